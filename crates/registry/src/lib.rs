//! The ServiceEntry service registry, as Istio's `pilot/pkg/serviceregistry/serviceentry`: turns
//! ServiceEntry and WorkloadEntry configs into `Service`s and `Endpoint`s, and says what changed
//! between two builds (full push vs EDS-only push). Pure and synchronous; `ServiceEntryRegistry`
//! keeps it up to date change by change.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod aggregate;
mod controller;
mod conversion;
mod diff;
mod instance;
pub mod memory;
mod workload_entry;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use model::ServiceKey;
use model::service::Endpoints;
use model::{Config, ConfigSpec, Endpoint, MeshConfig, Service};

pub use controller::{ServiceEntryRegistry, WorkloadSource};
pub use conversion::{
    LOCALITY_LABEL, SERVICE_REGISTRY_EXTERNAL, SERVICE_REGISTRY_KUBERNETES, TOPOLOGY_NETWORK, TOPOLOGY_REGION,
    TOPOLOGY_SUBZONE, TOPOLOGY_ZONE, UNIX_ADDRESS_PREFIX, augment_labels, visible_from,
};
pub use diff::{RegistryDiff, diff};
pub use instance::{ServiceEntries, ServiceRegistry, Workload, WorkloadSources};
pub use memory::{MemoryRegistry, SERVICE_REGISTRY_MOCK};

use conversion::{WorkloadRef, convert_endpoint, convert_services, host_endpoint, is_dns, resolution, valid_ports};
use workload_entry::WorkloadEntryIndex;

/// Endpoints per service: a persistent map, so that a snapshot made for one service's endpoints
/// shares everything else with the snapshot before it (copying it costs nothing; changing a key
/// costs a path of the tree).
pub type EndpointMap = imbl::OrdMap<ServiceKey, Endpoints>;

/// Everything a registry knows at one moment. Immutable: a change makes a new snapshot that shares
/// what did not change with the previous one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistrySnapshot {
    /// One service per (hostname, namespace), sorted by hostname then namespace; shared by the
    /// snapshots of changes that moved endpoints only.
    pub services: Arc<Vec<Arc<Service>>>,
    /// Endpoints per service, sorted; services without endpoints have no entry.
    pub endpoints: EndpointMap,
}

impl RegistrySnapshot {
    /// The service with this hostname in this namespace.
    pub fn service(&self, hostname: &str, namespace: &str) -> Option<&Arc<Service>> {
        self.services
            .binary_search_by(|s| (s.hostname.as_str(), s.namespace()).cmp(&(hostname, namespace)))
            .ok()
            .map(|i| &self.services[i])
    }

    /// A snapshot with the same services and these endpoints changed (`None` or empty: the
    /// service has none).
    pub fn with_endpoints(
        &self,
        changes: impl IntoIterator<Item = (ServiceKey, Option<Endpoints>)>,
    ) -> RegistrySnapshot {
        let mut endpoints = self.endpoints.clone();
        for (key, eps) in changes {
            match eps.filter(|e| !e.is_empty()) {
                Some(e) => {
                    endpoints.insert(key, e);
                }
                None => {
                    endpoints.remove(&key);
                }
            }
        }
        RegistrySnapshot {
            services: self.services.clone(),
            endpoints,
        }
    }

    /// The endpoints of a service (empty when it has none or does not exist).
    pub fn endpoints_of(&self, key: &ServiceKey) -> &[Endpoint] {
        self.endpoints.get(key).map(|e| e.as_slice()).unwrap_or(&[])
    }
}

/// Builds the registry from every config (kinds other than ServiceEntry and WorkloadEntry are
/// ignored), as Istio's ServiceEntry controller would hold it after seeing them all.
///
/// - One service per ServiceEntry host; when two ServiceEntries of one namespace declare the same
///   host, the oldest (`creationTimestamp`, then name) keeps the service, but the endpoints of both are
///   merged, as Istio indexes endpoints by (hostname, namespace).
/// - Endpoints: inline `endpoints`, WorkloadEntries selected by `workloadSelector` in the same
///   namespace, or, for DNS resolution with neither, the host itself.
pub fn build(configs: &[Arc<Config>], mesh: &MeshConfig) -> RegistrySnapshot {
    let mut service_entries: Vec<&Config> = configs
        .iter()
        .map(Arc::as_ref)
        .filter(|c| matches!(c.spec, ConfigSpec::ServiceEntry(_)))
        .collect();
    // Istio: the oldest ServiceEntry (creationTimestamp), then by name.
    service_entries.sort_by(|a, b| {
        (&a.meta.namespace, a.meta.creation_time, &a.meta.name).cmp(&(
            &b.meta.namespace,
            b.meta.creation_time,
            &b.meta.name,
        ))
    });
    let workload_entries = WorkloadEntryIndex::new(configs.iter().map(Arc::as_ref));

    let mut services: BTreeMap<ServiceKey, Arc<Service>> = BTreeMap::new();
    let mut endpoints: BTreeMap<ServiceKey, Vec<Endpoint>> = BTreeMap::new();
    for cfg in service_entries {
        let ConfigSpec::ServiceEntry(se) = &cfg.spec else {
            continue;
        };
        let origin = format!("ServiceEntry/{}/{}", cfg.meta.namespace, cfg.meta.name);
        let ports = valid_ports(&origin, se);
        let converted = convert_services(&cfg.meta, &origin, se, &ports, mesh);
        let dns = is_dns(resolution(se.resolution.as_deref()));
        let selected: Vec<&WorkloadRef<'_>> = workload_entries.selected_by(&cfg.meta.namespace, se, dns).collect();
        let inline: Vec<WorkloadRef<'_>> = se
            .endpoints
            .iter()
            .map(|entry| WorkloadRef {
                entry,
                labels: entry.labels.clone(),
                origin: origin.clone(),
            })
            .collect();
        let host_as_endpoint = dns && se.endpoints.is_empty() && se.workload_selector.is_none();

        for service in converted {
            let key = ServiceKey::of(&service);
            let eps = endpoints.entry(key.clone()).or_default();
            for &(port, number) in &ports {
                if host_as_endpoint {
                    eps.extend(host_endpoint(&service, port, number));
                    continue;
                }
                for workload in inline.iter().chain(selected.iter().copied()) {
                    eps.extend(convert_endpoint(&service, port, workload, mesh));
                }
            }
            match services.get(&key) {
                Some(kept) => tracing::debug!(
                    host = key.hostname,
                    namespace = key.namespace,
                    kept = kept.origin,
                    ignored = service.origin,
                    "duplicate ServiceEntry host: the first ServiceEntry keeps the service"
                ),
                None => {
                    services.insert(key, Arc::new(service));
                }
            }
        }
    }

    let endpoints = endpoints
        .into_iter()
        .filter(|(_, eps)| !eps.is_empty())
        .map(|(key, mut eps)| {
            eps.sort_by(|a, b| endpoint_order(a).cmp(&endpoint_order(b)));
            eps.dedup();
            (key, Arc::new(eps))
        })
        .collect();
    // BTreeMap order is (hostname, namespace): the services are sorted as documented.
    RegistrySnapshot {
        services: Arc::new(services.into_values().collect()),
        endpoints,
    }
}

type EndpointOrder<'a> = (
    &'a str,
    &'a str,
    u16,
    &'a str,
    &'a BTreeMap<String, String>,
    &'a model::Locality,
    u32,
    &'a str,
    &'a str,
    &'a str,
);

/// A total order over every field, so equal endpoints end up adjacent (and are deduplicated).
fn endpoint_order(e: &Endpoint) -> EndpointOrder<'_> {
    (
        &e.service_port_name,
        &e.address,
        e.endpoint_port,
        &e.origin,
        &e.labels,
        &e.locality,
        e.weight,
        &e.service_account,
        &e.network,
        &e.namespace,
    )
}
