//! The TLS and HTTP inspectors a listener needs, derived from its filter chains as Istio's
//! `populateListenerFilters`: a port whose chains match on `transport_protocol: tls` needs the TLS
//! inspector, one whose chains match on HTTP ALPNs (`http/1.1`, `h2c`) the HTTP inspector; the
//! inspectors are disabled (`filter_disabled`, by destination port) where no chain needs them, so
//! that a server-first or short-message protocol on a port declared TCP is forwarded at once
//! instead of waiting for bytes an inspector wants. Chains without a port stand for port 0 (all
//! other ports).

use std::collections::BTreeMap;

use xds_api::envoy::config::listener::v3::{
    FilterChain, ListenerFilter, ListenerFilterChainMatchPredicate, listener_filter_chain_match_predicate as predicate,
};
use xds_api::envoy::r#type::v3::Int32Range;

use super::sidecar::{http_inspector, tls_inspector};

const TLS_TRANSPORT_PROTOCOL: &str = "tls";

#[derive(Debug, Default, Clone, Copy)]
struct Needs {
    tls: bool,
    http: bool,
}

/// The inspectors `chains` need, TLS first (the HTTP inspector does not look at TLS connections).
pub(crate) fn inspectors(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    let mut ports: BTreeMap<i32, Needs> = BTreeMap::new();
    for fc in chains {
        let m = fc.filter_chain_match.as_ref();
        let port = m
            .and_then(|m| m.destination_port.as_ref())
            .map_or(0, |p| i32::try_from(p.value).unwrap_or(0));
        let needs = ports.entry(port).or_default();
        needs.tls |= m.is_some_and(|m| m.transport_protocol == TLS_TRANSPORT_PROTOCOL);
        needs.http |= m.is_some_and(|m| m.application_protocols.iter().any(|p| p == "http/1.1" || p == "h2c"));
    }
    let mut out = Vec::new();
    if ports.values().any(|n| n.tls) {
        let mut f = tls_inspector();
        let default_enabled = ports.get(&0).is_some_and(|n| n.tls);
        if default_enabled {
            let off: Vec<i32> = ports
                .iter()
                .filter(|(p, n)| **p != 0 && !n.tls)
                .map(|(p, _)| *p)
                .collect();
            f.filter_disabled = exclude_ports(&off);
        } else {
            let on: Vec<i32> = ports
                .iter()
                .filter(|(p, n)| **p != 0 && n.tls)
                .map(|(p, _)| *p)
                .collect();
            f.filter_disabled = include_ports(&on);
        }
        out.push(f);
    }
    if ports.values().any(|n| n.http) {
        let mut f = http_inspector();
        let off: Vec<i32> = ports.iter().filter(|(_, n)| !n.http).map(|(p, _)| *p).collect();
        f.filter_disabled = exclude_ports(&off);
        out.push(f);
    }
    out
}

/// Istio's `listenerPredicateExcludePorts`: matches these destination ports (so the filter is
/// disabled there); `None` for no ports.
fn exclude_ports(ports: &[i32]) -> Option<ListenerFilterChainMatchPredicate> {
    let mut rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .iter()
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(predicate::Rule::DestinationPortRange(Int32Range {
                start: *p,
                end: p + 1,
            })),
        })
        .collect();
    match rules.len() {
        0 => None,
        1 => rules.pop(),
        _ => Some(ListenerFilterChainMatchPredicate {
            rule: Some(predicate::Rule::OrMatch(predicate::MatchSet { rules })),
        }),
    }
}

/// Istio's `listenerPredicateIncludePorts`: matches every port but these.
fn include_ports(ports: &[i32]) -> Option<ListenerFilterChainMatchPredicate> {
    let rule = exclude_ports(ports)?;
    Some(ListenerFilterChainMatchPredicate {
        rule: Some(predicate::Rule::NotMatch(Box::new(rule))),
    })
}
