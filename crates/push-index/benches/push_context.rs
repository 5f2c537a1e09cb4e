//! Benches of the push index: the registry snapshot from ServiceEntries, a full `PushContext`
//! build, and the incremental `rebuild` the pipeline does after one VirtualService or
//! ServiceEntry change. Run: `cargo bench -p push-index --bench push_context`.

mod mesh;

use std::sync::Arc;

use divan::Bencher;
use model::{ConfigKind, MeshConfig};
use push_index::{ChangeScope, PushContext, PushInput};

fn main() {
    divan::main();
}

/// `registry::build`: services and endpoints from every ServiceEntry (the pipeline redoes it on
/// each ServiceEntry or WorkloadEntry change).
#[divan::bench(args = mesh::SIZES)]
fn registry_build(bencher: Bencher, services: usize) {
    let mesh = MeshConfig::default();
    let configs = mesh::configs(services);
    bencher.bench(|| registry::build(&configs, &mesh));
}

/// `PushContext::new` from configs and a built registry: every index from scratch (the first
/// push, or any push whose change is unknown).
#[divan::bench(args = mesh::SIZES)]
fn push_context_new(bencher: Bencher, services: usize) {
    let input = mesh::input(&Arc::new(MeshConfig::default()), mesh::configs(services), "1");
    bencher.with_inputs(|| input.clone()).bench_values(PushContext::new);
}

/// The whole first push: registry snapshot, then every index.
#[divan::bench(args = mesh::SIZES)]
fn registry_and_push_context_new(bencher: Bencher, services: usize) {
    let mesh = Arc::new(MeshConfig::default());
    let configs = mesh::configs(services);
    bencher
        .with_inputs(|| configs.clone())
        .bench_values(|configs| PushContext::new(mesh::input(&mesh, configs, "1")));
}

/// `PushContext::rebuild` after one VirtualService changed: only the VirtualService index is rebuilt.
#[divan::bench(args = mesh::SIZES)]
fn rebuild_after_virtual_service_change(bencher: Bencher, services: usize) {
    let mesh = Arc::new(MeshConfig::default());
    let configs = mesh::configs(services);
    let previous = PushContext::new(mesh::input(&mesh, configs.clone(), "1"));
    let input = PushInput {
        configs: mesh::with_virtual_service(&configs, 0, 1),
        version: "2".into(),
        ..mesh::input(&mesh, configs, "2")
    };
    let scope = ChangeScope {
        kinds: vec![ConfigKind::VirtualService],
        services: false,
    };
    bencher
        .with_inputs(|| input.clone())
        .bench_values(|input| previous.rebuild(input, &scope));
}

/// The pipeline's path for one ServiceEntry change: a new registry snapshot, then `rebuild` with
/// the service index rebuilt (the other indexes are reused).
#[divan::bench(args = mesh::SIZES)]
fn rebuild_after_service_entry_change(bencher: Bencher, services: usize) {
    let mesh = Arc::new(MeshConfig::default());
    let mut configs = mesh::configs(services);
    let previous = PushContext::new(mesh::input(&mesh, configs.clone(), "1"));
    configs[0] = mesh::service_entry(0, mesh::ENDPOINTS + 1);
    let scope = ChangeScope {
        kinds: vec![ConfigKind::ServiceEntry],
        services: true,
    };
    bencher
        .with_inputs(|| configs.clone())
        .bench_values(|configs| previous.rebuild(mesh::input(&mesh, configs, "2"), &scope));
}
