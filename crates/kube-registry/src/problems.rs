//! The registry's objects that are wrong, each named with its defect: objects that do not decode
//! as their kind (Service, EndpointSlice, Pod, Node, Namespace), and what of a decoded object the
//! conversion drops (an address that is not an IP, a Service port without a valid number). Istio
//! logs these in its kube controller (`serviceregistry/kube/controller`); here each is logged
//! once (when it appears or changes, not at every conversion), counted in
//! `pilot_k8s_object_errors`, and listed in `/debug/config_errors` as the config sources list
//! theirs (`model::event::SourceErrorEntry`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use kclient::ObjectErrorLabels;
use model::event::{Level, SourceErrorEntry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Who found a problem: the watch (decoding) or the conversion; each keeps its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Decode,
    Convert,
}

/// One defect: a metric reason and the message.
pub(crate) type Defect = (&'static str, String);

type Key = (&'static str, String, String, Source);

/// See the module doc.
#[derive(Debug, Default)]
pub struct Problems {
    entries: Mutex<BTreeMap<Key, Vec<Defect>>>,
    counter: Family<ObjectErrorLabels, Counter>,
}

impl Problems {
    pub fn new(counter: Family<ObjectErrorLabels, Counter>) -> Problems {
        Problems {
            entries: Mutex::default(),
            counter,
        }
    }

    /// The object's defects found by `source` are now `defects` (none: it is fine); new ones are
    /// logged and counted.
    pub fn set(&self, kind: &'static str, namespace: &str, name: &str, source: Source, defects: Vec<Defect>) {
        let key = (kind, namespace.to_owned(), name.to_owned(), source);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let old = if defects.is_empty() {
            entries.remove(&key).unwrap_or_default()
        } else {
            entries.insert(key, defects.clone()).unwrap_or_default()
        };
        drop(entries);
        for (reason, message) in defects.iter().filter(|d| !old.contains(d)) {
            tracing::warn!(
                resource = %resource(kind, namespace, name),
                "Kubernetes object {}: {message}",
                resource(kind, namespace, name)
            );
            self.counter
                .get_or_create(&ObjectErrorLabels {
                    r#type: kind.to_owned(),
                    reason: (*reason).to_owned(),
                })
                .inc();
        }
    }

    /// After a (re-)list: `source`'s defects of `kind` are exactly `now` (`(namespace, name)`).
    pub fn replace(&self, kind: &'static str, source: Source, now: Vec<(String, String, Vec<Defect>)>) {
        let keep: std::collections::BTreeSet<(String, String)> =
            now.iter().map(|(ns, n, _)| (ns.clone(), n.clone())).collect();
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(k, ns, n, s), _| *k != kind || *s != source || keep.contains(&(ns.clone(), n.clone())));
        for (ns, name, defects) in now {
            self.set(kind, &ns, &name, source, defects);
        }
    }

    /// Every current problem, as `/debug/config_errors` lists them.
    pub fn entries(&self) -> Vec<SourceErrorEntry> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .flat_map(|((kind, ns, name, _), defects)| {
                let r = resource(kind, ns, name);
                defects.iter().map(move |(_, message)| SourceErrorEntry {
                    file: PathBuf::from(format!("kubernetes://{kind}/{ns}/{name}")),
                    resource: Some(r.clone()),
                    reason: format!("{r}: {message}"),
                    level: Level::Error,
                })
            })
            .collect()
    }
}

/// `Kind namespace/name`, as config errors name resources.
fn resource(kind: &str, namespace: &str, name: &str) -> String {
    let name = if name.is_empty() { "(no readable name)" } else { name };
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_counted_once_and_listed_until_it_is_gone() {
        let p = Problems::default();
        let bad = || vec![("invalid_ip", "address \"x\" is not an IP".to_owned())];
        p.set("EndpointSlice", "ns", "s", Source::Convert, bad());
        p.set("EndpointSlice", "ns", "s", Source::Convert, bad());
        p.set(
            "Service",
            "ns",
            "svc",
            Source::Decode,
            vec![("undecodable", "spec: bad".into())],
        );
        let count = |kind: &str, reason: &str| {
            p.counter
                .get_or_create(&ObjectErrorLabels {
                    r#type: kind.into(),
                    reason: reason.into(),
                })
                .get()
        };
        assert_eq!(count("EndpointSlice", "invalid_ip"), 1);
        let listed: Vec<String> = p.entries().into_iter().map(|e| e.reason).collect();
        assert_eq!(
            listed,
            [
                "EndpointSlice ns/s: address \"x\" is not an IP",
                "Service ns/svc: spec: bad"
            ]
        );
        // A re-list without the Service's problem clears it; the slice's stays (another source).
        p.replace("Service", Source::Decode, Vec::new());
        p.set("EndpointSlice", "ns", "s", Source::Convert, Vec::new());
        assert!(p.entries().is_empty());
        assert_eq!(count("Service", "undecodable"), 1);
    }
}
