//! Sustained endpoint churn: every 1/R s for S s the next service (round robin) moves its
//! endpoints to fresh addresses, rewriting its one file as a Kubernetes endpoint update touches
//! one object; each change is timed from its write until every converged proxy has ACKed EDS
//! holding the new addresses (or newer ones), and the end from the last write until all have.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio::time::MissedTickBehavior;

use crate::mesh::{MeshSpec, first_endpoint_address, move_endpoints, same_namespace};
use crate::report::{Report, percentile_ms};
use crate::tally::Tally;

/// The rate and length of sustained churn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChurnOptions {
    /// Changes per second; 0 makes the one change of the plain endpoint-churn scenario.
    pub rate: f64,
    /// How long changes are made.
    pub duration: Duration,
}

impl Default for ChurnOptions {
    fn default() -> Self {
        ChurnOptions {
            rate: 0.0,
            duration: Duration::from_secs(60),
        }
    }
}

/// The window at each end of the run whose lags are compared (growing queues show as a last
/// window's p99 well above the first's).
const EDGE: Duration = Duration::from_secs(10);

/// One change: when it was written and when its last proxy ACKed it.
#[derive(Debug, Clone)]
struct Change {
    made: Instant,
    remaining: usize,
    done: Option<Instant>,
}

/// Which proxy has ACKed which generation of which service's endpoints.
#[derive(Debug)]
pub(crate) struct ChurnTracker {
    /// The first address of each generation written: its service and generation.
    by_address: HashMap<String, (usize, usize)>,
    /// Per service, its changes by generation (generation `g` at `g - 1`).
    per_service: Vec<Vec<usize>>,
    changes: Vec<Change>,
    /// Per proxy, per service: the newest generation ACKed (0: the initial endpoints).
    acked: Vec<Vec<usize>>,
    /// The proxies every change waits for (those converged and not failed at the start).
    live: Vec<bool>,
    /// Namespace-scoped proxies (the reference mesh): proxy `p` sees service `s` only when
    /// `p % n == s % n`; `None`, every proxy sees every service.
    scope: Option<usize>,
}

impl ChurnTracker {
    pub(crate) fn new(services: usize, live: Vec<bool>) -> ChurnTracker {
        ChurnTracker {
            by_address: HashMap::new(),
            per_service: vec![Vec::new(); services],
            changes: Vec::new(),
            acked: vec![vec![0; services]; live.len()],
            live,
            scope: None,
        }
    }

    /// Proxies see only the services of their namespace, one of `namespaces` (see
    /// [`MeshSpec::sees`]).
    pub(crate) fn scoped(mut self, namespaces: usize) -> ChurnTracker {
        self.scope = (namespaces > 1).then_some(namespaces);
        self
    }

    fn sees(&self, proxy: usize, service: usize) -> bool {
        self.scope.is_none_or(|n| same_namespace(n, proxy, service))
    }

    /// The newest generation written for `service`.
    pub(crate) fn generation(&self, service: usize) -> usize {
        self.per_service[service].len()
    }

    /// Records the next generation of `service`, whose first address is `first_address`, as
    /// written at `at`.
    pub(crate) fn made(&mut self, service: usize, first_address: String, at: Instant) {
        let generation = self.generation(service) + 1;
        self.by_address.insert(first_address, (service, generation));
        self.per_service[service].push(self.changes.len());
        self.changes.push(Change {
            made: at,
            remaining: (0..self.live.len())
                .filter(|&p| self.live[p] && self.sees(p, service))
                .count(),
            done: None,
        });
    }

    /// `proxy` ACKed, at `at`, EDS whose plain clusters moved to these addresses.
    pub(crate) fn acked(&mut self, proxy: usize, clusters: &[Vec<String>], at: Instant) {
        if !self.live.get(proxy).copied().unwrap_or(false) {
            return;
        }
        for addresses in clusters {
            let Some(&(service, generation)) = addresses.iter().find_map(|a| self.by_address.get(a)) else {
                continue;
            };
            if !self.sees(proxy, service) {
                continue;
            }
            let before = self.acked[proxy][service];
            for g in before + 1..=generation {
                let change = &mut self.changes[self.per_service[service][g - 1]];
                change.remaining = change.remaining.saturating_sub(1);
                if change.remaining == 0 && change.done.is_none() {
                    change.done = Some(at);
                }
            }
            self.acked[proxy][service] = before.max(generation);
        }
    }

    /// Every change has reached every live proxy.
    pub(crate) fn all_done(&self) -> bool {
        self.changes.iter().all(|c| c.done.is_some())
    }

    /// Live proxies that hold the newest generation of every service.
    pub(crate) fn converged_proxies(&self) -> usize {
        (0..self.live.len())
            .filter(|&p| self.live[p])
            .filter(|&p| {
                (0..self.per_service.len()).all(|s| !self.sees(p, s) || self.acked[p][s] == self.generation(s))
            })
            .count()
    }

    /// Write to last ACK, of the changes made in `from..to` that reached every proxy.
    fn lags(&self, from: Instant, to: Instant) -> Vec<Duration> {
        self.changes
            .iter()
            .filter(|c| c.made >= from && c.made <= to)
            .filter_map(|c| c.done.map(|d| d.saturating_duration_since(c.made)))
            .collect()
    }
}

/// The figures of a churn run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChurnFigures {
    pub changes: usize,
    pub rate_achieved: f64,
    pub lags: Vec<Duration>,
    pub first_p99_ms: Option<f64>,
    pub last_p99_ms: Option<f64>,
    pub settle_ms: Option<f64>,
    pub converged: usize,
    pub unfinished: usize,
}

impl ChurnFigures {
    pub(crate) fn fill(&self, report: &mut Report) {
        report.converged = self.converged;
        report.convergence_p50_ms = percentile_ms(&self.lags, 0.5);
        report.convergence_p99_ms = percentile_ms(&self.lags, 0.99);
        report.convergence_max_ms = percentile_ms(&self.lags, 1.0);
        report.churn_changes = Some(self.changes);
        report.churn_rate_achieved = Some(self.rate_achieved);
        report.churn_lag_p50_ms = report.convergence_p50_ms;
        report.churn_lag_p99_ms = report.convergence_p99_ms;
        report.churn_lag_first10s_p99_ms = self.first_p99_ms;
        report.churn_lag_last10s_p99_ms = self.last_p99_ms;
        report.churn_settle_ms = self.settle_ms;
        if self.unfinished > 0 {
            report.errors.push(format!(
                "churn: {} of {} changes never reached every proxy",
                self.unfinished, self.changes
            ));
        }
    }
}

/// Churns at `opts.rate` for `opts.duration`, then waits (up to `timeout`) for every proxy to
/// hold the final endpoints.
pub(crate) async fn churn(
    tally: &mut Tally,
    spec: &MeshSpec,
    opts: &ChurnOptions,
    dir: &Path,
    timeout: Duration,
) -> Result<ChurnFigures> {
    if spec.services == 0 || spec.endpoints == 0 {
        bail!("endpoint-churn needs at least one service with endpoints");
    }
    if !(opts.rate.is_finite() && opts.rate > 0.0) {
        bail!("--churn-rate must be a positive number of changes per second");
    }
    let live = tally
        .converged
        .iter()
        .zip(&tally.failed)
        .map(|(c, f)| c.is_some() && !f)
        .collect();
    let scope = if spec.sidecar_scope { spec.namespaces } else { 1 };
    tally.churn = Some(ChurnTracker::new(spec.services, live).scoped(scope));
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate));
    interval.set_missed_tick_behavior(MissedTickBehavior::Burst);
    tally.deadline = tokio::time::Instant::now() + opts.duration + timeout;
    let start = Instant::now();
    let mut last_write = start;
    let mut changes = 0;
    loop {
        enum Step {
            Tick,
            Event(bool),
        }
        let step = tokio::select! {
            biased;
            _ = interval.tick() => Step::Tick,
            more = tally.next() => Step::Event(more),
        };
        match step {
            Step::Tick if start.elapsed() >= opts.duration => break,
            Step::Tick => {
                let service = changes % spec.services;
                let Some(churn) = tally.churn.as_mut() else {
                    bail!("the churn tracker is gone");
                };
                let generation = churn.generation(service) + 1;
                last_write = Instant::now();
                churn.made(service, first_endpoint_address(spec, service, generation), last_write);
                move_endpoints(dir, spec, service, generation)?;
                changes += 1;
            }
            Step::Event(true) => {}
            Step::Event(false) => break,
        }
    }
    let window = start.elapsed();
    tally
        .until(|t| t.churn.as_ref().is_none_or(ChurnTracker::all_done))
        .await;
    let Some(tracker) = tally.churn.take() else {
        return Ok(ChurnFigures::default());
    };
    let end = start + window;
    let p99 = |from, to| percentile_ms(&tracker.lags(from, to), 0.99);
    let last_done = tracker.changes.iter().filter_map(|c| c.done).max();
    Ok(ChurnFigures {
        changes,
        rate_achieved: changes as f64 / window.as_secs_f64(),
        lags: tracker.lags(start, end),
        first_p99_ms: p99(start, start + EDGE),
        last_p99_ms: p99(end.checked_sub(EDGE).unwrap_or(start), end),
        settle_ms: tracker
            .all_done()
            .then(|| last_done.map_or(0.0, |d| d.saturating_duration_since(last_write).as_secs_f64() * 1e3)),
        converged: tracker.converged_proxies(),
        unfinished: tracker.changes.iter().filter(|c| c.done.is_none()).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_change_is_done_when_every_live_proxy_acked_it_or_a_newer_one() {
        let t0 = Instant::now();
        // Proxy 2 never converged: no change waits for it.
        let mut t = ChurnTracker::new(2, vec![true, true, false]);
        t.made(0, "a1".into(), t0);
        t.made(1, "b1".into(), t0 + ms(10));
        t.made(0, "a2".into(), t0 + ms(20));
        assert_eq!(t.generation(0), 2);
        // Unknown addresses (the initial endpoints, another cluster) change nothing.
        t.acked(0, &[vec!["x".into()]], t0 + ms(5));
        t.acked(0, &[vec!["a1".into(), "a1b".into()]], t0 + ms(30));
        t.acked(1, &[vec!["b1".into()]], t0 + ms(40));
        assert!(!t.all_done());
        // Proxy 1 skips generation 1 of service 0: generation 2 covers both.
        t.acked(1, &[vec!["a2".into()]], t0 + ms(50));
        t.acked(2, &[vec!["b1".into()]], t0 + ms(55));
        assert_eq!(t.converged_proxies(), 1);
        t.acked(0, &[vec!["b1".into()], vec!["a2".into()]], t0 + ms(60));
        assert!(t.all_done());
        assert_eq!(t.converged_proxies(), 2);
        // a1: t0 -> 50 (proxy 1); b1: 10 -> 60 (proxy 0); a2: 20 -> 60.
        assert_eq!(t.lags(t0, t0 + ms(100)), vec![ms(50), ms(50), ms(40)]);
        assert_eq!(t.lags(t0 + ms(15), t0 + ms(100)), vec![ms(40)]);
        // An older generation ACKed late takes nothing back.
        t.acked(0, &[vec!["a1".into()]], t0 + ms(70));
        assert_eq!(t.converged_proxies(), 2);
    }

    #[test]
    fn scoped_changes_wait_for_the_proxies_of_their_namespace_only() {
        let t0 = Instant::now();
        // two namespaces: proxies 0 and 2 see service 0, proxy 1 sees service 1
        let mut t = ChurnTracker::new(2, vec![true, true, true]).scoped(2);
        t.made(0, "a1".into(), t0);
        t.made(1, "b1".into(), t0);
        t.acked(0, &[vec!["a1".into()]], t0 + ms(10));
        t.acked(1, &[vec!["b1".into()]], t0 + ms(20));
        assert!(!t.all_done());
        t.acked(2, &[vec!["a1".into()]], t0 + ms(30));
        assert!(t.all_done());
        assert_eq!(t.converged_proxies(), 3);
        assert_eq!(t.lags(t0, t0 + ms(100)), vec![ms(30), ms(20)]);
    }
}
