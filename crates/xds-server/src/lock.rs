//! Locking the server's mutexes. Every critical section in this crate leaves its data consistent,
//! so a mutex poisoned by a panicking thread is taken as it is (Go's `sync.Mutex`, which Istio's
//! `DiscoveryServer` and `Connection` use, has no poisoning at all).

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every critical section
/// here leaves the data consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
