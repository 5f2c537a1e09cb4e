//! End-to-end: gateway servers that are not HTTP, and Service port translation, with a real Envoy
//! gateway fed by a real pilot-discovery. Istio's "Ingress gateway without TLS termination" task
//! (a PASSTHROUGH server routing by SNI to HTTPS backends that keep their own certificates, checked
//! by the client), a TCP server with a `tcp` route, the east-west gateway's AUTO_PASSTHROUGH
//! server (an Istio mTLS client's SNI `outbound_.<port>_._.<host>` and ALPN reach the workload
//! through the SNI-DNAT cluster; a workload without a sidecar is not reachable), and a Gateway on
//! port 80 served on the target port of the gateway's Service, as `istioctl install` sets it up.
//! `openssl s_server` and `s_client`, written by nobody here, are the TLS backends and client.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::{Ads, TlsServer};
use test_support::backend::{Backend, http_get};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::Envoy;
use test_support::ports::free_port;
use test_support::tls::{HttpsClient, TestCa};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A line-echo TCP server on 127.0.0.1: answers each line with `echo <line>`.
async fn tcp_echo() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("echo {line}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// One line over plain TCP to `addr`, and the line answered.
async fn tcp_round_trip(addr: SocketAddr, line: &str) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(format!("{line}\n").as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        anyhow::Ok(answer.trim_end().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .context("no answer in 5s")?
}

/// `openssl s_client` to `addr` with `sni` and `alpn`, trusting `ca`: the peer certificate's subject
/// when the handshake completes and verifies, else an error with s_client's output.
fn s_client(addr: SocketAddr, sni: &str, alpn: Option<&str>, ca: &Path) -> anyhow::Result<String> {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &addr.to_string(),
        "-servername",
        sni,
        "-verify_return_error",
        "-CAfile",
    ])
    .arg(ca);
    if let Some(a) = alpn {
        cmd.args(["-alpn", a]);
    }
    let out = cmd.stdin(Stdio::null()).output().context("running openssl s_client")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("Verify return code: 0 (ok)") {
        bail!(
            "handshake for SNI {sni} failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text.lines()
        .find(|l| l.starts_with("subject="))
        .map(|l| l.trim().to_owned())
        .context("no subject in s_client's output")
}

struct Setup {
    _dir: tempfile::TempDir,
    discovery: Discovery,
    envoy: Envoy,
    ca_file: std::path::PathBuf,
    ca: TestCa,
    _servers: Vec<TlsServer>,
    http_backend: Backend,
    ports: Ports,
}

struct Ports {
    /// The gateway Service's target port for its port 80.
    http_target: u16,
    passthrough: u16,
    tcp: u16,
    east_west: u16,
}

fn config(ports: &Ports, nginx: u16, other: u16, echo: u16, mtls: u16, plain: u16, http: u16) -> String {
    let Ports {
        http_target,
        passthrough,
        tcp,
        east_west,
    } = ports;
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 80, name: http, protocol: HTTP}}
    hosts: ["*"]
  - port: {{number: {passthrough}, name: tls, protocol: TLS}}
    hosts: ["*.example.com"]
    tls: {{mode: PASSTHROUGH}}
  - port: {{number: {tcp}, name: tcp, protocol: TCP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: cross-network-gateway, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {east_west}, name: tls, protocol: TLS}}
    hosts: ["*.local"]
    tls: {{mode: AUTO_PASSTHROUGH}}
---
# The gateway's own Service, as `istioctl install` makes it: port 80 targets another port.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: istio-ingressgateway, namespace: istio-system}}
spec:
  hosts: [istio-ingressgateway.istio-system.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {{number: 80, name: http2, protocol: HTTP, targetPort: {http_target}}}
  endpoints:
  - address: 127.0.0.1
    labels: {{istio: ingressgateway}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: backends, namespace: default}}
spec:
  hosts: [nginx.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8443, name: https, protocol: TLS}}]
  endpoints: [{{address: 127.0.0.1, ports: {{https: {nginx}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: other, namespace: default}}
spec:
  hosts: [other.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8443, name: https, protocol: TLS}}]
  endpoints: [{{address: 127.0.0.1, ports: {{https: {other}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: tcp-echo, namespace: default}}
spec:
  hosts: [tcp-echo.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9000, name: tcp, protocol: TCP}}]
  endpoints: [{{address: 127.0.0.1, ports: {{tcp: {echo}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: default}}
spec:
  hosts: [web.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  endpoints: [{{address: 127.0.0.1, ports: {{http: {http}}}}}]
---
# Behind the east-west gateway: one workload with a sidecar (a service account: Istio mTLS), one
# without, each its own service.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 127.0.0.1, ports: {{http: {mtls}}}, serviceAccount: reviews}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: legacy, namespace: default}}
spec:
  hosts: [legacy.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: 127.0.0.1, ports: {{http: {plain}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: sni, namespace: default}}
spec:
  hosts: [nginx.example.com, other.example.com]
  gateways: [istio-system/gw]
  tls:
  - match: [{{port: {passthrough}, sniHosts: [nginx.example.com]}}]
    route: [{{destination: {{host: nginx.default.svc.cluster.local, port: {{number: 8443}}}}}}]
  - match: [{{port: {passthrough}, sniHosts: [other.example.com]}}]
    route: [{{destination: {{host: other.default.svc.cluster.local, port: {{number: 8443}}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: tcp, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [istio-system/gw]
  tcp:
  - match: [{{port: {tcp}}}]
    route: [{{destination: {{host: tcp-echo.default.svc.cluster.local, port: {{number: 9000}}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: default}}
spec:
  hosts: [web.example.com]
  gateways: [istio-system/gw]
  http:
  - match: [{{port: 80}}]
    route: [{{destination: {{host: web.default.svc.cluster.local}}}}]
"#
    )
}

async fn start(ads: Ads) -> anyhow::Result<Setup> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new("pilot-rs gateway-tcp root")?;
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem())?;
    let mut servers = Vec::new();
    for (name, sni) in [
        ("nginx", "nginx.example.com"),
        ("other", "other.example.com"),
        ("reviews", "reviews.default.svc.cluster.local"),
        ("legacy", "legacy.default.svc.cluster.local"),
    ] {
        servers.push(TlsServer::start(dir.path(), name, &ca.issue_server(&[sni])?, None).await?);
    }
    let echo = tcp_echo().await?;
    let http_backend = Backend::start("web").await?;
    let ports = Ports {
        http_target: free_port(),
        passthrough: free_port(),
        tcp: free_port(),
        east_west: free_port(),
    };
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir)?;
    std::fs::write(
        config_dir.join("mesh.yaml"),
        config(
            &ports,
            servers[0].port,
            servers[1].port,
            echo,
            servers[2].port,
            servers[3].port,
            http_backend.port(),
        ),
    )?;
    let discovery = Discovery::start(&config_dir, DiscoveryOptions::default()).await?;
    let envoy = common::start_gateway_envoy(&discovery, ads).await?;
    Ok(Setup {
        _dir: dir,
        discovery,
        envoy,
        ca_file,
        ca,
        _servers: servers,
        http_backend,
        ports,
    })
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn check(setup: &Setup) -> anyhow::Result<()> {
    let Setup { envoy, ports, ca, .. } = setup;
    let expected = [
        format!("0.0.0.0_{}", ports.http_target),
        format!("0.0.0.0_{}", ports.passthrough),
        format!("0.0.0.0_{}", ports.tcp),
        format!("0.0.0.0_{}", ports.east_west),
    ];
    // Envoy is LIVE once its first listeners are active; the HTTP one may still wait for its
    // route configuration
    let deadline = Instant::now() + Duration::from_secs(10);
    let listeners = loop {
        let listeners = envoy.listener_addresses().await?;
        if expected.iter().all(|n| listeners.contains_key(n)) || Instant::now() > deadline {
            break listeners;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let names: Vec<&String> = listeners.keys().collect();
    for name in &expected {
        ensure!(listeners.contains_key(name), "no listener {name} in {names:?}");
    }
    ensure!(
        !listeners.contains_key("0.0.0.0_80"),
        "port 80 is the Service's: the gateway listens on its target port"
    );

    // Port translation: the Gateway's port 80 is served on the Service's target port, and the
    // VirtualService's `port: 80` match still applies there.
    let r = http_get(
        &format!("http://127.0.0.1:{}/", ports.http_target),
        &[("host", "web.example.com")],
    )
    .await?;
    ensure!(
        r.status == 200,
        "HTTP through the translated port: {} {}",
        r.status,
        r.body
    );
    ensure!(setup.http_backend.count() == 1, "the web backend got the request");

    // Ingress gateway without TLS termination: each SNI reaches its own backend, whose own
    // certificate the client verifies.
    let client = HttpsClient::trusting(ca)?;
    for host in ["nginx.example.com", "other.example.com"] {
        let r = client.get(local(ports.passthrough), host, host, "/", &[]).await?;
        ensure!(
            r.status == 200,
            "{host} through the passthrough server: {} {}",
            r.status,
            r.body
        );
    }
    ensure!(
        client
            .get(
                local(ports.passthrough),
                "unknown.example.com",
                "unknown.example.com",
                "/",
                &[]
            )
            .await
            .is_err(),
        "an SNI without a route has no chain"
    );

    // TCP server: the tcp route forwards the bytes.
    let answer = tcp_round_trip(local(ports.tcp), "hello").await?;
    ensure!(answer == "echo hello", "TCP through the gateway answered {answer:?}");

    // AUTO_PASSTHROUGH: what an Istio mTLS client of another network sends reaches the workload,
    // whose certificate comes back untouched.
    let ew = local(ports.east_west);
    let ca_file = setup.ca_file.clone();
    let subject = tokio::task::spawn_blocking(move || {
        s_client(
            ew,
            "outbound_.9080_._.reviews.default.svc.cluster.local",
            Some("istio"),
            &ca_file,
        )
    })
    .await??;
    ensure!(
        subject.contains("reviews.default.svc.cluster.local"),
        "the workload's own certificate: {subject}"
    );
    let ca_file = setup.ca_file.clone();
    let legacy = tokio::task::spawn_blocking(move || {
        s_client(
            ew,
            "outbound_.9080_._.legacy.default.svc.cluster.local",
            Some("istio"),
            &ca_file,
        )
    })
    .await?;
    ensure!(
        legacy.is_err(),
        "a workload without a sidecar is not reachable through AUTO_PASSTHROUGH"
    );
    let ca_file = setup.ca_file.clone();
    let no_alpn = tokio::task::spawn_blocking(move || {
        s_client(
            ew,
            "outbound_.9080_._.reviews.default.svc.cluster.local",
            None,
            &ca_file,
        )
    })
    .await?;
    ensure!(no_alpn.is_err(), "without Istio's mTLS ALPN no chain matches");

    ensure!(envoy.update_rejected_total().await? == 0, "Envoy rejected config");
    ensure!(
        setup.discovery.metric("pilot_total_xds_rejects").await? == 0.0,
        "pilot-discovery saw NACKs:\n{}",
        setup.discovery.logs()
    );
    Ok(())
}

#[tokio::test]
async fn tcp_tls_passthrough_and_east_west_servers_carry_traffic_over_sotw() -> anyhow::Result<()> {
    let setup = start(Ads::Sotw).await?;
    check(&setup).await.with_context(|| setup.envoy.log_tail())
}

#[tokio::test]
async fn tcp_tls_passthrough_and_east_west_servers_carry_traffic_over_delta() -> anyhow::Result<()> {
    let setup = start(Ads::Delta).await?;
    check(&setup).await.with_context(|| setup.envoy.log_tail())
}

/// The status line of a raw HTTP/1.0 request for `host` to `port`.
async fn http10_status(port: u16, host: &str) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET /reviews HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).await?;
        anyhow::Ok(line.trim_end().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .context("no answer in 5s")?
}

/// `PILOT_HTTP10=true` (Istio's flag) makes the gateway's HCM accept HTTP/1.0; without it, Envoy
/// answers 426 Upgrade Required, as with istiod.
#[tokio::test]
async fn pilot_http10_lets_http_1_0_clients_through() -> anyhow::Result<()> {
    let without = common::GatewayMesh::start().await?;
    let status = http10_status(without.gateway_port, common::HOST).await?;
    ensure!(status.starts_with("HTTP/1.1 426"), "without PILOT_HTTP10: {status}");
    let opts = DiscoveryOptions {
        env: vec![("PILOT_HTTP10".into(), "true".into())],
        ..Default::default()
    };
    let with = common::GatewayMesh::start_with_options(Ads::Sotw, serde_json::json!({}), opts).await?;
    let status = http10_status(with.gateway_port, common::HOST).await?;
    ensure!(status.starts_with("HTTP/1.0 200"), "with PILOT_HTTP10: {status}");
    ensure!(with.envoy.update_rejected_total().await? == 0, "Envoy rejected config");
    Ok(())
}
