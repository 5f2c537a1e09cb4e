//! A real `pilot-discovery discovery` process on loopback with free ports, for end-to-end tests.
//! Killed on drop; its log is kept for failure messages.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::bin::cargo_bin;
use crate::ports::free_port;

/// A running pilot-discovery.
pub struct Discovery {
    child: Child,
    bin: PathBuf,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    log_path: PathBuf,
    _log_dir: tempfile::TempDir,
}

/// Options for starting pilot-discovery.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryOptions {
    /// Extra environment (e.g. PILOT_DEBOUNCE_AFTER=10ms).
    pub env: Vec<(String, String)>,
    /// Extra flags.
    pub args: Vec<String>,
    /// Fixed gRPC port (e.g. to restart on the same address); free port if None.
    pub grpc_port: Option<u16>,
    /// Address the gRPC (xDS) port listens on; 127.0.0.1 if None. A `netns::Network`'s host
    /// address lets sidecars in its pods reach it.
    pub grpc_ip: Option<std::net::IpAddr>,
    /// The pilot-discovery executable (e.g. a release build); `target/debug/pilot-discovery`,
    /// built if missing, when None.
    pub binary: Option<PathBuf>,
}

impl Discovery {
    /// Starts pilot-discovery on `config_dir` and waits for `/ready`.
    pub async fn start(config_dir: &Path, opts: DiscoveryOptions) -> anyhow::Result<Discovery> {
        let bin = match &opts.binary {
            Some(bin) => bin.clone(),
            None => cargo_bin("pilot-discovery", "pilot-discovery")?,
        };
        let grpc_ip = opts.grpc_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        let grpc_addr = SocketAddr::new(grpc_ip, opts.grpc_port.unwrap_or_else(free_port));
        let http_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let monitoring_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log_dir = tempfile::tempdir()?;
        let log_path = log_dir.path().join("pilot-discovery.log");
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(&bin);
        cmd.arg("discovery")
            .arg("--configDir")
            .arg(config_dir)
            .arg("--grpcAddr")
            .arg(grpc_addr.to_string())
            .arg("--httpAddr")
            .arg(http_addr.to_string())
            .arg("--monitoringAddr")
            .arg(monitoring_addr.to_string())
            .args(&opts.args)
            .env("PILOT_DEBOUNCE_AFTER", "20ms")
            .envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // No TLS port unless the test asks for one, and no webhook port (15017 is the same for
        // every test) unless the test names one.
        if !opts.args.iter().any(|a| a.starts_with("--secureGrpcAddr")) {
            cmd.args(["--secureGrpcAddr", ""]);
        }
        if !opts.args.iter().any(|a| a.starts_with("--httpsAddr")) {
            cmd.args(["--httpsAddr", ""]);
        }
        // The mesh CA (served on the plaintext port without a TLS one) keeps its root beside the
        // log, not in the test's working directory, unless the test names a directory.
        if !opts.env.iter().any(|(k, _)| k == "ROOT_CA_DIR") {
            cmd.env("ROOT_CA_DIR", log_dir.path().join("cacerts"));
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let mut d = Discovery {
            child,
            bin,
            grpc_addr,
            http_addr,
            monitoring_addr,
            log_path,
            _log_dir: log_dir,
        };
        d.wait_ready(Duration::from_secs(30)).await?;
        Ok(d)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://{}/ready", self.http_addr);
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("pilot-discovery exited with {status} before ready:\n{}", self.logs());
            }
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("pilot-discovery not ready after {timeout:?}:\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET a debug or monitoring path; `monitoring` selects the 15014-equivalent port.
    pub async fn get(&self, path: &str, monitoring: bool) -> anyhow::Result<(u16, String)> {
        let addr = if monitoring {
            self.monitoring_addr
        } else {
            self.http_addr
        };
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()?;
        let r = client.get(format!("http://{addr}{path}")).send().await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    /// The value of a Prometheus sample (`name` or `name{labels}` exactly as exposed), summed over label sets
    /// when `name` has no braces.
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let (_, text) = self.get("/metrics", true).await?;
        Ok(sum_metric(&text, name))
    }

    /// The executable that runs.
    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// The process ID, while the process runs (for reading `/proc/<pid>`).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Stops the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// Sums the samples of a metric in Prometheus text exposition.
pub fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let matches = if name.contains('{') {
                series == name
            } else {
                series == name || series.strip_prefix(name).is_some_and(|rest| rest.starts_with('{'))
            };
            if matches { value.parse::<f64>().ok() } else { None }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_prometheus_samples() {
        let text = "# HELP x\nx_total{type=\"cds\"} 2\nx_total{type=\"eds\"} 3\nx_total_other 9\ny 1\n";
        assert_eq!(sum_metric(text, "x_total"), 5.0);
        assert_eq!(sum_metric(text, "x_total{type=\"eds\"}"), 3.0);
        assert_eq!(sum_metric(text, "y"), 1.0);
        assert_eq!(sum_metric(text, "z"), 0.0);
    }
}
