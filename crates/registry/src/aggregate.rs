//! The union of the registries, as Istio's `aggregate.Controller`: registries in order, a service
//! several of them define merged into one with the endpoints of all.

use std::collections::BTreeSet;
use std::sync::Arc;

use model::service::Endpoints;
use model::{Service, ServiceKey};

use crate::{RegistryDiff, RegistrySnapshot, ServiceRegistry};

/// The union of the registries' snapshots. A (hostname, namespace) that several registries
/// define keeps the first registry's service, and the endpoints of all of them.
pub fn aggregate(registries: &[Box<dyn ServiceRegistry>]) -> Arc<RegistrySnapshot> {
    let snapshots: Vec<Arc<RegistrySnapshot>> = registries.iter().map(|r| r.snapshot()).collect();
    match snapshots.as_slice() {
        [] => Arc::default(),
        [one] => one.clone(),
        all => {
            let keys: BTreeSet<&ServiceKey> = all.iter().flat_map(|s| s.endpoints.keys()).collect();
            let endpoints = keys
                .into_iter()
                .filter_map(|k| merged_endpoints(all, k).map(|e| (k.clone(), e)))
                .collect();
            Arc::new(RegistrySnapshot {
                services: merged_services(all),
                endpoints,
            })
        }
    }
}

/// The union after `diff`, from the union before it: the services merged again only when some
/// changed (a full push follows anyway), and the endpoints of the changed services only; the rest
/// is shared with `previous`. Equal to [`aggregate`].
pub fn aggregate_changed(
    previous: &RegistrySnapshot,
    registries: &[Box<dyn ServiceRegistry>],
    diff: &RegistryDiff,
) -> Arc<RegistrySnapshot> {
    let snapshots: Vec<Arc<RegistrySnapshot>> = registries.iter().map(|r| r.snapshot()).collect();
    if let [one] = snapshots.as_slice() {
        return one.clone();
    }
    let changed = diff.endpoints_changed.iter().chain(&diff.services_changed);
    let mut next = previous.with_endpoints(changed.map(|k| (k.clone(), merged_endpoints(&snapshots, k))));
    if !diff.services_changed.is_empty() {
        next.services = merged_services(&snapshots);
    }
    Arc::new(next)
}

/// One service per (hostname, namespace), the first registry's, sorted.
fn merged_services(snapshots: &[Arc<RegistrySnapshot>]) -> Arc<Vec<Arc<Service>>> {
    let mut keys = BTreeSet::new();
    let mut services: Vec<Arc<Service>> = snapshots
        .iter()
        .flat_map(|s| s.services.iter())
        .filter(|s| keys.insert(ServiceKey::of(s)))
        .cloned()
        .collect();
    services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
    Arc::new(services)
}

/// The endpoints every registry has for `key`, in registry order.
fn merged_endpoints(snapshots: &[Arc<RegistrySnapshot>], key: &ServiceKey) -> Option<Endpoints> {
    let mut found = snapshots.iter().filter_map(|s| s.endpoints.get(key));
    let first = found.next()?;
    let rest: Vec<&Endpoints> = found.collect();
    if rest.is_empty() {
        return Some(first.clone());
    }
    let mut all = first.as_ref().clone();
    for e in rest {
        all.extend(e.iter().cloned());
    }
    Some(Arc::new(all))
}
