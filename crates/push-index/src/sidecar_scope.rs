//! `SidecarScope`: what one proxy may see and which listeners it gets, as Istio's `model.SidecarScope`
//! built from the `Sidecar` resource that applies to it (workload selector in the proxy's namespace,
//! else the namespace's Sidecar without selector, else the root namespace's). Without one, everything
//! is visible.
//!
//! Each egress listener (`EgressListener`, Istio's `IstioEgressListenerWrapper`) imports its own
//! hosts; a Sidecar without egress listeners imports `*/*`. Ingress listeners, when present, replace
//! the proxy's service instances as its inbound configuration (`ingress_listeners`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use model::networking::{ConnectionPoolSettings, IstioIngressListener};
use model::{Config, ConfigKey, ConfigKind, ConfigSpec, MeshConfig, Proxy, Service};

#[path = "sidecar_egress.rs"]
mod egress;

pub use egress::{EgressListener, UNIX_ADDRESS_PREFIX};
use egress::{ImportedServices, WILDCARD_NAMESPACE, destinations, service_matching_ports};

/// Istio's `virtualServiceDestinations`: every host a VirtualService routes, mirrors or forwards
/// to, whatever its source namespace matches.
pub(crate) fn virtual_service_destinations(vs: &model::networking::VirtualService) -> impl Iterator<Item = &str> {
    destinations(vs, None).into_keys()
}

/// Istio's default egress listener: `*/*` on every port.
static CATCH_ALL: LazyLock<EgressListener> = LazyLock::new(EgressListener::catch_all);

/// The visibility and listener layout a `Sidecar` resource gives one proxy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SidecarScope {
    /// The Sidecar in effect; `None` is Istio's default scope (everything visible).
    sidecar: Option<ConfigKey>,
    /// The proxy's namespace (where the scope takes effect).
    namespace: String,
    /// The egress listeners, in the Sidecar's order (the catch-all, if any, last).
    egress_listeners: Vec<EgressListener>,
    ingress_listeners: Vec<IstioIngressListener>,
    inbound_connection_pool: Option<ConnectionPoolSettings>,
    /// The Sidecar's `outboundTrafficPolicy.mode`, overriding the mesh's.
    outbound_traffic_policy_mode: Option<String>,
}

impl SidecarScope {
    /// Istio's `convertToSidecarScope` for the Sidecar `config` applied to a proxy in `namespace`.
    pub fn from_sidecar(config: &Config, namespace: &str) -> SidecarScope {
        let ConfigSpec::Sidecar(sc) = &config.spec else {
            return SidecarScope::default();
        };
        let mut egress_listeners: Vec<EgressListener> = sc
            .egress
            .iter()
            .map(|l| EgressListener::new(l, namespace, &config.key()))
            .collect();
        if egress_listeners.is_empty() {
            egress_listeners.push(EgressListener::catch_all());
        }
        SidecarScope {
            sidecar: Some(config.key()),
            namespace: namespace.to_owned(),
            egress_listeners,
            ingress_listeners: sc.ingress.iter().filter(|l| l.port.is_some()).cloned().collect(),
            inbound_connection_pool: sc.inbound_connection_pool.clone(),
            outbound_traffic_policy_mode: sc.outbound_traffic_policy.as_ref().and_then(|p| p.mode.clone()),
        }
    }

    /// Whether a Sidecar resource applies (else everything is visible).
    pub fn is_default(&self) -> bool {
        self.sidecar.is_none()
    }

    /// The Sidecar resource in effect.
    pub fn sidecar(&self) -> Option<&ConfigKey> {
        self.sidecar.as_ref()
    }

    /// The egress listeners: the Sidecar's, or Istio's single catch-all `*/*` listener.
    pub fn egress_listeners(&self) -> &[EgressListener] {
        if self.egress_listeners.is_empty() {
            std::slice::from_ref(&*CATCH_ALL)
        } else {
            &self.egress_listeners
        }
    }

    /// Istio's `GetEgressListenerForRDS`: the listener on `port` (a unix socket listener, port 0,
    /// by its `bind`), else the catch-all; `None` when the Sidecar has neither.
    pub fn egress_listener_for_rds(&self, port: u16, bind: &str) -> Option<&EgressListener> {
        self.egress_listeners().iter().find(|l| match l.port() {
            None => true,
            Some(p) if p.number == 0 => port == 0 && l.bind() == bind,
            Some(p) => p.number == u32::from(port),
        })
    }

    /// Istio's `HasIngressListener`: the Sidecar declares the proxy's inbound listeners.
    pub fn has_ingress_listener(&self) -> bool {
        !self.ingress_listeners.is_empty()
    }

    /// The Sidecar's ingress listeners (each with a port).
    pub fn ingress_listeners(&self) -> &[IstioIngressListener] {
        &self.ingress_listeners
    }

    /// Istio's `InboundConnectionPoolForPort`: the ingress listener's `connectionPool` for `port`,
    /// else the Sidecar's `inboundConnectionPool`.
    pub fn inbound_connection_pool_for_port(&self, port: u32) -> Option<&ConnectionPoolSettings> {
        self.ingress_listeners
            .iter()
            .filter(|l| l.port.as_ref().is_some_and(|p| p.number == port))
            .find_map(|l| l.connection_pool.as_ref())
            .or(self.inbound_connection_pool.as_ref())
    }

    /// Whether a service of `namespace` with hostname `host` is imported by some egress listener
    /// (`EgressListener::imports_service`: the service's host a subset of an egress host).
    pub fn imports(&self, namespace: &str, host: &str) -> bool {
        self.is_default()
            || self
                .egress_listeners()
                .iter()
                .any(|l| l.imports_service(namespace, host))
    }

    /// Whether an egress host of any namespace matches `host` (a DestinationRule's host may name
    /// a service of another namespace than its own).
    pub fn imports_any_namespace(&self, host: &str) -> bool {
        self.is_default() || self.egress_listeners().iter().any(|l| l.imports_any_namespace(host))
    }

    /// Whether a VirtualService of `namespace` naming `hosts` is imported (any of its hosts is).
    pub fn imports_any(&self, namespace: &str, hosts: &[String]) -> bool {
        self.is_default()
            || hosts
                .iter()
                .any(|h| self.egress_listeners().iter().any(|l| l.imports(namespace, h)))
    }

    /// Istio's `SidecarScope.Services()`, what CDS builds clusters for: the union over the egress
    /// listeners of their services (trimmed to the listener's port for listeners with one) and of
    /// the destinations of their VirtualServices (`collectImportedServices`), one per hostname (ports
    /// of one namespace's service merged), sorted by hostname. `visible` are the services exported
    /// to the proxy's namespace; `virtual_services` the mesh VirtualServices it sees (resolved);
    /// `service_for_host` finds a visible service by hostname. The default scope gives `visible`.
    pub fn services(
        &self,
        visible: &[Arc<Service>],
        virtual_services: impl FnOnce() -> Vec<Arc<Config>>,
        service_for_host: impl Fn(&str) -> Option<Arc<Service>>,
    ) -> Vec<Arc<Service>> {
        if self.is_default() {
            return visible.to_vec();
        }
        let virtual_services = virtual_services();
        let mut imported = ImportedServices::default();
        for listener in self.egress_listeners() {
            for service in visible.iter().filter_map(|s| listener.select_service(s)) {
                imported.add(service);
            }
            for config in virtual_services.iter().filter(|c| listener.imports_virtual_service(c)) {
                let ConfigSpec::VirtualService(vs) = &config.spec else {
                    continue;
                };
                for (host, ports) in destinations(vs, Some(&self.namespace)) {
                    let Some(service) = service_for_host(host).filter(|s| s.hostname == host) else {
                        tracing::debug!(vs = %config.key(), host, "VirtualService destination is no visible service");
                        continue;
                    };
                    let matched = if listener.match_port() {
                        listener.select_port(&service)
                    } else {
                        service_matching_ports(&service, &ports)
                    };
                    if let Some(service) = matched {
                        imported.add(service);
                    }
                }
            }
        }
        imported.into_sorted()
    }

    /// `REGISTRY_ONLY` from the Sidecar's `outboundTrafficPolicy`, else from the mesh config.
    pub fn registry_only(&self, mesh: &MeshConfig) -> bool {
        match &self.outbound_traffic_policy_mode {
            Some(mode) => mode == "REGISTRY_ONLY",
            None => mesh.registry_only(),
        }
    }

    /// Whether a change to `key` can change what this scope shows: services, VirtualServices,
    /// DestinationRules and ServiceEntries of imported namespaces, and every Sidecar (a new one may
    /// select the proxy).
    pub fn depends_on(&self, key: &ConfigKey) -> bool {
        if self.is_default() || key.kind == ConfigKind::Sidecar {
            return true;
        }
        self.egress_listeners()
            .iter()
            .any(|l| l.namespaces().any(|ns| ns == WILDCARD_NAMESPACE || ns == key.namespace))
    }
}

/// The Sidecar resources of one push by namespace, oldest first: which one applies to a proxy.
/// A proxy's scope depends on its namespace and that Sidecar only, so proxies whose labels differ
/// but select the same Sidecar share one scope (Istio's `SidecarScope` per Sidecar resource).
#[derive(Debug, Default)]
pub struct SidecarIndex {
    /// Every Sidecar, oldest first; the index's answers are positions in it.
    sidecars: Vec<Arc<Config>>,
    by_namespace: HashMap<String, Vec<usize>, foldhash::fast::RandomState>,
}

impl SidecarIndex {
    pub fn new(configs: &[Arc<Config>]) -> SidecarIndex {
        let mut sidecars: Vec<Arc<Config>> = configs
            .iter()
            .filter(|c| c.kind == ConfigKind::Sidecar && matches!(c.spec, ConfigSpec::Sidecar(_)))
            .cloned()
            .collect();
        sidecars.sort_by(|a, b| crate::creation_order(a, b));
        let mut by_namespace: HashMap<String, Vec<usize>, foldhash::fast::RandomState> = HashMap::default();
        for (i, c) in sidecars.iter().enumerate() {
            by_namespace.entry(c.meta.namespace.clone()).or_default().push(i);
        }
        SidecarIndex { sidecars, by_namespace }
    }

    /// The position of the Sidecar that applies to `proxy`: the oldest in its namespace whose
    /// workload selector matches its labels, else its namespace's without selector, else the root
    /// namespace's without selector. None for gateways, which are never scoped (Istio's
    /// `DefaultSidecarScopeForGateway`).
    pub fn select(&self, mesh: &MeshConfig, proxy: &Proxy) -> Option<usize> {
        if !proxy.is_sidecar() {
            return None;
        }
        let of = |ns: &str| self.by_namespace.get(ns).map(Vec::as_slice).unwrap_or_default();
        let selector = |i: &usize| selector(&self.sidecars[*i]);
        let local = of(&proxy.config_namespace);
        local
            .iter()
            .find(|i| selector(i).is_some_and(|l| l.iter().all(|(k, v)| proxy.labels.get(k) == Some(v))))
            .or_else(|| local.iter().find(|i| selector(i).is_none()))
            .or_else(|| of(&mesh.root_namespace).iter().find(|i| selector(i).is_none()))
            .copied()
    }

    /// The Sidecar at a position [`select`](Self::select) gave.
    pub fn get(&self, position: usize) -> Option<&Arc<Config>> {
        self.sidecars.get(position)
    }
}

/// The non-empty workload selector of a Sidecar config.
fn selector(c: &Config) -> Option<&BTreeMap<String, String>> {
    match &c.spec {
        ConfigSpec::Sidecar(sc) => sc
            .workload_selector
            .as_ref()
            .map(|s| &s.match_labels)
            .filter(|l| !l.is_empty()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "sidecar_scope_tests.rs"]
mod tests;
