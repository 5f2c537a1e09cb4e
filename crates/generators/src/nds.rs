//! NDS: the name table of a proxy's DNS proxy (Istio's `BuildNameTable`): every host the proxy
//! sees (its Sidecar scope, `exportTo`) with the addresses it can be reached at — the service's
//! VIPs, the VIPs allocated to a ServiceEntry without addresses for a proxy that captures DNS,
//! else, for headless services (resolution NONE / Kubernetes headless), the endpoints' IPs.
//! Kubernetes services carry their name and namespace, from which the agent answers the short
//! names (`reviews`, `reviews.default`). Hosts with no address are left out.

use std::collections::BTreeMap;
use std::net::IpAddr;

use istio_api::nds::NameTable;
use istio_api::nds::name_table::NameInfo;
use model::Proxy;
use model::service::Resolution;
use push_index::PushContext;
use xds_api::Resource;

const KUBERNETES: &str = "Kubernetes";
const CLUSTERSET_SUFFIX: &str = ".clusterset.local";

/// The proxy's name table.
pub(crate) fn name_table(push: &PushContext, proxy: &Proxy) -> NameTable {
    let mut table: BTreeMap<String, NameInfo> = BTreeMap::new();
    let network = proxy.metadata.raw.get("NETWORK").and_then(|v| v.as_str()).unwrap_or("");
    for svc in push.services_for_proxy(proxy) {
        let mut ips: Vec<String> = push
            .service_addresses(proxy, &svc)
            .into_iter()
            .filter(|a| a.parse::<IpAddr>().is_ok_and(|ip| !ip.is_unspecified()))
            .collect();
        if ips.is_empty() && svc.resolution == Resolution::Passthrough && !svc.ports.is_empty() {
            // headless: the endpoints' addresses (of the proxy's network), once each
            for e in push.endpoints(&svc.hostname, svc.namespace()).iter() {
                let same_network = e.network.is_empty() || network.is_empty() || e.network == network;
                if same_network && e.address.parse::<IpAddr>().is_ok() && !ips.contains(&e.address) {
                    ips.push(e.address.clone());
                }
            }
        }
        if ips.is_empty() {
            continue;
        }
        let registry = svc.attributes.service_registry.clone();
        let kube_names = registry == KUBERNETES && !svc.hostname.ends_with(CLUSTERSET_SUFFIX);
        let info = NameInfo {
            ips,
            shortname: if kube_names {
                svc.attributes.name.clone()
            } else {
                String::new()
            },
            namespace: if kube_names {
                svc.namespace().to_owned()
            } else {
                String::new()
            },
            registry,
            ..Default::default()
        };
        match table.get_mut(&svc.hostname) {
            None => {
                table.insert(svc.hostname.clone(), info);
            }
            // a Kubernetes service wins over other registries' services of the same host; the
            // others' addresses add up
            Some(existing) if existing.registry != KUBERNETES => {
                if info.registry == KUBERNETES {
                    *existing = info;
                } else {
                    existing.ips.extend(info.ips);
                }
            }
            Some(_) => {}
        }
    }
    NameTable { table }
}

/// The NDS response: one unnamed `NameTable` resource.
pub(crate) fn name_tables(push: &PushContext, proxy: &Proxy) -> Vec<Resource> {
    vec![Resource::new("", &name_table(push, proxy))]
}

#[cfg(test)]
#[path = "nds_tests.rs"]
mod tests;
