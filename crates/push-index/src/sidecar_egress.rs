//! One egress listener of a `SidecarScope`, as Istio's `IstioEgressListenerWrapper`: its hosts
//! (`namespace/dnsName`: `.` is the proxy's namespace, `*` any namespace, `~` none), port, bind and
//! capture mode, and which services (trimmed to its port when it has one, Istio's `needsPortMatch`)
//! and VirtualServices it imports. Also the union of the services of all listeners that CDS needs
//! (`appendSidecarServices`) and the destinations of a VirtualService (`virtualServiceDestinations`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use model::networking::{IstioEgressListener, SidecarPort, VirtualService};
use model::{Config, ConfigKey, ConfigSpec, Service};

/// Namespace part of an egress host meaning "any namespace".
pub(super) const WILDCARD_NAMESPACE: &str = "*";
/// Namespace part meaning "the proxy's namespace".
const CURRENT_NAMESPACE: &str = ".";
/// Istio's `UnixAddressPrefix`: a `bind` or `defaultEndpoint` that is a unix domain socket.
pub const UNIX_ADDRESS_PREFIX: &str = "unix://";
/// The egress port protocol that makes a listener a plain HTTP proxy (no port matching).
const HTTP_PROXY: &str = "HTTP_PROXY";

/// One egress listener of the Sidecar in effect (or Istio's default catch-all `*/*`).
#[derive(Debug, Clone, PartialEq)]
pub struct EgressListener {
    port: Option<SidecarPort>,
    bind: String,
    capture_mode: Option<String>,
    /// (namespace, host) pairs, `.` resolved to the proxy's namespace, hosts lower-cased.
    hosts: Vec<(String, String)>,
}

impl EgressListener {
    /// Istio's default egress listener: every host of every namespace, on every port.
    pub(super) fn catch_all() -> EgressListener {
        EgressListener {
            port: None,
            bind: String::new(),
            capture_mode: None,
            hosts: vec![(WILDCARD_NAMESPACE.to_owned(), "*".to_owned())],
        }
    }

    /// The listener of a Sidecar (`sidecar`, for logs) applied to a proxy in `namespace`.
    pub(super) fn new(listener: &IstioEgressListener, namespace: &str, sidecar: &ConfigKey) -> EgressListener {
        let mut hosts: Vec<(String, String)> = Vec::new();
        for h in &listener.hosts {
            let Some((ns, host)) = h.split_once('/') else {
                tracing::debug!(%sidecar, host = h, "egress host without namespace ignored");
                continue;
            };
            let ns = if ns == CURRENT_NAMESPACE { namespace } else { ns };
            let pair = (ns.to_owned(), host.to_ascii_lowercase());
            if !hosts.contains(&pair) {
                hosts.push(pair);
            }
        }
        EgressListener {
            port: listener.port.clone(),
            bind: listener.bind.clone(),
            capture_mode: listener.capture_mode.clone(),
            hosts,
        }
    }

    /// The listener's port; `None` for the catch-all listener (every service port).
    pub fn port(&self) -> Option<&SidecarPort> {
        self.port.as_ref()
    }

    /// The address to bind (an IP, or `unix://<path>`); empty for "as the service decides".
    pub fn bind(&self) -> &str {
        &self.bind
    }

    /// Whether the listener binds a real socket instead of taking redirected traffic: capture mode
    /// `NONE`, or a unix domain socket bind (Istio's `bindToPort` of `buildSidecarOutboundListeners`).
    pub fn bind_to_port(&self) -> bool {
        self.capture_mode.as_deref() == Some("NONE") || self.bind.starts_with(UNIX_ADDRESS_PREFIX)
    }

    /// Whether the port's protocol is `HTTP_PROXY` (a generic egress HTTP proxy).
    pub fn is_http_proxy(&self) -> bool {
        self.port
            .as_ref()
            .is_some_and(|p| p.protocol.eq_ignore_ascii_case(HTTP_PROXY))
    }

    /// Istio's `needsPortMatch`: a listener on a port (not `HTTP_PROXY`) imports only the services
    /// that have that port, trimmed to it.
    pub fn match_port(&self) -> bool {
        self.port.as_ref().is_some_and(|p| p.number != 0) && !self.is_http_proxy()
    }

    /// Whether a service of `namespace` with hostname `host` is imported, as Istio's
    /// `hostClassification.Matches`: an egress host of that namespace (or `*`) names it exactly,
    /// or, where either is a wildcard, the service's host is a subset of the egress host. So
    /// `ns/api.example.com` does not import the `*.example.com` service, `ns/*.example.com`
    /// imports `api.example.com`.
    pub fn imports_service(&self, namespace: &str, host: &str) -> bool {
        self.hosts
            .iter()
            .filter(|(ns, _)| ns == namespace || ns == WILDCARD_NAMESPACE)
            .any(|(_, h)| h == "*" || model::host::subset_of(host, h))
    }

    /// Whether a VirtualService (or another config) of `namespace` with host `host` is imported:
    /// an egress host of that namespace (or `*`) matches it, wildcards either way, as Istio's
    /// `VSMatches` for sidecars (`host.Name.Matches`).
    pub fn imports(&self, namespace: &str, host: &str) -> bool {
        self.hosts
            .iter()
            .filter(|(ns, _)| ns == namespace || ns == WILDCARD_NAMESPACE)
            .any(|(_, h)| h == "*" || model::host::matches(h, host))
    }

    /// Whether an egress host of any namespace matches `host`.
    pub(super) fn imports_any_namespace(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|(_, h)| h == "*" || model::host::matches(h, host) || model::host::matches(host, h))
    }

    /// Istio's `SelectVirtualServices` for one VirtualService: one of its hosts is imported.
    pub fn imports_virtual_service(&self, config: &Config) -> bool {
        match &config.spec {
            ConfigSpec::VirtualService(vs) => vs
                .hosts
                .iter()
                .any(|h| self.imports(&config.meta.namespace, &h.to_ascii_lowercase())),
            _ => false,
        }
    }

    /// The namespaces of the listener's hosts.
    pub(super) fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(|(ns, _)| ns.as_str())
    }

    /// Istio's `selectServices` for one service: imported by the hosts, and for a listener with a
    /// port, having that port (the service trimmed to it).
    pub fn select_service(&self, service: &Arc<Service>) -> Option<Arc<Service>> {
        if !self.imports_service(service.namespace(), &service.hostname) {
            return None;
        }
        if self.match_port() {
            return self.select_port(service);
        }
        Some(service.clone())
    }

    /// Istio's `serviceMatchingListenerPort`: the service with only the listener's port, if it has it.
    pub(super) fn select_port(&self, service: &Arc<Service>) -> Option<Arc<Service>> {
        let number = self.port.as_ref()?.number;
        let port = service.ports.iter().find(|p| u32::from(p.port) == number)?;
        if service.ports.len() == 1 {
            return Some(service.clone());
        }
        Some(Arc::new(Service {
            ports: vec![port.clone()],
            ..Service::clone(service)
        }))
    }
}

/// Istio's `serviceMatchingVirtualServicePorts`: the service with only the ports a VirtualService
/// names for it (all of them when a destination names no port, `0`); `None` if it has none of them.
pub(super) fn service_matching_ports(service: &Arc<Service>, ports: &BTreeSet<u32>) -> Option<Arc<Service>> {
    if ports.is_empty() || ports.contains(&0) {
        return Some(service.clone());
    }
    let found: Vec<_> = service
        .ports
        .iter()
        .filter(|p| ports.contains(&u32::from(p.port)))
        .cloned()
        .collect();
    match found.len() {
        0 => None,
        n if n == service.ports.len() => Some(service.clone()),
        _ => Some(Arc::new(Service {
            ports: found,
            ..Service::clone(service)
        })),
    }
}

/// Istio's `virtualServiceDestinationsFilteredBySourceNamespace`: the destination hosts of the
/// `http` (routes and mirrors of rules whose matches admit `namespace`), `tcp` and `tls` routes, each
/// with the ports named (`0` when a destination names none), by host.
pub(super) fn destinations<'a>(vs: &'a VirtualService, namespace: Option<&str>) -> BTreeMap<&'a str, BTreeSet<u32>> {
    let mut out: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut add = |d: &'a model::networking::Destination| {
        out.entry(d.host.as_str())
            .or_default()
            .insert(d.port.as_ref().map_or(0, |p| p.number));
    };
    for rule in &vs.http {
        // a rule whose matches name source namespaces must name this one (when one is given)
        let mut admitted = true;
        for m in rule
            .match_
            .iter()
            .filter(|m| namespace.is_some() && !m.source_namespace.is_empty())
        {
            admitted = Some(m.source_namespace.as_str()) == namespace;
            if admitted {
                break;
            }
        }
        if !admitted {
            continue;
        }
        rule.route.iter().for_each(|r| add(&r.destination));
        rule.mirror.iter().for_each(&mut add);
        rule.mirrors.iter().for_each(|m| add(&m.destination));
    }
    vs.tcp.iter().flat_map(|t| &t.route).for_each(|r| add(&r.destination));
    vs.tls.iter().flat_map(|t| &t.route).for_each(|r| add(&r.destination));
    out
}

/// The services of all egress listeners, one per hostname, as Istio's `appendSidecarServices`.
#[derive(Debug, Default)]
pub(super) struct ImportedServices {
    services: Vec<Arc<Service>>,
    by_host: HashMap<String, usize>,
}

impl ImportedServices {
    /// Adds `service`: a new hostname is taken; for a known one a Kubernetes service wins over
    /// others, and services of the same namespace, resolution and registry merge their ports.
    pub(super) fn add(&mut self, service: Arc<Service>) {
        let Some(&i) = self.by_host.get(&service.hostname) else {
            self.by_host.insert(service.hostname.clone(), self.services.len());
            self.services.push(service);
            return;
        };
        let existing = &self.services[i];
        let kube = |s: &Service| s.attributes.service_registry == "Kubernetes";
        if Arc::ptr_eq(existing, &service) || existing.ports == service.ports || (kube(existing) && !kube(&service)) {
            return;
        }
        if !kube(existing) && kube(&service) {
            self.services[i] = service;
            return;
        }
        let mergeable = existing.namespace() == service.namespace()
            && existing.resolution == service.resolution
            && existing.attributes == service.attributes;
        if !mergeable {
            tracing::debug!(
                host = service.hostname,
                "service of another namespace or registry ignored"
            );
            return;
        }
        let mut merged = Service::clone(existing);
        for p in &service.ports {
            if !merged.ports.iter().any(|q| q.port == p.port) {
                merged.ports.push(p.clone());
            }
        }
        self.services[i] = Arc::new(merged);
    }

    /// The services, sorted by hostname.
    pub(super) fn into_sorted(mut self) -> Vec<Arc<Service>> {
        self.services.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        self.services
    }
}
