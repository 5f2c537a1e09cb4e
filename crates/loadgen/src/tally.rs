//! What the simulated proxies have reported so far: per proxy its handshake time, failure, the
//! content it last ACKed per watched type and when it first ACKed a change; the responses of the
//! recording proxy; bytes and errors.

use std::ops::Range;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::churn::ChurnTracker;
use crate::proxy::{ProxyEvent, Recorded, Watched};

/// The proxies' reports of one phase.
pub(crate) struct Tally {
    rx: mpsc::UnboundedReceiver<ProxyEvent>,
    /// When [`until`](Self::until) gives up.
    pub deadline: tokio::time::Instant,
    pub converged: Vec<Option<Duration>>,
    pub failed: Vec<bool>,
    /// Per watched type, per proxy: a hash of the last resources ACKed.
    pub content: [Vec<Option<u64>>; 2],
    /// The change: which type it shows in, when it was made, each proxy's content before it.
    changed_since: Option<(Watched, Instant, Vec<Option<u64>>)>,
    /// Per proxy: from the change to its first ACK of different content.
    pub changed: Vec<Option<Duration>>,
    /// Per proxy: whether the change is waited for (proxies a Sidecar keeps from seeing it are
    /// not); every proxy unless [`Tally::expect_change`] says otherwise.
    expected: Option<Vec<bool>>,
    /// What the recording proxy received, in order.
    pub recorded: Vec<(Instant, Recorded)>,
    /// Sustained endpoint churn: which proxy has ACKed which change.
    pub churn: Option<ChurnTracker>,
    pub bytes: u64,
    /// Bytes received since [`Tally::change_made`] (the measured change's share of `bytes`).
    pub change_bytes: u64,
    pub errors: Vec<String>,
}

impl Tally {
    pub(crate) fn new(n: usize, rx: mpsc::UnboundedReceiver<ProxyEvent>, deadline: tokio::time::Instant) -> Tally {
        Tally {
            rx,
            deadline,
            converged: vec![None; n],
            failed: vec![false; n],
            content: [vec![None; n], vec![None; n]],
            changed_since: None,
            changed: vec![None; n],
            expected: None,
            recorded: Vec::new(),
            churn: None,
            bytes: 0,
            change_bytes: 0,
            errors: Vec::new(),
        }
    }

    /// Every proxy converged or failed.
    pub(crate) fn settled(&self) -> bool {
        self.settled_within(0..self.converged.len())
    }

    /// Every proxy of `range` converged or failed.
    pub(crate) fn settled_within(&self, range: Range<usize>) -> bool {
        self.converged[range.clone()]
            .iter()
            .zip(&self.failed[range])
            .all(|(c, f)| c.is_some() || *f)
    }

    /// Handshake times of the proxies of `range` that converged.
    pub(crate) fn connect_times(&self, range: Range<usize>) -> Vec<Duration> {
        self.converged[range].iter().flatten().copied().collect()
    }

    /// Starts timing a change of `watched` made at `at`: each proxy's next ACK of content other
    /// than what it has now.
    pub(crate) fn change_made(&mut self, watched: Watched, at: Instant) {
        let before = self.content[watched as usize].clone();
        self.changed_since = Some((watched, at, before));
    }

    /// Waits for the change at the proxies `expected` marks only.
    pub(crate) fn expect_change(&mut self, expected: Vec<bool>) {
        self.expected = Some(expected);
    }

    /// Every converged proxy expected to see the change has ACKed it.
    pub(crate) fn all_changed(&self) -> bool {
        self.changed.iter().zip(&self.converged).enumerate().all(|(p, (c, v))| {
            c.is_some()
                || v.is_none()
                || self
                    .expected
                    .as_ref()
                    .is_some_and(|e| !e.get(p).copied().unwrap_or(true))
        })
    }

    /// Mean bytes each proxy that ACKed the change received for it (`None` before any did).
    pub(crate) fn change_bytes_per_proxy(&self) -> Option<f64> {
        let n = self.changed.iter().flatten().count();
        (n > 0).then(|| self.change_bytes as f64 / n as f64)
    }

    /// The change times of the proxies that ACKed it.
    pub(crate) fn change_times(&self) -> Vec<Duration> {
        self.changed.iter().flatten().copied().collect()
    }

    /// Applies events until `done` holds, the proxies are all gone, or the deadline.
    pub(crate) async fn until(&mut self, done: impl Fn(&Tally) -> bool) {
        while !done(self) {
            if !self.next().await {
                return;
            }
        }
    }

    /// Applies the next event; false once the proxies are all gone or at the deadline.
    pub(crate) async fn next(&mut self) -> bool {
        match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
            Ok(Some(e)) => {
                self.apply(e);
                true
            }
            Ok(None) => false,
            Err(_) => {
                self.errors.push("timed out (--timeout)".to_owned());
                false
            }
        }
    }

    fn apply(&mut self, e: ProxyEvent) {
        match e {
            ProxyEvent::Converged { proxy, elapsed } => self.converged[proxy] = Some(elapsed),
            ProxyEvent::Bytes(b) => {
                self.bytes += b as u64;
                if self.changed_since.is_some() {
                    self.change_bytes += b as u64;
                }
            }
            ProxyEvent::Received { at, response } => self.recorded.push((at, response)),
            ProxyEvent::Endpoints { proxy, clusters, at } => {
                if let Some(churn) = &mut self.churn {
                    churn.acked(proxy, &clusters, at);
                }
            }
            ProxyEvent::Failed { proxy, error } => {
                self.failed[proxy] = true;
                self.errors.push(format!("proxy {proxy}: {error}"));
            }
            ProxyEvent::Acked {
                proxy,
                watched,
                content,
                at,
            } => {
                if let Some((w, made, before)) = &self.changed_since
                    && *w == watched
                    && self.changed[proxy].is_none()
                    && before[proxy] != Some(content)
                {
                    self.changed[proxy] = Some(at.saturating_duration_since(*made));
                }
                self.content[watched as usize][proxy] = Some(content);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(proxy: usize, content: u64, at: Instant) -> ProxyEvent {
        ProxyEvent::Acked {
            proxy,
            watched: Watched::Routes,
            content,
            at,
        }
    }

    #[tokio::test]
    async fn a_change_counts_only_new_content_of_the_watched_type() {
        let (tx, rx) = mpsc::unbounded_channel();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut t = Tally::new(2, rx, deadline);
        let t0 = Instant::now();
        for p in 0..2 {
            tx.send(acked(p, 7, t0)).unwrap();
            tx.send(ProxyEvent::Converged {
                proxy: p,
                elapsed: Duration::from_millis(3),
            })
            .unwrap();
        }
        tx.send(ProxyEvent::Bytes(1000)).unwrap();
        t.until(Tally::settled).await;
        assert_eq!(t.connect_times(0..2).len(), 2);
        while t.bytes < 1000 {
            assert!(t.next().await);
        }
        t.change_made(Watched::Routes, t0);
        tx.send(ProxyEvent::Bytes(30)).unwrap();
        tx.send(ProxyEvent::Bytes(50)).unwrap();
        tx.send(acked(0, 7, t0 + Duration::from_millis(5))).unwrap();
        tx.send(ProxyEvent::Acked {
            proxy: 1,
            watched: Watched::Endpoints,
            content: 9,
            at: t0,
        })
        .unwrap();
        tx.send(acked(1, 8, t0 + Duration::from_millis(10))).unwrap();
        tx.send(acked(0, 8, t0 + Duration::from_millis(20))).unwrap();
        t.until(Tally::all_changed).await;
        assert_eq!(
            t.changed,
            vec![Some(Duration::from_millis(20)), Some(Duration::from_millis(10))]
        );
        assert_eq!((t.bytes, t.change_bytes), (1080, 80));
        assert_eq!(t.change_bytes_per_proxy(), Some(40.0));
        assert!(t.errors.is_empty());
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline() {
        let (_tx, rx) = mpsc::unbounded_channel();
        let mut t = Tally::new(1, rx, tokio::time::Instant::now() + Duration::from_millis(20));
        t.until(Tally::settled).await;
        assert_eq!(t.errors, vec!["timed out (--timeout)".to_owned()]);
    }
}
