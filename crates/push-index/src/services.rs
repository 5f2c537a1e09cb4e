//! The service index of a push: services by hostname and namespace, bucketed by `exportTo` as
//! Istio's `ServiceIndex` (public, private per namespace, exported to a named namespace).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use model::service::Visibility;
use model::{MeshConfig, Service};

/// Which namespaces see a service.
#[derive(Debug, Clone, PartialEq)]
enum Export {
    Public,
    /// Private to its own namespace and/or exported to the listed namespaces.
    Namespaces(Vec<String>),
    Hidden,
}

impl Export {
    /// Istio's `initServiceRegistry` rules: `*` wins over everything, then `~` hides the service,
    /// else `.` means the owner's namespace and other values name namespaces. An empty `exportTo`
    /// takes the mesh default.
    fn of(service: &Service, mesh: &MeshConfig) -> Export {
        let defaults: Vec<Visibility>;
        let export_to = if service.attributes.export_to.is_empty() {
            defaults = mesh
                .default_service_export_to
                .iter()
                .map(|s| Visibility::parse(s))
                .collect();
            &defaults
        } else {
            &service.attributes.export_to
        };
        if export_to.is_empty() || export_to.contains(&Visibility::Public) {
            return Export::Public;
        }
        if export_to.contains(&Visibility::None) {
            return Export::Hidden;
        }
        let mut namespaces: Vec<String> = export_to
            .iter()
            .filter_map(|v| match v {
                Visibility::Private => Some(service.namespace().to_owned()),
                Visibility::Namespace(ns) => Some(ns.clone()),
                Visibility::Public | Visibility::None => None,
            })
            .collect();
        namespaces.sort();
        namespaces.dedup();
        Export::Namespaces(namespaces)
    }

    fn visible_to(&self, namespace: &str) -> bool {
        match self {
            Export::Public => true,
            Export::Namespaces(list) => list.iter().any(|ns| ns == namespace),
            Export::Hidden => false,
        }
    }
}

#[derive(Debug)]
struct Entry {
    service: Arc<Service>,
    export: Export,
}

/// Services of one push, indexed for the lookups generators make per proxy.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    /// hostname -> namespace -> service (Istio's `HostnameAndNamespace`).
    by_host: HashMap<String, BTreeMap<String, Entry>>,
    /// Wildcard hostnames (`*.example.com`), for the wildcard fallback of `service_for_host`.
    wildcard_hosts: Vec<String>,
    /// The visible services per client namespace, one per hostname, computed on first use.
    visible: Mutex<HashMap<String, Arc<Vec<Arc<Service>>>>>,
    /// VIPs of ServiceEntries without addresses (for proxies that capture DNS).
    auto_allocated: crate::auto_allocate::Allocations,
}

impl ServiceIndex {
    pub fn new(services: &[Arc<Service>], mesh: &MeshConfig) -> ServiceIndex {
        let mut by_host: HashMap<String, BTreeMap<String, Entry>> = HashMap::new();
        for s in services {
            let export = Export::of(s, mesh);
            by_host.entry(s.hostname.clone()).or_default().insert(
                s.namespace().to_owned(),
                Entry {
                    service: s.clone(),
                    export,
                },
            );
        }
        let mut wildcard_hosts: Vec<String> = by_host
            .keys()
            .filter(|h| model::host::is_wildcard(h))
            .cloned()
            .collect();
        wildcard_hosts.sort();
        ServiceIndex {
            by_host,
            wildcard_hosts,
            visible: Mutex::default(),
            auto_allocated: crate::auto_allocate::allocate(services),
        }
    }

    /// The VIPs allocated to a ServiceEntry host without addresses, if any.
    pub fn auto_allocated(&self, hostname: &str, namespace: &str) -> Option<crate::auto_allocate::AutoAllocated> {
        self.auto_allocated
            .get(&(hostname.to_owned(), namespace.to_owned()))
            .copied()
    }

    /// Every service, each hostname once per namespace (for debug and change detection).
    /// The services of a hostname, by namespace.
    pub fn by_hostname(&self, host: &str) -> impl Iterator<Item = (&String, &Arc<Service>)> {
        self.by_host
            .get(host)
            .into_iter()
            .flatten()
            .map(|(ns, e)| (ns, &e.service))
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.by_host.values().flat_map(|m| m.values().map(|e| &e.service))
    }

    /// Whether a service with this hostname is defined in this namespace (visible or not).
    pub fn contains(&self, host: &str, namespace: &str) -> bool {
        self.by_host.get(host).is_some_and(|m| m.contains_key(namespace))
    }

    /// The service with exactly this hostname that a client in `namespace` sees. Several namespaces
    /// may define one hostname (ServiceEntries allow any host): Kubernetes services win over other
    /// registries (no "domain squatting"), then the client's own namespace, then the first
    /// namespace in name order (Istio: the oldest).
    pub fn exact(&self, host: &str, namespace: &str) -> Option<Arc<Service>> {
        let candidates = self.by_host.get(host)?;
        let visible = || candidates.values().filter(|e| e.export.visible_to(namespace));
        let kube = |e: &&Entry| e.service.attributes.service_registry == "Kubernetes";
        visible()
            .filter(kube)
            .find(|e| e.service.namespace() == namespace)
            .or_else(|| visible().find(kube))
            .or_else(|| visible().find(|e| e.service.namespace() == namespace))
            .or_else(|| visible().next())
            .map(|e| e.service.clone())
    }

    /// The visible service for `host`: exact, else the most specific visible wildcard service
    /// whose hostname matches it.
    pub fn for_host(&self, host: &str, namespace: &str) -> Option<Arc<Service>> {
        if let Some(s) = self.exact(host, namespace) {
            return Some(s);
        }
        self.wildcard_hosts
            .iter()
            .filter(|w| model::host::subset_of(host, w))
            .filter_map(|w| self.exact(w, namespace).map(|s| (w.len(), s)))
            .max_by_key(|(len, _)| *len)
            .map(|(_, s)| s)
    }

    /// The services a client in `namespace` sees, one per hostname, sorted by hostname.
    pub fn visible_to(&self, namespace: &str) -> Arc<Vec<Arc<Service>>> {
        let mut cache = self.visible.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = cache.get(namespace) {
            return v.clone();
        }
        let mut hosts: Vec<&String> = self.by_host.keys().collect();
        hosts.sort();
        let out: Arc<Vec<Arc<Service>>> =
            Arc::new(hosts.into_iter().filter_map(|h| self.exact(h, namespace)).collect());
        cache.insert(namespace.to_owned(), out.clone());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::{Port, Protocol, ServiceAttributes};

    pub(crate) fn service(host: &str, ns: &str, export_to: &[&str]) -> Arc<Service> {
        Arc::new(Service {
            cluster_vips: Default::default(),
            hostname: host.into(),
            ports: vec![Port {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Http,
            }],
            addresses: vec![],
            resolution: Default::default(),
            mesh_external: false,
            attributes: ServiceAttributes {
                service_registry: "External".into(),
                name: host.into(),
                namespace: ns.into(),
                export_to: export_to.iter().map(|s| Visibility::parse(s)).collect(),
                ..Default::default()
            },
            origin: format!("ServiceEntry/{ns}/x"),
        })
    }

    fn hosts(v: &[Arc<Service>]) -> Vec<(String, String)> {
        v.iter()
            .map(|s| (s.hostname.clone(), s.namespace().to_owned()))
            .collect()
    }

    #[test]
    fn export_to_controls_visibility() {
        let idx = ServiceIndex::new(
            &[
                service("pub.example.com", "a", &["*"]),
                service("priv.example.com", "a", &["."]),
                service("to-b.example.com", "a", &["b"]),
                service("none.example.com", "a", &["~"]),
                service("star-wins.example.com", "a", &["~", "*"]),
            ],
            &MeshConfig::default(),
        );
        assert_eq!(
            hosts(&idx.visible_to("a")),
            [
                ("priv.example.com", "a"),
                ("pub.example.com", "a"),
                ("star-wins.example.com", "a")
            ]
            .map(|(h, n)| (h.to_owned(), n.to_owned()))
        );
        assert_eq!(
            hosts(&idx.visible_to("b")),
            [
                ("pub.example.com", "a"),
                ("star-wins.example.com", "a"),
                ("to-b.example.com", "a")
            ]
            .map(|(h, n)| (h.to_owned(), n.to_owned()))
        );
    }

    #[test]
    fn mesh_default_export_applies_to_empty_export_to() {
        let mesh = MeshConfig {
            default_service_export_to: vec![".".into()],
            ..Default::default()
        };
        let idx = ServiceIndex::new(&[service("x.example.com", "a", &[])], &mesh);
        assert_eq!(idx.visible_to("a").len(), 1);
        assert!(idx.visible_to("b").is_empty());
    }

    #[test]
    fn same_hostname_in_two_namespaces_prefers_the_clients() {
        let idx = ServiceIndex::new(
            &[
                service("db.example.com", "a", &["*"]),
                service("db.example.com", "b", &["*"]),
            ],
            &MeshConfig::default(),
        );
        assert_eq!(idx.exact("db.example.com", "b").unwrap().namespace(), "b");
        assert_eq!(idx.exact("db.example.com", "c").unwrap().namespace(), "a");
        assert_eq!(
            hosts(&idx.visible_to("b")),
            vec![("db.example.com".to_owned(), "b".to_owned())]
        );
    }

    #[test]
    fn wildcard_fallback_picks_most_specific() {
        let idx = ServiceIndex::new(
            &[
                service("*.example.com", "a", &["*"]),
                service("*.api.example.com", "a", &["*"]),
            ],
            &MeshConfig::default(),
        );
        assert_eq!(
            idx.for_host("x.api.example.com", "z").unwrap().hostname,
            "*.api.example.com"
        );
        assert_eq!(idx.for_host("www.example.com", "z").unwrap().hostname, "*.example.com");
        assert!(idx.for_host("example.org", "z").is_none());
    }
}
