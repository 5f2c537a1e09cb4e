//! `ServiceEntry` validation as Istio's `ValidateServiceEntry` and the CRD's rules: hosts, addresses
//! and CIDRs, unique ports, resolution vs endpoints/addresses/workloadSelector, exportTo.

use std::collections::BTreeSet;

use super::common::{
    Errors, check_enum, check_export_to, check_labels, check_selector, parse_protocol, validate_port,
    validate_port_name, validate_protocol,
};
use super::hosts::{is_ip, validate_fqdn, validate_ip_subnet, validate_wildcard_domain};
use super::workload_entry::{Addresses, check_ports, check_workload};
use crate::config::Config;
use crate::networking::ServiceEntry;
use crate::service::Protocol;

/// Label that puts a ServiceEntry behind a waypoint.
const USE_WAYPOINT_LABEL: &str = "istio.io/use-waypoint";

pub(crate) fn check_service_entry(errs: &mut Errors, config: &Config, se: &ServiceEntry) {
    if let Some(sel) = &se.workload_selector {
        check_selector(errs, "spec.workloadSelector.labels", &sel.match_labels);
        if !se.endpoints.is_empty() {
            errs.add("spec", "only one of WorkloadSelector or Endpoints can be set");
        }
    }
    check_hosts_and_addresses(errs, se);
    let resolution = se.resolution.as_deref().unwrap_or("NONE");
    let names = check_ports_unique(errs, se);
    check_resolution(errs, config, se, resolution, &names);
    // plain TCP cannot tell hosts apart, unless they are ignored (NONE)
    if resolution != "NONE"
        && se.hosts.len() > 1
        && se
            .ports
            .iter()
            .any(|p| !parse_protocol(&p.protocol).is_some_and(|p| p.is_http() || p.is_tls()))
    {
        errs.add("spec.ports", "multiple hosts provided with non-HTTP, non-TLS ports");
    }
    check_export_to(
        errs,
        "spec.exportTo",
        &config.meta.namespace,
        &se.export_to,
        true,
        false,
    );
}

/// At least one host, none `*`; the location; addresses and CIDRs (CIDRs only for NONE and
/// STATIC resolution).
fn check_hosts_and_addresses(errs: &mut Errors, se: &ServiceEntry) {
    if se.hosts.is_empty() {
        errs.add("spec.hosts", "service entry must have at least one host");
    }
    for (i, host) in se.hosts.iter().enumerate() {
        if host == "*" {
            errs.add(&format!("spec.hosts[{i}]"), "hostname cannot be wildcard");
        } else {
            // partial wildcards (`*x`) are only a warning in Istio
            errs.check(&format!("spec.hosts[{i}]"), validate_wildcard_domain(host));
        }
    }
    check_enum(
        errs,
        "spec.location",
        se.location.as_ref(),
        &["MESH_EXTERNAL", "MESH_INTERNAL"],
    );
    let resolution = se.resolution.as_deref().unwrap_or("NONE");
    for (i, address) in se.addresses.iter().enumerate() {
        errs.check(&format!("spec.addresses[{i}]"), validate_ip_subnet(address));
    }
    if se.addresses.iter().any(|a| a.contains('/')) && !matches!(resolution, "NONE" | "STATIC") {
        errs.add(
            "spec.addresses",
            "CIDR addresses are allowed only for NONE/STATIC resolution types",
        );
    }
}

/// Port names and numbers unique, each port valid; the port names, for the endpoints' ports.
fn check_ports_unique<'a>(errs: &mut Errors, se: &'a ServiceEntry) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        if !names.insert(port.name.as_str()) {
            errs.add(
                &format!("{path}.name"),
                format!(
                    "Duplicate value: service entry port name {:?} already defined",
                    port.name
                ),
            );
        }
        if !numbers.insert(port.number) {
            errs.add(
                &format!("{path}.number"),
                format!("port number cannot be duplicated: {} already defined", port.number),
            );
        }
        if port.target_port != 0 {
            errs.check(&format!("{path}.targetPort"), validate_port(port.target_port.into()));
        }
        errs.check(&format!("{path}.name"), validate_port_name(&port.name));
        errs.check(&format!("{path}.protocol"), validate_protocol(&port.protocol));
        errs.check(&format!("{path}.number"), validate_port(port.number.into()));
    }
    names
}

/// What each resolution allows of endpoints and hosts.
fn check_resolution(errs: &mut Errors, config: &Config, se: &ServiceEntry, resolution: &str, names: &BTreeSet<&str>) {
    match resolution {
        "NONE" => {
            if !se.endpoints.is_empty() {
                errs.add(
                    "spec.endpoints",
                    "NONE mode cannot set endpoints (no endpoints should be provided for resolution type none)",
                );
            }
        }
        "STATIC" => {
            for (i, ep) in se.endpoints.iter().enumerate() {
                check_workload(
                    errs,
                    &format!("spec.endpoints[{i}]"),
                    ep,
                    Addresses::IpOnly,
                    Some(names),
                );
            }
        }
        "DNS" | "DNS_ROUND_ROBIN" => {
            if se.endpoints.is_empty()
                && let Some(e) = se.hosts.iter().find_map(|h| validate_fqdn(h).err())
            {
                errs.add(
                    "spec.hosts",
                    format!("hosts must be FQDN or contain only prefix wildcards if no endpoints are provided for resolution mode {resolution}, {e}"),
                );
            }
            if resolution == "DNS_ROUND_ROBIN" && se.endpoints.len() > 1 {
                errs.add(
                    "spec.endpoints",
                    "DNS_ROUND_ROBIN mode cannot have multiple endpoints (there must only be 0 or 1 endpoint)",
                );
            }
            for (i, ep) in se.endpoints.iter().enumerate() {
                let path = format!("spec.endpoints[{i}]");
                if !is_ip(&ep.address) && validate_fqdn(&ep.address).is_err() {
                    errs.add(
                        &format!("{path}.address"),
                        format!("endpoint address {:?} is not a valid FQDN or an IP address", ep.address),
                    );
                }
                check_labels(errs, &format!("{path}.labels"), &ep.labels);
                check_ports(errs, &path, ep, Some(names));
            }
        }
        "DYNAMIC_DNS" => check_dynamic_dns(errs, config, se),
        other => errs.add("spec.resolution", format!("unsupported resolution type {other}")),
    }
}

/// DYNAMIC_DNS: wildcard hosts resolved per request by Envoy's dynamic forward proxy.
fn check_dynamic_dns(errs: &mut Errors, config: &Config, se: &ServiceEntry) {
    let mode = "DYNAMIC_DNS";
    for (i, host) in se.hosts.iter().enumerate() {
        if !crate::host::is_wildcard(host) {
            errs.add(
                &format!("spec.hosts[{i}]"),
                format!("host must be wildcarded for resolution mode {mode}"),
            );
        }
    }
    if !se.addresses.is_empty() {
        errs.add(
            "spec.addresses",
            format!("addresses cannot be set for resolution type {mode}"),
        );
    }
    if !se.endpoints.is_empty() {
        errs.add(
            "spec.endpoints",
            format!("endpoints cannot be set for resolution type {mode}"),
        );
    }
    for (i, port) in se.ports.iter().enumerate() {
        let supported = matches!(
            parse_protocol(&port.protocol),
            Some(Protocol::Http | Protocol::Tls | Protocol::Grpc | Protocol::Http2)
        );
        if !supported || port.protocol.eq_ignore_ascii_case("http_proxy") {
            errs.add(
                &format!("spec.ports[{i}].protocol"),
                format!("only HTTP, TLS, GRPC, and HTTP2 protocols are supported for resolution type {mode}"),
            );
        }
    }
    let uses_waypoint = config
        .meta
        .labels
        .get(USE_WAYPOINT_LABEL)
        .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("none"));
    if se.location.as_deref() == Some("MESH_INTERNAL") && uses_waypoint {
        errs.add(
            "spec.location",
            format!("location MESH_INTERNAL with resolution type {mode} is not supported when using waypoints"),
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::validation::{errors_of, errors_with_meta};

    fn se(spec: Value) -> Vec<String> {
        errors_of("ServiceEntry", spec)
    }

    #[test]
    fn hosts_addresses_ports() {
        assert!(se(json!({"hosts": ["api.example.com", "b.example.org"], "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
            "resolution": "DNS", "location": "MESH_EXTERNAL"})).is_empty());
        assert!(se(json!({"hosts": ["*x"]})).is_empty());
        assert_eq!(se(json!({})), ["spec.hosts: service entry must have at least one host"]);
        assert_eq!(
            se(json!({"hosts": ["*"]})),
            ["spec.hosts[0]: hostname cannot be wildcard"]
        );
        assert!(se(json!({"hosts": ["foo*"]}))[0].starts_with("spec.hosts[0]: domain name"));
        assert!(se(json!({"hosts": ["a.com"], "addresses": ["1.2.3.4/99"]}))[0].contains("not a valid CIDR"));
        assert!(se(json!({"hosts": ["a.com"], "addresses": ["1.2.3.4/24"], "resolution": "STATIC"})).is_empty());
        assert!(
            se(json!({"hosts": ["a.com"], "addresses": ["1.2.3.4/24"], "resolution": "DNS"}))[0]
                .contains("CIDR addresses")
        );
        let ports = |p: Value| se(json!({"hosts": ["a.com"], "ports": p}));
        assert!(ports(json!([{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}])).is_empty());
        assert!(
            ports(json!([{"number": 80, "name": "a"}, {"number": 81, "name": "a"}]))[0].contains("Duplicate value")
        );
        assert!(
            ports(json!([{"number": 80, "name": "a"}, {"number": 80, "name": "b"}]))[0]
                .contains("cannot be duplicated")
        );
        assert!(ports(json!([{"number": 80, "name": "a_b"}]))[0].contains("invalid port name"));
        assert!(ports(json!([{"number": 80, "name": "a", "protocol": "SMTP"}]))[0].contains("unsupported protocol"));
        assert!(
            ports(json!([{"number": 80, "name": "a", "targetPort": 99999}]))[0].starts_with("spec.ports[0].targetPort")
        );
        assert!(se(json!({"hosts": ["a.com"], "location": "MESH_NEARBY"}))[0].contains("unknown value"));
        assert!(
            se(json!({"hosts": ["a.com"], "resolution": "MAGIC"}))[0].contains("unsupported resolution type MAGIC")
        );
        assert!(se(json!({"hosts": ["a.com"], "exportTo": ["~"]})).is_empty());
        assert!(se(json!({"hosts": ["a.com"], "exportTo": ["~", "."]}))[0].contains("no one (~)"));
    }

    #[test]
    fn resolution_rules() {
        let ep = json!([{"address": "1.2.3.4", "ports": {"http": 8080}}]);
        let http = json!([{"number": 80, "name": "http", "protocol": "HTTP"}]);
        assert!(se(json!({"hosts": ["a.com"], "ports": http, "resolution": "STATIC", "endpoints": ep})).is_empty());
        assert!(se(json!({"hosts": ["a.com"], "endpoints": ep}))[0].contains("NONE mode cannot set endpoints"));
        assert!(
            se(json!({"hosts": ["a.com"], "resolution": "STATIC", "workloadSelector": {"labels": {"app": "a"}}}))
                .is_empty()
        );
        assert!(se(json!({"hosts": ["a.com"], "resolution": "STATIC", "workloadSelector": {"labels": {"app": "a"}}, "endpoints": ep}))[0]
            .contains("only one of WorkloadSelector or Endpoints"));
        let static_host =
            se(json!({"hosts": ["a.com"], "ports": http, "resolution": "STATIC", "endpoints": [{"address": "b.com"}]}));
        assert_eq!(
            static_host,
            ["spec.endpoints[0].address: endpoint address \"b.com\" is not a valid IP address"]
        );
        let unknown_port = se(
            json!({"hosts": ["a.com"], "ports": http, "resolution": "STATIC", "endpoints": [{"address": "1.1.1.1", "ports": {"grpc": 1}}]}),
        );
        assert!(unknown_port[0].contains("not defined by the service entry"));
        assert!(se(json!({"hosts": ["a.com"], "ports": http, "resolution": "DNS", "endpoints": [{"address": "b.com", "ports": {"http": 80}}]})).is_empty());
        assert!(
            se(json!({"hosts": ["a.com"], "resolution": "DNS", "endpoints": [{"address": "not valid"}]}))[0]
                .contains("not a valid FQDN")
        );
        assert!(se(json!({"hosts": ["reviews"], "resolution": "DNS"})).is_empty());
        assert!(se(json!({"hosts": ["*.a.com"], "resolution": "DNS"}))[0].contains("hosts must be FQDN"));
        assert!(se(json!({"hosts": ["a.com"], "resolution": "DNS_ROUND_ROBIN", "endpoints": [{"address": "b.com"}, {"address": "c.com"}]}))[0]
            .contains("cannot have multiple endpoints"));
        let multi = |protocol: &str| {
            se(
                json!({"hosts": ["a.com", "b.com"], "resolution": "DNS", "ports": [{"number": 80, "name": "p", "protocol": protocol}]}),
            )
        };
        assert!(multi("HTTP").is_empty() && multi("TLS").is_empty());
        assert!(multi("TCP")[0].contains("multiple hosts provided with non-HTTP, non-TLS ports"));
        assert!(
            se(json!({"hosts": ["a.com", "b.com"], "ports": [{"number": 80, "name": "p", "protocol": "TCP"}]}))
                .is_empty()
        );
    }

    /// Cases of Istio's `TestValidateServiceEntries`.
    #[test]
    fn istio_cases() {
        let http2 = json!([{"number": 80, "protocol": "http", "name": "http-valid1"}, {"number": 8080, "protocol": "http", "name": "http-valid2"}]);
        let dns_endpoints = json!([{"address": "lon.google.com", "ports": {"http-valid1": 8080}},
            {"address": "in.google.com", "ports": {"http-valid2": 9080}, "labels": {"security.istio.io/tlsMode": "istio"}}]);
        assert!(
            se(json!({"hosts": ["*.google.com"], "ports": http2, "endpoints": dns_endpoints, "resolution": "DNS"}))
                .is_empty()
        );
        let multi = json!({"hosts": ["httpbin.org", "wikipedia.org"], "addresses": ["10.10.10.10"], "resolution": "DNS",
            "ports": [{"number": 80, "protocol": "http", "name": "http"}, {"number": 443, "protocol": "https", "name": "https"}]});
        assert!(se(multi).is_empty());
        let network_only = json!({"hosts": ["www.example.com"], "resolution": "STATIC",
            "ports": [{"number": 443, "protocol": "HTTPS", "name": "https-example"}], "endpoints": [{"network": "cluster-1"}]});
        assert!(se(network_only).is_empty());
        let repeat_target = json!({"hosts": ["google.com"], "resolution": "DNS", "ports": [
            {"number": 80, "protocol": "http", "name": "a", "targetPort": 80}, {"number": 81, "protocol": "http", "name": "b", "targetPort": 80}]});
        assert!(se(repeat_target).is_empty());
        let unix = json!({"hosts": ["uds.local"], "resolution": "STATIC", "ports": [{"number": 6553, "protocol": "grpc", "name": "grpc"}],
            "endpoints": [{"address": "unix:///path/to/socket"}]});
        assert!(se(unix).is_empty());
        let unix_dns =
            json!({"hosts": ["uds.local"], "resolution": "DNS", "endpoints": [{"address": "unix:///path/to/socket"}]});
        assert!(se(unix_dns)[0].contains("not a valid FQDN"));
        assert!(
            se(json!({"hosts": ["google.com"], "workloadSelector": {"labels": {"": "bar"}}}))[0].contains("empty key")
        );
    }

    #[test]
    fn dynamic_dns() {
        let https = json!([{"number": 443, "name": "tls", "protocol": "TLS"}]);
        assert!(se(json!({"hosts": ["*.example.com"], "resolution": "DYNAMIC_DNS", "ports": https})).is_empty());
        assert!(se(json!({"hosts": ["a.example.com"], "resolution": "DYNAMIC_DNS"}))[0].contains("must be wildcarded"));
        assert!(
            se(json!({"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "addresses": ["1.1.1.1"]}))[0]
                .contains("addresses cannot be set")
        );
        assert!(se(json!({"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "ports": [{"number": 80, "name": "t", "protocol": "TCP"}]}))[0].contains("only HTTP, TLS"));
        let meta = json!({"name": "se", "namespace": "ns", "labels": {"istio.io/use-waypoint": "wp"}});
        let errs = errors_with_meta(
            "ServiceEntry",
            meta,
            json!({"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "location": "MESH_INTERNAL"}),
        );
        assert!(errs[0].contains("not supported when using waypoints"), "{errs:?}");
    }
}
