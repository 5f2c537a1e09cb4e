//! From the environment's answer to a change to the xDS server (Istio's `ConfigUpdate` calls
//! after `Environment` decided): shared by the config task, the Kubernetes registry's follower and
//! the JWKS resolver, below all three.

use environment::Environment;
use xds_server::DiscoveryServer;

/// Hands what a change calls for to the xDS server: the push to the debouncer, the proxies whose
/// workload changed to `proxy_update`.
pub(crate) fn dispatch(server: &DiscoveryServer<Environment>, update: environment::Update) {
    if let Some(req) = update.push {
        server.config_update(req);
    }
    if !update.proxies.is_empty() {
        server.proxy_update(&update.proxies);
    }
}
