//! `Gateway` validation as Istio's `ValidateGateway`: name, servers (hosts, port, bind, TLS presence
//! by protocol), unique port names, and server TLS settings (shared with Sidecar ingress TLS).

use std::collections::BTreeSet;

use super::common::{Errors, check_enum, parse_protocol, validate_port, validate_unix_address};
use super::hosts::{is_dns1123_label, validate_ip, validate_namespace_slash_host};
use crate::config::Config;
use crate::networking::{Gateway, Server, ServerTlsSettings};

const UNIX_PREFIX: &str = "unix://";

const TLS_VERSIONS: &[&str] = &["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"];

pub(crate) fn check_gateway(errs: &mut Errors, config: &Config, gw: &Gateway) {
    if !is_dns1123_label(&config.meta.name) {
        errs.add("metadata.name", format!("invalid gateway name: {:?}", config.meta.name));
    }
    if gw.servers.is_empty() {
        errs.add("spec.servers", "gateway must have at least one server");
    }
    let mut port_names = BTreeSet::new();
    for (i, server) in gw.servers.iter().enumerate() {
        let path = format!("spec.servers[{i}]");
        check_server(errs, &path, server);
        if let Some(port) = &server.port
            && !port_names.insert(port.name.as_str())
        {
            errs.add(
                &format!("{path}.port.name"),
                format!("port names in servers must be unique: duplicate name {}", port.name),
            );
        }
    }
}

fn check_server(errs: &mut Errors, path: &str, server: &Server) {
    if server.hosts.is_empty() {
        errs.add(&format!("{path}.hosts"), "server config must contain at least one host");
    }
    for (i, host) in server.hosts.iter().enumerate() {
        for e in validate_namespace_slash_host(host, true) {
            errs.add(&format!("{path}.hosts[{i}]"), e);
        }
    }
    let port_ok = match &server.port {
        None => {
            errs.add(&format!("{path}.port"), "port is required");
            false
        }
        Some(port) => {
            let ppath = format!("{path}.port");
            let mut ok = true;
            if parse_protocol(&port.protocol).is_none() {
                errs.add(&format!("{ppath}.protocol"), format!("invalid protocol {:?}, supported protocols are HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, MYSQL, TCP", port.protocol));
                ok = false;
            }
            if (port.number > 0 || !server.bind.starts_with(UNIX_PREFIX))
                && let Err(e) = validate_port(port.number.into())
            {
                errs.add(&format!("{ppath}.number"), e);
                ok = false;
            }
            if port.target_port > 0 {
                errs.add(&format!("{ppath}.targetPort"), "targetPort has no impact on Gateways");
                ok = false;
            }
            if port.name.is_empty() {
                errs.add(&format!("{ppath}.name"), "port name must be set");
                ok = false;
            }
            ok
        }
    };
    if let Some(addr) = server.bind.strip_prefix(UNIX_PREFIX) {
        errs.check(&format!("{path}.bind"), validate_unix_address(addr));
        if server.port.as_ref().is_some_and(|p| p.number != 0) {
            errs.add(
                &format!("{path}.port.number"),
                "port number must be 0 for unix domain socket",
            );
        }
    } else if !server.bind.is_empty() {
        errs.check(&format!("{path}.bind"), validate_ip(&server.bind));
    }
    if let Some(tls) = &server.tls {
        check_server_tls(errs, &format!("{path}.tls"), tls);
    }
    let Some(port) = server.port.as_ref().filter(|_| port_ok) else {
        return;
    };
    let protocol = parse_protocol(&port.protocol);
    let is_tls = protocol.is_some_and(|p| p.is_tls());
    match &server.tls {
        None if is_tls => errs.add(
            &format!("{path}.tls"),
            "server must have TLS settings for HTTPS/TLS protocols",
        ),
        Some(tls) if !is_tls => {
            if protocol.is_some_and(|p| p.is_http()) {
                // plain HTTP servers may only carry httpsRedirect
                let passthrough = matches!(
                    tls.mode.as_deref().unwrap_or("PASSTHROUGH"),
                    "PASSTHROUGH" | "AUTO_PASSTHROUGH"
                );
                if !passthrough
                    || !tls.ca_certificates.is_empty()
                    || !tls.private_key.is_empty()
                    || !tls.server_certificate.is_empty()
                {
                    errs.add(
                        &format!("{path}.tls"),
                        "server cannot have TLS settings for plain text HTTP ports",
                    );
                }
            } else {
                errs.add(
                    &format!("{path}.tls"),
                    "server cannot have TLS settings for non HTTPS/TLS ports",
                );
            }
        }
        _ => {}
    }
}

/// `validateTLSOptions`: certificate sources by TLS mode (the mode defaults to PASSTHROUGH).
pub(crate) fn check_server_tls(errs: &mut Errors, path: &str, tls: &ServerTlsSettings) {
    check_enum(
        errs,
        &format!("{path}.mode"),
        tls.mode.as_ref(),
        &[
            "PASSTHROUGH",
            "SIMPLE",
            "MUTUAL",
            "AUTO_PASSTHROUGH",
            "ISTIO_MUTUAL",
            "OPTIONAL_MUTUAL",
        ],
    );
    check_enum(
        errs,
        &format!("{path}.minProtocolVersion"),
        tls.min_protocol_version.as_ref(),
        TLS_VERSIONS,
    );
    check_enum(
        errs,
        &format!("{path}.maxProtocolVersion"),
        tls.max_protocol_version.as_ref(),
        TLS_VERSIONS,
    );
    if tls.credential_names.len() > 2 || tls.tls_certificates.len() > 2 {
        errs.add(path, "at most 2 credentialNames or tlsCertificates may be set");
    }
    let mode = tls.mode.as_deref().unwrap_or("PASSTHROUGH");
    if mode == "ISTIO_MUTUAL" {
        let fields = [
            (!tls.server_certificate.is_empty(), "server certificate"),
            (!tls.private_key.is_empty(), "private key"),
            (!tls.ca_certificates.is_empty(), "CA bundle"),
            (!tls.tls_certificates.is_empty(), "tlsCertificates"),
            (!tls.credential_name.is_empty(), "credentialName"),
            (!tls.credential_names.is_empty(), "credentialNames"),
        ];
        for (_, what) in fields.iter().filter(|(set, _)| *set) {
            errs.add(path, format!("ISTIO_MUTUAL TLS cannot have associated {what}"));
        }
        return;
    }
    let sources = [
        !tls.server_certificate.is_empty() && !tls.private_key.is_empty(),
        !tls.credential_name.is_empty(),
        !tls.credential_names.is_empty(),
        !tls.tls_certificates.is_empty(),
    ];
    if sources.iter().filter(|s| **s).count() > 1 {
        errs.add(path, "only one of credential_name, credential_names, server_certificate/private_key, tls_certificates should be specified");
    }
    let terminating = matches!(mode, "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL");
    if terminating && (!tls.credential_name.is_empty() || !tls.credential_names.is_empty()) {
        // certificates are fetched from the credential
        return;
    }
    if terminating {
        let prefix = if mode == "SIMPLE" { "SIMPLE TLS" } else { "MUTUAL TLS" };
        if mode != "SIMPLE" && tls.ca_certificates.is_empty() {
            errs.add(
                &format!("{path}.caCertificates"),
                format!("{prefix} requires a client CA bundle"),
            );
        }
        let certs: Vec<(String, String)> = if tls.tls_certificates.is_empty() {
            vec![(tls.server_certificate.clone(), tls.private_key.clone())]
        } else {
            let field = |c: &serde_json::Value, f: &str| c.get(f).and_then(|v| v.as_str()).unwrap_or("").to_owned();
            tls.tls_certificates
                .iter()
                .map(|c| (field(c, "serverCertificate"), field(c, "privateKey")))
                .collect()
        };
        for (cert, key) in certs {
            if cert.is_empty() {
                errs.add(path, format!("{prefix} requires a server certificate"));
            }
            if key.is_empty() {
                errs.add(path, format!("{prefix} requires a private key"));
            }
        }
    }
    if !tls.ca_crl.is_empty() {
        if !tls.credential_name.is_empty() {
            errs.add(
                &format!("{path}.caCrl"),
                "CRL is not supported with credentialName. CRL has to be specified in the credential",
            );
        }
        if mode == "SIMPLE" {
            errs.add(&format!("{path}.caCrl"), "CRL is not supported with SIMPLE TLS");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::validation::{errors_of, errors_with_meta};

    fn server(s: Value) -> Vec<String> {
        errors_of(
            "Gateway",
            json!({"selector": {"istio": "ingressgateway"}, "servers": [s]}),
        )
    }

    fn http_server(hosts: Value) -> Value {
        json!({"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": hosts})
    }

    #[test]
    fn servers_and_hosts() {
        assert!(
            server(http_server(json!([
                "*",
                "ns/a.example.com",
                "./*.example.com",
                "*/b.example.com",
                "10.0.0.1"
            ])))
            .is_empty()
        );
        assert_eq!(
            errors_of("Gateway", json!({})),
            ["spec.servers: gateway must have at least one server"]
        );
        assert_eq!(
            server(http_server(json!([]))),
            ["spec.servers[0].hosts: server config must contain at least one host"]
        );
        assert!(server(http_server(json!(["reviews"])))[0].contains("short names"));
        assert!(
            server(http_server(json!(["ns/foo*.com"])))
                .iter()
                .any(|e| e.contains("partial wildcard"))
        );
        assert!(server(http_server(json!(["Bad_ns/a.com"])))[0].contains("invalid namespace value"));
        let errs = errors_with_meta(
            "Gateway",
            json!({"name": "my.gateway", "namespace": "ns"}),
            json!({"servers": [http_server(json!(["*"]))]}),
        );
        assert_eq!(errs, ["metadata.name: invalid gateway name: \"my.gateway\""]);
        let dup = errors_of(
            "Gateway",
            json!({"servers": [http_server(json!(["a.com"])), http_server(json!(["b.com"]))]}),
        );
        assert_eq!(
            dup,
            ["spec.servers[1].port.name: port names in servers must be unique: duplicate name http"]
        );
    }

    #[test]
    fn ports_and_binds() {
        let port = |p: Value| server(json!({"port": p, "hosts": ["*"]}));
        assert!(port(json!({"number": 0, "name": "x", "protocol": "SMTP"}))[0].contains("invalid protocol"));
        assert!(
            port(json!({"number": 70000, "name": "x", "protocol": "TCP"}))[0]
                .starts_with("spec.servers[0].port.number")
        );
        assert!(port(json!({"number": 80, "name": "", "protocol": "HTTP"}))[0].contains("port name must be set"));
        assert!(
            port(json!({"number": 80, "name": "x", "protocol": "HTTP", "targetPort": 8080}))[0].contains("targetPort")
        );
        assert_eq!(
            server(json!({"hosts": ["*"]})),
            ["spec.servers[0].port: port is required"]
        );
        let bind = |b: &str, n: u32| {
            server(json!({"port": {"number": n, "name": "x", "protocol": "HTTP"}, "hosts": ["*"], "bind": b}))
        };
        assert!(bind("0.0.0.0", 80).is_empty());
        assert!(bind("unix:///var/run/gw.sock", 0).is_empty());
        assert!(bind("unix:///var/run/gw.sock", 80)[0].contains("must be 0 for unix domain socket"));
        assert!(bind("localhost", 80)[0].contains("not a valid IP"));
    }

    #[test]
    fn tls_presence_by_protocol() {
        let https = |tls: Value| {
            server(json!({"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*"], "tls": tls}))
        };
        assert!(https(json!({"mode": "SIMPLE", "credentialName": "cert"})).is_empty());
        assert!(https(json!({"mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem"})).is_empty());
        assert!(https(json!({"mode": "PASSTHROUGH"})).is_empty());
        assert!(
            https(json!({"mode": "SIMPLE"}))
                .iter()
                .any(|e| e.contains("SIMPLE TLS requires a server certificate"))
        );
        assert!(
            https(json!({"mode": "MUTUAL", "serverCertificate": "/c", "privateKey": "/k"}))[0]
                .contains("client CA bundle")
        );
        assert!(
            https(json!({"mode": "ISTIO_MUTUAL", "credentialName": "x"}))[0]
                .contains("ISTIO_MUTUAL TLS cannot have associated credentialName")
        );
        assert!(
            https(json!({"mode": "SIMPLE", "credentialName": "a", "serverCertificate": "/c", "privateKey": "/k"}))[0]
                .contains("only one of credential_name")
        );
        assert!(
            https(json!({"mode": "PASSTHROUGH", "credentialName": "a", "caCrl": "/crl"}))[0]
                .contains("CRL is not supported with credentialName")
        );
        let simple_crl =
            https(json!({"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k", "caCrl": "/crl"}));
        assert_eq!(
            simple_crl,
            ["spec.servers[0].tls.caCrl: CRL is not supported with SIMPLE TLS"]
        );
        assert!(
            https(json!({"mode": "SIMPLE", "credentialName": "a", "minProtocolVersion": "SSLV3"}))[0]
                .contains("unknown value")
        );
        assert!(
            https(json!({"mode": "SIMPLE", "tlsCertificates": [{"serverCertificate": "/c"}]}))[0]
                .contains("requires a private key")
        );
        assert_eq!(
            server(json!({"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*"]})),
            ["spec.servers[0].tls: server must have TLS settings for HTTPS/TLS protocols"]
        );
        let http_tls = |tls: Value| {
            server(json!({"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": tls}))
        };
        assert!(http_tls(json!({"httpsRedirect": true})).is_empty());
        assert!(http_tls(json!({"mode": "SIMPLE", "credentialName": "c"}))[0].contains("plain text HTTP ports"));
        let tcp = server(
            json!({"port": {"number": 31400, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}}),
        );
        assert!(tcp[0].contains("non HTTPS/TLS ports"));
    }
}
