//! The scenarios: start (or reach) pilot-discovery on a synthetic mesh, run N simulated proxies
//! and measure `connect` (connect to last handshake ACK, per proxy) or `config-change` (one
//! VirtualService file write to every proxy's ACK of the new routes) or `endpoint-churn` (one
//! service's endpoints moved to every proxy's ACK of the new endpoints).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use test_support::discovery::{Discovery, DiscoveryOptions};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::mesh::{MeshSpec, change_virtual_service, churn_endpoints, write_mesh};
use crate::proxy::{ProxyEvent, Watched, run_proxy};
use crate::report::{Report, cpu_seconds, peak_rss_mb, percentile_ms};

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Connect,
    ConfigChange,
    EndpointChurn,
}

impl Scenario {
    pub fn as_str(&self) -> &'static str {
        match self {
            Scenario::Connect => "connect",
            Scenario::ConfigChange => "config-change",
            Scenario::EndpointChurn => "endpoint-churn",
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
            "ramp" | "raw" => Err(format!("scenario {s:?} is not implemented yet")),
            _ => Err(format!(
                "unknown scenario {s:?} (connect, config-change, endpoint-churn)"
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
    /// An already running pilot-discovery's gRPC address; it must watch `config_dir`.
    pub discovery: Option<String>,
    /// The process ID of that running pilot-discovery, to read its memory and CPU.
    pub discovery_pid: Option<u32>,
    /// Where the mesh is written; a temporary directory if `None`.
    pub config_dir: Option<PathBuf>,
    /// PILOT_DEBOUNCE_AFTER of the pilot-discovery started here.
    pub debounce_after: String,
    pub timeout: Duration,
}

/// Runs one scenario to the end or to `opts.timeout`, whichever comes first.
pub async fn run(opts: &LoadOptions) -> Result<Report> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + opts.timeout;
    let temp = tempfile::tempdir()?;
    let dir = opts.config_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write_mesh(&dir, &opts.mesh)?;
    let (discovery, addr) = match &opts.discovery {
        Some(addr) => {
            // A running pilot-discovery picks the files up through its watcher (100ms debounce
            // plus PILOT_DEBOUNCE_AFTER): let it load them before the proxies connect.
            tokio::time::sleep(EXTERNAL_LOAD_WAIT).await;
            (None, addr.clone())
        }
        None => {
            let env = vec![("PILOT_DEBOUNCE_AFTER".to_owned(), opts.debounce_after.clone())];
            let d = Discovery::start(
                &dir,
                DiscoveryOptions {
                    env,
                    ..Default::default()
                },
            )
            .await?;
            let addr = d.grpc_addr.to_string();
            (Some(d), addr)
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut proxies = JoinSet::new();
    for n in 0..opts.proxies {
        proxies.spawn(run_proxy(addr.clone(), n, opts.delta, tx.clone()));
    }
    drop(tx);
    let mut run = Run::new(opts.proxies, rx, deadline);
    run.until(|r| r.settled()).await;
    let connected: Vec<Duration> = run.converged.iter().flatten().copied().collect();
    let samples = match opts.scenario {
        Scenario::Connect => connected.clone(),
        Scenario::ConfigChange | Scenario::EndpointChurn => change(&mut run, opts, &dir).await?,
    };
    let pid = discovery.as_ref().and_then(Discovery::pid).or(opts.discovery_pid);
    let report = Report {
        scenario: opts.scenario.as_str().to_owned(),
        delta: opts.delta,
        proxies: opts.proxies,
        services: opts.mesh.services,
        endpoints: opts.mesh.endpoints,
        converged: samples.len(),
        connect_p50_ms: percentile_ms(&connected, 0.5),
        connect_p99_ms: percentile_ms(&connected, 0.99),
        convergence_p50_ms: percentile_ms(&samples, 0.5),
        convergence_p99_ms: percentile_ms(&samples, 0.99),
        convergence_max_ms: percentile_ms(&samples, 1.0),
        discovery_rss_mb: pid.and_then(peak_rss_mb),
        discovery_cpu_s: pid.and_then(cpu_seconds),
        loadgen_cpu_s: cpu_seconds(std::process::id()),
        bytes_sent: run.bytes,
        errors: run.errors,
        wall_s: started.elapsed().as_secs_f64(),
    };
    proxies.shutdown().await;
    drop(discovery);
    Ok(report)
}

/// Makes the scenario's one change (config-change: rewrites VirtualService 0; endpoint-churn:
/// moves service 0's endpoints) and measures, per proxy, the time from the write to its ACK of
/// routes (resp. endpoints) that differ from what it had before.
async fn change(run: &mut Run, opts: &LoadOptions, dir: &std::path::Path) -> Result<Vec<Duration>> {
    let watched = if opts.scenario == Scenario::EndpointChurn {
        Watched::Endpoints
    } else {
        Watched::Routes
    };
    if watched == Watched::Routes && opts.mesh.virtual_services == 0 {
        bail!("config-change needs at least one VirtualService (--virtual-services)");
    }
    if watched == Watched::Endpoints && (opts.mesh.services == 0 || opts.mesh.endpoints == 0) {
        bail!("endpoint-churn needs at least one service with endpoints");
    }
    let before = run.content[watched as usize].clone();
    let written = Instant::now();
    match watched {
        Watched::Routes => change_virtual_service(dir, 0, 1)?,
        Watched::Endpoints => churn_endpoints(dir, &opts.mesh, 1)?,
    }
    run.changed_since = Some((watched, written, before));
    run.until(|r| {
        r.changed
            .iter()
            .zip(&r.converged)
            .all(|(c, v)| c.is_some() || v.is_none())
    })
    .await;
    Ok(run.changed.iter().flatten().copied().collect())
}

/// What the proxies have reported so far.
struct Run {
    rx: mpsc::UnboundedReceiver<ProxyEvent>,
    deadline: tokio::time::Instant,
    converged: Vec<Option<Duration>>,
    failed: Vec<bool>,
    /// Per watched type, per proxy: a hash of the last resources ACKed.
    content: [Vec<Option<u64>>; 2],
    /// The change: which type it shows in, when it was written, each proxy's content before it.
    changed_since: Option<(Watched, Instant, Vec<Option<u64>>)>,
    changed: Vec<Option<Duration>>,
    bytes: u64,
    errors: Vec<String>,
}

impl Run {
    fn new(n: usize, rx: mpsc::UnboundedReceiver<ProxyEvent>, deadline: tokio::time::Instant) -> Run {
        Run {
            rx,
            deadline,
            converged: vec![None; n],
            failed: vec![false; n],
            content: [vec![None; n], vec![None; n]],
            changed_since: None,
            changed: vec![None; n],
            bytes: 0,
            errors: Vec::new(),
        }
    }

    /// Every proxy converged or failed.
    fn settled(&self) -> bool {
        self.converged.iter().zip(&self.failed).all(|(c, f)| c.is_some() || *f)
    }

    /// Applies events until `done` holds, the proxies are all gone, or the deadline.
    async fn until(&mut self, done: impl Fn(&Run) -> bool) {
        while !done(self) {
            match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
                Ok(Some(e)) => self.apply(e),
                Ok(None) => return,
                Err(_) => {
                    self.errors.push("timed out (--timeout)".to_owned());
                    return;
                }
            }
        }
    }

    fn apply(&mut self, e: ProxyEvent) {
        match e {
            ProxyEvent::Converged { proxy, elapsed } => self.converged[proxy] = Some(elapsed),
            ProxyEvent::Bytes(b) => self.bytes += b as u64,
            ProxyEvent::Failed { proxy, error } => {
                self.failed[proxy] = true;
                self.errors.push(format!("proxy {proxy}: {error}"));
            }
            ProxyEvent::Acked {
                proxy,
                watched,
                content,
                at,
            } => {
                if let Some((w, written, before)) = &self.changed_since
                    && *w == watched
                    && self.changed[proxy].is_none()
                    && before[proxy] != Some(content)
                {
                    self.changed[proxy] = Some(at.saturating_duration_since(*written));
                }
                self.content[watched as usize][proxy] = Some(content);
            }
        }
    }
}
