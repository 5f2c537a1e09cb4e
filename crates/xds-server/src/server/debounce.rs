//! The debouncer: turns a stream of push requests into snapshot builds and pushes.
//!
//! Istio's `debounce` (`pilot/pkg/xds/discovery.go`) waits for `PILOT_DEBOUNCE_AFTER` (100 ms) of
//! quiet before every push, and for `PILOT_DEBOUNCE_MAX` (10 s) when the quiet never comes: an
//! isolated change always waits 100 ms, and a steady stream of changes (a rollout, 40 pods a
//! second) waits 10 s. Here `PILOT_DEBOUNCE_AFTER` is instead the shortest time between the
//! starts of two pushes, so:
//! - a change on an idle server (no push started within the last `debounce_after`) is pushed at
//!   once, together with whatever else is already queued;
//! - changes that come while a push is in flight, or within `debounce_after` of the last push's
//!   start, are merged and pushed when both are over: at most one push per `debounce_after`
//!   (10 a second by default) however fast the changes come, each at most `debounce_after` plus
//!   one push late.
//!
//! EDS-only requests skip the wait when EDS debouncing is off (`PILOT_ENABLE_EDS_DEBOUNCE=false`).

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::PushRequest;

#[derive(Debug, Clone, Copy)]
pub(crate) struct DebounceOptions {
    /// The shortest time between the starts of two pushes (`PILOT_DEBOUNCE_AFTER`).
    pub debounce_after: Duration,
    pub enable_eds_debounce: bool,
}

/// How a request came out of the debouncer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Debounced {
    /// From the first merged event to the push (`pilot_debounce_time`).
    pub delay: Duration,
    /// Number of events merged.
    pub events: u32,
}

#[derive(Default)]
struct Pending {
    request: Option<PushRequest>,
    events: u32,
    first_event: Option<Instant>,
}

impl Pending {
    fn add(&mut self, req: PushRequest) {
        self.first_event.get_or_insert_with(Instant::now);
        self.events += 1;
        self.request = Some(match self.request.take() {
            Some(p) => p.merge(&req),
            None => req,
        });
    }

    fn take(&mut self) -> Option<(PushRequest, Debounced)> {
        let request = self.request.take()?;
        let debounced = Debounced {
            delay: self.first_event.take().map_or(Duration::ZERO, |t| t.elapsed()),
            events: std::mem::take(&mut self.events),
        };
        Some((request, debounced))
    }
}

/// Runs until `rx` is closed. `push` starts one push and resolves when it is done.
pub(crate) async fn run<F, Fut>(mut rx: UnboundedReceiver<PushRequest>, opts: DebounceOptions, mut push: F)
where
    F: FnMut(PushRequest, Debounced) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut pending = Pending::default();
    // When the last debounced push started: the next one starts `debounce_after` later at the earliest.
    let mut last_push: Option<Instant> = None;
    let mut in_flight: Option<JoinHandle<()>> = None;
    // EDS-only requests that bypass debouncing but arrived while a push was in flight.
    let mut eds_now: Option<PushRequest> = None;
    let bypasses = |req: &PushRequest| !opts.enable_eds_debounce && !req.full;
    loop {
        let due = pending
            .request
            .as_ref()
            .map(|_| last_push.map_or_else(Instant::now, |t| t + opts.debounce_after));
        tokio::select! {
            ev = rx.recv() => {
                let Some(req) = ev else { break };
                if bypasses(&req) {
                    if in_flight.is_none() {
                        in_flight = Some(tokio::spawn(push(req, Debounced { delay: Duration::ZERO, events: 1 })));
                    } else {
                        eds_now = Some(match eds_now.take() { Some(p) => p.merge(&req), None => req });
                    }
                    continue;
                }
                pending.add(req);
            }
            _ = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() && in_flight.is_none() => {
                // What is already queued goes into this push too (one file write or API call is
                // often several events; an EDS-only request among them is covered by the merge).
                while let Ok(req) = rx.try_recv() {
                    pending.add(req);
                }
                if let Some((req, debounced)) = pending.take() {
                    tracing::debug!(events = debounced.events, delay = ?debounced.delay, reason = %req.reason_string(), "push debounced");
                    last_push = Some(Instant::now());
                    in_flight = Some(tokio::spawn(push(req, debounced)));
                }
            }
            res = async { in_flight.as_mut().expect("guarded by is_some").await }, if in_flight.is_some() => {
                if let Err(e) = res {
                    tracing::error!("push failed: {e}");
                }
                in_flight = eds_now
                    .take()
                    .map(|req| tokio::spawn(push(req, Debounced { delay: Duration::ZERO, events: 1 })));
            }
        }
    }
    if let Some(h) = in_flight {
        let _ = h.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TriggerReason;
    use std::sync::{Arc, Mutex};
    use tokio::sync::mpsc;

    type Log = Arc<Mutex<Vec<(Duration, PushRequest, Debounced)>>>;

    fn opts(eds: bool) -> DebounceOptions {
        DebounceOptions {
            debounce_after: Duration::from_millis(100),
            enable_eds_debounce: eds,
        }
    }

    /// Starts the debouncer with a push that takes `push_time` and logs when it started.
    fn start(o: DebounceOptions, push_time: Duration) -> (mpsc::UnboundedSender<PushRequest>, Log) {
        let (tx, rx) = mpsc::unbounded_channel();
        let log: Log = Arc::default();
        let t0 = Instant::now();
        let l = log.clone();
        tokio::spawn(run(rx, o, move |req, d| {
            l.lock().unwrap().push((Instant::now() - t0, req, d));
            tokio::time::sleep(push_time)
        }));
        (tx, log)
    }

    fn times(log: &Log) -> Vec<Duration> {
        log.lock().unwrap().iter().map(|(t, _, _)| *t).collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn config() -> PushRequest {
        PushRequest::full(TriggerReason::ConfigUpdate)
    }

    #[tokio::test(start_paused = true)]
    async fn an_isolated_change_is_pushed_at_once() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        tx.send(config()).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A second one after a quiet second: at once again.
        tx.send(config()).unwrap();
        tokio::time::sleep(ms(1)).await;
        assert_eq!(times(&log), vec![Duration::ZERO, Duration::from_secs(1)]);
        let log = log.lock().unwrap();
        assert_eq!(
            log[0].2,
            Debounced {
                delay: Duration::ZERO,
                events: 1
            }
        );
        assert_eq!(
            log[1].2,
            Debounced {
                delay: Duration::ZERO,
                events: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn events_queued_together_are_one_push() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        tx.send(config()).unwrap();
        tx.send(PushRequest::all_endpoints()).unwrap();
        tx.send(PushRequest::full(TriggerReason::ServiceUpdate)).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0, Duration::ZERO);
        assert_eq!(log[0].2.events, 3);
        assert!(log[0].1.full);
        assert_eq!(log[0].1.reason.get(&TriggerReason::EndpointUpdate), Some(&1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_after_a_push_waits_for_the_interval_and_is_merged() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        // Events at 0, 20, 40, 60, 80 ms.
        for _ in 0..5 {
            tx.send(config()).unwrap();
            tokio::time::sleep(ms(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(times(&log), vec![ms(0), ms(100)]);
        let log = log.lock().unwrap();
        assert_eq!(log[1].1.reason.get(&TriggerReason::ConfigUpdate), Some(&4));
        // The first merged event (20 ms) waited 80 ms.
        assert_eq!(
            log[1].2,
            Debounced {
                delay: ms(80),
                events: 4
            }
        );
    }

    /// 1,000 changes a second for 10 s: one push per `debounce_after` (10 a second), none
    /// later than `debounce_after` after its first event, every event in one of them.
    #[tokio::test(start_paused = true)]
    async fn a_storm_is_pushed_at_most_once_per_interval() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        for _ in 0..10_000 {
            tx.send(config()).unwrap();
            tokio::time::sleep(ms(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = times(&log);
        assert_eq!(t.len(), 101, "{t:?}");
        assert!(t.windows(2).all(|w| w[1] - w[0] == ms(100)), "{t:?}");
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|(_, _, d)| d.events).sum::<u32>(), 10_000);
        assert!(log.iter().all(|(_, _, d)| d.delay <= ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn one_push_in_flight_and_events_meanwhile_go_into_the_next() {
        let (tx, log) = start(opts(true), Duration::from_secs(2));
        tx.send(config()).unwrap();
        tokio::time::sleep(ms(500)).await;
        for _ in 0..3 {
            tx.send(PushRequest::full(TriggerReason::ServiceUpdate)).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].0, Duration::ZERO);
        // The first push ends at 2 s; the next starts then, not at 0.5 s.
        assert_eq!(log[1].0, Duration::from_secs(2));
        assert_eq!(log[1].1.reason.get(&TriggerReason::ServiceUpdate), Some(&3));
        assert_eq!(log[1].2.delay, ms(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn eds_is_pushed_at_once_without_eds_debounce() {
        let (tx, log) = start(opts(false), Duration::ZERO);
        tx.send(config()).unwrap();
        tokio::time::sleep(ms(10)).await;
        // Within the interval after a full push: a full change waits, an endpoint change does not.
        tx.send(PushRequest::all_endpoints()).unwrap();
        tokio::time::sleep(ms(10)).await;
        assert_eq!(times(&log), vec![ms(0), ms(10)]);
        assert!(!log.lock().unwrap()[1].1.full);
    }

    #[tokio::test(start_paused = true)]
    async fn eds_is_debounced_by_default() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        tx.send(config()).unwrap();
        tokio::time::sleep(ms(10)).await;
        tx.send(PushRequest::all_endpoints()).unwrap();
        tx.send(PushRequest::all_endpoints()).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(times(&log), vec![ms(0), ms(100)]);
        let log = log.lock().unwrap();
        assert_eq!(log[1].2.events, 2);
        assert!(!log[1].1.full);
    }
}
