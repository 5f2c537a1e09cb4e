//! The Envoy supervisor, Istio's `envoy.Agent` with the restart budget of its epoch-based
//! predecessor: one task owns every Envoy process, restarts the latest one with backoff
//! (200ms·2ⁿ, 10 attempts) when it dies, starts epoch N+1 on a hot restart, and drains and stops
//! Envoy on shutdown. Dropping the [`Supervisor`] kills every Envoy it started.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::admin::{AdminClient, known_istio_listeners};
use super::process::HotRestartChain;
use super::runner::{Command, Runner};
use super::{EnvoyConfig, EnvoyError, ExitReport};
use model::NodeType;

/// When Envoy is restarted after it exits unexpectedly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The delay before the first restart, doubled for each restart in a row (Istio: 200ms·2ⁿ).
    pub initial_backoff: Duration,
    /// Restarts in a row before giving up (Istio's budget: 10).
    pub max_restarts: u32,
    /// An Envoy that ran at least this long before exiting was healthy: the budget starts over.
    pub healthy_uptime: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(200),
            max_restarts: 10,
            healthy_uptime: Duration::from_secs(10),
        }
    }
}

impl RestartPolicy {
    /// The delay before restart number `attempt` (0-based): `initial_backoff · 2^attempt`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        self.initial_backoff.saturating_mul(factor)
    }
}

/// How the supervisor runs, apart from Envoy's own settings.
#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    pub restart: RestartPolicy,
    /// After SIGTERM, how long Envoy gets before SIGKILL.
    pub kill_grace: Duration,
    /// How often a drain with `exit_on_zero_active_connections` reads the connection count (Istio: 1s).
    pub active_connection_poll: Duration,
    /// Where the supervisor publishes what it does (starts, exits, scheduled restarts).
    pub events: Option<broadcast::Sender<SupervisorEvent>>,
}

impl Default for SupervisorOptions {
    fn default() -> Self {
        Self {
            restart: RestartPolicy::default(),
            kill_grace: Duration::from_secs(5),
            active_connection_poll: Duration::from_secs(1),
            events: None,
        }
    }
}

/// Something the supervisor did.
#[derive(Debug, Clone, PartialEq)]
pub enum SupervisorEvent {
    Started {
        epoch: u32,
        pid: u32,
    },
    Exited(ExitReport),
    /// `attempt` counts from 1 up to the budget.
    RestartScheduled {
        attempt: u32,
        delay: Duration,
    },
    Draining,
    Terminating,
}

/// The latest Envoy as the supervisor sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyState {
    /// The restart epoch of the newest Envoy, while it runs.
    pub epoch: Option<u32>,
    /// Its pid, while it runs.
    pub pid: Option<u32>,
    /// Restarts after unexpected exits so far.
    pub restarts: u32,
    /// `drain_and_stop` has begun: no more restarts.
    pub draining: bool,
}

type Outcome = Result<ExitReport, EnvoyError>;

/// Runs Envoy until it is stopped or keeps failing. See the module docs.
pub struct Supervisor {
    config: Arc<EnvoyConfig>,
    admin: AdminClient,
    known_listeners: HashSet<String>,
    poll: Duration,
    commands: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<EnvoyState>,
    outcome: watch::Receiver<Option<Outcome>>,
    task: JoinHandle<()>,
}

impl Supervisor {
    /// Starts Envoy (epoch 0) with Istio's restart policy. Must run inside a Tokio runtime.
    pub fn start(config: EnvoyConfig) -> Result<Self, EnvoyError> {
        Self::start_with(config, SupervisorOptions::default())
    }

    pub fn start_with(config: EnvoyConfig, options: SupervisorOptions) -> Result<Self, EnvoyError> {
        let config = Arc::new(config);
        let admin = AdminClient::for_config(&config)?;
        let (state_tx, state) = watch::channel(EnvoyState::default());
        let (outcome_tx, outcome) = watch::channel(None);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let chain = config.hot_restart.then(|| HotRestartChain::new(config.base_id_path()));
        let mut runner = Runner::new(config.clone(), &options, state_tx, chain);
        runner.start_fresh()?;
        let task = tokio::spawn(async move {
            let outcome = runner.run(commands_rx).await;
            match &outcome {
                Ok(report) => tracing::info!("{report}; the supervisor is done"),
                Err(err) => tracing::error!("{err}"),
            }
            let _ = outcome_tx.send(Some(outcome));
        });
        Ok(Self {
            known_listeners: known_istio_listeners(config.status_port, config.prometheus_port),
            config,
            admin,
            poll: options.active_connection_poll,
            commands,
            state,
            outcome,
            task,
        })
    }

    pub fn config(&self) -> &EnvoyConfig {
        &self.config
    }

    /// The latest Envoy, updated on every start and exit.
    pub fn state(&self) -> watch::Receiver<EnvoyState> {
        self.state.clone()
    }

    /// The pid of the newest running Envoy.
    pub fn pid(&self) -> Option<u32> {
        self.state.borrow().pid
    }

    /// Starts a new Envoy with the next restart epoch; the current one hands over its listeners,
    /// drains, and exits after `parent_shutdown_duration`. Returns the new epoch.
    pub async fn hot_restart(&self) -> Result<u32, EnvoyError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::HotRestart(reply))
            .map_err(|_| EnvoyError::Stopped)?;
        answer.await.map_err(|_| EnvoyError::Stopped)?
    }

    /// Waits until the supervisor is done: `Ok` with the last Envoy's exit once it was stopped or
    /// exited cleanly by itself, `Err` once restarts are exhausted.
    pub async fn wait(&self) -> Outcome {
        let mut outcome = self.outcome.clone();
        match outcome.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or(Err(EnvoyError::Stopped)),
            Err(_) => Err(EnvoyError::Stopped),
        }
    }

    /// Istio's graceful termination: drain listeners, wait `termination_drain_duration` (or, with
    /// `exit_on_zero_active_connections`, at least `minimum_drain_duration` and until no downstream
    /// connection is left, at most the longer of the two durations), then SIGTERM Envoy (SIGKILL
    /// after the grace period). Returns how Envoy exited.
    pub async fn drain_and_stop(&self) -> Outcome {
        if self.commands.send(Command::Drain).is_err() {
            return self.wait().await;
        }
        tokio::select! {
            outcome = self.wait() => {
                tracing::info!("Graceful termination ended early: Envoy exited during the drain");
                return outcome;
            }
            () = self.drain() => {}
        }
        let _ = self.commands.send(Command::Terminate);
        self.wait().await
    }

    async fn drain(&self) {
        let started = Instant::now();
        tracing::info!("Agent draining Proxy for termination");
        let inbound_only = self.config.node_type == NodeType::SidecarProxy;
        if let Err(err) = self.admin.drain_listeners(inbound_only).await {
            tracing::warn!("Error in invoking drain listeners endpoint: {err}");
        }
        let termination = self.config.termination_drain_duration;
        if !self.config.exit_on_zero_active_connections {
            tracing::info!("Graceful termination period is {termination:?}, starting...");
            sleep(termination).await;
            tracing::info!("Graceful termination period complete, terminating remaining proxies.");
            return;
        }
        let minimum = self.config.minimum_drain_duration;
        let deadline = started + minimum.max(termination);
        tracing::info!("Agent draining proxy for {minimum:?}, then waiting for active connections to terminate...");
        sleep(minimum).await;
        let mut failures = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::info!("Termination drain duration passed with connections still active, terminating proxy");
                return;
            }
            sleep(self.poll.min(left)).await;
            match self.admin.active_connections(&self.known_listeners).await {
                Ok(Some(0)) => {
                    tracing::info!("There are no more active connections. terminating proxy...");
                    return;
                }
                Ok(Some(active)) => {
                    tracing::info!("There are still {active} active connections");
                    failures = 0;
                }
                Ok(None) => {
                    tracing::info!("downstream_cx_active is not available; skipping the active connections check");
                    return;
                }
                Err(err) => {
                    failures += 1;
                    // Istio gives up after 5 failed reads in a row.
                    if failures > 4 {
                        tracing::warn!("Graceful termination ended early, cannot read active connections: {err}");
                        return;
                    }
                    tracing::warn!("Retrying ({failures}) to obtain active connections: {err}");
                }
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // The runner owns every Envoy (kill_on_drop): ending it kills them.
        self.task.abort();
    }
}
