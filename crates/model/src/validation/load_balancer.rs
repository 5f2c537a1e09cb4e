//! A DestinationRule's load balancer settings, as Istio's `validateLoadBalancer` and
//! `ValidateLocalityLbSetting`: simple vs consistent hash, hash keys, ring hash vs Maglev, warmup,
//! locality distribute/failover. Also the `tunnel` and `proxyProtocol` traffic policy fields.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::common::{Errors, check_duration, check_enum, validate_port};
use super::hosts::{is_ip, validate_fqdn};
use crate::networking::{ConsistentHashLb, LoadBalancerSettings, LocalityLbSetting, ZoneAwareLbSetting};

/// Maglev table sizes must be primes below this (Envoy's limit).
const MAGLEV_MAX_TABLE_SIZE: u64 = 5_000_011;

/// Topology labels that may not appear in `failoverPriority` together with `failover`.
const TOPOLOGY_LABELS: [&str; 3] = [
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
];

/// Failover without outlier detection is only a warning in Istio, so it is not checked here.
pub(crate) fn check_load_balancer(errs: &mut Errors, path: &str, lb: Option<&LoadBalancerSettings>) {
    let Some(lb) = lb else { return };
    check_enum(
        errs,
        &format!("{path}.simple"),
        lb.simple.as_ref(),
        &[
            "UNSPECIFIED",
            "LEAST_CONN",
            "RANDOM",
            "PASSTHROUGH",
            "ROUND_ROBIN",
            "LEAST_REQUEST",
        ],
    );
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        errs.add(path, "only one of simple or consistentHash may be set");
    }
    if let Some(ch) = &lb.consistent_hash {
        check_consistent_hash(errs, &format!("{path}.consistentHash"), ch);
    }
    if let Some(l) = &lb.locality_lb_setting {
        check_locality_lb(errs, &format!("{path}.localityLbSetting"), l);
    }
    if lb.locality_lb_setting.is_some() && lb.zone_aware_lb_setting.is_some() {
        errs.add(path, "only one of localityLbSetting and zoneAwareLbSetting can be set");
    }
    if let Some(z) = &lb.zone_aware_lb_setting {
        check_zone_aware_lb(errs, &format!("{path}.zoneAwareLbSetting"), z);
    }
    check_duration(
        errs,
        &format!("{path}.warmupDurationSecs"),
        lb.warmup_duration_secs.as_ref(),
    );
    if let Some(w) = &lb.warmup {
        let wpath = format!("{path}.warmup");
        match &w.duration {
            None => errs.add(&format!("{wpath}.duration"), "duration is required"),
            Some(d) => check_duration(errs, &format!("{wpath}.duration"), Some(d)),
        }
        if let Some(p) = w.minimum_percent
            && !(0.0..=100.0).contains(&p)
        {
            errs.add(
                &format!("{wpath}.minimumPercent"),
                format!("minimumPercent {p} must be between 0 and 100"),
            );
        }
        if let Some(a) = w.aggression
            && a <= 0.0
        {
            errs.add(
                &format!("{wpath}.aggression"),
                format!("aggression {a} should be greater than 0"),
            );
        }
    }
}

fn check_consistent_hash(errs: &mut Errors, path: &str, ch: &ConsistentHashLb) {
    let keys = [
        ch.http_header_name.is_some(),
        ch.http_cookie.is_some(),
        ch.use_source_ip.is_some(),
        ch.http_query_parameter_name.is_some(),
    ];
    if keys.iter().filter(|k| **k).count() > 1 {
        errs.add(
            path,
            "only one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName may be set",
        );
    }
    if ch.ring_hash.is_some() && ch.maglev.is_some() {
        errs.add(path, "only one of ringHash or maglev may be set");
    }
    if let Some(cookie) = &ch.http_cookie {
        if cookie.name.is_empty() {
            errs.add(&format!("{path}.httpCookie.name"), "name required for HttpCookie");
        }
        let mut names = BTreeSet::new();
        for (i, attr) in cookie.attributes.iter().enumerate() {
            let apath = format!("{path}.httpCookie.attributes[{i}]");
            match attr.get("name").and_then(Value::as_str) {
                None | Some("") => errs.add(&apath, "cookie attribute name cannot be empty"),
                Some(n) if !names.insert(n) => errs.add(&apath, format!("duplicate cookie attribute name: {n}")),
                Some(_) => {}
            }
        }
    }
    if ch.minimum_ring_size.unwrap_or(0) != 0 && (ch.ring_hash.is_some() || ch.maglev.is_some()) {
        errs.add(path, "only one of MinimumRingSize or Maglev/Ringhash can be specified");
    }
    if let Some(m) = &ch.maglev {
        let mpath = format!("{path}.maglev.tableSize");
        if m.table_size == 0 {
            errs.add(&mpath, "tableSize must be set for maglev");
        }
        if m.table_size >= MAGLEV_MAX_TABLE_SIZE {
            errs.add(
                &mpath,
                format!("tableSize must be less than {MAGLEV_MAX_TABLE_SIZE} for maglev"),
            );
        }
        if !is_prime(m.table_size) {
            errs.add(&mpath, "tableSize must be a prime number for maglev");
        }
    }
}

/// Envoy's primality test (0 is not prime, 1 to 3 are).
fn is_prime(x: u64) -> bool {
    if x != 0 && x < 4 {
        return true;
    }
    if x & 1 == 0 {
        return false;
    }
    let mut f = 3;
    while f * f <= x {
        if x.is_multiple_of(f) {
            return false;
        }
        f += 2;
    }
    true
}

pub(crate) fn check_locality_lb(errs: &mut Errors, path: &str, lb: &LocalityLbSetting) {
    if !lb.distribute.is_empty() && !lb.failover.is_empty() {
        errs.add(path, "can not simultaneously specify 'distribute' and 'failover'");
        return;
    }
    if !lb.failover.is_empty()
        && let Some(l) = lb
            .failover_priority
            .iter()
            .find(|l| TOPOLOGY_LABELS.contains(&l.as_str()))
    {
        errs.add(
            path,
            format!("can not simultaneously set 'failover' and topology label '{l}' in 'failover_priority'"),
        );
        return;
    }
    for (i, d) in lb.distribute.iter().enumerate() {
        let dpath = format!("{path}.distribute[{i}]");
        if d.to.values().any(|w| *w == 0 || *w > 100) {
            errs.add(&format!("{dpath}.to"), "locality weight must be in range [1, 100]");
            return;
        }
        let total: u32 = d.to.values().sum();
        if total != 100 {
            errs.add(&format!("{dpath}.to"), format!("total locality weight {total} != 100"));
            return;
        }
        if let Err(e) = validate_localities(d.to.keys().map(String::as_str)) {
            errs.add(&format!("{dpath}.to"), e);
        }
    }
    if let Err(e) = validate_localities(lb.distribute.iter().map(|d| d.from.as_str())) {
        errs.add(&format!("{path}.distribute"), e);
    }
    for (i, f) in lb.failover.iter().enumerate() {
        let fpath = format!("{path}.failover[{i}]");
        if f.from == f.to {
            errs.add(&fpath, "locality lb failover settings must specify different regions");
        }
        if f.from.contains('/') || f.to.contains('/') {
            errs.add(&fpath, "locality lb failover only specify region");
        }
        if f.from.contains('*') || f.to.contains('*') {
            errs.add(&fpath, "locality lb failover region should not contain '*' wildcard");
        }
    }
}

/// Istio's `ValidateZoneAwareLbSetting`: Envoy handles zones and subzones within the region, so
/// `failoverPriority` may not name the topology labels and `failover` names regions only.
pub(crate) fn check_zone_aware_lb(errs: &mut Errors, path: &str, lb: &ZoneAwareLbSetting) {
    for l in lb
        .failover_priority
        .iter()
        .filter(|l| TOPOLOGY_LABELS.contains(&l.as_str()))
    {
        errs.add(
            &format!("{path}.failoverPriority"),
            format!(
                "'failover_priority' for zone aware lb must not use topology label '{l}'; region- and zone-level routing are handled automatically"
            ),
        );
    }
    if lb.min_cluster_size == Some(0) {
        errs.add(&format!("{path}.minClusterSize"), "minClusterSize must be at least 1");
    }
    for (i, f) in lb.failover.iter().enumerate() {
        let fpath = format!("{path}.failover[{i}]");
        if f.from == f.to {
            errs.add(&fpath, "zone aware lb failover settings must specify different regions");
        }
        if f.from.contains('/') || f.to.contains('/') {
            errs.add(
                &fpath,
                "zone aware lb failover only specifies region; zone and subzone failover are handled automatically",
            );
        }
        if f.from.contains('*') || f.to.contains('*') {
            errs.add(&fpath, "zone aware lb failover region should not contain '*' wildcard");
        }
    }
}

/// `validateLocalities`: `region[/zone[/subzone]]` with at most one trailing `*`, none overlapping.
fn validate_localities<'a>(localities: impl Iterator<Item = &'a str>) -> Result<(), String> {
    // region -> zone -> subzones; "*" marks "everything below"
    let mut seen: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for locality in localities {
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            return Err(format!(
                "locality {locality} wildcard '*' number can not exceed 1 and must be in the end"
            ));
        }
        let overlap = || format!("locality {locality} overlap with previous specified ones");
        if seen.contains_key("*") {
            return Err(overlap());
        }
        let items: Vec<&str> = locality.splitn(3, '/').collect();
        if items.iter().any(|i| i.is_empty()) {
            return Err(format!(
                "locality {locality} must not contain empty region/zone/subzone info"
            ));
        }
        match items.as_slice() {
            [region] => {
                if seen.contains_key(region) {
                    return Err(overlap());
                }
                seen.insert(region, BTreeMap::from([("*", BTreeSet::from(["*"]))]));
            }
            [region, zone] => {
                let zones = seen.entry(region).or_default();
                if zones.contains_key("*") || zones.contains_key(zone) {
                    return Err(overlap());
                }
                zones.insert(zone, BTreeSet::from(["*"]));
            }
            [region, zone, subzone] => {
                let zones = seen.entry(region).or_default();
                if zones.contains_key("*") {
                    return Err(overlap());
                }
                let subzones = zones.entry(zone).or_default();
                if subzones.contains("*") || !subzones.insert(subzone) {
                    return Err(overlap());
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `validateTunnelSettings` and `validateProxyProtocol` on their JSON form.
pub(crate) fn check_tunnel_and_proxy_protocol(
    errs: &mut Errors,
    path: &str,
    tunnel: Option<&Value>,
    proxy_protocol: Option<&Value>,
) {
    if let Some(t) = tunnel {
        let tpath = format!("{path}.tunnel");
        let protocol = t.get("protocol").and_then(Value::as_str).unwrap_or("");
        if !matches!(protocol, "" | "CONNECT" | "POST") {
            errs.add(
                &format!("{tpath}.protocol"),
                "tunnel protocol must be \"CONNECT\" or \"POST\"",
            );
        }
        let host = t.get("targetHost").and_then(Value::as_str).unwrap_or("");
        if let Err(e) = validate_fqdn(host)
            && !is_ip(host)
        {
            errs.add(
                &format!("{tpath}.targetHost"),
                format!("tunnel target host must be valid FQDN or IP address: {e}"),
            );
        }
        let port = t.get("targetPort").and_then(Value::as_i64).unwrap_or(0);
        if let Err(e) = validate_port(port) {
            errs.add(
                &format!("{tpath}.targetPort"),
                format!("tunnel target port is invalid: {e}"),
            );
        }
    }
    if let Some(p) = proxy_protocol {
        let version = p.get("version").and_then(Value::as_str).map(str::to_owned);
        check_enum(
            errs,
            &format!("{path}.proxyProtocol.version"),
            version.as_ref(),
            &["V1", "V2"],
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::validation::errors_of;

    fn lb(l: Value) -> Vec<String> {
        errors_of(
            "DestinationRule",
            json!({"host": "reviews", "trafficPolicy": {"loadBalancer": l}}),
        )
    }

    #[test]
    fn zone_aware_as_istios_validate_zone_aware_lb_setting() {
        assert!(lb(json!({"zoneAwareLbSetting": {"enabled": true, "minClusterSize": 3, "failover": [{"from": "us-east", "to": "us-west"}], "failoverPriority": ["topology.istio.io/network"]}})).is_empty());
        assert!(
            lb(json!({"zoneAwareLbSetting": {}, "localityLbSetting": {}}))[0]
                .contains("only one of localityLbSetting and zoneAwareLbSetting")
        );
        let e = lb(json!({"zoneAwareLbSetting": {"failoverPriority": ["topology.kubernetes.io/zone"]}}));
        assert!(
            e[0].contains("must not use topology label 'topology.kubernetes.io/zone'"),
            "{e:?}"
        );
        let e = lb(
            json!({"zoneAwareLbSetting": {"failover": [{"from": "a", "to": "a"}, {"from": "a/b", "to": "c"}, {"from": "*", "to": "c"}]}}),
        );
        assert!(e[0].contains("must specify different regions"), "{e:?}");
        assert!(e[1].contains("only specifies region"), "{e:?}");
        assert!(e[2].contains("'*' wildcard"), "{e:?}");
        assert!(lb(json!({"zoneAwareLbSetting": {"minClusterSize": 0}}))[0].contains("at least 1"));
    }

    #[test]
    fn simple_and_consistent_hash() {
        assert!(lb(json!({"simple": "LEAST_REQUEST"})).is_empty());
        assert!(
            lb(json!({"simple": "FASTEST"}))[0].starts_with("spec.trafficPolicy.loadBalancer.simple: unknown value")
        );
        assert!(
            lb(json!({"simple": "RANDOM", "consistentHash": {"useSourceIp": true}}))[0]
                .contains("only one of simple or consistentHash")
        );
        assert!(lb(json!({"consistentHash": {"httpCookie": {"name": "user", "ttl": "0s"}, "ringHash": {"minimumRingSize": 1024}}})).is_empty());
        assert!(
            lb(json!({"consistentHash": {"httpHeaderName": "x", "useSourceIp": true}}))[0]
                .contains("only one of httpHeaderName")
        );
        assert!(
            lb(json!({"consistentHash": {"useSourceIp": true, "ringHash": {}, "maglev": {"tableSize": 65537}}}))[0]
                .contains("ringHash or maglev")
        );
        assert_eq!(
            lb(json!({"consistentHash": {"httpCookie": {"name": ""}}})),
            ["spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.name: name required for HttpCookie"]
        );
        let attrs = lb(
            json!({"consistentHash": {"httpCookie": {"name": "c", "attributes": [{"name": "SameSite"}, {"name": "SameSite"}, {"value": "x"}]}}}),
        );
        assert!(
            attrs[0].contains("duplicate cookie attribute name") && attrs[1].contains("cannot be empty"),
            "{attrs:?}"
        );
        assert!(lb(json!({"consistentHash": {"useSourceIp": true, "minimumRingSize": 10, "ringHash": {"minimumRingSize": 10}}}))[0].contains("MinimumRingSize"));
    }

    #[test]
    fn maglev_table_size() {
        assert!(lb(json!({"consistentHash": {"useSourceIp": true, "maglev": {"tableSize": 65537}}})).is_empty());
        assert!(
            lb(json!({"consistentHash": {"useSourceIp": true, "maglev": {"tableSize": 65536}}}))[0].contains("prime")
        );
        assert!(lb(json!({"consistentHash": {"useSourceIp": true, "maglev": {}}}))[0].contains("must be set"));
        assert!(
            lb(json!({"consistentHash": {"useSourceIp": true, "maglev": {"tableSize": 5000011}}}))[0]
                .contains("less than")
        );
        assert!(is_prime(2) && is_prime(3) && is_prime(65537) && !is_prime(0) && !is_prime(9) && !is_prime(4));
    }

    #[test]
    fn warmup() {
        assert!(lb(json!({"warmup": {"duration": "300s", "minimumPercent": 5.0, "aggression": 2.0}})).is_empty());
        assert!(lb(json!({"warmupDurationSecs": "60s"})).is_empty());
        assert_eq!(
            lb(json!({"warmup": {"minimumPercent": 5.0}})),
            ["spec.trafficPolicy.loadBalancer.warmup.duration: duration is required"]
        );
        assert!(lb(json!({"warmup": {"duration": "1s", "minimumPercent": 150.0}}))[0].contains("minimumPercent"));
        assert!(lb(json!({"warmup": {"duration": "1s", "minimumPercent": -1.0}}))[0].contains("minimumPercent"));
        assert!(lb(json!({"warmup": {"duration": "1s", "aggression": 0.0}}))[0].contains("aggression"));
        assert!(
            lb(json!({"warmupDurationSecs": "0s"}))[0]
                .starts_with("spec.trafficPolicy.loadBalancer.warmupDurationSecs")
        );
    }

    #[test]
    fn locality_lb() {
        let loc = |l: Value| lb(json!({"localityLbSetting": l}));
        assert!(loc(json!({"distribute": [{"from": "us-west/zone1/*", "to": {"us-west/zone1/*": 80, "us-west/zone2/*": 20}}]})).is_empty());
        assert!(
            loc(json!({"failover": [{"from": "us-east", "to": "eu-west"}], "failoverPriority": ["network"]}))
                .is_empty()
        );
        assert!(
            loc(json!({"distribute": [{"from": "a", "to": {"b": 100}}], "failover": [{"from": "a", "to": "b"}]}))[0]
                .contains("simultaneously")
        );
        assert!(
            loc(json!({"distribute": [{"from": "a", "to": {"b": 60, "c": 30}}]}))[0]
                .contains("total locality weight 90 != 100")
        );
        assert!(loc(json!({"distribute": [{"from": "a", "to": {"b": 0, "c": 100}}]}))[0].contains("[1, 100]"));
        assert!(loc(json!({"distribute": [{"from": "a/*/c", "to": {"b": 100}}]}))[0].contains("wildcard"));
        assert!(
            loc(json!({"distribute": [{"from": "a", "to": {"b": 100}}, {"from": "a/z", "to": {"b": 100}}]}))[0]
                .contains("overlap")
        );
        assert!(loc(json!({"failover": [{"from": "a", "to": "a"}]}))[0].contains("different regions"));
        assert!(loc(json!({"failover": [{"from": "a/z", "to": "b"}]}))[0].contains("only specify region"));
        assert!(
            loc(json!({"failover": [{"from": "a", "to": "b"}], "failoverPriority": ["topology.kubernetes.io/zone"]}))
                [0]
            .contains("topology label")
        );
        assert!(validate_localities(["a/b/c", "a/b/d", "e"].into_iter()).is_ok());
        assert!(validate_localities(["a//c"].into_iter()).unwrap_err().contains("empty"));
        assert!(
            validate_localities(["*", "a"].into_iter())
                .unwrap_err()
                .contains("overlap")
        );
    }
}
