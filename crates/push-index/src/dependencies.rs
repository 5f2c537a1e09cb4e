//! Which proxies a config change concerns, as Istio's `ProxyNeedsPush` (`proxy_dependencies.go`)
//! and `SidecarScope.DependsOnConfig`: a proxy is pushed for a changed config only if that config,
//! as the push before or after the change has it, is part of what the proxy is sent.
//!
//! - services (`Changed::Service`, as the environment reports registry changes): visible to the
//!   proxy's namespace (`exportTo`) and imported by its Sidecar scope, or served by the proxy
//!   itself (its inbound side);
//! - VirtualServices: in the proxy's mesh list (sidecars) or bound to a gateway selecting it
//!   (routers); delegates (no hosts) by the roots among those that name them;
//! - DestinationRules: exported to the proxy's namespace and for a host its scope imports;
//! - Gateways: only routers they select; Sidecars: only sidecars of their namespace (or of any
//!   namespace, for the root namespace's);
//! - anything else, a change neither push holds, or `ConfigsUpdated::All`: every proxy.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use model::{Changed, Config, ConfigKey, ConfigKind, ConfigSpec, ConfigsUpdated, NodeType, Proxy, ServiceKey};

use crate::PushContext;

/// Per push: the configs' order by key, and answers per change and proxy class.
#[derive(Default)]
pub(crate) struct DependencyCache {
    /// Positions in the push's configs, sorted by key: a push asks for the changed configs only,
    /// so this is built without copying any key (a map by cloned keys cost 0.7 ms a push at 1,250
    /// configs, on the path of every change).
    by_key: OnceLock<Vec<u32>>,
    answers: Mutex<FastMap<Changed, Answers>>,
}

/// Hashed with foldhash: these maps are read once per connection and push, with keys that are
/// names (std's SipHash cost a third of the lookups).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The answers for one change by what decides a proxy's view besides the push. IP addresses
/// matter only for a service the proxy serves, which is checked apart and never cached. Looked up
/// without allocating: a push asks once per connection.
#[derive(Default)]
struct Answers {
    /// Sidecars, by namespace, then the Sidecar in effect (its position in the push's Sidecar
    /// index): their labels matter only in choosing that Sidecar.
    sidecars: FastMap<String, FastMap<Option<usize>, Option<bool>>>,
    /// Gateways: their labels decide which Gateways select them.
    others: FastMap<(NodeType, String, BTreeMap<String, String>), Option<bool>>,
}

impl Answers {
    fn get(&self, proxy: &Proxy, sidecar: Option<Option<usize>>) -> Option<Option<bool>> {
        match sidecar {
            Some(position) => self
                .sidecars
                .get(proxy.config_namespace.as_str())
                .and_then(|m| m.get(&position))
                .copied(),
            None => self.others.get(&other_key(proxy)).copied(),
        }
    }

    fn insert(&mut self, proxy: &Proxy, sidecar: Option<Option<usize>>, answer: Option<bool>) {
        match sidecar {
            Some(position) => {
                self.sidecars
                    .entry(proxy.config_namespace.clone())
                    .or_default()
                    .insert(position, answer);
            }
            None => {
                self.others.insert(other_key(proxy), answer);
            }
        }
    }
}

fn other_key(proxy: &Proxy) -> (NodeType, String, BTreeMap<String, String>) {
    (proxy.node_type, proxy.config_namespace.clone(), proxy.labels.clone())
}

impl std::fmt::Debug for DependencyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answers = self.answers.lock().map(|a| a.len()).unwrap_or_default();
        f.debug_struct("DependencyCache")
            .field("changes", &answers)
            .finish_non_exhaustive()
    }
}

/// Istio's `ProxyNeedsPush` for a push of `changes`: true when any change is part of what `proxy`
/// sees in `current` or saw in one of the `earlier` pushes (the push the change was made against,
/// the push the proxy last got). `All`, or a change no push holds, concerns every proxy.
pub fn proxy_needs_push(
    current: &PushContext,
    earlier: &[&PushContext],
    proxy: &Proxy,
    changes: &ConfigsUpdated,
) -> bool {
    let ConfigsUpdated::Only(changes) = changes else {
        return true;
    };
    changes.iter().any(|key| {
        let answers = std::iter::once(current)
            .chain(earlier.iter().copied())
            .map(|p| p.proxy_sees(proxy, key));
        let (mut known, mut sees) = (false, false);
        for a in answers {
            known |= a.is_some();
            sees |= a == Some(true);
        }
        sees || !known
    })
}

impl PushContext {
    /// Whether the change `key`, as this push holds it, is part of what `proxy` is sent; `None`
    /// when this push does not hold it (deleted, or not yet created).
    pub fn proxy_sees(&self, proxy: &Proxy, key: &Changed) -> Option<bool> {
        if let Changed::Service(service) = key
            && self.serves(proxy, &service.hostname, &service.namespace)
        {
            return Some(true);
        }
        let cache = &self.dependencies;
        let sidecar = proxy.is_sidecar().then(|| self.sidecar_position(proxy));
        let cached = cache
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .and_then(|a| a.get(proxy, sidecar));
        if let Some(answer) = cached {
            return answer;
        }
        let answer = match key {
            Changed::Service(service) => self.sees_service(proxy, service),
            Changed::Config(config) => self.compute_sees(proxy, config, cache),
        };
        cache
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_default()
            .insert(proxy, sidecar, answer);
        answer
    }

    fn compute_sees(&self, proxy: &Proxy, key: &ConfigKey, cache: &DependencyCache) -> Option<bool> {
        match key.kind {
            // A ServiceEntry named directly (its services travel as `Changed::Service`).
            ConfigKind::ServiceEntry => config(self, cache, key).map(|_| true),
            ConfigKind::VirtualService => config(self, cache, key).map(|c| self.sees_virtual_service(proxy, &c)),
            ConfigKind::DestinationRule => config(self, cache, key).map(|c| self.sees_destination_rule(proxy, &c)),
            ConfigKind::Gateway => config(self, cache, key).map(|_| {
                proxy.node_type == NodeType::Router && self.gateways_for_proxy(proxy).iter().any(|g| g.key() == *key)
            }),
            ConfigKind::Sidecar => config(self, cache, key).map(|c| {
                proxy.node_type == NodeType::SidecarProxy
                    && (c.meta.namespace == proxy.config_namespace || c.meta.namespace == self.mesh().root_namespace)
            }),
            _ => Some(true),
        }
    }

    /// A service: visible and imported.
    fn sees_service(&self, proxy: &Proxy, key: &ServiceKey) -> Option<bool> {
        if !self.services.contains(&key.hostname, &key.namespace) {
            return None;
        }
        // The proxy's namespace sees one service per hostname: is it this one?
        let visible = self
            .services
            .exact(&key.hostname, &proxy.config_namespace)
            .is_some_and(|s| s.namespace() == key.namespace);
        Some(visible && self.sidecar_scope(proxy).imports(&key.namespace, &key.hostname))
    }

    fn sees_virtual_service(&self, proxy: &Proxy, vs: &Config) -> bool {
        let ConfigSpec::VirtualService(spec) = &vs.spec else {
            return true;
        };
        let key = vs.key();
        // A delegate (no hosts) concerns whoever is sent a root that names it.
        let delegate = spec.hosts.is_empty();
        let listed = |list: Vec<Arc<Config>>| {
            if delegate {
                self.delegate_virtual_services(&list).contains(&key)
            } else {
                list.iter().any(|c| c.key() == key)
            }
        };
        match proxy.node_type {
            NodeType::Router => self.gateways_for_proxy(proxy).iter().any(|gw| {
                let name = format!("{}/{}", gw.meta.namespace, gw.meta.name);
                listed(self.virtual_services_for_gateway(proxy, &name))
            }),
            _ => listed(self.virtual_services_for_mesh(proxy)),
        }
    }

    fn sees_destination_rule(&self, proxy: &Proxy, dr: &Config) -> bool {
        let ConfigSpec::DestinationRule(rule) = &dr.spec else {
            return true;
        };
        let ns = dr.meta.namespace.as_str();
        let client = proxy.config_namespace.as_str();
        let export_to = if rule.export_to.is_empty() {
            &self.mesh().default_destination_rule_export_to
        } else {
            &rule.export_to
        };
        let exported = ns == client
            || ns == self.mesh().root_namespace
            || export_to.is_empty()
            || export_to
                .iter()
                .any(|e| e == "*" || e == client || (e == "." && ns == client));
        let host = model::host::resolve_short_name(&rule.host, ns, self.domain());
        exported && self.sidecar_scope(proxy).imports_any_namespace(&host)
    }
}

/// The config of `key` in this push, found in an order built once per push.
fn config(push: &PushContext, cache: &DependencyCache, key: &ConfigKey) -> Option<Arc<Config>> {
    let configs = push.configs();
    let order = cache.by_key.get_or_init(|| {
        let mut order: Vec<u32> = (0..configs.len()).filter_map(|i| u32::try_from(i).ok()).collect();
        // the environment hands configs in key order: then this checks and keeps it
        if !configs.is_sorted_by(|a, b| key_of(a) <= key_of(b)) {
            order.sort_by(|a, b| key_of(&configs[*a as usize]).cmp(&key_of(&configs[*b as usize])));
        }
        order
    });
    let wanted = (key.kind, key.namespace.as_str(), key.name.as_str());
    let found = order
        .binary_search_by(|i| key_of(&configs[*i as usize]).cmp(&wanted))
        .ok()?;
    Some(configs[order[found] as usize].clone())
}

/// A config's key, borrowed, ordered as [`ConfigKey`].
fn key_of(c: &Config) -> (ConfigKind, &str, &str) {
    (c.kind, c.meta.namespace.as_str(), c.meta.name.as_str())
}

#[cfg(test)]
#[path = "dependencies_tests.rs"]
mod tests;
