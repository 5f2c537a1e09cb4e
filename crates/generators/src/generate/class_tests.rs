//! The per-push caches give each proxy what it would get alone: for every field of every key, two
//! proxies that differ only there are served on one push (the second from whatever the first
//! left in the caches) and each gets the bytes of an uncached generation; where the field matters
//! those differ. Proxies that differ only in what no config reads share the encoded resources.

use model::{MeshConfig, Proxy};
use serde_json::{Value, json};
use xds_api::type_url;

use xds_api::Resource;

use crate::generate::{PushCache, generate};
use crate::testing::{config, config_in, destination_rule, in_locality, node, push_with_mesh, service_entry};

/// `ratings.default.svc.cluster.local:9080` (HTTP, VIP 240.0.0.1) with endpoints 10.0.0.9 (v1,
/// zone a, target port 8080) and 10.0.0.10 (v2, zone b); `resolution` as given.
fn ratings(resolution: &str) -> Value {
    let endpoints = if resolution == "DNS" {
        json!([{"address": "ratings-a.example.com", "labels": {"version": "v1", "zone": "a"}, "locality": "r1/a"},
               {"address": "ratings-b.example.com", "labels": {"version": "v2"}, "locality": "r2/b"}])
    } else {
        json!([{"address": "10.0.0.9", "labels": {"version": "v1", "zone": "a"}, "locality": "r1/a"},
               {"address": "10.0.0.10", "labels": {"version": "v2"}, "locality": "r2/b"}])
    };
    service_entry(
        "ratings",
        "default",
        json!({"hosts": ["ratings.default.svc.cluster.local"], "addresses": ["240.0.0.1"],
            "location": "MESH_INTERNAL", "resolution": resolution,
            "ports": [{"number": 9080, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
            "endpoints": endpoints}),
    )
}

/// A Sidecar for workloads labelled `team: a` that imports nothing of the mesh and refuses
/// unknown destinations.
fn narrow_sidecar() -> Value {
    config(
        "Sidecar",
        "narrow",
        "default",
        json!({"workloadSelector": {"labels": {"team": "a"}},
            "egress": [{"hosts": ["./nothing.default.svc.cluster.local"]}],
            "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
    )
}

/// A DestinationRule for ratings with outlier detection (locality failover) and subset v1;
/// `extra` is merged into its `trafficPolicy.loadBalancer`.
fn ratings_rule(extra: Value) -> Value {
    let mut lb = json!({"simple": "ROUND_ROBIN"});
    if let (Some(lb), Some(extra)) = (lb.as_object_mut(), extra.as_object()) {
        lb.extend(extra.clone());
    }
    destination_rule(
        "ratings",
        "default",
        json!({"host": "ratings.default.svc.cluster.local",
            "trafficPolicy": {"loadBalancer": lb, "outlierDetection": {"consecutive5xxErrors": 3}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
    )
}

/// A sidecar in `default` at 10.9.0.1 (no service instances) with `labels`.
fn sidecar(labels: Value) -> Proxy {
    node("sidecar", "10.9.0.1", "default", "default", json!({"LABELS": labels}))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// The field matters here: the proxies get different resources.
    Apart,
    /// Nothing reads what differs: the second proxy gets the first one's encoded resources.
    Shared,
}

struct Case {
    what: &'static str,
    mesh: MeshConfig,
    docs: Vec<Value>,
    type_url: &'static str,
    names: &'static [&'static str],
    a: Proxy,
    b: Proxy,
    expect: Expect,
}

impl Case {
    fn new(what: &'static str, docs: Vec<Value>, type_url: &'static str, a: Proxy, b: Proxy, expect: Expect) -> Case {
        let names: &'static [&'static str] = match type_url {
            type_url::ROUTE => &["9080"],
            type_url::ENDPOINT => &[
                "outbound|9080||ratings.default.svc.cluster.local",
                "outbound|9080|v1|ratings.default.svc.cluster.local",
            ],
            _ => &[],
        };
        Case {
            what,
            mesh: MeshConfig::default(),
            docs,
            type_url,
            names,
            a,
            b,
            expect,
        }
    }

    fn names(mut self, names: &'static [&'static str]) -> Case {
        self.names = names;
        self
    }

    fn generate(&self, push: &push_index::PushContext, cache: &PushCache, proxy: &Proxy) -> Vec<Resource> {
        let names: Vec<String> = self.names.iter().map(|n| n.to_string()).collect();
        generate(push, cache, proxy, self.type_url, &names).unwrap()
    }

    fn check(&self) {
        let fresh = || push_with_mesh(self.mesh.clone(), self.docs.clone());
        let alone_a = summary(&self.generate(&fresh(), &PushCache::default(), &self.a));
        let alone_b = summary(&self.generate(&fresh(), &PushCache::default(), &self.b));
        let (push, cache) = (fresh(), PushCache::default());
        let got_a = self.generate(&push, &cache, &self.a);
        let got_b = self.generate(&push, &cache, &self.b);
        assert!(!alone_a.is_empty(), "{}: nothing generated", self.what);
        assert_eq!(summary(&got_a), alone_a, "{}: first proxy", self.what);
        assert_eq!(
            summary(&got_b),
            alone_b,
            "{}: second proxy got another class's resources",
            self.what
        );
        match self.expect {
            Expect::Apart => assert_ne!(alone_a, alone_b, "{}: the field does not matter here", self.what),
            Expect::Shared => {
                for (a, b) in got_a.iter().zip(&got_b) {
                    assert!(
                        std::sync::Arc::ptr_eq(&a.resource, &b.resource),
                        "{}: {} not shared",
                        self.what,
                        a.name
                    );
                }
            }
        }
    }
}

/// Each resource's name and a hash of its proto3 JSON (the encoding of protobuf maps follows
/// `HashMap` order, so equal resources may differ in bytes).
fn summary(resources: &[Resource]) -> Vec<(String, u64)> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    resources
        .iter()
        .map(|r| {
            let json = xds_api::json::any_to_json(&r.resource).unwrap().to_string();
            let mut h = DefaultHasher::new();
            json.hash(&mut h);
            (r.name.clone(), h.finish())
        })
        .collect()
}

fn vs_source_labels() -> Value {
    let host = "ratings.default.svc.cluster.local";
    config(
        "VirtualService",
        "ratings",
        "default",
        json!({"hosts": [host], "http": [
            {"match": [{"sourceLabels": {"version": "v1"}}], "route": [{"destination": {"host": host, "subset": "v1"}}]},
            {"route": [{"destination": {"host": host}}]}]}),
    )
}

#[test]
fn route_configurations_are_shared_per_name_and_class_only() {
    let hidden = service_entry(
        "hidden",
        "other",
        json!({"hosts": ["hidden.other.svc.cluster.local"], "exportTo": ["."], "location": "MESH_INTERNAL",
            "resolution": "STATIC", "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": "10.2.0.1"}]}),
    );
    let hash_for_canary = destination_rule(
        "canary",
        "default",
        json!({"host": "ratings.default.svc.cluster.local", "workloadSelector": {"matchLabels": {"app": "canary"}},
            "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}),
    );
    let gateway = config(
        "Gateway",
        "gw",
        "default",
        json!({"selector": {"istio": "ingress"},
            "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
    );
    let router = |labels| node("router", "10.9.0.2", "default", "default", json!({"LABELS": labels}));
    let md_ns = |ns| node("sidecar", "10.9.0.1", ns, "default", json!({}));
    let domain = |d| node("sidecar", "10.9.0.1", "default", d, json!({}));
    let rds = type_url::ROUTE;
    let attempt_count = |disabled: bool| {
        node(
            "sidecar",
            "10.9.0.1",
            "default",
            "default",
            json!({"PROXY_CONFIG": {"proxyHeaders": {"attemptCount": {"disabled": disabled}}}}),
        )
    };
    let cases = [
        Case::new(
            "proxyHeaders.attemptCount",
            vec![ratings("STATIC")],
            rds,
            attempt_count(true),
            attempt_count(false),
            Expect::Apart,
        ),
        Case::new(
            "two names, one class",
            vec![ratings("STATIC")],
            rds,
            sidecar(json!({})),
            sidecar(json!({})),
            Expect::Shared,
        )
        .names(&["9080", "9090"]),
        Case::new(
            "config namespace",
            vec![ratings("STATIC"), hidden],
            rds,
            md_ns("default"),
            md_ns("other"),
            Expect::Apart,
        ),
        Case::new(
            "DNS domain",
            vec![ratings("STATIC")],
            rds,
            domain("default"),
            domain("other"),
            Expect::Apart,
        ),
        Case::new(
            "node type",
            vec![ratings("STATIC")],
            rds,
            sidecar(json!({})),
            router(json!({})),
            Expect::Apart,
        ),
        Case::new(
            "VirtualService sourceLabels",
            vec![ratings("STATIC"), vs_source_labels()],
            rds,
            sidecar(json!({"version": "v1"})),
            sidecar(json!({"version": "v2"})),
            Expect::Apart,
        ),
        Case::new(
            "labels no match reads",
            vec![ratings("STATIC"), vs_source_labels()],
            rds,
            sidecar(json!({"version": "v1", "pod": "a"})),
            sidecar(json!({"version": "v1", "pod": "b"})),
            Expect::Shared,
        ),
        Case::new(
            "DestinationRule workloadSelector",
            vec![ratings("STATIC"), hash_for_canary],
            rds,
            sidecar(json!({"app": "canary"})),
            sidecar(json!({"app": "prod"})),
            Expect::Apart,
        ),
        Case::new(
            "Sidecar in effect",
            vec![ratings("STATIC"), narrow_sidecar()],
            rds,
            sidecar(json!({"team": "a"})),
            sidecar(json!({"team": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "gateway selection",
            vec![ratings("STATIC"), gateway],
            rds,
            router(json!({"istio": "ingress"})),
            router(json!({"istio": "egress"})),
            Expect::Apart,
        )
        .names(&["http.80"]),
        Case::new(
            "pod, address, unread labels",
            vec![ratings("STATIC")],
            rds,
            sidecar(json!({"app": "x"})),
            node(
                "sidecar",
                "10.0.0.9",
                "default",
                "default",
                json!({"LABELS": {"app": "y"}, "POD_NAME": "q"}),
            ),
            Expect::Shared,
        ),
    ];
    for case in cases {
        case.check();
    }
}

#[test]
fn listeners_are_shared_per_class_only() {
    let db = |name: &str, vip: &str| {
        service_entry(
            name,
            "default",
            json!({"hosts": [format!("{name}.default.svc.cluster.local")], "addresses": [vip],
                "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 3306, "name": "tcp", "protocol": "TCP"}], "endpoints": [{"address": "10.3.0.1"}]}),
        )
    };
    let tcp_by_source = config(
        "VirtualService",
        "db",
        "default",
        json!({"hosts": ["db.default.svc.cluster.local"], "tcp": [
            {"match": [{"sourceLabels": {"app": "reporting"}}], "route": [{"destination": {"host": "replica.default.svc.cluster.local"}}]},
            {"route": [{"destination": {"host": "db.default.svc.cluster.local"}}]}]}),
    );
    // imported by every sidecar but those of the narrow Sidecar
    let tcp_to_replica = config(
        "VirtualService",
        "db",
        "default",
        json!({"hosts": ["db.default.svc.cluster.local"],
            "tcp": [{"route": [{"destination": {"host": "replica.default.svc.cluster.local"}}]}]}),
    );
    let md = |md| node("sidecar", "10.9.0.1", "default", "default", md);
    let at = |ip| node("sidecar", ip, "default", "default", json!({}));
    let lds = type_url::LISTENER;
    let cases = [
        Case::new(
            "HTTP10 metadata",
            vec![ratings("STATIC")],
            lds,
            md(json!({"HTTP10": "1"})),
            md(json!({})),
            Expect::Apart,
        ),
        Case::new(
            "proxyHeaders of the proxy's ProxyConfig",
            vec![ratings("STATIC")],
            lds,
            md(json!({"PROXY_CONFIG": {"proxyHeaders": {"server": {"disabled": true}}}})),
            md(json!({})),
            Expect::Apart,
        ),
        Case::new(
            "a ProxyConfig without proxyHeaders",
            vec![ratings("STATIC")],
            lds,
            md(json!({"PROXY_CONFIG": {"concurrency": 2}})),
            md(json!({})),
            Expect::Shared,
        ),
        Case::new(
            "IDLE_TIMEOUT metadata",
            vec![ratings("STATIC")],
            lds,
            md(json!({"IDLE_TIMEOUT": "30s"})),
            md(json!({})),
            Expect::Apart,
        ),
        Case::new(
            "service instances",
            vec![ratings("STATIC")],
            lds,
            at("10.0.0.9"),
            at("10.9.0.1"),
            Expect::Apart,
        ),
        Case::new(
            "tcp sourceLabels",
            vec![db("db", "240.0.0.5"), db("replica", "240.0.0.6"), tcp_by_source],
            lds,
            sidecar(json!({"app": "reporting"})),
            sidecar(json!({"app": "web"})),
            Expect::Apart,
        ),
        Case::new(
            "Sidecar in effect",
            vec![
                db("db", "240.0.0.5"),
                db("replica", "240.0.0.6"),
                tcp_to_replica,
                narrow_sidecar(),
            ],
            lds,
            sidecar(json!({"team": "a"})),
            sidecar(json!({"team": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "AuthorizationPolicy selector",
            vec![
                ratings("STATIC"),
                config_in(
                    "security.istio.io/v1",
                    "AuthorizationPolicy",
                    "db-only",
                    "default",
                    json!({"selector": {"matchLabels": {"app": "db"}}, "action": "DENY", "rules": [{}]}),
                ),
            ],
            lds,
            sidecar(json!({"app": "db"})),
            sidecar(json!({"app": "web"})),
            Expect::Apart,
        ),
        Case::new(
            "PeerAuthentication selector",
            vec![
                ratings("STATIC"),
                config_in(
                    "security.istio.io/v1",
                    "PeerAuthentication",
                    "db-strict",
                    "default",
                    json!({"selector": {"matchLabels": {"app": "db"}}, "mtls": {"mode": "STRICT"}}),
                ),
            ],
            lds,
            sidecar(json!({"app": "db"})),
            sidecar(json!({"app": "web"})),
            Expect::Apart,
        ),
        Case::new(
            "pod, address, unread labels and metadata",
            vec![ratings("STATIC")],
            lds,
            md(json!({"POD_NAME": "a", "LABELS": {"app": "x"}})),
            node(
                "sidecar",
                "10.9.0.7",
                "default",
                "default",
                json!({"POD_NAME": "b", "WORKLOAD_NAME": "w2"}),
            ),
            Expect::Shared,
        ),
        // the HCMs' tracing tags name the canonical service, the cluster and the mesh
        Case::new(
            "canonical service label (tracing tag)",
            vec![ratings("STATIC")],
            lds,
            sidecar(json!({"service.istio.io/canonical-name": "ratings"})),
            sidecar(json!({"service.istio.io/canonical-name": "reviews"})),
            Expect::Apart,
        ),
        Case::new(
            "cluster ID (tracing tag)",
            vec![ratings("STATIC")],
            lds,
            md(json!({"CLUSTER_ID": "c1"})),
            md(json!({"CLUSTER_ID": "c2"})),
            Expect::Apart,
        ),
    ];
    for case in cases {
        case.check();
    }
}

#[test]
fn clusters_and_endpoints_are_shared_per_class_only() {
    let canary_rule = destination_rule(
        "canary",
        "default",
        json!({"host": "ratings.default.svc.cluster.local", "workloadSelector": {"matchLabels": {"app": "canary"}},
            "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}),
    );
    let failover = || ratings_rule(json!({"localityLbSetting": {"failoverPriority": ["zone"]}}));
    let grpc_on_8080 = service_entry(
        "grpc",
        "default",
        json!({"hosts": ["grpc.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 7000, "name": "grpc", "protocol": "GRPC", "targetPort": 8080}],
            "endpoints": [{"address": "10.0.0.11"}]}),
    );
    let at = |ip| node("sidecar", ip, "default", "default", json!({}));
    let md_ns = |ns| node("sidecar", "10.9.0.1", ns, "default", json!({}));
    let private_rule = destination_rule(
        "private",
        "default",
        json!({"host": "ratings.default.svc.cluster.local", "exportTo": ["."],
            "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}),
    );
    let (cds, eds) = (type_url::CLUSTER, type_url::ENDPOINT);
    let dns = || ratings("DNS");
    let headers = |h: Value| {
        node(
            "sidecar",
            "10.9.0.1",
            "default",
            "default",
            json!({"PROXY_CONFIG": {"proxyHeaders": h}}),
        )
    };
    let cases = [
        Case::new(
            "proxyHeaders.preserveHttp1HeaderCase",
            vec![ratings("STATIC")],
            cds,
            headers(json!({"preserveHttp1HeaderCase": true})),
            headers(json!({})),
            Expect::Apart,
        ),
        Case::new(
            "proxyHeaders that clusters do not read",
            vec![ratings("STATIC")],
            cds,
            headers(json!({"attemptCount": {"disabled": true}})),
            headers(json!({})),
            Expect::Shared,
        ),
        Case::new(
            "DestinationRule workloadSelector",
            vec![ratings("STATIC"), canary_rule.clone()],
            cds,
            sidecar(json!({"app": "canary"})),
            sidecar(json!({"app": "prod"})),
            Expect::Apart,
        ),
        Case::new(
            "failoverPriority labels (DNS cluster)",
            vec![dns(), failover()],
            cds,
            sidecar(json!({"zone": "a"})),
            sidecar(json!({"zone": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "failoverPriority with no labels at all",
            vec![dns(), failover()],
            cds,
            sidecar(json!({})),
            sidecar(json!({"pod": "x"})),
            Expect::Apart,
        ),
        Case::new(
            "IP family",
            vec![dns()],
            cds,
            at("10.9.0.1"),
            at("fd00::1"),
            Expect::Apart,
        ),
        Case::new(
            "locality",
            vec![dns(), ratings_rule(json!({}))],
            cds,
            in_locality(sidecar(json!({})), "r1/a"),
            in_locality(sidecar(json!({})), "r2/a"),
            Expect::Apart,
        ),
        Case::new(
            "inbound port protocol",
            vec![ratings("STATIC"), grpc_on_8080],
            cds,
            at("10.0.0.9"),
            at("10.0.0.11"),
            Expect::Apart,
        ),
        Case::new(
            "Sidecar in effect",
            vec![ratings("STATIC"), ratings_rule(json!({})), narrow_sidecar()],
            cds,
            sidecar(json!({"team": "a"})),
            sidecar(json!({"team": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "config namespace",
            vec![ratings("STATIC"), private_rule],
            cds,
            md_ns("default"),
            md_ns("other"),
            Expect::Apart,
        ),
        Case::new(
            "node type",
            vec![ratings("STATIC")],
            cds,
            sidecar(json!({})),
            node("router", "10.9.0.1", "default", "default", json!({})),
            Expect::Apart,
        ),
        Case::new(
            "unread labels",
            vec![ratings("STATIC"), canary_rule, failover()],
            cds,
            sidecar(json!({"zone": "a", "app": "prod", "pod": "1"})),
            sidecar(json!({"zone": "a", "app": "prod", "pod": "2"})),
            Expect::Shared,
        ),
        Case::new(
            "EDS failoverPriority labels",
            vec![ratings("STATIC"), failover()],
            eds,
            sidecar(json!({"zone": "a"})),
            sidecar(json!({"zone": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "EDS locality",
            vec![ratings("STATIC"), ratings_rule(json!({}))],
            eds,
            in_locality(sidecar(json!({})), "r1/a"),
            in_locality(sidecar(json!({})), "r2/a"),
            Expect::Apart,
        ),
        Case::new(
            "EDS Sidecar in effect",
            vec![ratings("STATIC"), ratings_rule(json!({})), narrow_sidecar()],
            eds,
            sidecar(json!({"team": "a"})),
            sidecar(json!({"team": "b"})),
            Expect::Apart,
        ),
        Case::new(
            "EDS unread labels",
            vec![ratings("STATIC"), failover()],
            eds,
            sidecar(json!({"zone": "a", "pod": "1"})),
            sidecar(json!({"zone": "a", "pod": "2"})),
            Expect::Shared,
        ),
    ];
    for case in cases {
        case.check();
    }
}

#[test]
fn an_eds_request_for_other_names_is_answered_for_those_names() {
    let push = push_with_mesh(MeshConfig::default(), vec![ratings("STATIC")]);
    let cache = PushCache::default();
    let p = sidecar(json!({}));
    let ask = |names: &[&str]| -> Vec<String> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        generate(&push, &cache, &p, type_url::ENDPOINT, &names)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    let all = "outbound|9080||ratings.default.svc.cluster.local";
    let v1 = "outbound|9080|v1|ratings.default.svc.cluster.local";
    assert_eq!(ask(&[all, v1]), [all, v1]);
    assert_eq!(ask(&[v1]), [v1]);
    assert_eq!(ask(&[v1, all]), [v1, all]);
}
