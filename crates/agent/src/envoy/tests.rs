//! Supervisor tests with a real Envoy (`$ENVOY_BIN`) on a static bootstrap: start and restart,
//! the restart budget, graceful drain under load, exit on zero connections, hot restart, and
//! that nothing outlives the supervisor. Small scripts stand in for Envoy where only the process
//! matters.

mod drain;
mod restart;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use test_support::backend::http_get;
use test_support::bootstrap::static_proxy_bootstrap;
use test_support::envoy::envoy_bin;
use test_support::ports::free_port;
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep, timeout};

use super::*;

const READY: Duration = Duration::from_secs(10);

struct Fixture {
    dir: TempDir,
    config: EnvoyConfig,
    listener: SocketAddr,
}

impl Fixture {
    /// Envoy on `static_proxy_bootstrap` with a fixed listener port and admin port.
    fn new(upstream: SocketAddr) -> Fixture {
        let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut bootstrap = static_proxy_bootstrap(listener.port(), upstream);
        Self::with_bootstrap(&mut bootstrap, listener)
    }

    fn with_bootstrap(bootstrap: &mut Value, listener: SocketAddr) -> Fixture {
        let dir = tempfile::Builder::new().prefix("agent-envoy-").tempdir().unwrap();
        let admin_port = free_port();
        bootstrap["admin"] = json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}});
        let config_path = dir.path().join("envoy-rev.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(bootstrap).unwrap()).unwrap();
        let log_path = dir.path().join("envoy.log");
        let config = EnvoyConfig {
            binary_path: envoy_bin().unwrap(),
            config_path,
            drain_duration: Duration::from_secs(5),
            termination_drain_duration: Duration::ZERO,
            parent_shutdown_duration: Duration::from_secs(1),
            concurrency: Some(1),
            log_level: "warning".into(),
            service_node: "sidecar~127.0.0.1~productpage-v1.default~default.svc.cluster.local".into(),
            admin_port,
            base_id_path: Some(dir.path().join("envoy-base-id")),
            extra_args: vec!["--log-path".into(), log_path.display().to_string()],
            node_type: model::NodeType::Router,
            ..EnvoyConfig::default()
        };
        Fixture { dir, config, listener }
    }

    fn admin(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.admin_port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Waits for `/ready` to say LIVE.
    async fn wait_live(&self) {
        let deadline = Instant::now() + READY;
        loop {
            let ready = http_get(&format!("{}/ready", self.admin()), &[]).await;
            if ready
                .as_ref()
                .is_ok_and(|ready| ready.status == 200 && ready.body.trim() == "LIVE")
            {
                return;
            }
            assert!(Instant::now() < deadline, "Envoy not LIVE: {ready:?}\n{}", self.log());
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// `/server_info`'s restart epoch.
    async fn restart_epoch(&self) -> Option<u64> {
        let info = http_get(&format!("{}/server_info", self.admin()), &[]).await.ok()?;
        info.json().ok()?["command_line_options"]["restart_epoch"].as_u64()
    }

    async fn get(&self) -> anyhow::Result<u16> {
        Ok(http_get(&format!("http://{}/productpage", self.listener), &[])
            .await?
            .status)
    }
}

fn events() -> (broadcast::Sender<SupervisorEvent>, broadcast::Receiver<SupervisorEvent>) {
    broadcast::channel(256)
}

/// Events until `pred` matches one (which is returned), within `limit`.
async fn next_event(
    rx: &mut broadcast::Receiver<SupervisorEvent>,
    limit: Duration,
    pred: impl Fn(&SupervisorEvent) -> bool,
) -> SupervisorEvent {
    timeout(limit, async {
        loop {
            let event = rx.recv().await.unwrap();
            if pred(&event) {
                return event;
            }
        }
    })
    .await
    .expect("no such event in time")
}

/// True once `pid` is gone or a zombie.
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn wait_exited(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exited(pid) {
        assert!(Instant::now() < deadline, "pid {pid} is still running");
        sleep(Duration::from_millis(20)).await;
    }
}

fn script(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("fake-envoy.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
