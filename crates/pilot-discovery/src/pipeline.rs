//! The control-plane pipeline between the config source and the xDS server: current configs and
//! the ServiceEntry registry, turned into a `PushRequest` per change (full, or EDS-only when only
//! endpoints moved) and into one `PushContext` snapshot per push.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use config_sources::{ConfigChange, ConfigEvent, ConfigSnapshot};
use model::{Config, ConfigKey, ConfigKind, MeshConfig, Proxy};
use push_index::{ChangeScope, PushContext, PushInput};
use registry::RegistrySnapshot;
use xds_server::{GenerateError, PushRequest, PushSnapshot, Resource, SnapshotBuilder, WatchedResource, reason};

use crate::metrics::PipelineMetrics;

/// Configs and services as of the last change.
#[derive(Clone)]
pub struct PipelineState {
    pub configs: ConfigSnapshot,
    pub registry: Arc<RegistrySnapshot>,
}

pub struct Pipeline {
    mesh: Arc<MeshConfig>,
    domain: String,
    state: RwLock<PipelineState>,
    seq: AtomicU64,
    metrics: PipelineMetrics,
    /// The previous push's index, whose untouched per-kind indexes the next push reuses.
    last: Mutex<Option<Arc<PushContext>>>,
}

impl Pipeline {
    pub fn new(mesh: Arc<MeshConfig>, domain: String, configs: ConfigSnapshot, metrics: PipelineMetrics) -> Pipeline {
        let registry = Arc::new(registry::build(&config_list(&configs), &mesh));
        metrics.observe(&configs, &registry);
        Pipeline {
            mesh,
            domain,
            state: RwLock::new(PipelineState { configs, registry }),
            seq: AtomicU64::new(0),
            metrics,
            last: Mutex::new(None),
        }
    }

    pub fn state(&self) -> PipelineState {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn mesh(&self) -> &MeshConfig {
        &self.mesh
    }

    /// Applies one batch of config events; returns the push it calls for, if any.
    pub fn apply(&self, change: &ConfigChange) -> Option<PushRequest> {
        if change.is_empty() {
            return None;
        }
        let old = self.state();
        let mut configs: BTreeMap<ConfigKey, Arc<Config>> = (*old.configs).clone();
        let mut registry_touched = false;
        let mut other_keys = BTreeSet::new();
        for event in &change.events {
            let key = event.key();
            match event {
                ConfigEvent::Added(c) | ConfigEvent::Updated { new: c, .. } => {
                    configs.insert(key.clone(), c.clone());
                }
                ConfigEvent::Deleted(_) => {
                    configs.remove(&key);
                }
            }
            match key.kind {
                ConfigKind::ServiceEntry | ConfigKind::WorkloadEntry => registry_touched = true,
                _ => {
                    other_keys.insert(key);
                }
            }
        }
        let configs: ConfigSnapshot = Arc::new(configs);
        let registry = if registry_touched {
            Arc::new(registry::build(&config_list(&configs), &self.mesh))
        } else {
            old.registry.clone()
        };
        let diff = registry::diff(&old.registry, &registry);
        self.metrics.observe(&configs, &registry);
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = PipelineState { configs, registry };

        let service_key = |k: &registry::ServiceKey| ConfigKey {
            kind: ConfigKind::ServiceEntry,
            namespace: k.namespace.clone(),
            name: k.hostname.clone(),
        };
        if !other_keys.is_empty() || diff.needs_full_push() {
            let mut keys = other_keys;
            keys.extend(diff.services_changed.iter().map(service_key));
            keys.extend(diff.endpoints_changed.iter().map(service_key));
            let mut req = PushRequest::config_update(keys);
            if diff.needs_full_push() {
                req.reason.insert(reason::SERVICE.to_owned(), 1);
            }
            return Some(req);
        }
        if !diff.endpoints_changed.is_empty() {
            return Some(PushRequest::endpoints(diff.endpoints_changed.iter().map(service_key)));
        }
        None
    }
}

fn config_list(configs: &ConfigSnapshot) -> Vec<Arc<Config>> {
    configs.values().cloned().collect()
}

impl SnapshotBuilder for Pipeline {
    fn build(&self, req: &PushRequest) -> Arc<dyn PushSnapshot> {
        let state = self.state();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let version = format!("{}/{}", xds_server::rfc3339(SystemTime::now()), seq);
        let input = PushInput {
            mesh: self.mesh.clone(),
            domain: self.domain.clone(),
            configs: config_list(&state.configs),
            registry: state.registry.clone(),
            version,
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let push = match (last.as_ref(), change_scope(req)) {
            (Some(previous), Some(scope)) => previous.rebuild(input, &scope),
            _ => PushContext::new(input),
        };
        let push = Arc::new(push);
        let previous = last.replace(push.clone());
        Arc::new(Snapshot { push, previous })
    }
}

/// What a push request says changed, for reusing the previous index; `None` when it may be
/// anything (an empty `configs_updated` means "everything", e.g. at start).
fn change_scope(req: &PushRequest) -> Option<ChangeScope> {
    if req.configs_updated.is_empty() {
        return None;
    }
    let mut kinds: Vec<ConfigKind> = req.configs_updated.iter().map(|k| k.kind).collect();
    kinds.dedup();
    // Service changes arrive as ServiceEntry keys named by hostname (see `apply`); an EDS-only
    // request (not full) moved endpoints only, which the index reads from the registry directly.
    let services = req.full
        && kinds
            .iter()
            .any(|k| matches!(k, ConfigKind::ServiceEntry | ConfigKind::WorkloadEntry));
    Some(ChangeScope { kinds, services })
}

/// One push: the push index, and the generators over it.
pub struct Snapshot {
    pub push: Arc<PushContext>,
    /// The push before this one: what a change was made against, for `needs_push`.
    pub previous: Option<Arc<PushContext>>,
}

impl PushSnapshot for Snapshot {
    fn version(&self) -> &str {
        self.push.version()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// Istio's `ProxyNeedsPush`: the changed configs as this push, the one before it and the one
    /// the proxy was last pushed from have them; any of them part of the proxy's view means a push.
    fn needs_push(&self, proxy: &Proxy, req: &PushRequest, last_pushed: Option<&dyn PushSnapshot>) -> bool {
        let last = last_pushed
            .and_then(|s| s.as_any().downcast_ref::<Snapshot>())
            .map(|s| s.push.as_ref());
        let earlier: Vec<&PushContext> = self.previous.as_deref().into_iter().chain(last).collect();
        push_index::proxy_needs_push(&self.push, &earlier, proxy, req.configs_updated.iter())
    }

    fn generate(
        &self,
        proxy: &Proxy,
        type_url: &str,
        watched: &WatchedResource,
        _req: &PushRequest,
    ) -> Result<Vec<Resource>, GenerateError> {
        let names: Vec<String> = watched.names.iter().map(|n| n.to_string()).collect();
        match generators::generate::generate(&self.push, proxy, type_url, &names) {
            Ok(resources) => Ok(resources
                .into_iter()
                .map(|r| Resource {
                    name: r.name,
                    resource: r.resource,
                    version: r.version,
                })
                .collect()),
            Err(e) => Err(GenerateError::Failed {
                type_url: type_url.to_owned(),
                proxy: proxy.node_id.clone(),
                reason: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: ConfigKind, name: &str) -> ConfigKey {
        ConfigKey {
            kind,
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn change_scope_follows_the_push_request() {
        assert_eq!(change_scope(&PushRequest::full(reason::GLOBAL)), None);
        let vs = change_scope(&PushRequest::config_update([key(ConfigKind::VirtualService, "a")])).unwrap();
        assert_eq!(
            vs,
            ChangeScope {
                kinds: vec![ConfigKind::VirtualService],
                services: false
            }
        );
        let eds = change_scope(&PushRequest::endpoints([key(
            ConfigKind::ServiceEntry,
            "h.example.com",
        )]))
        .unwrap();
        assert!(!eds.services, "endpoint-only pushes keep the service index");
        let both = change_scope(&PushRequest::config_update([
            key(ConfigKind::VirtualService, "a"),
            key(ConfigKind::ServiceEntry, "h.example.com"),
        ]))
        .unwrap();
        assert!(both.services);
        assert_eq!(both.kinds, vec![ConfigKind::VirtualService, ConfigKind::ServiceEntry]);
    }
}
