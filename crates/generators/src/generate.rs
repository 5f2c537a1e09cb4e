//! Dispatch by type URL to the generators, as Istio's `XdsServer.Generators`, with per-push
//! caches of encoded resources shared by proxies that get the same bytes: one
//! `ClusterLoadAssignment` per (cluster, what shapes it) and one CDS response per proxy class.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use model::{NodeType, Proxy};
use push_index::PushContext;
use xds_api::{pbwkt, type_url};

/// One named, encoded resource.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedResource {
    pub name: String,
    pub resource: Arc<pbwkt::Any>,
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
        type_url::LISTENER => Ok(crate::lds::build_listeners(proxy, push)
            .into_iter()
            .map(|l| resource(l.name.clone(), &l))
            .collect()),
        type_url::ROUTE => Ok(crate::rds::build_route_configs(proxy, push, names)
            .into_iter()
            .map(|r| resource(r.name.clone(), &r))
            .collect()),
        other => Err(GenerateError::UnknownTypeUrl(other.to_owned())),
    }
}

fn resource<M: prost::Message + prost::Name>(name: String, m: &M) -> GeneratedResource {
    GeneratedResource {
        name,
        resource: Arc::new(xds_api::pack(m)),
    }
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

/// Encoded ClusterLoadAssignments of one push.
pub type EdsCache = OnceCache<crate::eds::EdsKey, Arc<pbwkt::Any>>;

/// What the clusters of a proxy depend on besides the push: its namespace (visibility,
/// DestinationRule lookup), type, labels (DestinationRule workload selectors, failover
/// priorities), IP family (DNS lookup family) and locality (DNS cluster priorities).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CdsKey {
    namespace: String,
    node_type: NodeType,
    labels: BTreeMap<String, String>,
    ipv6_only: bool,
    locality: String,
    /// Target ports of the proxy's service instances: sidecars get one inbound cluster each.
    inbound_ports: Vec<u16>,
}

/// Encoded CDS responses of one push, per proxy class.
pub type CdsCache = OnceCache<CdsKey, Arc<Vec<GeneratedResource>>>;

fn clusters(push: &PushContext, proxy: &Proxy) -> Arc<Vec<GeneratedResource>> {
    let key = CdsKey {
        namespace: proxy.config_namespace.clone(),
        node_type: proxy.node_type,
        labels: proxy.labels.clone(),
        ipv6_only: !proxy.ip_addresses.is_empty() && proxy.ip_addresses.iter().all(|ip| ip.is_ipv6()),
        locality: proxy.locality.to_string(),
        inbound_ports: crate::cds::inbound::inbound_ports(proxy, push),
    };
    push.caches().get::<CdsCache>().get_or_build(key, || {
        Arc::new(
            crate::cds::build_clusters(proxy, push)
                .into_iter()
                .map(|c| resource(c.name.clone(), &c))
                .collect(),
        )
    })
}

fn load_assignments(push: &PushContext, proxy: &Proxy, names: &[String]) -> Vec<GeneratedResource> {
    let cache = push.caches().get::<EdsCache>();
    names
        .iter()
        .map(|name| {
            let any = match crate::eds::Target::resolve(proxy, push, name) {
                Some(target) => cache.get_or_build(target.key(proxy, push), || {
                    Arc::new(xds_api::pack(&target.build(proxy, push)))
                }),
                None => Arc::new(xds_api::pack(
                    &xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment {
                        cluster_name: name.clone(),
                        ..Default::default()
                    },
                )),
            };
            GeneratedResource {
                name: name.clone(),
                resource: any,
            }
        })
        .collect()
}
