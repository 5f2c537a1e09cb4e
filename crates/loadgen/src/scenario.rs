//! The scenarios: start (or reach) pilot-discovery on a synthetic mesh, run N simulated proxies
//! and measure `connect` (connect to last handshake ACK, per proxy), `config-change` (one
//! VirtualService file write to every proxy's ACK of the new routes, then by default its raw
//! limit, see [`crate::raw`]), `endpoint-churn` (one service's endpoints moved to every proxy's
//! ACK of the new endpoints; with a churn rate, sustained churn, see [`crate::churn`]), `raw` (only the raw limit of a config change) or `ramp` (see
//! [`crate::ramp`]).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use test_support::discovery::{Discovery, DiscoveryOptions};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::churn::{ChurnFigures, ChurnOptions, churn};
use crate::mesh::{MeshSpec, change_virtual_service, churn_endpoints, write_mesh};
use crate::proxy::{ProxyOptions, Watched, run_proxy};
use crate::ramp::{RampOptions, ramp};
use crate::raw::{Capture, raw_phase};
use crate::report::{Report, cpu_seconds, peak_rss_mb, percentile_ms};
use crate::tally::Tally;
use crate::upstream::Upstream;

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scenario {
    #[default]
    Connect,
    ConfigChange,
    EndpointChurn,
    Raw,
    Ramp,
}

impl Scenario {
    pub fn as_str(&self) -> &'static str {
        match self {
            Scenario::Connect => "connect",
            Scenario::ConfigChange => "config-change",
            Scenario::EndpointChurn => "endpoint-churn",
            Scenario::Raw => "raw",
            Scenario::Ramp => "ramp",
        }
    }
}

impl FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "connect" => Ok(Scenario::Connect),
            "config-change" => Ok(Scenario::ConfigChange),
            "endpoint-churn" => Ok(Scenario::EndpointChurn),
            "raw" => Ok(Scenario::Raw),
            "ramp" => Ok(Scenario::Ramp),
            _ => Err(format!(
                "unknown scenario {s:?} (connect, config-change, endpoint-churn, raw, ramp)"
            )),
        }
    }
}

/// How long a running pilot-discovery (`--discovery`) is given to load the written mesh.
const EXTERNAL_LOAD_WAIT: Duration = Duration::from_secs(2);

/// One run's settings.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub mesh: MeshSpec,
    pub proxies: usize,
    pub scenario: Scenario,
    pub delta: bool,
    /// The simulated proxies are light clients ([`ProxyOptions::light`]), in the raw phase too.
    pub light: bool,
    /// Proxies whose ADS streams share one HTTP/2 connection (1, as Envoy, unless the open-file
    /// limit forces more; state of the world only).
    pub streams_per_connection: usize,
    /// With `config-change`, also measure its raw limit.
    pub raw: bool,
    pub ramp: RampOptions,
    /// With `endpoint-churn`, sustained churn when its rate is above 0.
    pub churn: ChurnOptions,
    /// An already running pilot-discovery's gRPC address; it must watch `config_dir`.
    pub discovery: Option<String>,
    /// The process ID of that running pilot-discovery, to read its memory and CPU.
    pub discovery_pid: Option<u32>,
    /// The pilot-discovery executable to start; `target/debug/pilot-discovery` if `None`.
    pub discovery_bin: Option<PathBuf>,
    /// Where the mesh is written; a temporary directory if `None`.
    pub config_dir: Option<PathBuf>,
    /// PILOT_DEBOUNCE_AFTER of the pilot-discovery started here.
    pub debounce_after: String,
    /// Bound on each phase: proxies against pilot-discovery, the raw phase, each ramp step.
    pub timeout: Duration,
}

impl Default for LoadOptions {
    /// The command line's defaults.
    fn default() -> Self {
        LoadOptions {
            mesh: MeshSpec {
                services: 100,
                endpoints: 5,
                virtual_services: 10,
                destination_rules: 10,
                namespaces: 1,
                sidecar_scope: false,
            },
            proxies: 10,
            scenario: Scenario::Connect,
            delta: false,
            light: false,
            streams_per_connection: 1,
            raw: true,
            ramp: RampOptions::default(),
            churn: ChurnOptions::default(),
            discovery: None,
            discovery_pid: None,
            discovery_bin: None,
            config_dir: None,
            debounce_after: "100ms".to_owned(),
            timeout: Duration::from_secs(120),
        }
    }
}

/// Runs one scenario to the end or to `opts.timeout` per phase, whichever comes first.
pub async fn run(opts: &LoadOptions) -> Result<Report> {
    let started = Instant::now();
    if opts.delta && opts.streams_per_connection > 1 {
        bail!("streams per connection above 1 need state of the world (the delta client dials its own connection)");
    }
    let control = ControlPlane::start(opts).await?;
    let mut report = Report {
        scenario: opts.scenario.as_str().to_owned(),
        delta: opts.delta,
        client: if opts.light { "light" } else { "full" }.to_owned(),
        proxies: opts.proxies,
        services: opts.mesh.services,
        endpoints: opts.mesh.endpoints,
        namespaces: opts.mesh.namespaces,
        sidecar_scope: if opts.mesh.sidecar_scope { "namespace" } else { "none" }.to_owned(),
        discovery_bin: control.binary(),
        ..Default::default()
    };
    let proxy = ProxyOptions {
        delta: opts.delta,
        namespaces: opts.mesh.namespaces,
        light: opts.light,
        ..Default::default()
    };
    if opts.scenario == Scenario::Ramp {
        let upstream = Upstream::new(control.addr.clone(), opts.streams_per_connection);
        ramp(
            &upstream,
            control.pid(),
            opts.proxies,
            proxy,
            &opts.ramp,
            opts.timeout,
            &mut report,
        )
        .await?;
        control.usage(&mut report);
    } else {
        let raw = opts.scenario == Scenario::Raw || opts.scenario == Scenario::ConfigChange && opts.raw;
        // The raw scenario needs pilot-discovery only to record one proxy's change.
        let proxies = if opts.scenario == Scenario::Raw {
            1
        } else {
            opts.proxies
        };
        let mut phase = discovery_phase(opts, &control, proxies, raw).await?;
        let mut errors = std::mem::take(&mut phase.tally.errors);
        if opts.scenario != Scenario::Raw {
            control.usage(&mut report);
            report.converged = phase.samples.len();
            report.connect_p50_ms = percentile_ms(&phase.connect, 0.5);
            report.connect_p99_ms = percentile_ms(&phase.connect, 0.99);
            report.convergence_p50_ms = percentile_ms(&phase.samples, 0.5);
            report.convergence_p99_ms = percentile_ms(&phase.samples, 0.99);
            report.convergence_max_ms = percentile_ms(&phase.samples, 1.0);
            report.bytes_sent = phase.tally.bytes;
            if phase.churn.is_none() {
                report.change_bytes_per_proxy = phase.tally.change_bytes_per_proxy();
                let pushed = phase.samples.len();
                report.change_cpu_s_per_proxy = phase.change_cpu_s.filter(|_| pushed > 0).map(|s| s / pushed as f64);
            }
            if let Some(figures) = &phase.churn {
                figures.fill(&mut report);
            }
        }
        // pilot-discovery is idle from here: stop it, so that it takes no CPU from the raw phase.
        drop(control);
        match phase.capture {
            Some(Ok(capture)) => {
                report.raw_push_bytes = Some(capture.push_bytes());
                // replayed to as many proxies as the change reached (proxy 0 is one of them)
                let reached = (0..opts.proxies).filter(|&n| opts.mesh.sees(n, 0)).count();
                let raw = raw_phase(
                    capture,
                    Watched::Routes,
                    reached,
                    opts.streams_per_connection,
                    opts.light,
                    opts.timeout,
                )
                .await?;
                report.raw_p50_ms = percentile_ms(&raw.samples, 0.5);
                report.raw_p99_ms = percentile_ms(&raw.samples, 0.99);
                if opts.scenario == Scenario::Raw {
                    report.converged = raw.samples.len();
                    report.connect_p50_ms = percentile_ms(&raw.connect, 0.5);
                    report.connect_p99_ms = percentile_ms(&raw.connect, 0.99);
                    report.convergence_p50_ms = report.raw_p50_ms;
                    report.convergence_p99_ms = report.raw_p99_ms;
                    report.convergence_max_ms = percentile_ms(&raw.samples, 1.0);
                    report.bytes_sent = raw.bytes;
                }
                errors.extend(raw.errors.into_iter().map(|e| format!("raw: {e}")));
            }
            Some(Err(e)) if opts.scenario == Scenario::Raw => return Err(e.context("recording the change to replay")),
            Some(Err(e)) => errors.push(format!("raw: {e:#}")),
            None => {}
        }
        errors.append(&mut report.errors);
        report.errors = errors;
    }
    report.loadgen_cpu_s = cpu_seconds(std::process::id());
    report.wall_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// pilot-discovery serving the written mesh: started here (killed on drop) or already running.
struct ControlPlane {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    discovery: Option<Discovery>,
    addr: String,
    external_pid: Option<u32>,
}

impl ControlPlane {
    async fn start(opts: &LoadOptions) -> Result<ControlPlane> {
        let temp = tempfile::tempdir()?;
        let dir = opts.config_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_mesh(&dir, &opts.mesh)?;
        let (discovery, addr) = match &opts.discovery {
            Some(addr) => {
                // A running pilot-discovery picks the files up through its watcher (100ms
                // debounce plus PILOT_DEBOUNCE_AFTER): let it load them before proxies connect.
                tokio::time::sleep(EXTERNAL_LOAD_WAIT).await;
                (None, addr.clone())
            }
            None => {
                let env = vec![("PILOT_DEBOUNCE_AFTER".to_owned(), opts.debounce_after.clone())];
                let options = DiscoveryOptions {
                    env,
                    binary: opts.discovery_bin.clone(),
                    ..Default::default()
                };
                let d = Discovery::start(&dir, options).await?;
                let addr = d.grpc_addr.to_string();
                (Some(d), addr)
            }
        };
        Ok(ControlPlane {
            _temp: temp,
            dir,
            discovery,
            addr,
            external_pid: opts.discovery_pid,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.discovery.as_ref().and_then(Discovery::pid).or(self.external_pid)
    }

    /// The executable started here, if any.
    fn binary(&self) -> Option<String> {
        self.discovery.as_ref().map(|d| d.binary().display().to_string())
    }

    /// pilot-discovery's peak memory and CPU time so far.
    fn usage(&self, report: &mut Report) {
        let pid = self.pid();
        report.discovery_rss_mb = pid.and_then(peak_rss_mb);
        report.discovery_cpu_s = pid.and_then(cpu_seconds);
    }
}

/// What the proxies measured against pilot-discovery.
struct Phase {
    tally: Tally,
    connect: Vec<Duration>,
    /// The scenario's measure: connect times, or change times.
    samples: Vec<Duration>,
    /// Proxy 0's change, to replay, when asked for.
    capture: Option<Result<Capture>>,
    /// Sustained endpoint churn's figures.
    churn: Option<ChurnFigures>,
    /// pilot-discovery's CPU seconds from the one change's write to its last proxy's ACK.
    change_cpu_s: Option<f64>,
}

/// Runs `proxies` proxies against pilot-discovery through the handshake and the scenario's
/// change; with `record`, proxy 0 records what it receives for the raw phase.
async fn discovery_phase(opts: &LoadOptions, control: &ControlPlane, proxies: usize, record: bool) -> Result<Phase> {
    let sustained = opts.scenario == Scenario::EndpointChurn && opts.churn.rate > 0.0;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    let upstream = Upstream::new(control.addr.clone(), opts.streams_per_connection);
    for n in 0..proxies {
        let proxy = ProxyOptions {
            delta: opts.delta,
            record: record && n == 0,
            endpoints: sustained,
            namespaces: opts.mesh.namespaces,
            light: opts.light,
        };
        tasks.spawn(run_proxy(upstream.clone(), n, proxy, tx.clone()));
    }
    drop(tx);
    let mut tally = Tally::new(proxies, rx, tokio::time::Instant::now() + opts.timeout);
    tally.until(Tally::settled).await;
    let connect = tally.connect_times(0..proxies);
    let watched = match opts.scenario {
        Scenario::Connect | Scenario::Ramp => None,
        Scenario::ConfigChange | Scenario::Raw => Some(Watched::Routes),
        Scenario::EndpointChurn => Some(Watched::Endpoints),
    };
    let mut phase = Phase {
        samples: connect.clone(),
        connect,
        capture: None,
        churn: None,
        change_cpu_s: None,
        tally,
    };
    if sustained {
        let figures = churn(&mut phase.tally, &opts.mesh, &opts.churn, &control.dir, opts.timeout).await?;
        phase.samples = figures.lags.clone();
        phase.churn = Some(figures);
    } else if let Some(watched) = watched {
        let cpu_before = control.pid().and_then(cpu_seconds);
        let made = change(&mut phase.tally, opts, &control.dir, watched).await?;
        if let (Some(before), Some(after)) = (cpu_before, control.pid().and_then(cpu_seconds)) {
            phase.change_cpu_s = Some(after - before);
        }
        phase.samples = phase.tally.change_times();
        if record {
            let acked = phase.tally.changed.first().copied().flatten().map(|d| made + d);
            let recorded = std::mem::take(&mut phase.tally.recorded);
            phase.capture = Some(Capture::new(recorded, made, acked));
        }
    }
    tasks.shutdown().await;
    Ok(phase)
}

/// Makes the scenario's one change (config-change: rewrites VirtualService 0; endpoint-churn:
/// moves service 0's endpoints), returns when it was made and measures, per proxy that sees
/// service 0, the time from the write to its ACK of routes (resp. endpoints) that differ from
/// what it had before.
async fn change(tally: &mut Tally, opts: &LoadOptions, dir: &std::path::Path, watched: Watched) -> Result<Instant> {
    if watched == Watched::Routes && opts.mesh.virtual_services == 0 {
        bail!("config-change needs at least one VirtualService (--virtual-services)");
    }
    if watched == Watched::Endpoints && (opts.mesh.services == 0 || opts.mesh.endpoints == 0) {
        bail!("endpoint-churn needs at least one service with endpoints");
    }
    let made = Instant::now();
    tally.change_made(watched, made);
    // with Sidecar scoping only the proxies of service 0's namespace see the change
    tally.expect_change((0..tally.changed.len()).map(|n| opts.mesh.sees(n, 0)).collect());
    match watched {
        Watched::Routes => change_virtual_service(dir, &opts.mesh, 0, 1)?,
        Watched::Endpoints => churn_endpoints(dir, &opts.mesh, 1)?,
    }
    tally.until(Tally::all_changed).await;
    Ok(made)
}
