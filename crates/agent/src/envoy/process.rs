//! One Envoy process (one restart epoch): spawned with `kill_on_drop`, watched by its own task
//! that reports the exit, and signalled (SIGTERM, SIGKILL) through that task so a signal never
//! reaches a reaped pid. Also the hot restart chain's base id and its `/dev/shm` leftovers.

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::args::{HotRestartArgs, epoch_args};
use super::{EnvoyConfig, EnvoyError, ExitReport};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Terminate,
    Kill,
}

/// A running Envoy epoch. Dropping it kills the process.
pub(crate) struct EpochProcess {
    pub(crate) epoch: u32,
    pub(crate) pid: u32,
    stop: mpsc::UnboundedSender<Stop>,
    waiter: JoinHandle<()>,
}

impl EpochProcess {
    /// Starts Envoy; `(id, its ExitReport)` is sent on `exits` when it ends.
    pub(crate) fn spawn(
        id: u64,
        config: &EnvoyConfig,
        restart: &HotRestartArgs,
        exits: mpsc::UnboundedSender<(u64, ExitReport)>,
    ) -> Result<Self, EnvoyError> {
        let epoch = restart.epoch();
        let args = epoch_args(config, restart);
        tracing::info!("Envoy command: {} {args:?}", config.binary_path.display());
        let mut child = Command::new(&config.binary_path)
            .args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| EnvoyError::Spawn {
                binary: config.binary_path.clone(),
                source: Arc::new(source),
            })?;
        let started = Instant::now();
        let Some(pid) = child.id() else {
            // Only possible if it was already reaped, which nothing here does.
            let _ = child.start_kill();
            return Err(EnvoyError::Spawn {
                binary: config.binary_path.clone(),
                source: Arc::new(io::Error::other("the process has no pid")),
            });
        };
        tracing::info!("Envoy epoch {epoch} started (pid {pid})");
        let (stop, stops) = mpsc::unbounded_channel();
        let waiter = tokio::spawn(async move {
            let status = watch(&mut child, stops).await;
            let report = ExitReport {
                epoch,
                pid,
                status,
                uptime: started.elapsed(),
            };
            let _ = exits.send((id, report));
        });
        Ok(Self {
            epoch,
            pid,
            stop,
            waiter,
        })
    }

    /// SIGTERM: Envoy closes its listeners and exits.
    pub(crate) fn terminate(&self) {
        let _ = self.stop.send(Stop::Terminate);
    }

    pub(crate) fn kill(&self) {
        let _ = self.stop.send(Stop::Kill);
    }
}

impl Drop for EpochProcess {
    fn drop(&mut self) {
        // Dropping the waiter's future drops the Child, which kill_on_drop SIGKILLs.
        self.waiter.abort();
    }
}

/// Waits for `child` to exit, passing on stop requests meanwhile.
async fn watch(child: &mut Child, mut stops: mpsc::UnboundedReceiver<Stop>) -> ExitStatus {
    let mut stops_open = true;
    loop {
        tokio::select! {
            status = child.wait() => match status {
                Ok(status) => return status,
                Err(err) => {
                    tracing::error!("waiting for Envoy failed, killing it: {err}");
                    let _ = child.start_kill();
                    return ExitStatus::from_raw(Signal::SIGKILL as i32);
                }
            },
            stop = stops.recv(), if stops_open => match stop {
                Some(Stop::Terminate) => {
                    // `id()` is None once the child is reaped: no signal to a recycled pid.
                    let pid = child.id().and_then(|pid| i32::try_from(pid).ok());
                    if let Some(pid) = pid
                        && let Err(err) = kill(Pid::from_raw(pid), Signal::SIGTERM)
                    {
                        tracing::warn!("SIGTERM to Envoy (pid {pid}) failed: {err}");
                    }
                }
                Some(Stop::Kill) => {
                    if let Err(err) = child.start_kill() {
                        tracing::warn!("SIGKILL to Envoy failed: {err}");
                    }
                }
                None => stops_open = false,
            },
        }
    }
}

/// The base id shared by the epochs of one hot restart chain. Epoch 0 picks it
/// (`--use-dynamic-base-id`) and writes it to `path`; the agent reads it for later epochs and,
/// when the chain ends, removes the file and the shared memory Envoy leaves in `/dev/shm`.
pub(crate) struct HotRestartChain {
    path: PathBuf,
    base_id: Option<u32>,
}

impl HotRestartChain {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path, base_id: None }
    }

    /// Forgets the previous chain, for a new epoch 0.
    pub(crate) fn begin(&mut self) {
        self.end();
    }

    /// The chain's base id, read once from the file epoch 0 wrote.
    pub(crate) fn base_id(&mut self) -> Result<u32, EnvoyError> {
        if let Some(id) = self.base_id {
            return Ok(id);
        }
        let error = |source: io::Error| EnvoyError::BaseId {
            path: self.path.clone(),
            source: Arc::new(source),
        };
        let text = std::fs::read_to_string(&self.path).map_err(error)?;
        let id = text
            .trim()
            .parse::<u32>()
            .map_err(|err| error(io::Error::new(io::ErrorKind::InvalidData, err)))?;
        self.base_id = Some(id);
        Ok(id)
    }

    /// Removes the base id file and the chain's shared memory. Call once no epoch runs.
    pub(crate) fn end(&mut self) {
        if self.base_id.is_none() {
            // Epoch 0 may have written the file without anyone reading it yet.
            let _ = self.base_id();
        }
        if let Some(id) = self.base_id.take() {
            remove_quietly(&shared_memory_path(id));
        }
        remove_quietly(&self.path);
    }
}

impl Drop for HotRestartChain {
    fn drop(&mut self) {
        self.end();
    }
}

/// Envoy's hot restart shared memory: `shm_open("/envoy_shared_memory_<base id × 10>")`.
pub(crate) fn shared_memory_path(base_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/envoy_shared_memory_{}", u64::from(base_id) * 10))
}

fn remove_quietly(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!("removed {}", path.display()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => tracing::warn!("cannot remove {}: {err}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_reads_the_base_id_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("envoy-base-id");
        let mut chain = HotRestartChain::new(path.clone());
        assert!(matches!(chain.base_id(), Err(EnvoyError::BaseId { .. })));
        std::fs::write(&path, "12345\n").unwrap();
        assert_eq!(chain.base_id().unwrap(), 12345);
        assert_eq!(
            shared_memory_path(12345),
            Path::new("/dev/shm/envoy_shared_memory_123450")
        );
        chain.end();
        assert!(!path.exists());
        std::fs::write(&path, "not a number").unwrap();
        assert!(matches!(chain.base_id(), Err(EnvoyError::BaseId { .. })));
    }
}
