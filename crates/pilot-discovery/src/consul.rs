//! The Consul registry in pilot-discovery (`--registries Consul`, `--consulserverURL`, Istio
//! 1.7's flags): started before the first push, waited for a little (a Consul that does not
//! answer is reported and retried in the background; its services arrive when it does), then
//! followed: each change goes to the environment and, as a push request, to the xDS server.

use std::sync::Arc;
use std::time::Duration;

use consul_registry::{Client, ClientOptions, ConsulMetrics, ConsulRegistry, WatchOptions};
use environment::Environment;
use model::MeshConfig;
use registry::{RegistryDiff, ServiceRegistry};
use tokio::sync::mpsc;
use xds_server::DiscoveryServer;

use crate::args::DiscoveryArgs;

/// Where Consul's Go client looks without an address, as Istio 1.7 did with an empty
/// `--consulserverURL`.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:8500";

/// How long start-up waits for the catalog's first read before serving without it.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Consul {
    pub registry: Arc<ConsulRegistry>,
    diffs: mpsc::UnboundedReceiver<RegistryDiff>,
}

/// Whether `--registries` names Consul.
pub fn enabled(args: &DiscoveryArgs) -> bool {
    args.registries
        .iter()
        .any(|r| r == consul_registry::SERVICE_REGISTRY_CONSUL)
}

/// Starts following the catalog at `--consulserverURL` and waits up to [`SYNC_TIMEOUT`] for
/// its first read. An address that cannot be used is an error naming it.
pub async fn start(
    args: &DiscoveryArgs,
    mesh: &MeshConfig,
    metrics: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Consul> {
    let address = match args.consul_server_url.trim() {
        "" => DEFAULT_ADDRESS,
        a => a,
    };
    let client = Client::new(address, ClientOptions::default())?;
    let base = client.base().to_owned();
    let metrics = ConsulMetrics::register(metrics);
    let registry = Arc::new(ConsulRegistry::new(&mesh.trust_domain));
    let (tx, diffs) = mpsc::unbounded_channel();
    let (_task, mut synced) = consul_registry::spawn(registry.clone(), client, WatchOptions::default(), metrics, tx);
    let t0 = std::time::Instant::now();
    match tokio::time::timeout(SYNC_TIMEOUT, synced.wait_for(|s| *s)).await {
        Ok(Ok(_)) => {
            let snapshot = registry.snapshot();
            tracing::info!(
                consul = base,
                services = snapshot.services.len(),
                seconds = t0.elapsed().as_secs_f64(),
                "Consul registry synced"
            );
        }
        _ => tracing::warn!(
            consul = base,
            "Consul catalog not read within {SYNC_TIMEOUT:?}: serving without its services until it answers (see pilot_consul_errors)"
        ),
    }
    Ok(Consul { registry, diffs })
}

impl Consul {
    /// Hands what the first reads found to the environment (before the first push).
    pub fn apply_initial(&mut self, env: &Environment) {
        while let Ok(diff) = self.diffs.try_recv() {
            let _ = env.services_changed(diff);
        }
    }

    /// From now on, each change reaches the environment and the xDS server.
    pub fn follow(mut self, env: Arc<Environment>, server: Arc<DiscoveryServer<Environment>>) {
        tokio::spawn(async move {
            while let Some(diff) = self.diffs.recv().await {
                crate::push::dispatch(&server, env.services_changed(diff));
            }
        });
    }
}
