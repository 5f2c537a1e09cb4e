//! `DestinationRule` validation as Istio's `ValidateDestinationRule`: host, subsets, exportTo,
//! workload selector, and traffic policies (outlier detection, connection pool, client TLS).
//! Load balancer settings are in `load_balancer`.

use std::collections::BTreeSet;

use super::common::{
    Errors, check_duration, check_enum, check_export_to, check_labels, check_selector, validate_percent,
};
use super::hosts::validate_wildcard_domain;
use super::load_balancer::{check_load_balancer, check_tunnel_and_proxy_protocol};
use super::virtual_service::validate_subset_name;
use crate::config::Config;
use crate::networking::{ClientTlsSettings, ConnectionPoolSettings, DestinationRule, OutlierDetection, TrafficPolicy};

pub(crate) fn check_destination_rule(errs: &mut Errors, config: &Config, dr: &DestinationRule) {
    let ns = &config.meta.namespace;
    errs.check("spec.host", validate_wildcard_domain(&dr.host));
    check_traffic_policy(errs, "spec.trafficPolicy", ns, dr.traffic_policy.as_ref());
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let path = format!("spec.subsets[{i}]");
        if !names.insert(subset.name.as_str()) {
            errs.add(
                &format!("{path}.name"),
                format!("duplicate subset names: {}", subset.name),
            );
        }
        errs.check(&format!("{path}.name"), validate_subset_name(&subset.name));
        check_labels(errs, &format!("{path}.labels"), &subset.labels);
        check_traffic_policy(
            errs,
            &format!("{path}.trafficPolicy"),
            ns,
            subset.traffic_policy.as_ref(),
        );
    }
    check_export_to(
        errs,
        "spec.exportTo",
        ns,
        &dr.export_to,
        false,
        dr.workload_selector.is_some(),
    );
    if let Some(sel) = &dr.workload_selector {
        check_selector(errs, "spec.workloadSelector.matchLabels", &sel.match_labels);
    }
}

fn check_traffic_policy(errs: &mut Errors, path: &str, ns: &str, policy: Option<&TrafficPolicy>) {
    let Some(p) = policy else { return };
    if p.outlier_detection.is_none()
        && p.connection_pool.is_none()
        && p.load_balancer.is_none()
        && p.tls.is_none()
        && p.port_level_settings.is_empty()
        && p.tunnel.is_none()
        && p.proxy_protocol.is_none()
        && p.retry_budget.is_none()
    {
        errs.add(path, "traffic policy must have at least one field");
        return;
    }
    if p.tunnel.is_some() && p.proxy_protocol.is_some() {
        errs.add(path, "tunnel and proxyProtocol must not be set together");
        return;
    }
    check_outlier_detection(errs, &format!("{path}.outlierDetection"), p.outlier_detection.as_ref());
    check_connection_pool(errs, &format!("{path}.connectionPool"), p.connection_pool.as_ref());
    check_load_balancer(errs, &format!("{path}.loadBalancer"), p.load_balancer.as_ref());
    check_client_tls(errs, &format!("{path}.tls"), ns, p.tls.as_ref());
    check_tunnel_and_proxy_protocol(errs, path, p.tunnel.as_ref(), p.proxy_protocol.as_ref());
    for (i, pl) in p.port_level_settings.iter().enumerate() {
        let ppath = format!("{path}.portLevelSettings[{i}]");
        if pl.port.is_none() {
            errs.add(&ppath, "portTrafficPolicy must have valid port");
        }
        if pl.outlier_detection.is_none()
            && pl.connection_pool.is_none()
            && pl.load_balancer.is_none()
            && pl.tls.is_none()
        {
            errs.add(&ppath, "port traffic policy must have at least one field");
            continue;
        }
        check_outlier_detection(
            errs,
            &format!("{ppath}.outlierDetection"),
            pl.outlier_detection.as_ref(),
        );
        check_connection_pool(errs, &format!("{ppath}.connectionPool"), pl.connection_pool.as_ref());
        check_load_balancer(errs, &format!("{ppath}.loadBalancer"), pl.load_balancer.as_ref());
        check_client_tls(errs, &format!("{ppath}.tls"), ns, pl.tls.as_ref());
    }
}

pub(crate) fn check_outlier_detection(errs: &mut Errors, path: &str, outlier: Option<&OutlierDetection>) {
    let Some(o) = outlier else { return };
    check_duration(errs, &format!("{path}.baseEjectionTime"), o.base_ejection_time.as_ref());
    check_duration(errs, &format!("{path}.interval"), o.interval.as_ref());
    if !o.split_external_local_origin_errors.unwrap_or(false) && o.consecutive_local_origin_failures.unwrap_or(0) > 0 {
        errs.add(
            &format!("{path}.consecutiveLocalOriginFailures"),
            "outlier detection consecutive local origin failures is specified, but split external local origin errors is set to false",
        );
    }
    if let Some(p) = o.max_ejection_percent {
        errs.check(&format!("{path}.maxEjectionPercent"), validate_percent(p.into()));
    }
    if let Some(p) = o.min_health_percent {
        errs.check(&format!("{path}.minHealthPercent"), validate_percent(p.into()));
    }
}

/// `validateConnectionPool`, shared with Sidecar inbound connection pools.
pub(crate) fn check_connection_pool(errs: &mut Errors, path: &str, pool: Option<&ConnectionPoolSettings>) {
    let Some(pool) = pool else { return };
    if pool.http.is_none() && pool.tcp.is_none() {
        errs.add(path, "connection pool must have at least one field");
        return;
    }
    if let Some(h) = &pool.http {
        let hpath = format!("{path}.http");
        let non_negative = [
            ("http1MaxPendingRequests", h.http1_max_pending_requests),
            ("http2MaxRequests", h.http2_max_requests),
            ("maxRequestsPerConnection", h.max_requests_per_connection),
            ("maxRetries", h.max_retries),
            ("maxConcurrentStreams", h.max_concurrent_streams),
        ];
        for (field, v) in non_negative {
            if v.unwrap_or(0) < 0 {
                errs.add(&format!("{hpath}.{field}"), "must be non-negative");
            }
        }
        check_duration(errs, &format!("{hpath}.idleTimeout"), h.idle_timeout.as_ref());
        check_enum(
            errs,
            &format!("{hpath}.h2UpgradePolicy"),
            h.h2_upgrade_policy.as_ref(),
            &["DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"],
        );
        if h.h2_upgrade_policy.as_deref() == Some("UPGRADE") && h.use_client_protocol.unwrap_or(false) {
            errs.add(
                &hpath,
                "use client protocol must not be true when H2UpgradePolicy is UPGRADE",
            );
        }
        if let Some(ka) = &h.http2_keep_alive {
            let kpath = format!("{hpath}.http2KeepAlive");
            for (field, d) in [("interval", &ka.interval), ("timeout", &ka.timeout)] {
                match d {
                    None => errs.add(
                        &format!("{kpath}.{field}"),
                        format!("http2 keepalive {field} is required"),
                    ),
                    Some(d) => check_duration(errs, &format!("{kpath}.{field}"), Some(d)),
                }
            }
        }
    }
    if let Some(t) = &pool.tcp {
        let tpath = format!("{path}.tcp");
        if t.max_connections.unwrap_or(0) < 0 {
            errs.add(
                &format!("{tpath}.maxConnections"),
                "max connections must be non-negative",
            );
        }
        check_duration(errs, &format!("{tpath}.connectTimeout"), t.connect_timeout.as_ref());
        check_duration(
            errs,
            &format!("{tpath}.maxConnectionDuration"),
            t.max_connection_duration.as_ref(),
        );
        // an idle timeout of 0s disables it
        let idle = t
            .idle_timeout
            .as_ref()
            .filter(|d| crate::duration::parse(d).is_none_or(|d| d.as_millis() != 0));
        check_duration(errs, &format!("{tpath}.idleTimeout"), idle);
        if let Some(ka) = &t.tcp_keepalive {
            check_duration(errs, &format!("{tpath}.tcpKeepalive.time"), ka.time.as_ref());
            check_duration(errs, &format!("{tpath}.tcpKeepalive.interval"), ka.interval.as_ref());
        }
    }
}

/// `ValidateTLS`: client TLS towards the destination.
fn check_client_tls(errs: &mut Errors, path: &str, ns: &str, tls: Option<&ClientTlsSettings>) {
    let Some(tls) = tls else { return };
    check_enum(
        errs,
        &format!("{path}.mode"),
        tls.mode.as_ref(),
        &["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"],
    );
    let mode = tls.mode.as_deref().unwrap_or("DISABLE");
    let set = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    let credential = tls.credential_name.as_deref().unwrap_or("");
    if let Some(rest) = credential.strip_prefix("configmap://") {
        match rest.split_once('/') {
            Some((cm_ns, name)) if !cm_ns.is_empty() && !name.is_empty() => {
                if cm_ns != ns {
                    errs.add(
                        &format!("{path}.credentialName"),
                        format!("invalid configmap:// credentialName: namespace must match the configuration namespace {ns:?}"),
                    );
                }
            }
            _ => errs.add(
                &format!("{path}.credentialName"),
                format!("invalid configmap:// credentialName: {credential:?} expected configmap://<namespace>/<name>"),
            ),
        }
    }
    if tls.insecure_skip_verify.unwrap_or(false) {
        if mode == "SIMPLE"
            && (set(&tls.ca_certificates) || !credential.is_empty() || !tls.subject_alt_names.is_empty())
        {
            errs.add(path, "cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is set true");
        }
        if mode == "MUTUAL" && (set(&tls.ca_certificates) || !tls.subject_alt_names.is_empty()) {
            errs.add(
                path,
                "cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true",
            );
        }
    }
    if matches!(mode, "SIMPLE" | "MUTUAL") && !credential.is_empty() {
        if set(&tls.client_certificate) || set(&tls.ca_certificates) || set(&tls.private_key) || set(&tls.ca_crl) {
            errs.add(
                path,
                "cannot specify client certificates or CA certificate or CA CRL If credentialName is set",
            );
        }
        // certificates come from the credential
        return;
    }
    if mode == "MUTUAL" {
        if !set(&tls.client_certificate) {
            errs.add(
                &format!("{path}.clientCertificate"),
                "client certificate required for mutual tls",
            );
        }
        if !set(&tls.private_key) {
            errs.add(&format!("{path}.privateKey"), "private key required for mutual tls");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::validation::errors_of;

    fn dr(spec: Value) -> Vec<String> {
        errors_of("DestinationRule", spec)
    }

    fn policy(p: Value) -> Vec<String> {
        dr(json!({"host": "reviews", "trafficPolicy": p}))
    }

    #[test]
    fn host_subsets_export_to_selector() {
        assert!(dr(json!({"host": "reviews.prod.svc.cluster.local", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]})).is_empty());
        assert!(dr(json!({"host": "*.example.com"})).is_empty());
        assert_eq!(dr(json!({})), ["spec.host: empty domain name not allowed"]);
        assert!(dr(json!({"host": "foo*"}))[0].starts_with("spec.host: domain name \"foo*\" invalid"));
        let errs = dr(json!({"host": "r", "subsets": [{"name": "v1"}, {"name": "v1"}]}));
        assert_eq!(errs, ["spec.subsets[1].name: duplicate subset names: v1"]);
        assert_eq!(
            dr(json!({"host": "r", "subsets": [{"name": "v.1"}]})),
            ["spec.subsets[0].name: subset name is invalid: v.1"]
        );
        assert!(
            dr(json!({"host": "r", "subsets": [{"name": "v1", "labels": {"a": "b c"}}]}))[0]
                .starts_with("spec.subsets[0].labels")
        );
        assert!(
            dr(json!({"host": "r", "subsets": [{"name": "v1", "trafficPolicy": {}}]}))[0]
                .starts_with("spec.subsets[0].trafficPolicy: traffic policy must have at least one field")
        );
        let sel = |labels: Value, export: Value| {
            dr(json!({"host": "r", "workloadSelector": {"matchLabels": labels}, "exportTo": export}))
        };
        assert!(sel(json!({"app": "a"}), json!(["."])).is_empty());
        assert!(sel(json!({"app": "*"}), json!([]))[0].contains("wildcard is not supported"));
        assert!(sel(json!({"app": "a"}), json!(["*"]))[0].contains("beyond current namespace"));
    }

    #[test]
    fn traffic_policy_shape() {
        assert_eq!(
            policy(json!({})),
            ["spec.trafficPolicy: traffic policy must have at least one field"]
        );
        assert!(
            policy(json!({"tunnel": {"targetHost": "proxy.example.com", "targetPort": 443, "protocol": "CONNECT"}}))
                .is_empty()
        );
        assert!(policy(json!({"tunnel": {"targetHost": "proxy.example.com", "targetPort": 443}, "proxyProtocol": {"version": "V1"}}))[0]
            .contains("must not be set together"));
        assert!(policy(json!({"tunnel": {"targetHost": "", "targetPort": 0, "protocol": "PUT"}})).len() == 3);
        assert!(
            policy(json!({"proxyProtocol": {"version": "V3"}}))[0]
                .starts_with("spec.trafficPolicy.proxyProtocol.version")
        );
        let port_level = |p: Value| policy(json!({"portLevelSettings": [p]}));
        assert!(port_level(json!({"port": {"number": 80}, "tls": {"mode": "ISTIO_MUTUAL"}})).is_empty());
        assert_eq!(
            port_level(json!({"tls": {"mode": "ISTIO_MUTUAL"}})),
            ["spec.trafficPolicy.portLevelSettings[0]: portTrafficPolicy must have valid port"]
        );
        assert!(
            port_level(json!({"port": {"number": 80}}))[0].contains("port traffic policy must have at least one field")
        );
    }

    #[test]
    fn outlier_detection() {
        let od = |o: Value| policy(json!({"outlierDetection": o}));
        assert!(od(json!({"consecutive5xxErrors": 5, "interval": "10s", "baseEjectionTime": "30s", "maxEjectionPercent": 100})).is_empty());
        assert_eq!(
            od(json!({"maxEjectionPercent": 101})),
            ["spec.trafficPolicy.outlierDetection.maxEjectionPercent: percentage 101 is not in range 0..100"]
        );
        assert!(od(json!({"minHealthPercent": -1}))[0].contains("minHealthPercent"));
        assert!(od(json!({"interval": "0.5ms"}))[0].starts_with("spec.trafficPolicy.outlierDetection.interval"));
        assert!(od(json!({"consecutiveLocalOriginFailures": 3}))[0].contains("split external local origin errors"));
        assert!(od(json!({"consecutiveLocalOriginFailures": 3, "splitExternalLocalOriginErrors": true})).is_empty());
    }

    #[test]
    fn connection_pool() {
        let pool = |c: Value| policy(json!({"connectionPool": c}));
        assert!(
            pool(
                json!({"tcp": {"maxConnections": 100, "connectTimeout": "30ms", "idleTimeout": "0s",
            "tcpKeepalive": {"time": "7200s", "interval": "75s"}},
            "http": {"http2MaxRequests": 1000, "maxRequestsPerConnection": 10, "h2UpgradePolicy": "UPGRADE",
            "http2KeepAlive": {"interval": "15s", "timeout": "5s"}}})
            )
            .is_empty()
        );
        assert_eq!(
            pool(json!({})),
            ["spec.trafficPolicy.connectionPool: connection pool must have at least one field"]
        );
        assert_eq!(
            pool(json!({"tcp": {"maxConnections": -1}})),
            ["spec.trafficPolicy.connectionPool.tcp.maxConnections: max connections must be non-negative"]
        );
        assert_eq!(
            pool(json!({"http": {"maxRetries": -1}})),
            ["spec.trafficPolicy.connectionPool.http.maxRetries: must be non-negative"]
        );
        assert!(
            pool(json!({"http": {"h2UpgradePolicy": "UPGRADE", "useClientProtocol": true}}))[0]
                .contains("use client protocol")
        );
        assert!(pool(json!({"http": {"h2UpgradePolicy": "SOMETIMES"}}))[0].contains("unknown value"));
        assert_eq!(
            pool(json!({"http": {"http2KeepAlive": {"interval": "15s"}}})),
            ["spec.trafficPolicy.connectionPool.http.http2KeepAlive.timeout: http2 keepalive timeout is required"]
        );
        assert!(pool(json!({"tcp": {"connectTimeout": "0s"}}))[0].contains("greater than 1ms"));
    }

    #[test]
    fn client_tls() {
        let tls = |t: Value| policy(json!({"tls": t}));
        assert!(tls(json!({"mode": "SIMPLE", "sni": "a.com"})).is_empty());
        assert!(tls(json!({"mode": "MUTUAL", "clientCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem"})).is_empty());
        assert!(tls(json!({"mode": "MUTUAL", "credentialName": "client-secret"})).is_empty());
        assert_eq!(
            tls(json!({"mode": "MUTUAL"})),
            [
                "spec.trafficPolicy.tls.clientCertificate: client certificate required for mutual tls",
                "spec.trafficPolicy.tls.privateKey: private key required for mutual tls"
            ]
        );
        assert!(
            tls(json!({"mode": "SIMPLE", "credentialName": "s", "caCertificates": "/ca.pem"}))[0]
                .contains("If credentialName is set")
        );
        assert!(
            tls(json!({"mode": "SIMPLE", "insecureSkipVerify": true, "subjectAltNames": ["a"]}))[0]
                .contains("InsecureSkipVerify")
        );
        assert!(tls(json!({"mode": "STRICT"}))[0].starts_with("spec.trafficPolicy.tls.mode: unknown value"));
        assert!(tls(json!({"mode": "SIMPLE", "credentialName": "configmap://ns/ca"})).is_empty());
        assert!(
            tls(json!({"mode": "SIMPLE", "credentialName": "configmap://other/ca"}))[0]
                .contains("namespace must match")
        );
        assert!(tls(json!({"mode": "SIMPLE", "credentialName": "configmap://ca"}))[0].contains("invalid configmap://"));
    }
}
