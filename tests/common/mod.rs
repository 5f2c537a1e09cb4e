//! A gateway mesh for end-to-end tests: loopback backends, a config directory describing them as
//! ServiceEntries/WorkloadEntries behind an Istio Gateway, a real pilot-discovery on it, and a real
//! Envoy acting as the ingress gateway (bootstrap written here until pilot-agent exists).

#![allow(dead_code)]

pub mod istiod;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use test_support::backend::{Backend, BackendOptions, HttpResponse, http_get};
use test_support::bootstrap::{AdsBootstrap, SecureXds};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::Envoy;
use test_support::mesh_ca::MeshCa;
use test_support::ports::free_port;

pub const HOST: &str = "bookinfo.example.com";
pub const NODE_ID: &str = "router~127.0.0.1~istio-ingressgateway-e2e.istio-system~istio-system.svc.cluster.local";

pub struct GatewayMesh {
    pub dir: tempfile::TempDir,
    pub backends: BTreeMap<&'static str, Backend>,
    pub discovery: Discovery,
    pub envoy: Envoy,
    pub gateway_port: u16,
}

/// SotW or delta ADS between Envoy and pilot-discovery.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ads {
    Sotw,
    Delta,
}

impl GatewayMesh {
    pub async fn start() -> anyhow::Result<GatewayMesh> {
        Self::start_with(Ads::Sotw).await
    }

    pub async fn start_with(ads: Ads) -> anyhow::Result<GatewayMesh> {
        Self::start_with_metadata(ads, json!({})).await
    }

    /// A mesh whose gateway's node metadata also carries `metadata` (e.g. `PROXY_CONFIG`).
    pub async fn start_with_metadata(ads: Ads, metadata: serde_json::Value) -> anyhow::Result<GatewayMesh> {
        Self::start_with_options(ads, metadata, DiscoveryOptions::default()).await
    }

    /// A mesh whose pilot-discovery runs with `options` (e.g. other `PILOT_*` settings).
    pub async fn start_with_options(
        ads: Ads,
        metadata: serde_json::Value,
        options: DiscoveryOptions,
    ) -> anyhow::Result<GatewayMesh> {
        let mut backends = BTreeMap::new();
        for name in ["reviews-v1", "reviews-v2", "ratings"] {
            backends.insert(name, Backend::start(name).await?);
        }
        let slow = BackendOptions {
            delay: Duration::from_secs(3),
            ..Default::default()
        };
        backends.insert("slow", Backend::start_with("slow", slow).await?);
        let gateway_port = free_port();
        let dir = tempfile::tempdir()?;
        write_mesh_config(dir.path(), gateway_port, &backends)?;
        let discovery = Discovery::start(dir.path(), options).await?;
        let envoy = start_gateway_envoy_with(&discovery, ads, metadata).await?;
        let mesh = GatewayMesh {
            dir,
            backends,
            discovery,
            envoy,
            gateway_port,
        };
        mesh.wait_for(Duration::from_secs(20), |r| r.status == 200, "/reviews", &[])
            .await?;
        Ok(mesh)
    }

    pub fn backend(&self, name: &str) -> &Backend {
        &self.backends[name]
    }

    /// A request through the gateway for `bookinfo.example.com`.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<HttpResponse> {
        let mut h = vec![("host", HOST)];
        h.extend_from_slice(headers);
        http_get(&format!("http://127.0.0.1:{}{}", self.gateway_port, path), &h).await
    }

    /// The backend that answered (from its JSON echo), or None for non-backend answers.
    pub async fn who(&self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Option<String>> {
        let r = self.get(path, headers).await?;
        if r.status != 200 {
            return Ok(None);
        }
        Ok(r.json().ok().and_then(|v| v["backend"].as_str().map(str::to_owned)))
    }

    /// Polls a request until `pred` holds (config propagation is asynchronous).
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&HttpResponse) -> bool,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<HttpResponse> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.get(path, headers).await;
            if let Ok(r) = &last
                && pred(r)
            {
                return last;
            }
            if Instant::now() > deadline {
                bail!(
                    "condition not met for {path} within {timeout:?}; last: {last:?}\n--- pilot-discovery log ---\n{}\n--- envoy log ---\n{}",
                    self.discovery.logs(),
                    self.envoy.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls until `n` requests in a row are answered by `backend` (a config change has landed).
    pub async fn wait_for_backend(
        &self,
        backend: &str,
        n: usize,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut in_a_row = 0;
        while in_a_row < n {
            let who = self.who(path, headers).await?;
            if who.as_deref() == Some(backend) {
                in_a_row += 1;
            } else {
                in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if Instant::now() > deadline {
                bail!(
                    "{path} not consistently routed to {backend} within 15s (last: {who:?})\n--- pilot-discovery log ---\n{}",
                    self.discovery.logs()
                );
            }
        }
        Ok(())
    }

    pub fn write(&self, file: &str, yaml: &str) -> anyhow::Result<()> {
        let path = self.dir.path().join(file);
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn remove(&self, file: &str) -> anyhow::Result<()> {
        std::fs::remove_file(self.dir.path().join(file))?;
        Ok(())
    }

    /// Envoy rejected nothing pilot sent.
    pub async fn assert_no_rejects(&self) -> anyhow::Result<()> {
        let rejected = self.envoy.update_rejected_total().await?;
        if rejected != 0 {
            bail!(
                "Envoy rejected config ({rejected} update_rejected):\n{}",
                self.envoy.log_tail()
            );
        }
        let nacks = self.discovery.metric("pilot_total_xds_rejects").await?;
        if nacks != 0.0 {
            bail!("pilot counted {nacks} NACKs:\n{}", self.discovery.logs());
        }
        Ok(())
    }
}

pub fn gateway_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: bookinfo-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {port}, name: http, protocol: HTTP}}
    hosts: ["{HOST}"]
"#
    )
}

pub fn workload_entry_yaml(name: &str, version: &str, port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: default}}
spec:
  address: 127.0.0.1
  ports: {{http: {port}}}
  labels: {{app: reviews, version: {version}}}
"#
    )
}

pub fn services_yaml(ratings_port: u16, slow_port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.default.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ratings, namespace: default}}
spec:
  hosts: [ratings.default.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP, targetPort: {ratings_port}}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: slow, namespace: default}}
spec:
  hosts: [slow.default.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP, targetPort: {slow_port}}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: default}}
spec:
  host: reviews.default.svc.cluster.local
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
"#
    )
}

/// The routing under test. `v1_weight` of /reviews goes to v1, the rest to v2.
pub fn virtual_service_yaml(v1_weight: u32) -> String {
    let v2_weight = 100 - v1_weight;
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: bookinfo, namespace: default}}
spec:
  hosts: ["{HOST}"]
  gateways: [bookinfo-gateway]
  http:
  - name: jason
    match:
    - headers: {{end-user: {{exact: jason}}}}
      uri: {{prefix: /reviews}}
    route:
    - destination: {{host: reviews, subset: v2}}
  - name: reviews-split
    match: [{{uri: {{prefix: /reviews}}}}]
    route:
    - destination: {{host: reviews, subset: v1}}
      weight: {v1_weight}
    - destination: {{host: reviews, subset: v2}}
      weight: {v2_weight}
  - name: ratings
    match: [{{uri: {{prefix: /ratings}}}}]
    rewrite: {{uri: /v1/ratings, authority: ratings.internal}}
    route:
    - destination: {{host: ratings.default.svc.cluster.local, port: {{number: 9080}}}}
    headers:
      request:
        set: {{x-routed-by: pilot-rs}}
  - name: old
    match: [{{uri: {{exact: /productpage-old}}}}]
    redirect: {{uri: /productpage, redirectCode: 302}}
  - name: fault
    match: [{{uri: {{prefix: /fault}}}}]
    fault:
      abort: {{httpStatus: 418, percentage: {{value: 100}}}}
    route:
    - destination: {{host: ratings.default.svc.cluster.local}}
  - name: slow
    match: [{{uri: {{prefix: /slow}}}}]
    timeout: 0.5s
    retries: {{attempts: 0}}
    route:
    - destination: {{host: slow.default.svc.cluster.local}}
"#
    )
}

pub fn write_mesh_config(
    dir: &Path,
    gateway_port: u16,
    backends: &BTreeMap<&'static str, Backend>,
) -> anyhow::Result<()> {
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(gateway_port))?;
    std::fs::write(
        dir.join("services.yaml"),
        services_yaml(backends["ratings"].port(), backends["slow"].port()),
    )?;
    std::fs::write(
        dir.join("reviews-v1.yaml"),
        workload_entry_yaml("reviews-v1", "v1", backends["reviews-v1"].port()),
    )?;
    std::fs::write(
        dir.join("reviews-v2.yaml"),
        workload_entry_yaml("reviews-v2", "v2", backends["reviews-v2"].port()),
    )?;
    std::fs::write(dir.join("virtual-service.yaml"), virtual_service_yaml(75))?;
    Ok(())
}

/// A real Envoy as the ingress gateway (node `NODE_ID`, labels `istio=ingressgateway`) on
/// `discovery`'s ADS, once it is LIVE.
pub async fn start_gateway_envoy(discovery: &Discovery, ads: Ads) -> anyhow::Result<Envoy> {
    start_gateway_envoy_with(discovery, ads, json!({})).await
}

/// [`start_gateway_envoy`] with `extra` node metadata.
pub async fn start_gateway_envoy_with(
    discovery: &Discovery,
    ads: Ads,
    extra: serde_json::Value,
) -> anyhow::Result<Envoy> {
    let envoy = Envoy::start(gateway_bootstrap(discovery.grpc_addr, ads, extra, None).build()).await?;
    envoy
        .wait_ready(Duration::from_secs(20))
        .await
        .with_context(|| discovery.logs())?;
    Ok(envoy)
}

/// The service account of the ingress gateway (Istio's default install).
pub const GATEWAY_SERVICE_ACCOUNT: &str = "istio-ingressgateway-service-account";

/// [`start_gateway_envoy`] as an authenticated proxy, the way a gateway that is served
/// credentials (`credentialName`) connects: over TLS to `ca`'s secure port (which `discovery`
/// must serve, see `MeshCa::serve`), trusting the mesh root, with a token of the gateway's
/// service account in istio-system.
pub async fn start_secure_gateway_envoy(discovery: &Discovery, ads: Ads, ca: &MeshCa) -> anyhow::Result<Envoy> {
    anyhow::ensure!(!ca.plaintext, "a secure gateway needs the CA on a secure port");
    let secure = SecureXds::new(ca.root_cert(), ca.token("istio-system", GATEWAY_SERVICE_ACCOUNT));
    let envoy = Envoy::start(gateway_bootstrap(ca.addr, ads, json!({}), Some(secure)).build()).await?;
    envoy
        .wait_ready(Duration::from_secs(20))
        .await
        .with_context(|| discovery.logs())?;
    Ok(envoy)
}

/// The bootstrap of the ingress gateway (node `NODE_ID`, labels `istio=ingressgateway`) on the
/// ADS of `xds_addr`, with `extra` node metadata, over TLS with a token when `secure` is set.
pub fn gateway_bootstrap(
    xds_addr: std::net::SocketAddr,
    ads: Ads,
    extra: serde_json::Value,
    secure: Option<SecureXds>,
) -> AdsBootstrap {
    let mut metadata = json!({
        "NAMESPACE": "istio-system",
        "LABELS": {"istio": "ingressgateway", "app": "istio-ingressgateway"},
        "CLUSTER_ID": "Kubernetes",
        "ISTIO_VERSION": "1.28.0",
    });
    if let (Some(m), Some(extra)) = (metadata.as_object_mut(), extra.as_object()) {
        m.extend(extra.clone());
    }
    let mut bootstrap = AdsBootstrap::new(NODE_ID, "istio-ingressgateway.istio-system", metadata, xds_addr);
    if ads == Ads::Delta {
        bootstrap = bootstrap.delta();
    }
    if let Some(secure) = secure {
        bootstrap = bootstrap.secure(secure);
    }
    bootstrap
}

/// `openssl s_server -www` (a TLS server nobody here wrote) on 127.0.0.1 with `cert`, requiring a
/// client certificate of `client_ca` when given; killed on drop.
pub struct TlsServer {
    child: std::process::Child,
    pub port: u16,
}

impl TlsServer {
    /// Starts it and waits until it listens.
    pub async fn start(
        dir: &Path,
        name: &str,
        cert: &test_support::tls::IssuedCert,
        client_ca: Option<&test_support::tls::TestCa>,
    ) -> anyhow::Result<TlsServer> {
        let files = cert.write(dir, name)?;
        let port = free_port();
        let mut cmd = std::process::Command::new("openssl");
        cmd.args([
            "s_server",
            "-quiet",
            "-www",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-cert",
        ])
        .arg(&files.cert)
        .arg("-key")
        .arg(&files.key);
        if let Some(ca) = client_ca {
            let ca_file = dir.join(format!("{name}-client-ca.pem"));
            std::fs::write(&ca_file, ca.cert_pem())?;
            cmd.args(["-Verify", "1", "-verify_return_error", "-CAfile"])
                .arg(ca_file);
        }
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting `openssl s_server` (is openssl installed?)")?;
        let server = TlsServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if Instant::now() > deadline {
                bail!("openssl s_server never listened on {port}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(server)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A VirtualService of the gateway that sends everything to reviews:9080 (the Kubernetes tests'
/// Service).
pub fn reviews_virtual_service() -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: bookinfo, namespace: default}}
spec:
  hosts: ["{HOST}"]
  gateways: [bookinfo-gateway]
  http:
  - route: [{{destination: {{host: reviews.default.svc.cluster.local, port: {{number: 9080}}}}}}]
"#
    )
}

/// Who answers `HOST` through the gateway: the backend's name, else the status (`503`), else
/// the error.
pub async fn answer(gateway: u16) -> String {
    match http_get(&format!("http://127.0.0.1:{gateway}/"), &[("host", HOST)]).await {
        Ok(r) if r.status == 200 => r
            .json()
            .ok()
            .and_then(|v: serde_json::Value| v["backend"].as_str().map(str::to_owned))
            .unwrap_or_default(),
        Ok(r) => r.status.to_string(),
        Err(e) => e.to_string(),
    }
}

/// `expected` ([`answer`]) answers 5 requests in a row through the gateway, within 20 s.
pub async fn answered_by(gateway: u16, expected: &str, discovery: &Discovery) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut in_a_row, mut last) = (0, String::new());
    while in_a_row < 5 {
        let who = answer(gateway).await;
        if who == expected {
            in_a_row += 1;
        } else {
            in_a_row = 0;
            last = who;
        }
        if Instant::now() > deadline {
            bail!(
                "{expected} did not answer 5 in a row within 20 s (last: {last})\n{}",
                discovery.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
