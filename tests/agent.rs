//! End-to-end: the gateway scenario through `pilot-agent proxy router`: real pilot-discovery, real
//! pilot-agent, real Envoy talking xDS to the agent over its Unix socket. Envoy killed with
//! SIGKILL is restarted and traffic resumes; pilot-discovery killed and restarted: Envoy keeps
//! routing meanwhile and picks up a change made while it was down; SIGTERM under a request loop
//! finishes every request and the agent exits 0.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use common::{HOST, virtual_service_yaml, write_mesh_config};
use test_support::agent::{Agent, AgentOptions};
use test_support::backend::{Backend, BackendOptions, HttpResponse, http_get};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::{parse_stats, update_rejected_total};
use test_support::mesh_ca::MeshCa;
use test_support::ports::free_port;

struct AgentMesh {
    dir: tempfile::TempDir,
    /// The gateway's identity comes from pilot-discovery's CA, as an Istio gateway's does.
    ca: MeshCa,
    _backends: BTreeMap<&'static str, Backend>,
    discovery: Discovery,
    agent: Agent,
    gateway_port: u16,
    grpc_port: u16,
}

impl AgentMesh {
    async fn start() -> anyhow::Result<AgentMesh> {
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
        let grpc_port = free_port();
        let dir = tempfile::tempdir()?;
        write_mesh_config(dir.path(), gateway_port, &backends)?;
        let ca = MeshCa::loopback()?;
        let opts = ca.serve(DiscoveryOptions {
            grpc_port: Some(grpc_port),
            ..Default::default()
        });
        let discovery = Discovery::start(dir.path(), opts).await?;
        let mut agent = Agent::start(ca.agent(AgentOptions::ingress_gateway(discovery.grpc_addr))).await?;
        agent.wait_ready(Duration::from_secs(30)).await?;
        let mesh = AgentMesh {
            dir,
            ca,
            _backends: backends,
            discovery,
            agent,
            gateway_port,
            grpc_port,
        };
        mesh.wait_routed(Duration::from_secs(20)).await?;
        Ok(mesh)
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<HttpResponse> {
        let mut h = vec![("host", HOST)];
        h.extend_from_slice(headers);
        http_get(&format!("http://127.0.0.1:{}{}", self.gateway_port, path), &h).await
    }

    async fn who(&self, path: &str, headers: &[(&str, &str)]) -> Option<String> {
        let r = self.get(path, headers).await.ok()?;
        if r.status != 200 {
            return None;
        }
        r.json().ok()?["backend"].as_str().map(str::to_owned)
    }

    async fn wait_routed(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.who("/reviews", &[]).await.is_none() {
            if Instant::now() > deadline {
                bail!("gateway never routed /reviews:\n{}", self.agent.logs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn envoy_stats(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let url = format!("http://127.0.0.1:{}/stats", self.agent.admin_port);
        Ok(parse_stats(&http_get(&url, &[]).await?.body))
    }

    async fn assert_no_rejects(&self) -> anyhow::Result<()> {
        let rejected = update_rejected_total(&self.envoy_stats().await?);
        anyhow::ensure!(rejected == 0, "Envoy rejected config:\n{}", self.agent.logs());
        Ok(())
    }
}

#[tokio::test]
async fn gateway_routes_through_pilot_agent() -> anyhow::Result<()> {
    let mesh = AgentMesh::start().await?;
    let mut seen = BTreeMap::new();
    for _ in 0..60 {
        *seen.entry(mesh.who("/reviews", &[]).await).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "both subsets serve the split: {seen:?}");
    assert!(
        seen.keys()
            .all(|k| matches!(k.as_deref(), Some("reviews-v1" | "reviews-v2"))),
        "{seen:?}"
    );
    assert_eq!(
        mesh.who("/reviews", &[("end-user", "jason")]).await.as_deref(),
        Some("reviews-v2")
    );
    assert_eq!(mesh.get("/fault", &[]).await?.status, 418);
    // The bootstrap the agent wrote, and the merged stats on the status port.
    assert!(mesh.agent.bootstrap_path().exists());
    let stats = http_get(&mesh.agent.status_url("/stats/prometheus"), &[]).await?;
    assert_eq!(stats.status, 200);
    assert!(stats.body.contains("envoy_server_live"), "Envoy's stats missing");
    assert!(
        stats.body.contains("istio_agent_xds_proxy_requests"),
        "agent's stats missing"
    );
    // pilot-discovery sees one proxy, connected through the agent.
    let (_, adsz) = mesh.discovery.get("/debug/adsz", false).await?;
    assert!(
        adsz.contains("router~127.0.0.1~istio-ingressgateway-agent.istio-system"),
        "{adsz}"
    );
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn killed_envoy_is_restarted_and_traffic_resumes() -> anyhow::Result<()> {
    let mesh = AgentMesh::start().await?;
    let before = mesh.agent.envoy_pids();
    assert_eq!(before.len(), 1, "one Envoy: {before:?}");
    Agent::signal(before[0], "KILL")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = mesh.agent.envoy_pids();
        if now.len() == 1 && now != before && mesh.who("/reviews", &[]).await.is_some() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "Envoy not restarted or not routing (pids {now:?}):\n{}",
                mesh.agent.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..10 {
        assert!(mesh.who("/reviews", &[]).await.is_some());
    }
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn discovery_restart_keeps_routing_and_picks_up_changes() -> anyhow::Result<()> {
    let mut mesh = AgentMesh::start().await?;
    mesh.discovery.kill().await?;
    // Envoy keeps its last config while pilot-discovery is down.
    for _ in 0..20 {
        assert!(
            mesh.who("/reviews", &[]).await.is_some(),
            "routing stopped while pilot was down"
        );
    }
    // A change made while pilot-discovery is down: all of /reviews to v2.
    std::fs::write(mesh.dir.path().join("virtual-service.yaml"), virtual_service_yaml(0))?;
    let opts = mesh.ca.serve(DiscoveryOptions {
        grpc_port: Some(mesh.grpc_port),
        ..Default::default()
    });
    mesh.discovery = Discovery::start(mesh.dir.path(), opts).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut in_a_row = 0;
    while in_a_row < 10 {
        if mesh.who("/reviews", &[]).await.as_deref() == Some("reviews-v2") {
            in_a_row += 1;
        } else {
            in_a_row = 0;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if Instant::now() > deadline {
            bail!("change made while pilot was down never arrived:\n{}", mesh.agent.logs());
        }
    }
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn sigterm_under_load_finishes_requests_and_exits_zero() -> anyhow::Result<()> {
    let mut mesh = AgentMesh::start().await?;
    let mesh_port = mesh.gateway_port;
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = Instant::now() + Duration::from_millis(2500);
    let mut loops = Vec::new();
    for _ in 0..4 {
        let (ok, failed) = (ok.clone(), failed.clone());
        loops.push(tokio::spawn(async move {
            // Requests keep flowing for the first part of the 2s termination drain.
            while Instant::now() < stop - Duration::from_millis(1000) {
                let url = format!("http://127.0.0.1:{mesh_port}/reviews");
                match http_get(&url, &[("host", HOST)]).await {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = mesh.agent.pid().expect("agent pid");
    Agent::signal(pid, "TERM")?;
    for l in loops {
        l.await?;
    }
    let status = mesh.agent.wait_exit(Duration::from_secs(15)).await?;
    assert!(status.success(), "agent exit {status:?}:\n{}", mesh.agent.logs());
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "ok={}:\n{}",
        ok.load(Ordering::Relaxed),
        mesh.agent.logs()
    );
    assert!(ok.load(Ordering::Relaxed) > 10);
    assert!(mesh.agent.envoy_pids().is_empty(), "Envoy left running");
    Ok(())
}

#[tokio::test]
async fn bad_environment_exits_2_before_starting_anything() -> anyhow::Result<()> {
    let bin = test_support::bin::cargo_bin("agent", "pilot-agent")?;
    let dir = tempfile::tempdir()?;
    let run = |env: &[(&str, &str)]| {
        std::process::Command::new(&bin)
            .args(["proxy", "router"])
            .current_dir(dir.path())
            .env_clear()
            .envs(env.iter().copied())
            .output()
    };
    // No POD_NAMESPACE.
    let out = run(&[("POD_NAME", "gw")])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("POD_NAMESPACE"),
        "{out:?}"
    );
    // A malformed INSTANCE_IP and PROXY_CONFIG name the variable.
    let out = run(&[
        ("POD_NAME", "gw"),
        ("POD_NAMESPACE", "istio-system"),
        ("INSTANCE_IP", "10.1.2"),
    ])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("INSTANCE_IP"), "{out:?}");
    let out = run(&[
        ("POD_NAME", "gw"),
        ("POD_NAMESPACE", "istio-system"),
        ("PROXY_CONFIG", "{not yaml: ["),
    ])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROXY_CONFIG"), "{out:?}");
    // An unknown flag.
    let out = std::process::Command::new(&bin)
        .args(["proxy", "router", "--bogus"])
        .output()?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Nothing was written.
    assert!(!dir.path().join("etc/istio/proxy/envoy-rev.json").exists());
    Ok(())
}

/// `istio-iptables` takes its flags from the environment as Istio's (the flag's upper-cased name,
/// and ISTIO_META_DNS_CAPTURE for --redirect-dns); the command line wins.
#[test]
fn istio_iptables_reads_flags_from_the_environment() -> anyhow::Result<()> {
    let bin = test_support::bin::cargo_bin("agent", "pilot-agent")?;
    let dry_run = |flags: &[&str], env: &[(&str, &str)]| -> anyhow::Result<String> {
        let out = std::process::Command::new(&bin)
            .arg("istio-iptables")
            .args(flags)
            .env_clear()
            .envs(env.iter().copied())
            .output()?;
        anyhow::ensure!(out.status.success(), "{out:?}");
        Ok(String::from_utf8(out.stdout)?)
    };
    let dns = "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053";
    let all = ("CAPTURE_ALL_DNS", "true");
    assert!(!dry_run(&["--dry-run"], &[all])?.contains(dns));
    assert!(dry_run(&["--dry-run"], &[all, ("ISTIO_META_DNS_CAPTURE", "true")])?.contains(dns));
    assert!(dry_run(&[], &[all, ("REDIRECT_DNS", "true"), ("DRY_RUN", "true")])?.contains(dns));
    let out = dry_run(
        &["--dry-run", "--redirect-dns=false"],
        &[all, ("ISTIO_META_DNS_CAPTURE", "true")],
    )?;
    assert!(!out.contains(dns), "{out}");
    let out = dry_run(&["--dry-run"], &[("PROXY_UID", "4242")])?;
    assert!(out.contains("--uid-owner 4242"), "{out}");
    Ok(())
}
