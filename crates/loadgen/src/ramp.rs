//! The `ramp` scenario: proxies join pilot-discovery in steps, each step converging (connect to
//! last handshake ACK) before the next, until pilot-discovery's resident memory or the step's
//! connect p99 passes its limit, or every proxy has joined.

use std::time::Duration;

use anyhow::Result;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::proxy::{ProxyOptions, run_proxy};
use crate::report::{Report, percentile_ms, rss_mb};
use crate::tally::Tally;
use crate::upstream::Upstream;

/// The ramp's step and limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RampOptions {
    /// Proxies that join per step (the first step included).
    pub step: usize,
    /// Stop once pilot-discovery's resident memory (VmRSS) exceeds this, in MB.
    pub max_rss_mb: Option<f64>,
    /// Stop once a step's connect p99 exceeds this, in milliseconds.
    pub max_p99_ms: Option<f64>,
}

impl Default for RampOptions {
    fn default() -> Self {
        RampOptions {
            step: 500,
            max_rss_mb: None,
            max_p99_ms: None,
        }
    }
}

/// One step of a ramp, measured once all its proxies converged.
#[derive(Debug, Clone, PartialEq)]
pub struct RampStep {
    /// Proxies connected after the step.
    pub proxies: usize,
    /// pilot-discovery's resident memory (VmRSS) after the step, in MB.
    pub rss_mb: Option<f64>,
    /// Connect p99 of the step's proxies.
    pub p99_ms: Option<f64>,
}

/// Why a ramp stopped: the limit it passed, `proxies` when all joined, `errors` when proxies
/// failed or a step timed out.
pub(crate) fn stop_reason(step: &RampStep, opts: &RampOptions) -> Option<&'static str> {
    if opts
        .max_rss_mb
        .is_some_and(|max| step.rss_mb.is_some_and(|rss| rss > max))
    {
        return Some("max-rss-mb");
    }
    if opts
        .max_p99_ms
        .is_some_and(|max| step.p99_ms.is_some_and(|p99| p99 > max))
    {
        return Some("max-p99-ms");
    }
    None
}

/// Runs the ramp against pilot-discovery at `upstream` (process `pid`, for its memory) and fills
/// the ramp's part of `report`: steps, the stop reason, the proxies that joined, connect figures.
pub(crate) async fn ramp(
    upstream: &Upstream,
    pid: Option<u32>,
    max_proxies: usize,
    proxy: ProxyOptions,
    opts: &RampOptions,
    timeout: Duration,
    report: &mut Report,
) -> Result<()> {
    let step = opts.step.max(1);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut tally = Tally::new(max_proxies, rx, tokio::time::Instant::now() + timeout);
    let mut tasks = JoinSet::new();
    let mut joined = 0;
    let mut stop = "proxies";
    while joined < max_proxies {
        let from = joined;
        joined = (from + step).min(max_proxies);
        for n in from..joined {
            tasks.spawn(run_proxy(upstream.clone(), n, proxy, tx.clone()));
        }
        tally.deadline = tokio::time::Instant::now() + timeout;
        tally.until(|t| t.settled_within(from..joined)).await;
        let row = RampStep {
            proxies: joined,
            rss_mb: pid.and_then(rss_mb),
            p99_ms: percentile_ms(&tally.connect_times(from..joined), 0.99),
        };
        let failed = !tally.settled_within(from..joined) || tally.failed[from..joined].iter().any(|f| *f);
        let limit = stop_reason(&row, opts);
        report.steps.push(row);
        if failed {
            stop = "errors";
            break;
        }
        if let Some(limit) = limit {
            stop = limit;
            break;
        }
    }
    let connect = tally.connect_times(0..joined);
    report.proxies = joined;
    report.converged = connect.len();
    report.connect_p50_ms = percentile_ms(&connect, 0.5);
    report.connect_p99_ms = percentile_ms(&connect, 0.99);
    report.convergence_p50_ms = report.connect_p50_ms;
    report.convergence_p99_ms = report.connect_p99_ms;
    report.convergence_max_ms = percentile_ms(&connect, 1.0);
    report.ramp_stop = Some(stop.to_owned());
    report.bytes_sent = tally.bytes;
    report.errors.append(&mut tally.errors);
    tasks.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_the_first_limit_passed() {
        let opts = RampOptions {
            step: 10,
            max_rss_mb: Some(100.0),
            max_p99_ms: Some(50.0),
        };
        let row = |rss, p99| RampStep {
            proxies: 10,
            rss_mb: Some(rss),
            p99_ms: Some(p99),
        };
        assert_eq!(stop_reason(&row(99.0, 49.0), &opts), None);
        assert_eq!(stop_reason(&row(101.0, 49.0), &opts), Some("max-rss-mb"));
        assert_eq!(stop_reason(&row(99.0, 51.0), &opts), Some("max-p99-ms"));
        let unknown = RampStep {
            proxies: 10,
            rss_mb: None,
            p99_ms: None,
        };
        assert_eq!(stop_reason(&unknown, &opts), None);
        assert_eq!(stop_reason(&row(1e9, 1e9), &RampOptions::default()), None);
    }
}
