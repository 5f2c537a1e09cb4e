//! What a connection watches per type URL and the xDS ACK/NACK rules that update it: Istio's
//! `ShouldRespond` (state of the world) and `shouldRespondDelta` (delta), as pure functions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use xds_api::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use xds_api::type_url;

pub(crate) use crate::names::NameInterner;
pub use crate::names::Names;
use crate::request::SotwRequest;

/// A delta resource version, shared with the resource it versions (`Resource::version`), so that
/// a connection's `known` holds a pointer per resource rather than a copy of its version.
pub(crate) type Version = Arc<OnceLock<String>>;

/// The text of a version (empty if never computed, which `connection::generate` prevents).
pub(crate) fn version_str(v: &Version) -> &str {
    v.get().map_or("", String::as_str)
}

/// What a proxy watches of one type, as Istio's `model.WatchedResource`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchedResource {
    pub type_url: String,
    /// Subscribed names, shared with every connection subscribed to the same set. Empty for a
    /// wildcard watch of CDS/LDS.
    pub names: Names,
    /// All resources of the type (CDS, LDS and Istio's own types), not only `names`.
    pub wildcard: bool,
}

impl WatchedResource {
    /// Whether the resource `name` is one this watch asks for.
    pub fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// Wildcard types by the xDS spec (CDS, LDS), Istio's own types, and VHDS as Envoy subscribes to
/// it (see [`type_url::VIRTUAL_HOST`]); EDS, RDS and SDS are not.
pub(crate) fn is_wildcard_type(t: &str) -> bool {
    !matches!(t, type_url::ENDPOINT | type_url::ROUTE | type_url::SECRET)
}

/// Per type state of one connection: the watch and the nonces, for ACK/NACK and `/debug/syncz`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Watch {
    pub resource: WatchedResource,
    pub nonce_sent: String,
    pub version_sent: String,
    pub nonce_acked: String,
    pub nonce_nacked: String,
    /// Envoy's message of the last NACK; cleared by the next ACK.
    pub last_error: String,
    pub last_sent: Option<SystemTime>,
    /// Delta only: what the proxy has, name -> resource version (both shared).
    pub known: BTreeMap<Arc<str>, Version>,
    /// Delta CDS only: clusters a response added or updated whose ClusterLoadAssignment has not
    /// been sent since (see `delta.rs`).
    pub warming: BTreeSet<Arc<str>>,
}

/// What a request means, once applied to the watches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// First request for the type on this stream (or after our restart): respond.
    Init,
    /// ACK of the last response.
    Ack,
    /// Rejected by the proxy: logged and counted, never answered by resending.
    Nack { code: i32, message: String },
    /// Nonce of an older response: ignored.
    ExpiredNonce { sent: String },
    /// Empty names of a non-wildcard type: the watch is dropped.
    Unsubscribe,
    /// Delta subscription change without a nonce.
    Subscription,
}

/// What to send back for a request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Respond {
    No,
    /// Everything the watch covers.
    All,
    /// Only these newly subscribed names (delta).
    Names(BTreeSet<Arc<str>>),
}

/// The most of a NACK's error detail that is kept (in `/debug/syncz`) and logged.
pub(crate) const MAX_NACK_DETAIL: usize = 4096;

/// A NACK's error detail, cut to [`MAX_NACK_DETAIL`] bytes (on a character boundary).
pub(crate) fn nack_detail(message: &str) -> String {
    if message.len() <= MAX_NACK_DETAIL {
        return message.to_owned();
    }
    let mut end = MAX_NACK_DETAIL;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &message[..end], message.len())
}

/// Whether `listed` names exactly the watch's `names`. Every ACK repeats the names, so this is
/// the common case and costs no allocation per name: names sent in the set's (sorted) order are
/// compared as they come; otherwise (Envoy lists them in its own hash set's order) each is
/// looked up in the shared set's index of positions.
fn same_names<'a>(names: &Names, listed: impl Iterator<Item = &'a [u8]> + Clone) -> bool {
    names.iter().map(|n| n.as_bytes()).eq(listed.clone()) || names.equals_unordered(listed)
}

/// Whether `names` holds a name `before` does not. The same shared set (what nearly every ACK
/// resolves to) holds none, without walking 2,000 names of each.
fn added_to(names: &Names, before: &Names) -> bool {
    !names.ptr_eq(before) && names.difference(before).next().is_some()
}

fn new_watch(type_url: &str, names: Names, wildcard: bool) -> Watch {
    Watch {
        resource: WatchedResource {
            type_url: type_url.to_owned(),
            names,
            wildcard,
        },
        ..Default::default()
    }
}

/// State-of-the-world rules, as Istio's `ShouldRespond`: NACKs are recorded and never answered
/// (unless they carry newly added names), stale nonces are ignored, ACKs are answered only when
/// the subscription grew (non-wildcard) or changed (wildcard).
pub(crate) fn sotw_request(
    watched: &mut HashMap<String, Watch>,
    req: &SotwRequest,
    interner: &NameInterner,
) -> (Outcome, Respond) {
    let t = req.type_url.as_str();
    let wildcard_type = is_wildcard_type(t);
    let listed = || req.resource_names().filter(|n| *n != b"*");
    let names = match watched.get(t) {
        Some(w) if same_names(&w.resource.names, listed()) => w.resource.names.clone(),
        _ => interner.lock().names(req.resource_names_str().filter(|n| *n != "*")),
    };
    let wildcard = wildcard_type && (names.is_empty() || req.resource_names().any(|n| n == b"*"));
    if let Some(err) = &req.error_detail {
        let outcome = Outcome::Nack {
            code: err.code,
            message: nack_detail(&err.message),
        };
        let Some(w) = watched.get_mut(t) else {
            return (outcome, Respond::No);
        };
        w.last_error = nack_detail(&err.message);
        w.nonce_nacked = req.response_nonce.clone();
        let added = !wildcard_type && added_to(&names, &w.resource.names);
        w.resource.names = names;
        return (outcome, if added { Respond::All } else { Respond::No });
    }
    if names.is_empty() && !wildcard_type {
        watched.remove(t);
        return (Outcome::Unsubscribe, Respond::No);
    }
    let Some(w) = watched.get_mut(t).filter(|_| !req.response_nonce.is_empty()) else {
        watched.insert(t.to_owned(), new_watch(t, names, wildcard));
        return (Outcome::Init, Respond::All);
    };
    if req.response_nonce != w.nonce_sent {
        return (
            Outcome::ExpiredNonce {
                sent: w.nonce_sent.clone(),
            },
            Respond::No,
        );
    }
    w.nonce_acked = req.response_nonce.clone();
    w.nonce_nacked.clear();
    w.last_error.clear();
    let added = added_to(&names, &w.resource.names);
    let changed =
        added || !names.ptr_eq(&w.resource.names) && names != w.resource.names || wildcard != w.resource.wildcard;
    w.resource.names = names;
    w.resource.wildcard = wildcard;
    let respond = if wildcard_type { changed } else { added };
    (Outcome::Ack, if respond { Respond::All } else { Respond::No })
}

/// Delta rules, as Istio's `shouldRespondDelta`, except that subscription changes are applied
/// whatever the nonce (they are deltas of the client's state and would be lost otherwise).
pub(crate) fn delta_request(
    watched: &mut HashMap<String, Watch>,
    req: &DeltaDiscoveryRequest,
    interner: &NameInterner,
) -> (Outcome, Respond) {
    let t = req.type_url.as_str();
    let wildcard_type = is_wildcard_type(t);
    let Some(w) = watched.get_mut(t) else {
        if let Some(err) = &req.error_detail {
            return (
                Outcome::Nack {
                    code: err.code,
                    message: nack_detail(&err.message),
                },
                Respond::No,
            );
        }
        let mut interning = interner.lock();
        let names = interning.names(
            req.resource_names_subscribe
                .iter()
                .map(String::as_str)
                .filter(|n| *n != "*"),
        );
        let wildcard = (wildcard_type && req.resource_names_subscribe.is_empty())
            || req.resource_names_subscribe.iter().any(|n| n == "*");
        let mut watch = new_watch(t, names, wildcard);
        watch.known = req
            .initial_resource_versions
            .iter()
            .map(|(k, v)| (interning.name(k), Arc::new(OnceLock::from(v.clone()))))
            .collect();
        watched.insert(t.to_owned(), watch);
        return (Outcome::Init, Respond::All);
    };
    let outcome = if let Some(err) = &req.error_detail {
        w.last_error = nack_detail(&err.message);
        w.nonce_nacked = req.response_nonce.clone();
        Outcome::Nack {
            code: err.code,
            message: nack_detail(&err.message),
        }
    } else if req.response_nonce.is_empty() {
        Outcome::Subscription
    } else if req.response_nonce != w.nonce_sent {
        Outcome::ExpiredNonce {
            sent: w.nonce_sent.clone(),
        }
    } else {
        w.nonce_acked = req.response_nonce.clone();
        w.nonce_nacked.clear();
        w.last_error.clear();
        Outcome::Ack
    };
    let mut added = BTreeSet::new();
    let mut wildcard_on = false;
    let mut unsubscribed = BTreeSet::new();
    let mut interning = None;
    for n in &req.resource_names_subscribe {
        if n == "*" {
            wildcard_on |= !w.resource.wildcard;
            w.resource.wildcard = true;
        } else if !w.resource.names.contains(n) {
            added.insert(interning.get_or_insert_with(|| interner.lock()).name(n));
        }
    }
    let mut unsubscribed_wildcard = false;
    for n in &req.resource_names_unsubscribe {
        if n == "*" {
            unsubscribed_wildcard |= w.resource.wildcard;
            w.resource.wildcard = false;
        } else if w.resource.names.contains(n) || added.contains(n.as_str()) {
            added.remove(n.as_str());
            unsubscribed.insert(n.as_str());
        }
    }
    if !added.is_empty() || !unsubscribed.is_empty() {
        let mut set: BTreeSet<Arc<str>> = (*w.resource.names).clone();
        set.extend(added.iter().cloned());
        set.retain(|n| !unsubscribed.contains(&**n));
        w.resource.names = interning.get_or_insert_with(|| interner.lock()).set(set);
    }
    drop(interning);
    // What the proxy no longer watches is no longer known (a wildcard watch keeps everything).
    if !w.resource.wildcard && (unsubscribed_wildcard || !unsubscribed.is_empty()) {
        let resource = &w.resource;
        w.known.retain(|k, _| resource.covers(k));
    }
    let respond = if wildcard_on {
        Respond::All
    } else if !w.resource.wildcard && !added.is_empty() {
        Respond::Names(added)
    } else {
        Respond::No
    };
    (outcome, respond)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
    use xds_api::envoy_types::pb::google::rpc::Status;

    fn names(w: &Watch) -> Vec<&str> {
        w.resource.names.iter().map(|n| &**n).collect()
    }

    fn sotw(t: &str, names: &[&str], nonce: &str) -> SotwRequest {
        (&DiscoveryRequest {
            type_url: t.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
            .into()
    }

    #[test]
    fn sotw_init_ack_nack_and_expired() {
        let mut w = HashMap::new();
        let i = NameInterner::default();
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::CLUSTER, &[], ""), &i),
            (Outcome::Init, Respond::All)
        );
        assert!(w[type_url::CLUSTER].resource.wildcard);
        w.get_mut(type_url::CLUSTER).unwrap().nonce_sent = "n1".into();
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::CLUSTER, &[], "n1"), &i),
            (Outcome::Ack, Respond::No)
        );
        assert_eq!(w[type_url::CLUSTER].nonce_acked, "n1");
        let (o, r) = sotw_request(&mut w, &sotw(type_url::CLUSTER, &[], "n0"), &i);
        assert_eq!((o, r), (Outcome::ExpiredNonce { sent: "n1".into() }, Respond::No));
        let mut nack = sotw(type_url::CLUSTER, &[], "n1");
        nack.error_detail = Some(Status {
            code: 13,
            message: "bad cluster".into(),
            details: vec![],
        });
        let (o, r) = sotw_request(&mut w, &nack, &i);
        assert_eq!(
            (o, r),
            (
                Outcome::Nack {
                    code: 13,
                    message: "bad cluster".into()
                },
                Respond::No
            )
        );
        assert_eq!(w[type_url::CLUSTER].last_error, "bad cluster");
    }

    #[test]
    fn sotw_eds_answers_only_added_names_and_unsubscribes_on_empty() {
        let mut w = HashMap::new();
        let i = NameInterner::default();
        sotw_request(&mut w, &sotw(type_url::ENDPOINT, &["a"], ""), &i);
        w.get_mut(type_url::ENDPOINT).unwrap().nonce_sent = "1".into();
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::ENDPOINT, &["a", "b"], "1"), &i).1,
            Respond::All
        );
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::ENDPOINT, &["b"], "1"), &i).1,
            Respond::No
        );
        assert_eq!(names(&w[type_url::ENDPOINT]), ["b"]);
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::ENDPOINT, &[], "1"), &i).0,
            Outcome::Unsubscribe
        );
        assert!(!w.contains_key(type_url::ENDPOINT));
    }

    #[test]
    fn nack_details_are_kept_to_a_bound() {
        assert_eq!(nack_detail("bad cluster"), "bad cluster");
        let long = "é".repeat(5000);
        let kept = nack_detail(&long);
        assert!(kept.len() < MAX_NACK_DETAIL + 40, "{}", kept.len());
        assert!(
            kept.ends_with("... (10000 bytes in all)"),
            "{}",
            &kept[kept.len() - 30..]
        );
    }

    #[test]
    fn sotw_nonce_after_restart_is_a_new_watch() {
        let mut w = HashMap::new();
        let i = NameInterner::default();
        assert_eq!(
            sotw_request(&mut w, &sotw(type_url::LISTENER, &[], "old"), &i).0,
            Outcome::Init
        );
    }

    #[test]
    fn delta_wildcard_subscribe_unsubscribe() {
        let mut w = HashMap::new();
        let i = NameInterner::default();
        let mut init = DeltaDiscoveryRequest {
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        };
        init.initial_resource_versions.insert("c1".into(), "v1".into());
        assert_eq!(delta_request(&mut w, &init, &i), (Outcome::Init, Respond::All));
        assert!(w[type_url::CLUSTER].resource.wildcard);
        assert_eq!(w[type_url::CLUSTER].known.get("c1").map(version_str), Some("v1"));

        let eds = DeltaDiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names_subscribe: vec!["a".into()],
            ..Default::default()
        };
        assert_eq!(delta_request(&mut w, &eds, &i).1, Respond::All);
        assert!(!w[type_url::ENDPOINT].resource.wildcard);
        let more = DeltaDiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names_subscribe: vec!["a".into(), "b".into()],
            resource_names_unsubscribe: vec!["x".into()],
            ..Default::default()
        };
        let (o, r) = delta_request(&mut w, &more, &i);
        assert_eq!(
            (o, r),
            (Outcome::Subscription, Respond::Names(BTreeSet::from([Arc::from("b")])))
        );
        w.get_mut(type_url::ENDPOINT)
            .unwrap()
            .known
            .insert("a".into(), Arc::new(OnceLock::from("h".to_string())));
        let less = DeltaDiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names_unsubscribe: vec!["a".into()],
            response_nonce: "stale".into(),
            ..Default::default()
        };
        assert!(matches!(
            delta_request(&mut w, &less, &i),
            (Outcome::ExpiredNonce { .. }, Respond::No)
        ));
        assert!(!w[type_url::ENDPOINT].known.contains_key("a"));
        assert_eq!(names(&w[type_url::ENDPOINT]), ["b"]);
    }
}

#[cfg(test)]
mod sharing_tests {
    use super::*;
    use crate::names::PRUNE_MIN;
    use xds_api::envoy::service::discovery::v3::DiscoveryRequest;

    fn eds(names: &[&str], nonce: &str) -> SotwRequest {
        (&DiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
            .into()
    }

    fn names_of(w: &HashMap<String, Watch>) -> &Names {
        &w[type_url::ENDPOINT].resource.names
    }

    #[test]
    fn connections_subscribed_to_the_same_names_share_one_set() {
        let i = NameInterner::default();
        let (mut a, mut b) = (HashMap::new(), HashMap::new());
        sotw_request(&mut a, &eds(&["outbound|80||x", "outbound|80||y"], ""), &i);
        sotw_request(&mut b, &eds(&["outbound|80||y", "outbound|80||x"], ""), &i);
        assert!(names_of(&a).ptr_eq(names_of(&b)));
        assert_eq!(i.len(), (2, 1));
        // an ACK repeating the names keeps the set without interning again
        let before = names_of(&a).clone();
        a.get_mut(type_url::ENDPOINT).unwrap().nonce_sent = "1".into();
        sotw_request(&mut a, &eds(&["outbound|80||y", "outbound|80||x"], "1"), &i);
        assert!(names_of(&a).ptr_eq(&before));
        // ... in order too (compared as they come, without sorting), and with a duplicate
        sotw_request(&mut a, &eds(&["outbound|80||x", "outbound|80||y"], "1"), &i);
        assert!(names_of(&a).ptr_eq(&before));
        sotw_request(
            &mut a,
            &eds(&["outbound|80||x", "outbound|80||x", "outbound|80||y"], "1"),
            &i,
        );
        assert!(names_of(&a).ptr_eq(&before));
        // a name more, in order, is a new set
        let (_, respond) = sotw_request(
            &mut a,
            &eds(&["outbound|80||x", "outbound|80||y", "outbound|80||z"], "1"),
            &i,
        );
        assert!(!names_of(&a).ptr_eq(&before) && names_of(&a).contains("outbound|80||z"));
        assert!(matches!(respond, Respond::All));
        sotw_request(&mut a, &eds(&["outbound|80||y", "outbound|80||x"], "1"), &i);
        // out of order, as many names but one replaced: a new set
        sotw_request(&mut b, &eds(&["outbound|80||z", "outbound|80||x"], ""), &i);
        b.get_mut(type_url::ENDPOINT).unwrap().nonce_sent = "1".into();
        sotw_request(&mut b, &eds(&["outbound|80||y", "outbound|80||x"], "1"), &i);
        assert!(names_of(&b).ptr_eq(names_of(&a)));
        // a different set still shares its names
        sotw_request(&mut b, &eds(&["outbound|80||x"], ""), &i);
        assert!(Arc::ptr_eq(
            names_of(&a).first().unwrap(),
            names_of(&b).first().unwrap()
        ));
    }

    #[test]
    fn delta_subscription_changes_land_on_the_shared_set() {
        let i = NameInterner::default();
        let (mut a, mut b) = (HashMap::new(), HashMap::new());
        let sub = |names: &[&str], unsub: &[&str]| DeltaDiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        delta_request(&mut a, &sub(&["x", "y"], &[]), &i);
        delta_request(&mut b, &sub(&["x"], &[]), &i);
        // subscribe and unsubscribe in one request: only what stays subscribed is answered
        let (_, r) = delta_request(&mut b, &sub(&["y", "z"], &["z"]), &i);
        assert_eq!(r, Respond::Names(BTreeSet::from([Arc::from("y")])));
        assert!(names_of(&a).ptr_eq(names_of(&b)));
        assert_eq!(names_of(&b).iter().map(|n| &**n).collect::<Vec<_>>(), ["x", "y"]);
    }

    #[test]
    fn names_nobody_holds_are_pruned_once_the_table_doubles() {
        let i = NameInterner::default();
        let mut kept = HashMap::new();
        sotw_request(&mut kept, &eds(&["kept"], ""), &i);
        for n in 0..10 * PRUNE_MIN {
            let mut w = HashMap::new();
            sotw_request(&mut w, &eds(&[&format!("gone-{n}")], ""), &i);
        }
        let (names, sets) = i.len();
        assert!(names + sets <= PRUNE_MIN + 2, "{names} names, {sets} sets");
        // what a connection still holds survives every prune, and is still shared
        let mut again = HashMap::new();
        sotw_request(&mut again, &eds(&["kept"], ""), &i);
        assert!(names_of(&kept).ptr_eq(names_of(&again)));
    }
}
