//! Running Envoy, as Istio's `pkg/envoy`: the command line Envoy starts with ([`EnvoyConfig`]),
//! the [`Supervisor`] that starts it, restarts it with backoff when it dies, hot-restarts it on
//! demand and drains it gracefully on shutdown, and the admin calls that draining needs.

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use model::NodeType;

mod admin;
mod args;
mod process;
mod runner;
mod supervisor;
#[cfg(test)]
mod tests;

pub use admin::{AdminClient, active_proxy_connections, known_istio_listeners};
pub use args::{envoy_args, split_component_log};
pub use supervisor::{EnvoyState, RestartPolicy, Supervisor, SupervisorEvent, SupervisorOptions};

/// The environment variable that turns on Envoy hot restart (`true`/`1`): a certificate change
/// then starts a new Envoy with the next restart epoch instead of nothing. Off by default, as in
/// Istio, which always passes `--disable-hot-restart`.
pub const ENABLE_ENVOY_HOT_RESTART: &str = "ENABLE_ENVOY_HOT_RESTART";

/// Reads [`ENABLE_ENVOY_HOT_RESTART`] through `lookup` (the process env in the binary, a map in
/// tests).
pub fn hot_restart_enabled(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup(ENABLE_ENVOY_HOT_RESTART).is_some_and(|value| matches!(value.trim(), "true" | "True" | "TRUE" | "1"))
}

/// `--local-address-ip-version`: the address family Envoy uses for its own local addresses, and
/// which loopback address its admin API listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IpVersion {
    #[default]
    V4,
    V6,
}

impl IpVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            IpVersion::V4 => "v4",
            IpVersion::V6 => "v6",
        }
    }

    /// Loopback as it goes in a URL authority: `127.0.0.1` or `[::1]`.
    pub fn localhost(self) -> &'static str {
        match self {
            IpVersion::V4 => "127.0.0.1",
            IpVersion::V6 => "[::1]",
        }
    }
}

/// How Envoy is started and stopped: Istio's `envoy.ProxyConfig` plus the agent's drain settings
/// (`proxyConfig.drainDuration`, `terminationDrainDuration`, `MINIMUM_DRAIN_DURATION`,
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`). Defaults are Istio's.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyConfig {
    /// `proxyConfig.binaryPath`.
    pub binary_path: PathBuf,
    /// The bootstrap (`-c`), e.g. `./etc/istio/proxy/envoy-rev.json`.
    pub config_path: PathBuf,
    /// `--drain-time-s`: how long listeners keep accepting while draining (`proxyConfig.drainDuration`).
    pub drain_duration: Duration,
    /// How long `drain_and_stop` waits between draining and terminating Envoy
    /// (`proxyConfig.terminationDrainDuration`).
    pub termination_drain_duration: Duration,
    /// `--parent-shutdown-time-s`: with hot restart, when the previous epoch is told to exit.
    pub parent_shutdown_duration: Duration,
    /// `--concurrency`: worker threads; `None` or `Some(0)` lets Envoy decide.
    pub concurrency: Option<u32>,
    /// `-l`; may also carry component levels, as `warning,misc:error` (Istio's `--proxyLogLevel`).
    pub log_level: String,
    /// `--component-log-level`, used when `log_level` names no component (`--proxyComponentLogLevel`).
    pub component_log_level: String,
    /// `--service-cluster`; left out when empty.
    pub service_cluster: String,
    /// `--service-node` (the node ID `type~ip~id~domain`); left out when empty.
    pub service_node: String,
    pub local_address_ip_version: IpVersion,
    /// `proxyConfig.proxyAdminPort`: where `drain_and_stop` reaches Envoy's admin API.
    pub admin_port: u16,
    /// The status port (15021), whose listener is not counted as an active connection.
    pub status_port: u16,
    /// The Prometheus port (15090), whose listener is not counted as an active connection.
    pub prometheus_port: u16,
    /// Hot restart ([`ENABLE_ENVOY_HOT_RESTART`]); off means `--disable-hot-restart`.
    pub hot_restart: bool,
    /// Where Envoy writes its dynamic base id for hot restart (`--base-id-path`); `None`: next to
    /// `config_path`, as `envoy-base-id`.
    pub base_id_path: Option<PathBuf>,
    /// Appended to Envoy's command line.
    pub extra_args: Vec<String>,
    /// Sidecars drain only inbound listeners (`drain_listeners?inboundonly`); gateways drain all.
    pub node_type: NodeType,
    /// After `minimum_drain_duration`, stop Envoy as soon as no downstream connection is left.
    pub exit_on_zero_active_connections: bool,
    /// With `exit_on_zero_active_connections`: always drain at least this long.
    pub minimum_drain_duration: Duration,
}

impl Default for EnvoyConfig {
    fn default() -> Self {
        Self {
            binary_path: PathBuf::from("/usr/local/bin/envoy"),
            config_path: PathBuf::from("./etc/istio/proxy/envoy-rev.json"),
            drain_duration: Duration::from_secs(45),
            termination_drain_duration: Duration::from_secs(5),
            parent_shutdown_duration: Duration::from_secs(60),
            concurrency: Some(2),
            log_level: "warning".into(),
            component_log_level: "misc:error".into(),
            service_cluster: "istio-proxy".into(),
            service_node: String::new(),
            local_address_ip_version: IpVersion::V4,
            admin_port: 15000,
            status_port: 15021,
            prometheus_port: 15090,
            hot_restart: false,
            base_id_path: None,
            extra_args: Vec::new(),
            node_type: NodeType::SidecarProxy,
            exit_on_zero_active_connections: false,
            minimum_drain_duration: Duration::from_secs(5),
        }
    }
}

impl EnvoyConfig {
    /// Where Envoy writes (epoch 0) and the agent reads (later epochs) the hot restart base id.
    pub fn base_id_path(&self) -> PathBuf {
        match &self.base_id_path {
            Some(path) => path.clone(),
            None => self.config_path.with_file_name("envoy-base-id"),
        }
    }
}

/// How one Envoy process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    pub epoch: u32,
    pub pid: u32,
    pub status: ExitStatus,
    /// How long it ran.
    pub uptime: Duration,
}

impl ExitReport {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The signal that killed it.
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Possibly the OOM killer: Istio warns on `signal: killed`.
    pub fn killed(&self) -> bool {
        self.signal() == Some(nix::sys::signal::Signal::SIGKILL as i32)
    }
}

impl std::fmt::Display for ExitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Envoy epoch {} (pid {}) ", self.epoch, self.pid)?;
        match (self.code(), self.signal()) {
            (Some(code), _) => write!(f, "exited with code {code}")?,
            (None, Some(signal)) => {
                let name = nix::sys::signal::Signal::try_from(signal).map_or("unknown", |signal| signal.as_str());
                write!(f, "was killed by signal {signal} ({name})")?
            }
            (None, None) => write!(f, "ended with {}", self.status)?,
        }
        write!(f, " after {:.1?}", self.uptime)
    }
}

/// What went wrong running Envoy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnvoyError {
    #[error("cannot start Envoy {binary}: {source} (hint: is proxyConfig.binaryPath an executable Envoy?)")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    #[error(
        "Envoy kept exiting: gave up after {restarts} restarts; last: {last} \
         (hint: Envoy's log above says why; check the bootstrap {config})"
    )]
    RestartBudgetExhausted {
        restarts: u32,
        last: ExitReport,
        config: PathBuf,
    },
    #[error("hot restart is disabled (hint: set {ENABLE_ENVOY_HOT_RESTART}=true)")]
    HotRestartDisabled,
    #[error("no Envoy is running to hot-restart from (a restart is pending)")]
    NothingToHotRestart,
    #[error("Envoy's hot restart base id is not readable at {path}: {source} (hint: has epoch 0 started?)")]
    BaseId {
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("Envoy admin {url}: {reason} (hint: is Envoy's admin API on proxyConfig.proxyAdminPort?)")]
    Admin { url: String, reason: String },
    #[error("the Envoy supervisor has stopped")]
    Stopped,
}
