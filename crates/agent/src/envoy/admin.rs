//! The Envoy admin calls that shutdown needs: `POST /drain_listeners` and the count of active
//! downstream connections from `/stats`, leaving out Istio's own listeners (admin, status,
//! Prometheus) as Istio's `activeProxyConnections` does.

use std::collections::HashSet;
use std::time::Duration;

use super::{EnvoyConfig, EnvoyError, IpVersion};

/// Istio reads the stats with a 2 s timeout.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The `downstream_cx_active` stats of listeners that are Istio's plumbing, not traffic.
pub fn known_istio_listeners(status_port: u16, prometheus_port: u16) -> HashSet<String> {
    HashSet::from([
        format!("listener.0.0.0.0_{status_port}.downstream_cx_active"),
        format!("listener.0.0.0.0_{prometheus_port}.downstream_cx_active"),
        "listener.admin.downstream_cx_active".to_owned(),
        "listener.admin.main_thread.downstream_cx_active".to_owned(),
    ])
}

/// Sums `listener.*.downstream_cx_active` in a `/stats` text body, skipping per-worker stats,
/// internal listeners and `known` ones. `None` when the body has no stat at all (no connection was
/// ever made, or stats are off), which Istio treats as "nothing to wait for".
pub fn active_proxy_connections(stats: &str, known: &HashSet<String>) -> Option<u64> {
    if stats.trim().is_empty() {
        return None;
    }
    let mut active = 0u64;
    for line in stats.lines().filter(|line| !line.trim().is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            tracing::warn!("envoy stat line is missing separator. line: {line}");
            continue;
        };
        // HTTP listeners count under `http.` too; per-worker stats repeat the listener's.
        if !name.starts_with("listener.") || name.contains("worker_") {
            continue;
        }
        if name.starts_with("listener.envoy_internal_") || known.contains(name) {
            continue;
        }
        match value.trim().parse::<u64>() {
            Ok(value) => active = active.saturating_add(value),
            Err(err) => tracing::warn!("failed parsing Envoy stat {name} ({err}), line: {line}"),
        }
    }
    Some(active)
}

/// A client of one Envoy's admin API on loopback.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    client: reqwest::Client,
}

impl AdminClient {
    pub fn new(ip: IpVersion, port: u16) -> Result<Self, EnvoyError> {
        let base = format!("http://{}:{port}", ip.localhost());
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|err| EnvoyError::Admin {
                url: base.clone(),
                reason: err.to_string(),
            })?;
        Ok(Self { base, client })
    }

    pub fn for_config(config: &EnvoyConfig) -> Result<Self, EnvoyError> {
        Self::new(config.local_address_ip_version, config.admin_port)
    }

    /// `http://127.0.0.1:<admin port>`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// `POST /drain_listeners?graceful` (`?inboundonly&graceful` for sidecars): listeners keep
    /// accepting for `--drain-time-s` while clients are told to go away, then close.
    pub async fn drain_listeners(&self, inbound_only: bool) -> Result<(), EnvoyError> {
        let query = if inbound_only {
            "inboundonly&graceful"
        } else {
            "graceful"
        };
        let url = format!("{}/drain_listeners?{query}", self.base);
        let response = self.client.post(&url).timeout(DRAIN_TIMEOUT).send().await;
        let response = response.map_err(|err| admin_error(&url, err))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(EnvoyError::Admin {
                url,
                reason: format!("answered {status}: {}", body.trim()),
            });
        }
        Ok(())
    }

    /// Active downstream connections on Envoy's traffic listeners (see [`active_proxy_connections`]).
    pub async fn active_connections(&self, known: &HashSet<String>) -> Result<Option<u64>, EnvoyError> {
        let url = format!("{}/stats?usedonly&filter=downstream_cx_active$", self.base);
        let response = self.client.get(&url).timeout(STATS_TIMEOUT).send().await;
        let response = response.map_err(|err| admin_error(&url, err))?;
        let status = response.status();
        let body = response.text().await.map_err(|err| admin_error(&url, err))?;
        if !status.is_success() {
            return Err(EnvoyError::Admin {
                url,
                reason: format!("answered {status}: {}", body.trim()),
            });
        }
        Ok(active_proxy_connections(&body, known))
    }
}

fn admin_error(url: &str, err: reqwest::Error) -> EnvoyError {
    EnvoyError::Admin {
        url: url.to_owned(),
        reason: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "\
http.static_http.downstream_cx_active: 3
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.0.0.0.0_15090.downstream_cx_active: 2
listener.127.0.0.1_8080.downstream_cx_active: 3
listener.127.0.0.1_8080.worker_0.downstream_cx_active: 2
listener.127.0.0.1_8080.worker_1.downstream_cx_active: 1
listener.[__1]_9090.downstream_cx_active: 4
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
listener.envoy_internal_connect_originate.downstream_cx_active: 5
";

    #[test]
    fn counts_traffic_listeners_only() {
        let known = known_istio_listeners(15021, 15090);
        assert_eq!(active_proxy_connections(STATS, &known), Some(7));
        // With other Istio ports, 15021 and 15090 are traffic.
        let known = known_istio_listeners(16021, 16090);
        assert_eq!(active_proxy_connections(STATS, &known), Some(10));
    }

    #[test]
    fn empty_stats_mean_unknown_and_bad_lines_are_skipped() {
        let known = known_istio_listeners(15021, 15090);
        assert_eq!(active_proxy_connections("", &known), None);
        assert_eq!(active_proxy_connections("\n", &known), None);
        let stats =
            "garbage\nlistener.1.1.1.1_80.downstream_cx_active: lots\nlistener.1.1.1.1_81.downstream_cx_active: 0\n";
        assert_eq!(active_proxy_connections(stats, &known), Some(0));
    }

    #[test]
    fn admin_urls_use_loopback_of_the_ip_family() {
        let v4 = AdminClient::new(IpVersion::V4, 15000).unwrap();
        assert_eq!(v4.url(), "http://127.0.0.1:15000");
        let v6 = AdminClient::new(IpVersion::V6, 15000).unwrap();
        assert_eq!(v6.url(), "http://[::1]:15000");
    }
}
