//! Bench of the push's choice of proxies (Istio's `ProxyNeedsPush`) on the reference mesh the load
//! generator runs (`loadgen --namespaces 50 --sidecar-scope namespace`): 1,000 services over 50
//! namespaces, a Sidecar per namespace importing `./*` and `istio-system/*`, 2,000 sidecars with
//! 16 label sets, and one VirtualService changed. Each iteration asks for every sidecar against
//! two push contexts rebuilt from one base, as one push does: their answers start empty; the
//! Sidecar scopes, which pushes share while no Sidecar changes, are built by the first iteration,
//! as a server's first push builds them.
//! Run: `cargo bench -p push-index --bench needs_push`.

mod mesh;

use std::collections::BTreeSet;
use std::sync::Arc;

use divan::Bencher;
use mesh::input;
use model::config::parse_config;
use model::{Changed, Config, ConfigKind, ConfigsUpdated, MeshConfig, Proxy};
use push_index::{ChangeScope, PushContext, proxy_needs_push};
use serde_json::{Value, json};

const NAMESPACES: usize = 50;
const SERVICES: usize = 1000;
const SIDECARS: usize = 2000;

fn main() {
    divan::main();
}

fn namespace(i: usize) -> String {
    format!("load-{}", i % NAMESPACES)
}

fn parse(doc: Value, ns: &str) -> Arc<Config> {
    Arc::new(parse_config(doc, ns).unwrap_or_else(|e| panic!("bench config rejected: {e}")))
}

fn host(i: usize) -> String {
    format!("svc-{i}.{}.svc.cluster.local", namespace(i))
}

fn virtual_service(i: usize, generation: u64) -> Arc<Config> {
    let ns = namespace(i);
    parse(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": format!("vs-{i}"), "namespace": ns},
            "spec": {"hosts": [host(i)], "http": [{"timeout": format!("{}s", generation + 1),
                     "route": [{"destination": {"host": host(i)}}]}]}}),
        &ns,
    )
}

fn configs(generation: u64) -> Vec<Arc<Config>> {
    let mut out: Vec<Arc<Config>> = (0..SERVICES)
        .map(|i| {
            let ns = namespace(i);
            parse(
                json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                    "metadata": {"name": format!("svc-{i}"), "namespace": ns},
                    "spec": {"hosts": [host(i)], "location": "MESH_INTERNAL", "resolution": "STATIC",
                             "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
                             "endpoints": [{"address": format!("10.{}.{}.1", 128 + i / 250, i % 250)}]}}),
                &ns,
            )
        })
        .collect();
    out.extend((0..SERVICES / 10).map(|i| virtual_service(i, if i == 0 { generation } else { 0 })));
    out.extend((0..NAMESPACES).map(|n| {
        let ns = namespace(n);
        parse(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                "metadata": {"name": "default", "namespace": ns},
                "spec": {"egress": [{"hosts": ["./*", "istio-system/*"]}]}}),
            &ns,
        )
    }));
    // in key order, as the environment hands a push its configs
    out.sort_by_key(|c| c.key());
    out
}

/// One VirtualService change: which of the 2,000 sidecars it concerns (the 40 of its namespace).
#[divan::bench]
fn virtual_service_change_2000_sidecars(bencher: Bencher) {
    let mesh = Arc::new(MeshConfig::default());
    let base = PushContext::new(input(&mesh, configs(0), "1"));
    let scope = ChangeScope {
        kinds: vec![ConfigKind::VirtualService],
        services: false,
    };
    let before = input(&mesh, configs(0), "2");
    let after = input(&mesh, configs(1), "3");
    let changes = ConfigsUpdated::Only(BTreeSet::from([Changed::Config(virtual_service(0, 1).key())]));
    let proxies: Vec<Proxy> = (0..SIDECARS).map(|n| mesh::sidecar_in(&namespace(n), n)).collect();
    bencher
        .with_inputs(|| {
            let previous = base.rebuild(before.clone(), &scope);
            let current = previous.rebuild(after.clone(), &scope);
            (previous, current)
        })
        .bench_local_refs(|(previous, current)| {
            let pushed = proxies
                .iter()
                .filter(|p| proxy_needs_push(current, &[&*previous], p, &changes))
                .count();
            assert_eq!(pushed, SIDECARS / NAMESPACES);
        });
}
