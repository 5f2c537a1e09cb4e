//! Real Envoy processes for tests: finding (or installing) the binary, running Envoy on a bootstrap
//! with its admin API on loopback, and reading that API (`/ready`, `/config_dump`, `/stats`,
//! `/listeners`). Each Envoy lives in its own temp dir and is killed on drop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

mod dump;
mod install;

use dump::socket_addr;
pub use dump::{
    cluster_names, dump_section, endpoint_addresses, listener_names, parse_stats, route_config_names,
    update_rejected_total,
};
pub use install::{envoy_bin, require_envoy_bin, workspace_root};

/// How often the `wait_*` helpers poll the admin API.
const POLL: Duration = Duration::from_millis(50);
/// How much of the log an error message carries.
const LOG_TAIL: usize = 6000;

/// How Envoy runs.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    /// `-l`: trace, debug, info, warning, error, critical, off.
    pub log_level: String,
    /// `--component-log-level`, e.g. `upstream:debug,config:debug`.
    pub component_log_level: Option<String>,
    /// `--concurrency`: worker threads.
    pub concurrency: u32,
    /// `--drain-time-s`.
    pub drain_time_s: u32,
    /// How long to wait for the admin API to come up.
    pub start_timeout: Duration,
    /// Appended to the command line.
    pub extra_args: Vec<String>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        Self {
            log_level: "warning".into(),
            component_log_level: None,
            concurrency: 1,
            drain_time_s: 1,
            start_timeout: Duration::from_secs(20),
            extra_args: Vec::new(),
        }
    }
}

/// A running Envoy, killed on drop.
pub struct Envoy {
    child: Mutex<Child>,
    dir: TempDir,
    admin: SocketAddr,
    client: reqwest::Client,
}

impl Envoy {
    pub async fn start(bootstrap: Value) -> anyhow::Result<Envoy> {
        Self::start_with(bootstrap, EnvoyOptions::default()).await
    }

    /// Starts Envoy on `bootstrap`, with its admin API on 127.0.0.1 (at the bootstrap's admin port,
    /// or a port Envoy picks when that is 0 or absent), and waits until the admin API answers.
    pub async fn start_with(mut bootstrap: Value, options: EnvoyOptions) -> anyhow::Result<Envoy> {
        let bin = tokio::task::spawn_blocking(envoy_bin).await??;
        let Some(config) = bootstrap.as_object_mut() else {
            bail!("the bootstrap must be a JSON object")
        };
        let admin_port = config
            .get("admin")
            .and_then(|admin| admin.pointer("/address/socket_address/port_value"));
        let admin_port = admin_port.and_then(Value::as_u64).unwrap_or(0);
        config.insert(
            "admin".into(),
            json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}),
        );

        let dir = tempfile::Builder::new().prefix("envoy-").tempdir()?;
        let config_path = dir.path().join("envoy.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&bootstrap)?)?;
        let admin_path = dir.path().join("admin-address");
        let stderr = std::fs::File::create(dir.path().join("stderr.log"))?;
        let mut command = Command::new(&bin);
        command
            .arg("-c")
            .arg(&config_path)
            .arg("--disable-hot-restart")
            .args(["-l", &options.log_level])
            .args(["--concurrency", &options.concurrency.to_string()])
            .args(["--drain-time-s", &options.drain_time_s.to_string()])
            .arg("--log-path")
            .arg(dir.path().join("envoy.log"))
            .arg("--admin-address-path")
            .arg(&admin_path);
        if let Some(levels) = &options.component_log_level {
            command.args(["--component-log-level", levels]);
        }
        command.args(&options.extra_args);
        command
            .stdin(Stdio::null())
            .stdout(stderr.try_clone()?)
            .stderr(stderr)
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("starting {}", bin.display()))?;

        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?;
        let mut envoy = Envoy {
            child: Mutex::new(child),
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            client,
        };
        let deadline = Instant::now() + options.start_timeout;
        loop {
            envoy.check_running("before its admin API came up")?;
            let written = std::fs::read_to_string(&admin_path).unwrap_or_default();
            if let Ok(addr) = written.trim().parse::<SocketAddr>() {
                envoy.admin = addr;
                return Ok(envoy);
            }
            if Instant::now() > deadline {
                bail!(
                    "envoy wrote no admin address in {:?}\n{}",
                    options.start_timeout,
                    envoy.log_tail()
                );
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// `http://127.0.0.1:<admin port>`.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// The temp dir holding the bootstrap (`envoy.json`) and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything Envoy logged so far (its log file, then stderr).
    pub fn logs(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!("{}{}", read("envoy.log"), read("stderr.log"))
    }

    /// The end of [`Envoy::logs`], for error messages.
    pub fn log_tail(&self) -> String {
        let logs = self.logs();
        let cut = logs.len().saturating_sub(LOG_TAIL);
        let start = (cut..=logs.len())
            .find(|i| logs.is_char_boundary(*i))
            .unwrap_or(logs.len());
        format!("--- envoy log (last {LOG_TAIL} bytes) ---\n{}", &logs[start..])
    }

    /// `Some(status)` once Envoy has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_wait()
            .ok()
            .flatten()
    }

    fn check_running(&self, when: &str) -> anyhow::Result<()> {
        match self.exit_status() {
            Some(status) => bail!("envoy exited ({status}) {when}\n{}", self.log_tail()),
            None => Ok(()),
        }
    }

    /// Kills Envoy and waits for it to exit.
    pub async fn stop(&self) -> anyhow::Result<ExitStatus> {
        // An error here means it has already exited; try_wait reports how.
        let _ = self.child.lock().unwrap_or_else(PoisonError::into_inner).start_kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("envoy did not exit after SIGKILL");
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// GETs an admin path (`/ready`, `/clusters?format=json`, ...): status and body.
    pub async fn admin_get(&self, path_and_query: &str) -> anyhow::Result<(u16, String)> {
        self.admin_call(reqwest::Method::GET, path_and_query).await
    }

    /// POSTs to an admin path (`/drain_listeners?graceful`, `/logging?level=debug`, ...).
    pub async fn admin_post(&self, path_and_query: &str) -> anyhow::Result<(u16, String)> {
        self.admin_call(reqwest::Method::POST, path_and_query).await
    }

    async fn admin_call(&self, method: reqwest::Method, path_and_query: &str) -> anyhow::Result<(u16, String)> {
        let url = format!("{}{path_and_query}", self.admin_url());
        let response = self.client.request(method.clone(), &url).send().await;
        let response = match response {
            Ok(response) => response,
            Err(err) => {
                self.check_running(&format!("while calling {method} {path_and_query}"))?;
                return Err(err).with_context(|| format!("{method} {url}"));
            }
        };
        let status = response.status().as_u16();
        Ok((status, response.text().await?))
    }

    /// Waits until `/ready` answers 200 `LIVE`, i.e. Envoy has its initial xDS (or static) config.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running("before it was ready")?;
            let answer = self.admin_get("/ready").await;
            if let Ok((200, body)) = &answer
                && body.trim() == "LIVE"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "envoy not ready after {timeout:?}: last /ready answer {answer:?}\n{}",
                    self.log_tail()
                );
            }
            sleep(POLL).await;
        }
    }

    /// `/config_dump?include_eds`, parsed.
    pub async fn config_dump(&self) -> anyhow::Result<Value> {
        let (status, body) = self.admin_get("/config_dump?include_eds").await?;
        if status != 200 {
            bail!("/config_dump answered {status}: {body}");
        }
        serde_json::from_str(&body).context("/config_dump is not JSON")
    }

    /// Polls [`Envoy::config_dump`] until `pred` holds, and returns that dump.
    pub async fn wait_until(&self, timeout: Duration, mut pred: impl FnMut(&Value) -> bool) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let dump = self.config_dump().await?;
            if pred(&dump) {
                return Ok(dump);
            }
            if Instant::now() > deadline {
                bail!(
                    "config_dump never matched in {timeout:?}; clusters {:?}, listeners {:?}, routes {:?}\n{}",
                    cluster_names(&dump),
                    listener_names(&dump),
                    route_config_names(&dump),
                    self.log_tail()
                );
            }
            sleep(POLL).await;
        }
    }

    /// Every counter and gauge from `/stats`, by full name.
    pub async fn stats(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let (status, body) = self.admin_get("/stats").await?;
        if status != 200 {
            bail!("/stats answered {status}: {body}");
        }
        Ok(parse_stats(&body))
    }

    /// The sum of the RDS counter `counter` (e.g. `update_success`) over every route
    /// configuration (`http.<prefix>.rds.<route>.<counter>`).
    pub async fn rds_total(&self, counter: &str) -> anyhow::Result<u64> {
        let suffix = format!(".{counter}");
        Ok(self
            .stats()
            .await?
            .iter()
            .filter(|(k, _)| k.contains(".rds.") && k.ends_with(&suffix))
            .map(|(_, v)| *v)
            .sum())
    }

    /// The sum of every `*update_rejected` stat (CDS, LDS, RDS, EDS, SDS): how many xDS updates
    /// Envoy NACKed.
    pub async fn update_rejected_total(&self) -> anyhow::Result<u64> {
        Ok(update_rejected_total(&self.stats().await?))
    }

    /// Polls the stat `name` until `pred` holds for its value, and returns that value.
    pub async fn wait_for_stat(
        &self,
        name: &str,
        pred: impl Fn(u64) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.stats().await?.get(name).copied();
            if let Some(value) = value.filter(|value| pred(*value)) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("stat {name} is {value:?} after {timeout:?}\n{}", self.log_tail());
            }
            sleep(POLL).await;
        }
    }

    /// Listener name to the address it is bound to (from `/listeners`), so tests need not know
    /// ports in advance.
    pub async fn listener_addresses(&self) -> anyhow::Result<BTreeMap<String, SocketAddr>> {
        let (status, body) = self.admin_get("/listeners?format=json").await?;
        if status != 200 {
            bail!("/listeners answered {status}: {body}");
        }
        let listeners: Value = serde_json::from_str(&body).context("/listeners is not JSON")?;
        let mut addresses = BTreeMap::new();
        for listener in listeners["listener_statuses"].as_array().into_iter().flatten() {
            let (Some(name), Some(addr)) = (listener["name"].as_str(), socket_addr(&listener["local_address"])) else {
                continue;
            };
            addresses.insert(name.to_owned(), addr);
        }
        Ok(addresses)
    }

    /// The address the listener `name` is bound to.
    pub async fn listener_address(&self, name: &str) -> anyhow::Result<SocketAddr> {
        let addresses = self.listener_addresses().await?;
        match addresses.get(name) {
            Some(addr) => Ok(*addr),
            None => bail!(
                "envoy has no listener {name}; it has {:?}",
                addresses.keys().collect::<Vec<_>>()
            ),
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .start_kill();
    }
}

/// Runs `envoy --mode validate` on `bootstrap`; the error carries Envoy's reason.
pub async fn validate(bootstrap: &Value) -> anyhow::Result<()> {
    let bin = tokio::task::spawn_blocking(envoy_bin).await??;
    let dir = tempfile::Builder::new().prefix("envoy-validate-").tempdir()?;
    let path = dir.path().join("envoy.json");
    std::fs::write(&path, serde_json::to_vec_pretty(bootstrap)?)?;
    let output = Command::new(&bin)
        .args(["--mode", "validate", "--disable-hot-restart", "-l", "warning", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .await?;
    if !output.status.success() {
        bail!(
            "envoy rejected the bootstrap ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, http_get};
    use crate::bootstrap::static_proxy_bootstrap;

    const READY: Duration = Duration::from_secs(20);

    #[tokio::test]
    async fn envoy_proxies_a_request_to_a_backend() -> anyhow::Result<()> {
        let backend = Backend::start("productpage").await?;
        let envoy = Envoy::start(static_proxy_bootstrap(0, backend.addr())).await?;
        envoy.wait_ready(READY).await?;
        let listener = envoy.listener_address("static_http").await?;
        assert_ne!(listener.port(), 0);

        let response = http_get(
            &format!("http://{listener}/reviews/1"),
            &[("host", "bookinfo.example.com")],
        )
        .await?;
        assert_eq!(response.status, 200, "{}\n{}", response.body, envoy.log_tail());
        let echo = response.json()?;
        assert_eq!(echo["backend"], "productpage");
        assert_eq!(echo["path"], "/reviews/1");
        assert_eq!(echo["host"], "bookinfo.example.com");
        assert_eq!(backend.count(), 1);
        let seen = backend.last().context("backend saw no request")?;
        assert!(
            seen.header("x-request-id").is_some(),
            "envoy adds x-request-id: {seen:?}"
        );

        let sent = envoy
            .wait_for_stat("cluster.static_backend.upstream_rq_200", |n| n >= 1, READY)
            .await?;
        assert_eq!(sent, 1);
        let stats = envoy.stats().await?;
        assert_eq!(stats.get("listener_manager.total_listeners_active"), Some(&1));
        assert_eq!(envoy.update_rejected_total().await?, 0);
        Ok(())
    }

    #[tokio::test]
    async fn envoy_config_dump_names_static_resources() -> anyhow::Result<()> {
        let upstream = SocketAddr::from(([127, 0, 0, 1], 9));
        let envoy = Envoy::start(static_proxy_bootstrap(0, upstream)).await?;
        envoy.wait_ready(READY).await?;
        let dump = envoy
            .wait_until(READY, |dump| cluster_names(dump).contains(&"static_backend".to_owned()))
            .await?;
        assert_eq!(listener_names(&dump), ["static_http"]);
        assert_eq!(route_config_names(&dump), ["static_route"]);
        assert!(dump_section(&dump, "ScopedRoutesConfigDump").is_some());
        assert_eq!(endpoint_addresses(&dump, "static_backend"), [upstream]);
        assert!(endpoint_addresses(&dump, "no_such_cluster").is_empty());
        let bootstrap = dump_section(&dump, "BootstrapConfigDump").context("no bootstrap in the dump")?;
        let admin = &bootstrap["bootstrap"]["admin"]["address"]["socket_address"];
        assert_eq!(admin["address"], "127.0.0.1");
        let timeout = envoy
            .wait_until(Duration::from_millis(200), |dump| listener_names(dump).len() > 1)
            .await;
        assert!(timeout.is_err(), "only one listener exists");
        Ok(())
    }

    #[tokio::test]
    async fn envoy_that_cannot_start_reports_its_log() -> anyhow::Result<()> {
        let mut bootstrap = static_proxy_bootstrap(0, SocketAddr::from(([127, 0, 0, 1], 9)));
        bootstrap["static_resources"]["clusters"][0]["type"] = json!("NO_SUCH_DISCOVERY_TYPE");
        let started = Envoy::start(bootstrap).await;
        let err = match started {
            Ok(envoy) => envoy.wait_ready(READY).await.expect_err("envoy must not become ready"),
            Err(err) => err,
        };
        assert!(err.to_string().contains("NO_SUCH_DISCOVERY_TYPE"), "{err:#}");
        Ok(())
    }

    #[tokio::test]
    async fn stopped_envoy_reports_its_exit() -> anyhow::Result<()> {
        let envoy = Envoy::start(static_proxy_bootstrap(0, SocketAddr::from(([127, 0, 0, 1], 9)))).await?;
        envoy.wait_ready(READY).await?;
        let (status, _) = envoy.admin_post("/healthcheck/fail").await?;
        assert_eq!(status, 200);
        assert!(envoy.exit_status().is_none());
        envoy.stop().await?;
        assert!(envoy.exit_status().is_some());
        let err = envoy.admin_get("/ready").await.expect_err("admin is gone");
        assert!(err.to_string().contains("envoy exited"), "{err:#}");
        Ok(())
    }
}
