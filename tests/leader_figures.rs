//! Leader election figures for docs/perf.md (issue 29, item 9): the time for a new leader to take
//! over the cluster-wide writes when the leader goes.
//!
//! A fake API server (test-support's) with a few namespaces; `--replicas` pilot-discovery
//! replicas (default 3; `--binary`, else this build's) with `--lease` second locks (default 30,
//! istiod's). Each round stops the replica that holds `istio-namespace-controller-election`
//! at a random point of its renew period (`--stop kill`: SIGKILL, it cannot give the lock up; `--stop term`: SIGTERM, it releases
//! its locks as it exits), deletes a namespace's `istio-ca-root-cert` once it is gone, and
//! measures from the signal until that ConfigMap is written again by the new leader; a fresh replica then
//! replaces the stopped one. Prints one JSON line: the lease, each round's takeover in seconds,
//! and their minimum, median and maximum.
//!
//! `cargo run -p e2e --bin leader-figures -- [--replicas 3] [--lease 30] [--rounds 5] [--stop kill|term] [--binary PATH]`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::FakeApiServer;
use test_support::ports::free_port;

const LEASE: &str = "istio-namespace-controller-election";

struct Options {
    replicas: usize,
    lease: u64,
    rounds: usize,
    term: bool,
    binary: Option<PathBuf>,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        replicas: 3,
        lease: 30,
        rounds: 5,
        term: false,
        binary: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} takes a value"));
        match a.as_str() {
            "--replicas" => o.replicas = value()?.parse()?,
            "--lease" => o.lease = value()?.parse()?,
            "--rounds" => o.rounds = value()?.parse()?,
            "--stop" => {
                o.term = match value()?.as_str() {
                    "kill" => false,
                    "term" => true,
                    other => bail!("--stop kill or term, not {other}"),
                }
            }
            "--binary" => o.binary = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(o.replicas >= 2, "--replicas: at least 2");
    Ok(o)
}

async fn replica(api: &FakeApiServer, work: &Path, name: &str, o: &Options) -> anyhow::Result<Discovery> {
    let dir = work.join(name);
    std::fs::create_dir_all(dir.join("config"))?;
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig_with_token(&kubeconfig, name)?;
    let opts = DiscoveryOptions {
        args: vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--secureGrpcAddr".into(),
            format!("127.0.0.1:{}", free_port()),
        ],
        env: vec![
            ("ROOT_CA_DIR".into(), dir.join("cacerts").display().to_string()),
            ("POD_NAME".into(), name.into()),
            ("PILOT_LEADER_ELECTION_LEASE_DURATION".into(), format!("{}s", o.lease)),
        ],
        binary: o.binary.clone(),
        ..Default::default()
    };
    Discovery::start(&dir.join("config"), opts).await
}

/// The index of the replica that holds the lock, waiting up to two lease durations.
async fn holder(replicas: &[Discovery], lease_secs: u64) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(2 * lease_secs + 5);
    loop {
        let mut held = Vec::new();
        for (i, d) in replicas.iter().enumerate() {
            if d.metric(&format!("leader_election_master_status{{name=\"{LEASE}\"}}"))
                .await?
                == 1.0
            {
                held.push(i);
            }
        }
        match held.as_slice() {
            [one] => return Ok(*one),
            [] if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            [] => bail!("no replica holds {LEASE}"),
            many => bail!("{LEASE} held by {many:?} at once"),
        }
    }
}

/// Whether process `pid` has exited (gone, or a zombie not yet waited for).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

async fn has_root(api: &FakeApiServer, namespace: &str) -> bool {
    let url = format!(
        "{}/api/v1/namespaces/{namespace}/configmaps/istio-ca-root-cert",
        api.url()
    );
    reqwest::get(url).await.is_ok_and(|r| r.status().is_success())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = options()?;
    let api = FakeApiServer::start().await?;
    for ns in ["default", "bookinfo", "istio-system"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    }
    let work = tempfile::tempdir()?;
    let mut replicas = Vec::new();
    let mut started = 0;
    for _ in 0..o.replicas {
        started += 1;
        replicas.push(replica(&api, work.path(), &format!("istiod-{started}"), &o).await?);
    }
    let mut takeovers = Vec::new();
    for round in 0..o.rounds {
        let leader = holder(&replicas, o.lease).await?;
        // Past the first write of every namespace's ConfigMap.
        while !has_root(&api, "bookinfo").await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // At a random point of the leader's renew period: a leader stopped right after it
        // renewed is the worst case (a whole lease duration), right before, the best.
        let period_ms = (o.lease / 4).max(1) * 1000;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()))
            .unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(nanos % period_ms)).await;
        let mut stopped = replicas.remove(leader);
        let t0 = Instant::now();
        if o.term {
            let pid = stopped.pid().context("the leader's pid")?;
            let status = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await?;
            anyhow::ensure!(status.success(), "kill -TERM {pid}");
            // It writes until it exits: the change it must not see comes after.
            while !exited(pid) {
                anyhow::ensure!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the leader did not exit on SIGTERM"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else {
            stopped.kill().await?;
        }
        api.delete(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "istio-ca-root-cert", "namespace": "bookinfo"}}))?;
        while !has_root(&api, "bookinfo").await {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(3 * o.lease + 10),
                "round {round}: no takeover"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = t0.elapsed().as_secs_f64();
        eprintln!("round {round}: taken over in {took:.2} s");
        takeovers.push(took);
        drop(stopped);
        started += 1;
        replicas.push(replica(&api, work.path(), &format!("istiod-{started}"), &o).await?);
        // The new replica has read the lock and waits as the others do (a replica starting as
        // the leader stops would take the lock at once, and measure its start instead).
        tokio::time::sleep(Duration::from_secs((o.lease / 4).max(1) + 2)).await;
    }
    let mut sorted = takeovers.clone();
    sorted.sort_by(f64::total_cmp);
    let round2 = |v: f64| (v * 100.0).round() / 100.0;
    println!(
        "{}",
        json!({
            "replicas": o.replicas,
            "lease_seconds": o.lease,
            "stop": if o.term { "SIGTERM" } else { "SIGKILL" },
            "takeover_seconds": takeovers.iter().map(|t| round2(*t)).collect::<Vec<_>>(),
            "min": sorted.first().copied().map(round2),
            "median": sorted.get(sorted.len() / 2).copied().map(round2),
            "max": sorted.last().copied().map(round2),
        })
    );
    Ok(())
}
