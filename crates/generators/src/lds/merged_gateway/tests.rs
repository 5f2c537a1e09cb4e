//! Tests of gateway merging: ports, RDS names, conflicts and duplicate TLS hosts.

use std::sync::Arc;

use serde_json::json;

use super::*;

fn gateway(name: &str, ns: &str, servers: serde_json::Value) -> Arc<Config> {
    let doc = crate::testing::gateway(name, ns, servers);
    Arc::new(model::config::parse_config(doc, "default").unwrap())
}

fn https(port_name: &str, hosts: &[&str]) -> serde_json::Value {
    json!({"port": {"number": 443, "name": port_name, "protocol": "HTTPS"}, "hosts": hosts,
           "tls": {"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}})
}

#[test]
fn http_servers_of_several_gateways_share_one_route_name() {
    let a = gateway(
        "a",
        "ns1",
        json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["./a.com"]}]),
    );
    let b = gateway(
        "b",
        "ns2",
        json!([{"port": {"number": 80, "name": "web", "protocol": "HTTP"}, "hosts": ["*/b.com"]}]),
    );
    let mg = MergedGateway::merge(&[a, b], &[]);
    assert_eq!(mg.server_ports.len(), 1);
    let servers: Vec<_> = mg.servers_for_route("http.80").collect();
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].server.hosts, ["ns1/a.com"]);
    assert_eq!(servers[0].gateway_name, "ns1/a");
    assert_eq!(servers[1].server.hosts, ["b.com"]);
    assert_eq!(mg.merged_servers[&mg.server_ports[0]].route_name, "http.80");
}

#[test]
fn https_servers_get_their_own_route_names_and_sni_hosts() {
    let gw = gateway(
        "gw",
        "istio-system",
        json!([https("https-a", &["ns/a.com", "b.com"]), https("https-c", &["c.com"])]),
    );
    let mg = MergedGateway::merge(&[gw], &[]);
    assert_eq!(mg.server_ports.len(), 1, "both on one listener port");
    let names: Vec<_> = mg.servers_by_route_name.keys().cloned().collect();
    assert_eq!(
        names,
        ["https.443.https-a.gw.istio-system", "https.443.https-c.gw.istio-system"]
    );
    assert_eq!(mg.servers[0].sni_hosts, ["a.com", "b.com"]);
}

#[test]
fn duplicate_tls_hosts_and_protocol_conflicts_are_refused() {
    let first = gateway("a", "ns", json!([https("https-a", &["a.com"])]));
    let dup = gateway("b", "ns", json!([https("https-b", &["a.com"])]));
    let mg = MergedGateway::merge(&[first, dup], &[]);
    assert_eq!(mg.servers.len(), 1, "second server with the same SNI host dropped");

    let http = gateway(
        "a",
        "ns",
        json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
    );
    let tcp = gateway(
        "b",
        "ns",
        json!([{"port": {"number": 80, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]}]),
    );
    let mg = MergedGateway::merge(&[http, tcp], &[]);
    assert_eq!(mg.servers.len(), 1, "TCP cannot share a plaintext HTTP port");
}

#[test]
fn star_slash_star_means_every_host_and_passthrough_has_no_route() {
    let gw = gateway(
        "gw",
        "ns",
        json!([
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*/*"]},
            {"port": {"number": 443, "name": "tls", "protocol": "HTTPS"}, "hosts": ["x.com"], "tls": {"mode": "PASSTHROUGH"}}
        ]),
    );
    let mg = MergedGateway::merge(&[gw], &[]);
    assert_eq!(mg.servers[0].server.hosts, ["*"]);
    assert_eq!(mg.servers[1].route_name, "");
    assert!(is_passthrough_server(&mg.servers[1].server));
    assert_eq!(mg.servers_by_route_name.len(), 1);
}

#[test]
fn bind_addresses_make_separate_ports_and_route_names() {
    let gw = gateway(
        "gw",
        "ns",
        json!([
            {"port": {"number": 80, "name": "a", "protocol": "HTTP"}, "hosts": ["a.com"], "bind": "10.0.0.1"},
            {"port": {"number": 80, "name": "b", "protocol": "HTTP"}, "hosts": ["b.com"], "bind": "10.0.0.2"}
        ]),
    );
    let mg = MergedGateway::merge(&[gw], &[]);
    assert_eq!(mg.server_ports.len(), 2);
    assert!(mg.servers_by_route_name.contains_key("http.80.10.0.0.1"));
    assert!(mg.servers_by_route_name.contains_key("http.80.10.0.0.2"));
}

fn target(service_port: u32, target_port: u32) -> GatewayTarget {
    GatewayTarget {
        service_port,
        target_port,
        disable_translation: false,
    }
}

/// Istio's `resolvePorts` cases: a selector-based gateway takes the first target port of the
/// Service port, else the port itself; a Service-bound one takes every target port, and none.
#[test]
fn server_ports_resolve_through_the_service_target_ports() {
    let targets = [target(80, 8080), target(443, 8443), target(80, 9080)];
    assert_eq!(
        resolve_ports(80, &targets, true),
        [8080],
        "legacy: the first target only"
    );
    assert_eq!(
        resolve_ports(15443, &targets, true),
        [15443],
        "legacy: no Service port, as-is"
    );
    assert_eq!(resolve_ports(80, &targets, false), [8080, 9080]);
    assert!(
        resolve_ports(15443, &targets, false).is_empty(),
        "Service-bound: no port, no server"
    );
    let opted_out = GatewayTarget {
        disable_translation: true,
        ..target(80, 8080)
    };
    assert_eq!(
        resolve_ports(80, std::slice::from_ref(&opted_out), true),
        [80],
        "the label opts out of translation"
    );
    assert_eq!(
        resolve_ports(80, &[opted_out], false),
        [8080],
        "but only for legacy gateways"
    );
}

/// Istio's "targetPort overrides service port": the istioctl ingress gateway Service maps 80 to
/// 8080 and 443 to 8443, so the servers listen there and route names carry the target port.
#[test]
fn a_gateway_on_service_ports_listens_on_their_target_ports() {
    let gw = gateway(
        "gw",
        "istio-system",
        json!([
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]},
            https("https", &["a.com"])
        ]),
    );
    let mg = MergedGateway::merge(&[gw], &[target(80, 8080), target(443, 8443)]);
    let ports: Vec<u32> = mg.server_ports.iter().map(|p| p.number).collect();
    assert_eq!(ports, [8080, 8443]);
    let names: Vec<&str> = mg.servers_by_route_name.keys().map(String::as_str).collect();
    assert_eq!(names, ["http.8080", "https.8443.https.gw.istio-system"]);
    assert_eq!(
        mg.servers[0].port(),
        80,
        "the server keeps its own port for VirtualService matches"
    );
}

#[test]
fn auto_passthrough_servers_are_recorded_with_their_hosts() {
    let gw = gateway(
        "cross-network-gateway",
        "istio-system",
        json!([{"port": {"number": 15443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.local"],
                "tls": {"mode": "AUTO_PASSTHROUGH"}}]),
    );
    let mg = MergedGateway::merge(&[gw], &[]);
    assert!(mg.contains_auto_passthrough());
    assert_eq!(mg.auto_passthrough_hosts.iter().collect::<Vec<_>>(), ["*.local"]);
    let plain = MergedGateway::merge(
        &[gateway(
            "gw",
            "ns",
            json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
        )],
        &[],
    );
    assert!(!plain.contains_auto_passthrough());
}
