//! Subscribed resource names shared across connections: `Names` (one set, shared by every
//! connection that subscribes to exactly those names) and the server's `NameInterner`, which
//! keeps each name and each set once and prunes what no connection holds any more.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};

use crate::lock::lock;

/// A set of subscribed resource names, shared: the server interns equal sets (and each name), so
/// the sidecars of a namespace, which subscribe to the same names, hold one set between them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names(Arc<NameSet>);

/// The names, and an index of them by host built the first time an endpoint push asks.
#[derive(Default)]
struct NameSet {
    names: BTreeSet<Arc<str>>,
    by_host: OnceLock<HashMap<Box<str>, Vec<Arc<str>>>>,
    /// Each name's place in `names`, built the first time an ACK lists them in another order.
    position: OnceLock<HashMap<ByBytes, u32, foldhash::fast::RandomState>>,
}

/// A name found by its bytes: an ACK's names are spans of the request, already checked for UTF-8
/// when it was read, so the lookup need not check them again.
struct ByBytes(Arc<str>);

impl std::hash::Hash for ByBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.as_bytes().hash(state);
    }
}

impl PartialEq for ByBytes {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for ByBytes {}

impl Borrow<[u8]> for ByBytes {
    fn borrow(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The names only: the index is derived from them.
impl std::fmt::Debug for NameSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.names.fmt(f)
    }
}

impl PartialEq for NameSet {
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names
    }
}

impl Eq for NameSet {}

impl Names {
    fn new(names: BTreeSet<Arc<str>>) -> Names {
        Names(Arc::new(NameSet {
            names,
            by_host: OnceLock::new(),
            position: OnceLock::new(),
        }))
    }

    /// Whether `name` is subscribed.
    pub fn contains(&self, name: &str) -> bool {
        self.0.names.contains(name)
    }

    /// Whether both are the same shared set (not only equal).
    pub fn ptr_eq(&self, other: &Names) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether `listed` (in any order, duplicates allowed) names exactly this set: a lookup per
    /// name in an index built once per shared set, for the ACKs of Envoy, which lists its names
    /// in its own hash set's order. Names are compared as bytes.
    pub fn equals_unordered<'a>(&self, listed: impl Iterator<Item = &'a [u8]>) -> bool {
        let position = self.0.position.get_or_init(|| {
            self.0
                .names
                .iter()
                .zip(0u32..)
                .map(|(n, i)| (ByBytes(n.clone()), i))
                .collect()
        });
        let mut seen = vec![0u64; self.0.names.len().div_ceil(64)];
        let mut distinct = 0;
        for n in listed {
            let Some(&i) = position.get(n) else {
                return false;
            };
            let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
            if let Some(w) = seen.get_mut(word).filter(|w| **w & bit == 0) {
                *w |= bit;
                distinct += 1;
            }
        }
        distinct == self.0.names.len()
    }

    /// The subscribed cluster names of `host` (the last `|`-separated part of a name, as in
    /// `outbound|<port>|<subset>|<host>`). The index is built once per shared set, so an
    /// endpoint push looks up the few hosts it changed instead of splitting every name of every
    /// sidecar (2,000 names for each of 2,000 unscoped sidecars).
    pub fn of_host(&self, host: &str) -> &[Arc<str>] {
        let by_host = self.0.by_host.get_or_init(|| {
            let mut by_host: HashMap<Box<str>, Vec<Arc<str>>> = HashMap::new();
            for n in &self.0.names {
                let h = n.rsplit('|').next().unwrap_or_default();
                by_host.entry(h.into()).or_default().push(n.clone());
            }
            by_host
        });
        by_host.get(host).map_or(&[], Vec::as_slice)
    }
}

impl Deref for Names {
    type Target = BTreeSet<Arc<str>>;
    fn deref(&self) -> &Self::Target {
        &self.0.names
    }
}

/// A set of its own, not interned (for views outside the server, e.g. `/debug/config_dump`).
impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        Names::new(iter.into_iter().map(Arc::from).collect())
    }
}

impl<'a> FromIterator<&'a str> for Names {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        Names::new(iter.into_iter().map(Arc::from).collect())
    }
}

impl FromIterator<Arc<str>> for Names {
    fn from_iter<I: IntoIterator<Item = Arc<str>>>(iter: I) -> Self {
        Names::new(iter.into_iter().collect())
    }
}

/// An interned set in the table, found by its names.
#[derive(Debug)]
struct Interned(Arc<NameSet>);

impl std::hash::Hash for Interned {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.names.hash(state);
    }
}

impl PartialEq for Interned {
    fn eq(&self, other: &Self) -> bool {
        self.0.names == other.0.names
    }
}

impl Eq for Interned {}

impl Borrow<BTreeSet<Arc<str>>> for Interned {
    fn borrow(&self) -> &BTreeSet<Arc<str>> {
        &self.0.names
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
    sets: HashSet<Interned>,
    /// Entries (names + sets) left by the last prune.
    kept: usize,
}

/// Tables smaller than this are never pruned.
pub(crate) const PRUNE_MIN: usize = 1024;

impl NameInterner {
    /// Locks the table for a batch of lookups (one lock per request, not per name).
    pub(crate) fn lock(&self) -> Interning<'_> {
        Interning(lock(&self.table))
    }

    /// Live entries (names, sets), for tests and debugging.
    #[cfg(test)]
    pub(crate) fn len(&self) -> (usize, usize) {
        let t = lock(&self.table);
        (t.names.len(), t.sets.len())
    }
}

/// The interner's table, locked. Taken after a connection's `watched` lock, never before.
pub(crate) struct Interning<'a>(std::sync::MutexGuard<'a, Table>);

impl Interning<'_> {
    /// The shared copy of `name`.
    pub(crate) fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.0.names.insert(n.clone());
        self.maybe_prune();
        n
    }

    /// The shared set of these names.
    pub(crate) fn names<'n>(&mut self, names: impl IntoIterator<Item = &'n str>) -> Names {
        let set: BTreeSet<Arc<str>> = names.into_iter().map(|n| self.name(n)).collect();
        self.set(set)
    }

    /// The shared set equal to `set` (whose names should come from [`name`](Self::name)).
    pub(crate) fn set(&mut self, set: BTreeSet<Arc<str>>) -> Names {
        if let Some(s) = self.0.sets.get(&set) {
            return Names(s.0.clone());
        }
        let s = Names::new(set);
        self.0.sets.insert(Interned(s.0.clone()));
        self.maybe_prune();
        s
    }

    fn maybe_prune(&mut self) {
        let t = &mut *self.0;
        if t.names.len() + t.sets.len() <= PRUNE_MIN.max(2 * t.kept) {
            return;
        }
        // Sets first: a set only the table holds still holds its names.
        t.sets.retain(|s| Arc::strong_count(&s.0) > 1);
        t.names.retain(|n| Arc::strong_count(n) > 1);
        t.kept = t.names.len() + t.sets.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unordered_listing_equals_the_set_only_with_every_name_and_no_other() {
        let interner = NameInterner::default();
        let set = interner.lock().names(["a", "b", "c"]);
        let equals = |listed: &[&str]| set.equals_unordered(listed.iter().map(|n| n.as_bytes()));
        assert!(equals(&["c", "a", "b"]));
        assert!(equals(&["b", "b", "c", "a"]));
        assert!(!equals(&["c", "a"]));
        assert!(!equals(&["c", "a", "a"]));
        assert!(!equals(&["c", "a", "b", "d"]));
        assert!(!set.equals_unordered([&b"a"[..], b"b", b"c", &[0xff]].into_iter()));
        let empty = interner.lock().names([]);
        assert!(empty.equals_unordered(std::iter::empty()));
        assert!(!empty.equals_unordered([&b"a"[..]].into_iter()));
    }
}
