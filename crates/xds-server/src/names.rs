//! Subscribed resource names shared across connections: `Names` (one set, shared by every
//! connection that subscribes to exactly those names) and the server's `NameInterner`, which
//! keeps each name and each set once and prunes what no connection holds any more.

use std::collections::{BTreeSet, HashSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use crate::connection::lock;

/// A set of subscribed resource names, shared: the server interns equal sets (and each name), so
/// the sidecars of a namespace, which subscribe to the same names, hold one set between them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names(Arc<BTreeSet<Arc<str>>>);

impl Names {
    /// Whether `name` is subscribed.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }

    /// Whether both are the same shared set (not only equal).
    pub fn ptr_eq(&self, other: &Names) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Names {
    type Target = BTreeSet<Arc<str>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// A set of its own, not interned (for views outside the server, e.g. `/debug/config_dump`).
impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        Names(Arc::new(iter.into_iter().map(Arc::from).collect()))
    }
}

impl<'a> FromIterator<&'a str> for Names {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        Names(Arc::new(iter.into_iter().map(Arc::from).collect()))
    }
}

impl FromIterator<Arc<str>> for Names {
    fn from_iter<I: IntoIterator<Item = Arc<str>>>(iter: I) -> Self {
        Names(Arc::new(iter.into_iter().collect()))
    }
}

/// The server's interned names and name sets. Entries that only the interner still holds are
/// pruned whenever the table has doubled since the last prune, so it stays within twice what the
/// connections use.
#[derive(Debug, Default)]
pub(crate) struct NameInterner {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    names: HashSet<Arc<str>>,
    sets: HashSet<Arc<BTreeSet<Arc<str>>>>,
    /// Entries (names + sets) left by the last prune.
    kept: usize,
}

/// Tables smaller than this are never pruned.
pub(crate) const PRUNE_MIN: usize = 1024;

impl NameInterner {
    /// Locks the table for a batch of lookups (one lock per request, not per name).
    pub fn lock(&self) -> Interning<'_> {
        Interning(lock(&self.table))
    }

    /// Live entries (names, sets), for tests and debugging.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        let t = lock(&self.table);
        (t.names.len(), t.sets.len())
    }
}

/// The interner's table, locked. Taken after a connection's `watched` lock, never before.
pub(crate) struct Interning<'a>(std::sync::MutexGuard<'a, Table>);

impl Interning<'_> {
    /// The shared copy of `name`.
    pub fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.0.names.insert(n.clone());
        self.maybe_prune();
        n
    }

    /// The shared set of these names.
    pub fn names<'n>(&mut self, names: impl IntoIterator<Item = &'n str>) -> Names {
        let set: BTreeSet<Arc<str>> = names.into_iter().map(|n| self.name(n)).collect();
        self.set(set)
    }

    /// The shared set equal to `set` (whose names should come from [`name`](Self::name)).
    pub fn set(&mut self, set: BTreeSet<Arc<str>>) -> Names {
        if let Some(s) = self.0.sets.get(&set) {
            return Names(s.clone());
        }
        let s = Arc::new(set);
        self.0.sets.insert(s.clone());
        self.maybe_prune();
        Names(s)
    }

    fn maybe_prune(&mut self) {
        let t = &mut *self.0;
        if t.names.len() + t.sets.len() <= PRUNE_MIN.max(2 * t.kept) {
            return;
        }
        // Sets first: a set only the table holds still holds its names.
        t.sets.retain(|s| Arc::strong_count(s) > 1);
        t.names.retain(|n| Arc::strong_count(n) > 1);
        t.kept = t.names.len() + t.sets.len();
    }
}
