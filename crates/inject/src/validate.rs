//! Validation of the injection annotations on a Pod (Istio's `pkg/kube/inject/validate.go`,
//! `AnnotationValidation`): a bad value is an injection error naming the annotation.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::mesh::MeshConfig;

type Check = fn(&str) -> Result<(), String>;

fn validator(name: &str) -> Option<Check> {
    Some(match name {
        "sidecar.istio.io/interceptionMode" => |v| match v {
            "REDIRECT" | "TPROXY" | "NONE" => Ok(()),
            _ => Err(format!("interceptionMode invalid, use REDIRECT,TPROXY,NONE: {v}")),
        },
        "status.sidecar.istio.io/port" => |v| {
            parse_port(v)
                .map(|_| ())
                .map_err(|e| format!("excludeInboundPorts invalid: {e}"))
        },
        "readiness.status.sidecar.istio.io/initialDelaySeconds"
        | "readiness.status.sidecar.istio.io/periodSeconds"
        | "readiness.status.sidecar.istio.io/failureThreshold" => {
            |v| v.parse::<u32>().map(|_| ()).map_err(|e| format!("parsing {v:?}: {e}"))
        }
        "traffic.sidecar.istio.io/includeOutboundIPRanges" => |v| {
            if v == "*" {
                Ok(())
            } else {
                cidr_list(v).map_err(|e| format!("includeIPRanges invalid: {e}"))
            }
        },
        "traffic.sidecar.istio.io/excludeOutboundIPRanges" => {
            |v| cidr_list(v).map_err(|e| format!("excludeIPRanges invalid: {e}"))
        }
        "traffic.sidecar.istio.io/includeInboundPorts" => |v| {
            if v == "*" {
                Ok(())
            } else {
                port_list(v).map_err(|e| format!("includeInboundPorts invalid: {e}"))
            }
        },
        "traffic.sidecar.istio.io/excludeInboundPorts" => {
            |v| port_list(v).map_err(|e| format!("excludeInboundPorts invalid: {e}"))
        }
        "traffic.sidecar.istio.io/excludeOutboundPorts" => {
            |v| port_list(v).map_err(|e| format!("excludeOutboundPorts invalid: {e}"))
        }
        "traffic.sidecar.istio.io/excludeInterfaces"
        | "traffic.sidecar.istio.io/kubevirtInterfaces"
        | "istio.io/reroute-virtual-interfaces" => interface_names,
        "prometheus.istio.io/merge-metrics" => |v| {
            parse_go_bool(v)
                .map(|_| ())
                .ok_or_else(|| format!("invalid bool {v:?}"))
        },
        "proxy.istio.io/config" => |v| {
            crate::mesh::merge_proxy_config(&MeshConfig::default().default_config(), v)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        "sidecar.istio.io/proxyCPU"
        | "sidecar.istio.io/proxyMemory"
        | "sidecar.istio.io/proxyCPULimit"
        | "sidecar.istio.io/proxyMemoryLimit" => quantity,
        _ => return None,
    })
}

/// Every invalid annotation, as Istio's `validateAnnotations` (in key order).
pub(crate) fn validate_annotations(annotations: &BTreeMap<String, String>) -> Result<(), String> {
    let errs: Vec<String> = annotations
        .iter()
        .filter_map(|(k, v)| {
            validator(k)
                .and_then(|f| f(v).err())
                .map(|e| format!("invalid value '{v}' for annotation '{k}': {e}"))
        })
        .collect();
    if errs.is_empty() { Ok(()) } else { Err(errs.join("; ")) }
}

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn parse_port(p: &str) -> Result<u16, String> {
    p.trim()
        .parse::<u16>()
        .map_err(|e| format!("failed parsing port '{p}': {e}"))
}

fn port_list(ports: &str) -> Result<(), String> {
    let ports = ports.trim();
    if ports.is_empty() {
        return Ok(());
    }
    for p in ports.split(',') {
        parse_port(p)?;
    }
    Ok(())
}

fn cidr_list(cidrs: &str) -> Result<(), String> {
    if cidrs.is_empty() {
        return Ok(());
    }
    for c in cidrs.split(',') {
        let ok = c
            .split_once('/')
            .and_then(|(ip, bits)| {
                let ip: IpAddr = ip.parse().ok()?;
                let bits: u8 = bits.parse().ok()?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                (bits <= max && !bits.to_string().is_empty()).then_some(())
            })
            .is_some();
        if !ok {
            return Err(format!("failed parsing cidr '{c}'"));
        }
    }
    Ok(())
}

/// Istio's `ValidateInterfaceNames`: comma-separated names of at most 15 characters, without
/// `/` or whitespace.
fn interface_names(v: &str) -> Result<(), String> {
    for name in v.split(',') {
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\t', '\n']) || name == "." || name == ".." {
            return Err(format!("interface name {name:?} is invalid"));
        }
    }
    Ok(())
}

/// A Kubernetes resource quantity (`100m`, `1Gi`, `1e3`, `0.5`).
fn quantity(v: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {v:?}"
        ))
    };
    if v.chars().any(char::is_control) {
        return Err("value contains control characters".into());
    }
    let body = v.strip_prefix(['+', '-']).unwrap_or(v);
    let num_len = body.chars().take_while(|c| c.is_ascii_digit() || *c == '.').count();
    let (num, suffix) = body.split_at(num_len);
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return bad();
    }
    const SUFFIXES: &[&str] = &[
        "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let exp_ok = suffix.strip_prefix(['e', 'E']).is_some_and(|e| {
        !e.is_empty()
            && e.strip_prefix(['+', '-'])
                .unwrap_or(e)
                .chars()
                .all(|c| c.is_ascii_digit())
    });
    if SUFFIXES.contains(&suffix) || exp_ok {
        Ok(())
    } else {
        bad()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(k: &str, v: &str) -> Result<(), String> {
        validate_annotations(&[(k.to_string(), v.to_string())].into_iter().collect())
    }

    #[test]
    fn annotations_are_validated_as_istio() {
        assert!(check("traffic.sidecar.istio.io/includeOutboundIPRanges", "*").is_ok());
        assert!(check("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/8,::1/128").is_ok());
        let e = check("traffic.sidecar.istio.io/includeOutboundIPRanges", "127.0.0.1").unwrap_err();
        assert!(e.to_lowercase().contains("includeipranges"), "{e}");
        assert!(check("traffic.sidecar.istio.io/excludeInboundPorts", "4,5,6").is_ok());
        assert!(
            check("traffic.sidecar.istio.io/excludeInboundPorts", "4,x")
                .unwrap_err()
                .contains("excludeInboundPorts")
        );
        assert!(check("sidecar.istio.io/interceptionMode", "TPROXY").is_ok());
        assert!(check("sidecar.istio.io/interceptionMode", "X").is_err());
        assert!(check("sidecar.istio.io/proxyCPU", "100m").is_ok());
        assert!(check("sidecar.istio.io/proxyMemory", "1Gi").is_ok());
        assert!(check("sidecar.istio.io/proxyMemory", "1 Gi").is_err());
        assert!(check("prometheus.istio.io/merge-metrics", "T").is_ok());
        assert!(check("proxy.istio.io/config", "[").is_err());
        assert!(check("unrelated", "anything").is_ok());
    }
}
