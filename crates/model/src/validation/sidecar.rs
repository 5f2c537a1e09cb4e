//! `Sidecar` validation as Istio's `ValidateSidecar`: workload selector, ingress listeners (port,
//! bind, defaultEndpoint, TLS), egress listeners (`namespace/host` hosts, unix sockets, the catch-all
//! listener last), connection pools and the outbound traffic policy.

use std::collections::BTreeSet;

use super::common::{
    Errors, check_enum, check_selector, parse_protocol, validate_port, validate_port_name, validate_protocol,
    validate_unix_address,
};
use super::destination_rule::check_connection_pool;
use super::gateway::check_server_tls;
use super::hosts::{validate_fqdn, validate_ip, validate_namespace_slash_host};
use super::virtual_service::check_destination;
use crate::networking::{IstioIngressListener, OutboundTrafficPolicy, Sidecar, SidecarPort};

const UNIX_PREFIX: &str = "unix://";
const CAPTURE_MODES: &[&str] = &["DEFAULT", "IPTABLES", "NONE"];

pub(crate) fn check_sidecar(errs: &mut Errors, sc: &Sidecar) {
    if let Some(sel) = &sc.workload_selector {
        check_selector(errs, "spec.workloadSelector.labels", &sel.match_labels);
    }
    if sc.egress.is_empty()
        && sc.ingress.is_empty()
        && sc.outbound_traffic_policy.is_none()
        && sc.inbound_connection_pool.is_none()
    {
        errs.add("spec", "sidecar: empty configuration provided");
        return;
    }
    let mut ports = BTreeSet::new();
    for (i, ingress) in sc.ingress.iter().enumerate() {
        check_ingress(errs, &format!("spec.ingress[{i}]"), ingress, &mut ports);
    }
    check_connection_pool(errs, "spec.inboundConnectionPool", sc.inbound_connection_pool.as_ref());

    let mut ports = BTreeSet::new();
    let mut sockets = BTreeSet::new();
    let mut catch_all_found = false;
    for (i, egress) in sc.egress.iter().enumerate() {
        let path = format!("spec.egress[{i}]");
        check_enum(
            errs,
            &format!("{path}.captureMode"),
            egress.capture_mode.as_ref(),
            CAPTURE_MODES,
        );
        match &egress.port {
            None if catch_all_found => {
                errs.add(&path, "sidecar: egress can have only one listener with empty port");
                continue;
            }
            None if i == sc.egress.len() - 1 => catch_all_found = true,
            None => errs.add(
                &path,
                "sidecar: the egress listener with empty port should be the last listener in the list",
            ),
            Some(port) => {
                if port.target_port > 0 {
                    errs.add(
                        &format!("{path}.port.targetPort"),
                        "targetPort has no impact on Sidecars",
                    );
                }
                check_egress_port(errs, &path, port, &egress.bind, egress.capture_mode.as_deref());
                let unique = if port.number == 0 {
                    sockets.insert(egress.bind.clone())
                } else {
                    ports.insert(port.number)
                };
                if !unique {
                    let what = if port.number == 0 {
                        "unix domain socket values for listeners"
                    } else {
                        "ports on IP bound listeners"
                    };
                    errs.add(&format!("{path}.port"), format!("sidecar: {what} must be unique"));
                }
            }
        }
        if egress.hosts.is_empty() {
            errs.add(
                &format!("{path}.hosts"),
                "sidecar: egress listener must contain at least one host",
            );
        }
        for (j, host) in egress.hosts.iter().enumerate() {
            for e in validate_namespace_slash_host(host, false) {
                errs.add(&format!("{path}.hosts[{j}]"), e);
            }
        }
    }
    if let Some(tp) = &sc.outbound_traffic_policy {
        check_outbound_traffic_policy(errs, "spec.outboundTrafficPolicy", tp);
    }
}

fn check_ingress(errs: &mut Errors, path: &str, ingress: &IstioIngressListener, ports: &mut BTreeSet<u32>) {
    check_enum(
        errs,
        &format!("{path}.captureMode"),
        ingress.capture_mode.as_ref(),
        CAPTURE_MODES,
    );
    let Some(port) = &ingress.port else {
        errs.add(
            &format!("{path}.port"),
            "sidecar: port is required for ingress listeners",
        );
        return;
    };
    if port.target_port > 0 {
        errs.add(
            &format!("{path}.port.targetPort"),
            "targetPort has no impact on Sidecars",
        );
    }
    if !port.name.is_empty() {
        errs.check(&format!("{path}.port.name"), validate_port_name(&port.name));
    }
    errs.check(&format!("{path}.port.protocol"), validate_protocol(&port.protocol));
    errs.check(&format!("{path}.port.number"), validate_port(port.number.into()));
    if !ingress.bind.is_empty() {
        errs.check(&format!("{path}.bind"), validate_ip(&ingress.bind));
    }
    if !ports.insert(port.number) {
        errs.add(
            &format!("{path}.port"),
            "sidecar: ports on IP bound listeners must be unique",
        );
    }
    if !ingress.default_endpoint.is_empty() {
        check_default_endpoint(errs, &format!("{path}.defaultEndpoint"), &ingress.default_endpoint);
    }
    if let Some(tls) = &ingress.tls {
        let tpath = format!("{path}.tls");
        let unsupported = [
            (
                !tls.subject_alt_names.is_empty(),
                "subjectAltNames is not supported in ingress tls",
            ),
            (tls.https_redirect, "httpsRedirect is not supported"),
            (
                !tls.credential_name.is_empty(),
                "credentialName is not currently supported",
            ),
            (
                !tls.credential_names.is_empty(),
                "credentialNames is not currently supported",
            ),
            (
                !tls.tls_certificates.is_empty(),
                "tls_certificates is not currently supported",
            ),
        ];
        for (_, what) in unsupported.iter().filter(|(set, _)| *set) {
            errs.add(&tpath, format!("sidecar: {what}"));
        }
        if let Some(mode @ ("ISTIO_MUTUAL" | "AUTO_PASSTHROUGH")) = tls.mode.as_deref() {
            errs.add(
                &format!("{tpath}.mode"),
                format!("configuration is invalid: cannot set mode to {mode} in sidecar ingress tls"),
            );
        }
        if !parse_protocol(&port.protocol).is_some_and(|p| p.is_tls()) {
            errs.add(&tpath, "server cannot have TLS settings for non HTTPS/TLS ports");
        }
        check_server_tls(errs, &tpath, tls);
    }
    check_connection_pool(
        errs,
        &format!("{path}.connectionPool"),
        ingress.connection_pool.as_ref(),
    );
}

/// `127.0.0.1:<port>`, `0.0.0.0:<port>`, `[::1]:<port>`, `[::]:<port>`, `:<port>` or `unix://<path>`.
fn check_default_endpoint(errs: &mut Errors, path: &str, endpoint: &str) {
    if let Some(addr) = endpoint.strip_prefix(UNIX_PREFIX) {
        errs.check(path, validate_unix_address(addr));
        return;
    }
    let Some((host, port)) = split_host_port(endpoint) else {
        errs.add(path, format!("address {endpoint}: missing port in address"));
        return;
    };
    if !matches!(host, "" | "127.0.0.1" | "0.0.0.0" | "::1" | "::") {
        errs.add(path, "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,unix://filepath or unset");
    }
    match port.parse::<i64>() {
        Ok(p) => errs.check(path, validate_port(p)),
        Err(_) => errs.add(path, format!("sidecar: defaultEndpoint port ({port}) is not a number")),
    }
}

/// Go's `net.SplitHostPort` for `host:port` and `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return Some((host, after.strip_prefix(':')?));
    }
    let (host, port) = s.rsplit_once(':')?;
    (!host.contains(':')).then_some((host, port))
}

/// `validateSidecarEgressPortBindAndCaptureMode`: port 0 means a unix domain socket bind.
fn check_egress_port(errs: &mut Errors, path: &str, port: &SidecarPort, bind: &str, capture_mode: Option<&str>) {
    if !port.name.is_empty() {
        errs.check(&format!("{path}.port.name"), validate_port_name(&port.name));
    }
    errs.check(&format!("{path}.port.protocol"), validate_protocol(&port.protocol));
    if port.number == 0 {
        match bind.strip_prefix(UNIX_PREFIX) {
            None => errs.add(
                &format!("{path}.bind"),
                "sidecar: ports with 0 value must have a unix domain socket bind address",
            ),
            Some(addr) => errs.check(&format!("{path}.bind"), validate_unix_address(addr)),
        }
        if !matches!(capture_mode, None | Some("DEFAULT" | "NONE")) {
            errs.add(
                &format!("{path}.captureMode"),
                "sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners",
            );
        }
    } else {
        errs.check(&format!("{path}.port.number"), validate_port(port.number.into()));
        if !bind.is_empty() {
            errs.check(&format!("{path}.bind"), validate_ip(bind));
        }
    }
}

fn check_outbound_traffic_policy(errs: &mut Errors, path: &str, tp: &OutboundTrafficPolicy) {
    if tp.mode.as_deref() == Some("ALLOW_ANY_DYNAMIC_DNS") {
        errs.add(
            &format!("{path}.mode"),
            "sidecar: ALLOW_ANY_DYNAMIC_DNS mode is only supported in MeshConfig, not in Sidecar resource",
        );
        return;
    }
    check_enum(
        errs,
        &format!("{path}.mode"),
        tp.mode.as_ref(),
        &["REGISTRY_ONLY", "ALLOW_ANY"],
    );
    let Some(proxy) = &tp.egress_proxy else { return };
    let ppath = format!("{path}.egressProxy");
    if tp.mode.as_deref() != Some("ALLOW_ANY") {
        errs.add(
            &ppath,
            "sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode",
        );
        return;
    }
    errs.check(&format!("{ppath}.host"), validate_fqdn(&proxy.host));
    if proxy.port.is_none() {
        errs.add(&format!("{ppath}.port"), "sidecar: egress_proxy port must be non-nil");
        return;
    }
    check_destination(errs, &ppath, proxy);
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::split_host_port;
    use crate::validation::errors_of;

    fn sc(spec: Value) -> Vec<String> {
        errors_of("Sidecar", spec)
    }

    fn ingress(i: Value) -> Vec<String> {
        sc(json!({"ingress": [i]}))
    }

    #[test]
    fn empty_and_selector() {
        assert_eq!(sc(json!({})), ["spec: sidecar: empty configuration provided"]);
        assert!(sc(json!({"workloadSelector": {"labels": {"app": "a"}}, "egress": [{"hosts": ["./*"]}]})).is_empty());
        assert!(
            sc(json!({"workloadSelector": {"labels": {"app": "*"}}, "egress": [{"hosts": ["./*"]}]}))[0]
                .contains("wildcard")
        );
        assert!(sc(json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}})).is_empty());
    }

    #[test]
    fn egress_listeners() {
        assert!(sc(json!({"egress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "hosts": ["prod/*.example.com"], "bind": "127.0.0.1"},
            {"port": {"number": 0, "protocol": "HTTP"}, "bind": "unix:///var/run/app.sock", "captureMode": "NONE", "hosts": ["*/*"]},
            {"hosts": ["istio-system/*", "~ns/*"]}]})).is_empty());
        assert!(sc(json!({"egress": [{"hosts": ["reviews.example.com"]}]}))[0].contains("namespace/dnsName"));
        assert_eq!(
            sc(json!({"egress": [{"hosts": []}]})),
            ["spec.egress[0].hosts: sidecar: egress listener must contain at least one host"]
        );
        assert!(
            sc(json!({"egress": [{"hosts": ["./*"]}, {"port": {"number": 80}, "hosts": ["./*"]}]}))[0]
                .contains("should be the last")
        );
        let dup = sc(
            json!({"egress": [{"port": {"number": 80}, "hosts": ["./*"]}, {"port": {"number": 80}, "hosts": ["./*"]}]}),
        );
        assert_eq!(
            dup,
            ["spec.egress[1].port: sidecar: ports on IP bound listeners must be unique"]
        );
        assert!(
            sc(json!({"egress": [{"port": {"number": 0}, "hosts": ["./*"]}]}))[0].contains("unix domain socket bind")
        );
        assert!(sc(json!({"egress": [{"port": {"number": 0}, "bind": "unix:///s", "captureMode": "IPTABLES", "hosts": ["./*"]}]}))[0].contains("DEFAULT/NONE"));
        assert!(
            sc(json!({"egress": [{"port": {"number": 80, "protocol": "SMTP"}, "hosts": ["./*"]}]}))[0]
                .contains("unsupported protocol")
        );
        assert!(
            sc(json!({"egress": [{"port": {"number": 80, "targetPort": 8080}, "hosts": ["./*"]}]}))[0]
                .contains("targetPort")
        );
        assert!(sc(json!({"egress": [{"captureMode": "MAGIC", "hosts": ["./*"]}]}))[0].contains("unknown value"));
    }

    /// Egress hosts of Istio's `TestValidateSidecar`.
    #[test]
    fn istio_egress_hosts() {
        let hosts = |h: Value| sc(json!({"egress": [{"hosts": h}]}));
        for ok in [
            json!(["*/*"]),
            json!(["./foo.com"]),
            json!(["~/*"]),
            json!(["*/*", "~ns1/*"]),
            json!(["*/*", "~/foo.com"]),
        ] {
            assert!(hosts(ok.clone()).is_empty(), "{ok}");
        }
        for bad in [
            json!(["*/*", "~Invalid_NS/*"]),
            json!(["*"]),
            json!(["/"]),
            json!(["ns1/foo.*.bar.com"]),
        ] {
            assert!(!hosts(bad.clone()).is_empty(), "{bad}");
        }
        let uds = |bind: &str| {
            sc(
                json!({"egress": [{"port": {"protocol": "http", "number": 0, "name": "uds"}, "hosts": ["ns1/bar.com"], "bind": bind}]}),
            )
        };
        assert!(uds("unix:///@foo/bar/com").is_empty() && uds("unix:///foo/bar/com").is_empty());
        assert!(!uds("foobar:///@foo/bar/com").is_empty());
        let inbound_uds = sc(
            json!({"ingress": [{"port": {"protocol": "http", "number": 0, "name": "uds"}, "bind": "unix:///@foo/bar/com", "defaultEndpoint": "127.0.0.1:9999"}]}),
        );
        assert!(!inbound_uds.is_empty());
    }

    #[test]
    fn ingress_listeners() {
        assert!(ingress(json!({"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080"})).is_empty());
        assert!(ingress(json!({"port": {"number": 9080}, "defaultEndpoint": "unix:///var/run/app.sock"})).is_empty());
        assert!(ingress(json!({"port": {"number": 9080}, "defaultEndpoint": "[::1]:8080"})).is_empty());
        assert_eq!(
            ingress(json!({})),
            ["spec.ingress[0].port: sidecar: port is required for ingress listeners"]
        );
        assert!(
            ingress(json!({"port": {"number": 9080}, "defaultEndpoint": "10.0.0.1:8080"}))[0]
                .contains("defaultEndpoint must be of form")
        );
        assert!(
            ingress(json!({"port": {"number": 9080}, "defaultEndpoint": "127.0.0.1:http"}))[0].contains("not a number")
        );
        assert!(ingress(json!({"port": {"number": 0}}))[0].starts_with("spec.ingress[0].port.number"));
        let dup = sc(json!({"ingress": [{"port": {"number": 80}}, {"port": {"number": 80}}]}));
        assert_eq!(
            dup,
            ["spec.ingress[1].port: sidecar: ports on IP bound listeners must be unique"]
        );
        let tls = |t: Value, protocol: &str| ingress(json!({"port": {"number": 8443, "protocol": protocol}, "tls": t}));
        assert!(
            tls(
                json!({"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}),
                "HTTPS"
            )
            .is_empty()
        );
        assert!(
            tls(
                json!({"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}),
                "HTTP"
            )[0]
            .contains("non HTTPS/TLS")
        );
        assert!(tls(json!({"mode": "ISTIO_MUTUAL"}), "HTTPS")[0].contains("cannot set mode to ISTIO_MUTUAL"));
        assert!(
            tls(json!({"mode": "SIMPLE", "credentialName": "c"}), "HTTPS")[0]
                .contains("credentialName is not currently supported")
        );
        assert!(
            ingress(json!({"port": {"number": 80}, "connectionPool": {"tcp": {"maxConnections": -1}}}))[0]
                .contains("non-negative")
        );
        assert!(
            sc(json!({"inboundConnectionPool": {"http": {"idleTimeout": "0s"}}}))[0]
                .starts_with("spec.inboundConnectionPool.http.idleTimeout")
        );
        assert_eq!(split_host_port(":80"), Some(("", "80")));
        assert_eq!(split_host_port("[::]:80"), Some(("::", "80")));
        assert_eq!(split_host_port("::1:80"), None);
    }

    #[test]
    fn outbound_traffic_policy() {
        let otp = |p: Value| sc(json!({"outboundTrafficPolicy": p}));
        assert!(
            otp(json!({"mode": "ALLOW_ANY", "egressProxy": {"host": "egress.example.com", "port": {"number": 3128}}}))
                .is_empty()
        );
        assert!(otp(json!({"mode": "ALLOW_ANY_DYNAMIC_DNS"}))[0].contains("only supported in MeshConfig"));
        assert!(otp(json!({"mode": "BLOCK"}))[0].contains("unknown value"));
        assert!(
            otp(json!({"egressProxy": {"host": "egress.example.com", "port": {"number": 3128}}}))[0]
                .contains("only with ALLOW_ANY")
        );
        assert!(
            otp(json!({"mode": "ALLOW_ANY", "egressProxy": {"host": "egress.example.com"}}))[0]
                .contains("port must be non-nil")
        );
        assert!(
            otp(json!({"mode": "ALLOW_ANY", "egressProxy": {"host": "*.example.com", "port": {"number": 3128}}}))[0]
                .contains("invalid")
        );
    }
}
