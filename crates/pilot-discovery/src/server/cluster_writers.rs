//! The cluster-wide writers and their leader election (Istio's `pilot/pkg/leaderelection` as
//! `NewServer` wires it): the webhook configuration patchers and the leader election identity
//! of this replica.

use prometheus_client::registry::Registry;

use crate::ca_server::MeshCaServer;
use crate::leader::Leadership;
use crate::settings::Settings;

/// Starts this replica's elections and what the leader of each does: the `istio-ca-root-cert`
/// ConfigMaps in every namespace (the namespace controller), and with the webhooks served
/// (`https` and a secure port) the webhook configuration patchers. The returned leaderships are
/// released on shutdown.
pub(super) fn start(
    client: &kube::Client,
    settings: &Settings,
    registry: &mut Registry,
    (secure, plaintext_ca): (&Option<crate::secure::SecureGrpc>, &Option<MeshCaServer>),
    mesh: &std::sync::Arc<model::MeshConfig>,
    https: bool,
) -> Vec<Leadership> {
    let patch_metrics = (
        crate::webhook::patch::PatchMetrics::register(registry),
        crate::webhook::patch::MutatingMetrics::register(registry),
    );
    let elections = elections(client, settings, crate::leader::LeaderMetrics::register(registry));
    let mut leaderships = Vec::new();
    // Every namespace gets the mesh root (Istio's `istio-ca-root-cert`).
    let root_pem = secure
        .as_ref()
        .map(crate::secure::SecureGrpc::root_pem)
        .or_else(|| plaintext_ca.as_ref().map(MeshCaServer::root_pem));
    if let Some(root_pem) = root_pem {
        let (client, mesh) = (client.clone(), mesh.clone());
        leaderships.push(elections.spawn(crate::leader::NAMESPACE_CONTROLLER, move || {
            crate::root_cert::publish(client.clone(), root_pem.clone(), mesh.clone())
        }));
    }
    if let (true, Some(secure)) = (https, secure) {
        leaderships.push(start_webhook_patchers(
            client,
            &elections,
            secure,
            &settings.pod_namespace,
            &patch_metrics,
        ));
    }
    leaderships
}

/// istiod's webhook configuration patchers, both following the serving certificate's CA bundle:
/// the validation controller, only while this replica holds its lock (a new leader proves the
/// webhook again before `Fail`), and (Istio's `INJECTION_WEBHOOK_CONFIG_NAME`, by default
/// `istio-sidecar-injector`, not empty) the injector's webhook cert patcher, in every replica as
/// istiod's ("No leader election - different istiod revisions will patch their own cert").
fn start_webhook_patchers(
    client: &kube::Client,
    elections: &crate::leader::Elections,
    secure: &crate::secure::SecureGrpc,
    namespace: &str,
    (validating, mutating): &(
        crate::webhook::patch::PatchMetrics,
        crate::webhook::patch::MutatingMetrics,
    ),
) -> crate::leader::Leadership {
    use crate::webhook::patch::{MutatingPatcher, ValidatingPatcher, run};
    let (c, revision, namespace, metrics, bundles) = (
        client.clone(),
        secure.revision(),
        namespace.to_owned(),
        validating.clone(),
        secure.bundles(),
    );
    let validation = elections.spawn(crate::leader::VALIDATION_CONTROLLER, move || {
        let patcher = ValidatingPatcher {
            client: c.clone(),
            revision: revision.clone(),
            namespace: namespace.clone(),
            metrics: metrics.clone(),
            ready_for_fail_close: Default::default(),
        };
        run(patcher, c.clone(), bundles.clone())
    });
    let injection_config =
        std::env::var("INJECTION_WEBHOOK_CONFIG_NAME").unwrap_or_else(|_| "istio-sidecar-injector".into());
    if injection_config.is_empty() {
        tracing::info!("INJECTION_WEBHOOK_CONFIG_NAME is empty: the injector's webhook configurations are not patched");
        return validation;
    }
    let injection = MutatingPatcher {
        revision: secure.revision(),
        metrics: mutating.clone(),
    };
    tokio::spawn(run(injection, client.clone(), secure.bundles()));
    validation
}

/// Leader election for this replica (`leader.rs`): `POD_NAME` in `POD_NAMESPACE`.
fn elections(
    client: &kube::Client,
    settings: &Settings,
    metrics: crate::leader::LeaderMetrics,
) -> crate::leader::Elections {
    let e = crate::leader::Elections {
        client: client.clone(),
        namespace: settings.pod_namespace.clone(),
        identity: crate::leader::identity(&settings.pod_name),
        revision: settings.revision.clone(),
        timing: settings.leader_lease,
        enabled: settings.enable_leader_election,
        metrics,
    };
    if e.enabled && settings.pod_name.is_empty() {
        tracing::warn!(
            identity = %e.identity,
            "POD_NAME is not set: leader election names this replica after its host, as istiod; \
             replicas that share a host name would all think they lead (set POD_NAME)"
        );
    }
    tracing::info!(
        identity = %e.identity,
        namespace = %e.namespace,
        enabled = e.enabled,
        lease_duration_secs = e.timing.duration_secs,
        revision = %e.revision,
        "leader election"
    );
    e
}
