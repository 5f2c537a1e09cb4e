//! The real `pilot-discovery discovery` binary with `--secureGrpcAddr`: xDS over TLS with the
//! mesh root from `ROOT_CA_DIR` for a caller authenticated by its token (`JWT_RULE`), the same
//! root after a restart, and startup errors that name the flag and the file and exit non-zero;
//! without the secure port, the CA on the plaintext port.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use xds_api::type_url;

const NODE_ID: &str = "router~127.0.0.1~gw.istio-system~istio-system.svc.cluster.local";

/// The issuer of the tests' service account tokens, named by `JWT_RULE`.
fn issuer() -> &'static security::testing::TestIssuer {
    static ISSUER: std::sync::OnceLock<security::testing::TestIssuer> = std::sync::OnceLock::new();
    ISSUER.get_or_init(|| security::testing::TestIssuer::new("https://kubernetes.default.svc", "k1"))
}

/// pilot-discovery with only the secure gRPC port, in `work` (its working directory).
fn command(work: &Path, ca_dir: &Path, secure_addr: &str) -> Command {
    let config_dir = work.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pilot-discovery"));
    cmd.arg("discovery")
        .arg("--configDir")
        .arg(&config_dir)
        .args([
            "--grpcAddr",
            "",
            "--httpAddr",
            "",
            "--monitoringAddr",
            "",
            "--httpsAddr",
            "",
        ])
        .args(["--secureGrpcAddr", secure_addr])
        .env("ROOT_CA_DIR", ca_dir)
        .env(
            "JWT_RULE",
            serde_json::json!({"issuer": issuer().issuer, "jwks": issuer().jwks()}).to_string(),
        )
        .current_dir(work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn tls_channel(addr: SocketAddr, root_pem: &str) -> anyhow::Result<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name("istiod.istio-system.svc");
    Ok(Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
}

/// Waits until the process serves TLS that `root-cert.pem` of `ca_dir` verifies.
async fn wait_serving(child: &mut Child, addr: SocketAddr, ca_dir: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("pilot-discovery exited with {status} before serving");
        }
        if let Ok(root) = std::fs::read_to_string(ca_dir.join("root-cert.pem"))
            && let Ok(ch) = tls_channel(addr, &root).await
        {
            return ch;
        }
        assert!(Instant::now() < deadline, "no TLS xDS on {addr} after 30s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Cluster names of the first CDS response to a router authenticated as `istio-system/gw`,
/// protocol-checked by the shared client.
async fn cds(channel: Channel) -> Vec<String> {
    let token = issuer().token("istio-system", "gw", &["istio-ca"], 600);
    let mut client =
        test_support::ads::AdsClient::on_channel_with_token(channel, Some(&token), NODE_ID, serde_json::json!({}))
            .await
            .unwrap();
    client.request(type_url::CLUSTER, &[]).unwrap();
    client.expect_type(type_url::CLUSTER).await.unwrap().names
}

#[tokio::test]
async fn tls_xds_with_a_root_that_survives_restarts() {
    let work = tempfile::tempdir().unwrap();
    let ca_dir = work.path().join("cacerts");
    let addr: SocketAddr = ([127, 0, 0, 1], test_support::ports::free_port()).into();

    let mut first = command(work.path(), &ca_dir, &addr.to_string()).spawn().unwrap();
    let channel = wait_serving(&mut first, addr, &ca_dir).await;
    assert!(cds(channel).await.iter().any(|c| c == "BlackHoleCluster"));
    let root = std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap();
    assert!(ca_dir.join("istio-generated").exists());
    first.kill().await.unwrap();

    let mut second = command(work.path(), &ca_dir, &addr.to_string()).spawn().unwrap();
    let channel = wait_serving(&mut second, addr, &ca_dir).await;
    assert_eq!(std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(), root);
    // A client that kept the first start's root still trusts the restarted istiod.
    drop(channel);
    let channel = tls_channel(addr, &root).await.unwrap();
    assert!(cds(channel).await.iter().any(|c| c == "BlackHoleCluster"));
}

async fn failed_start(cmd: &mut Command) -> String {
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("pilot-discovery exits")
        .unwrap();
    assert!(!out.status.success(), "pilot-discovery should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn port_in_use_names_the_flag() {
    let work = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let stderr = failed_start(&mut command(work.path(), &work.path().join("cacerts"), &addr)).await;
    assert!(
        stderr.contains("--secureGrpcAddr") && stderr.contains("port in use"),
        "{stderr}"
    );
}

#[tokio::test]
async fn incomplete_ca_dir_names_the_dir_and_missing_files() {
    let work = tempfile::tempdir().unwrap();
    let ca_dir = work.path().join("cacerts");
    std::fs::create_dir_all(&ca_dir).unwrap();
    std::fs::write(ca_dir.join("ca-key.pem"), "not a key").unwrap();
    let stderr = failed_start(&mut command(work.path(), &ca_dir, "127.0.0.1:0")).await;
    let dir = ca_dir.display().to_string();
    assert!(stderr.contains("--secureGrpcAddr") && stderr.contains(&dir), "{stderr}");
    assert!(
        stderr.contains("ca-cert.pem, root-cert.pem, cert-chain.pem"),
        "{stderr}"
    );
}

/// A CSR as pilot-agent makes it, asking for `san`.
fn csr(san: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(san.to_owned().try_into().unwrap())];
    params.serialize_request(&key).unwrap().pem().unwrap()
}

async fn create_certificate(channel: Channel, token: Option<&str>) -> Result<Vec<String>, tonic::Status> {
    use istio_api::ca::IstioCertificateRequest;
    use istio_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr("spiffe://cluster.local/ns/istio-system/sa/gw"),
        validity_duration: 3600,
        metadata: None,
    });
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .map(|r| r.into_inner().cert_chain)
}

/// With `--secureGrpcAddr ""` the CA is served on the plaintext port, as istiod's `startCA` does
/// without a secure server: the root kept in `ROOT_CA_DIR`, a CSR with a token of `JWT_RULE`
/// signed for the token's identity, one without refused with UNAUTHENTICATED, and counted.
#[tokio::test]
async fn without_a_secure_port_the_ca_is_on_the_plaintext_port_for_token_holders_only() {
    let work = tempfile::tempdir().unwrap();
    let ca_dir = work.path().join("cacerts");
    std::fs::create_dir_all(work.path().join("config")).unwrap();
    let grpc: SocketAddr = ([127, 0, 0, 1], test_support::ports::free_port()).into();
    let monitoring: SocketAddr = ([127, 0, 0, 1], test_support::ports::free_port()).into();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pilot-discovery"))
        .arg("discovery")
        .arg("--configDir")
        .arg(work.path().join("config"))
        .args([
            "--grpcAddr",
            &grpc.to_string(),
            "--secureGrpcAddr",
            "",
            "--httpAddr",
            "",
        ])
        .args(["--monitoringAddr", &monitoring.to_string()])
        .env("ROOT_CA_DIR", &ca_dir)
        .env(
            "JWT_RULE",
            serde_json::json!({"issuer": issuer().issuer, "jwks": issuer().jwks()}).to_string(),
        )
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let channel = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("pilot-discovery exited with {status} before serving");
        }
        if let Ok(ch) = Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect().await {
            break ch;
        }
        assert!(Instant::now() < deadline, "no plaintext gRPC on {grpc} after 30s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let e = create_certificate(channel.clone(), None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("no bearer token"), "{}", e.message());

    let token = issuer().token("istio-system", "ingress", &["istio-ca"], 600);
    let chain = create_certificate(channel, Some(&token)).await.unwrap();
    let root = std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap();
    assert_eq!(
        chain.last().unwrap().trim(),
        root.trim(),
        "the root of ROOT_CA_DIR is last"
    );
    use rustls::pki_types::pem::PemObject;
    let leaf = rustls::pki_types::CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
    assert_eq!(
        security::spiffe_uri_sans(leaf.as_ref()).unwrap(),
        ["spiffe://cluster.local/ns/istio-system/sa/ingress"],
        "the token's identity, not the CSR's"
    );

    let metrics = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{monitoring}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for want in [
        "citadel_server_csr_count 2",
        "citadel_server_authentication_failure_count 1",
        "citadel_server_success_cert_issuance_count 1",
    ] {
        assert!(metrics.contains(want), "{want} in\n{metrics}");
    }
}
