//! `kube-load`: pilot-discovery against a Kubernetes-shaped mesh on the fake API server: start-up
//! to `/ready`, then optional pod churn with its EDS convergence (see `loadgen::kube`). Starts the
//! pilot-discovery next to its own executable, else target/debug, or `--discovery-bin`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use loadgen::kube::{KubeOptions, run};

/// mimalloc, as pilot-discovery: with glibc's malloc, building 2,000 sidecars' ACKs (each lists
/// every subscribed name) spent 60 % of the load generator's CPU in malloc and free, and the load
/// generator, not pilot-discovery, set the pace of a churn on two cores.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "kube-load",
    about = "pilot-discovery on a Kubernetes-shaped mesh (fake API server)"
)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    services: usize,
    #[arg(long, default_value_t = 5)]
    pods_per_service: usize,
    /// EndpointSlices per Service (its Pods dealt round robin over them).
    #[arg(long, default_value_t = 1)]
    slices_per_service: usize,
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Pod replacements per second (0: start-up only).
    #[arg(long, default_value_t = 0.0)]
    churn_rate: f64,
    #[arg(long, default_value_t = 30.0)]
    churn_seconds: f64,
    /// Sidecars (real ADS clients) connected during the churn, the measuring one included.
    #[arg(long, default_value_t = 1)]
    proxies: usize,
    /// Clusters holding the mesh: the config cluster and N - 1 remote ones (remote secrets).
    #[arg(long, default_value_t = 1)]
    clusters: usize,
    #[arg(long)]
    discovery_bin: Option<PathBuf>,
}

fn main() -> Result<()> {
    loadgen::disable_transparent_huge_pages();
    let a = Args::parse();
    let discovery_bin = a.discovery_bin.or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let bin = exe.parent()?.join("pilot-discovery");
        bin.is_file().then_some(bin)
    });
    let opts = KubeOptions {
        services: a.services,
        pods_per_service: a.pods_per_service,
        slices_per_service: a.slices_per_service,
        namespaces: a.namespaces,
        churn_rate: a.churn_rate,
        churn_seconds: a.churn_seconds,
        proxies: a.proxies,
        clusters: a.clusters,
        discovery_bin,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(run(&opts))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
