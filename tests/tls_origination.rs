//! End-to-end: TLS origination with a DestinationRule `credentialName`, as Istio's "Egress
//! Gateways with TLS Origination" task. A real Envoy gateway takes plain HTTP and originates TLS
//! to an upstream `openssl s_server` (written by nobody here): SIMPLE verifies the server with the
//! CA of the Secret `<credentialName>` (served over ADS as `kubernetes://<name>-cacert`), MUTUAL also
//! presents the Secret's client certificate, which the server requires. A Secret whose CA does not
//! sign the server's certificate makes the request fail, as it should. The gateway connects as one
//! that is served credentials must: over TLS to the secure port, with a service account token.

mod common;

use std::time::{Duration, Instant};

use anyhow::ensure;
use common::{Ads, TlsServer};
use test_support::backend::http_get;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::ports::free_port;
use test_support::tls::{IssuedCert, TestCa};

/// A `kubernetes.io/tls`-like Secret in istio-system: `ca.crt` always, `tls.crt`/`tls.key` when
/// `client` is given.
fn secret_yaml(name: &str, ca: &TestCa, client: Option<&IssuedCert>) -> String {
    let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let mut s = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: istio-system}}\nstringData:\n  ca.crt: |\n{}",
        indent(&ca.cert_pem())
    );
    if let Some(c) = client {
        s.push_str(&format!(
            "  tls.crt: |\n{}  tls.key: |\n{}",
            indent(&c.cert_pem),
            indent(&c.key_pem)
        ));
    }
    s
}

fn mesh_yaml(gateway_port: u16, simple: u16, mutual: u16) -> String {
    let service = |name: &str, port: u16| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: istio-system}}\n\
             spec:\n  hosts: [{name}.external.example]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n\
             \x20 ports: [{{number: 443, name: tls, protocol: TLS}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{tls: {port}}}}}]\n---\n"
        )
    };
    let rule = |name: &str, mode: &str, credential: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: istio-system}}\n\
             spec:\n  host: {name}.external.example\n  trafficPolicy:\n    portLevelSettings:\n    - port: {{number: 443}}\n\
             \x20     tls: {{mode: {mode}, credentialName: {credential}, sni: {name}.external.example}}\n---\n"
        )
    };
    let route = |prefix: &str, host: &str| {
        format!(
            "  - match: [{{uri: {{prefix: /{prefix}}}}}]\n    route: [{{destination: {{host: {host}.external.example, port: {{number: 443}}}}}}]\n"
        )
    };
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: egress, namespace: istio-system}}\n\
         spec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {gateway_port}, name: http, protocol: HTTP}}\n    hosts: [\"*\"]\n---\n\
         {}{}{}{}{}{}\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: egress, namespace: istio-system}}\n\
         spec:\n  hosts: [\"*\"]\n  gateways: [egress]\n  http:\n{}{}{}",
        service("simple", simple),
        service("mutual", mutual),
        service("wrong", simple),
        rule("simple", "SIMPLE", "upstream-ca"),
        rule("mutual", "MUTUAL", "client-credential"),
        rule("wrong", "SIMPLE", "other-ca"),
        route("simple", "simple"),
        route("mutual", "mutual"),
        route("wrong", "wrong"),
    )
}

async fn run(ads: Ads) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server_ca = TestCa::new("upstream root")?;
    let client_ca = TestCa::new("client root")?;
    let other_ca = TestCa::new("unrelated root")?;
    let simple = TlsServer::start(
        dir.path(),
        "simple",
        &server_ca.issue_server(&["simple.external.example"])?,
        None,
    )
    .await?;
    let mutual = TlsServer::start(
        dir.path(),
        "mutual",
        &server_ca.issue_server(&["mutual.external.example"])?,
        Some(&client_ca),
    )
    .await?;
    let client_cert = client_ca.issue_client(&["egress.istio-system"])?;
    let config = dir.path().join("config");
    std::fs::create_dir(&config)?;
    let gateway_port = free_port();
    std::fs::write(
        config.join("mesh.yaml"),
        mesh_yaml(gateway_port, simple.port, mutual.port),
    )?;
    std::fs::write(
        config.join("upstream-ca.yaml"),
        secret_yaml("upstream-ca", &server_ca, None),
    )?;
    std::fs::write(
        config.join("client-credential.yaml"),
        secret_yaml("client-credential", &server_ca, Some(&client_cert)),
    )?;
    std::fs::write(config.join("other-ca.yaml"), secret_yaml("other-ca", &other_ca, None))?;
    let mesh_ca = MeshCa::loopback()?;
    let discovery = Discovery::start(&config, mesh_ca.serve(DiscoveryOptions::default())).await?;
    let envoy = common::start_secure_gateway_envoy(&discovery, ads, &mesh_ca).await?;
    let get = |path: &str| {
        let url = format!("http://127.0.0.1:{gateway_port}{path}");
        async move { http_get(&url, &[("host", "anything")]).await }
    };

    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = get("/simple").await?;
        if r.status == 200 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        r.status == 200,
        "SIMPLE origination: {} {}\n{}",
        r.status,
        r.body,
        envoy.log_tail()
    );
    ensure!(r.body.contains("s_server"), "the upstream's own page: {}", r.body);
    let r = get("/mutual").await?;
    ensure!(
        r.status == 200,
        "MUTUAL origination with the Secret's client certificate: {} {}",
        r.status,
        r.body
    );
    let r = get("/wrong").await?;
    ensure!(
        r.status == 503,
        "a CA that did not sign the server fails the handshake: {} {}",
        r.status,
        r.body
    );

    let dump = envoy.config_dump().await?.to_string();
    ensure!(
        dump.contains("kubernetes://upstream-ca-cacert"),
        "the CA comes over ADS SDS"
    );
    ensure!(
        !dump.contains("\"kubernetes://upstream-ca\""),
        "SIMPLE asks for no client certificate"
    );
    ensure!(envoy.update_rejected_total().await? == 0, "Envoy rejected config");
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

#[tokio::test]
async fn a_gateway_originates_tls_with_credential_name_secrets_over_sotw() -> anyhow::Result<()> {
    run(Ads::Sotw).await
}

#[tokio::test]
async fn a_gateway_originates_tls_with_credential_name_secrets_over_delta() -> anyhow::Result<()> {
    run(Ads::Delta).await
}
