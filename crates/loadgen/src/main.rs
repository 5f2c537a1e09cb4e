//! `loadgen`: runs one load scenario against pilot-discovery and prints the report (a table, and
//! with `--json` one JSON object as the last line). It starts the pilot-discovery that sits next
//! to its own executable (so `target/release/loadgen` measures `target/release/pilot-discovery`),
//! else `target/debug/pilot-discovery`, or `--discovery-bin`. It raises its open-file limit for
//! the proxies' sockets (the pilot-discovery it starts inherits it); as non-root past the hard
//! limit, run `ulimit -n` first.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use loadgen::{ChurnOptions, LoadOptions, MeshSpec, RampOptions, Scenario};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// mimalloc, as pilot-discovery: with glibc's malloc, building 2,000 sidecars' ACKs (each lists
/// every subscribed name) spent 60 % of the load generator's CPU in malloc and free, and the load
/// generator, not pilot-discovery, set the pace of a churn on two cores.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "loadgen", about = "Simulated sidecars against pilot-discovery")]
struct Args {
    /// ServiceEntries in the synthetic mesh.
    #[arg(long, default_value_t = 100)]
    services: usize,
    /// Inline endpoints per ServiceEntry.
    #[arg(long, default_value_t = 5)]
    endpoints: usize,
    /// Simulated proxies (sidecars), one ADS stream and connection each; for ramp, the most.
    #[arg(long, default_value_t = 10)]
    proxies: usize,
    /// connect, config-change (then its raw limit, unless --no-raw), endpoint-churn, raw or ramp.
    #[arg(long, default_value = "connect")]
    scenario: Scenario,
    /// With config-change, skip the raw phase (the same responses replayed with no generation).
    #[arg(long)]
    no_raw: bool,
    /// ramp: proxies that join per step, each step converging before the next.
    #[arg(long, default_value_t = 500)]
    ramp_step: usize,
    /// ramp: stop once pilot-discovery's resident memory exceeds this many MB.
    #[arg(long)]
    max_rss_mb: Option<f64>,
    /// ramp: stop once a step's connect p99 exceeds this many milliseconds.
    #[arg(long)]
    max_p99_ms: Option<f64>,
    /// endpoint-churn: changes per second, each moving the next service's endpoints (round robin);
    /// 0 makes one change.
    #[arg(long, default_value_t = 0.0)]
    churn_rate: f64,
    /// endpoint-churn: seconds of churn at --churn-rate.
    #[arg(long, default_value_t = 60.0)]
    churn_seconds: f64,
    /// VirtualServices (default: services / 10, at least 1).
    #[arg(long)]
    virtual_services: Option<usize>,
    /// DestinationRules with two subsets (default: services / 10).
    #[arg(long)]
    destination_rules: Option<usize>,
    /// Namespaces the services and proxies are spread over (service and proxy `i` in
    /// `load-<i mod N>`; one: everything in `load`).
    #[arg(long, default_value_t = 1)]
    namespaces: usize,
    /// `namespace`: a Sidecar per namespace importing `./*` and `istio-system/*`, as istio.io's
    /// load tests (the reference mesh); `none`: every proxy sees every service (the worst case).
    #[arg(long, default_value = "none", value_parser = ["none", "namespace"])]
    sidecar_scope: String,
    /// Use delta xDS instead of state of the world.
    #[arg(long)]
    delta: bool,
    /// `full`: every resource of every response is decoded and checked, as a strict client;
    /// `light`: each response's envelope (type, version, nonce, resource names read without
    /// decoding, a checksum of the bytes), clusters and listeners decoded only when they changed.
    #[arg(long, default_value = "full", value_parser = ["full", "light"])]
    client: String,
    /// Proxies whose ADS streams share one HTTP/2 connection (state of the world only). Envoy has
    /// one each; share only when the open-file limit cannot cover one per proxy, knowing that
    /// pilot-discovery's per-connection memory is then under-counted.
    #[arg(long, default_value_t = 1)]
    streams_per_connection: usize,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// gRPC address of a running pilot-discovery (it must watch --config-dir); else one is started.
    #[arg(long, requires = "config_dir")]
    discovery: Option<String>,
    /// Process ID of the --discovery process, to report its memory and CPU time.
    #[arg(long, requires = "discovery")]
    discovery_pid: Option<u32>,
    /// pilot-discovery executable to start (default: the one next to loadgen, else target/debug).
    #[arg(long, conflicts_with = "discovery")]
    discovery_bin: Option<PathBuf>,
    /// Directory the mesh is written to (default: a temporary directory).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// PILOT_DEBOUNCE_AFTER of the pilot-discovery started here.
    #[arg(long, default_value = "100ms")]
    debounce_after: String,
    /// Bound on each phase (and each ramp step), in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// Open files besides the proxies'.
const FILES_SPARE: u64 = 1024;

fn main() -> Result<()> {
    loadgen::disable_transparent_huge_pages();
    let args = Args::parse();
    let connections = args.proxies.div_ceil(args.streams_per_connection.max(1)) as u64;
    // The raw phase's server runs here: both ends of each connection.
    let raw = args.scenario == Scenario::Raw || args.scenario == Scenario::ConfigChange && !args.no_raw;
    let per_connection = if raw { 2 } else { 1 };
    raise_open_file_limit(connections * per_connection + FILES_SPARE);
    let opts = LoadOptions {
        mesh: MeshSpec {
            services: args.services,
            endpoints: args.endpoints,
            virtual_services: args.virtual_services.unwrap_or((args.services / 10).max(1)),
            destination_rules: args.destination_rules.unwrap_or(args.services / 10),
            namespaces: args.namespaces.max(1),
            sidecar_scope: args.sidecar_scope == "namespace",
        },
        proxies: args.proxies,
        scenario: args.scenario,
        delta: args.delta,
        light: args.client == "light",
        streams_per_connection: args.streams_per_connection,
        raw: !args.no_raw,
        ramp: RampOptions {
            step: args.ramp_step,
            max_rss_mb: args.max_rss_mb,
            max_p99_ms: args.max_p99_ms,
        },
        churn: ChurnOptions {
            rate: args.churn_rate,
            duration: Duration::try_from_secs_f64(args.churn_seconds)?,
        },
        discovery_bin: args.discovery_bin.or_else(sibling_discovery),
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

/// `pilot-discovery` in the directory of this executable, if there is one.
fn sibling_discovery() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.join("pilot-discovery");
    bin.is_file().then_some(bin)
}

/// Raises the soft open-file limit to `want` (and the hard one, when allowed); warns when the
/// result is still below it.
fn raise_open_file_limit(want: u64) {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= want {
        return;
    }
    if want > hard && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
        return;
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard);
    let now = getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(s, _)| s);
    if now < want {
        eprintln!(
            "warning: open-file limit {now} is below the {want} these connections need here and in \
             pilot-discovery (hint: ulimit -n {want}, or share connections with --streams-per-connection)"
        );
    }
}
