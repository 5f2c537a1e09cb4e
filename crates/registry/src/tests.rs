//! Behaviour tests of `build` and `diff` on small ServiceEntries and WorkloadEntries.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use model::config::{ConfigMeta, parse_config};
use model::service::Visibility;
use model::{Config, ConfigKind, ConfigSpec, MeshConfig, Protocol, Resolution};
use serde_json::{Value, json};

use crate::{RegistrySnapshot, ServiceKey, build, visible_from};

pub(crate) fn se(ns: &str, name: &str, spec: Value) -> Arc<Config> {
    let doc = json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "payments"}}, "spec": spec});
    Arc::new(parse_config(doc, "default").unwrap())
}

pub(crate) fn we(ns: &str, name: &str, meta_labels: Value, spec: Value) -> Arc<Config> {
    let doc = json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
        "metadata": {"name": name, "namespace": ns, "labels": meta_labels}, "spec": spec});
    Arc::new(parse_config(doc, "default").unwrap())
}

/// A ServiceEntry that validation would reject, built without it.
pub(crate) fn unvalidated_se(ns: &str, name: &str, spec: Value) -> Arc<Config> {
    let meta = ConfigMeta {
        name: name.into(),
        namespace: ns.into(),
        ..Default::default()
    };
    Arc::new(Config {
        kind: ConfigKind::ServiceEntry,
        meta,
        spec: ConfigSpec::ServiceEntry(serde_json::from_value(spec).unwrap()),
    })
}

pub(crate) fn key(host: &str, ns: &str) -> ServiceKey {
    ServiceKey::new(host, ns)
}

pub(crate) fn snapshot(configs: &[Arc<Config>]) -> RegistrySnapshot {
    build(configs, &MeshConfig::default())
}

/// (address, port, service port name) of a service's endpoints.
pub(crate) fn eps(s: &RegistrySnapshot, host: &str, ns: &str) -> Vec<(String, u16, String)> {
    s.endpoints_of(&key(host, ns))
        .iter()
        .map(|e| (e.address.clone(), e.endpoint_port, e.service_port_name.clone()))
        .collect()
}

pub(crate) fn ep(addr: &str, port: u16, name: &str) -> (String, u16, String) {
    (addr.to_owned(), port, name.to_owned())
}

#[test]
fn one_service_per_host_with_ports_addresses_and_attributes() {
    let s = snapshot(&[se(
        "web",
        "ext",
        json!({
            "hosts": ["api.example.com", "short"],
            "addresses": ["10.1.0.0/16", "10.2.0.7/32"],
            "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"},
                      {"number": 8080, "name": "http-alt", "protocol": ""},
                      {"number": 9000, "name": "data"}],
            "location": "MESH_INTERNAL",
            "resolution": "NONE",
            "workloadSelector": {"labels": {"app": "api"}}
        }),
    )]);
    assert_eq!(s.services.len(), 2);
    // hosts as written, short names included; sorted by hostname
    assert_eq!(s.services[0].hostname, "api.example.com");
    assert_eq!(s.services[1].hostname, "short");
    let svc = s.service("api.example.com", "web").unwrap();
    let ports: Vec<_> = svc
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.port, p.protocol))
        .collect();
    assert_eq!(
        ports,
        vec![
            ("https", 443, Protocol::Https),
            ("http-alt", 8080, Protocol::Http),
            ("data", 9000, Protocol::Unsupported)
        ]
    );
    assert_eq!(svc.addresses, vec!["10.1.0.0/16", "10.2.0.7"]);
    assert_eq!(svc.resolution, Resolution::Passthrough);
    assert!(!svc.mesh_external);
    assert_eq!(svc.attributes.service_registry, "External");
    assert_eq!(svc.attributes.name, "api.example.com");
    assert_eq!(svc.attributes.namespace, "web");
    assert_eq!(svc.attributes.labels["team"], "payments");
    assert_eq!(svc.attributes.label_selectors["app"], "api");
    assert_eq!(svc.attributes.export_to, vec![Visibility::Public]);
    assert_eq!(svc.origin, "ServiceEntry/web/ext");
}

#[test]
fn resolution_and_location_defaults() {
    let s = snapshot(&[
        se(
            "a",
            "none",
            json!({"hosts": ["none.example.com"], "ports": [{"number": 80, "name": "http"}]}),
        ),
        se(
            "a",
            "rr",
            json!({"hosts": ["rr.example.com"], "ports": [{"number": 80, "name": "http"}], "resolution": "DNS_ROUND_ROBIN"}),
        ),
    ]);
    let none = s.service("none.example.com", "a").unwrap();
    assert_eq!(none.resolution, Resolution::Passthrough);
    assert!(none.mesh_external);
    assert!(none.addresses.is_empty());
    assert_eq!(
        s.service("rr.example.com", "a").unwrap().resolution,
        Resolution::DnsRoundRobinLb
    );
}

#[test]
fn export_to_from_entry_or_mesh_default() {
    let configs = [
        se(
            "a",
            "own",
            json!({"hosts": ["own.example.com"], "ports": [{"number": 80, "name": "http"}], "exportTo": [".", "b"]}),
        ),
        se(
            "a",
            "dflt",
            json!({"hosts": ["dflt.example.com"], "ports": [{"number": 80, "name": "http"}]}),
        ),
    ];
    let mesh = MeshConfig {
        default_service_export_to: vec![".".into()],
        ..Default::default()
    };
    let s = build(&configs, &mesh);
    let own = s.service("own.example.com", "a").unwrap();
    assert_eq!(
        own.attributes.export_to,
        vec![Visibility::Private, Visibility::Namespace("b".into())]
    );
    assert!(visible_from(own, "a") && visible_from(own, "b") && !visible_from(own, "c"));
    let dflt = s.service("dflt.example.com", "a").unwrap();
    assert_eq!(dflt.attributes.export_to, vec![Visibility::Private]);
    assert!(visible_from(dflt, "a") && !visible_from(dflt, "b"));
}

#[test]
fn inline_endpoints_port_mapping_and_workload_fields() {
    let s = snapshot(&[se(
        "shop",
        "db",
        json!({
            "hosts": ["db.example.com"],
            "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP", "targetPort": 15432},
                      {"number": 80, "name": "http"},
                      {"number": 9090, "name": "metrics", "targetPort": 9191}],
            "resolution": "STATIC",
            "endpoints": [
                {"address": "10.0.0.1", "ports": {"tcp-pg": 6432}, "labels": {"version": "v1"},
                 "locality": "us-east/zone-a/rack-1", "weight": 3, "network": "net-1", "serviceAccount": "db-sa"},
                {"address": "10.0.0.2", "labels": {"istio-locality": "eu.zone-b"}}
            ]
        }),
    )]);
    assert_eq!(
        eps(&s, "db.example.com", "shop"),
        vec![
            ep("10.0.0.1", 80, "http"),
            ep("10.0.0.2", 80, "http"),
            ep("10.0.0.1", 9191, "metrics"),
            ep("10.0.0.2", 9191, "metrics"),
            // workload port by name beats targetPort
            ep("10.0.0.1", 6432, "tcp-pg"),
            ep("10.0.0.2", 15432, "tcp-pg"),
        ]
    );
    assert_eq!(
        s.service("db.example.com", "shop").unwrap().resolution,
        Resolution::ClientSideLb
    );
    let first = &s.endpoints_of(&key("db.example.com", "shop"))[0];
    assert_eq!(first.locality.to_string(), "us-east/zone-a/rack-1");
    assert_eq!(first.weight, 3);
    assert_eq!(first.network, "net-1");
    assert_eq!(first.namespace, "shop");
    assert_eq!(first.service_account, "spiffe://cluster.local/ns/shop/sa/db-sa");
    assert_eq!(first.tls_mode(), "istio");
    assert_eq!(first.origin, "ServiceEntry/shop/db");
    assert_eq!(first.labels["version"], "v1");
    assert_eq!(first.labels["topology.kubernetes.io/region"], "us-east");
    assert_eq!(first.labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(first.labels["topology.istio.io/subzone"], "rack-1");
    assert_eq!(first.labels["topology.istio.io/network"], "net-1");
    let second = &s.endpoints_of(&key("db.example.com", "shop"))[1];
    assert_eq!(second.locality.to_string(), "eu/zone-b/");
    assert_eq!(second.tls_mode(), "disabled");
}

#[test]
fn dns_entry_without_endpoints_resolves_its_hosts() {
    let s = snapshot(&[
        se(
            "a",
            "dns",
            json!({"hosts": ["a.example.com", "b.example.com"], "resolution": "DNS",
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}, {"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}]}),
        ),
        se(
            "a",
            "static",
            json!({"hosts": ["s.example.com"], "resolution": "STATIC", "ports": [{"number": 80, "name": "http"}]}),
        ),
    ]);
    assert_eq!(
        eps(&s, "a.example.com", "a"),
        vec![ep("a.example.com", 8080, "http"), ep("a.example.com", 443, "tls")]
    );
    assert_eq!(
        eps(&s, "b.example.com", "a"),
        vec![ep("b.example.com", 8080, "http"), ep("b.example.com", 443, "tls")]
    );
    let e = &s.endpoints_of(&key("a.example.com", "a"))[0];
    assert!(e.labels.is_empty() && e.service_account.is_empty());
    assert_eq!(e.namespace, "a");
    assert!(eps(&s, "s.example.com", "a").is_empty());
    assert!(!s.endpoints.contains_key(&key("s.example.com", "a")));
}

#[test]
fn dns_wildcard_host_and_invalid_addresses_give_no_endpoint() {
    let s = snapshot(&[
        unvalidated_se(
            "a",
            "wild",
            json!({"hosts": ["*.example.com"], "resolution": "DNS", "ports": [{"number": 80, "name": "http"}]}),
        ),
        unvalidated_se(
            "a",
            "bad",
            json!({"hosts": ["bad.example.com"], "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http"}, {"number": 70000, "name": "huge"}],
            "endpoints": [{"address": "not an address"}, {"address": "10.0.0.9"}, {"address": ""}]}),
        ),
    ]);
    assert!(s.service("*.example.com", "a").is_some());
    assert!(eps(&s, "*.example.com", "a").is_empty());
    assert_eq!(s.service("bad.example.com", "a").unwrap().ports.len(), 1);
    assert_eq!(eps(&s, "bad.example.com", "a"), vec![ep("10.0.0.9", 80, "http")]);
}

#[test]
fn unix_socket_endpoint_keeps_address_and_has_no_port() {
    let s = snapshot(&[se(
        "a",
        "uds",
        json!({"hosts": ["uds.local"], "resolution": "STATIC",
        "ports": [{"number": 80, "name": "http", "targetPort": 8080}],
        "endpoints": [{"address": "unix:///var/run/app.sock"}]}),
    )]);
    assert_eq!(
        eps(&s, "uds.local", "a"),
        vec![ep("unix:///var/run/app.sock", 0, "http")]
    );
}

#[test]
fn workload_selector_picks_matching_entries_of_its_namespace() {
    let s = snapshot(&[
        se(
            "vm",
            "svc",
            json!({"hosts": ["vm.example.com"], "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http", "targetPort": 8080}], "workloadSelector": {"labels": {"app": "vm"}}}),
        ),
        we(
            "vm",
            "vm-1",
            json!({}),
            json!({"address": "10.0.1.1", "labels": {"app": "vm"}, "serviceAccount": "vm-sa"}),
        ),
        we(
            "vm",
            "vm-2",
            json!({"app": "vm"}),
            json!({"address": "10.0.1.2", "labels": {"app": "other"}, "ports": {"http": 9080}}),
        ),
        we(
            "vm",
            "vm-3",
            json!({}),
            json!({"address": "10.0.1.3", "labels": {"app": "other"}}),
        ),
        we(
            "elsewhere",
            "vm-4",
            json!({}),
            json!({"address": "10.0.1.4", "labels": {"app": "vm"}}),
        ),
        // a hostname WorkloadEntry is only for DNS ServiceEntries
        we(
            "vm",
            "vm-5",
            json!({}),
            json!({"address": "vm5.internal", "labels": {"app": "vm"}}),
        ),
    ]);
    // vm-2: metadata labels win over spec labels
    assert_eq!(
        eps(&s, "vm.example.com", "vm"),
        vec![ep("10.0.1.1", 8080, "http"), ep("10.0.1.2", 9080, "http")]
    );
    let e = &s.endpoints_of(&key("vm.example.com", "vm"))[0];
    assert_eq!(e.origin, "WorkloadEntry/vm/vm-1");
    assert_eq!(e.namespace, "vm");
    assert_eq!(e.service_account, "spiffe://cluster.local/ns/vm/sa/vm-sa");
}

#[test]
fn dns_entry_with_selector_takes_hostname_workloads() {
    let s = snapshot(&[
        se(
            "vm",
            "dns",
            json!({"hosts": ["vm.example.com"], "resolution": "DNS",
            "ports": [{"number": 80, "name": "http"}], "workloadSelector": {"labels": {"app": "vm"}}}),
        ),
        we(
            "vm",
            "vm-1",
            json!({}),
            json!({"address": "vm1.internal", "labels": {"app": "vm"}}),
        ),
        we(
            "vm",
            "vm-2",
            json!({}),
            json!({"address": "10.0.1.2", "labels": {"app": "vm"}}),
        ),
    ]);
    // a selector means no host endpoint, even when nothing else matched
    assert_eq!(
        eps(&s, "vm.example.com", "vm"),
        vec![ep("10.0.1.2", 80, "http"), ep("vm1.internal", 80, "http")]
    );
}

#[test]
fn duplicate_hosts_first_entry_wins_per_namespace() {
    let port = json!([{"number": 80, "name": "http"}]);
    let s = snapshot(&[
        se(
            "a",
            "zz-late",
            json!({"hosts": ["dup.example.com"], "ports": [{"number": 81, "name": "http"}],
            "resolution": "STATIC", "endpoints": [{"address": "10.0.0.2"}]}),
        ),
        se(
            "a",
            "aa-first",
            json!({"hosts": ["dup.example.com"], "ports": port, "resolution": "STATIC",
            "endpoints": [{"address": "10.0.0.1"}]}),
        ),
        se(
            "b",
            "other-ns",
            json!({"hosts": ["dup.example.com"], "ports": port, "resolution": "STATIC"}),
        ),
    ]);
    assert_eq!(s.services.len(), 2);
    let kept = s.service("dup.example.com", "a").unwrap();
    assert_eq!(kept.origin, "ServiceEntry/a/aa-first");
    assert_eq!(kept.ports[0].port, 80);
    // endpoints of both entries of namespace a, as Istio's (hostname, namespace) endpoint index
    assert_eq!(
        eps(&s, "dup.example.com", "a"),
        vec![ep("10.0.0.1", 80, "http"), ep("10.0.0.2", 81, "http")]
    );
    assert_eq!(
        s.service("dup.example.com", "b").unwrap().origin,
        "ServiceEntry/b/other-ns"
    );
}

#[test]
fn workload_selected_twice_for_one_host_is_one_endpoint() {
    let entry = |name: &str| {
        se(
            "a",
            name,
            json!({"hosts": ["vm.example.com"], "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http"}], "workloadSelector": {"labels": {"app": "vm"}}}),
        )
    };
    let s = snapshot(&[
        entry("one"),
        entry("two"),
        we(
            "a",
            "vm",
            json!({}),
            json!({"address": "10.0.0.1", "labels": {"app": "vm"}}),
        ),
    ]);
    assert_eq!(eps(&s, "vm.example.com", "a"), vec![ep("10.0.0.1", 80, "http")]);
}

#[test]
fn build_is_independent_of_input_order() {
    let mut configs = vec![
        se(
            "a",
            "one",
            json!({"hosts": ["x.example.com", "y.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "STATIC", "workloadSelector": {"labels": {"app": "x"}}}),
        ),
        se(
            "b",
            "two",
            json!({"hosts": ["x.example.com"], "ports": [{"number": 80, "name": "http"}], "resolution": "DNS"}),
        ),
        we(
            "a",
            "w1",
            json!({}),
            json!({"address": "10.0.0.1", "labels": {"app": "x"}}),
        ),
        we(
            "a",
            "w2",
            json!({}),
            json!({"address": "10.0.0.2", "labels": {"app": "x"}}),
        ),
    ];
    let forward = snapshot(&configs);
    configs.reverse();
    assert_eq!(forward, snapshot(&configs));
    let keys: Vec<_> = forward.services.iter().map(|s| ServiceKey::of(s)).collect();
    assert_eq!(
        keys,
        vec![
            key("x.example.com", "a"),
            key("x.example.com", "b"),
            key("y.example.com", "a")
        ]
    );
}

#[test]
fn ignores_other_kinds() {
    let vs = Arc::new(
        parse_config(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "vs"}, "spec": {"hosts": ["x"], "http": [{"route": [{"destination": {"host": "x"}}]}]}}),
            "default",
        )
        .unwrap(),
    );
    let s = snapshot(&[vs]);
    assert_eq!(s, RegistrySnapshot::default());
}
