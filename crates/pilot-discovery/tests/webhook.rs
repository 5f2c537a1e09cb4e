//! The real `pilot-discovery discovery` binary's validating webhook on `--httpsAddr` (istiod's
//! 15017), called by `curl` as the API server would: HTTPS verified with the mesh root for
//! `istiod.istio-system.svc`, an AdmissionReview in, Istio's answer out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Command;

fn review(object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0df28fbd-5f5f-4a35-97c1-5a3b0ee9c1b4",
            "kind": {"group": "networking.istio.io", "version": "v1", "kind": "DestinationRule"},
            "resource": {"group": "networking.istio.io", "version": "v1", "resource": "destinationrules"},
            "namespace": "default",
            "name": "reviews",
            "operation": "CREATE",
            "object": object,
        }
    })
}

fn destination_rule(lb: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": lb}}},
    })
}

/// `curl` posting `body` to the webhook; the HTTP status and the body.
async fn curl(https: SocketAddr, root: &Path, work: &Path, body: &Value) -> (String, String) {
    let file = work.join("review.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(root)
        .args([
            "--resolve",
            &format!("istiod.istio-system.svc:{}:127.0.0.1", https.port()),
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "-w",
            "\n%{http_code}",
            "--data-binary",
        ])
        .arg(format!("@{}", file.display()))
        .arg(format!("https://istiod.istio-system.svc:{}/validate", https.port()))
        .output()
        .await
        .expect("curl is needed for this test (apt-get install curl)");
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.to_owned(), body.to_owned())
}

#[tokio::test]
async fn the_validating_webhook_answers_the_api_servers_reviews() {
    let work = tempfile::tempdir().unwrap();
    let ca_dir = work.path().join("cacerts");
    std::fs::create_dir_all(work.path().join("config")).unwrap();
    let free = || -> SocketAddr { ([127, 0, 0, 1], test_support::ports::free_port()).into() };
    let (secure, https) = (free(), free());
    let mut child = Command::new(env!("CARGO_BIN_EXE_pilot-discovery"))
        .arg("discovery")
        .arg("--configDir")
        .arg(work.path().join("config"))
        .args(["--grpcAddr", "", "--httpAddr", "", "--monitoringAddr", ""])
        .args([
            "--secureGrpcAddr",
            &secure.to_string(),
            "--httpsAddr",
            &https.to_string(),
        ])
        .env("ROOT_CA_DIR", &ca_dir)
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(https).await.is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("pilot-discovery exited with {status} before serving");
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on --httpsAddr {https} after 30s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let root = ca_dir.join("root-cert.pem");

    let (code, body) = curl(https, &root, work.path(), &review(destination_rule("ROUND_ROBIN"))).await;
    assert_eq!(code, "200", "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "0df28fbd-5f5f-4a35-97c1-5a3b0ee9c1b4");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let (code, body) = curl(https, &root, work.path(), &review(destination_rule("SOMETIMES"))).await;
    assert_eq!(code, "200", "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("SOMETIMES"),
        "the denial names what is wrong: {message}"
    );

    let (code, _) = curl(https, &root, work.path(), &json!("not a review")).await;
    assert_eq!(code, "200");
}
