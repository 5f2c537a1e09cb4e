//! VirtualServices of a push, indexed by the gateway they bind to and bucketed by `exportTo`, as
//! Istio's `virtualServiceIndex`. Short hosts and gateway names are resolved once here, and roots
//! are merged with their delegates (`delegate.rs`) before indexing.

use std::collections::HashMap;
use std::sync::Arc;

use model::networking::VirtualService;
use model::{Config, ConfigKey, ConfigSpec, MeshConfig};

use crate::delegate::{DelegateName, merge_virtual_services_if_needed};

/// The gateway name that means "the sidecars of the mesh".
pub const MESH_GATEWAY: &str = "mesh";

/// Istio's `resolveGatewayName`: `name` → `<namespace>/name`, `./name` → `<namespace>/name`,
/// `ns/name` as is, and the legacy FQDN form `name.ns.svc.cluster.local` → `ns/name`.
/// `mesh` is returned unchanged.
pub fn resolve_gateway_name(gateway: &str, namespace: &str) -> String {
    if gateway == MESH_GATEWAY {
        return gateway.to_owned();
    }
    match gateway.split_once('/') {
        Some((".", name)) => format!("{namespace}/{name}"),
        Some(_) => gateway.to_owned(),
        None => match gateway.split_once('.') {
            None => format!("{namespace}/{gateway}"),
            Some((name, rest)) => {
                let ns = rest.split('.').next().unwrap_or(rest);
                format!("{ns}/{name}")
            }
        },
    }
}

/// Resolves, as Istio's `resolveVirtualServiceShortnames`, the hosts, gateways (top level and in
/// HTTP/TLS/TCP matches) and destination hosts (routes and mirrors) of a VirtualService.
pub fn resolve_short_names(vs: &mut VirtualService, namespace: &str, domain: &str) {
    let host = |h: &mut String| *h = model::host::resolve_short_name(h, namespace, domain);
    let gateway = |g: &mut String| *g = resolve_gateway_name(g, namespace);
    vs.hosts.iter_mut().for_each(host);
    vs.gateways.iter_mut().for_each(gateway);
    for http in &mut vs.http {
        http.match_
            .iter_mut()
            .flat_map(|m| m.gateways.iter_mut())
            .for_each(gateway);
        http.route.iter_mut().for_each(|r| host(&mut r.destination.host));
        if let Some(m) = &mut http.mirror {
            host(&mut m.host);
        }
        http.mirrors.iter_mut().for_each(|m| host(&mut m.destination.host));
    }
    for tls in &mut vs.tls {
        tls.match_
            .iter_mut()
            .flat_map(|m| m.gateways.iter_mut())
            .for_each(gateway);
        tls.route.iter_mut().for_each(|r| host(&mut r.destination.host));
    }
    for tcp in &mut vs.tcp {
        tcp.match_
            .iter_mut()
            .flat_map(|m| m.gateways.iter_mut())
            .for_each(gateway);
        tcp.route.iter_mut().for_each(|r| host(&mut r.destination.host));
    }
}

type GatewayKey = (String, String);

/// VirtualServices by gateway (`namespace/name` or `mesh`), each list in creation order.
#[derive(Debug, Default)]
pub struct VirtualServiceIndex {
    public_by_gateway: HashMap<String, Vec<Arc<Config>>>,
    /// (VS namespace, gateway) for VSs visible in their own namespace only.
    private_by_namespace_and_gateway: HashMap<GatewayKey, Vec<Arc<Config>>>,
    /// (client namespace, gateway) for VSs exported to named namespaces.
    exported_to_namespace_by_gateway: HashMap<GatewayKey, Vec<Arc<Config>>>,
    /// VirtualServices without hosts: delegates, reachable only through a root's `delegate`.
    delegates: HashMap<DelegateName, Arc<Config>>,
    /// Root VirtualService → the delegates it names (Istio's `virtualServiceIndex.delegates`).
    delegates_by_root: HashMap<ConfigKey, Vec<ConfigKey>>,
}

impl VirtualServiceIndex {
    pub fn new(configs: &[Arc<Config>], mesh: &MeshConfig, domain: &str) -> VirtualServiceIndex {
        let mut vses: Vec<Arc<Config>> = configs
            .iter()
            .filter_map(|c| match &c.spec {
                ConfigSpec::VirtualService(vs) => {
                    let mut vs = vs.clone();
                    resolve_short_names(&mut vs, &c.meta.namespace, domain);
                    Some(Arc::new(Config {
                        kind: c.kind,
                        meta: c.meta.clone(),
                        spec: ConfigSpec::VirtualService(vs),
                    }))
                }
                _ => None,
            })
            .collect();
        vses.sort_by(|a, b| crate::creation_order(a, b));
        let merged = merge_virtual_services_if_needed(vses, &mesh.default_virtual_service_export_to);
        let mut idx = VirtualServiceIndex {
            delegates: merged.delegates.into_iter().map(|(name, d)| (name, d.config)).collect(),
            delegates_by_root: merged.delegates_by_root,
            ..Default::default()
        };
        for cfg in merged.virtual_services {
            let ConfigSpec::VirtualService(vs) = &cfg.spec else {
                continue;
            };
            let ns = cfg.meta.namespace.clone();
            let gateways: Vec<String> = if vs.gateways.is_empty() {
                vec![MESH_GATEWAY.to_owned()]
            } else {
                vs.gateways.clone()
            };
            let export_to: &[String] = if vs.export_to.is_empty() {
                &mesh.default_virtual_service_export_to
            } else {
                &vs.export_to
            };
            let public = export_to.is_empty() || export_to.iter().any(|e| e == "*");
            if !public && export_to.iter().any(|e| e == "~") {
                continue;
            }
            let mut targets: Vec<&str> = export_to.iter().map(String::as_str).collect();
            targets.sort_unstable();
            targets.dedup();
            for gw in &gateways {
                if public {
                    idx.public_by_gateway.entry(gw.clone()).or_default().push(cfg.clone());
                    continue;
                }
                for target in &targets {
                    if *target == "." || *target == ns {
                        idx.private_by_namespace_and_gateway
                            .entry((ns.clone(), gw.clone()))
                            .or_default()
                            .push(cfg.clone());
                    } else {
                        idx.exported_to_namespace_by_gateway
                            .entry(((*target).to_owned(), gw.clone()))
                            .or_default()
                            .push(cfg.clone());
                    }
                }
            }
        }
        // "." and the own namespace name may both be listed: keep each VS once per bucket.
        for list in idx.private_by_namespace_and_gateway.values_mut() {
            list.dedup_by(|a, b| Arc::ptr_eq(a, b));
        }
        idx
    }

    /// Istio's `VirtualServicesForGateway`: the client namespace's private VSs, then VSs exported
    /// to it by name, then public ones; each group in creation order.
    pub fn for_gateway(&self, client_namespace: &str, gateway: &str) -> Vec<Arc<Config>> {
        let key = (client_namespace.to_owned(), gateway.to_owned());
        let mut out = Vec::new();
        for group in [
            self.private_by_namespace_and_gateway.get(&key),
            self.exported_to_namespace_by_gateway.get(&key),
            self.public_by_gateway.get(gateway),
        ]
        .into_iter()
        .flatten()
        {
            out.extend(group.iter().cloned());
        }
        out
    }

    /// A delegate VirtualService (one without hosts) by namespace and name.
    pub fn delegate(&self, namespace: &str, name: &str) -> Option<Arc<Config>> {
        self.delegates.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// The delegates a root VirtualService names, found or not (a delegate created later must
    /// still push the root); empty for any other VirtualService.
    pub fn delegates_of(&self, root: &ConfigKey) -> &[ConfigKey] {
        self.delegates_by_root.get(root).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_names_resolve_as_istio() {
        assert_eq!(resolve_gateway_name("gw", "bookinfo"), "bookinfo/gw");
        assert_eq!(resolve_gateway_name("./gw", "bookinfo"), "bookinfo/gw");
        assert_eq!(resolve_gateway_name("istio-system/gw", "bookinfo"), "istio-system/gw");
        assert_eq!(
            resolve_gateway_name("gw.istio-system.svc.cluster.local", "bookinfo"),
            "istio-system/gw"
        );
        assert_eq!(resolve_gateway_name("gw.istio-system", "bookinfo"), "istio-system/gw");
        assert_eq!(resolve_gateway_name("mesh", "bookinfo"), "mesh");
    }
}
