use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::*;
use crate::accept::{SetupMetrics, https_acceptor};
use webhooks::admission::{MAX_REQUEST_BODY_BYTES, serve as serve_review};

fn review(api_version: &str, object: Value) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2891-916f-4ed6-b7cd-27bff1815a8c",
            "kind": {"group": "networking.istio.io", "version": "v1", "kind": "VirtualService"},
            "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
            "namespace": "default",
            "name": "reviews",
            "operation": "CREATE",
            "object": object,
        }
    })
}

fn valid_vs() -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]},
    })
}

fn answer(body: &[u8]) -> Value {
    let out = serve_review(Some("application/json"), body, |r| validation::validate(r).response).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn the_answer_is_in_the_reviews_own_version_with_its_uid() {
    for version in ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] {
        let a = answer(&serde_json::to_vec(&review(version, valid_vs())).unwrap());
        assert_eq!(a["apiVersion"], version);
        assert_eq!(a["kind"], "AdmissionReview");
        assert_eq!(a["response"]["uid"], "7f0b2891-916f-4ed6-b7cd-27bff1815a8c");
        assert_eq!(a["response"]["allowed"], true);
        assert!(a.get("request").is_none());
    }
}

#[test]
fn bad_requests_get_istios_http_errors_and_undecodable_reviews_are_denied() {
    let body = serde_json::to_vec(&review("admission.k8s.io/v1", valid_vs())).unwrap();
    let deny_all = |_: &_| panic!("not admitted");
    let e = serve_review(Some("application/json"), b"", deny_all).unwrap_err();
    assert_eq!((e.status, e.message.as_str()), (400, "no body found"));
    let e = serve_review(Some("text/plain"), &body, deny_all).unwrap_err();
    assert_eq!(e.status, 415);
    let e = serve_review(
        Some("application/json"),
        &vec![b' '; MAX_REQUEST_BODY_BYTES + 1],
        deny_all,
    )
    .unwrap_err();
    assert_eq!(e.status, 413);
    for bad in [&b"{not json"[..], br#"{"apiVersion":"v1","kind":"Pod"}"#, br#"[1]"#] {
        let a = answer(bad);
        assert_eq!(a["response"]["allowed"], false, "{a}");
        assert!(
            a["response"].get("result").is_none()
                && a["response"]["status"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("could not decode body: "),
            "{a}"
        );
    }
}

/// A serving certificate for `localhost` and the root that signed it.
fn serving_cert() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (leaf.pem(), key.serialize_pem(), ca.pem())
}

async fn start(timeout: Duration) -> (SocketAddr, String, Registry) {
    let (chain, key, root) = serving_cert();
    let mut registry = Registry::default();
    let metrics = PipelineMetrics::register(&mut registry);
    let setup = Setup {
        timeout,
        metrics: SetupMetrics::register(&mut registry),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        https_acceptor(crate::serving_cert::Resolver::new(
            tokio::sync::watch::channel(std::sync::Arc::new(
                crate::serving_cert::KeyCertBundle::new(chain, key, root.clone()).unwrap(),
            ))
            .1,
        ))
        .unwrap(),
        setup,
        router(metrics, None),
    ));
    (addr, root, registry)
}

#[tokio::test]
async fn the_webhook_answers_over_https_and_closes_idle_connections() {
    let (addr, root, registry) = start(Duration::from_millis(300)).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(root.as_bytes()).unwrap())
        .build()
        .unwrap();
    let mut bad = valid_vs();
    bad["spec"]["http"][0]["route"][0]["weight"] = json!(-1);
    for (object, allowed) in [(valid_vs(), true), (bad, false)] {
        let a: Value = client
            .post(format!("https://localhost:{}/validate", addr.port()))
            .header("content-type", "application/json")
            .json(&review("admission.k8s.io/v1", object))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(a["response"]["allowed"], allowed, "{a}");
    }
    let status = client
        .post(format!("https://localhost:{}/validate/", addr.port()))
        .header("content-type", "text/yaml")
        .body("x")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 415);
    // The connection that never began TLS was closed.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut idle, &mut rest),
    )
    .await;
    assert!(closed.is_ok(), "an idle connection to the webhook port stays open");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "galley_validation_passed_total{resource=\"virtualservices\"} 1",
        "galley_validation_failed_total{resource=\"virtualservices\",reason=\"invalid_resource\"} 1",
        "galley_validation_http_error_total{status=\"415\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(
        text.contains("pilot_grpc_connection_setup_failures_total{port="),
        "{text}"
    );
}
