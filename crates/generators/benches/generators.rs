//! Benches of the generators for one sidecar of the synthetic mesh (`mesh`, shared with the
//! push-index benches): CDS, EDS (every EDS cluster), LDS and RDS (every route name its listeners
//! ask for) through the `generate` dispatch, on a fresh push and `PushCache` (cold caches) and for
//! a second proxy of the same class on a push whose cache already served one (warm caches); and a
//! full push (all four types) packed into `DiscoveryResponse`s and encoded.
//! Run: `cargo bench -p generators --bench generators [-- FILTER --sample-count 10]`.

#[path = "../../push-index/benches/mesh/mod.rs"]
mod mesh;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use divan::Bencher;
use divan::counter::BytesCount;
use generators::{PushCache, generate};
use model::{MeshConfig, Proxy};
use prost::Message;
use push_index::{ChangeScope, PushContext, PushInput};
use xds_api::Resource;
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::listener::v3::{Listener, filter};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};
use xds_api::envoy::service::discovery::v3::DiscoveryResponse;
use xds_api::type_url;

/// The xDS types in push order, as the bench arguments name them.
const TYPES: &[&str] = &["cds", "eds", "lds", "rds"];

fn main() {
    for &services in mesh::SIZES {
        let f = fixture(services);
        let (push, cache) = f.fresh();
        let sizes: Vec<String> = TYPES
            .iter()
            .map(|t| format!("{t}={}", responses(&push, &cache, &f.proxy, &f, &[t])[0].len()))
            .collect();
        let total: usize = responses(&push, &cache, &f.proxy, &f, TYPES).iter().map(Vec::len).sum();
        println!(
            "services={services}: {} clusters ({} EDS), {} route configs; encoded push bytes: {} total={total}",
            run(&push, &cache, &f.proxy, &f, "cds").len(),
            f.eds_names.len(),
            f.route_names.len(),
            sizes.join(" "),
        );
    }
    divan::main();
}

/// One mesh size: the push (whose indexes every fresh push reuses), the proxies, and the names
/// a sidecar subscribes to.
struct Fixture {
    push: PushContext,
    input: PushInput,
    proxy: Proxy,
    /// A second sidecar of the same class (namespace and labels) as `proxy`.
    peer: Proxy,
    /// EDS clusters of the proxy's CDS response, as Envoy asks for them.
    eds_names: Vec<String>,
    /// Route configuration names of the proxy's listeners, as Envoy asks for them.
    route_names: Vec<String>,
}

impl Fixture {
    /// A new push over the same indexes with empty per-push caches, as the pipeline's `rebuild`.
    fn fresh_push(&self) -> PushContext {
        self.push.rebuild(self.input.clone(), &ChangeScope::default())
    }

    /// A fresh push and its (empty) generator cache.
    fn fresh(&self) -> (PushContext, PushCache) {
        (self.fresh_push(), PushCache::default())
    }

    fn names(&self, type_url: &str) -> &[String] {
        match type_url {
            type_url::ENDPOINT => &self.eds_names,
            type_url::ROUTE => &self.route_names,
            _ => &[],
        }
    }
}

/// The fixture of each size, built once per bench run.
fn fixture(services: usize) -> Arc<Fixture> {
    static FIXTURES: OnceLock<Mutex<BTreeMap<usize, Arc<Fixture>>>> = OnceLock::new();
    let mut all = FIXTURES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    all.entry(services)
        .or_insert_with(|| Arc::new(build_fixture(services)))
        .clone()
}

fn build_fixture(services: usize) -> Fixture {
    let input = mesh::input(&Arc::new(MeshConfig::default()), mesh::configs(services), "1");
    let push = PushContext::new(input.clone());
    let proxy = mesh::sidecar(0);
    let peer = mesh::sidecar(16);
    let cache = PushCache::default();
    let eds_names = decoded::<Cluster>(&push, &cache, &proxy, type_url::CLUSTER)
        .into_iter()
        .filter_map(|c| c.eds_cluster_config.map(|e| e.service_name))
        .collect();
    let mut route_names: Vec<String> = decoded::<Listener>(&push, &cache, &proxy, type_url::LISTENER)
        .iter()
        .flat_map(rds_names)
        .collect();
    route_names.sort();
    route_names.dedup();
    Fixture {
        push,
        input,
        proxy,
        peer,
        eds_names,
        route_names,
    }
}

/// The resources of a wildcard type (CDS, LDS) for `proxy`, decoded.
fn decoded<M: Message + Default>(push: &PushContext, cache: &PushCache, proxy: &Proxy, type_url: &str) -> Vec<M> {
    generate(push, cache, proxy, type_url, &[])
        .unwrap_or_else(|e| panic!("{type_url}: {e}"))
        .iter()
        .map(|r| M::decode(r.resource.value.as_slice()).unwrap_or_else(|e| panic!("{type_url}: {e}")))
        .collect()
}

/// RDS names of the HTTP connection managers of a listener.
fn rds_names(listener: &Listener) -> Vec<String> {
    listener
        .filter_chains
        .iter()
        .flat_map(|c| &c.filters)
        .filter_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(any)) if any.type_url.ends_with(".HttpConnectionManager") => {
                HttpConnectionManager::decode(any.value.as_slice()).ok()
            }
            _ => None,
        })
        .filter_map(|h| match h.route_specifier {
            Some(hcm::RouteSpecifier::Rds(rds)) => Some(rds.route_config_name),
            _ => None,
        })
        .collect()
}

fn type_url_of(short: &str) -> &'static str {
    match short {
        "cds" => type_url::CLUSTER,
        "eds" => type_url::ENDPOINT,
        "lds" => type_url::LISTENER,
        "rds" => type_url::ROUTE,
        other => panic!("unknown bench type {other}"),
    }
}

fn run(push: &PushContext, cache: &PushCache, proxy: &Proxy, f: &Fixture, short: &str) -> Vec<Resource> {
    let t = type_url_of(short);
    generate(push, cache, proxy, t, f.names(t)).unwrap_or_else(|e| panic!("{short}: {e}"))
}

/// One encoded `DiscoveryResponse` per type, in push order.
fn responses(push: &PushContext, cache: &PushCache, proxy: &Proxy, f: &Fixture, types: &[&str]) -> Vec<Vec<u8>> {
    types
        .iter()
        .map(|&short| encode(push, type_url_of(short), &run(push, cache, proxy, f, short)))
        .collect()
}

/// A `DiscoveryResponse` as the SotW stream builds it (resources copied out of their shared
/// `Arc<Any>`), encoded.
fn encode(push: &PushContext, type_url: &str, resources: &[Resource]) -> Vec<u8> {
    DiscoveryResponse {
        version_info: push.version().to_owned(),
        resources: resources.iter().map(|r| (*r.resource).clone()).collect(),
        type_url: type_url.to_owned(),
        nonce: "1".into(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// One type for one sidecar on a fresh push: nothing cached yet (the first proxy of a push).
#[divan::bench(consts = [100, 1000], args = TYPES)]
fn generate_cold<const S: usize>(bencher: Bencher, short: &str) {
    let f = fixture(S);
    bencher
        .with_inputs(|| f.fresh())
        .bench_local_refs(|(push, cache)| run(push, cache, &f.proxy, &f, short));
}

/// One type for a second sidecar of the same class on a push that already served the first:
/// what the per-push caches save for the rest of the fleet.
#[divan::bench(consts = [100, 1000], args = TYPES)]
fn generate_warm<const S: usize>(bencher: Bencher, short: &str) {
    let f = fixture(S);
    let (push, cache) = f.fresh();
    run(&push, &cache, &f.proxy, &f, short);
    bencher.bench_local(|| run(&push, &cache, &f.peer, &f, short));
}

/// A full push to one sidecar on a fresh push: CDS, EDS, LDS and RDS generated, packed into
/// `DiscoveryResponse`s and encoded (the throughput counts encoded bytes).
#[divan::bench(consts = [100, 1000])]
fn full_push_cold<const S: usize>(bencher: Bencher) {
    let f = fixture(S);
    let (push, cache) = f.fresh();
    let bytes: usize = responses(&push, &cache, &f.proxy, &f, TYPES).iter().map(Vec::len).sum();
    bencher
        .counter(BytesCount::new(bytes))
        .with_inputs(|| f.fresh())
        .bench_local_refs(|(push, cache)| responses(push, cache, &f.proxy, &f, TYPES));
}

/// The same full push for a second sidecar of the same class (warm per-push caches).
#[divan::bench(consts = [100, 1000])]
fn full_push_warm<const S: usize>(bencher: Bencher) {
    let f = fixture(S);
    let (push, cache) = f.fresh();
    let bytes: usize = responses(&push, &cache, &f.proxy, &f, TYPES).iter().map(Vec::len).sum();
    bencher
        .counter(BytesCount::new(bytes))
        .bench_local(|| responses(&push, &cache, &f.peer, &f, TYPES));
}

/// Only the packing and encoding of an already generated full push.
#[divan::bench(consts = [100, 1000])]
fn encode_only<const S: usize>(bencher: Bencher) {
    let f = fixture(S);
    let (push, cache) = f.fresh();
    let generated: Vec<(&str, Vec<Resource>)> = TYPES
        .iter()
        .map(|&short| (type_url_of(short), run(&push, &cache, &f.proxy, &f, short)))
        .collect();
    let bytes: usize = generated.iter().map(|(t, r)| encode(&push, t, r).len()).sum();
    bencher
        .counter(BytesCount::new(bytes))
        .bench_local(|| generated.iter().map(|(t, r)| encode(&push, t, r)).collect::<Vec<_>>());
}
