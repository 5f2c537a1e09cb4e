//! The debouncer, as Istio's `debounce` in `pilot/pkg/xds/discovery.go`: merges push requests
//! until `debounce_after` of quiet has passed, but pushes no later than `debounce_max` after the
//! first event; one push in flight at a time, events arriving meanwhile go into the next one.
//! EDS-only requests skip the quiet period when EDS debouncing is off.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::PushRequest;

#[derive(Debug, Clone, Copy)]
pub(crate) struct DebounceOptions {
    pub debounce_after: Duration,
    pub debounce_max: Duration,
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

struct State {
    pending: Option<PushRequest>,
    events: u32,
    first_event: Instant,
    last_event: Instant,
    /// When to look again at `pending`.
    deadline: Option<Instant>,
}

/// Runs until `rx` is closed. `push` starts one push and resolves when it is done.
pub(crate) async fn run<F, Fut>(mut rx: UnboundedReceiver<PushRequest>, opts: DebounceOptions, mut push: F)
where
    F: FnMut(PushRequest, Debounced) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let now = Instant::now();
    let mut st = State {
        pending: None,
        events: 0,
        first_event: now,
        last_event: now,
        deadline: None,
    };
    let mut in_flight: Option<JoinHandle<()>> = None;
    // EDS-only requests that bypass debouncing but arrived while a push was in flight.
    let mut eds_now: Option<PushRequest> = None;
    loop {
        let deadline = st.deadline.unwrap_or_else(Instant::now);
        tokio::select! {
            ev = rx.recv() => {
                let Some(req) = ev else { break };
                if !opts.enable_eds_debounce && !req.full {
                    if in_flight.is_none() {
                        in_flight = Some(tokio::spawn(push(req, Debounced { delay: Duration::ZERO, events: 1 })));
                    } else {
                        eds_now = Some(match eds_now.take() { Some(p) => p.merge(&req), None => req });
                    }
                    continue;
                }
                let now = Instant::now();
                st.last_event = now;
                if st.events == 0 {
                    st.first_event = now;
                    st.deadline = Some(now + opts.debounce_after);
                }
                st.events += 1;
                st.pending = Some(match st.pending.take() { Some(p) => p.merge(&req), None => req });
            }
            _ = sleep_until(deadline), if st.deadline.is_some() && in_flight.is_none() => {
                in_flight = worker(&mut st, &opts, &mut push);
            }
            res = async { in_flight.as_mut().expect("guarded by is_some").await }, if in_flight.is_some() => {
                if let Err(e) = res {
                    tracing::error!("push failed: {e}");
                }
                in_flight = match eds_now.take() {
                    Some(req) => Some(tokio::spawn(push(req, Debounced { delay: Duration::ZERO, events: 1 }))),
                    None => worker(&mut st, &opts, &mut push),
                };
            }
        }
    }
    if let Some(h) = in_flight {
        let _ = h.await;
    }
}

/// Istio's `pushWorker`: push if quiet long enough or waited too long, else look again later.
fn worker<F, Fut>(st: &mut State, opts: &DebounceOptions, push: &mut F) -> Option<JoinHandle<()>>
where
    F: FnMut(PushRequest, Debounced) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(pending) = st.pending.take() else {
        st.deadline = None;
        return None;
    };
    let now = Instant::now();
    let delay = now - st.first_event;
    let quiet = now - st.last_event;
    if delay >= opts.debounce_max || quiet >= opts.debounce_after {
        tracing::debug!(events = st.events, ?delay, reason = %pending.reason_string(), "push debounce stable");
        let debounced = Debounced {
            delay,
            events: st.events,
        };
        st.events = 0;
        st.deadline = None;
        Some(tokio::spawn(push(pending, debounced)))
    } else {
        st.pending = Some(pending);
        st.deadline = Some((st.last_event + opts.debounce_after).min(st.first_event + opts.debounce_max));
        None
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
            debounce_max: Duration::from_secs(10),
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

    #[tokio::test(start_paused = true)]
    async fn burst_is_merged_into_one_push_after_quiet_period() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        for _ in 0..5 {
            tx.send(PushRequest::full(TriggerReason::ConfigUpdate)).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1);
        // Last event at 200ms, quiet for 100ms.
        assert_eq!(log[0].0, Duration::from_millis(300));
        assert_eq!(log[0].1.reason.get(&TriggerReason::ConfigUpdate), Some(&5));
        assert_eq!(
            log[0].2,
            Debounced {
                delay: Duration::from_millis(300),
                events: 5
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn constant_stream_is_pushed_at_debounce_max() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        // An event every 30ms, never 100ms of quiet: events at 0, 30, ..., 9990ms go into the
        // first push at 10s; the next window starts at 10.02s.
        for _ in 0..700 {
            tx.send(PushRequest::full(TriggerReason::ConfigUpdate)).unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let t = times(&log);
        assert_eq!(t[..2], [Duration::from_secs(10), Duration::from_millis(20_020)]);
        assert_eq!(log.lock().unwrap()[0].2.events, 334);
    }

    #[tokio::test(start_paused = true)]
    async fn one_push_in_flight_and_events_meanwhile_go_into_the_next() {
        let (tx, log) = start(opts(true), Duration::from_secs(2));
        tx.send(PushRequest::full(TriggerReason::ConfigUpdate)).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..3 {
            tx.send(PushRequest::full(TriggerReason::ServiceUpdate)).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].0, Duration::from_millis(100));
        // The first push ends at 2.1s; the next starts then, not at 0.6s.
        assert_eq!(log[1].0, Duration::from_millis(2100));
        assert_eq!(log[1].1.reason.get(&TriggerReason::ServiceUpdate), Some(&3));
    }

    #[tokio::test(start_paused = true)]
    async fn eds_is_pushed_at_once_without_eds_debounce() {
        let (tx, log) = start(opts(false), Duration::ZERO);
        tx.send(PushRequest::all_endpoints()).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(times(&log), vec![Duration::ZERO]);
        assert!(!log.lock().unwrap()[0].1.full);
    }

    #[tokio::test(start_paused = true)]
    async fn eds_is_debounced_by_default() {
        let (tx, log) = start(opts(true), Duration::ZERO);
        tx.send(PushRequest::all_endpoints()).unwrap();
        tx.send(PushRequest::all_endpoints()).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(times(&log), vec![Duration::from_millis(100)]);
        assert_eq!(log.lock().unwrap()[0].2.events, 2);
    }
}
