//! `Resource`: one named, encoded xDS resource, as generators make it and the ADS server sends it,
//! and `GenerateError`: why a type could not be generated.

use std::sync::{Arc, OnceLock};

use crate::pbwkt;

/// One named resource, encoded once and shared (`Arc`) across every proxy that gets it.
#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub resource: Arc<pbwkt::Any>,
    /// The delta version of `resource`, computed on first use ([`Resource::version`]). Copies
    /// that share `resource` share this slot with it, so each shared resource is hashed once.
    pub version: Arc<OnceLock<String>>,
}

impl Resource {
    /// Packs `m` into a shared `Any`.
    pub fn new<M: prost::Message + prost::Name>(name: impl Into<String>, m: &M) -> Resource {
        Resource::from_any(name, Arc::new(crate::pack(m)))
    }

    /// A resource already packed.
    pub fn from_any(name: impl Into<String>, resource: Arc<pbwkt::Any>) -> Resource {
        Resource {
            name: name.into(),
            resource,
            version: Arc::default(),
        }
    }

    /// The delta version: a hash of the resource's type URL and bytes.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| version_of(&self.resource))
    }
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.resource == other.resource
    }
}

/// A resource's delta version: a hash of its type URL and bytes.
fn version_of(any: &pbwkt::Any) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    any.type_url.hash(&mut h);
    any.value.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Why nothing was generated for a type. The ADS server sends nothing for that type (the proxy
/// keeps its last config): quietly for a type nobody generates, as Istio answers a type without
/// a generator, with a warning for a failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    #[error("no generator for type {0:?} (pilot-discovery serves CDS, EDS, LDS, RDS, VHDS, SDS and NDS)")]
    UnsupportedType(String),
    #[error("generating {type_url}: {reason}")]
    Failed { type_url: String, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_follows_bytes() {
        let a = pbwkt::Any {
            type_url: "t".into(),
            value: vec![1],
        };
        let b = pbwkt::Any {
            type_url: "t".into(),
            value: vec![2],
        };
        assert_eq!(version_of(&a), version_of(&a.clone()));
        assert_ne!(version_of(&a), version_of(&b));
    }

    #[test]
    fn a_shared_resource_is_versioned_once_with_the_hash_of_its_bytes() {
        let r = Resource::new("a", &pbwkt::Duration { seconds: 1, nanos: 0 });
        let shared = Resource {
            name: "a".into(),
            ..r.clone()
        };
        assert!(shared.version.get().is_none());
        assert_eq!(r.version(), version_of(&r.resource));
        // the copy handed to another proxy finds the version already computed
        assert_eq!(shared.version.get().map(String::as_str), Some(r.version()));
        let other = Resource::new("a", &pbwkt::Duration { seconds: 2, nanos: 0 });
        assert_ne!(other.version(), r.version());
    }
}
