//! The mesh config at start, as istiod's `initMeshConfiguration` (pilot/pkg/bootstrap/mesh.go):
//! the mounted file, else the `istio` ConfigMap (followed live, `mesh_configmap.rs`), else
//! Istio's defaults; and the same for the injector.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use model::MeshConfig;
use prometheus_client::metrics::counter::Counter;

use crate::mesh_configmap::LiveMesh;

/// Reads the mesh config file; Istio's defaults when the file does not exist.
pub fn load_mesh_config(path: &str) -> anyhow::Result<MeshConfig> {
    let p = Path::new(path);
    if path.is_empty() || !p.exists() {
        tracing::info!(path, "mesh config file not found, using Istio's defaults");
        return Ok(MeshConfig::default());
    }
    let text = std::fs::read_to_string(p).with_context(|| format!("reading mesh config {path}"))?;
    let value: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(&text).with_context(|| format!("parsing mesh config {path}"))?
    };
    MeshConfig::from_value(value).with_context(|| format!("mesh config {path}"))
}

/// The mesh config the process starts with, and where its changes come from.
pub(super) struct Mesh {
    pub(super) config: Arc<MeshConfig>,
    /// The `istio` ConfigMap's changes, when it is the source.
    pub(super) live: Option<tokio::sync::watch::Receiver<LiveMesh>>,
    /// The injector's mesh config.
    pub(super) injector: crate::injection::MeshSource,
    /// meshNetworks, and each valid change.
    pub(super) networks: tokio::sync::watch::Receiver<Arc<model::mesh_networks::MeshNetworks>>,
}

/// The mounted file (`--meshConfig`) when it exists; else, with a cluster, the `istio`
/// ConfigMap (`istio-<REVISION>`), followed; else Istio's defaults. The mesh networks likewise.
pub(super) async fn init(
    args: &crate::args::DiscoveryArgs,
    settings: &crate::settings::Settings,
    client: Option<&kube::Client>,
    changes_ignored: Counter,
) -> anyhow::Result<Mesh> {
    let (file, namespace) = (args.mesh_config.as_str(), settings.pod_namespace.as_str());
    let networks = networks(&args.networks_config, settings, client, changes_ignored.clone()).await?;
    let mesh_file = !file.is_empty() && Path::new(file).exists();
    let mut mesh = load_mesh_config(file)?;
    let mut live = None;
    if let (false, Some(client)) = (mesh_file, client) {
        let revision = settings.revision.clone();
        let yaml = match crate::mesh_configmap::load(client, namespace, &revision).await? {
            Some((from_cluster, text)) => {
                mesh = from_cluster;
                text
            }
            None => String::new(),
        };
        let started = Arc::new(mesh.clone());
        let (tx, rx) = tokio::sync::watch::channel(LiveMesh {
            mesh: started.clone(),
            yaml: yaml.into(),
        });
        live = Some(rx);
        tokio::spawn(crate::mesh_configmap::follow(
            client.clone(),
            namespace.to_owned(),
            revision,
            started,
            tx,
            changes_ignored,
        ));
    }
    // The injector's mesh: the same, or the mounted file's text (read at start).
    let injector = match &live {
        Some(rx) => crate::injection::MeshSource::Live(rx.clone()),
        None if mesh_file => crate::injection::MeshSource::Fixed(
            std::fs::read_to_string(file).with_context(|| format!("reading mesh config {file}"))?,
        ),
        None => crate::injection::MeshSource::Fixed(String::new()),
    };
    Ok(Mesh {
        config: Arc::new(mesh),
        live,
        injector,
        networks,
    })
}

/// The mesh networks: the `--networksConfig` file, else the `istio` ConfigMap's `meshNetworks`
/// (followed), else none (`mesh_networks.rs`).
async fn networks(
    file: &str,
    settings: &crate::settings::Settings,
    client: Option<&kube::Client>,
    changes_ignored: Counter,
) -> anyhow::Result<tokio::sync::watch::Receiver<Arc<model::mesh_networks::MeshNetworks>>> {
    let source = crate::mesh_networks::Source {
        file,
        namespace: &settings.pod_namespace,
        revision: &settings.revision,
        resolve_hostname_gateways: settings.resolve_hostname_gateways,
    };
    crate::mesh_networks::init(source, client, changes_ignored).await
}

/// The next mesh config the `istio` ConfigMap's follower sends; never, without one.
pub(super) async fn next_mesh(live: &mut Option<tokio::sync::watch::Receiver<LiveMesh>>) -> Arc<model::MeshConfig> {
    if let Some(rx) = live {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().mesh.clone();
        }
        *live = None;
    }
    std::future::pending().await
}
