//! Gateways of a push and which proxies they select, as Istio's `gatewayIndex` with
//! `PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false`: a gateway of any namespace selects any proxy whose
//! labels match its selector; an empty selector selects every gateway proxy.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use model::{Config, ConfigSpec};

#[derive(Debug, Default)]
pub struct GatewayIndex {
    /// Every Gateway, in creation order.
    all: Vec<Arc<Config>>,
    /// `namespace/name` → Gateway.
    by_name: HashMap<String, Arc<Config>>,
}

impl GatewayIndex {
    pub fn new(configs: &[Arc<Config>]) -> GatewayIndex {
        let mut all: Vec<Arc<Config>> = configs
            .iter()
            .filter(|c| matches!(c.spec, ConfigSpec::Gateway(_)))
            .cloned()
            .collect();
        all.sort_by(|a, b| crate::creation_order(a, b));
        let by_name = all
            .iter()
            .map(|c| (format!("{}/{}", c.meta.namespace, c.meta.name), c.clone()))
            .collect();
        GatewayIndex { all, by_name }
    }

    /// Gateways whose selector is a subset of `labels`, in creation order.
    pub fn selecting(&self, labels: &BTreeMap<String, String>) -> Vec<Arc<Config>> {
        self.all
            .iter()
            .filter(|c| match &c.spec {
                ConfigSpec::Gateway(gw) => gw.selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
                _ => false,
            })
            .cloned()
            .collect()
    }

    /// A gateway by `namespace/name`.
    pub fn get(&self, name: &str) -> Option<Arc<Config>> {
        self.by_name.get(name).cloned()
    }
}
