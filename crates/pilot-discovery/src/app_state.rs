//! What the debug and monitoring handlers read (`http.rs`, `configz.rs`, `registryz.rs`): the
//! xDS server, the environment, the metrics registry and the config sources' state. Below the
//! handlers, so that they import it and not each other.

use std::sync::Arc;

use config_sources::StoreSnapshot;
use environment::Environment;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use xds_server::DiscoveryServer;

/// The state every debug and monitoring handler shares.
#[derive(Clone)]
pub struct AppState {
    pub server: Arc<DiscoveryServer<Environment>>,
    pub environment: Arc<Environment>,
    pub registry: Arc<Registry>,
    /// `process_*`, read at each scrape.
    pub process: monitoring::process::ProcessMetrics,
    pub store: watch::Receiver<StoreSnapshot>,
    /// meshNetworks, as last read (`mesh_networks.rs`).
    pub networks: watch::Receiver<Arc<model::mesh_networks::MeshNetworks>>,
    /// The remote clusters (`/debug/clusterz`); `None` without a Kubernetes registry.
    pub clusters: Option<Arc<crate::multicluster::Multicluster>>,
    /// ENABLE_DEBUG_ENDPOINT_AUTH.
    pub debug_auth: bool,
    /// The large debug dumps (`/debug/configz`, ...) are built one at a time: ten concurrent
    /// dumps of a large config must not hold ten copies of it.
    pub dumps: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// One permit: see `dumps`.
    pub fn dump_permits() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(1))
    }
}
