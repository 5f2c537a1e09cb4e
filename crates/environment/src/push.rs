//! One push: the `PushContext` built for it (reusing the previous push's indexes that the change
//! did not touch, as Istio's `initPushContext` / `PushContext.UpdateMetrics`), the generators'
//! caches of encoded resources, and the push before it (for `ProxyNeedsPush`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use model::{Changed, ConfigKind, ConfigsUpdated, Proxy, PushRequest};
use push_index::{ChangeScope, PushContext, PushInput};
use xds_api::{GenerateError, Resource};
use xds_server::{PushSnapshot, SnapshotBuilder, WatchedResource};

use crate::environment::{Environment, lock};

/// The snapshot every proxy is sent from for one push.
pub struct Push {
    context: Arc<PushContext>,
    cache: generators::PushCache,
    /// The push before this one: what a change was made against, for `needs_push`.
    previous: Option<Arc<PushContext>>,
}

impl Push {
    /// The push index.
    pub fn context(&self) -> &Arc<PushContext> {
        &self.context
    }
}

impl PushSnapshot for Push {
    fn version(&self) -> &str {
        self.context.version()
    }

    fn generate(&self, proxy: &Proxy, watched: &WatchedResource, delta: bool) -> Result<Vec<Resource>, GenerateError> {
        let names: Vec<String> = watched.names.iter().map(|n| n.to_string()).collect();
        let vhds = delta && self.context.features().enable_delta_vhds;
        generators::generate_with_vhds(&self.context, &self.cache, proxy, &watched.type_url, &names, vhds)
    }

    /// Istio's `ProxyNeedsPush`: the changes as this push, the one before it and the one the
    /// proxy was last pushed from have them; any of them part of the proxy's view means a push.
    fn needs_push(&self, proxy: &Proxy, req: &PushRequest, last_pushed: Option<&Push>) -> bool {
        let mut earlier: Vec<&PushContext> = self.previous.as_deref().into_iter().collect();
        // Usually the proxy was last pushed from the previous push: ask it once.
        if let Some(last) = last_pushed.map(|p| p.context.as_ref())
            && !earlier.iter().any(|e| std::ptr::eq(*e, last))
        {
            earlier.push(last);
        }
        push_index::proxy_needs_push(&self.context, &earlier, proxy, &req.configs_updated)
    }
}

impl SnapshotBuilder for Environment {
    type Snapshot = Push;

    fn build(&self, req: &PushRequest) -> Arc<Push> {
        let (configs, derived, registry) = {
            let st = lock(&self.state);
            (
                st.configs.clone(),
                st.ingress.output().configs.clone(),
                st.registry.clone(),
            )
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let input = PushInput {
            mesh: self.mesh(),
            domain: self.domain.clone(),
            // the configs made from Ingresses beside the sources' (theirs win a shared key)
            configs: configs
                .values()
                .chain(
                    derived
                        .iter()
                        .filter(|(k, _)| !configs.contains_key(*k))
                        .map(|(_, c)| c),
                )
                .cloned()
                .collect(),
            registry,
            version: format!("{}/{seq}", xds_server::rfc3339(SystemTime::now())),
            features: self.features,
            jwks: lock(&self.jwks).clone(),
        };
        drop((configs, derived));
        let mut last = lock(&self.last);
        let context = match (last.as_ref(), change_scope(req)) {
            (Some(previous), Some(scope)) => previous.rebuild(input, &scope),
            _ => PushContext::new(input),
        };
        let context = Arc::new(context.with_networks(lock(&self.networks).clone()));
        let previous = last.replace(context.clone());
        Arc::new(Push {
            context,
            cache: generators::PushCache::with_sds_metrics(self.sds_metrics.clone()),
            previous,
        })
    }

    /// Istio's `SetWorkloadLabels`: the labels of the proxy's workload as the first registry that
    /// knows it has them (those of the proxy's cluster first) (Kubernetes: the Pod its ID names, else the Pod at its IP), else the
    /// node metadata's; the locality of the node, else the workload's; and, as Istio's
    /// `SetServiceTargets`, the Service ports that select that workload.
    fn init_proxy(&self, proxy: &mut model::Proxy) {
        let ip = proxy.ip_addresses.first().map(|i| i.to_string()).unwrap_or_default();
        let st = lock(&self.state);
        // The registries of the proxy's cluster first: Pod IPs may repeat across clusters.
        let cluster = proxy.cluster_id();
        let ours = st.registries.iter().filter(|r| r.cluster_id() == cluster);
        let others = st.registries.iter().filter(|r| r.cluster_id() != cluster);
        let Some(w) = ours
            .chain(others)
            .find_map(|r| r.workload(&ip, &proxy.id, &proxy.config_namespace))
        else {
            return;
        };
        drop(st);
        proxy.labels = w.labels;
        proxy.service_targets = w.service_targets;
        if proxy.locality.is_empty() && !w.locality.is_empty() {
            proxy.locality = model::Locality::parse(&w.locality);
        }
    }
}

/// What a push request says changed, for reusing the previous index; `None` when it may be
/// anything.
pub(crate) fn change_scope(req: &PushRequest) -> Option<ChangeScope> {
    let ConfigsUpdated::Only(changes) = &req.configs_updated else {
        return None;
    };
    let mut kinds: Vec<ConfigKind> = changes
        .iter()
        .filter_map(|c| match c {
            Changed::Config(k) => Some(k.kind),
            Changed::Service(_) => None,
        })
        .collect();
    kinds.dedup();
    // An EDS-only request moved endpoints only, which the index reads from the registry directly.
    let services = req.full && changes.iter().any(|c| matches!(c, Changed::Service(_)));
    Some(ChangeScope { kinds, services })
}
