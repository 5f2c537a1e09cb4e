//! The Consul service registry, as Istio 1.7's `pilot/pkg/serviceregistry/consul`: the services
//! of Consul's catalog (`/v1/catalog/services`, `/v1/catalog/service/<name>`) as
//! `<name>.service.consul` in namespace `default`, their instances as endpoints
//! ([`conversion`]), followed with blocking queries ([`watch`]) over a small typed HTTP client
//! ([`client`]). What the catalog holds that cannot be served, and answers that are malformed,
//! too large or too slow, are named in the log and counted (`pilot_consul_errors`); the services
//! known before stay served as they were.
//!
//! [`ConsulRegistry`] holds the current snapshot; the watcher replaces services in it and hands
//! each [`registry::RegistryDiff`] on, as the Kubernetes registry does.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod catalog;
pub mod client;
pub mod conversion;
mod metrics;
pub mod watch;

#[cfg(test)]
mod watch_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use model::service::Endpoints;
use model::{Service, ServiceKey};
use registry::{RegistryDiff, RegistrySnapshot, ServiceRegistry, Workload};

pub use catalog::CatalogService;
pub use client::{Client, ClientOptions, ConsulError};
pub use conversion::{Problem, SERVICE_REGISTRY_CONSUL, service_hostname};
pub use metrics::ConsulMetrics;
pub use watch::{WatchOptions, spawn};

/// The Consul registry's services and endpoints.
#[derive(Debug)]
pub struct ConsulRegistry {
    trust_domain: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By Consul service name; a service none of whose instances can be served has no entry.
    services: BTreeMap<String, (Arc<Service>, Endpoints)>,
    /// What was left out of each service at its last read (reported once, when new).
    problems: BTreeMap<String, Vec<Problem>>,
    snapshot: Arc<RegistrySnapshot>,
}

impl ConsulRegistry {
    /// An empty registry; `trust_domain` makes the services' identity (Istio's
    /// `spiffe://<trust domain>/ns/default/sa/default`).
    pub fn new(trust_domain: &str) -> ConsulRegistry {
        ConsulRegistry {
            trust_domain: trust_domain.to_owned(),
            state: Mutex::default(),
        }
    }

    /// The catalog as one round of reads saw it: `listed` are the services Consul lists (any
    /// other goes), `read` the instances of those that were read; a listed service that was not
    /// read (its read failed) keeps what it had. Returns what changed and the problems not
    /// reported before.
    pub fn replace(
        &self,
        listed: &BTreeSet<String>,
        read: BTreeMap<String, Vec<CatalogService>>,
    ) -> (RegistryDiff, Vec<Problem>) {
        let converted: Vec<(String, Option<conversion::Converted>, Vec<Problem>)> = read
            .into_iter()
            .map(|(name, instances)| {
                let (c, p) = conversion::convert(&name, &instances, &self.trust_domain);
                (name, c, p)
            })
            .collect();
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut changed: Vec<(ServiceKey, Option<Endpoints>)> = Vec::new();
        let gone: Vec<String> = st.services.keys().filter(|n| !listed.contains(*n)).cloned().collect();
        for name in gone {
            if let Some((svc, _)) = st.services.remove(&name) {
                changed.push((ServiceKey::of(&svc), None));
            }
            st.problems.remove(&name);
        }
        st.problems.retain(|name, _| listed.contains(name));
        let mut new_problems = Vec::new();
        for (name, c, problems) in converted {
            let before = st.problems.remove(&name).unwrap_or_default();
            new_problems.extend(problems.iter().filter(|p| !before.contains(p)).cloned());
            if !problems.is_empty() {
                st.problems.insert(name.clone(), problems);
            }
            match c {
                Some(c) => {
                    let key = ServiceKey::of(&c.service);
                    let endpoints: Endpoints = Arc::new(c.endpoints);
                    let unchanged = st.services.get(&name).map(|(s, _)| s.as_ref()) == Some(&c.service);
                    let service = match st.services.get(&name) {
                        Some((s, _)) if unchanged => s.clone(),
                        _ => Arc::new(c.service),
                    };
                    changed.push((key, Some(endpoints.clone())));
                    st.services.insert(name, (service, endpoints));
                }
                None => {
                    if let Some((svc, _)) = st.services.remove(&name) {
                        changed.push((ServiceKey::of(&svc), None));
                    }
                }
            }
        }
        let mut next = st.snapshot.with_endpoints(changed);
        let mut services: Vec<Arc<Service>> = st.services.values().map(|(s, _)| s.clone()).collect();
        services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
        if services.len() == st.snapshot.services.len()
            && services
                .iter()
                .zip(st.snapshot.services.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b))
        {
            // same services: share the list, so that an endpoint-only change is one
            next.services = st.snapshot.services.clone();
        } else {
            next.services = Arc::new(services);
        }
        let next = Arc::new(next);
        let diff = registry::diff(&st.snapshot, &next);
        st.snapshot = next;
        (diff, new_problems)
    }
}

impl ServiceRegistry for ConsulRegistry {
    fn provider(&self) -> &str {
        SERVICE_REGISTRY_CONSUL
    }

    /// Istio config does not shape the Consul registry.
    fn config_changed(&self, _events: &[model::ConfigEvent]) -> RegistryDiff {
        RegistryDiff::default()
    }

    fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot
            .clone()
    }

    /// Istio 1.7's `GetProxyWorkloadLabels` for a proxy that pilot-agent started with
    /// `--serviceregistry Consul` (its ID is `<ip>.service.consul`): the labels (tags) and
    /// locality (datacenter) of the first Consul instance at its IP. Other proxies are not
    /// Consul workloads, whatever shares their IP.
    fn workload(&self, ip: &str, id: &str, _namespace: &str) -> Option<Workload> {
        if id.strip_suffix(".service.consul") != Some(ip) {
            return None;
        }
        let snapshot = self.snapshot();
        let e = snapshot
            .endpoints
            .values()
            .flat_map(|e| e.iter())
            .find(|e| e.address == ip)?;
        Some(Workload {
            labels: e.labels.clone(),
            locality: e.locality.region.clone(),
            service_targets: None,
        })
    }
}
