//! `VirtualService` validation as Istio's `ValidateVirtualService`: hosts (mesh vs gateway, delegates),
//! gateway names, TLS and TCP routes, destinations and weights. HTTP routes are in `http_route`.

use std::collections::BTreeMap;

use super::common::{Check, Errors, check_export_to, check_labels, validate_port};
use super::headers::is_jwt_claim_route;
use super::hosts::{is_dns1123_label, is_ip, validate_fqdn, validate_ip_subnet, validate_wildcard_domain};
use super::http_route::check_http_route;
use crate::config::Config;
use crate::networking::{Destination, RouteDestination, StringMatch, VirtualService};

/// The gateway name that means "all sidecars".
const MESH_GATEWAY: &str = "mesh";

pub(crate) fn check_virtual_service(errs: &mut Errors, config: &Config, vs: &VirtualService) {
    let delegate = vs.hosts.is_empty();
    if delegate {
        check_delegate(errs, vs);
    }
    check_gateway_names(errs, "spec.gateways", &vs.gateways);
    let applies_to_gateway = !vs.gateways.is_empty() && !vs.gateways.iter().any(|g| g == MESH_GATEWAY);
    if !applies_to_gateway {
        check_no_jwt_claim_routes(errs, vs);
    }
    check_hosts(errs, vs, applies_to_gateway);
    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        errs.add("spec", "http, tcp or tls must be provided in virtual service");
    }
    for (i, http) in vs.http.iter().enumerate() {
        check_http_route(errs, &format!("spec.http[{i}]"), http, delegate);
    }
    check_tls_routes(errs, vs, applies_to_gateway);
    check_tcp_routes(errs, vs);
    check_export_to(
        errs,
        "spec.exportTo",
        &config.meta.namespace,
        &vs.export_to,
        false,
        false,
    );
}

/// A delegate (no hosts) is only HTTP routes: no gateways, TLS or TCP routes.
fn check_delegate(errs: &mut Errors, vs: &VirtualService) {
    if !vs.gateways.is_empty() {
        errs.add(
            "spec.gateways",
            "delegate virtual service must have no gateways specified",
        );
    }
    if !vs.tls.is_empty() {
        errs.add("spec.tls", "delegate virtual service must have no tls route specified");
    }
    if !vs.tcp.is_empty() {
        errs.add("spec.tcp", "delegate virtual service must have no tcp route specified");
    }
}

/// JWT claim based routing needs a gateway (the claims are read there).
fn check_no_jwt_claim_routes(errs: &mut Errors, vs: &VirtualService) {
    for (i, http) in vs.http.iter().enumerate() {
        for (j, m) in http.match_.iter().enumerate() {
            for key in m
                .headers
                .keys()
                .chain(m.without_headers.keys())
                .filter(|k| is_jwt_claim_route(k))
            {
                errs.add(
                    &format!("spec.http[{i}].match[{j}]"),
                    format!("JWT claim based routing (key: {key}) is only supported for gateway, found no gateways"),
                );
            }
        }
    }
}

/// Each host valid for where the VirtualService applies (a gateway's SNI names, or the mesh's,
/// where `*` is not allowed), and no two hosts that overlap.
fn check_hosts(errs: &mut Errors, vs: &VirtualService, applies_to_gateway: bool) {
    let sni = vs.tls.iter().any(|t| t.match_.iter().any(|m| !m.sni_hosts.is_empty()));
    let mut all_hosts_valid = true;
    for (i, host) in vs.hosts.iter().enumerate() {
        let path = format!("spec.hosts[{i}]");
        let result = if applies_to_gateway {
            validate_gateway_bound_domain(sni, host)
        } else {
            validate_wildcard_domain(host)
        };
        match result {
            // an IP is a valid virtual service host
            Err(e) if !is_ip(host) => {
                errs.add(&path, e);
                all_hosts_valid = false;
            }
            Ok(()) if !applies_to_gateway && host == "*" => {
                errs.add(
                    &path,
                    "wildcard host * is not allowed for virtual services bound to the mesh gateway",
                );
                all_hosts_valid = false;
            }
            _ => {}
        }
    }
    if all_hosts_valid {
        for (i, a) in vs.hosts.iter().enumerate() {
            for b in &vs.hosts[i + 1..] {
                if crate::host::matches(a, b) {
                    errs.add("spec.hosts", format!("duplicate hosts in virtual service: {a} & {b}"));
                }
            }
        }
    }
}

fn check_tls_routes(errs: &mut Errors, vs: &VirtualService, applies_to_gateway: bool) {
    for (i, tls) in vs.tls.iter().enumerate() {
        let path = format!("spec.tls[{i}]");
        if tls.match_.is_empty() {
            errs.add(&path, "TLS route must have at least one match condition");
        }
        for (j, m) in tls.match_.iter().enumerate() {
            let mpath = format!("{path}.match[{j}]");
            if m.sni_hosts.is_empty() {
                errs.add(&mpath, "TLS match must have at least one SNI host");
            }
            for (k, sni_host) in m.sni_hosts.iter().enumerate() {
                errs.check(
                    &format!("{mpath}.sniHosts[{k}]"),
                    validate_sni_host(sni_host, vs, applies_to_gateway),
                );
            }
            check_l4_match(
                errs,
                &mpath,
                &m.destination_subnets,
                m.port,
                &m.source_labels,
                &m.gateways,
            );
        }
        if tls.route.is_empty() {
            errs.add(&path, "TLS route is required");
        }
        check_route_destinations(errs, &format!("{path}.route"), &tls.route);
    }
}

fn check_tcp_routes(errs: &mut Errors, vs: &VirtualService) {
    for (i, tcp) in vs.tcp.iter().enumerate() {
        let path = format!("spec.tcp[{i}]");
        for (j, m) in tcp.match_.iter().enumerate() {
            check_l4_match(
                errs,
                &format!("{path}.match[{j}]"),
                &m.destination_subnets,
                m.port,
                &m.source_labels,
                &m.gateways,
            );
        }
        if tcp.route.is_empty() {
            errs.add(&path, "TCP route is required");
        }
        check_route_destinations(errs, &format!("{path}.route"), &tcp.route);
    }
}

/// `ValidateWildcardDomainForVirtualServiceBoundToGateway`: with SNI matches, the auto-generated
/// `outbound_.<PORT>_._.<HOSTNAME>` names of AUTO_PASSTHROUGH gateways are hosts too.
fn validate_gateway_bound_domain(sni: bool, domain: &str) -> Check {
    if domain.is_empty() || domain.len() > 255 {
        return validate_wildcard_domain(domain);
    }
    if sni && domain.starts_with("outbound_") {
        let format = "outbound_.<PORT>_._.<HOSTNAME>";
        let parts: Vec<&str> = domain.split('_').collect();
        if parts.len() < 4 {
            return Err(format!("domain name {domain} invalid, should follow '{format}' format"));
        }
        let port = parts[1].trim_matches('.');
        let hostname = parts[3].trim_matches('.');
        if !port.bytes().any(|b| b.is_ascii_digit()) {
            return Err(format!(
                "domain name {domain:?} invalid (label {port:?} invalid). should follow {format} format"
            ));
        }
        if !hostname.bytes().any(|b| b.is_ascii_alphabetic()) {
            return Err(format!(
                "domain name {domain:?} invalid (label {hostname:?} invalid). should follow {format} format"
            ));
        }
        return Ok(());
    }
    validate_wildcard_domain(domain)
}

/// `validateSniHost`: a domain (an IP is tolerated) that is a subset of one of the virtual service hosts.
fn validate_sni_host(sni_host: &str, vs: &VirtualService, applies_to_gateway: bool) -> Check {
    let valid = if applies_to_gateway {
        validate_gateway_bound_domain(true, sni_host)
    } else {
        validate_wildcard_domain(sni_host)
    };
    if let Err(e) = valid {
        // IPs go against the SNI spec, but Istio only warns
        return if is_ip(sni_host) { Ok(()) } else { Err(e) };
    }
    if vs.hosts.iter().any(|h| crate::host::subset_of(sni_host, h)) {
        return Ok(());
    }
    Err(format!(
        "SNI host {sni_host:?} is not a compatible subset of any of the virtual service hosts: [{}]",
        vs.hosts.join(", ")
    ))
}

fn check_l4_match(
    errs: &mut Errors,
    path: &str,
    subnets: &[String],
    port: u32,
    source_labels: &BTreeMap<String, String>,
    gateways: &[String],
) {
    for (k, s) in subnets.iter().enumerate() {
        errs.check(&format!("{path}.destinationSubnets[{k}]"), validate_ip_subnet(s));
    }
    if port != 0 {
        errs.check(&format!("{path}.port"), validate_port(port.into()));
    }
    check_labels(errs, &format!("{path}.sourceLabels"), source_labels);
    check_gateway_names(errs, &format!("{path}.gateways"), gateways);
}

/// `validateGatewayNames`: `namespace/name`, or a legacy FQDN or short name (e.g. `mesh`).
pub(crate) fn check_gateway_names(errs: &mut Errors, path: &str, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let Some((ns, gw)) = name.split_once('/') else {
            errs.check(&path, validate_fqdn(name));
            // Istio stops at the first name without a namespace
            return;
        };
        if ns.is_empty() || gw.is_empty() {
            errs.add(&path, "config namespace and gateway name cannot be empty");
        }
        if !is_dns1123_label(ns) {
            errs.add(&path, format!("invalid value for namespace: {ns:?}"));
        }
        if !is_dns1123_label(gw) {
            errs.add(&path, format!("invalid value for gateway name: {gw:?}"));
        }
    }
}

/// `validateDestination`: a host other than `*`, an optional subset name and port.
pub(crate) fn check_destination(errs: &mut Errors, path: &str, d: &Destination) {
    if d.host == "*" {
        errs.add(&format!("{path}.host"), format!("invalid destination host {}", d.host));
    } else {
        errs.check(&format!("{path}.host"), validate_wildcard_domain(&d.host));
    }
    if !d.subset.is_empty() {
        errs.check(&format!("{path}.subset"), validate_subset_name(&d.subset));
    }
    if let Some(p) = &d.port {
        errs.check(&format!("{path}.port.number"), validate_port(p.number.into()));
    }
}

pub(crate) fn validate_subset_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("subset name cannot be empty".into());
    }
    if !is_dns1123_label(name) {
        return Err(format!("subset name is invalid: {name}"));
    }
    Ok(())
}

/// Weights are non-negative; several destinations may not all weigh 0. Istio does not require a sum of 100.
pub(crate) fn check_weights(errs: &mut Errors, path: &str, weights: impl ExactSizeIterator<Item = i32>) {
    let n = weights.len();
    let mut total: i64 = 0;
    for (i, w) in weights.enumerate() {
        if w < 0 {
            errs.add(&format!("{path}[{i}].weight"), format!("weight {w} < 0"));
        }
        total += i64::from(w);
    }
    if n > 1 && total == 0 {
        errs.add(path, "total destination weight = 0");
    }
}

fn check_route_destinations(errs: &mut Errors, path: &str, routes: &[RouteDestination]) {
    for (i, r) in routes.iter().enumerate() {
        check_destination(errs, &format!("{path}[{i}].destination"), &r.destination);
    }
    check_weights(errs, path, routes.iter().map(|r| r.weight));
}

/// `validateStringMatch`: at most one of exact/prefix/regex; a prefix may not be empty unless
/// `empty_prefix_ok` (URIs); regexes are RE2.
pub(crate) fn check_string_match(errs: &mut Errors, path: &str, sm: &StringMatch, empty_prefix_ok: bool) {
    let set = [sm.exact.is_some(), sm.prefix.is_some(), sm.regex.is_some()]
        .iter()
        .filter(|s| **s)
        .count();
    if set > 1 {
        errs.add(path, "only one of exact, prefix or regex may be set");
        return;
    }
    if !empty_prefix_ok && sm.prefix.as_deref() == Some("") {
        errs.add(path, "prefix string match should not be empty");
    }
    if let Some(re) = &sm.regex {
        if re.is_empty() {
            errs.add(path, "regex string match should not be empty");
        } else {
            errs.check(path, super::common::validate_regex(re));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::validation::errors_of;

    fn vs(spec: Value) -> Vec<String> {
        errors_of("VirtualService", spec)
    }

    fn route_to(host: &str) -> Value {
        json!([{"route": [{"destination": {"host": host}}]}])
    }

    #[test]
    fn hosts() {
        for host in [
            "reviews",
            "reviews.prod.svc.cluster.local",
            "*.example.com",
            "10.0.0.1",
            "Bookinfo.com",
        ] {
            assert!(
                vs(json!({"hosts": [host], "http": route_to("reviews")})).is_empty(),
                "{host}"
            );
        }
        let errs = vs(json!({"hosts": ["*"], "http": route_to("reviews")}));
        assert_eq!(
            errs,
            ["spec.hosts[0]: wildcard host * is not allowed for virtual services bound to the mesh gateway"]
        );
        assert!(vs(json!({"hosts": ["*"], "gateways": ["ns/gw"], "http": route_to("reviews")})).is_empty());
        assert!(
            vs(json!({"hosts": ["*"], "gateways": ["ns/gw", "mesh"], "http": route_to("reviews")}))[0]
                .contains("mesh gateway")
        );
        let errs = vs(json!({"hosts": ["foo*.com"], "http": route_to("reviews")}));
        assert!(
            errs[0].starts_with("spec.hosts[0]: domain name \"foo*.com\" invalid"),
            "{errs:?}"
        );
        let errs = vs(json!({"hosts": ["*.foo.com", "a.foo.com"], "http": route_to("reviews")}));
        assert_eq!(
            errs,
            ["spec.hosts: duplicate hosts in virtual service: *.foo.com & a.foo.com"]
        );
        assert_eq!(
            vs(json!({"hosts": ["a.com"]})),
            ["spec: http, tcp or tls must be provided in virtual service"]
        );
    }

    /// Cases of Istio's `TestValidateWildcardDomainForVirtualServiceBoundToGateway`.
    #[test]
    fn gateway_bound_domains() {
        use super::validate_gateway_bound_domain as check;
        for (sni, ok) in [
            (false, "*"),
            (false, "*foo.bar.com"),
            (false, "*-foo.bar.com"),
            (true, "outbound_.80_._.e2e.foobar.mesh"),
            (true, "outbound.com"),
        ] {
            assert!(check(sni, ok).is_ok(), "{ok}");
        }
        for (sni, bad) in [
            (false, ""),
            (false, "foo.*.com"),
            (false, "1.1.1.1"),
            (true, "neverbound_.80_._.e2e.foobar.mesh"),
            (true, "outbound_.thisIsNotAPort_._.e2e.foobar.mesh"),
            (true, "outbound_.80_._"),
        ] {
            assert!(check(sni, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn delegates_and_gateways() {
        // a delegate has no hosts, gateways, tls or tcp
        assert!(vs(json!({"http": route_to("reviews")})).is_empty());
        let errs = vs(json!({"gateways": ["ns/gw"], "http": route_to("reviews")}));
        assert_eq!(
            errs,
            ["spec.gateways: delegate virtual service must have no gateways specified"]
        );
        let errs = vs(json!({"http": [{"delegate": {"name": "d"}}]}));
        assert!(
            errs.iter()
                .any(|e| e == "spec.http[0].delegate: delegate HTTP route cannot contain delegate"),
            "{errs:?}"
        );

        for ok in ["mesh", "istio-system/ingress", "gw.istio-system.svc.cluster.local"] {
            assert!(
                vs(json!({"hosts": ["a.com"], "gateways": [ok], "http": route_to("a")})).is_empty(),
                "{ok}"
            );
        }
        let errs = vs(json!({"hosts": ["a.com"], "gateways": ["ns/Bad_gw"], "http": route_to("a")}));
        assert_eq!(errs, ["spec.gateways[0]: invalid value for gateway name: \"Bad_gw\""]);
        let errs = vs(json!({"hosts": ["a.com"], "gateways": ["/gw"], "http": route_to("a")}));
        assert!(errs[0].contains("cannot be empty"), "{errs:?}");
    }

    #[test]
    fn jwt_claim_routes_need_a_gateway() {
        let http = json!([{"match": [{"headers": {"@request.auth.claims.group": {"exact": "a"}}}], "route": [{"destination": {"host": "a"}}]}]);
        assert!(vs(json!({"hosts": ["a.com"], "gateways": ["ns/gw"], "http": http.clone()})).is_empty());
        let errs = vs(json!({"hosts": ["a.com"], "http": http}));
        assert!(
            errs[0].starts_with("spec.http[0].match[0]: JWT claim based routing"),
            "{errs:?}"
        );
    }

    #[test]
    fn weights_and_destinations() {
        let two = |a: i32, b: i32| {
            vs(json!({"hosts": ["a.com"], "http": [{"route": [
            {"destination": {"host": "a", "subset": "v1"}, "weight": a},
            {"destination": {"host": "a", "subset": "v2"}, "weight": b}]}]}))
        };
        assert!(two(75, 25).is_empty());
        // Istio does not require a total of 100
        assert!(two(30, 30).is_empty());
        assert!(two(0, 100).is_empty());
        assert_eq!(two(-1, 100), ["spec.http[0].route[0].weight: weight -1 < 0"]);
        assert_eq!(two(0, 0), ["spec.http[0].route: total destination weight = 0"]);

        let dest = |d: Value| vs(json!({"hosts": ["a.com"], "http": [{"route": [{"destination": d}]}]}));
        assert_eq!(
            dest(json!({"host": "*"})),
            ["spec.http[0].route[0].destination.host: invalid destination host *"]
        );
        assert!(dest(json!({"host": ""}))[0].contains("empty domain name"));
        assert_eq!(
            dest(json!({"host": "a", "subset": "v_1"})),
            ["spec.http[0].route[0].destination.subset: subset name is invalid: v_1"]
        );
        assert!(
            dest(json!({"host": "a", "port": {"number": 0}}))[0]
                .starts_with("spec.http[0].route[0].destination.port.number: port number 0")
        );
    }

    #[test]
    fn tls_and_tcp_routes() {
        let tls = |sni: &str| {
            vs(
                json!({"hosts": ["*.example.com"], "tls": [{"match": [{"sniHosts": [sni], "port": 443}],
            "route": [{"destination": {"host": "a.example.com"}}]}]}),
            )
        };
        assert!(tls("a.example.com").is_empty());
        assert!(tls("10.0.0.1").is_empty());
        assert!(tls("other.com")[0].contains("is not a compatible subset"));
        let errs = vs(json!({"hosts": ["a.com"], "tls": [{"match": [{}]}]}));
        assert_eq!(
            errs,
            [
                "spec.tls[0].match[0]: TLS match must have at least one SNI host",
                "spec.tls[0]: TLS route is required"
            ]
        );
        // AUTO_PASSTHROUGH names on gateways
        let auto = vs(
            json!({"hosts": ["*"], "gateways": ["ns/gw"], "tls": [{"match": [{"sniHosts": ["outbound_.80_._.e2e.foo.mesh"]}],
            "route": [{"destination": {"host": "a.com"}}]}]}),
        );
        assert!(auto.is_empty(), "{auto:?}");

        let tcp = |m: Value| {
            vs(json!({"hosts": ["a.com"], "tcp": [{"match": [m], "route": [{"destination": {"host": "a"}}]}]}))
        };
        assert!(
            tcp(json!({"destinationSubnets": ["10.0.0.0/8"], "port": 3306, "sourceLabels": {"app": "x"}})).is_empty()
        );
        assert_eq!(
            tcp(json!({"destinationSubnets": ["10.0.0.0/33"]})),
            ["spec.tcp[0].match[0].destinationSubnets[0]: 10.0.0.0/33 is not a valid CIDR block"]
        );
        assert!(tcp(json!({"port": 70000}))[0].starts_with("spec.tcp[0].match[0].port"));
        assert_eq!(
            vs(json!({"hosts": ["a.com"], "tcp": [{}]})),
            ["spec.tcp[0]: TCP route is required"]
        );
    }

    #[test]
    fn string_matches_and_export_to() {
        let uri = |m: Value| {
            vs(
                json!({"hosts": ["a.com"], "http": [{"match": [{"uri": m}], "route": [{"destination": {"host": "a"}}]}]}),
            )
        };
        assert!(uri(json!({"prefix": "/api"})).is_empty());
        assert!(uri(json!({"prefix": ""})).is_empty());
        assert!(uri(json!({"regex": "^/v[0-9]+/.*"})).is_empty());
        assert!(uri(json!({"regex": "(?!x)"}))[0].starts_with("spec.http[0].match[0].uri: invalid regex"));
        assert_eq!(
            uri(json!({"regex": ""})),
            ["spec.http[0].match[0].uri: regex string match should not be empty"]
        );
        assert_eq!(
            uri(json!({"exact": "/a", "prefix": "/b"})),
            ["spec.http[0].match[0].uri: only one of exact, prefix or regex may be set"]
        );
        let method = vs(
            json!({"hosts": ["a.com"], "http": [{"match": [{"method": {"prefix": ""}}], "route": [{"destination": {"host": "a"}}]}]}),
        );
        assert_eq!(
            method,
            ["spec.http[0].match[0].method: prefix string match should not be empty"]
        );

        let export = |e: Value| vs(json!({"hosts": ["a.com"], "http": route_to("a"), "exportTo": e}));
        assert!(export(json!([".", "other"])).is_empty());
        assert!(export(json!(["~"]))[0].starts_with("spec.exportTo: exportTo ~ (none) is not allowed"));
    }
}
