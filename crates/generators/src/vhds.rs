//! VHDS: route configurations delivered in two parts to proxies on delta xDS. The route
//! configuration itself (RDS) carries everything but its virtual hosts and points Envoy at VHDS
//! over ADS; each virtual host is then its own resource, named `<route configuration>/<virtual
//! host>`, so that a change to one host sends that host alone. Envoy merges them back into the
//! route configuration it routes by (and shows in `/config_dump`), exactly as if they were inline.
//!
//! Both parts are split from the one route configuration RDS would build, so a proxy routes the
//! same either way. Envoy keys the virtual hosts it got over VHDS by their own `name` and removes
//! them by resource name, so each host's `name` is its resource name. A configuration without
//! virtual hosts stays as it is: Envoy's VHDS subscription waits for a host of its configuration
//! before the listener is ready, and there would be none.

use std::sync::Arc;

use model::Proxy;
use push_index::PushContext;
use xds_api::Resource;
use xds_api::envoy::config::route::v3::{RouteConfiguration, Vhds};

use crate::generate::PushCache;

/// A route configuration split for VHDS: the configuration without its hosts, and the hosts.
pub(crate) struct Split {
    pub config: Resource,
    pub virtual_hosts: Vec<Resource>,
}

/// The VHDS resource name of the virtual host `host` of route configuration `config`.
fn resource_name(config: &str, host: &str) -> String {
    format!("{config}/{host}")
}

/// Splits `config` for VHDS (one without virtual hosts is left whole).
pub(crate) fn split(mut config: RouteConfiguration) -> Split {
    if config.virtual_hosts.is_empty() {
        return Split {
            config: Resource::new(config.name.clone(), &config),
            virtual_hosts: Vec::new(),
        };
    }
    let hosts = std::mem::take(&mut config.virtual_hosts);
    let virtual_hosts = crate::generate::packed(hosts, |mut host| {
        host.name = resource_name(&config.name, &host.name);
        Resource::new(host.name.clone(), &host)
    });
    config.vhds = Some(Vhds {
        config_source: Some(crate::lds::hcm::ads_config_source()),
    });
    Split {
        config: Resource::new(config.name.clone(), &config),
        virtual_hosts,
    }
}

/// RDS for a proxy on VHDS: each of `names` without its virtual hosts.
pub(crate) fn route_configs(push: &PushContext, cache: &PushCache, proxy: &Proxy, names: &[String]) -> Vec<Resource> {
    cache
        .split_routes(push, proxy, names)
        .iter()
        .map(|s| s.config.clone())
        .collect()
}

/// VHDS: the virtual hosts of the route configurations `names`, as resources.
pub(crate) fn virtual_hosts(push: &PushContext, cache: &PushCache, proxy: &Proxy, names: &[String]) -> Vec<Resource> {
    cache
        .split_routes(push, proxy, names)
        .iter()
        .flat_map(|s| s.virtual_hosts.iter().cloned())
        .collect()
}

/// The shared split of one route configuration.
pub(crate) type SharedSplit = Arc<Split>;

#[cfg(test)]
#[path = "vhds_tests.rs"]
mod tests;
