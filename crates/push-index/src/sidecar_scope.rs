//! `SidecarScope`: what one proxy may see, as Istio's `model.SidecarScope` built from the `Sidecar`
//! resource that applies to it (workload selector in the proxy's namespace, else the namespace's
//! Sidecar without selector, else the root namespace's). Without one, everything is visible.
//!
//! Egress hosts are `namespace/dnsName`: `.` is the proxy's namespace, `*` any namespace, `~` none.
//! Hosts are the union over all egress listeners (per-port egress listeners are not told apart).

use std::collections::BTreeMap;
use std::sync::Arc;

use model::{Config, ConfigKey, ConfigKind, ConfigSpec, MeshConfig, Proxy};

/// Namespace part of an egress host meaning "any namespace".
const WILDCARD_NAMESPACE: &str = "*";
/// Namespace part meaning "the proxy's namespace".
const CURRENT_NAMESPACE: &str = ".";

/// The visibility a `Sidecar` resource gives one proxy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SidecarScope {
    /// The Sidecar in effect; `None` is Istio's default scope (everything visible).
    sidecar: Option<ConfigKey>,
    /// (namespace, host) pairs of the egress listeners, `.` resolved to the proxy's namespace.
    egress_hosts: Vec<(String, String)>,
    /// The Sidecar's `outboundTrafficPolicy.mode`, overriding the mesh's.
    outbound_traffic_policy_mode: Option<String>,
}

impl SidecarScope {
    /// The scope for a sidecar `proxy`, in Istio's selection order; creation order decides ties.
    /// Gateways are never scoped (Istio's `DefaultSidecarScopeForGateway`).
    pub fn for_proxy(configs: &[Arc<Config>], mesh: &MeshConfig, proxy: &Proxy) -> SidecarScope {
        if !proxy.is_sidecar() {
            return SidecarScope::default();
        }
        let mut sidecars: Vec<&Arc<Config>> = configs
            .iter()
            .filter(|c| c.kind == ConfigKind::Sidecar && matches!(c.spec, ConfigSpec::Sidecar(_)))
            .collect();
        sidecars.sort_by(|a, b| crate::creation_order(a, b));
        let ns = proxy.config_namespace.as_str();
        let chosen = sidecars
            .iter()
            .filter(|c| c.meta.namespace == ns)
            .find(|c| selector(c).is_some_and(|l| l.iter().all(|(k, v)| proxy.labels.get(k) == Some(v))))
            .or_else(|| {
                sidecars
                    .iter()
                    .find(|c| c.meta.namespace == ns && selector(c).is_none())
            })
            .or_else(|| {
                sidecars
                    .iter()
                    .find(|c| c.meta.namespace == mesh.root_namespace && selector(c).is_none())
            });
        match chosen {
            Some(c) => SidecarScope::from_sidecar(c, ns),
            None => SidecarScope::default(),
        }
    }

    /// Istio's `convertToSidecarScope` for the Sidecar `config` applied to a proxy in `namespace`.
    pub fn from_sidecar(config: &Config, namespace: &str) -> SidecarScope {
        let ConfigSpec::Sidecar(sc) = &config.spec else {
            return SidecarScope::default();
        };
        let mut egress_hosts: Vec<(String, String)> = Vec::new();
        for listener in &sc.egress {
            for h in &listener.hosts {
                let Some((ns, host)) = h.split_once('/') else {
                    tracing::debug!(sidecar = %config.key(), host = h, "egress host without namespace ignored");
                    continue;
                };
                let ns = if ns == CURRENT_NAMESPACE { namespace } else { ns };
                let pair = (ns.to_owned(), host.to_ascii_lowercase());
                if !egress_hosts.contains(&pair) {
                    egress_hosts.push(pair);
                }
            }
        }
        SidecarScope {
            sidecar: Some(config.key()),
            egress_hosts,
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

    /// Whether a config of `namespace` with hostname `host` is imported: an egress host of that
    /// namespace (or `*`) matches it, wildcards either way as Istio's `host.Name.Matches`.
    pub fn imports(&self, namespace: &str, host: &str) -> bool {
        if self.is_default() {
            return true;
        }
        self.egress_hosts
            .iter()
            .filter(|(ns, _)| ns == namespace || ns == WILDCARD_NAMESPACE)
            .any(|(_, h)| h == "*" || model::host::matches(h, host))
    }

    /// Whether an egress host of any namespace matches `host` (a DestinationRule's host may name
    /// a service of another namespace than its own).
    pub fn imports_any_namespace(&self, host: &str) -> bool {
        self.is_default()
            || self
                .egress_hosts
                .iter()
                .any(|(_, h)| h == "*" || model::host::matches(h, host) || model::host::matches(host, h))
    }

    /// Whether a VirtualService of `namespace` naming `hosts` is imported (any of its hosts is).
    pub fn imports_any(&self, namespace: &str, hosts: &[String]) -> bool {
        self.is_default() || hosts.iter().any(|h| self.imports(namespace, h))
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
        self.egress_hosts
            .iter()
            .any(|(ns, _)| ns == WILDCARD_NAMESPACE || *ns == key.namespace)
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
