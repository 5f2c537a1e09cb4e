//! A real `pilot-agent proxy` process (with its real Envoy) on loopback for end-to-end tests: free
//! ports for Envoy's admin, the status server, and Envoy's readiness and Prometheus listeners;
//! every file under a temporary working directory. Killed on drop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::bin::cargo_bin;
use crate::envoy::envoy_bin;
use crate::ports::free_port;

/// How to start the agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `router` or `sidecar`.
    pub proxy_type: String,
    pub pod_name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// pilot-discovery's xDS address.
    pub discovery: SocketAddr,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Extra ProxyConfig fields (merged into PROXY_CONFIG).
    pub proxy_config: serde_json::Value,
    /// Files written into the agent's working directory before it starts (relative path,
    /// contents), e.g. `var/run/secrets/tokens/istio-token`.
    pub files: Vec<(PathBuf, String)>,
}

impl AgentOptions {
    /// An Istio ingress gateway (`istio: ingressgateway`) in istio-system.
    pub fn ingress_gateway(discovery: SocketAddr) -> AgentOptions {
        AgentOptions {
            proxy_type: "router".into(),
            pod_name: "istio-ingressgateway-agent".into(),
            namespace: "istio-system".into(),
            labels: BTreeMap::from([("istio".into(), "ingressgateway".into())]),
            discovery,
            env: Vec::new(),
            proxy_config: json!({}),
            files: Vec::new(),
        }
    }
}

/// A running pilot-agent.
pub struct Agent {
    child: Child,
    pub admin_port: u16,
    pub status_port: u16,
    pub dir: tempfile::TempDir,
    log_path: PathBuf,
}

impl Agent {
    /// Starts the agent; does not wait for readiness (see [`Agent::wait_ready`]).
    pub async fn start(opts: AgentOptions) -> anyhow::Result<Agent> {
        let bin = cargo_bin("agent", "pilot-agent")?;
        let envoy = envoy_bin()?;
        let dir = tempfile::tempdir()?;
        let admin_port = free_port();
        let status_port = free_port();
        let mut proxy_config = json!({
            "discoveryAddress": opts.discovery.to_string(),
            "proxyAdminPort": admin_port,
            "statusPort": status_port,
            "binaryPath": envoy,
            "configPath": dir.path().join("etc/istio/proxy"),
            "drainDuration": "2s",
            "terminationDrainDuration": "2s",
            "controlPlaneAuthPolicy": "NONE",
            "concurrency": 1,
        });
        if let (Some(base), Some(extra)) = (proxy_config.as_object_mut(), opts.proxy_config.as_object()) {
            base.extend(extra.clone());
        }
        for (rel, contents) in &opts.files {
            let path = dir.path().join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        }
        let log_path = dir.path().join("pilot-agent.log");
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(&bin);
        cmd.args(["proxy", &opts.proxy_type])
            .current_dir(dir.path())
            .env("POD_NAME", &opts.pod_name)
            .env("POD_NAMESPACE", &opts.namespace)
            .env("INSTANCE_IP", "127.0.0.1")
            .env("SERVICE_ACCOUNT", "default")
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("ISTIO_METAJSON_LABELS", serde_json::to_string(&opts.labels)?)
            .env("PROXY_CONFIG", proxy_config.to_string())
            .env("XDS_UDS_PATH", dir.path().join("XDS"))
            .env("SDS_UDS_PATH", dir.path().join("SDS"))
            .env("ENVOY_STATUS_PORT", free_port().to_string())
            .env("ENVOY_PROMETHEUS_PORT", free_port().to_string())
            .env("ISTIO_DELTA_XDS", "true")
            .envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        Ok(Agent {
            child,
            admin_port,
            status_port,
            dir,
            log_path,
        })
    }

    pub fn status_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.status_port)
    }

    /// Polls `/healthz/ready` on the status port until 200.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()?;
        let mut last;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("pilot-agent exited with {status} before ready:\n{}", self.logs());
            }
            match client.get(self.status_url("/healthz/ready")).send().await {
                Ok(r) if r.status().is_success() => return Ok(t0.elapsed()),
                Ok(r) => last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
            if t0.elapsed() > timeout {
                bail!(
                    "pilot-agent not ready after {timeout:?} (last: {last}):\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// PIDs of the Envoy processes whose command line names this agent's bootstrap.
    pub fn envoy_pids(&self) -> Vec<u32> {
        let marker = self.dir.path().join("etc/istio/proxy");
        let marker = marker.to_string_lossy().into_owned();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("envoy") && cmdline.contains(&marker) && Some(pid) != self.child.id() {
                pids.push(pid);
            }
        }
        pids
    }

    /// Sends a signal (`TERM`, `KILL`, ...) to a process with the `kill` command.
    pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// Waits for the agent to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!("pilot-agent still running after {timeout:?}:\n{}", self.logs()),
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn bootstrap_path(&self) -> PathBuf {
        self.dir.path().join("etc/istio/proxy/envoy-rev.json")
    }

    pub fn working_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Agent {
    /// The agent is killed with SIGKILL, which leaves it no chance to stop Envoy: stop its Envoys
    /// here so tests leave no process behind.
    fn drop(&mut self) {
        let envoys = self.envoy_pids();
        let _ = self.child.start_kill();
        for pid in envoys {
            let _ = Agent::signal(pid, "KILL");
        }
    }
}
