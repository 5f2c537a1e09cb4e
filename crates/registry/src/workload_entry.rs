//! WorkloadEntries selected by ServiceEntries, as Istio's `workloadEntryHandler` and
//! `getWorkloadServiceEntries`: a ServiceEntry's `workloadSelector` picks the WorkloadEntries of
//! its own namespace whose labels contain every selector label. Kubernetes Pods reach it shaped as
//! WorkloadEntries (Istio's `WorkloadInstance`s of kind Pod) and are selected the same way.

use std::collections::BTreeMap;

use model::networking::{ServiceEntry, WorkloadEntry};
use model::{Config, ConfigSpec};

use crate::conversion::{AddressKind, WorkloadRef};

/// One WorkloadEntry, with its labels merged as Istio's `ConvertWorkloadEntry`.
pub(crate) struct SelectableWorkload<'a> {
    pub workload: WorkloadRef<'a>,
    /// Not an IP (a hostname or a unix socket): only DNS ServiceEntries may select it
    /// (Istio's `DNSServiceEntryOnly`).
    pub dns_only: bool,
}

/// WorkloadEntries by namespace, each namespace's list sorted by name.
#[derive(Default)]
pub(crate) struct WorkloadEntryIndex<'a> {
    by_namespace: BTreeMap<&'a str, Vec<SelectableWorkload<'a>>>,
}

impl<'a> WorkloadEntryIndex<'a> {
    pub(crate) fn new(configs: impl Iterator<Item = &'a Config>) -> Self {
        let mut by_namespace: BTreeMap<&'a str, Vec<(&'a str, SelectableWorkload<'a>)>> = BTreeMap::new();
        for cfg in configs {
            let ConfigSpec::WorkloadEntry(entry) = &cfg.spec else {
                continue;
            };
            let workload = WorkloadRef {
                entry,
                labels: merged_labels(entry, &cfg.meta.labels),
                // `WorkloadEntry/ns/name`, or `Pod/ns/name` for a Kubernetes workload.
                origin: format!("{}/{}/{}", cfg.kind, cfg.meta.namespace, cfg.meta.name),
            };
            let dns_only = AddressKind::of(&entry.address) != AddressKind::Ip;
            by_namespace
                .entry(cfg.meta.namespace.as_str())
                .or_default()
                .push((cfg.meta.name.as_str(), SelectableWorkload { workload, dns_only }));
        }
        let by_namespace = by_namespace
            .into_iter()
            .map(|(ns, mut list)| {
                list.sort_by(|a, b| a.0.cmp(b.0));
                (ns, list.into_iter().map(|(_, w)| w).collect())
            })
            .collect();
        WorkloadEntryIndex { by_namespace }
    }

    /// The WorkloadEntries that `se` in `namespace` selects; none without a `workloadSelector`.
    pub(crate) fn selected_by(
        &self,
        namespace: &str,
        se: &ServiceEntry,
        dns: bool,
    ) -> impl Iterator<Item = &WorkloadRef<'a>> {
        let selector = se.workload_selector.as_ref();
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(move |w| selector.is_some_and(|s| selects(&s.match_labels, &w.workload.labels)))
            .filter(move |w| {
                if w.dns_only && !dns {
                    tracing::debug!(
                        origin = w.workload.origin,
                        "non-IP WorkloadEntry skipped for non-DNS ServiceEntry"
                    );
                    return false;
                }
                true
            })
            .map(|w| &w.workload)
    }
}

/// Spec labels overlaid with metadata labels; metadata wins.
fn merged_labels(entry: &WorkloadEntry, meta_labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = entry.labels.clone();
    out.extend(meta_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// Every selector label is present with the same value (an empty selector selects everything).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selector_is_a_subset_match() {
        let labels = map(&[("app", "vm"), ("version", "v1")]);
        assert!(selects(&map(&[("app", "vm")]), &labels));
        assert!(selects(&map(&[]), &labels));
        assert!(!selects(&map(&[("app", "other")]), &labels));
        assert!(!selects(&map(&[("app", "vm"), ("tier", "db")]), &labels));
    }

    #[test]
    fn metadata_labels_win_over_spec_labels() {
        let entry = WorkloadEntry {
            labels: map(&[("app", "spec"), ("version", "v1")]),
            ..Default::default()
        };
        let merged = merged_labels(&entry, &map(&[("app", "meta")]));
        assert_eq!(merged, map(&[("app", "meta"), ("version", "v1")]));
    }
}
