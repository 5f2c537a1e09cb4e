//! pilot-discovery as istiod's validating webhook in a cluster (the fake API server, which runs
//! validating admission as the real one does, and `kubectl`): the ValidatingWebhookConfiguration
//! of Istio's rendered default install is applied as written; pilot-discovery patches its
//! caBundle with the mesh root and, once a dry run of an invalid Gateway comes back denied, its
//! failurePolicy to Fail; `kubectl apply` of an invalid Istio object of the revision is then
//! denied with the reason, a valid one is created, and a configuration someone overwrites is
//! patched again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::{FakeApiServer, kubectl};
use test_support::ports::free_port;

/// The ValidatingWebhookConfiguration of Istio's rendered default profile.
fn istio_validator() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("Istio's rendered install {} is needed ({e}): ../shared", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("a ValidatingWebhookConfiguration in the rendered install")
}

fn destination_rule(name: &str, lb: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {name}\n  namespace: default\n  \
         labels: {{istio.io/rev: default}}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {{simple: {lb}}}\n"
    )
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn failure_policy(kubeconfig: &Path) -> String {
    kubectl(
        kubeconfig,
        &[
            "get",
            "validatingwebhookconfiguration",
            "istio-validator-istio-system",
            "-o",
            "jsonpath={.webhooks[0].failurePolicy} {.webhooks[0].clientConfig.caBundle}",
        ],
    )
    .await
    .unwrap_or_default()
}

#[tokio::test]
async fn kubectl_apply_of_invalid_istio_config_is_denied_by_pilot_discovery() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    for ns in ["istio-system", "default"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    }
    api.apply(istio_validator())?;
    let work = tempfile::tempdir()?;
    let config = work.path().join("config");
    std::fs::create_dir(&config)?;
    let kubeconfig = work.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let https = free_port();
    api.route_service("istiod", "istio-system", ([127, 0, 0, 1], https).into());
    let discovery = Discovery::start(
        &config,
        DiscoveryOptions {
            args: vec![
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--secureGrpcAddr".into(),
                format!("127.0.0.1:{}", free_port()),
                "--httpsAddr".into(),
                format!("127.0.0.1:{https}"),
            ],
            env: vec![("ROOT_CA_DIR".into(), work.path().join("cacerts").display().to_string())],
            ..Default::default()
        },
    )
    .await?;

    // Patched: the mesh root as caBundle, and Fail once the dry run was denied.
    eventually("failurePolicy Fail with a caBundle", || async {
        let got = failure_policy(&kubeconfig).await;
        got.starts_with("Fail ") && got.len() > 100
    })
    .await;

    let file = |name: &str, text: String| -> PathBuf {
        let p = work.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let bad = file("bad.yaml", destination_rule("reviews-bad", "SOMETIMES"));
    let e = kubectl(&kubeconfig, &["apply", "-f", bad.to_str().unwrap()])
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("admission webhook \"rev.validation.istio.io\" denied the request: configuration is invalid")
            || e.contains(
                "admission webhook \"rev.validation.istio.io\" denied the request: error decoding configuration"
            ),
        "{e}"
    );
    assert!(e.contains("SOMETIMES"), "the denial names what is wrong: {e}");
    let good = file("good.yaml", destination_rule("reviews", "ROUND_ROBIN"));
    kubectl(&kubeconfig, &["apply", "-f", good.to_str().unwrap()]).await?;
    let got = kubectl(
        &kubeconfig,
        &["get", "destinationrule", "reviews", "-n", "default", "-o", "name"],
    )
    .await?;
    assert_eq!(got.trim(), "destinationrule.networking.istio.io/reviews");

    // Overwritten (as a Helm upgrade does): patched again.
    let mut reset = istio_validator();
    reset["metadata"]["resourceVersion"] = Value::Null;
    let reset_file = file("reset.json", reset.to_string());
    kubectl(&kubeconfig, &["replace", "-f", reset_file.to_str().unwrap()]).await?;
    eventually("the overwritten configuration patched again", || async {
        failure_policy(&kubeconfig).await.starts_with("Fail ")
    })
    .await;

    let (_, text) = discovery.get("/metrics", true).await?;
    let updates = test_support::discovery::sum_metric(&text, "galley_validation_config_updates");
    assert!(
        updates >= 2.0,
        "galley_validation_config_updates {updates}:\n{}",
        text.lines()
            .filter(|l| l.contains("galley"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let failed = discovery.metric("galley_validation_failed").await?;
    assert!(failed >= 1.0, "galley_validation_failed {failed}");
    Ok(())
}
