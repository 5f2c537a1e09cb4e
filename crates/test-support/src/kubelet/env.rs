//! A container's environment and command line as the kubelet makes them
//! (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`, `pkg/kubelet/container`
//! `ExpandContainerCommandAndArgs`, `third_party/forked/golang/expansion`): `value`s with
//! `$(VAR)` references to earlier variables and the service variables expanded, `valueFrom`
//! `fieldRef` and `resourceFieldRef` resolved for the Pod (a limit the container does not set is
//! the node's allocatable), then the service variables the container does not set itself.

use std::collections::BTreeMap;

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use super::Node;

/// The container's env, in the kubelet's order. `service_env` are the service variables the
/// kubelet adds (`KUBERNETES_SERVICE_HOST`, ...).
pub fn container_env(
    pod: &Value,
    container: &Value,
    node: &Node,
    service_env: &[(String, String)],
) -> anyhow::Result<Vec<(String, String)>> {
    let name = container["name"].as_str().unwrap_or_default();
    let services: BTreeMap<&str, &str> = service_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    let mut out: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let key = var["name"]
            .as_str()
            .ok_or_else(|| anyhow!("container {name}: an env entry without a name"))?;
        let value = if let Some(from) = var.get("valueFrom") {
            value_from(pod, container, from, node).with_context(|| format!("container {name}: env {key}"))?
        } else {
            let raw = var["value"].as_str().unwrap_or_default();
            expand(raw, |v| {
                defined
                    .get(v)
                    .map(String::as_str)
                    .or_else(|| services.get(v).copied())
                    .map(str::to_owned)
            })
        };
        defined.insert(key.to_owned(), value.clone());
        out.retain(|(k, _)| k != key);
        out.push((key.to_owned(), value));
    }
    for (k, v) in service_env {
        if !defined.contains_key(k) {
            out.push((k.clone(), v.clone()));
        }
    }
    Ok(out)
}

/// The container's `command` (else the image's `entrypoint`) and `args` with `$(VAR)` expanded
/// from `env`.
pub fn command_line(container: &Value, entrypoint: &[String], env: &[(String, String)]) -> Vec<String> {
    let vars: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lookup = |v: &str| vars.get(v).map(|s| (*s).to_owned());
    let strings = |field: &str| -> Option<Vec<String>> {
        container[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(|s| expand(s, lookup)).collect())
    };
    let mut argv = strings("command").unwrap_or_else(|| entrypoint.to_vec());
    argv.extend(strings("args").unwrap_or_default());
    argv
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`, and
/// anything else (an undefined or unclosed reference) is kept as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(open) = after.strip_prefix('(')
            && let Some(close) = open.find(')')
        {
            let name = &open[..close];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &open[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn value_from(pod: &Value, container: &Value, from: &Value, node: &Node) -> anyhow::Result<String> {
    if let Some(path) = from.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
        return field_ref(pod, path);
    }
    if let Some(field) = from.get("resourceFieldRef") {
        let target = match field["containerName"].as_str() {
            Some(other) if !other.is_empty() => all_containers(pod)
                .find(|c| c["name"] == other)
                .ok_or_else(|| anyhow!("resourceFieldRef names no container {other}"))?,
            _ => container,
        };
        return resource_field_ref(target, field, node);
    }
    bail!("the test's kubelet resolves fieldRef and resourceFieldRef only, not {from}")
}

fn all_containers(pod: &Value) -> impl Iterator<Item = &Value> {
    let spec = &pod["spec"];
    spec["initContainers"]
        .as_array()
        .into_iter()
        .chain(spec["containers"].as_array())
        .flatten()
}

/// A `fieldRef`'s value (`pkg/fieldpath` `ExtractFieldPathAsString` and the kubelet's
/// `podFieldSelectorRuntimeValue`).
pub fn field_ref(pod: &Value, path: &str) -> anyhow::Result<String> {
    let text = |pointer: &str| -> anyhow::Result<String> {
        Ok(pod
            .pointer(pointer)
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("the Pod has no {path} yet"))?
            .to_owned())
    };
    let map = |pointer: &str| -> BTreeMap<String, String> {
        pod.pointer(pointer)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let ips = |pointer: &str| -> String {
        pod.pointer(pointer)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["ip"].as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    match path {
        "metadata.name" => text("/metadata/name"),
        "metadata.namespace" => text("/metadata/namespace"),
        "metadata.uid" => text("/metadata/uid"),
        "spec.nodeName" => text("/spec/nodeName"),
        "spec.serviceAccountName" => Ok(pod
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned()),
        "status.podIP" => text("/status/podIP"),
        "status.hostIP" => text("/status/hostIP"),
        "status.podIPs" => Ok(ips("/status/podIPs")),
        "status.hostIPs" => Ok(ips("/status/hostIPs")),
        "metadata.labels" => Ok(format_map(&map("/metadata/labels"))),
        "metadata.annotations" => Ok(format_map(&map("/metadata/annotations"))),
        _ => {
            for (prefix, pointer) in [
                ("metadata.labels['", "/metadata/labels"),
                ("metadata.annotations['", "/metadata/annotations"),
            ] {
                if let Some(key) = path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']")) {
                    return Ok(map(pointer).remove(key).unwrap_or_default());
                }
            }
            bail!("the test's kubelet does not resolve fieldPath {path}")
        }
    }
}

/// `pkg/fieldpath` `FormatMap`: `key="value"` lines (Go's `%q`) in key order, as the downward
/// API writes labels and annotations.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote` for the strings a label or annotation holds.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A `resourceFieldRef` (`pkg/api/v1/resource` `ExtractContainerResourceValue`): CPU rounded up
/// to whole divisors of millicores, memory to whole divisors of bytes; a missing limit is the
/// node's allocatable (`MergeContainerResourceLimits`), a missing request 0.
fn resource_field_ref(container: &Value, field: &Value, node: &Node) -> anyhow::Result<String> {
    let resource = field["resource"].as_str().unwrap_or_default();
    let divisor = match &field["divisor"] {
        Value::String(s) => quantity(s)?,
        Value::Number(n) => n.as_f64().unwrap_or(1.0),
        _ => 1.0,
    };
    if divisor <= 0.0 {
        bail!(
            "resourceFieldRef {resource}: divisor {} is not positive",
            field["divisor"]
        );
    }
    let (section, kind) = resource
        .split_once('.')
        .ok_or_else(|| anyhow!("resourceFieldRef: {resource:?} is not <limits|requests>.<resource>"))?;
    let set = container
        .pointer(&format!("/resources/{section}/{kind}"))
        .map(|q| match q {
            Value::String(s) => quantity(s),
            Value::Number(n) => n.as_f64().ok_or_else(|| anyhow!("{n} is not a quantity")),
            other => Err(anyhow!("{other} is not a quantity")),
        })
        .transpose()?;
    let value = match (section, kind, set) {
        (_, _, Some(v)) => v,
        ("limits", "cpu", None) => f64::from(node.cpus),
        ("limits", "memory", None) => node.memory as f64,
        ("requests", "cpu" | "memory", None) => 0.0,
        _ => bail!("the test's kubelet does not resolve resourceFieldRef {resource}"),
    };
    // Rounded up (float noise of the decimal suffixes aside), CPU in millis as
    // ConvertResourceCPUToString.
    let up = |x: f64| (x - 1e-9).ceil();
    let whole = match kind {
        "cpu" => up(up(value * 1000.0) / up(divisor * 1000.0)),
        _ => up(value / divisor),
    };
    Ok(format!("{whole:.0}"))
}

/// A Kubernetes quantity (`100m`, `2`, `128Mi`, `1Gi`, `1.5G`, `1e3`) as a number.
pub fn quantity(text: &str) -> anyhow::Result<f64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| anyhow!("{text:?} is not a Kubernetes quantity"))?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        s if s.starts_with(['e', 'E']) => 10f64.powi(
            s[1..]
                .parse()
                .map_err(|_| anyhow!("{text:?} is not a Kubernetes quantity"))?,
        ),
        _ => bail!("{text:?}: the test's kubelet does not know the suffix {suffix:?}"),
    };
    Ok(number * scale)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn node() -> Node {
        Node {
            name: "node-1".into(),
            ip: [10, 0, 0, 1].into(),
            cpus: 4,
            memory: 8 << 30,
        }
    }

    #[test]
    fn expansion_is_kubernetes() {
        let vars = |v: &str| (v == "NS").then(|| "apps".to_owned());
        assert_eq!(expand("$(NS).svc.cluster.local", vars), "apps.svc.cluster.local");
        assert_eq!(expand("$(UNSET)-$$(NS)-$NS-$(", vars), "$(UNSET)-$(NS)-$NS-$(");
    }

    #[test]
    fn env_resolves_fields_resources_and_references() {
        let pod = json!({
            "metadata": {"name": "web-1", "namespace": "apps", "labels": {"app": "web", "q": "a\"b"}},
            "spec": {"serviceAccountName": "web", "nodeName": "node-1", "containers": [{"name": "app"}]},
            "status": {"podIP": "10.244.1.3", "hostIP": "10.0.0.1"},
        });
        let container = json!({"name": "proxy",
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m"}},
        "env": [
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "DOMAIN", "value": "$(NS).svc:$(KUBERNETES_SERVICE_PORT)"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}},
            {"name": "REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1"}}},
            {"name": "APPCPU", "valueFrom": {"resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}},
            {"name": "LABELS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
        ]});
        let env = container_env(
            &pod,
            &container,
            &node(),
            &[("KUBERNETES_SERVICE_PORT".into(), "443".into())],
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(get("DOMAIN"), "apps.svc:443");
        assert_eq!(get("IP"), "10.244.1.3");
        assert_eq!(get("SA"), "web");
        assert_eq!(get("CPU"), "2");
        assert_eq!(get("REQ"), "100");
        assert_eq!(get("MEM"), "1073741824");
        assert_eq!(get("APPCPU"), "4", "no limit: the node's allocatable");
        assert_eq!(get("LABELS"), "app=\"web\"\nq=\"a\\\"b\"");
        assert_eq!(env.last().unwrap().0, "KUBERNETES_SERVICE_PORT");
        let argv = command_line(
            &json!({"args": ["--domain", "$(NS).svc.cluster.local"]}),
            &["/usr/local/bin/pilot-agent".to_owned()],
            &env,
        );
        assert_eq!(
            argv,
            ["/usr/local/bin/pilot-agent", "--domain", "apps.svc.cluster.local"]
        );
    }

    #[test]
    fn what_it_cannot_resolve_is_an_error() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {}});
        let c = json!({"name": "c", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]});
        let err = container_env(&pod, &c, &node(), &[]).unwrap_err();
        assert!(format!("{err:#}").contains("env X"), "{err:#}");
        assert!(quantity("12Zi").is_err());
        assert_eq!(quantity("1e3").unwrap(), 1000.0);
    }
}
