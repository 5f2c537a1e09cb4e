//! A per-key retry queue, as client-go's rate-limited work queue behind Istio's
//! `controllers.Queue` (pkg/kube/controllers/queue.go): keys are handled one at a time, a key
//! added again while it waits is handled once, and a key whose handling failed comes back after
//! its own delay while the others go on: a configuration that cannot be patched never holds up
//! the rest. Retries are for ever (`WithMaxAttempts(math.MaxInt)`), spaced by the limiter.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

/// When a key that failed `n` times in a row (n >= 1) is tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limiter {
    /// client-go's `ItemExponentialFailureRateLimiter`: `base * 2^(n-1)`, at most `max`
    /// (Istio's validation controller: 100 ms, 1 min).
    Exponential { base: Duration, max: Duration },
    /// client-go's `ItemFastSlowRateLimiter`: `fast` for the first `fast_attempts`, then `slow`
    /// (Istio's webhook cert patcher: 100 ms, 1 min, 5).
    FastSlow {
        fast: Duration,
        slow: Duration,
        fast_attempts: u32,
    },
}

impl Limiter {
    pub fn delay(self, failures: u32) -> Duration {
        match self {
            Limiter::Exponential { base, max } => {
                let exp = failures.saturating_sub(1).min(30);
                base.saturating_mul(1u32 << exp).min(max)
            }
            Limiter::FastSlow {
                fast,
                slow,
                fast_attempts,
            } => {
                if failures <= fast_attempts {
                    fast
                } else {
                    slow
                }
            }
        }
    }
}

/// The sending side: add keys, report how their handling went.
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<String>,
    failures: Arc<Mutex<HashMap<String, u32>>>,
    limiter: Limiter,
}

/// The receiving side: the next key to handle.
pub struct Keys {
    rx: mpsc::UnboundedReceiver<String>,
    ready: VecDeque<String>,
}

pub fn queue(limiter: Limiter) -> (Queue, Keys) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Queue {
            tx,
            failures: Arc::default(),
            limiter,
        },
        Keys {
            rx,
            ready: VecDeque::new(),
        },
    )
}

impl Queue {
    pub fn add(&self, key: &str) {
        let _ = self.tx.send(key.to_owned());
    }

    /// The key was handled: its failures are forgotten.
    pub fn done(&self, key: &str) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(key);
        }
    }

    /// The key failed: it comes back after its delay. Returns the delay.
    pub fn retry(&self, key: &str) -> Duration {
        let n = match self.failures.lock() {
            Ok(mut f) => {
                let n = f.entry(key.to_owned()).or_default();
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        let delay = self.limiter.delay(n);
        let tx = self.tx.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(key);
        });
        delay
    }
}

impl Keys {
    /// The next key; keys added several times while waiting come once, in the order first added.
    pub async fn next(&mut self) -> Option<String> {
        if self.ready.is_empty() {
            let first = self.rx.recv().await?;
            let mut seen = HashSet::from([first.clone()]);
            self.ready.push_back(first);
            while let Ok(k) = self.rx.try_recv() {
                if seen.insert(k.clone()) {
                    self.ready.push_back(k);
                }
            }
        }
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istios_limiters() {
        let exp = Limiter::Exponential {
            base: Duration::from_millis(100),
            max: Duration::from_secs(60),
        };
        assert_eq!(exp.delay(1), Duration::from_millis(100));
        assert_eq!(exp.delay(4), Duration::from_millis(800));
        assert_eq!(exp.delay(40), Duration::from_secs(60));
        let fast_slow = Limiter::FastSlow {
            fast: Duration::from_millis(100),
            slow: Duration::from_secs(60),
            fast_attempts: 5,
        };
        assert_eq!(fast_slow.delay(5), Duration::from_millis(100));
        assert_eq!(fast_slow.delay(6), Duration::from_secs(60));
    }

    /// One key failing for ever does not hold up another added after it.
    #[tokio::test(start_paused = true)]
    async fn a_failing_key_comes_back_later_and_never_blocks_the_others() {
        let (q, mut keys) = queue(Limiter::Exponential {
            base: Duration::from_millis(100),
            max: Duration::from_secs(60),
        });
        q.add("bad");
        q.add("bad");
        q.add("good");
        let mut handled = Vec::new();
        let t0 = tokio::time::Instant::now();
        while handled.len() < 5 {
            let k = keys.next().await.unwrap();
            handled.push((k.clone(), t0.elapsed().as_millis()));
            if k == "bad" {
                q.retry(&k);
            } else {
                q.done(&k);
            }
        }
        let names: Vec<&str> = handled.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["bad", "good", "bad", "bad", "bad"], "{handled:?}");
        let times: Vec<u128> = handled.iter().map(|(_, t)| *t).collect();
        assert_eq!(
            times,
            [0, 0, 100, 300, 700],
            "exponential retries of the failing key only"
        );
    }
}
