//! End-to-end: a real pilot-discovery with `--registries Consul` on test-support's fake Consul,
//! and a real Envoy ingress gateway that routes by the README's VirtualService to the Consul
//! service `web.service.consul` (subsets by the `version|v1` tags). Registering and deregistering an
//! instance in Consul moves traffic within a second; a malformed answer from Consul is named in
//! the log, counted, and leaves the routing as it was until Consul answers well again. Envoy
//! rejects nothing.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::bail;
use common::{Ads, HOST, gateway_yaml, start_gateway_envoy};
use test_support::backend::{Backend, BackendOptions, http_get};
use test_support::consul::{FakeConsul, Fault, Instance};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::Envoy;
use test_support::ports::free_port;

/// The README's VirtualService and DestinationRule for `web.service.consul`, as written
/// (`end-user: jason` to subset v2, the rest to the whole service).
fn routing_yaml() -> anyhow::Result<String> {
    let readme = std::fs::read_to_string(test_support::envoy::workspace_root()?.join("README.md"))?;
    readme
        .split("```yaml\n")
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("host: web.service.consul"))
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("README.md has no example routing to web.service.consul"))
}

/// The Consul instance of backend `name` (`web-v1`: version v1 on 127.0.0.2, node-1; `web-v2`:
/// v2 on 127.0.0.3, node-2), protocol HTTP.
fn instance(name: &str, port: u16) -> Instance {
    let (ip, version, node) = match name {
        "web-v1" => ("127.0.0.2", "v1", "node-1"),
        _ => ("127.0.0.3", "v2", "node-2"),
    };
    Instance::new("web", name, node, ip, port)
        .meta("protocol", "http")
        .tag(&format!("version|{version}"))
        .tag("app|web")
}

struct ConsulMesh {
    consul: FakeConsul,
    /// web-v1 on 127.0.0.2, web-v2 on 127.0.0.3, all on `port`, as instances on two hosts.
    backends: Vec<Backend>,
    port: u16,
    _dir: tempfile::TempDir,
    discovery: Discovery,
    envoy: Envoy,
    gateway_port: u16,
}

impl ConsulMesh {
    /// Consul holds web-v1; pilot-discovery reads it; the gateway routes to it.
    async fn start() -> anyhow::Result<ConsulMesh> {
        let consul = FakeConsul::start().await?;
        let port = free_port();
        let mut backends = Vec::new();
        for (name, ip) in [("web-v1", [127, 0, 0, 2]), ("web-v2", [127, 0, 0, 3])] {
            let options = BackendOptions {
                ip: Some(Ipv4Addr::from(ip)),
                port: Some(port),
                ..Default::default()
            };
            backends.push(Backend::start_with(name, options).await?);
        }
        let gateway_port = free_port();
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("gateway.yaml"), gateway_yaml(gateway_port))?;
        std::fs::write(dir.path().join("web.yaml"), routing_yaml()?)?;
        consul.register(instance("web-v1", port));
        let options = DiscoveryOptions {
            args: vec![
                "--registries".into(),
                "Consul".into(),
                "--consulserverURL".into(),
                consul.url(),
            ],
            ..Default::default()
        };
        let discovery = Discovery::start(dir.path(), options).await?;
        let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
        let mesh = ConsulMesh {
            consul,
            backends,
            port,
            _dir: dir,
            discovery,
            envoy,
            gateway_port,
        };
        mesh.until(Duration::from_secs(20), "web-v1", &[]).await?;
        Ok(mesh)
    }

    fn instance(&self, name: &str) -> Instance {
        instance(name, self.port)
    }

    /// Which backend answered a request through the gateway (`None`: not a backend's answer).
    async fn who(&self, headers: &[(&str, &str)]) -> anyhow::Result<Option<String>> {
        let mut h = vec![("host", HOST)];
        h.extend_from_slice(headers);
        let r = http_get(&format!("http://127.0.0.1:{}/", self.gateway_port), &h).await?;
        if r.status != 200 {
            return Ok(None);
        }
        Ok(r.json().ok().and_then(|v| v["backend"].as_str().map(str::to_owned)))
    }

    /// How long until `backend` answers 10 requests in a row, polling every 20 ms from now:
    /// the time of the first of them.
    async fn until(&self, timeout: Duration, backend: &str, headers: &[(&str, &str)]) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let mut streak: Option<Duration> = None;
        let mut in_a_row = 0;
        while in_a_row < 10 {
            let at = t0.elapsed();
            let who = self.who(headers).await?;
            if who.as_deref() == Some(backend) {
                streak.get_or_insert(at);
                in_a_row += 1;
            } else {
                streak = None;
                in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if t0.elapsed() > timeout {
                bail!(
                    "not routed to {backend} within {timeout:?} (last: {who:?})\n--- pilot-discovery ---\n{}\n--- envoy ---\n{}",
                    self.discovery.logs(),
                    self.envoy.log_tail()
                );
            }
        }
        Ok(streak.unwrap_or_default())
    }

    async fn assert_no_rejects(&self) -> anyhow::Result<()> {
        let rejected = self.envoy.update_rejected_total().await?;
        anyhow::ensure!(rejected == 0, "Envoy rejected config:\n{}", self.envoy.log_tail());
        let nacks = self.discovery.metric("pilot_total_xds_rejects").await?;
        anyhow::ensure!(nacks == 0.0, "pilot counted {nacks} NACKs:\n{}", self.discovery.logs());
        Ok(())
    }
}

#[tokio::test]
async fn registering_and_deregistering_in_consul_moves_traffic_within_a_second() -> anyhow::Result<()> {
    let mesh = ConsulMesh::start().await?;
    // no v2 instance yet: subset v2 has no endpoint
    let jason = [("end-user", "jason")];
    assert_eq!(mesh.who(&jason).await?, None);

    mesh.consul.register(mesh.instance("web-v2"));
    let took = mesh.until(Duration::from_secs(10), "web-v2", &jason).await?;
    eprintln!("registered web-v2: routed to it after {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "registration took {took:?} to move traffic"
    );
    // the rest is spread over both instances
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        seen.extend(mesh.who(&[]).await?);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["web-v1", "web-v2"]);

    assert!(mesh.consul.deregister("node-1", "web-v1"));
    let took = mesh.until(Duration::from_secs(10), "web-v2", &[]).await?;
    eprintln!("deregistered web-v1: all traffic on web-v2 after {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "deregistration took {took:?} to move traffic"
    );
    let before = mesh.backends[0].count();
    for _ in 0..20 {
        assert_eq!(mesh.who(&[]).await?.as_deref(), Some("web-v2"));
    }
    assert_eq!(mesh.backends[0].count(), before, "web-v1 still got requests");
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn a_malformed_consul_answer_is_counted_and_changes_nothing() -> anyhow::Result<()> {
    let mesh = ConsulMesh::start().await?;
    mesh.consul.fault("/v1/catalog/service/web", Fault::Malformed);
    mesh.consul.register(mesh.instance("web-v2"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while mesh.discovery.metric("pilot_consul_errors{type=\"malformed\"}").await? == 0.0 {
        if Instant::now() > deadline {
            bail!("no malformed answer counted:\n{}", mesh.discovery.logs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = format!("{}/v1/catalog/service/web", mesh.consul.url());
    let logs = mesh.discovery.logs();
    assert!(
        logs.lines().any(|l| l.contains(&url) && l.contains("not valid JSON")),
        "no log line names {url}:\n{logs}"
    );
    // what was served stays: web-v1 only, nothing in subset v2
    for _ in 0..20 {
        assert_eq!(mesh.who(&[]).await?.as_deref(), Some("web-v1"));
    }
    assert_eq!(mesh.who(&[("end-user", "jason")]).await?, None);

    // Consul answers well again: the change lands (after the watcher's backoff)
    mesh.consul.clear_faults();
    mesh.until(Duration::from_secs(30), "web-v2", &[("end-user", "jason")])
        .await?;
    mesh.assert_no_rejects().await
}
