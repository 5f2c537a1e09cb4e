//! `PushContext`: the immutable index of one push, as Istio's `model.PushContext`, built from the
//! mesh config, all configs and the service registry, and shared (`Arc`) by every generator.
//! It is made of small per-kind indexes so a change can rebuild only the ones it touches
//! (`PushContext::rebuild`).
//!
//! Sidecar scoping: the `Sidecar` resource that applies to a proxy (`sidecar_scope`) narrows
//! `services_for_proxy`, `virtual_services_for_mesh` and `destination_rule`; without one, lookups
//! go through the proxy's namespace (`exportTo`) only.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod auto_allocate;
mod cluster_local;
mod delegate;
mod dependencies;
mod destination_rules;
mod gateways;
mod instances;
pub mod peer_authn;
pub mod security_policies;
mod services;
mod sidecar_scope;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod virtual_services;

#[cfg(test)]
mod rebuild_tests;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cluster_local::ClusterLocalHosts;
use model::mesh_networks::NetworkIndex;
use model::service::Endpoints;
use model::{Config, ConfigKind, MeshConfig, Proxy, Service};

pub use dependencies::proxy_needs_push;
pub use destination_rules::{DestinationRuleIndex, MergedDestinationRule};
pub use gateways::GatewayIndex;
pub use instances::ServiceInstance;
pub use services::ServiceIndex;
pub use sidecar_scope::{EgressListener, SidecarIndex, SidecarScope, UNIX_ADDRESS_PREFIX};
pub use virtual_services::{MESH_GATEWAY, VirtualServiceIndex, resolve_gateway_name, resolve_short_names};

/// Sidecar scopes by proxy namespace, then Sidecar in effect; hashed with foldhash (asked for
/// every proxy at every push).
type ScopesByNamespace = HashMap<
    String,
    HashMap<Option<usize>, Arc<SidecarScope>, foldhash::fast::RandomState>,
    foldhash::fast::RandomState,
>;

/// Everything a push is built from.
#[derive(Debug, Clone)]
pub struct PushInput {
    pub mesh: Arc<MeshConfig>,
    /// The cluster's DNS domain (`cluster.local`), for short host names.
    pub domain: String,
    pub configs: Vec<Arc<Config>>,
    pub registry: Arc<registry::RegistrySnapshot>,
    /// The push version, as Istio's `PushVersion`; sent as `version_info`.
    pub version: String,
    pub features: model::Features,
    /// The JWKS pilot-discovery fetched for RequestAuthentication rules.
    pub jwks: Arc<security_policies::JwksKeys>,
}

/// The per-push index. Immutable once built, except for what it computes on first use (Sidecar
/// scopes, instances by address, push dependencies).
#[derive(Debug)]
pub struct PushContext {
    version: String,
    mesh: Arc<MeshConfig>,
    domain: String,
    features: model::Features,
    jwks: Arc<security_policies::JwksKeys>,
    configs: Vec<Arc<Config>>,
    registry: Arc<registry::RegistrySnapshot>,
    services: Arc<ServiceIndex>,
    destination_rules: Arc<DestinationRuleIndex>,
    virtual_services: Arc<VirtualServiceIndex>,
    gateways: Arc<GatewayIndex>,
    peer_authn: Arc<peer_authn::PeerAuthnIndex>,
    authorization_policies: Arc<security_policies::PolicyIndex>,
    request_authentications: Arc<security_policies::PolicyIndex>,
    /// Service instances by endpoint address, built on first use; shared with the next push
    /// while the registry is the same.
    instances: Arc<instances::InstancesByAddress>,
    /// Configs by key and `proxy_sees` answers, for push filtering.
    dependencies: dependencies::DependencyCache,
    /// The Sidecar index and scopes, built on first use; shared with the next push while no
    /// Sidecar changed.
    sidecars: Arc<Sidecars>,
    /// meshNetworks as the endpoints read it (networks, gateways).
    networks: Arc<NetworkIndex>,
    /// Hosts whose endpoints stay in their cluster (meshConfig `serviceSettings`, Istio's
    /// defaults).
    cluster_local: Arc<ClusterLocalHosts>,
}

/// What the Sidecar resources of a push decide, computed on first use. It reads the Sidecars
/// (and the mesh's root namespace) only, so a push that changed neither shares it.
#[derive(Debug, Default)]
struct Sidecars {
    /// The Sidecar resources by namespace.
    index: OnceLock<SidecarIndex>,
    /// Sidecar scopes by proxy namespace, then Sidecar in effect (its position in `index`): all
    /// that decides a sidecar's scope.
    scopes: Mutex<ScopesByNamespace>,
}

fn authorization_index(input: &PushInput) -> security_policies::PolicyIndex {
    security_policies::PolicyIndex::new(&input.configs, &input.mesh.root_namespace, |c| {
        security_policies::authorization_policy(c).is_some()
    })
}

fn request_authn_index(input: &PushInput) -> security_policies::PolicyIndex {
    security_policies::PolicyIndex::new(&input.configs, &input.mesh.root_namespace, |c| {
        security_policies::request_authentication(c).is_some()
    })
}

/// Istio's `sortConfigByCreationTime`: the oldest first (configs without a creation time, Go's zero
/// time, before all), ties broken by name then namespace.
pub fn creation_order(a: &Config, b: &Config) -> Ordering {
    (a.meta.creation_time, &a.meta.name, &a.meta.namespace).cmp(&(
        b.meta.creation_time,
        &b.meta.name,
        &b.meta.namespace,
    ))
}

/// What changed since the previous push, for `PushContext::rebuild`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeScope {
    /// Config kinds with at least one added, updated or deleted resource.
    pub kinds: Vec<ConfigKind>,
    /// Whether the registry's services (not only their endpoints) changed.
    pub services: bool,
}

impl PushContext {
    pub fn new(input: PushInput) -> PushContext {
        let services = Arc::new(ServiceIndex::new(&input.registry.services, &input.mesh));
        let destination_rules = Arc::new(DestinationRuleIndex::new(&input.configs, &input.mesh, &input.domain));
        let virtual_services = Arc::new(VirtualServiceIndex::new(&input.configs, &input.mesh, &input.domain));
        let gateways = Arc::new(GatewayIndex::new(&input.configs));
        let peer_authn = Arc::new(peer_authn::PeerAuthnIndex::new(
            &input.configs,
            &input.mesh.root_namespace,
        ));
        let authorization_policies = Arc::new(authorization_index(&input));
        let request_authentications = Arc::new(request_authn_index(&input));
        let cluster_local = Arc::new(ClusterLocalHosts::new(&input.mesh, &input.domain));
        PushContext {
            version: input.version,
            mesh: input.mesh,
            domain: input.domain,
            features: input.features,
            jwks: input.jwks,
            configs: input.configs,
            registry: input.registry,
            services,
            destination_rules,
            virtual_services,
            gateways,
            peer_authn,
            authorization_policies,
            request_authentications,
            instances: Default::default(),
            dependencies: Default::default(),
            sidecars: Default::default(),
            networks: Default::default(),
            cluster_local,
        }
    }

    /// A new push that reuses the indexes of `self` that `changed` does not touch. The mesh config,
    /// domain and features must be those of `self` (else it is `PushContext::new`). What is computed
    /// on first use starts empty, except the instances by address (the registry is the same) and
    /// the Sidecar index and scopes (no Sidecar changed), which the two pushes share: a
    /// VirtualService change then finds them built.
    pub fn rebuild(&self, input: PushInput, changed: &ChangeScope) -> PushContext {
        if input.mesh != self.mesh || input.domain != self.domain || input.features != self.features {
            return PushContext::new(input);
        }
        let touched = |k: ConfigKind| changed.kinds.contains(&k);
        let services = if changed.services {
            Arc::new(ServiceIndex::new(&input.registry.services, &input.mesh))
        } else {
            self.services.clone()
        };
        let destination_rules = if touched(ConfigKind::DestinationRule) {
            Arc::new(DestinationRuleIndex::new(&input.configs, &input.mesh, &input.domain))
        } else {
            self.destination_rules.clone()
        };
        let virtual_services = if touched(ConfigKind::VirtualService) {
            Arc::new(VirtualServiceIndex::new(&input.configs, &input.mesh, &input.domain))
        } else {
            self.virtual_services.clone()
        };
        let gateways = if touched(ConfigKind::Gateway) {
            Arc::new(GatewayIndex::new(&input.configs))
        } else {
            self.gateways.clone()
        };
        let peer_authn = if touched(ConfigKind::PeerAuthentication) {
            Arc::new(peer_authn::PeerAuthnIndex::new(
                &input.configs,
                &input.mesh.root_namespace,
            ))
        } else {
            self.peer_authn.clone()
        };
        let authorization_policies = if touched(ConfigKind::AuthorizationPolicy) {
            Arc::new(authorization_index(&input))
        } else {
            self.authorization_policies.clone()
        };
        let request_authentications = if touched(ConfigKind::RequestAuthentication) {
            Arc::new(request_authn_index(&input))
        } else {
            self.request_authentications.clone()
        };
        // built from the registry alone (services and endpoints)
        let instances = if Arc::ptr_eq(&input.registry, &self.registry) {
            self.instances.clone()
        } else {
            Default::default()
        };
        let sidecars = if touched(ConfigKind::Sidecar) {
            Default::default()
        } else {
            self.sidecars.clone()
        };
        // the mesh config and domain are those of `self`
        let cluster_local = self.cluster_local.clone();
        let networks = self.networks.clone();
        PushContext {
            version: input.version,
            mesh: input.mesh,
            domain: input.domain,
            features: input.features,
            jwks: input.jwks,
            configs: input.configs,
            registry: input.registry,
            services,
            destination_rules,
            virtual_services,
            gateways,
            peer_authn,
            authorization_policies,
            request_authentications,
            instances,
            dependencies: Default::default(),
            sidecars,
            networks,
            cluster_local,
        }
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// This push with meshNetworks as the endpoints read it (none until given).
    pub fn with_networks(mut self, networks: Arc<NetworkIndex>) -> PushContext {
        self.networks = networks;
        self
    }

    pub fn networks(&self) -> &NetworkIndex {
        &self.networks
    }

    /// Whether callers of `host` reach only the endpoints of their own cluster (meshConfig
    /// `serviceSettings[].settings.clusterLocal`, Istio's defaults).
    pub fn is_cluster_local(&self, host: &str) -> bool {
        self.cluster_local.is_cluster_local(host)
    }

    pub fn mesh(&self) -> &MeshConfig {
        &self.mesh
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    pub fn features(&self) -> &model::Features {
        &self.features
    }

    /// Every config of this push, as given.
    pub fn configs(&self) -> &[Arc<Config>] {
        &self.configs
    }

    /// The PeerAuthentication in effect for a workload of `namespace` with `labels`.
    pub fn peer_authentication(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> peer_authn::MergedPeerAuthentication {
        self.peer_authn.effective(namespace, labels)
    }

    /// The AuthorizationPolicies that apply to a workload of `namespace` with `labels`, by action.
    pub fn authorization_policies(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> security_policies::AuthorizationPoliciesResult {
        security_policies::by_action(self.authorization_policies.for_workload(
            namespace,
            labels,
            security_policies::authorization_scope,
        ))
    }

    /// Istio's `LookupCluster`: the outbound cluster of `service` (`<namespace>/<hostname>`, or a
    /// hostname only one namespace has) on `port`.
    pub fn lookup_cluster(&self, service: &str, port: u16) -> Result<String, String> {
        if service.is_empty() {
            return Err("service must not be empty".into());
        }
        let (namespace, host) = match service.split_once('/') {
            Some((ns, host)) => (Some(ns), host),
            None => (None, service),
        };
        let found: Vec<_> = self
            .services
            .by_hostname(host)
            .filter(|(ns, _)| namespace.is_none_or(|n| n == ns.as_str()))
            .collect();
        match found.as_slice() {
            [(_, svc)] => Ok(format!("outbound|{port}||{}", svc.hostname)),
            [] => Err(format!("could not find service {service} in Istio service registry")),
            many => Err(format!(
                "found {service} in multiple namespaces {:?}, specify the namespace explicitly in the format of \
                 <Namespace>/<Hostname>",
                many.iter().map(|(ns, _)| ns.as_str()).collect::<Vec<_>>()
            )),
        }
    }

    /// The JWKS fetched for a rule's issuer and `jwksUri` (empty: OpenID discovery), if any.
    pub fn jwks(&self, issuer: &str, jwks_uri: &str) -> Option<&str> {
        self.jwks
            .get(&security_policies::JwksKey {
                issuer: issuer.to_owned(),
                jwks_uri: jwks_uri.to_owned(),
            })
            .map(String::as_str)
    }

    /// The RequestAuthentications that apply to a workload of `namespace` with `labels`, root
    /// namespace first, oldest first.
    pub fn request_authentications(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<Arc<Config>> {
        self.request_authentications
            .for_workload(namespace, labels, security_policies::request_authentication_scope)
            .cloned()
            .collect()
    }

    /// Istio's `BestEffortInferServiceMTLSMode` without the DestinationRule: what mTLS the
    /// workloads of `service` accept, as far as namespace- and mesh-wide policies tell (PERMISSIVE
    /// when they do not; DISABLE for services outside the mesh).
    pub fn service_mtls_mode(&self, service: &Service) -> model::security::MtlsMode {
        if service.mesh_external {
            return model::security::MtlsMode::Disable;
        }
        self.peer_authn
            .namespace_mode(service.namespace())
            .unwrap_or(model::security::MtlsMode::Permissive)
    }

    pub fn registry(&self) -> &registry::RegistrySnapshot {
        &self.registry
    }

    /// Istio's `GetAllAddressesForProxy`: the service's addresses in the proxy's cluster (else its
    /// default ones), or, for a proxy that captures DNS, the VIPs allocated to a ServiceEntry
    /// without addresses (of the proxy's IP families).
    pub fn service_addresses(&self, proxy: &Proxy, service: &Service) -> Vec<String> {
        let addresses = service.addresses_for(proxy.cluster_id());
        if !addresses.is_empty() {
            return addresses.to_vec();
        }
        if !proxy.uses_auto_allocated_ips(self.features.enable_ip_autoallocate) {
            return Vec::new();
        }
        let Some(a) = self.services.auto_allocated(&service.hostname, service.namespace()) else {
            return Vec::new();
        };
        let (v4, v6) = proxy.ip_families();
        let mut out = Vec::new();
        if v4 {
            out.push(a.v4.to_string());
        }
        if v6 {
            out.push(a.v6.to_string());
        }
        out
    }

    /// Services visible to the proxy's namespace (`exportTo`), one per hostname, sorted by hostname.
    /// A Sidecar resource applying to the proxy narrows them to its egress hosts.
    pub fn services_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Service>> {
        let visible = self.services_for_namespace(&proxy.config_namespace);
        let scope = self.sidecar_scope(proxy);
        if scope.is_default() {
            return visible.as_ref().clone();
        }
        visible
            .iter()
            .filter(|s| scope.imports(s.namespace(), &s.hostname))
            .cloned()
            .collect()
    }

    /// The position of the Sidecar in effect for the proxy in this push's Sidecar index: with the
    /// proxy's namespace, all that decides what a sidecar sees.
    pub(crate) fn sidecar_position(&self, proxy: &Proxy) -> Option<usize> {
        self.sidecar_index().select(&self.mesh, proxy)
    }

    fn sidecar_index(&self) -> &SidecarIndex {
        self.sidecars.index.get_or_init(|| SidecarIndex::new(&self.configs))
    }

    /// The `SidecarScope` of the proxy (Istio's `proxy.SidecarScope`), shared by the proxies of a
    /// namespace that the same Sidecar applies to.
    pub fn sidecar_scope(&self, proxy: &Proxy) -> Arc<SidecarScope> {
        let position = self.sidecar_position(proxy);
        let ns = proxy.config_namespace.as_str();
        let mut cache = self.sidecars.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = cache.get(ns).and_then(|m| m.get(&position)) {
            return scope.clone();
        }
        let scope = Arc::new(match position.and_then(|i| self.sidecar_index().get(i)) {
            Some(c) => SidecarScope::from_sidecar(c, ns),
            None => SidecarScope::default(),
        });
        cache.entry(ns.to_owned()).or_default().insert(position, scope.clone());
        scope
    }

    /// Whether the proxy's outbound traffic policy is `REGISTRY_ONLY` (its Sidecar's, else the mesh's).
    pub fn registry_only(&self, proxy: &Proxy) -> bool {
        self.sidecar_scope(proxy).registry_only(&self.mesh)
    }

    /// As `services_for_proxy`, shared: computed once per namespace and push.
    pub fn services_for_namespace(&self, namespace: &str) -> Arc<Vec<Arc<Service>>> {
        self.services.visible_to(namespace)
    }

    /// The visible service for a hostname: exact, else the most specific wildcard service; a
    /// service in the proxy's namespace wins over others of the same hostname.
    pub fn service_for_host(&self, proxy: &Proxy, host: &str) -> Option<Arc<Service>> {
        self.services.for_host(host, &proxy.config_namespace)
    }

    /// The endpoints of the service (hostname, namespace); empty if it has none.
    pub fn endpoints(&self, hostname: &str, namespace: &str) -> Endpoints {
        self.registry
            .endpoints
            .get(&registry::ServiceKey::new(hostname, namespace))
            .cloned()
            .unwrap_or_default()
    }

    /// The DestinationRule of a service the proxy runs an instance of, for its inbound cluster
    /// (Istio's `SidecarScope.DestinationRule(TrafficDirectionInbound, ...)`): as
    /// `destination_rule`, without the rules that select workloads.
    pub fn inbound_destination_rule(&self, proxy: &Proxy, service: &Service) -> Option<Arc<MergedDestinationRule>> {
        if !self
            .sidecar_scope(proxy)
            .imports(service.namespace(), &service.hostname)
        {
            return None;
        }
        self.destination_rules
            .lookup_inbound(&proxy.config_namespace, &service.hostname, service.namespace())
    }

    /// The DestinationRule for a service as seen from the proxy, in Istio's lookup order: the
    /// proxy's namespace, the service's namespace, then the root namespace; most specific host;
    /// `exportTo` respected; rules with a workload selector matching the proxy first.
    /// A service outside the proxy's Sidecar egress hosts has no rule, as Istio's `SidecarScope`.
    pub fn destination_rule(&self, proxy: &Proxy, service: &Service) -> Option<Arc<MergedDestinationRule>> {
        if !self
            .sidecar_scope(proxy)
            .imports(service.namespace(), &service.hostname)
        {
            return None;
        }
        self.destination_rules.lookup(
            &proxy.config_namespace,
            &proxy.labels,
            &service.hostname,
            service.namespace(),
        )
    }

    /// Gateway configs whose selector matches the proxy's labels, in creation order.
    pub fn gateways_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Config>> {
        self.gateways.selecting(&proxy.labels)
    }

    /// A Gateway config by `namespace/name`.
    pub fn gateway(&self, name: &str) -> Option<Arc<Config>> {
        self.gateways.get(name)
    }

    /// VirtualServices bound to `gateway` (`namespace/name`, or `mesh`) and visible to the proxy's
    /// namespace, in Istio's order. Hosts, gateway names and destination hosts are resolved
    /// (`resolve_short_names`).
    pub fn virtual_services_for_gateway(&self, proxy: &Proxy, gateway: &str) -> Vec<Arc<Config>> {
        self.virtual_services.for_gateway(&proxy.config_namespace, gateway)
    }

    /// Istio's `destinationsByGateway` (read with `PILOT_FILTER_GATEWAY_CLUSTER_CONFIG`): the hosts
    /// that the VirtualServices bound to `gateway` and visible to the proxy, and their delegates,
    /// route, mirror or forward to.
    pub fn gateway_destinations(&self, proxy: &Proxy, gateway: &str) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for root in self.virtual_services_for_gateway(proxy, gateway) {
            let delegates = self
                .virtual_services
                .delegates_of(&root.key())
                .iter()
                .filter_map(|k| self.virtual_services.delegate(&k.namespace, &k.name));
            for config in std::iter::once(root.clone()).chain(delegates) {
                if let model::ConfigSpec::VirtualService(vs) = &config.spec {
                    out.extend(sidecar_scope::virtual_service_destinations(vs).map(str::to_owned));
                }
            }
        }
        out
    }

    /// VirtualServices that apply to sidecars (no gateways, or `mesh` among them), visible to the proxy.
    /// A Sidecar resource keeps those with a host among its egress hosts (Istio's `SelectVirtualServices`).
    pub fn virtual_services_for_mesh(&self, proxy: &Proxy) -> Vec<Arc<Config>> {
        let all = self.virtual_services.for_gateway(&proxy.config_namespace, MESH_GATEWAY);
        let scope = self.sidecar_scope(proxy);
        if scope.is_default() {
            return all;
        }
        all.into_iter()
            .filter(|c| match &c.spec {
                model::ConfigSpec::VirtualService(vs) => scope.imports_any(&c.meta.namespace, &vs.hosts),
                _ => false,
            })
            .collect()
    }

    /// A delegate VirtualService (no hosts) by namespace and name, resolved.
    pub fn delegate_virtual_service(&self, namespace: &str, name: &str) -> Option<Arc<Config>> {
        self.virtual_services.delegate(namespace, name)
    }

    /// Istio's `DelegateVirtualServices`: the delegates (found or not) that the given root
    /// VirtualServices name, so a change to one of them concerns whoever is sent those roots.
    /// Roots returned by this push are already merged with their delegates.
    pub fn delegate_virtual_services(&self, vses: &[Arc<Config>]) -> Vec<model::ConfigKey> {
        let mut out: Vec<model::ConfigKey> = vses
            .iter()
            .flat_map(|vs| self.virtual_services.delegates_of(&vs.key()).iter().cloned())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}
