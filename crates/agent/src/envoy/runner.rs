//! The supervisor's task. It alone owns the Envoy processes, so it needs no locks: it reacts to
//! process exits (restart the latest epoch with backoff, or give up), to commands from the
//! [`Supervisor`](super::Supervisor) (hot restart, drain, terminate) and to its two timers
//! (the scheduled restart, SIGKILL after the grace period).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};

use super::args::HotRestartArgs;
use super::process::{EpochProcess, HotRestartChain};
use super::supervisor::{EnvoyState, RestartPolicy, SupervisorEvent, SupervisorOptions};
use super::{EnvoyConfig, EnvoyError, ExitReport};

type Outcome = Result<ExitReport, EnvoyError>;

pub(super) enum Command {
    HotRestart(oneshot::Sender<Result<u32, EnvoyError>>),
    /// Draining has begun: an exit from now on is final.
    Drain,
    /// SIGTERM every Envoy, SIGKILL after the grace period.
    Terminate,
}

pub(super) struct Runner {
    config: Arc<EnvoyConfig>,
    policy: RestartPolicy,
    kill_grace: Duration,
    events: Option<broadcast::Sender<SupervisorEvent>>,
    state: watch::Sender<EnvoyState>,
    /// Running processes by spawn id.
    epochs: BTreeMap<u64, EpochProcess>,
    /// Set when hot restart is on; dropped after `epochs`, so its files go once Envoy is killed.
    chain: Option<HotRestartChain>,
    exits_tx: mpsc::UnboundedSender<(u64, ExitReport)>,
    exits: mpsc::UnboundedReceiver<(u64, ExitReport)>,
    next_id: u64,
    /// Spawn id and epoch of the newest Envoy, running or not.
    latest: Option<(u64, u32)>,
    /// How the newest Envoy exited.
    last_exit: Option<ExitReport>,
    /// Restarts in a row (the budget used).
    attempts: u32,
    restart_at: Option<Instant>,
    kill_at: Option<Instant>,
    stopping: bool,
}

impl Runner {
    pub(super) fn new(
        config: Arc<EnvoyConfig>,
        options: &SupervisorOptions,
        state: watch::Sender<EnvoyState>,
        chain: Option<HotRestartChain>,
    ) -> Self {
        let (exits_tx, exits) = mpsc::unbounded_channel();
        Self {
            config,
            policy: options.restart.clone(),
            kill_grace: options.kill_grace,
            events: options.events.clone(),
            state,
            epochs: BTreeMap::new(),
            chain,
            exits_tx,
            exits,
            next_id: 0,
            latest: None,
            last_exit: None,
            attempts: 0,
            restart_at: None,
            kill_at: None,
            stopping: false,
        }
    }

    /// Starts epoch 0 of a new chain.
    pub(super) fn start_fresh(&mut self) -> Result<u32, EnvoyError> {
        let restart = match &mut self.chain {
            Some(chain) => {
                chain.begin();
                HotRestartArgs::First {
                    base_id_path: self.config.base_id_path(),
                }
            }
            None => HotRestartArgs::Disabled,
        };
        self.spawn(&restart)
    }

    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) -> Outcome {
        let mut commands_open = true;
        loop {
            let restart_at = self.restart_at;
            let kill_at = self.kill_at;
            let outcome = tokio::select! {
                Some((id, report)) = self.exits.recv() => self.on_exit(id, report),
                command = commands.recv(), if commands_open => match command {
                    Some(Command::HotRestart(reply)) => {
                        let _ = reply.send(self.hot_restart());
                        None
                    }
                    Some(Command::Drain) => self.stop_restarting(),
                    Some(Command::Terminate) => self.terminate(),
                    // The Supervisor is gone; it aborts this task.
                    None => {
                        commands_open = false;
                        None
                    }
                },
                () = sleep_until(restart_at.unwrap_or_else(Instant::now)), if restart_at.is_some() => {
                    self.restart_at = None;
                    self.start_fresh().err().map(Err)
                }
                () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    self.kill_at = None;
                    for process in self.epochs.values() {
                        tracing::warn!("Envoy epoch {} (pid {}) ignored SIGTERM, killing it", process.epoch, process.pid);
                        process.kill();
                    }
                    None
                }
            };
            if let Some(outcome) = outcome {
                return outcome;
            }
        }
    }

    fn spawn(&mut self, restart: &HotRestartArgs) -> Result<u32, EnvoyError> {
        let id = self.next_id;
        self.next_id += 1;
        let process = EpochProcess::spawn(id, &self.config, restart, self.exits_tx.clone())?;
        let (epoch, pid) = (process.epoch, process.pid);
        self.epochs.insert(id, process);
        self.latest = Some((id, epoch));
        self.state.send_modify(|state| {
            state.epoch = Some(epoch);
            state.pid = Some(pid);
        });
        self.emit(SupervisorEvent::Started { epoch, pid });
        Ok(epoch)
    }

    fn on_exit(&mut self, id: u64, report: ExitReport) -> Option<Outcome> {
        self.epochs.remove(&id);
        self.emit(SupervisorEvent::Exited(report));
        if self.latest.is_none_or(|(latest, _)| latest != id) {
            // A hot restart parent that was told to shut down, or one killed after a crash.
            tracing::info!("{report} (an earlier epoch)");
            return (self.stopping && self.epochs.is_empty()).then(|| self.finish());
        }
        self.last_exit = Some(report);
        self.state.send_modify(|state| {
            state.epoch = None;
            state.pid = None;
        });
        if self.stopping {
            tracing::info!("{report}");
            return self.epochs.is_empty().then(|| self.finish());
        }
        if report.success() {
            tracing::info!("{report}: Envoy exited normally");
            return Some(self.finish());
        }
        tracing::error!("{report}: Envoy exited unexpectedly");
        if report.killed() {
            tracing::warn!("Envoy may have been out of memory killed. Check memory usage and limits.");
        }
        // As Istio: a failed epoch takes every other epoch down, and Envoy starts over at epoch 0.
        for process in self.epochs.values() {
            process.kill();
        }
        if report.uptime >= self.policy.healthy_uptime {
            self.attempts = 0;
        }
        if self.attempts >= self.policy.max_restarts {
            return Some(Err(EnvoyError::RestartBudgetExhausted {
                restarts: self.attempts,
                last: report,
                config: self.config.config_path.clone(),
            }));
        }
        let delay = self.policy.backoff(self.attempts);
        self.attempts += 1;
        self.restart_at = Some(Instant::now() + delay);
        self.state.send_modify(|state| state.restarts += 1);
        tracing::warn!(
            "restarting Envoy in {delay:?} (attempt {} of {})",
            self.attempts,
            self.policy.max_restarts
        );
        self.emit(SupervisorEvent::RestartScheduled {
            attempt: self.attempts,
            delay,
        });
        None
    }

    fn hot_restart(&mut self) -> Result<u32, EnvoyError> {
        if self.stopping {
            return Err(EnvoyError::Stopped);
        }
        let Some(chain) = self.chain.as_mut() else {
            return Err(EnvoyError::HotRestartDisabled);
        };
        let running = self.latest.filter(|(id, _)| self.epochs.contains_key(id));
        let Some((_, epoch)) = running else {
            return Err(EnvoyError::NothingToHotRestart);
        };
        let base_id = chain.base_id()?;
        let next = epoch.saturating_add(1);
        tracing::info!("hot restarting Envoy: epoch {epoch} -> {next} (base id {base_id})");
        self.spawn(&HotRestartArgs::Next { epoch: next, base_id })
    }

    fn stop_restarting(&mut self) -> Option<Outcome> {
        self.stopping = true;
        self.restart_at = None;
        self.state.send_modify(|state| state.draining = true);
        self.emit(SupervisorEvent::Draining);
        self.epochs.is_empty().then(|| self.finish())
    }

    fn terminate(&mut self) -> Option<Outcome> {
        if let Some(outcome) = self.stop_restarting() {
            return Some(outcome);
        }
        self.emit(SupervisorEvent::Terminating);
        for process in self.epochs.values() {
            tracing::info!("terminating Envoy epoch {} (pid {})", process.epoch, process.pid);
            process.terminate();
        }
        self.kill_at = Some(Instant::now() + self.kill_grace);
        None
    }

    /// The end: how the newest Envoy exited. Envoys still running are killed when the runner drops.
    fn finish(&mut self) -> Outcome {
        self.last_exit.ok_or(EnvoyError::Stopped)
    }

    fn emit(&self, event: SupervisorEvent) {
        if let Some(events) = &self.events {
            // No subscriber is fine.
            let _ = events.send(event);
        }
    }
}
