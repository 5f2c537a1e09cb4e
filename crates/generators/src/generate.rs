//! Dispatch by type URL to the generators, as Istio's `XdsServer.Generators`, with per-push
//! caches of encoded resources shared by proxies that get the same bytes: one CDS and one LDS
//! response per proxy class, one route configuration per (name, class), one
//! `ClusterLoadAssignment` per (cluster, what shapes it) and one EDS response per (class, names).
//! The keys (`class`) name everything each type reads from a proxy.

mod class;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use model::Proxy;
use push_index::PushContext;
use xds_api::{pbwkt, type_url};

pub use class::{CdsKey, EndpointClass, LdsKey, RdsKey};

/// One named, encoded resource.
#[derive(Debug, Clone)]
pub struct GeneratedResource {
    pub name: String,
    pub resource: Arc<pbwkt::Any>,
    /// The resource's delta version (a hash of its type URL and bytes), computed by the first
    /// delta stream that needs it and shared with every proxy that gets this `resource`.
    pub version: Arc<OnceLock<String>>,
}

impl GeneratedResource {
    pub fn new(name: String, resource: Arc<pbwkt::Any>) -> GeneratedResource {
        GeneratedResource {
            name,
            resource,
            version: Arc::default(),
        }
    }
}

impl PartialEq for GeneratedResource {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.resource == other.resource
    }
}

/// Why nothing could be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    #[error("unsupported type URL {0:?} (hint: pilot-discovery serves CDS, EDS, LDS and RDS)")]
    UnknownTypeUrl(String),
}

/// The resources of `type_url` for `proxy`. CDS and LDS ignore `names` (they are always the
/// wildcard); EDS and RDS answer each requested name.
pub fn generate(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[String],
) -> Result<Vec<GeneratedResource>, GenerateError> {
    match type_url {
        type_url::CLUSTER => Ok(clusters(push, proxy).as_ref().clone()),
        type_url::ENDPOINT => Ok(load_assignments(push, proxy, names)),
        type_url::LISTENER => Ok(listeners(push, proxy).as_ref().clone()),
        type_url::ROUTE => Ok(route_configs(push, proxy, names)),
        other => Err(GenerateError::UnknownTypeUrl(other.to_owned())),
    }
}

fn resource<M: prost::Message + prost::Name>(name: String, m: &M) -> GeneratedResource {
    GeneratedResource::new(name, Arc::new(xds_api::pack(m)))
}

/// A cache valid for one push: each key is computed once, by the first caller; later callers
/// with the same key wait for it and share the result.
pub struct OnceCache<K, V> {
    entries: Mutex<HashMap<K, Arc<OnceLock<V>>>>,
}

impl<K, V> Default for OnceCache<K, V> {
    fn default() -> Self {
        OnceCache {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, V: Clone> OnceCache<K, V> {
    pub fn get_or_build(&self, key: K, build: impl FnOnce() -> V) -> V {
        let slot = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            entries.entry(key).or_default().clone()
        };
        slot.get_or_init(build).clone()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Encoded ClusterLoadAssignments of one push, per cluster and what shapes it.
pub type EdsCache = OnceCache<crate::eds::EdsKey, GeneratedResource>;

/// Encoded CDS responses of one push, per proxy class.
pub type CdsCache = OnceCache<CdsKey, Arc<Vec<GeneratedResource>>>;

/// Encoded LDS responses of one push, per proxy class.
pub type LdsCache = OnceCache<LdsKey, Arc<Vec<GeneratedResource>>>;

/// Encoded route configurations of one push, per name and proxy class.
pub type RdsCache = OnceCache<RdsKey, GeneratedResource>;

/// EDS responses of one push: per (endpoint class, hash of the names asked) the names and the
/// response; a different list with the same hash is generated uncached.
pub type EdsResponseCache = OnceCache<(EndpointClass, u64), Arc<(Vec<String>, Vec<GeneratedResource>)>>;

fn clusters(push: &PushContext, proxy: &Proxy) -> Arc<Vec<GeneratedResource>> {
    push.caches()
        .get::<CdsCache>()
        .get_or_build(CdsKey::new(push, proxy), || {
            Arc::new(
                crate::cds::build_clusters(proxy, push)
                    .into_iter()
                    .map(|c| resource(c.name.clone(), &c))
                    .collect(),
            )
        })
}

fn listeners(push: &PushContext, proxy: &Proxy) -> Arc<Vec<GeneratedResource>> {
    push.caches()
        .get::<LdsCache>()
        .get_or_build(LdsKey::new(push, proxy), || {
            Arc::new(
                crate::lds::build_listeners(proxy, push)
                    .into_iter()
                    .map(|l| resource(l.name.clone(), &l))
                    .collect(),
            )
        })
}

fn route_configs(push: &PushContext, proxy: &Proxy, names: &[String]) -> Vec<GeneratedResource> {
    let cache = push.caches().get::<RdsCache>();
    RdsKey::for_names(push, proxy, names)
        .into_iter()
        .zip(names)
        .map(|(key, name)| {
            cache.get_or_build(key, || {
                let mut built = crate::rds::build_route_configs(proxy, push, std::slice::from_ref(name));
                let config = built.pop().unwrap_or_else(|| crate::rds::empty_route_config(name));
                resource(name.clone(), &config)
            })
        })
        .collect()
}

fn load_assignments(push: &PushContext, proxy: &Proxy, names: &[String]) -> Vec<GeneratedResource> {
    let class = EndpointClass::new(push, proxy);
    let mut hasher = DefaultHasher::new();
    names.hash(&mut hasher);
    let hash = hasher.finish();
    let cached = push.caches().get::<EdsResponseCache>().get_or_build((class, hash), || {
        Arc::new((names.to_vec(), uncached_load_assignments(push, proxy, names)))
    });
    if cached.0 == names {
        return cached.1.clone();
    }
    uncached_load_assignments(push, proxy, names)
}

/// Each assignment from the per-cluster cache.
fn uncached_load_assignments(push: &PushContext, proxy: &Proxy, names: &[String]) -> Vec<GeneratedResource> {
    let cache = push.caches().get::<EdsCache>();
    names
        .iter()
        .map(|name| match crate::eds::Target::resolve(proxy, push, name) {
            Some(target) => cache.get_or_build(target.key(proxy, push), || {
                resource(name.clone(), &target.build(proxy, push))
            }),
            None => resource(
                name.clone(),
                &xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment {
                    cluster_name: name.clone(),
                    ..Default::default()
                },
            ),
        })
        .collect()
}
