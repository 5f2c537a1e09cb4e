//! The injector's webhook cert patcher against the fake API server, with the
//! MutatingWebhookConfiguration of Istio's rendered default install.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use test_support::kube_api::FakeApiServer;

use super::*;
use crate::serving_cert::KeyCertBundle;

fn istio_injector() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("Istio's rendered install {} is needed ({e}): ../shared", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .expect("a MutatingWebhookConfiguration in the rendered install")
}

fn bundle(dir: &std::path::Path) -> (KeyCertBundle, String) {
    let ca = ca::CertificateAuthority::load_or_create(dir, "cluster.local").unwrap();
    let issued = ca
        .issue_server_cert(&["istiod.istio-system.svc".to_owned()], &[], Duration::from_secs(3600))
        .unwrap();
    let root = ca.root_cert_pem().to_owned();
    (
        KeyCertBundle::new(issued.cert_chain_pem, issued.key_pem, root.clone()).unwrap(),
        root,
    )
}

async fn ca_bundles(api: &Api<MutatingWebhookConfiguration>, name: &str) -> Vec<(String, Option<String>)> {
    let c = api.get(name).await.unwrap();
    c.webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| {
            let ca = w
                .client_config
                .ca_bundle
                .map(|b| String::from_utf8_lossy(&b.0).into_owned());
            (w.name, ca)
        })
        .collect()
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_injectors_configuration_of_the_revision_carries_the_ca_bundle_and_follows_it() {
    let server = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = crate::kubernetes::fake_api_client(&server, dir.path()).await;
    server.apply(istio_injector()).unwrap();
    // Another revision's, a configuration that is not Istio's, one without the injector's webhook.
    let mut canary = istio_injector();
    canary["metadata"]["name"] = json!("istio-sidecar-injector-canary");
    canary["metadata"]["labels"]["istio.io/rev"] = json!("canary");
    server.apply(canary).unwrap();
    let mut foreign = istio_injector();
    foreign["metadata"]["name"] = json!("someone-elses");
    foreign["metadata"]["labels"] = json!({});
    server.apply(foreign).unwrap();
    let mut other = istio_injector();
    other["metadata"]["name"] = json!("istio-other-hooks");
    for w in other["webhooks"].as_array_mut().unwrap() {
        w["name"] = json!("other.example.com");
    }
    server.apply(other).unwrap();

    let ca_dir = tempfile::tempdir().unwrap();
    let (first, root) = bundle(ca_dir.path());
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(first));
    let mut registry = Registry::default();
    let metrics = MutatingMetrics::register(&mut registry);
    let patcher = MutatingPatcher {
        revision: "default".into(),
        metrics: metrics.clone(),
    };
    tokio::spawn(super::super::run(patcher, client.clone(), rx));

    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    eventually("the default revision's webhooks patched", || async {
        let got = ca_bundles(&api, "istio-sidecar-injector").await;
        got.len() == 4 && got.iter().all(|(_, ca)| ca.as_deref() == Some(root.as_str()))
    })
    .await;
    for name in ["istio-sidecar-injector-canary", "someone-elses", "istio-other-hooks"] {
        let got = ca_bundles(&api, name).await;
        assert!(
            got.iter().all(|(_, ca)| ca.is_none()),
            "{name} is not ours to patch: {got:?}"
        );
    }

    // Overwritten (a Helm upgrade): patched again.
    let mut reset = istio_injector();
    reset["metadata"]["resourceVersion"] = Value::Null;
    server.apply(reset).unwrap();
    eventually("the overwritten configuration patched again", || async {
        let got = ca_bundles(&api, "istio-sidecar-injector").await;
        got.iter().all(|(_, ca)| ca.as_deref() == Some(root.as_str()))
    })
    .await;

    // A new CA bundle: followed.
    let ca_dir2 = tempfile::tempdir().unwrap();
    let (second, root2) = bundle(ca_dir2.path());
    tx.send_replace(Arc::new(second));
    eventually("the new CA bundle patched", || async {
        let got = ca_bundles(&api, "istio-sidecar-injector").await;
        got.iter().all(|(_, ca)| ca.as_deref() == Some(root2.as_str()))
    })
    .await;

    // As /metrics renders it: prometheus-client takes the `_total` off the registered name.
    let text = monitoring::render(&registry).unwrap();
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        value("webhook_patch_attempts{name=\"sidecar-injector.istio.io\"}") >= 3.0,
        "{text}"
    );
    assert!(
        value("webhook_patch_failures{name=\"istio-sidecar-injector-canary\",reason=\"wrong_revision\"}") >= 1.0,
        "{text}"
    );
    assert!(
        value("webhook_patch_failures{name=\"istio-other-hooks\",reason=\"webhook_entry_not_found\"}") >= 1.0,
        "{text}"
    );
    assert!(!text.contains("name=\"someone-elses\""), "{text}");
}
