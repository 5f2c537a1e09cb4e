//! Kubernetes watch figures for docs/perf.md (issue 28, item 6b): the memory pilot-discovery
//! takes when the API server sends a watch line that never ends.
//!
//! A fake API server (test-support's) with one Service; pilot-discovery (`--binary`, else this
//! build's) reads Istio config and services from it. Once it is ready, its RSS is read; then an
//! ADDED event whose object never ends (`--mb` MB, default 400, without a newline) is sent on its
//! Services watch; after the fake has sent what pilot-discovery would read (or `--wait` seconds)
//! its RSS and peak RSS (VmHWM) are read again. Prints the figures as one JSON line.
//!
//! `cargo run -p e2e --bin kube-figures -- [--mb 400] [--wait 60] [--binary PATH]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use test_support::discovery::{Discovery, DiscoveryOptions, sum_metric};
use test_support::figures::memory_kib;
use test_support::kube_api::{FakeApiServer, RawWatch};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut mb, mut wait, mut binary) = (400usize, 60u64, None);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} takes a value"));
        match a.as_str() {
            "--mb" => mb = value()?.parse()?,
            "--wait" => wait = value()?.parse()?,
            "--binary" => binary = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other}"),
        }
    }
    let api = FakeApiServer::start().await?;
    api.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 9080}]}}),
    )?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
        binary,
        ..Default::default()
    };
    let discovery = Discovery::start(std::path::Path::new(""), opts).await?;
    let pid = discovery.pid().context("pilot-discovery's pid")?;
    // settle: the initial lists and the first push are done
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_before, _) = memory_kib(pid)?;
    let watches = || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/services?") && r.contains("watch="))
            .count()
    };
    if watches() == 0 {
        bail!("pilot-discovery does not watch Services");
    }
    let t0 = Instant::now();
    api.send_raw("v1", "Service", RawWatch::Endless { bytes: mb * 1_000_000 })?;
    let mut refused = false;
    let mut peak_rss = rss_before;
    while t0.elapsed() < Duration::from_secs(wait) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (rss, _) = memory_kib(pid)?;
        peak_rss = peak_rss.max(rss);
        let (_, metrics) = discovery.get("/metrics", true).await?;
        if sum_metric(&metrics, "pilot_k8s_watch_errors") > 0.0 {
            refused = true;
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss_after, hwm) = memory_kib(pid)?;
    println!(
        "{}",
        json!({"line_mb": mb, "refused": refused, "seconds": (t0.elapsed().as_secs_f64() * 10.0).round() / 10.0,
               "rss_before_mib": rss_before / 1024, "rss_after_mib": rss_after / 1024,
               "peak_rss_mib": peak_rss.max(hwm) / 1024, "added_peak_mib": (peak_rss.max(hwm) - rss_before) / 1024})
    );
    Ok(())
}
