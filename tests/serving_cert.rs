//! istiod's serving certificate on a cluster (the fake API server), checked with `openssl
//! s_client` as a client outside the project sees it:
//! - signed by the mesh CA with a short lifetime (`CITADEL_SELF_SIGNED_CA_CERT_TTL`, which istiod
//!   gives its own certificate), it is signed again before it expires: a new handshake on 15017
//!   and 15012 gets a certificate with another serial and a later notAfter, which verifies
//!   against the mesh root, while a connection made before keeps working; the injector's
//!   MutatingWebhookConfiguration of Istio's rendered install carries the mesh root as caBundle;
//! - an external certificate (Istio's `--tlsCertFile`, `--tlsKeyFile`, `--caCertFile`) is served
//!   instead, and when its files are replaced the new one is served and its CA bundle patched
//!   into the webhook configurations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::{FakeApiServer, kubectl};
use test_support::ports::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A document of Istio's rendered default install.
fn rendered(kind: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("Istio's rendered install {} is needed ({e}): ../shared", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("a {kind} in the rendered install"))
}

/// The certificate `openssl s_client` is served on `port` for istiod's name, verified against
/// `ca_file`: its serial and notAfter.
async fn served(port: u16, ca_file: &Path, alpn: &str) -> (String, String) {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args([
            "-servername",
            "istiod.istio-system.svc",
            "-verify_hostname",
            "istiod.istio-system.svc",
        ])
        .args([
            "-CAfile",
            ca_file.to_str().unwrap(),
            "-verify_return_error",
            "-alpn",
            alpn,
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("openssl s_client (the openssl CLI is needed)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("Verify return code: 0 (ok)"),
        "s_client on {port}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("the server certificate");
    let end = text.find("-----END CERTIFICATE-----").expect("its end") + "-----END CERTIFICATE-----".len();
    let mut x509 = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-enddate"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    x509.stdin
        .take()
        .unwrap()
        .write_all(&text.as_bytes()[begin..end])
        .unwrap();
    let fields = String::from_utf8(x509.wait_with_output().unwrap().stdout).unwrap();
    let field = |k: &str| {
        fields
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {fields}"))
            .to_owned()
    };
    (field("serial="), field("notAfter="))
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ca_bundles(kubeconfig: &Path, kind: &str, name: &str) -> Vec<String> {
    let out = kubectl(
        kubeconfig,
        &[
            "get",
            kind,
            name,
            "-o",
            "jsonpath={range .webhooks[*]}{.clientConfig.caBundle}{\"\\n\"}{end}",
        ],
    )
    .await
    .unwrap_or_default();
    out.lines().map(str::to_owned).collect()
}

fn base64(pem: &str) -> String {
    use std::io::Read;
    let mut child = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.wait().unwrap();
    out
}

struct Cluster {
    api: FakeApiServer,
    kubeconfig: std::path::PathBuf,
}

async fn cluster(work: &Path, https: u16) -> Cluster {
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["istio-system", "default"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    api.apply(rendered("MutatingWebhookConfiguration")).unwrap();
    api.apply(rendered("ValidatingWebhookConfiguration")).unwrap();
    let kubeconfig = work.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.route_service("istiod", "istio-system", ([127, 0, 0, 1], https).into());
    Cluster { api, kubeconfig }
}

async fn start(
    work: &Path,
    cluster: &Cluster,
    https: u16,
    secure: u16,
    more: Vec<String>,
    env: Vec<(String, String)>,
) -> Discovery {
    let config = work.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let mut args = vec![
        "--kubeconfig".into(),
        cluster.kubeconfig.display().to_string(),
        "--secureGrpcAddr".into(),
        format!("127.0.0.1:{secure}"),
        "--httpsAddr".into(),
        format!("127.0.0.1:{https}"),
    ];
    args.extend(more);
    Discovery::start(
        &config,
        DiscoveryOptions {
            args,
            env,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_short_lived_serving_certificate_is_signed_again_and_new_handshakes_get_it() {
    let work = tempfile::tempdir().unwrap();
    let (https, secure) = (free_port(), free_port());
    let cluster = cluster(work.path(), https).await;
    // The mesh root, long-lived, made beforehand (a short CITADEL_SELF_SIGNED_CA_CERT_TTL would
    // also be the lifetime of a root made at start); pilot-discovery publishes it in istio-ca-secret.
    let cacerts = work.path().join("cacerts");
    let ca = ca::CertificateAuthority::load_or_create(&cacerts, "cluster.local").unwrap();
    let root_file = work.path().join("root.pem");
    std::fs::write(&root_file, ca.root_cert_pem()).unwrap();
    let discovery = start(
        work.path(),
        &cluster,
        https,
        secure,
        vec![],
        vec![
            ("ROOT_CA_DIR".into(), cacerts.display().to_string()),
            ("CITADEL_SELF_SIGNED_CA_CERT_TTL".into(), "6s".into()),
        ],
    )
    .await;

    let first = served(https, &root_file, "http/1.1").await;
    // A connection made now, used after the rotation.
    let mut old = tokio::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &format!("127.0.0.1:{https}")])
        .args([
            "-servername",
            "istiod.istio-system.svc",
            "-CAfile",
            root_file.to_str().unwrap(),
        ])
        .args(["-verify_return_error", "-alpn", "http/1.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut old_stderr = old.stderr.take().unwrap();
    let mut verified = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !verified.contains("verify return:1") || !verified.contains("depth=0") {
        assert!(
            Instant::now() < deadline,
            "the long-lived connection's handshake: {verified}"
        );
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), old_stderr.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "s_client ended: {verified}");
        verified.push_str(&String::from_utf8_lossy(&buf[..n]));
    }

    // Signed again at half of its lifetime (3 s): a new handshake on both ports gets it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let now = served(https, &root_file, "http/1.1").await;
        if now.0 != first.0 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "a new serving certificate on 15017 within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(second.1, first.1, "a later notAfter: {first:?} then {second:?}");
    let grpc = served(secure, &root_file, "h2").await;
    assert_ne!(grpc.0, first.0, "15012 serves the new certificate too");

    // The connection made before the rotation still answers.
    let mut stdin = old.stdin.take().unwrap();
    stdin
        .write_all(b"GET /validate HTTP/1.1\r\nHost: istiod\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        old.stdout.take().unwrap().read_to_string(&mut answer),
    )
    .await
    .expect("an answer on the old connection")
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");

    // The injector's configuration of Istio's install carries the mesh root.
    let root_b64 = base64(ca.root_cert_pem());
    eventually("the injector's webhooks patched with the mesh root", || async {
        let got = ca_bundles(
            &cluster.kubeconfig,
            "mutatingwebhookconfiguration",
            "istio-sidecar-injector",
        )
        .await;
        got.len() == 4 && got.iter().all(|b| *b == root_b64)
    })
    .await;
    let (_, text) = discovery.get("/metrics", true).await.unwrap();
    let attempts = test_support::discovery::sum_metric(&text, "webhook_patch_attempts");
    assert!(
        attempts >= 1.0,
        "webhook_patch_attempts {attempts}:\n{}",
        text.lines()
            .filter(|l| l.contains("webhook"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(discovery.metric("pilot_istiod_cert_errors").await.unwrap(), 0.0);
    assert!(discovery.logs().contains("signed again (half of its lifetime is left)"));
    drop(cluster.api);
}

/// A CA of the test's own and istiod's certificate signed by it, written where `dir` says.
fn external(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf, String) {
    let ca_dir = dir.join(format!("external-ca-{name}"));
    let ca = ca::CertificateAuthority::load_or_create(&ca_dir, "external.example.com").unwrap();
    let issued = ca
        .issue_server_cert(&["istiod.istio-system.svc".to_owned()], &[], Duration::from_secs(3600))
        .unwrap();
    let tls = dir.join("istiod-tls");
    std::fs::create_dir_all(&tls).unwrap();
    let (cert, key, root) = (tls.join("tls.crt"), tls.join("tls.key"), tls.join("ca.crt"));
    std::fs::write(&cert, issued.cert_chain_pem).unwrap();
    std::fs::write(&key, issued.key_pem).unwrap();
    std::fs::write(&root, ca.root_cert_pem()).unwrap();
    let root_copy = dir.join(format!("root-{name}.pem"));
    std::fs::write(&root_copy, ca.root_cert_pem()).unwrap();
    (cert, key, root_copy, ca.root_cert_pem().to_owned())
}

#[tokio::test]
async fn an_external_serving_certificate_is_served_and_followed_when_its_files_change() {
    let work = tempfile::tempdir().unwrap();
    let (https, secure) = (free_port(), free_port());
    let cluster = cluster(work.path(), https).await;
    let (cert, key, root_a, pem_a) = external(work.path(), "a");
    let tls_ca = cert.parent().unwrap().join("ca.crt");
    let discovery = start(
        work.path(),
        &cluster,
        https,
        secure,
        vec![
            "--tlsCertFile".into(),
            cert.display().to_string(),
            "--tlsKeyFile".into(),
            key.display().to_string(),
            "--caCertFile".into(),
            tls_ca.display().to_string(),
        ],
        vec![("ROOT_CA_DIR".into(), work.path().join("cacerts").display().to_string())],
    )
    .await;
    let first = served(https, &root_a, "http/1.1").await;
    served(secure, &root_a, "h2").await;
    let b64_a = base64(&pem_a);
    eventually(
        "the external CA bundle patched into both webhook configurations",
        || async {
            let m = ca_bundles(
                &cluster.kubeconfig,
                "mutatingwebhookconfiguration",
                "istio-sidecar-injector",
            )
            .await;
            let v = ca_bundles(
                &cluster.kubeconfig,
                "validatingwebhookconfiguration",
                "istio-validator-istio-system",
            )
            .await;
            !m.is_empty() && m.iter().chain(&v).all(|b| *b == b64_a)
        },
    )
    .await;

    // Replaced on disk (cert-manager renewing the istiod-tls Secret with another CA).
    let (_, _, root_b, pem_b) = external(work.path(), "b");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = tokio::process::Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{https}"), "-CAfile"])
            .args([root_b.to_str().unwrap(), "-verify_return_error"])
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("Verify return code: 0 (ok)") {
            break;
        }
        assert!(Instant::now() < deadline, "the replaced certificate served within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = served(https, &root_b, "http/1.1").await;
    assert_ne!(second.0, first.0);
    let b64_b = base64(&pem_b);
    eventually("the new CA bundle patched into both webhook configurations", || async {
        let m = ca_bundles(
            &cluster.kubeconfig,
            "mutatingwebhookconfiguration",
            "istio-sidecar-injector",
        )
        .await;
        let v = ca_bundles(
            &cluster.kubeconfig,
            "validatingwebhookconfiguration",
            "istio-validator-istio-system",
        )
        .await;
        !m.is_empty() && m.iter().chain(&v).all(|b| *b == b64_b)
    })
    .await;
    assert!(discovery.logs().contains("istiod's serving certificate reloaded from"));
}
