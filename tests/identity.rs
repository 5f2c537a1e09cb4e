//! End-to-end workload identity through the real binaries: pilot-discovery's CA on its secure
//! port (callers authenticated by `JWT_RULE`), pilot-agent with the pod's service account token
//! getting its certificate and serving it over SDS, and a real Envoy whose TLS listener takes its
//! certificate from the agent's SDS socket. `openssl s_client`, a client nobody here wrote,
//! checks what Envoy serves; the certificate is renewed under a stream of handshakes.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};
use test_support::agent::{Agent, AgentOptions};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::Envoy;
use test_support::ports::free_port;

const IDENTITY: &str = "spiffe://cluster.local/ns/istio-system/sa/default";

/// A static Envoy with one TLS listener on `port` whose certificate is the SDS secret `default`
/// from the agent's socket `sds`.
fn sds_listener_bootstrap(sds: &Path, port: u16) -> Value {
    let sds_config = json!({
        "resource_api_version": "V3",
        "api_config_source": {"api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}]}
    });
    json!({
        "node": {"id": "sidecar~127.0.0.1~sds-check.istio-system~istio-system.svc.cluster.local", "cluster": "sds-check"},
        "static_resources": {
            "clusters": [{
                "name": "sds-grpc", "type": "STATIC", "connect_timeout": "1s",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
                "load_assignment": {"cluster_name": "sds-grpc", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"pipe": {"path": sds}}}}]}]}
            }],
            "listeners": [{
                "name": "tls", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{
                    "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                        "common_tls_context": {
                            "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": sds_config}],
                            "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": sds_config}
                        }}},
                    "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "tls",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                    }}]
                }]
            }]
        }
    })
}

/// The certificate Envoy serves on `port`, as `openssl s_client` sees it after verifying it with
/// `root`: (serial, subject alternative names).
fn served_certificate(port: u16, root: &Path) -> anyhow::Result<(String, String)> {
    let handshake = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-verify_return_error",
            "-CAfile",
        ])
        .arg(root)
        .stdin(Stdio::null())
        .output()
        .context("running openssl s_client (is openssl installed?)")?;
    let text = String::from_utf8_lossy(&handshake.stdout).into_owned();
    ensure!(
        handshake.status.success() && text.contains("Verify return code: 0 (ok)"),
        "handshake failed: {}\n{text}",
        String::from_utf8_lossy(&handshake.stderr)
    );
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .context("no certificate in s_client's output")?;
    let end = text.find("-----END CERTIFICATE-----").context("no certificate end")? + "-----END CERTIFICATE-----".len();
    let mut x509 = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-ext", "subjectAltName"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    use std::io::Write;
    x509.stdin
        .take()
        .context("stdin")?
        .write_all(&text.as_bytes()[begin..end])?;
    let out = x509.wait_with_output()?;
    let info = String::from_utf8_lossy(&out.stdout).into_owned();
    let serial = info
        .lines()
        .find_map(|l| l.strip_prefix("serial="))
        .context("no serial")?
        .to_owned();
    let sans = info
        .lines()
        .skip_while(|l| !l.contains("Subject Alternative Name"))
        .nth(1)
        .unwrap_or_default()
        .trim()
        .to_owned();
    Ok((serial, sans))
}

/// pilot-discovery with its CA on a secure port (tokens checked by `JWT_RULE`), a gateway agent
/// that gets its identity there with `env`, and an Envoy serving the agent's SDS certificate on
/// `port`.
struct IdentitySetup {
    discovery: Discovery,
    agent: Agent,
    envoy: Envoy,
    root: std::path::PathBuf,
    port: u16,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn start_identity(env: &[(&str, &str)]) -> anyhow::Result<IdentitySetup> {
    let issuer = security::testing::TestIssuer::new("https://kubernetes.default.svc", "k1");
    let config = tempfile::tempdir()?;
    std::fs::write(config.path().join("gateway.yaml"), common::gateway_yaml(free_port()))?;
    let ca_dir = tempfile::tempdir()?;
    let secure = format!("127.0.0.1:{}", free_port());
    let rule = json!({"issuer": issuer.issuer, "jwks": issuer.jwks()}).to_string();
    let discovery = Discovery::start(
        config.path(),
        DiscoveryOptions {
            args: vec!["--secureGrpcAddr".into(), secure.clone()],
            env: vec![
                ("ROOT_CA_DIR".into(), ca_dir.path().display().to_string()),
                ("JWT_RULE".into(), rule),
            ],
            ..Default::default()
        },
    )
    .await?;
    let root = ca_dir.path().join("root-cert.pem");
    ensure!(root.is_file(), "no root certificate in ROOT_CA_DIR");

    // The gateway's agent: xDS and CA on the secure port, authenticated by its token.
    let mut opts = AgentOptions::ingress_gateway(discovery.grpc_addr);
    opts.proxy_config = json!({"discoveryAddress": secure, "controlPlaneAuthPolicy": "MUTUAL_TLS"});
    opts.env = vec![("XDS_ROOT_CA".into(), root.display().to_string())];
    opts.env
        .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    opts.files = vec![(
        "var/run/secrets/tokens/istio-token".into(),
        issuer.token("istio-system", "default", &["istio-ca"], 3600),
    )];
    let mut agent = Agent::start(opts).await?;
    agent.wait_ready(Duration::from_secs(30)).await?;

    let port = free_port();
    let envoy = Envoy::start(sds_listener_bootstrap(&agent.dir.path().join("SDS"), port)).await?;
    envoy.wait_ready(Duration::from_secs(20)).await.with_context(|| {
        format!(
            "Envoy never got its SDS secrets:\n{}\n{}",
            envoy.log_tail(),
            agent.logs()
        )
    })?;
    Ok(IdentitySetup {
        discovery,
        agent,
        envoy,
        root,
        port,
        _dirs: (config, ca_dir),
    })
}

#[tokio::test]
async fn the_agent_gets_its_identity_from_the_ca_serves_it_over_sds_and_renews_it_without_failures()
-> anyhow::Result<()> {
    let IdentitySetup {
        discovery,
        agent,
        envoy,
        root,
        port,
        _dirs,
    } = start_identity(&[("SECRET_TTL", "8s"), ("SECRET_GRACE_PERIOD_RATIO", "0.5")]).await?;
    let (first_serial, sans) = served_certificate(port, &root)?;
    assert_eq!(
        sans,
        format!("URI:{IDENTITY}"),
        "the certificate names the token's identity only"
    );
    let (_, certs) = envoy.admin_get("/certs").await?;
    assert!(certs.contains(IDENTITY), "{certs}");

    // Renewal at half of an 8 s life, under a stream of handshakes: none fails, the serial moves.
    let mut serials = vec![first_serial];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut handshakes = 0;
    while Instant::now() < deadline {
        let (serial, sans) = served_certificate(port, &root).with_context(|| agent.logs())?;
        assert_eq!(sans, format!("URI:{IDENTITY}"));
        if serials.last() != Some(&serial) {
            serials.push(serial);
        }
        handshakes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // one renewal every ~4 s: two or three certificates in 10 s, not one per handshake
    if !(2..=4).contains(&serials.len()) {
        bail!(
            "{} certificates served in 10 s ({handshakes} handshakes); want a renewal every ~4 s:\n{}",
            serials.len(),
            agent.logs()
        );
    }
    assert_eq!(envoy.update_rejected_total().await?, 0);
    let (_, metrics) = discovery.get("/metrics", true).await?;
    assert!(
        metrics.contains("citadel_server_success_cert_issuance_count")
            && !metrics.contains("citadel_server_success_cert_issuance_count 0"),
        "{metrics}"
    );
    println!(
        "{handshakes} handshakes, {} certificates served, none failed",
        serials.len()
    );
    Ok(())
}

/// `ECC_SIGNATURE_ALGORITHM=RSA`: the agent makes an RSA key of `WORKLOAD_RSA_KEY_SIZE` bits, the
/// CA signs it, and Envoy serves it (as `openssl` sees the handshake).
#[tokio::test]
async fn rsa_workload_keys_on_request() -> anyhow::Result<()> {
    let setup = start_identity(&[("ECC_SIGNATURE_ALGORITHM", "RSA"), ("WORKLOAD_RSA_KEY_SIZE", "3072")]).await?;
    let (_, sans) = served_certificate(setup.port, &setup.root)?;
    assert_eq!(sans, format!("URI:{IDENTITY}"));
    let handshake = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{}", setup.port), "-CAfile"])
        .arg(&setup.root)
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&handshake.stdout);
    assert!(
        text.contains("Server public key is 3072 bit"),
        "not a 3072-bit RSA key:\n{text}\n{}",
        setup.agent.logs()
    );
    assert_eq!(setup.envoy.update_rejected_total().await?, 0);
    drop(setup.discovery);
    Ok(())
}
