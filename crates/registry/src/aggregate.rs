//! The union of the registries, as Istio's `aggregate.Controller`: registries in order (the
//! config cluster's Kubernetes first, then remote clusters, then the others), a service several
//! of them define merged into one with the endpoints of all, each endpoint keeping the cluster
//! and network it came from.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use model::service::Endpoints;
use model::{Service, ServiceKey};

use crate::{RegistryDiff, RegistrySnapshot, SERVICE_REGISTRY_KUBERNETES, ServiceRegistry};

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

/// One service per (hostname, namespace), sorted: the first registry's, as Istio's
/// `aggregate.Controller.Services`. A Kubernetes Service that several clusters have is one
/// service: the first cluster's, with the cluster IPs of each cluster (`ClusterVIPs`; a cluster
/// already present keeps its own) and the service accounts of all (`mergeService`).
fn merged_services(snapshots: &[Arc<RegistrySnapshot>]) -> Arc<Vec<Arc<Service>>> {
    let mut merged: BTreeMap<ServiceKey, Arc<Service>> = BTreeMap::new();
    for service in snapshots.iter().flat_map(|s| s.services.iter()) {
        match merged.entry(ServiceKey::of(service)) {
            Entry::Vacant(v) => {
                v.insert(service.clone());
            }
            Entry::Occupied(mut o) if is_kubernetes(o.get()) && is_kubernetes(service) => {
                merge_service(Arc::make_mut(o.get_mut()), service);
            }
            Entry::Occupied(_) => {}
        }
    }
    // BTreeMap order is (hostname, namespace), the order `RegistrySnapshot::service` searches.
    Arc::new(merged.into_values().collect())
}

fn is_kubernetes(s: &Service) -> bool {
    s.attributes.service_registry == SERVICE_REGISTRY_KUBERNETES
}

/// Istio's `mergeService`: `src`, of another cluster, adds its VIPs for its cluster (unless `dst`
/// has VIPs for that cluster already) and its service accounts.
fn merge_service(dst: &mut Service, src: &Service) {
    if src.ports != dst.ports {
        tracing::debug!(
            host = src.hostname,
            cluster = src.attributes.cluster_id,
            "service defined in several clusters with different ports: the first cluster's are served"
        );
    }
    let cluster = &src.attributes.cluster_id;
    let has = dst.cluster_vips.get(cluster).is_some_and(|v| !v.is_empty());
    if !has && let Some(vips) = src.cluster_vips.get(cluster).filter(|v| !v.is_empty()) {
        dst.cluster_vips.insert(cluster.clone(), vips.clone());
    }
    for sa in &src.attributes.service_accounts {
        if !dst.attributes.service_accounts.contains(sa) {
            dst.attributes.service_accounts.push(sa.clone());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryRegistry;
    use model::{Endpoint, Port, Protocol, Resolution, ServiceAttributes};

    fn service(cluster: &str, registry: &str, vip: &str, sa: &str) -> Service {
        Service {
            hostname: "web.shop.svc.cluster.local".into(),
            ports: vec![Port {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Http,
            }],
            addresses: vec![vip.into()],
            cluster_vips: BTreeMap::from([(cluster.to_owned(), vec![vip.to_owned()])]),
            resolution: Resolution::ClientSideLb,
            mesh_external: false,
            attributes: ServiceAttributes {
                service_registry: registry.into(),
                name: "web".into(),
                namespace: "shop".into(),
                cluster_id: cluster.into(),
                service_accounts: vec![sa.into()],
                ..Default::default()
            },
            origin: format!("Service/shop/web in {cluster}"),
        }
    }

    fn endpoint(cluster: &str, ip: &str, network: &str) -> Endpoint {
        Endpoint {
            address: ip.into(),
            endpoint_port: 8080,
            service_port_name: "http".into(),
            namespace: "shop".into(),
            cluster_id: cluster.into(),
            network: network.into(),
            ..Default::default()
        }
    }

    fn cluster(id: &str, vip: &str, ip: &str, network: &str) -> MemoryRegistry {
        let r = MemoryRegistry::as_provider(SERVICE_REGISTRY_KUBERNETES);
        r.add_service(service(
            id,
            SERVICE_REGISTRY_KUBERNETES,
            vip,
            &format!("spiffe://{id}/sa/web"),
        ));
        r.set_endpoints("web.shop.svc.cluster.local", "shop", vec![endpoint(id, ip, network)]);
        r
    }

    #[test]
    fn a_service_of_several_clusters_is_one_with_each_clusters_vips_and_all_endpoints() {
        let registries: Vec<Box<dyn ServiceRegistry>> = vec![
            Box::new(cluster("c1", "10.96.0.1", "10.1.0.1", "net1")),
            Box::new(cluster("c2", "10.96.0.2", "10.2.0.1", "net2")),
        ];
        let all = aggregate(&registries);
        assert_eq!(all.services.len(), 1);
        let svc = &all.services[0];
        // The first cluster's service, with the VIPs of both.
        assert_eq!(svc.attributes.cluster_id, "c1");
        assert_eq!(svc.addresses, ["10.96.0.1"]);
        assert_eq!(svc.addresses_for("c2"), ["10.96.0.2"]);
        assert_eq!(svc.addresses_for("c1"), ["10.96.0.1"]);
        assert_eq!(svc.addresses_for("elsewhere"), ["10.96.0.1"]);
        assert_eq!(
            svc.attributes.service_accounts,
            ["spiffe://c1/sa/web", "spiffe://c2/sa/web"]
        );
        // Each endpoint keeps its cluster and network.
        let key = ServiceKey::new("web.shop.svc.cluster.local", "shop");
        let eps: Vec<(&str, &str, &str)> = all
            .endpoints_of(&key)
            .iter()
            .map(|e| (e.address.as_str(), e.cluster_id.as_str(), e.network.as_str()))
            .collect();
        assert_eq!(eps, [("10.1.0.1", "c1", "net1"), ("10.2.0.1", "c2", "net2")]);
    }

    #[test]
    fn a_service_entry_of_the_same_host_does_not_merge_into_a_kubernetes_service() {
        let se = MemoryRegistry::as_provider(crate::SERVICE_REGISTRY_EXTERNAL);
        se.add_service(service(
            "",
            crate::SERVICE_REGISTRY_EXTERNAL,
            "240.0.0.1",
            "spiffe://se",
        ));
        let registries: Vec<Box<dyn ServiceRegistry>> =
            vec![Box::new(cluster("c1", "10.96.0.1", "10.1.0.1", "")), Box::new(se)];
        let all = aggregate(&registries);
        let svc = &all.services[0];
        assert_eq!(svc.attributes.service_registry, "Kubernetes");
        assert_eq!(svc.cluster_vips.len(), 1);
        assert_eq!(svc.attributes.service_accounts, ["spiffe://c1/sa/web"]);
    }

    #[test]
    fn a_change_in_one_cluster_gives_what_the_whole_union_gives() {
        let c1 = Arc::new(cluster("c1", "10.96.0.1", "10.1.0.1", ""));
        let c2 = Arc::new(cluster("c2", "10.96.0.2", "10.2.0.1", ""));
        let registries: Vec<Box<dyn ServiceRegistry>> = vec![Box::new(c1.clone()), Box::new(c2.clone())];
        let before = aggregate(&registries);
        let d = c2.set_endpoints(
            "web.shop.svc.cluster.local",
            "shop",
            vec![endpoint("c2", "10.2.0.1", ""), endpoint("c2", "10.2.0.2", "")],
        );
        assert_eq!(*aggregate_changed(&before, &registries, &d), *aggregate(&registries));
        let d = c2.remove_service("web.shop.svc.cluster.local", "shop");
        let after = aggregate_changed(&before, &registries, &d);
        assert_eq!(*after, *aggregate(&registries));
        assert_eq!(
            after.services[0].cluster_vips.len(),
            1,
            "c2's VIP left with its Service"
        );
    }
}
