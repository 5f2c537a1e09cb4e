//! Route propagation figures for docs/perf.md: how long a VirtualService change takes to reach a
//! real Envoy gateway, measured as gateway-api-bench measures it: from the change (the file's
//! rename into the config directory) to the first request served by the new route; and how many
//! pushes a storm of changes makes.
//!
//! A real pilot-discovery (default settings: `PILOT_DEBOUNCE_AFTER` 100 ms, Istio's default)
//! watches a config directory; a real Envoy is its ingress gateway (SotW ADS, or `--delta`). The
//! VirtualService sends `/reviews` all to reviews-v1 or all to reviews-v2; each change flips it,
//! and requests on fresh connections (about 1 ms each) go through the gateway until one is
//! answered by the new backend. Each change is written `--gap-ms` after the previous one was
//! served (default 1,100 ms; docs/perf.md measures 200, 600 and 2,000 ms too: the directory
//! watcher reads a change that comes 100 ms or more after the last one it read at once, and
//! batches only storms, whose events keep coming closer than that).
//!
//! The storm (`--storm-seconds`, default 5): the VirtualService is rewritten `--storm-rate` times a
//! second (default 1,000), each time with other content; reported are Envoy's RDS updates per
//! second (`update_attempt` of its route configurations) and whether the last one landed.
//!
//! pilot-discovery is `target/release/pilot-discovery` unless `--discovery-bin` names another.
//!
//! Prints a table, then the figures as one JSON line (`--json`: only that line).

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{Ads, GatewayMesh, virtual_service_yaml};
use serde_json::json;
use test_support::discovery::DiscoveryOptions;
use test_support::envoy::workspace_root;
use test_support::figures::{rank, round, sorted};

struct Args {
    changes: usize,
    gap: Duration,
    storm_seconds: u64,
    storm_rate: u64,
    ads: Ads,
    debounce_after: Option<String>,
    discovery_bin: Option<PathBuf>,
    json_only: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        changes: 100,
        gap: Duration::from_millis(1100),
        storm_seconds: 5,
        storm_rate: 1000,
        ads: Ads::Sotw,
        debounce_after: None,
        discovery_bin: None,
        json_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        let mut number = || -> anyhow::Result<u64> {
            let v = value()?;
            v.parse().with_context(|| format!("{flag} {v:?}: not a number"))
        };
        match flag.as_str() {
            "--changes" => args.changes = number()?.max(1) as usize,
            "--gap-ms" => args.gap = Duration::from_millis(number()?),
            "--storm-seconds" => args.storm_seconds = number()?,
            "--storm-rate" => args.storm_rate = number()?.max(1),
            "--delta" => args.ads = Ads::Delta,
            "--debounce-after" => args.debounce_after = Some(value()?),
            "--discovery-bin" => args.discovery_bin = Some(PathBuf::from(value()?)),
            "--json" => args.json_only = true,
            other => bail!(
                "unknown flag {other} (flags: --changes N --gap-ms MS --storm-seconds S --storm-rate R --delta --debounce-after D --discovery-bin PATH --json)"
            ),
        }
    }
    Ok(args)
}

/// The VirtualService of change `i`: all of `/reviews` to v1 (even) or v2 (odd), and the backend
/// that must answer once it is live.
fn change(i: usize) -> (String, &'static str) {
    if i.is_multiple_of(2) {
        (virtual_service_yaml(100), "reviews-v1")
    } else {
        (virtual_service_yaml(0), "reviews-v2")
    }
}

/// Requests until `backend` answers `/reviews`; the time from `since`.
async fn first_served_by(mesh: &GatewayMesh, backend: &str, since: Instant) -> anyhow::Result<Duration> {
    let deadline = since + Duration::from_secs(30);
    loop {
        if mesh.who("/reviews", &[]).await?.as_deref() == Some(backend) {
            return Ok(since.elapsed());
        }
        if Instant::now() > deadline {
            bail!(
                "the change to {backend} did not reach Envoy in 30 s\n--- pilot-discovery log ---\n{}",
                mesh.discovery.logs()
            );
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let bin = match &args.discovery_bin {
        Some(b) => b.clone(),
        None => workspace_root()?.join("target/release/pilot-discovery"),
    };
    if !bin.exists() {
        bail!(
            "{} not found: cargo build --release -p pilot-discovery (or --discovery-bin PATH)",
            bin.display()
        );
    }
    let mut options = DiscoveryOptions {
        binary: Some(bin),
        ..DiscoveryOptions::default()
    };
    // test-support runs pilot-discovery with a 20 ms debounce for speed; these figures are for
    // the defaults (or the one asked for).
    let debounce_after = args.debounce_after.clone().unwrap_or_else(|| "100ms".to_owned());
    options
        .env
        .push(("PILOT_DEBOUNCE_AFTER".to_owned(), debounce_after.clone()));
    let mesh = GatewayMesh::start_with_options(args.ads, json!({}), options).await?;
    let (yaml, backend) = change(0);
    mesh.write("virtual-service.yaml", &yaml)?;
    mesh.wait_for_backend(backend, 5, "/reviews", &[]).await?;

    let mut latencies = Vec::with_capacity(args.changes);
    for i in 1..=args.changes {
        tokio::time::sleep(args.gap).await;
        let (yaml, backend) = change(i);
        let t0 = Instant::now();
        mesh.write("virtual-service.yaml", &yaml)?;
        latencies.push(first_served_by(&mesh, backend, t0).await?);
    }
    let ms: Vec<f64> = sorted(&latencies.iter().map(|d| d.as_secs_f64() * 1000.0).collect::<Vec<_>>());

    let mut storm = json!(null);
    if args.storm_seconds > 0 {
        tokio::time::sleep(args.gap).await;
        let before = mesh.envoy.rds_total("update_attempt").await?;
        let interval = Duration::from_secs(1) / args.storm_rate as u32;
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(args.storm_seconds);
        let mut writes = 0usize;
        let mut next = t0;
        while Instant::now() < end {
            writes += 1;
            // Other content each time: a timeout that counts the writes.
            let yaml = change(writes).0.replace(
                "  - name: jason",
                &format!("  - name: storm\n    match: [{{uri: {{prefix: /storm}}}}]\n    timeout: {writes}ms\n    route:\n    - destination: {{host: ratings.default.svc.cluster.local}}\n  - name: jason"),
            );
            mesh.write("virtual-service.yaml", &yaml)?;
            next += interval;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
        }
        let storm_time = t0.elapsed();
        let last = change(writes).1;
        let settled = first_served_by(&mesh, last, Instant::now()).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let updates = mesh.envoy.rds_total("update_attempt").await? - before;
        storm = json!({
            "seconds": round(storm_time.as_secs_f64()),
            "writes": writes,
            "writes_per_s": round(writes as f64 / storm_time.as_secs_f64()),
            "rds_updates": updates,
            "rds_updates_per_s": round(updates as f64 / storm_time.as_secs_f64()),
            "last_write_served_after_ms": round(settled.as_secs_f64() * 1000.0),
        });
    }
    mesh.assert_no_rejects().await?;
    Ok(json!({
        "ads": if args.ads == Ads::Delta { "delta" } else { "sotw" },
        "debounce_after": debounce_after,
        "changes": args.changes,
        "gap_ms": args.gap.as_millis() as u64,
        "change_to_first_request_ms": {
            "p50": round(rank(&ms, 50.0)),
            "p90": round(rank(&ms, 90.0)),
            "p99": round(rank(&ms, 99.0)),
            "min": round(ms[0]),
            "max": round(ms[ms.len() - 1]),
        },
        "storm": storm,
    }))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(&args).await {
        Ok(figures) => {
            if !args.json_only {
                let l = &figures["change_to_first_request_ms"];
                println!(
                    "change -> first request by the new route ({} changes, {} ms apart, {}): p50 {} ms, p90 {} ms, p99 {} ms, min {} ms, max {} ms",
                    figures["changes"],
                    figures["gap_ms"],
                    figures["ads"],
                    l["p50"],
                    l["p90"],
                    l["p99"],
                    l["min"],
                    l["max"]
                );
                let s = &figures["storm"];
                if !s.is_null() {
                    println!(
                        "storm: {} writes in {} s ({}/s): {} RDS updates ({}/s) at the gateway; last write served {} ms after the storm",
                        s["writes"],
                        s["seconds"],
                        s["writes_per_s"],
                        s["rds_updates"],
                        s["rds_updates_per_s"],
                        s["last_write_served_after_ms"]
                    );
                }
            }
            println!("{figures}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
