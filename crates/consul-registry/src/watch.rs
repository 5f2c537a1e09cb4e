//! Following the catalog with blocking queries, as Istio 1.7's `consulMonitor` did and Consul's
//! docs on blocking queries say:
//!
//! - `/v1/catalog/services` is asked with `index` (the last `X-Consul-Index`) and `wait`: Consul
//!   answers as soon as any service registration changes (its index is the catalog's services
//!   table's, which every instance's registration and deregistration moves), or after `wait`;
//! - when its index moved (and at the first answer), each listed service is read
//!   (`/v1/catalog/service/<name>`, a few at a time) and the registry replaced with what was
//!   read; a service that disappeared from the list goes;
//! - an index that goes backwards resets to 0 (the next query answers at once); an index of 0
//!   is waited on as 1, so that a broken answer never makes a busy loop;
//! - queries are rate-limited by a token bucket (a burst, then one per `refill`), as the docs
//!   advise, so a catalog that churns is polled at a bounded rate;
//! - an error (unreachable, timeout, HTTP status, an answer too large or malformed) is logged
//!   with the URL and counted, and the query is retried after an exponential backoff; a service
//!   whose read failed keeps what it had, and is read again after the backoff.
//!
//! Only one long query is open at a time (Consul limits connections per client:
//! `limits.http_max_conns_per_client`, 200 by default), unlike one blocking query per service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use registry::RegistryDiff;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::catalog::{CatalogService, Services};
use crate::client::{Client, ConsulError, Query};
use crate::{ConsulMetrics, ConsulRegistry, Problem};

/// How the watcher paces itself.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// A blocking query's `wait` (Consul's default is 5 minutes, its maximum 10).
    pub wait: Duration,
    /// The first delay after an error; doubled after each error in a row.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Queries allowed in a row before the rate limit applies.
    pub burst: u32,
    /// One more query allowed per `refill`.
    pub refill: Duration,
    /// Services read at the same time after a change.
    pub concurrency: usize,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            wait: Duration::from_secs(300),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            burst: 5,
            refill: Duration::from_secs(1),
            concurrency: 8,
        }
    }
}

/// Starts following the catalog: each change of the registry is sent on `diffs`. The receiver
/// turns `true` after the first round of reads (whether or not every read succeeded).
pub fn spawn(
    registry: Arc<ConsulRegistry>,
    client: Client,
    options: WatchOptions,
    metrics: ConsulMetrics,
    diffs: mpsc::UnboundedSender<RegistryDiff>,
) -> (JoinHandle<()>, watch::Receiver<bool>) {
    let (synced, synced_rx) = watch::channel(false);
    let w = Watcher {
        registry,
        client,
        options,
        metrics,
        diffs,
        synced,
    };
    (tokio::spawn(w.run()), synced_rx)
}

struct Watcher {
    registry: Arc<ConsulRegistry>,
    client: Client,
    options: WatchOptions,
    metrics: ConsulMetrics,
    diffs: mpsc::UnboundedSender<RegistryDiff>,
    synced: watch::Sender<bool>,
}

/// The index of the next blocking query after an answer with `got`, the answer before it
/// having had `prev`.
pub fn next_index(prev: u64, got: u64) -> u64 {
    if got < prev { 0 } else { got.max(1) }
}

impl Watcher {
    async fn run(self) {
        // the query's index, and the last X-Consul-Index seen (none yet)
        let (mut index, mut seen) = (0, None);
        // a round of reads is owed: at the start, and after reads that failed
        let mut owed = true;
        let mut backoff = Backoff::new(self.options.backoff_initial, self.options.backoff_max);
        let mut bucket = TokenBucket::new(self.options.burst, self.options.refill);
        loop {
            if self.diffs.is_closed() {
                return;
            }
            bucket.take().await;
            let q = Query {
                index: if owed { 0 } else { index },
                wait: self.options.wait,
            };
            let listed = match self.client.services(q).await {
                Ok(a) => a,
                Err(e) => {
                    self.report(&e);
                    tokio::time::sleep(backoff.next()).await;
                    continue;
                }
            };
            let moved = seen != Some(listed.index);
            index = next_index(seen.unwrap_or(0), listed.index);
            seen = Some(listed.index);
            if !owed && !moved {
                backoff.reset();
                continue; // `wait` passed with no change
            }
            let failed = self.round(&listed.value).await;
            let _ = self.synced.send(true);
            owed = failed > 0;
            if owed {
                tokio::time::sleep(backoff.next()).await;
            } else {
                backoff.reset();
            }
        }
    }

    /// Reads every listed service and replaces the registry with what was read; returns how
    /// many reads failed.
    async fn round(&self, listed: &Services) -> usize {
        let names: BTreeSet<String> = listed.keys().cloned().collect();
        let reads: Vec<(String, Result<Vec<CatalogService>, ConsulError>)> = futures::stream::iter(names.clone())
            .map(|name| {
                let client = self.client.clone();
                async move {
                    let q = Query {
                        index: 0,
                        wait: Duration::ZERO,
                    };
                    let r = client.service(&name, q).await.map(|a| a.value);
                    (name, r)
                }
            })
            .buffer_unordered(self.options.concurrency.max(1))
            .collect()
            .await;
        let mut read = BTreeMap::new();
        let mut failed = 0;
        for (name, r) in reads {
            match r {
                Ok(instances) => {
                    read.insert(name, instances);
                }
                Err(e) => {
                    failed += 1;
                    self.report(&e);
                }
            }
        }
        let (diff, problems) = self.registry.replace(&names, read);
        for p in &problems {
            self.report_problem(p);
        }
        if !diff.is_empty() {
            tracing::info!(
                services_changed = diff.services_changed.len(),
                endpoints_changed = diff.endpoints_changed.len(),
                "Consul catalog changed"
            );
            let _ = self.diffs.send(diff);
        }
        failed
    }

    fn report(&self, e: &ConsulError) {
        self.metrics.error(e.kind());
        if let Some(suppressed) = monitoring::throttle::allow("consul_read") {
            tracing::warn!(
                r#type = e.kind(),
                suppressed,
                "{e}; the services already read stay as they were, retrying"
            );
        }
    }

    fn report_problem(&self, p: &Problem) {
        let kind = if p.what.starts_with("service") {
            "invalid_service"
        } else {
            "invalid_instance"
        };
        self.metrics.error(kind);
        tracing::warn!(what = p.what, "Consul {}: not served: {}", p.what, p.reason);
    }
}

/// Exponential backoff between `initial` and `max`.
#[derive(Debug)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// `burst` tokens, one more per `refill`.
#[derive(Debug)]
struct TokenBucket {
    burst: f64,
    refill: Duration,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(burst: u32, refill: Duration) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            burst,
            refill,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Waits for a token and takes it.
    async fn take(&mut self) {
        let now = Instant::now();
        if !self.refill.is_zero() {
            let earned = now.duration_since(self.at).as_secs_f64() / self.refill.as_secs_f64();
            self.tokens = (self.tokens + earned).min(self.burst);
        } else {
            self.tokens = self.burst;
        }
        self.at = now;
        if self.tokens < 1.0 {
            let wait = self.refill.mul_f64(1.0 - self.tokens);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.at = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_rules_of_consuls_docs() {
        assert_eq!(next_index(0, 12), 12, "first answer");
        assert_eq!(next_index(12, 12), 12, "no change (wait passed)");
        assert_eq!(next_index(12, 15), 15, "moved on");
        assert_eq!(next_index(12, 3), 0, "went backwards: start again");
        assert_eq!(next_index(0, 0), 1, "0 is waited on as 1, never a busy loop");
        assert_eq!(next_index(1, 0), 0, "backwards from 1");
        assert_eq!(next_index(0, 0).max(1), 1);
    }

    #[test]
    fn backoff_doubles_to_its_max_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next().as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_then_one_per_refill() {
        let mut bucket = TokenBucket::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        bucket.take().await;
        bucket.take().await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "the burst goes at once");
        bucket.take().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        bucket.take().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t1 = Instant::now();
        bucket.take().await;
        bucket.take().await;
        assert_eq!(t1.elapsed(), Duration::ZERO, "refilled up to the burst, no more");
        bucket.take().await;
        assert_eq!(t1.elapsed(), Duration::from_secs(1));
    }
}
