//! Per-push caches owned by generators: one value per Rust type, created on first use and dropped
//! with the push, so what generators cache (encoded EDS, CDS per proxy class) is never stale.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A type map of caches, one per type, valid for one push.
#[derive(Default)]
pub struct PushCaches {
    slots: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl PushCaches {
    /// The cache of type `T` for this push, created with `T::default()` on first use.
    pub fn get<T: Any + Default + Send + Sync>(&self) -> Arc<T> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        match slot.clone().downcast::<T>() {
            Ok(t) => t,
            // The slot is keyed by T's TypeId, so the downcast cannot fail; rebuild if it ever did.
            Err(_) => {
                let t = Arc::new(T::default());
                *slot = t.clone();
                t
            }
        }
    }
}

impl std::fmt::Debug for PushCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.slots.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("PushCaches").field("caches", &n).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counter(std::sync::atomic::AtomicUsize);

    #[test]
    fn one_instance_per_type() {
        let caches = PushCaches::default();
        caches
            .get::<Counter>()
            .0
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(caches.get::<Counter>().0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(caches.get::<Mutex<Vec<u8>>>().lock().unwrap().is_empty());
    }
}
