//! Sidecar TCP/TLS outbound behaviour ("a TCP connection from sidecar X to address A port P goes
//! to cluster C", "a TLS connection with SNI S to port P goes to cluster C"), evaluated by an Envoy
//! filter chain matcher over the generated listeners; the golden file `lds_sidecar_tcp.json`;
//! the real Envoy's verdict on the listeners with the sidecar's clusters.

use std::collections::BTreeSet;
use std::net::IpAddr;

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::config::core::v3::{address, socket_address};
use xds_api::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener, filter};
use xds_api::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use super::build_listeners;
use super::sidecar::{HTTP_INSPECTOR, TCP_PROXY};
use super::sidecar_tcp::{NetworkChain, PASSTHROUGH_FILTER_CHAIN};
use crate::testing::{
    assert_golden, destination_rule, envoy_binary, proxy, push, push_with_mesh, rds_name, service_entry,
    virtual_service,
};

fn tcp_service(name: &str, host: &str, addresses: Value, port: Value) -> Value {
    let ns = if host.ends_with("istio-system.svc.cluster.local") {
        "istio-system"
    } else {
        "default"
    };
    service_entry(
        name,
        ns,
        json!({"hosts": [host], "addresses": addresses, "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [port], "endpoints": [{"address": "10.9.0.1", "labels": {"version": "v1"}},
                                          {"address": "10.9.0.2", "labels": {"version": "v2"}}]}),
    )
}

fn external_tls(name: &str, host: &str, port: u16, protocol: &str) -> Value {
    service_entry(
        name,
        "default",
        json!({"hosts": [host], "location": "MESH_EXTERNAL", "resolution": "DNS",
            "ports": [{"number": port, "name": format!("{}-{port}", protocol.to_lowercase()), "protocol": protocol}]}),
    )
}

const DB: &str = "db.default.svc.cluster.local";
const PAYMENTS: &str = "payments.default.svc.cluster.local";
const EGRESS: &str = "istio-egressgateway.istio-system.svc.cluster.local";

/// The mesh: TCP `db` (VIP, subsets v1/v2, a DestinationRule with TCP settings) with canary and
/// weighted `tcp` routes; `legacy-db` sent to db:5432; `ranges` (a CIDR) with a subnet route;
/// Mongo `mongo` whose routes apply to a gateway or another namespace only; external TLS
/// `api.example.com` and HTTPS `secure.example.com` (sent to the egress gateway by SNI) on 443
/// without VIP; HTTPS `payments` (VIP) with SNI routes; sniffed `cache` with a `tcp` route; Mongo
/// and TLS services without VIP sharing port 27018.
fn mesh() -> Vec<Value> {
    let port = |n: u16, name: &str, p: &str| json!({"number": n, "name": name, "protocol": p});
    vec![
        tcp_service("db", DB, json!(["240.0.0.20"]), port(5432, "tcp", "TCP")),
        destination_rule(
            "db",
            "default",
            json!({"host": DB, "trafficPolicy": {
                    "connectionPool": {"tcp": {"idleTimeout": "1h", "maxConnectionDuration": "10m"}},
                    "loadBalancer": {"consistentHash": {"useSourceIp": true}}},
                "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                            {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}]}),
        ),
        virtual_service(
            "db-routes",
            "default",
            json!({"hosts": ["db"], "tcp": [
                {"match": [{"sourceLabels": {"app": "canary"}}], "route": [{"destination": {"host": "db", "subset": "v2"}}]},
                {"match": [{"port": 9999}], "route": [{"destination": {"host": "legacy-db"}}]},
                {"route": [{"destination": {"host": "db", "subset": "v1"}, "weight": 80},
                           {"destination": {"host": "db", "subset": "v2"}, "weight": 20}]}]}),
        ),
        tcp_service(
            "legacy-db",
            "legacy-db.default.svc.cluster.local",
            json!(["240.0.0.21"]),
            port(3306, "mysql", "MySQL"),
        ),
        virtual_service(
            "legacy-db",
            "default",
            json!({"hosts": ["legacy-db"], "tcp": [{"route": [{"destination": {"host": "db", "port": {"number": 5432}}}]}]}),
        ),
        tcp_service(
            "ranges",
            "ranges.example.com",
            json!(["10.20.0.0/16"]),
            port(7000, "tcp", "TCP"),
        ),
        virtual_service(
            "ranges",
            "default",
            json!({"hosts": ["ranges.example.com"], "tcp": [
                {"match": [{"destinationSubnets": ["10.20.1.0/24"]}], "route": [{"destination": {"host": "db"}}]}]}),
        ),
        tcp_service(
            "mongo",
            "mongo.default.svc.cluster.local",
            json!(["240.0.0.22"]),
            port(27017, "mongo", "Mongo"),
        ),
        virtual_service(
            "mongo",
            "default",
            json!({"hosts": ["mongo"], "gateways": ["mesh", "istio-system/egress"], "tcp": [
                {"match": [{"gateways": ["istio-system/egress"]}], "route": [{"destination": {"host": "db"}}]},
                {"match": [{"sourceNamespace": "other"}], "route": [{"destination": {"host": "db"}}]}]}),
        ),
        virtual_service(
            "mongo-gateway-only",
            "default",
            json!({"hosts": ["mongo"], "gateways": ["istio-system/egress"],
                "tcp": [{"route": [{"destination": {"host": "db"}}]}]}),
        ),
        external_tls("api", "api.example.com", 443, "TLS"),
        external_tls("secure", "secure.example.com", 443, "HTTPS"),
        tcp_service("egress", EGRESS, json!(["240.0.0.30"]), port(443, "tls", "TLS")),
        virtual_service(
            "secure-via-egress",
            "default",
            json!({"hosts": ["secure.example.com"], "tls": [
                {"match": [{"sniHosts": ["secure.example.com"], "port": 443}],
                 "route": [{"destination": {"host": EGRESS, "port": {"number": 443}}}]}]}),
        ),
        tcp_service(
            "payments",
            PAYMENTS,
            json!(["240.0.0.40"]),
            port(8443, "https", "HTTPS"),
        ),
        destination_rule(
            "payments",
            "default",
            json!({"host": PAYMENTS, "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                                                 {"name": "v2", "labels": {"version": "v2"}}]}),
        ),
        virtual_service(
            "payments",
            "default",
            json!({"hosts": [PAYMENTS, "pay-alt.example.com"], "tls": [
                {"match": [{"sniHosts": [PAYMENTS], "sourceLabels": {"app": "canary"}}],
                 "route": [{"destination": {"host": "payments", "subset": "v2"}}]},
                {"match": [{"sniHosts": [PAYMENTS]}, {"sniHosts": ["pay-alt.example.com"]}],
                 "route": [{"destination": {"host": "payments", "subset": "v1"}, "weight": 90},
                           {"destination": {"host": "payments", "subset": "v2"}, "weight": 10}]}]}),
        ),
        tcp_service(
            "cache",
            "cache.default.svc.cluster.local",
            json!(["240.0.0.11"]),
            port(6379, "cache", ""),
        ),
        virtual_service(
            "cache",
            "default",
            json!({"hosts": ["cache"], "tcp": [{"route": [{"destination": {"host": "db", "subset": "v1"}}]}]}),
        ),
        tcp_service(
            "mongo-b",
            "mongo-b.default.svc.cluster.local",
            json!([]),
            port(27018, "mongo", "Mongo"),
        ),
        external_tls("tls-b", "tls-b.example.com", 27018, "TLS"),
    ]
}

/// Where a connection goes: one cluster, or weighted clusters.
#[derive(Debug, Clone, PartialEq)]
enum Upstream {
    Cluster(String),
    Weighted(Vec<(String, u32)>),
}

fn cluster(c: &str) -> Upstream {
    Upstream::Cluster(c.to_owned())
}

fn weighted(cs: &[(&str, u32)]) -> Upstream {
    Upstream::Weighted(cs.iter().map(|(c, w)| ((*c).to_owned(), *w)).collect())
}

fn listener_address(l: &Listener) -> (String, u32) {
    match l.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(s)) => match s.port_specifier {
            Some(socket_address::PortSpecifier::PortValue(p)) => (s.address.clone(), p),
            _ => (s.address.clone(), 0),
        },
        _ => (String::new(), 0),
    }
}

fn in_cidr(ip: IpAddr, prefix: &str, len: u32) -> bool {
    match (ip, prefix.parse::<IpAddr>()) {
        (IpAddr::V4(ip), Ok(IpAddr::V4(p))) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(ip) & mask == u32::from(p) & mask
        }
        _ => false,
    }
}

/// Envoy's filter chain selection: destination port, destination IP (longest prefix), server name
/// (exact, then longest wildcard suffix), transport protocol, application protocols; at each step the chains that specify
/// the criterion and match, else those that do not specify it; none left → the default chain.
fn select_chain<'a>(l: &'a Listener, dst: IpAddr, port: u32, sni: Option<&str>) -> Option<&'a FilterChain> {
    type Criterion<'c> = dyn Fn(&FilterChainMatch) -> Option<Option<usize>> + 'c;
    let by_port: &Criterion = &|m| m.destination_port.map(|p| (p.value == port).then_some(1));
    let by_ip: &Criterion = &|m| {
        (!m.prefix_ranges.is_empty()).then(|| {
            m.prefix_ranges
                .iter()
                .filter(|r| in_cidr(dst, &r.address_prefix, r.prefix_len.map_or(0, |l| l.value)))
                .map(|r| r.prefix_len.map_or(0, |l| l.value) as usize)
                .max()
        })
    };
    let by_sni: &Criterion = &|m| {
        (!m.server_names.is_empty()).then(|| {
            let sni = sni?;
            m.server_names
                .iter()
                .filter_map(|n| match n.strip_prefix('*') {
                    None => (n == sni).then_some(usize::MAX),
                    Some(suffix) => sni.ends_with(suffix).then_some(suffix.len()),
                })
                .max()
        })
    };
    let transport = if sni.is_some() { "tls" } else { "raw_buffer" };
    let by_transport: &Criterion =
        &|m| (!m.transport_protocol.is_empty()).then(|| (m.transport_protocol == transport).then_some(1));
    // these connections are not HTTP: http_inspector finds no application protocol
    let by_alpn: &Criterion = &|m| (!m.application_protocols.is_empty()).then_some(None);
    let mut candidates: Vec<&FilterChain> = l.filter_chains.iter().collect();
    for criterion in [by_port, by_ip, by_sni, by_transport, by_alpn] {
        let scored: Vec<(&FilterChain, Option<Option<usize>>)> = candidates
            .iter()
            .map(|c| (*c, c.filter_chain_match.as_ref().and_then(criterion)))
            .collect();
        let best = scored.iter().filter_map(|(_, s)| s.flatten()).max();
        candidates = match best {
            Some(best) => scored
                .iter()
                .filter(|(_, s)| *s == Some(Some(best)))
                .map(|(c, _)| *c)
                .collect(),
            None => scored.iter().filter(|(_, s)| s.is_none()).map(|(c, _)| *c).collect(),
        };
    }
    candidates.first().copied().or(l.default_filter_chain.as_ref())
}

fn tcp_proxy_of(c: &FilterChain) -> TcpProxy {
    let f = c.filters.iter().find(|f| f.name == TCP_PROXY).expect("a tcp_proxy");
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("tcp_proxy without typed config")
    };
    TcpProxy::decode(any.value.as_slice()).unwrap()
}

/// The chain a connection to `dst:port` (with `sni` for TLS) lands on: the listener of that
/// address, else of `0.0.0.0:port`, else virtualOutbound (as its original-destination hand-off).
fn connect<'a>(ls: &'a [Listener], dst: &str, port: u32, sni: Option<&str>) -> (&'a Listener, &'a FilterChain) {
    let ip: IpAddr = dst.parse().unwrap();
    let l = ls
        .iter()
        .find(|l| listener_address(l) == (dst.to_owned(), port))
        .or_else(|| ls.iter().find(|l| listener_address(l) == ("0.0.0.0".to_owned(), port)))
        .or_else(|| ls.iter().find(|l| l.name == "virtualOutbound"))
        .unwrap();
    let chain = select_chain(l, ip, port, sni).unwrap_or_else(|| panic!("no chain of {} for {dst}:{port}", l.name));
    (l, chain)
}

fn upstream(p: &TcpProxy) -> Upstream {
    match p.cluster_specifier.as_ref() {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => cluster(c),
        Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
            Upstream::Weighted(w.clusters.iter().map(|c| (c.name.clone(), c.weight)).collect())
        }
        None => panic!("tcp_proxy without cluster"),
    }
}

fn client() -> model::Proxy {
    proxy("sidecar", "default", json!({"app": "client"}))
}

fn canary() -> model::Proxy {
    proxy("sidecar", "default", json!({"app": "canary"}))
}

#[test]
fn tcp_connections_follow_the_first_applicable_tcp_route() {
    let p = push(mesh());
    let (client, canary) = (build_listeners(&client(), &p), build_listeners(&canary(), &p));
    let v1 = "outbound|5432|v1|db.default.svc.cluster.local";
    let v2 = "outbound|5432|v2|db.default.svc.cluster.local";
    let db = "outbound|5432||db.default.svc.cluster.local";
    #[rustfmt::skip]
    let cases: Vec<(&str, &[Listener], &str, u32, Upstream)> = vec![
        ("client → db: the weighted catch-all", &client, "240.0.0.20", 5432, weighted(&[(v1, 80), (v2, 20)])),
        ("canary → db: its sourceLabels route", &canary, "240.0.0.20", 5432, cluster(v2)),
        ("legacy-db → db with the destination's port", &client, "240.0.0.21", 3306, cluster(db)),
        ("ranges, in the routed subnet → db", &client, "10.20.1.5", 7000, cluster(db)),
        ("ranges, elsewhere in its CIDR → its own cluster", &client, "10.20.2.5", 7000, cluster("outbound|7000||ranges.example.com")),
        ("outside the CIDR → passthrough", &client, "10.30.0.1", 7000, cluster("PassthroughCluster")),
        ("mongo: gateway-only and other-namespace routes do not apply", &client, "240.0.0.22", 27017, cluster("outbound|27017||mongo.default.svc.cluster.local")),
        ("cache (sniffed), not HTTP: its tcp route", &client, "240.0.0.11", 6379, cluster(v1)),
        ("mongo-b keeps 0.0.0.0_27018 from a TLS service", &client, "10.1.1.1", 27018, cluster("outbound|27018||mongo-b.default.svc.cluster.local")),
    ];
    for (what, ls, dst, port, want) in cases {
        let (_, chain) = connect(ls, dst, port, None);
        assert_eq!(upstream(&tcp_proxy_of(chain)), want, "{what}");
    }
}

/// What, from whose listeners, to which address and port, with which SNI, goes where.
type TlsCase<'a> = (&'a str, &'a [Listener], &'a str, u32, &'a str, Upstream);

#[test]
fn tls_connections_are_routed_by_sni() {
    let p = push(mesh());
    let (client, canary) = (build_listeners(&client(), &p), build_listeners(&canary(), &p));
    let pay = |s: &str| format!("outbound|8443|{s}|{PAYMENTS}");
    let pay_weighted = weighted(&[(&pay("v1"), 90), (&pay("v2"), 10)]);
    #[rustfmt::skip]
    let cases: Vec<TlsCase> = vec![
        ("api.example.com, no VirtualService: its own cluster by SNI", &client, "93.184.216.34", 443, "api.example.com", cluster("outbound|443||api.example.com")),
        ("secure.example.com: the egress gateway", &client, "93.184.216.35", 443, "secure.example.com", cluster(&format!("outbound|443||{EGRESS}"))),
        ("unknown SNI: passthrough", &client, "93.184.216.36", 443, "other.example.org", cluster("PassthroughCluster")),
        ("egress gateway VIP: its own cluster", &client, "240.0.0.30", 443, "anything", cluster(&format!("outbound|443||{EGRESS}"))),
        ("payments: weighted", &client, "240.0.0.40", 8443, PAYMENTS, pay_weighted.clone()),
        ("payments from canary: its sourceLabels route wins the same SNI", &canary, "240.0.0.40", 8443, PAYMENTS, cluster(&pay("v2"))),
        ("payments from canary by another SNI: weighted", &canary, "240.0.0.40", 8443, "pay-alt.example.com", pay_weighted),
        ("payments VIP, SNI of no route: passthrough", &client, "240.0.0.40", 8443, "nope.example.com", cluster("PassthroughCluster")),
    ];
    for (what, ls, dst, port, sni, want) in cases {
        let (_, chain) = connect(ls, dst, port, Some(sni));
        assert_eq!(upstream(&tcp_proxy_of(chain)), want, "{what}");
    }
}

#[test]
fn listeners_keep_istio_names_binds_and_inspectors() {
    let ls = build_listeners(&client(), &push(mesh()));
    let by_name = |n: &str| {
        ls.iter()
            .find(|l| l.name == n)
            .unwrap_or_else(|| panic!("no listener {n}"))
    };
    for name in [
        "240.0.0.20_5432",
        "0.0.0.0_7000",
        "0.0.0.0_443",
        "240.0.0.30_443",
        "240.0.0.40_8443",
    ] {
        assert_eq!(by_name(name).bind_to_port.map(|b| b.value), Some(false), "{name}");
    }
    let tls_inspected = |n: &str| {
        by_name(n)
            .listener_filters
            .iter()
            .any(|f| f.name == super::gateway::TLS_INSPECTOR)
    };
    assert!(tls_inspected("0.0.0.0_443") && tls_inspected("240.0.0.40_8443"));
    assert!(
        !tls_inspected("240.0.0.30_443") && !tls_inspected("240.0.0.20_5432"),
        "no SNI match, no inspector"
    );
    let https = by_name("0.0.0.0_443");
    assert_eq!(
        https.listener_filters_timeout.map(|d| (d.seconds, d.nanos)),
        Some((0, 0))
    );
    assert_eq!(
        https.default_filter_chain.as_ref().map(|c| c.name.as_str()),
        Some(PASSTHROUGH_FILTER_CHAIN)
    );
    let cache = by_name("240.0.0.11_6379");
    assert!(cache.listener_filters.iter().any(|f| f.name == HTTP_INSPECTOR));
    assert!(
        cache
            .filter_chains
            .iter()
            .any(|c| rds_name(c).as_deref() == Some("cache.default.svc.cluster.local:6379")),
        "sniffed HTTP on the service's VIP routes by <host>:<port>, as Istio's"
    );
    // a single catch-all chain stays the only chain: no default chain
    assert!(by_name("240.0.0.20_5432").default_filter_chain.is_none());
    assert_eq!(
        by_name("0.0.0.0_27018").filter_chains.len(),
        1,
        "Mongo shares its port with nothing"
    );
}

#[test]
fn tcp_proxy_stat_prefix_and_destination_rule_settings() {
    let ls = build_listeners(&client(), &push(mesh()));
    let (_, chain) = connect(&ls, "240.0.0.20", 5432, None);
    let weighted = tcp_proxy_of(chain);
    assert_eq!(
        weighted.stat_prefix, "db-routes.default",
        "weighted: <vs name>.<vs namespace>"
    );
    assert_eq!(weighted.idle_timeout.map(|d| d.seconds), Some(3600));
    assert_eq!(
        weighted.max_downstream_connection_duration.map(|d| d.seconds),
        Some(600)
    );
    assert_eq!(weighted.hash_policy.len(), 1, "useSourceIp of the rule");
    let canary_ls = build_listeners(&canary(), &push(mesh()));
    let (_, chain) = connect(&canary_ls, "240.0.0.20", 5432, None);
    let single = tcp_proxy_of(chain);
    assert_eq!(single.stat_prefix, "outbound|5432|v2|db.default.svc.cluster.local");
    assert!(
        single.hash_policy.is_empty(),
        "subset v2's own load balancer has no consistent hash"
    );
    let (_, chain) = connect(&ls, "93.184.216.34", 443, Some("api.example.com"));
    let plain = tcp_proxy_of(chain);
    assert_eq!(plain.stat_prefix, "outbound|443||api.example.com");
    assert!(plain.idle_timeout.is_none());
}

#[test]
fn registry_only_blackholes_what_no_chain_claims() {
    let mut mesh_config = model::MeshConfig::default();
    mesh_config.outbound_traffic_policy.mode = "REGISTRY_ONLY".into();
    let ls = build_listeners(&client(), &push_with_mesh(mesh_config, mesh()));
    let (_, chain) = connect(&ls, "93.184.216.36", 443, Some("other.example.org"));
    assert_eq!(upstream(&tcp_proxy_of(chain)), cluster("BlackHoleCluster"));
}

#[test]
fn network_chains_conflict_when_envoy_cannot_tell_them_apart() {
    let chain = |sni: &[&str], cidrs: &[&str]| NetworkChain {
        sni_hosts: sni.iter().map(|s| s.to_string()).collect(),
        destination_cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
        filters: Vec::new(),
    };
    assert!(chain(&[], &[]).conflicts_with(&chain(&["*"], &["0.0.0.0/0"])));
    assert!(chain(&["a", "b"], &[]).conflicts_with(&chain(&["b", "a"], &[])));
    assert!(chain(&[], &["10.1.2.3/8"]).conflicts_with(&chain(&[], &["10.9.9.9/8"])));
    assert!(!chain(&["a"], &[]).conflicts_with(&chain(&["b"], &[])));
    assert!(!chain(&[], &["10.1.0.0/16"]).conflicts_with(&chain(&[], &["10.2.0.0/16"])));
    let m = chain(&["b", "a"], &["10.2.0.0/16", "10.1.0.7"])
        .filter_chain_match()
        .unwrap();
    assert_eq!(m.server_names, ["a", "b"]);
    let ranges: Vec<(String, u32)> = m
        .prefix_ranges
        .iter()
        .map(|r| (r.address_prefix.clone(), r.prefix_len.unwrap().value))
        .collect();
    assert_eq!(ranges, [("10.1.0.7".to_owned(), 32), ("10.2.0.0".to_owned(), 16)]);
    assert!(chain(&["*"], &[]).filter_chain_match().is_none(), "match-all");
}

/// The outbound TCP/TLS listeners of the client sidecar.
fn outbound_network_listeners() -> Vec<Listener> {
    build_listeners(&client(), &push(mesh()))
        .into_iter()
        .filter(|l| !l.name.starts_with("virtual"))
        .collect()
}

#[test]
fn lds_sidecar_tcp_golden() {
    let rendered: Vec<Value> = outbound_network_listeners()
        .iter()
        .map(|l| xds_api::json::message_to_json(l).unwrap())
        .collect();
    assert_golden(
        "lds_sidecar_tcp.json",
        &serde_json::to_string_pretty(&rendered).unwrap(),
    );
}

/// Every cluster a tcp_proxy names.
fn tcp_clusters(ls: &[Listener]) -> BTreeSet<String> {
    ls.iter()
        .flat_map(|l| l.filter_chains.iter().chain(l.default_filter_chain.iter()))
        .filter(|c| c.filters.iter().any(|f| f.name == TCP_PROXY))
        .flat_map(|c| match upstream(&tcp_proxy_of(c)) {
            Upstream::Cluster(c) => vec![c],
            Upstream::Weighted(w) => w.into_iter().map(|(c, _)| c).collect(),
        })
        .collect()
}

#[test]
fn envoy_accepts_tcp_and_tls_listeners_and_cds_serves_their_clusters() {
    let p = push(mesh());
    let proxy = client();
    let mut listeners = build_listeners(&proxy, &p);
    let clusters = crate::cds::build_clusters(&proxy, &p);
    let served: BTreeSet<String> = clusters.iter().map(|c| c.name.clone()).collect();
    let missing: Vec<_> = tcp_clusters(&listeners).difference(&served).cloned().collect();
    assert!(missing.is_empty(), "tcp_proxy clusters not in CDS: {missing:?}");

    let envoy = envoy_binary();
    // validate mode does not fetch RDS: the sniffed listener's HCM gets an inline route
    super::envoy_tests::inline_rds(&mut listeners, super::envoy_tests::passthrough_route);
    super::envoy_tests::assert_accepted_with_ads(
        &envoy,
        &proxy.node_id,
        listeners,
        clusters,
        "the sidecar's TCP/TLS config",
    );
}

#[test]
fn the_same_sni_hosts_in_another_order_keep_the_first_route() {
    let p = push(vec![
        service_entry(
            "dup",
            "default",
            json!({"hosts": ["*.dup.example.com"], "location": "MESH_EXTERNAL", "resolution": "NONE",
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        ),
        virtual_service(
            "dup",
            "default",
            json!({"hosts": ["*.dup.example.com"], "tls": [
                {"match": [{"sniHosts": ["a.dup.example.com", "b.dup.example.com"]}], "route": [{"destination": {"host": "a.dup.example.com"}}]},
                {"match": [{"sniHosts": ["b.dup.example.com", "a.dup.example.com"]}], "route": [{"destination": {"host": "b.dup.example.com"}}]}]}),
        ),
    ]);
    let ls = build_listeners(&client(), &p);
    let (l, chain) = connect(&ls, "93.184.216.34", 443, Some("b.dup.example.com"));
    assert_eq!(l.filter_chains.len(), 1, "Envoy refuses two chains with the same match");
    assert_eq!(
        upstream(&tcp_proxy_of(chain)),
        cluster("outbound|443||a.dup.example.com")
    );
}

/// A DestinationRule `tunnel` makes the tcp_proxy an HTTP CONNECT (or POST) tunnel, as Istio's
/// `tunnelingconfig.Apply`: the subset's tunnel for a route to a subset, the top-level one else.
#[test]
fn destination_rule_tunnel_becomes_the_tcp_proxy_tunneling_config() {
    let db = || {
        tcp_service(
            "db",
            "db.default.svc.cluster.local",
            json!(["240.0.0.20"]),
            json!({"number": 5432, "name": "tcp", "protocol": "TCP"}),
        )
    };
    let p = push(vec![
        db(),
        destination_rule(
            "db",
            "default",
            json!({"host": "db.default.svc.cluster.local",
                   "trafficPolicy": {"tunnel": {"protocol": "CONNECT", "targetHost": "db.example.com", "targetPort": 5432}},
                   "subsets": [{"name": "v2", "labels": {"version": "v2"},
                                "trafficPolicy": {"tunnel": {"protocol": "POST", "targetHost": "2001:db8::1", "targetPort": 443}}}]}),
        ),
    ]);
    let listeners = build_listeners(&client(), &p);
    let (_, chain) = connect(&listeners, "240.0.0.20", 5432, None);
    let tunnel = tcp_proxy_of(chain).tunneling_config.expect("a tunnel");
    assert_eq!(
        (tunnel.hostname.as_str(), tunnel.use_post),
        ("db.example.com:5432", false)
    );

    let p = push(vec![
        db(),
        destination_rule(
            "db",
            "default",
            json!({"host": "db.default.svc.cluster.local",
                   "subsets": [{"name": "v2", "labels": {"version": "v2"},
                                "trafficPolicy": {"tunnel": {"protocol": "POST", "targetHost": "2001:db8::1", "targetPort": 443}}}]}),
        ),
        virtual_service(
            "db",
            "default",
            json!({"hosts": ["db.default.svc.cluster.local"],
                   "tcp": [{"route": [{"destination": {"host": "db.default.svc.cluster.local", "subset": "v2"}}]}]}),
        ),
    ]);
    let listeners = build_listeners(&client(), &p);
    let (_, chain) = connect(&listeners, "240.0.0.20", 5432, None);
    let tunnel = tcp_proxy_of(chain).tunneling_config.expect("the subset's tunnel");
    assert_eq!((tunnel.hostname.as_str(), tunnel.use_post), ("[2001:db8::1]:443", true));
}
