//! End-to-end: HTTPS on an Istio Gateway with a real Envoy fed by a real pilot-discovery. A SIMPLE
//! server terminates TLS with certificate files issued by a test CA and serves only its SNI; an HTTP
//! server with `httpsRedirect` answers 301 to https; a VirtualService change moves HTTPS traffic
//! without a restart. Envoy accepts everything (update_rejected 0, no NACKs counted by pilot).
//! A `credentialName` Secret is served over SDS to a gateway that proved its identity on the
//! secure port, and to no one on the plaintext port.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use common::{
    Ads, GatewayMesh, HOST, gateway_bootstrap, services_yaml, start_gateway_envoy, start_secure_gateway_envoy,
    virtual_service_yaml, workload_entry_yaml,
};
use test_support::agent::{Agent, AgentOptions};
use test_support::backend::{Backend, HttpResponse};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::Envoy;
use test_support::mesh_ca::MeshCa;
use test_support::ports::free_port;
use test_support::tls::{CertFiles, HttpsClient, IssuedCert, TestCa};

/// The gateway of `common` with an HTTPS server on `https_port` terminating TLS with `files`, and
/// an HTTP server on `http_port` that only redirects to https.
fn tls_gateway_yaml(https_port: u16, http_port: u16, files: &CertFiles) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: bookinfo-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {https_port}, name: https, protocol: HTTPS}}
    name: bookinfo-https
    hosts: ["{HOST}"]
    tls:
      mode: SIMPLE
      serverCertificate: {cert:?}
      privateKey: {key:?}
  - port: {{number: {http_port}, name: http, protocol: HTTP}}
    hosts: ["{HOST}"]
    tls: {{httpsRedirect: true}}
"#,
        cert = files.cert.display().to_string(),
        key = files.key.display().to_string(),
    )
}

/// The Kubernetes Secret `bookinfo-cert` (a `kubernetes.io/tls` Secret, as `kubectl create secret
/// tls` makes) holding `cert`.
fn tls_secret_yaml(cert: &IssuedCert) -> String {
    let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: bookinfo-cert, namespace: istio-system}}\n\
         type: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(&cert.cert_pem),
        indent(&cert.key_pem)
    )
}

/// The config directory of the TLS mesh: the gateway (certificate `files`, or with `credential`
/// `credentialName: bookinfo-cert` and that Secret holding `cert`), the services and workloads
/// of `backends`, all of /reviews to v1.
fn write_tls_config(
    dir: &std::path::Path,
    https_port: u16,
    http_port: u16,
    files: &CertFiles,
    cert: &IssuedCert,
    credential: bool,
    backends: &BTreeMap<&str, Backend>,
) -> anyhow::Result<()> {
    let write = |file: &str, yaml: String| std::fs::write(dir.join(file), yaml);
    if credential {
        let with_credential = tls_gateway_yaml(https_port, http_port, files)
            .lines()
            .filter(|l| !l.contains("serverCertificate") && !l.contains("privateKey"))
            .map(|l| l.replace("mode: SIMPLE", "mode: SIMPLE\n      credentialName: bookinfo-cert") + "\n")
            .collect::<String>();
        write("gateway.yaml", with_credential)?;
        write("secret.yaml", tls_secret_yaml(cert))?;
    } else {
        write("gateway.yaml", tls_gateway_yaml(https_port, http_port, files))?;
    }
    write(
        "services.yaml",
        services_yaml(backends["ratings"].port(), backends["slow"].port()),
    )?;
    for (name, version) in [("reviews-v1", "v1"), ("reviews-v2", "v2")] {
        write(
            &format!("{name}.yaml"),
            workload_entry_yaml(name, version, backends[name].port()),
        )?;
    }
    write("virtual-service.yaml", virtual_service_yaml(100))?;
    Ok(())
}

/// `common`'s mesh (its `gateway_port` is the redirecting HTTP server) plus the HTTPS side.
struct TlsMesh {
    mesh: GatewayMesh,
    https_addr: SocketAddr,
    client: HttpsClient,
    server_cert: IssuedCert,
    _certs: tempfile::TempDir,
    /// The mesh CA of the secure port the gateway connects to (credentialName only).
    _ca: Option<MeshCa>,
}

impl TlsMesh {
    async fn start() -> anyhow::Result<TlsMesh> {
        TlsMesh::start_with(false).await
    }

    /// With `credential`, the HTTPS server's certificate is `credentialName: bookinfo-cert`, a
    /// Secret in the config directory that pilot-discovery serves over SDS, instead of files, and
    /// the gateway connects as a real one is served credentials: to the secure port, with a token.
    async fn start_with(credential: bool) -> anyhow::Result<TlsMesh> {
        let ca = TestCa::new("pilot-rs e2e root")?;
        let server_cert = ca.issue_server(&[HOST])?;
        let certs = tempfile::tempdir()?;
        let files = server_cert.write(certs.path(), "bookinfo")?;

        let mut backends = BTreeMap::new();
        for name in ["reviews-v1", "reviews-v2", "ratings", "slow"] {
            backends.insert(name, Backend::start(name).await?);
        }
        let (https_port, http_port) = (free_port(), free_port());
        let dir = tempfile::tempdir()?;
        write_tls_config(
            dir.path(),
            https_port,
            http_port,
            &files,
            &server_cert,
            credential,
            &backends,
        )?;
        let (discovery, envoy, mesh_ca) = if credential {
            let ca = MeshCa::loopback()?;
            let discovery = Discovery::start(dir.path(), ca.serve(DiscoveryOptions::default())).await?;
            let envoy = start_secure_gateway_envoy(&discovery, Ads::Sotw, &ca).await?;
            (discovery, envoy, Some(ca))
        } else {
            let discovery = Discovery::start(dir.path(), DiscoveryOptions::default()).await?;
            let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
            (discovery, envoy, None)
        };
        let tls = TlsMesh {
            mesh: GatewayMesh {
                dir,
                backends,
                discovery,
                envoy,
                gateway_port: http_port,
            },
            https_addr: SocketAddr::from(([127, 0, 0, 1], https_port)),
            client: HttpsClient::trusting(&ca)?,
            server_cert,
            _certs: certs,
            _ca: mesh_ca,
        };
        tls.wait_for_backend("reviews-v1", 1).await?;
        Ok(tls)
    }

    /// GET `path` for `bookinfo.example.com` over TLS (SNI and Host both the gateway host).
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<HttpResponse> {
        self.client.get(self.https_addr, HOST, HOST, path, headers).await
    }

    /// Polls HTTPS /reviews until `n` answers in a row come from `backend`.
    async fn wait_for_backend(&self, backend: &str, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut in_a_row = 0;
        while in_a_row < n {
            let answer = self.get("/reviews", &[]).await;
            let who = match &answer {
                Ok(r) if r.status == 200 => r.json().ok().and_then(|v| v["backend"].as_str().map(str::to_owned)),
                _ => None,
            };
            if who.as_deref() == Some(backend) {
                in_a_row += 1;
                continue;
            }
            in_a_row = 0;
            if Instant::now() > deadline {
                bail!(
                    "https /reviews not routed to {backend} within 15s; last: {answer:?}\n--- pilot-discovery log ---\n{}\n--- envoy log ---\n{}",
                    self.mesh.discovery.logs(),
                    self.mesh.envoy.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Envoy's count of connections to the HTTPS listener that matched no filter chain.
    async fn no_filter_chain_match(&self) -> anyhow::Result<u64> {
        let stat = format!("listener.0.0.0.0_{}.no_filter_chain_match", self.https_addr.port());
        Ok(self.mesh.envoy.stats().await?.get(&stat).copied().unwrap_or(0))
    }
}

#[tokio::test]
async fn https_server_terminates_tls_for_its_sni_and_http_redirects() -> anyhow::Result<()> {
    let tls = TlsMesh::start().await?;

    // Envoy serves the certificate from the files, negotiates HTTP/1.1 and routes to the backend.
    let stream = tls.client.connect(tls.https_addr, HOST).await?;
    let session = stream.get_ref().1;
    assert_eq!(
        session.peer_certificates().unwrap_or_default(),
        std::slice::from_ref(&tls.server_cert.cert_der)
    );
    assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]));
    drop(stream);
    let r = tls.get("/reviews", &[("x-test", "tls")]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    let echo = r.json()?;
    assert_eq!(echo["backend"], "reviews-v1");
    assert_eq!(echo["path"], "/reviews");
    let seen = tls
        .mesh
        .backend("reviews-v1")
        .last()
        .context("reviews-v1 got the request")?;
    assert_eq!(seen.host, HOST);
    assert_eq!(seen.header("x-test"), Some("tls"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("https"), "{seen:?}");
    // The other routes of the VirtualService apply on the HTTPS server too.
    let r = tls.get("/ratings/7", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        tls.mesh
            .backend("ratings")
            .last()
            .context("ratings got the request")?
            .path,
        "/v1/ratings/7"
    );

    // An SNI the server does not list matches no filter chain: no certificate, no handshake.
    let before = tls.no_filter_chain_match().await?;
    let err = tls
        .client
        .connect(tls.https_addr, "other.example.com")
        .await
        .err()
        .context("a handshake for other.example.com succeeded")?;
    let err = format!("{err:#}");
    assert!(
        !err.contains("invalid peer certificate"),
        "Envoy served a certificate: {err}"
    );
    tls.mesh
        .envoy
        .wait_for_stat(
            &format!("listener.0.0.0.0_{}.no_filter_chain_match", tls.https_addr.port()),
            |v| v > before,
            Duration::from_secs(5),
        )
        .await?;

    // Plaintext on the HTTP server is redirected to https, and never reaches a backend.
    let requests_before = tls.mesh.backend("reviews-v1").count();
    let r = tls.mesh.get("/reviews?x=1", &[]).await?;
    assert_eq!(r.status, 301, "{r:?}");
    assert_eq!(r.header("location"), Some("https://bookinfo.example.com/reviews?x=1"));
    assert_eq!(tls.mesh.backend("reviews-v1").count(), requests_before);

    tls.mesh.assert_no_rejects().await
}

#[tokio::test]
async fn https_traffic_follows_a_virtual_service_change() -> anyhow::Result<()> {
    let tls = TlsMesh::start().await?;
    for _ in 0..5 {
        let r = tls.get("/reviews", &[]).await?;
        assert_eq!(r.json()?["backend"], "reviews-v1", "{r:?}");
    }
    let listeners_before = tls
        .mesh
        .envoy
        .stats()
        .await?
        .get("listener_manager.listener_modified")
        .copied();

    // All of /reviews to v2 now.
    tls.mesh.write("virtual-service.yaml", &virtual_service_yaml(0))?;
    tls.wait_for_backend("reviews-v2", 10).await?;
    for _ in 0..20 {
        let r = tls.get("/reviews", &[]).await?;
        assert_eq!(r.json()?["backend"], "reviews-v2", "{r:?}");
    }
    // The header route still wins over the split, on TLS as on plaintext.
    let r = tls.get("/reviews", &[("end-user", "jason")]).await?;
    assert_eq!(r.json()?["backend"], "reviews-v2");

    // Same Envoy, same TLS listener: only the routes changed.
    assert!(tls.mesh.envoy.exit_status().is_none(), "envoy exited");
    let stats = tls.mesh.envoy.stats().await?;
    let https_rds_updates: u64 = stats
        .iter()
        .filter(|(k, _)| k.starts_with("http.bookinfo-https.rds.") && k.ends_with("update_success"))
        .map(|(_, v)| *v)
        .sum();
    ensure!(
        https_rds_updates >= 2,
        "expected a second RDS update on the HTTPS chain; stats: {:?}",
        stats.iter().filter(|(k, _)| k.contains(".rds.")).collect::<Vec<_>>()
    );
    assert_eq!(
        stats.get("listener_manager.listener_modified").copied(),
        listeners_before,
        "a route change must not replace the listeners"
    );
    // The redirect server is untouched.
    assert_eq!(tls.mesh.get("/reviews", &[]).await?.status, 301);
    tls.mesh.assert_no_rejects().await
}

/// `credentialName`: the gateway's certificate is a Kubernetes Secret (here a manifest in the
/// config directory) that pilot-discovery serves over ADS (SDS `kubernetes://bookinfo-cert`); a new
/// certificate in the Secret reaches Envoy without a restart.
#[tokio::test]
async fn credential_name_comes_from_a_secret_over_sds_and_follows_it() -> anyhow::Result<()> {
    let tls = TlsMesh::start_with(true).await?;
    let stream = tls.client.connect(tls.https_addr, HOST).await?;
    assert_eq!(
        stream.get_ref().1.peer_certificates().unwrap_or_default(),
        std::slice::from_ref(&tls.server_cert.cert_der)
    );
    drop(stream);
    let r = tls.get("/reviews", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");

    // a renewed certificate in the Secret: served on the next handshake, same Envoy
    let ca = TestCa::new("pilot-rs e2e root 2")?;
    let renewed = ca.issue_server(&[HOST])?;
    std::fs::write(tls.mesh.dir.path().join("secret.yaml"), tls_secret_yaml(&renewed))?;
    let client = HttpsClient::trusting(&ca)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(stream) = client.connect(tls.https_addr, HOST).await
            && stream.get_ref().1.peer_certificates().unwrap_or_default() == std::slice::from_ref(&renewed.cert_der)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the renewed certificate was not served within 15 s\n{}",
            tls.mesh.discovery.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tls.mesh.envoy.update_rejected_total().await?, 0);
    Ok(())
}

/// Istio's SecretGen refuses credentials to a proxy that did not prove who it is: a bare Envoy on
/// the plaintext port, naming itself the istio-system gateway, asks for `kubernetes://bookinfo-cert`
/// and gets nothing (no certificate, no handshake), pilot-discovery says why and counts it, and
/// Envoy rejects nothing. The same gateway on the secure port with a token is served.
#[tokio::test]
async fn a_gateway_on_the_plaintext_port_gets_no_credential() -> anyhow::Result<()> {
    let ca = TestCa::new("pilot-rs e2e root")?;
    let server_cert = ca.issue_server(&[HOST])?;
    let certs = tempfile::tempdir()?;
    let files = server_cert.write(certs.path(), "bookinfo")?;
    let mut backends = BTreeMap::new();
    for name in ["reviews-v1", "reviews-v2", "ratings", "slow"] {
        backends.insert(name, Backend::start(name).await?);
    }
    let (https_port, http_port) = (free_port(), free_port());
    let dir = tempfile::tempdir()?;
    write_tls_config(dir.path(), https_port, http_port, &files, &server_cert, true, &backends)?;
    let mesh_ca = MeshCa::loopback()?;
    let discovery = Discovery::start(dir.path(), mesh_ca.serve(DiscoveryOptions::default())).await?;
    let envoy =
        Envoy::start(gateway_bootstrap(discovery.grpc_addr, Ads::Sotw, serde_json::json!({}), None).build()).await?;

    // the listener is sent and Envoy asks for the Secret: refused, said and counted
    let denied = "pilot_sds_denied{reason=\"unauthenticated\"}";
    let deadline = Instant::now() + Duration::from_secs(15);
    while discovery.metric(denied).await? == 0.0 {
        ensure!(
            Instant::now() < deadline,
            "no SDS refusal counted within 15 s\n{}\n{}",
            discovery.logs(),
            envoy.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = discovery.logs();
    ensure!(
        logs.contains("is not authorized to receive credentials (\"kubernetes://bookinfo-cert\")")
            && logs.contains("secure port"),
        "pilot-discovery says why and what to do:\n{logs}"
    );
    let dump = envoy.config_dump().await?;
    let secrets = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["@type"] == "type.googleapis.com/envoy.admin.v3.SecretsConfigDump");
    ensure!(
        secrets.is_none_or(|s| s["dynamic_active_secrets"].as_array().is_none_or(Vec::is_empty)),
        "Envoy holds a secret it was not to be given: {secrets:?}"
    );
    let client = HttpsClient::trusting(&ca)?;
    let https = SocketAddr::from(([127, 0, 0, 1], https_port));
    ensure!(
        client.connect(https, HOST).await.is_err(),
        "a TLS handshake succeeded without the certificate"
    );
    ensure!(envoy.update_rejected_total().await? == 0, "Envoy rejected config");
    ensure!(
        discovery.metric("pilot_total_xds_rejects").await? == 0.0,
        "NACKs:\n{}",
        discovery.logs()
    );

    // the same gateway proven on the secure port gets it
    drop(envoy);
    let secure = start_secure_gateway_envoy(&discovery, Ads::Sotw, &mesh_ca).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(stream) = client.connect(https, HOST).await
            && stream.get_ref().1.peer_certificates().unwrap_or_default() == std::slice::from_ref(&server_cert.cert_der)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the secure gateway was not served its certificate within 15 s\n{}\n{}",
            discovery.logs(),
            secure.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(secure.update_rejected_total().await? == 0, "Envoy rejected config");
    Ok(())
}

/// What users run: the gateway is pilot-agent and its Envoy, the agent connected to the secure
/// port with its service account token (`discoveryAddress` on 15012). The Envoy's SDS request for
/// `kubernetes://bookinfo-cert` goes through the agent's xDS proxy (delta xDS) and is served.
#[tokio::test]
async fn a_pilot_agent_gateway_is_served_its_credential_over_the_secure_port() -> anyhow::Result<()> {
    let ca = TestCa::new("pilot-rs e2e root")?;
    let server_cert = ca.issue_server(&[HOST])?;
    let certs = tempfile::tempdir()?;
    let files = server_cert.write(certs.path(), "bookinfo")?;
    let mut backends = BTreeMap::new();
    for name in ["reviews-v1", "reviews-v2", "ratings", "slow"] {
        backends.insert(name, Backend::start(name).await?);
    }
    let (https_port, http_port) = (free_port(), free_port());
    let dir = tempfile::tempdir()?;
    write_tls_config(dir.path(), https_port, http_port, &files, &server_cert, true, &backends)?;
    let mesh_ca = MeshCa::loopback()?;
    let discovery = Discovery::start(dir.path(), mesh_ca.serve(DiscoveryOptions::default())).await?;
    let mut opts = mesh_ca.agent(AgentOptions::ingress_gateway(mesh_ca.addr));
    opts.proxy_config = serde_json::json!({"controlPlaneAuthPolicy": "MUTUAL_TLS"});
    let mut agent = Agent::start(opts).await?;
    agent
        .wait_ready(Duration::from_secs(30))
        .await
        .with_context(|| format!("{}\n{}", agent.logs(), discovery.logs()))?;

    let client = HttpsClient::trusting(&ca)?;
    let https = SocketAddr::from(([127, 0, 0, 1], https_port));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(stream) = client.connect(https, HOST).await
            && stream.get_ref().1.peer_certificates().unwrap_or_default() == std::slice::from_ref(&server_cert.cert_der)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the agent's gateway was not served its certificate within 20 s\n{}\n{}",
            discovery.logs(),
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = client.get(https, HOST, HOST, "/reviews", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()?["backend"], "reviews-v1");
    ensure!(
        discovery.metric("pilot_sds_denied").await? == 0.0,
        "a credential was refused:\n{}",
        discovery.logs()
    );
    ensure!(
        discovery.metric("pilot_total_xds_rejects").await? == 0.0,
        "NACKs:\n{}",
        discovery.logs()
    );
    Ok(())
}
