//! Delta ADS (`DeltaAggregatedResources`), as Istio's `StreamDeltas` and `pushDeltaXds`: per
//! type the server tracks what the proxy has (name -> version, a hash of the resource bytes), and
//! each response carries only what changed plus `removed_resources`.
//!
//! One exception to "only what changed": Envoy replaces a cluster that CDS adds or updates by a
//! new one that stays warming until it gets its ClusterLoadAssignment, and asks nothing for a name
//! its EDS subscription already has. So the assignment of every cluster a CDS response carried is
//! sent again, changed or not, by the next EDS response (Istio: "it is always the server's
//! responsibility to send EDS after CDS", `pushConnection`'s full EDS pushes and
//! `forceEDSPush`); the CDS watch keeps those clusters in `warming` until then.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use xds_api::{Resource, type_url};

use super::flavour::{Cause, Flavour};
use super::generate::Generated;
use crate::connection::Connection;
use crate::lock::lock;
use crate::response::{Response, Shared};
use crate::snapshot::PushSnapshot;
use crate::watched::{NameInterner, Outcome, Respond, Version, Watch, WatchedResource, delta_request, version_str};

pub(crate) struct Delta;

impl Flavour for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = Response<DeltaDiscoveryResponse>;
    const DELTA: bool = true;
    const LOG: &'static str = "delta ";

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn type_url(req: &DeltaDiscoveryRequest) -> &str {
        &req.type_url
    }

    fn on_request(
        watched: &mut HashMap<String, Watch>,
        req: &DeltaDiscoveryRequest,
        names: &NameInterner,
    ) -> (Outcome, Option<WatchedResource>) {
        let (outcome, respond) = delta_request(watched, req, names);
        let target = watched.get(&req.type_url).and_then(|w| match respond {
            Respond::No => None,
            Respond::All => Some(w.resource.clone()),
            Respond::Names(names) => Some(WatchedResource {
                names: names.into_iter().collect(),
                wildcard: false,
                ..w.resource.clone()
            }),
        });
        (outcome, target)
    }

    fn response(
        conn: &Connection<impl PushSnapshot>,
        names: &NameInterner,
        g: &Generated,
        resources: &[Resource],
        version: &str,
        cause: Cause,
    ) -> Option<(Response<DeltaDiscoveryResponse>, usize, String)> {
        let t = g.watched.type_url.as_str();
        let (changed, removed) = {
            let mut watched = lock(&conn.watched);
            if !watched.contains_key(t) {
                return None;
            }
            // EDS: the clusters whose assignments are owed (what stays owed is put back below)
            let mut warming = match t {
                type_url::ENDPOINT => watched
                    .get_mut(type_url::CLUSTER)
                    .map(|cds| std::mem::take(&mut cds.warming))
                    .unwrap_or_default(),
                _ => BTreeSet::new(),
            };
            let w = watched.get_mut(t)?;
            let current: Vec<(&str, &Version)> = resources.iter().map(|r| r.name.as_str()).zip(&g.versions).collect();
            let answering = cause == Cause::Request;
            let (changed, removed) = diff(&mut w.known, &current, &g.watched, answering, names, &warming);
            match t {
                type_url::CLUSTER => w.warming.extend(
                    changed
                        .iter()
                        .filter_map(|(n, _)| w.known.get_key_value(*n))
                        .map(|(k, _)| k.clone()),
                ),
                type_url::ENDPOINT if !warming.is_empty() => {
                    // This response answered for the names it covers; a name the proxy stopped
                    // subscribing to is asked for anew (and answered) if it comes back.
                    warming.retain(|n| !g.watched.covers(n) && w.resource.covers(n));
                    if let Some(cds) = watched.get_mut(type_url::CLUSTER) {
                        cds.warming.extend(warming);
                    }
                }
                _ => {}
            }
            (changed, removed)
        };
        if cause == Cause::Push && changed.is_empty() && removed.is_empty() {
            return None;
        }
        let by_name: BTreeMap<&str, _> = resources.iter().map(|r| (r.name.as_str(), r)).collect();
        let shared: Vec<Shared> = changed
            .iter()
            .filter_map(|&(name, v)| {
                by_name.get(name).map(|r| Shared::Delta {
                    name: name.to_owned(),
                    version: version_str(v).to_owned(),
                    any: r.resource.clone(),
                })
            })
            .collect();
        let n = shared.len();
        let log = format!(" removed:{removed:?}");
        let resp = Response {
            message: DeltaDiscoveryResponse {
                system_version_info: version.to_owned(),
                type_url: t.to_owned(),
                removed_resources: removed,
                ..Default::default()
            },
            resources: shared,
        };
        Some((resp, n, log))
    }

    fn set_nonce(resp: &mut Response<DeltaDiscoveryResponse>, nonce: String) {
        resp.message.nonce = nonce;
    }
}

/// Compares what the proxy has (`known`) with `current` (name, version) for the `scope` that was
/// generated; updates `known` as if the response were applied. Returns the resources to send (the
/// changed ones, and those named in `resend` whatever their version) and the names to remove.
/// Names of a non-wildcard scope that do not exist are reported removed when answering a request
/// (so the proxy stops waiting for them), and when the proxy had them. `known` keeps shared names
/// (the scope's, else interned) and the resources' own version slots.
fn diff<'a>(
    known: &mut BTreeMap<Arc<str>, Version>,
    current: &[(&'a str, &'a Version)],
    scope: &WatchedResource,
    answering: bool,
    interner: &NameInterner,
    resend: &BTreeSet<Arc<str>>,
) -> (Vec<(&'a str, &'a Version)>, Vec<String>) {
    let mut changed = Vec::new();
    let present: BTreeSet<&str> = current.iter().map(|(n, _)| *n).collect();
    let mut interning = None;
    // A first response fills `known` in one bulk build: full B-tree nodes, where inserting in
    // order leaves them about half empty.
    let mut new_entries = Vec::new();
    for &(name, version) in current {
        match known.get_mut(name) {
            Some(k) => {
                let same = Arc::ptr_eq(k, version) || version_str(k) == version_str(version);
                // Same version, newer slot: hold the current one so older pushes' slots can go.
                if !Arc::ptr_eq(k, version) {
                    *k = version.clone();
                }
                if !same || resend.contains(name) {
                    changed.push((name, version));
                }
            }
            None => {
                let n = match scope.names.get(name) {
                    Some(n) => n.clone(),
                    None => interning.get_or_insert_with(|| interner.lock()).name(name),
                };
                new_entries.push((n, version.clone()));
                changed.push((name, version));
            }
        }
    }
    if known.is_empty() {
        *known = new_entries.into_iter().collect();
    } else {
        known.extend(new_entries);
    }
    let mut removed: Vec<String> = if scope.wildcard {
        known
            .keys()
            .filter(|n| !present.contains(&***n))
            .map(|n| n.to_string())
            .collect()
    } else {
        scope
            .names
            .iter()
            .filter(|n| !present.contains(&***n) && (answering || known.contains_key(&***n)))
            .map(|n| n.to_string())
            .collect()
    };
    for n in &removed {
        known.remove(n.as_str());
    }
    removed.sort();
    (changed, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use xds_api::type_url;

    fn scope(names: &[&str], wildcard: bool) -> WatchedResource {
        WatchedResource {
            type_url: type_url::CLUSTER.into(),
            names: names.iter().copied().collect(),
            wildcard,
        }
    }

    fn v(s: &str) -> Version {
        Arc::new(OnceLock::from(s.to_owned()))
    }

    fn none() -> BTreeSet<Arc<str>> {
        BTreeSet::new()
    }

    fn known(entries: &[(&str, &str)]) -> BTreeMap<Arc<str>, Version> {
        entries.iter().map(|(n, x)| (Arc::from(*n), v(x))).collect()
    }

    fn text(changed: &[(&str, &Version)]) -> Vec<(String, String)> {
        changed
            .iter()
            .map(|(n, v)| (n.to_string(), version_str(v).to_owned()))
            .collect()
    }

    #[test]
    fn wildcard_diff_sends_changes_and_removals() {
        let i = NameInterner::default();
        let mut known = known(&[("a", "1"), ("b", "1")]);
        let (a1, c1) = (v("1"), v("1"));
        let (changed, removed) = diff(
            &mut known,
            &[("a", &a1), ("c", &c1)],
            &scope(&[], true),
            false,
            &i,
            &none(),
        );
        assert_eq!(text(&changed), [("c".to_string(), "1".to_string())]);
        assert_eq!(removed, vec!["b".to_string()]);
        assert_eq!(known.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["a", "c"]);
        // the same version in a newer slot: nothing sent, the newer slot is held
        assert!(Arc::ptr_eq(&known["a"], &a1));
        // a name outside the scope's names is interned
        assert_eq!(i.len().0, 1);
        let a2 = v("2");
        let (changed, removed) = diff(
            &mut known,
            &[("a", &a2), ("c", &c1)],
            &scope(&[], true),
            false,
            &i,
            &none(),
        );
        assert_eq!(text(&changed), [("a".to_string(), "2".to_string())]);
        assert!(removed.is_empty());
    }

    #[test]
    fn named_diff_reports_missing_names_only_when_answering_or_known() {
        let i = NameInterner::default();
        let mut known = known(&[("x", "1")]);
        let s = scope(&["x", "y"], false);
        let (changed, removed) = diff(&mut known, &[], &s, false, &i, &none());
        assert!(changed.is_empty());
        assert_eq!(removed, vec!["x".to_string()]);
        let (_, removed) = diff(&mut known, &[], &s, true, &i, &none());
        assert_eq!(removed, vec!["x".to_string(), "y".to_string()]);
    }

    #[test]
    fn known_names_of_a_named_scope_are_the_scope_s_own() {
        let i = NameInterner::default();
        let mut known = BTreeMap::new();
        let s = scope(&["y"], false);
        let y = v("1");
        diff(&mut known, &[("y", &y)], &s, true, &i, &none());
        let (k, ver) = known.first_key_value().unwrap();
        assert!(Arc::ptr_eq(k, s.names.first().unwrap()));
        assert!(Arc::ptr_eq(ver, &y));
        assert_eq!(i.len(), (0, 0));
    }

    /// A name to resend goes out although the proxy has its version; the others only if changed.
    #[test]
    fn names_to_resend_are_sent_unchanged() {
        let i = NameInterner::default();
        let mut known = known(&[("a", "1"), ("b", "1")]);
        let (a1, b1) = (v("1"), v("1"));
        let resend = BTreeSet::from([Arc::from("a"), Arc::from("gone")]);
        let s = scope(&["a", "b"], false);
        let (changed, removed) = diff(&mut known, &[("a", &a1), ("b", &b1)], &s, false, &i, &resend);
        assert_eq!(text(&changed), [("a".to_string(), "1".to_string())]);
        assert!(removed.is_empty());
        let (changed, _) = diff(&mut known, &[("a", &a1), ("b", &b1)], &s, false, &i, &none());
        assert!(changed.is_empty());
    }
}
