//! The Kubernetes registry in pilot-discovery: connected at start when `--registries` names
//! Kubernetes and a cluster is configured (`--kubeconfig`, `KUBECONFIG`, in-cluster), synced
//! before the first push, then followed: each change goes to the environment and, as a push
//! request, to the xDS server.

use std::sync::Arc;
use std::time::Duration;

use environment::Environment;
use kclient::{WatchMetrics, client_config, connect};
use kube::Client;
use kube_registry::watch::{KINDS, Watchers, watch_all};
use kube_registry::{Context, KubeRegistry};
use model::MeshConfig;
use registry::RegistryDiff;
use tokio::sync::mpsc;
use xds_server::DiscoveryServer;

use crate::args::DiscoveryArgs;

/// How long the API server may take to answer at start-up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Kubernetes {
    pub registry: Arc<KubeRegistry>,
    diffs: mpsc::UnboundedReceiver<RegistryDiff>,
    /// The config cluster's watchers run as long as the process.
    watchers: Watchers,
}

/// A client for the configured cluster (`--kubeconfig`, `KUBECONFIG`, in-cluster), checked by
/// asking the API server its version; `None` when no cluster is configured. An unreachable API
/// server is an error naming it.
pub async fn client(args: &DiscoveryArgs) -> anyhow::Result<Option<Client>> {
    let Some(cfg) = client_config(&args.kubeconfig, |k| std::env::var(k).ok()).await? else {
        tracing::info!("no --kubeconfig, KUBECONFIG or in-cluster config: no Kubernetes cluster");
        return Ok(None);
    };
    let address = cfg.cluster_url.to_string();
    let client = connect(cfg, CONNECT_TIMEOUT).await?;
    tracing::info!(api_server = %address, "connected to the Kubernetes API server");
    Ok(Some(client))
}

/// Starts the registry's watchers and waits for their initial lists.
pub async fn start(
    client: Client,
    (args, system_namespace): (&DiscoveryArgs, &str),
    mesh: &MeshConfig,
    metrics: WatchMetrics,
) -> anyhow::Result<Kubernetes> {
    let ctx = context(args, mesh, system_namespace);
    let registry = Arc::new(KubeRegistry::new(ctx).counting_problems(metrics.object_errors.clone()));
    let _ = PROBLEMS.set(registry.problems());
    let (tx, diffs) = mpsc::unbounded_channel();
    let mut watchers = watch_all(client, registry.clone(), tx, metrics);
    let t0 = std::time::Instant::now();
    loop {
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            watchers.synced.wait_for(|s| s.len() == KINDS.len()),
        )
        .await
        .map(|r| r.is_ok());
        match waited {
            Ok(true) => break,
            Ok(false) => anyhow::bail!("Kubernetes watchers stopped before their initial lists"),
            Err(_) => {
                let pending = pending(&watchers.synced.borrow());
                tracing::info!(
                    synced = KINDS.len() - pending.len(),
                    of = KINDS.len(),
                    "waiting for the initial lists of the Kubernetes API server: {}",
                    pending.join(", ")
                );
            }
        }
    }
    let snapshot = registry.snapshot();
    tracing::info!(
        cluster_id = %args.cluster_id,
        services = snapshot.services.len(),
        services_with_endpoints = snapshot.endpoints.len(),
        seconds = t0.elapsed().as_secs_f64(),
        "Kubernetes registry synced"
    );
    Ok(Kubernetes {
        registry,
        diffs,
        watchers,
    })
}

/// The kinds of [`KINDS`] not in `synced`.
fn pending(synced: &std::collections::BTreeSet<&'static str>) -> Vec<&'static str> {
    KINDS.iter().copied().filter(|k| !synced.contains(k)).collect()
}

/// The cluster registry's problems (objects that do not decode or convert), for
/// `/debug/config_errors`; set when the registry starts (there is one per process).
static PROBLEMS: std::sync::OnceLock<Arc<kube_registry::problems::Problems>> = std::sync::OnceLock::new();

/// What [`PROBLEMS`] lists now (nothing without a cluster registry).
pub fn problems() -> Vec<config_sources::SourceErrorEntry> {
    PROBLEMS.get().map(|p| p.entries()).unwrap_or_default()
}

/// The conversion context of this cluster's objects (watched, or manifests in --configDir).
pub fn context(args: &DiscoveryArgs, mesh: &MeshConfig, system_namespace: &str) -> Context {
    Context {
        domain: args.domain.clone(),
        trust_domain: mesh.trust_domain.clone(),
        cluster_id: args.cluster_id.clone(),
        system_namespace: system_namespace.to_owned(),
        discovery_selectors: mesh.discovery_selectors.clone(),
    }
}

impl Kubernetes {
    /// Hands what the initial lists found to the environment (before the first push).
    pub fn apply_initial(&mut self, env: &Environment) {
        while let Ok(diff) = self.diffs.try_recv() {
            let _ = env.services_changed(diff);
        }
    }

    /// From now on, each change reaches the environment and the xDS server.
    pub fn follow(mut self, env: Arc<Environment>, server: Arc<DiscoveryServer<Environment>>) {
        tokio::spawn(async move {
            let _watchers = self.watchers;
            while let Some(diff) = self.diffs.recv().await {
                crate::push::dispatch(&server, env.services_changed(diff));
            }
        });
    }
}

/// A client of a fake API server (tests), through a kubeconfig written in `dir`.
#[cfg(test)]
pub(crate) async fn fake_api_client(
    api: &test_support::kube_api::FakeApiServer,
    dir: &std::path::Path,
) -> kube::Client {
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap_or_else(|e| panic!("kubeconfig: {e}")),
        &Default::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("client: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    #[test]
    fn the_start_up_line_names_the_kinds_not_yet_listed() {
        let synced = ["Service", "Pod"].into_iter().collect();
        assert_eq!(super::pending(&synced), ["EndpointSlice", "Node", "Namespace"]);
    }

    /// `(api group, resource, verb)` of every rule of the README's ClusterRole.
    fn readme_cluster_role() -> BTreeSet<(String, String, String)> {
        readme_role("ClusterRole")
    }

    /// `(api group, resource, verb)` of every rule of the README's `kind` (ClusterRole, Role).
    fn readme_role(kind: &str) -> BTreeSet<(String, String, String)> {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
            .unwrap_or_else(|e| panic!("README.md: {e}"));
        let block = readme
            .split("```yaml\n")
            .filter_map(|b| b.split("```").next())
            .find(|b| b.contains(&format!("kind: {kind}\n")))
            .unwrap_or_else(|| panic!("no {kind} in README.md"));
        let role: Value = serde_saphyr::from_str(block).unwrap_or_else(|e| panic!("README's {kind}: {e}"));
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let mut out = BTreeSet::new();
        for rule in role["rules"].as_array().into_iter().flatten() {
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        out.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
        out
    }

    /// The README's ClusterRole lets pilot-discovery do what it does against a cluster: watch
    /// the registry's kinds and every config kind, keep the root certificate ConfigMaps, review
    /// tokens.
    #[test]
    fn the_readme_cluster_role_covers_every_resource_used() {
        let role = readme_cluster_role();
        let mut needed: Vec<(&str, &str, &[&str])> = vec![
            // the registry (kube_registry::watch::KINDS)
            ("", "services", &["list", "watch"]),
            ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
            ("", "pods", &["list", "watch"]),
            ("", "nodes", &["list", "watch"]),
            ("", "namespaces", &["list", "watch"]),
            // root_cert.rs, and the leader election locks (leader/config_map_lock.rs)
            ("", "configmaps", &["get", "list", "watch", "create", "update"]),
            // the default revision for the prioritized election (leader/elector.rs)
            (
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                &["get"],
            ),
            // token_review.rs
            ("authentication.k8s.io", "tokenreviews", &["create"]),
        ];
        assert_eq!(
            kube_registry::watch::KINDS.len(),
            5,
            "a registry kind was added: list it here"
        );
        for r in config_sources::crdclient::CONFIG_KINDS {
            needed.push((r.group, r.plural, &["get", "list", "watch"]));
        }
        for (group, resource, verbs) in needed {
            for verb in verbs {
                assert!(
                    role.contains(&(group.to_owned(), resource.to_owned(), (*verb).to_owned())),
                    "the README's ClusterRole does not allow {verb} of {resource} in group {group:?}"
                );
            }
        }
    }
}
