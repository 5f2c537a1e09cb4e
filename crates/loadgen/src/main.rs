//! `loadgen`: runs one load scenario against pilot-discovery and prints the report (a table, and
//! with `--json` one JSON object as the last line). Many proxies need many sockets: raise the
//! open-file limit first, e.g. `ulimit -n 65536` for 2,000 proxies.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use loadgen::{LoadOptions, MeshSpec, Scenario};

#[derive(Debug, Parser)]
#[command(name = "loadgen", about = "Simulated sidecars against pilot-discovery")]
struct Args {
    /// ServiceEntries in the synthetic mesh.
    #[arg(long, default_value_t = 100)]
    services: usize,
    /// Inline endpoints per ServiceEntry.
    #[arg(long, default_value_t = 5)]
    endpoints: usize,
    /// Simulated proxies (sidecars), one ADS stream and connection each.
    #[arg(long, default_value_t = 10)]
    proxies: usize,
    /// connect, config-change or endpoint-churn (ramp and raw are not implemented yet).
    #[arg(long, default_value = "connect")]
    scenario: Scenario,
    /// VirtualServices (default: services / 10, at least 1).
    #[arg(long)]
    virtual_services: Option<usize>,
    /// DestinationRules with two subsets (default: services / 10).
    #[arg(long)]
    destination_rules: Option<usize>,
    /// Use delta xDS instead of state of the world.
    #[arg(long)]
    delta: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// gRPC address of a running pilot-discovery (it must watch --config-dir); else one is started.
    #[arg(long, requires = "config_dir")]
    discovery: Option<String>,
    /// Process ID of the --discovery process, to report its peak memory and CPU time.
    #[arg(long, requires = "discovery")]
    discovery_pid: Option<u32>,
    /// Directory the mesh is written to (default: a temporary directory).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// PILOT_DEBOUNCE_AFTER of the pilot-discovery started here.
    #[arg(long, default_value = "100ms")]
    debounce_after: String,
    /// Bound on the whole run, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let opts = LoadOptions {
        mesh: MeshSpec {
            services: args.services,
            endpoints: args.endpoints,
            virtual_services: args.virtual_services.unwrap_or((args.services / 10).max(1)),
            destination_rules: args.destination_rules.unwrap_or(args.services / 10),
        },
        proxies: args.proxies,
        scenario: args.scenario,
        delta: args.delta,
        discovery: args.discovery,
        discovery_pid: args.discovery_pid,
        config_dir: args.config_dir,
        debounce_after: args.debounce_after,
        timeout: Duration::from_secs(args.timeout),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(loadgen::run(&opts))?;
    print!("{}", report.table());
    if args.json {
        println!("{}", report.to_json());
    }
    if report.converged < report.proxies {
        std::process::exit(1);
    }
    Ok(())
}
