//! `/healthz/ready`: Istio's readiness probe for the sidecar. Ready once the xDS proxy saw Envoy
//! accept its first CDS and LDS, and Envoy's admin `/ready` says LIVE with its workers started.
//! As in Istio, both halves are sticky: once passed they are not asked again (they change only
//! across a hot restart), so a probe after readiness costs nothing. Once the agent is shutting
//! down the probe fails with "server is terminated".

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::sync::watch;

use super::admin::EnvoyAdmin;
use crate::readiness::XdsStatus;

/// `/stats?filter=^listener_manager\.workers_started$`.
const WORKERS_STARTED_QUERY: &str = "/stats?filter=%5Elistener_manager%5C.workers_started%24";
const WORKERS_STARTED: &str = "listener_manager.workers_started";

/// Why the proxy is not ready; the message is the body of the 503.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NotReady {
    #[error("config not received from XDS server (is Istiod running?): {0}")]
    ConfigNotReceived(String),
    #[error("config not fully received from XDS server: {0}")]
    ConfigNotFullyReceived(String),
    #[error("config received from XDS server, but was rejected: {0}")]
    ConfigRejected(String),
    #[error("server is terminated")]
    Terminated,
    #[error("server is not live, current state is: {0}")]
    NotLive(String),
    #[error("workers have not yet started")]
    WorkersNotStarted,
    #[error("failed to get readiness stats: {0}")]
    Admin(String),
    #[error("{0}")]
    CertificateNotDelivered(String),
}

/// Istio's `ready.Probe`, fed by the xDS proxy's [`XdsStatus`] instead of Envoy's update stats.
pub(crate) struct ReadinessProbe {
    admin: EnvoyAdmin,
    timeout: Duration,
    xds: watch::Receiver<XdsStatus>,
    shutdown: watch::Receiver<bool>,
    received_first_update: AtomicBool,
    at_least_once_ready: AtomicBool,
    sds: Option<crate::sds::SdsStatus>,
}

impl ReadinessProbe {
    pub(crate) fn new(
        admin: EnvoyAdmin,
        timeout: Duration,
        xds: watch::Receiver<XdsStatus>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            admin,
            timeout,
            xds,
            shutdown,
            received_first_update: AtomicBool::new(false),
            at_least_once_ready: AtomicBool::new(false),
            sds: None,
        }
    }

    /// Also not ready while Envoy waits for the workload certificate it asked SDS for.
    pub(crate) fn with_sds(mut self, sds: Option<crate::sds::SdsStatus>) -> Self {
        self.sds = sds;
        self
    }

    /// Istio's order: config first, then termination, then Envoy's own state.
    /// A certificate that cannot be had comes first: Envoy's clusters wait for it, so the config
    /// is never complete and Istio's message would not say why.
    pub(crate) async fn check(&self) -> Result<(), NotReady> {
        if let Some(reason) = self.sds.as_ref().and_then(crate::sds::SdsStatus::failing) {
            return Err(NotReady::CertificateNotDelivered(reason));
        }
        self.check_config_status()?;
        if *self.shutdown.borrow() {
            return Err(NotReady::Terminated);
        }
        if let Some(reason) = self.sds.as_ref().and_then(crate::sds::SdsStatus::pending) {
            return Err(NotReady::CertificateNotDelivered(reason));
        }
        if self.at_least_once_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_envoy_ready().await?;
        self.at_least_once_ready.store(true, Ordering::Release);
        Ok(())
    }

    fn check_config_status(&self) -> Result<(), NotReady> {
        if self.received_first_update.load(Ordering::Acquire) {
            return Ok(());
        }
        let status = self.xds.borrow().clone();
        if status.config_received() {
            self.received_first_update.store(true, Ordering::Release);
            return Ok(());
        }
        Err(config_error(&status))
    }

    async fn check_envoy_ready(&self) -> Result<(), NotReady> {
        let admin_error = |err: super::admin::AdminError| NotReady::Admin(err.to_string());
        let (status, body) = self
            .admin
            .get("/ready", self.timeout, HeaderMap::new())
            .await
            .map_err(admin_error)?;
        let state = body.trim();
        if !status.is_success() || state != "LIVE" {
            let state = if state.is_empty() {
                status.to_string()
            } else {
                state.to_string()
            };
            return Err(NotReady::NotLive(state));
        }
        let (_, stats) = self
            .admin
            .get(WORKERS_STARTED_QUERY, self.timeout, HeaderMap::new())
            .await
            .map_err(admin_error)?;
        match workers_started(&stats) {
            Some(true) => Ok(()),
            Some(false) => Err(NotReady::WorkersNotStarted),
            None => Err(NotReady::Admin(format!(
                "{WORKERS_STARTED} is not yet updated: {}",
                stats.trim()
            ))),
        }
    }
}

/// Istio's three messages: nothing accepted, part accepted, or rejected; each says what the xDS
/// proxy saw, with Envoy's last rejection when there is one.
fn config_error(status: &XdsStatus) -> NotReady {
    let acked = |yes: bool| if yes { "accepted" } else { "not accepted" };
    let mut detail = format!(
        "cds updates: {}; lds updates: {}; upstream: {}",
        acked(status.cds_acked),
        acked(status.lds_acked),
        if status.upstream_connected {
            "connected"
        } else {
            "not connected"
        },
    );
    if let Some(nack) = &status.last_nack {
        detail.push_str("; last rejected: ");
        detail.push_str(nack);
        return NotReady::ConfigRejected(detail);
    }
    if status.cds_acked || status.lds_acked {
        NotReady::ConfigNotFullyReceived(detail)
    } else {
        NotReady::ConfigNotReceived(detail)
    }
}

/// `listener_manager.workers_started: 1` in Envoy's `/stats` text; `None` when absent or unparsable.
fn workers_started(stats: &str) -> Option<bool> {
    stats.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == WORKERS_STARTED).then(|| value.trim().parse::<u64>().ok().map(|v| v == 1))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_messages_follow_istio() {
        let none = XdsStatus::default();
        let err = config_error(&none).to_string();
        assert!(
            err.starts_with("config not received from XDS server (is Istiod running?): "),
            "{err}"
        );
        assert!(
            err.contains("cds updates: not accepted; lds updates: not accepted"),
            "{err}"
        );

        let half = XdsStatus {
            cds_acked: true,
            upstream_connected: true,
            ..Default::default()
        };
        let err = config_error(&half).to_string();
        assert!(
            err.starts_with("config not fully received from XDS server: cds updates: accepted"),
            "{err}"
        );
        assert!(err.contains("upstream: connected"), "{err}");

        let nacked = XdsStatus {
            last_nack: Some("LDS: duplicate listener".into()),
            ..Default::default()
        };
        assert_eq!(
            config_error(&nacked),
            NotReady::ConfigRejected(
                "cds updates: not accepted; lds updates: not accepted; upstream: not connected; \
                 last rejected: LDS: duplicate listener"
                    .into()
            )
        );
    }

    #[test]
    fn workers_started_parses_envoy_stats() {
        assert_eq!(workers_started("listener_manager.workers_started: 1\n"), Some(true));
        assert_eq!(
            workers_started("foo: 3\nlistener_manager.workers_started: 0\n"),
            Some(false)
        );
        assert_eq!(workers_started("listener_manager.workers_started_x: 1\n"), None);
        assert_eq!(workers_started(""), None);
    }
}
