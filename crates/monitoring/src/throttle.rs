//! Rate limits for warnings a peer can repeat at will (invalid requests, NACKs, requests without a
//! type): per kind of warning, a few per window are logged, and the first one logged after some
//! were dropped says how many.
//!
//! ```text
//! if let Some(suppressed) = monitoring::throttle::allow("ads_invalid_request") {
//!     tracing::warn!(suppressed, "ADS: invalid request");
//! }
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Warnings of one kind logged per window.
pub const BURST: u32 = 5;
/// The window.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Window {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

/// Per-kind state; one per process ([`allow`]) or one per owner.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    kinds: Mutex<HashMap<&'static str, Window>>,
}

impl Throttle {
    /// Whether a warning of `kind` may be logged now; if so, how many were dropped since the last
    /// one logged.
    pub(crate) fn allow_at(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        let w = kinds.entry(kind).or_insert(Window {
            start: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(w.start) >= WINDOW {
            w.start = now;
            w.logged = 0;
        }
        if w.logged >= BURST {
            w.suppressed += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

/// [`Throttle::allow_at`] now, on the process's throttle.
pub fn allow(kind: &'static str) -> Option<u64> {
    static GLOBAL: OnceLock<Throttle> = OnceLock::new();
    GLOBAL.get_or_init(Throttle::default).allow_at(kind, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_count_of_what_was_dropped() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(t.allow_at("nack", t0), Some(0));
        }
        for _ in 0..1000 {
            assert_eq!(t.allow_at("nack", t0 + Duration::from_secs(1)), None);
        }
        // Other kinds have their own budget.
        assert_eq!(t.allow_at("invalid", t0), Some(0));
        assert_eq!(t.allow_at("nack", t0 + WINDOW), Some(1000));
        assert_eq!(t.allow_at("nack", t0 + WINDOW), Some(0));
    }
}
