//! Locality load balancing, as Istio's `loadbalancer` package: which setting applies (zone-aware
//! or locality; DestinationRule, else mesh), and how it shapes a `ClusterLoadAssignment` for one
//! proxy: `distribute` weights, or failover priorities (region/zone/subzone proximity, `failover`
//! region pairs, `failoverPriority` labels). Locality failover needs outlier detection, else
//! Envoy would never leave priority 0, so it is applied only when the cluster has it; zone-aware
//! settings always put the proxy's region first and leave the zones to Envoy.

use std::collections::{BTreeMap, HashSet};

use model::networking::{
    LoadBalancerSettings, LocalityDistribute, LocalityFailover, LocalityLbSetting, ZoneAwareLbSetting,
};
use model::service::TrafficDistribution;
use model::{Endpoint, Locality, MeshConfig, Service};
use xds_api::envoy::config::cluster::v3::cluster;
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use xds_api::pbwkt;

/// Label naming an endpoint's network (Istio's `topology.istio.io/network`).
const NETWORK_LABEL: &str = "topology.istio.io/network";
const TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
const TOPOLOGY_SUBZONE: &str = "topology.istio.io/subzone";
/// Istio's `LabelHostname`: the node an endpoint runs on.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Every label a traffic distribution compares (`PreferSameNode`'s, a superset of the zone's).
pub(crate) const TRAFFIC_DISTRIBUTION_LABELS: [&str; 5] = [
    NETWORK_LABEL,
    TOPOLOGY_REGION,
    TOPOLOGY_ZONE,
    TOPOLOGY_SUBZONE,
    HOSTNAME_LABEL,
];

/// The locality load-balancing semantics in effect for one cluster (Istio's `LBSettings`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LbSettings {
    /// `force`: failover whether or not the cluster has outlier detection (a service's traffic
    /// distribution relies on endpoint health instead).
    Locality {
        setting: LocalityLbSetting,
        force: bool,
    },
    ZoneAware(ZoneAwareLbSetting),
}

/// Istio's `GetEffectiveLbSetting`: the DestinationRule's zone-aware setting, else its locality
/// setting, else the service's traffic distribution, else the mesh's zone-aware setting, else the
/// mesh's locality setting; a locality setting with `enabled: false` turns locality load balancing
/// off (a zone-aware one with `enabled: false` still wins, to switch Envoy's zone-aware routing
/// off). An absent mesh setting is Istio's default mesh config, `{enabled: true}`.
pub(crate) fn effective_setting(
    mesh: &MeshConfig,
    lb: Option<&LoadBalancerSettings>,
    service: &Service,
) -> Option<LbSettings> {
    if let Some(z) = lb.and_then(|lb| lb.zone_aware_lb_setting.as_ref()) {
        return Some(LbSettings::ZoneAware(z.clone()));
    }
    let locality = |setting: LocalityLbSetting| {
        (setting.enabled != Some(false)).then_some(LbSettings::Locality { setting, force: false })
    };
    if let Some(dr) = lb.and_then(|lb| lb.locality_lb_setting.as_ref()) {
        return locality(dr.clone());
    }
    let labels = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
    match service.attributes.traffic_distribution {
        TrafficDistribution::Any => {}
        TrafficDistribution::PreferSameZone => {
            return Some(LbSettings::Locality {
                setting: LocalityLbSetting {
                    enabled: Some(true),
                    failover_priority: labels(&[NETWORK_LABEL, TOPOLOGY_REGION, TOPOLOGY_ZONE]),
                    ..Default::default()
                },
                force: true,
            });
        }
        TrafficDistribution::PreferSameNode => {
            return Some(LbSettings::Locality {
                setting: LocalityLbSetting {
                    enabled: Some(true),
                    failover_priority: labels(&[
                        NETWORK_LABEL,
                        TOPOLOGY_REGION,
                        TOPOLOGY_ZONE,
                        TOPOLOGY_SUBZONE,
                        HOSTNAME_LABEL,
                    ]),
                    ..Default::default()
                },
                force: true,
            });
        }
    }
    if let Some(z) = &mesh.zone_aware_lb_setting {
        return Some(LbSettings::ZoneAware(z.clone()));
    }
    locality(mesh.locality_lb_setting.clone().unwrap_or(LocalityLbSetting {
        enabled: Some(true),
        ..Default::default()
    }))
}

impl LbSettings {
    /// `failoverPriority` labels in use (they make the EDS answer depend on the proxy's labels).
    pub(crate) fn failover_priority(&self) -> &[String] {
        match self {
            LbSettings::Locality { setting, .. } => &setting.failover_priority,
            LbSettings::ZoneAware(z) if z.routing_enabled() => &z.failover_priority,
            LbSettings::ZoneAware(_) => &[],
        }
    }

    /// Istio's `ApplyToCluster` for the cluster itself: `common_lb_config`'s locality config.
    pub(crate) fn apply_to_cluster(&self, common: &mut cluster::CommonLbConfig, enable_failover: bool) {
        use cluster::common_lb_config::{LocalityConfigSpecifier, ZoneAwareLbConfig};
        match self {
            LbSettings::Locality { setting, force } => {
                let enable_failover = enable_failover || *force;
                if (enable_failover && (!setting.failover.is_empty() || !setting.failover_priority.is_empty()))
                    || !setting.distribute.is_empty()
                {
                    common.locality_config_specifier =
                        Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(Default::default()));
                }
            }
            LbSettings::ZoneAware(z) => {
                common.locality_config_specifier =
                    Some(LocalityConfigSpecifier::ZoneAwareLbConfig(ZoneAwareLbConfig {
                        // `enabled: false`: 0% keeps Envoy's own zone-aware routing off.
                        routing_enabled: (!z.routing_enabled())
                            .then_some(xds_api::envoy::r#type::v3::Percent { value: 0.0 }),
                        min_cluster_size: z.min_cluster_size.map(|v| pbwkt::UInt64Value { value: u64::from(v) }),
                        ..Default::default()
                    }));
            }
        }
    }

    /// Istio's `ApplyToLoadAssignment`. `endpoints[i]` are the registry endpoints behind
    /// `cla.endpoints[i]`, in the same order (for `failoverPriority` label matching).
    pub(crate) fn apply(
        &self,
        cla: &mut ClusterLoadAssignment,
        endpoints: &[Vec<&Endpoint>],
        proxy_locality: &Locality,
        proxy_labels: &BTreeMap<String, String>,
        enable_failover: bool,
    ) {
        match self {
            LbSettings::Locality { setting, force } => {
                apply(
                    cla,
                    endpoints,
                    proxy_locality,
                    proxy_labels,
                    setting,
                    enable_failover || *force,
                );
            }
            LbSettings::ZoneAware(z) if z.routing_enabled() => {
                if !z.failover_priority.is_empty() {
                    apply_failover_priorities(cla, endpoints, proxy_labels, &z.failover_priority);
                }
                apply_zone_aware_regional_failover(proxy_locality, cla, &z.failover);
            }
            // Routing off: no regional partitioning, so EDS priorities stay as they are.
            LbSettings::ZoneAware(_) => {}
        }
    }
}

/// Istio's `applyZoneAwareRegionalFailover`: the proxy's region at the first priority (Envoy
/// balances its zones), the region its `failover` entry names next, the others last; composed
/// with any earlier (failoverPriority) priority and compacted to 0..N.
fn apply_zone_aware_regional_failover(
    proxy: &Locality,
    cla: &mut ClusterLoadAssignment,
    failover: &[LocalityFailover],
) {
    let to = failover.iter().find(|f| f.from == proxy.region).map(|f| f.to.as_str());
    let priorities: Vec<u32> = cla
        .endpoints
        .iter()
        .map(|group| {
            let region = locality_of(group).0;
            let p = if region == proxy.region {
                0
            } else if Some(region) == to {
                1
            } else {
                2
            };
            group.priority * 3 + p
        })
        .collect();
    for (group, p) in cla.endpoints.iter_mut().zip(compact(&priorities)) {
        group.priority = p;
    }
}

/// Istio's `ApplyLocalityLoadBalancer`. `endpoints[i]` are the registry endpoints behind
/// `cla.endpoints[i]`, in the same order (for `failoverPriority` label matching).
fn apply(
    cla: &mut ClusterLoadAssignment,
    endpoints: &[Vec<&Endpoint>],
    proxy_locality: &Locality,
    proxy_labels: &BTreeMap<String, String>,
    setting: &LocalityLbSetting,
    enable_failover: bool,
) {
    if !setting.distribute.is_empty() {
        apply_locality_weights(proxy_locality, cla, &setting.distribute);
    } else if enable_failover {
        if !setting.failover_priority.is_empty() {
            apply_failover_priorities(cla, endpoints, proxy_labels, &setting.failover_priority);
            if !setting.failover.is_empty() {
                apply_locality_failover(proxy_locality, cla, &setting.failover);
            }
        } else {
            apply_locality_failover(proxy_locality, cla, &setting.failover);
        }
    }
}

fn locality_of(l: &LocalityLbEndpoints) -> (&str, &str, &str) {
    l.locality.as_ref().map_or(("", "", ""), |l| {
        (l.region.as_str(), l.zone.as_str(), l.sub_zone.as_str())
    })
}

/// Istio's `LocalityMatch`: `region[/zone[/subzone]]` with `*` wildcards; missing parts match all.
fn locality_match(l: (&str, &str, &str), rule: &str) -> bool {
    let mut parts = rule.splitn(3, '/');
    let (region, zone, subzone) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    (region == "*" || l.0 == region)
        && (zone == "*" || zone.is_empty() || l.1 == zone)
        && (subzone == "*" || subzone.is_empty() || l.2 == subzone)
}

fn proxy_tuple(l: &Locality) -> (&str, &str, &str) {
    (l.region.as_str(), l.zone.as_str(), l.subzone.as_str())
}

/// `distribute`: for the first rule whose `from` matches the proxy, spread each `to` weight over
/// the matching localities in proportion to their own weight; localities matching no `to` get
/// no endpoints.
fn apply_locality_weights(proxy: &Locality, cla: &mut ClusterLoadAssignment, distribute: &[LocalityDistribute]) {
    let Some(rule) = distribute.iter().find(|d| locality_match(proxy_tuple(proxy), &d.from)) else {
        return;
    };
    let mut unmatched: HashSet<usize> = (0..cla.endpoints.len()).collect();
    for (to, weight) in &rule.to {
        let mut matched: Vec<(usize, u32)> = Vec::new();
        for (i, group) in cla.endpoints.iter().enumerate() {
            if unmatched.contains(&i) && locality_match(locality_of(group), to) {
                matched.push((i, group.load_balancing_weight.as_ref().map_or(1, |w| w.value)));
            }
        }
        let total: u64 = matched.iter().map(|(_, w)| u64::from(*w)).sum();
        for (i, original) in matched {
            unmatched.remove(&i);
            if total == 0 {
                continue;
            }
            let share = (u64::from(original) * u64::from(*weight)).div_ceil(total);
            if share > 0 {
                cla.endpoints[i].load_balancing_weight = Some(pbwkt::UInt32Value {
                    value: u32::try_from(share).unwrap_or(u32::MAX),
                });
            }
        }
    }
    for i in unmatched {
        cla.endpoints[i].lb_endpoints.clear();
    }
}

/// Istio's `LbPriority`: 0 same subzone, 1 same zone, 2 same region, 3 elsewhere.
fn lb_priority(proxy: (&str, &str, &str), ep: (&str, &str, &str)) -> u32 {
    match (proxy.0 == ep.0, proxy.1 == ep.1, proxy.2 == ep.2) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        (false, _, _) => 3,
    }
}

/// Proximity priorities, composed with any earlier (failoverPriority) priority, then compacted
/// to 0..N. With a `failover` entry for the proxy's region, other regions than its `to` drop to
/// the lowest priority.
fn apply_locality_failover(proxy: &Locality, cla: &mut ClusterLoadAssignment, failover: &[LocalityFailover]) {
    let mut priorities = Vec::with_capacity(cla.endpoints.len());
    for group in &cla.endpoints {
        let ep = locality_of(group);
        let mut priority = lb_priority(proxy_tuple(proxy), ep);
        if priority == 3
            && let Some(f) = failover.iter().find(|f| f.from == proxy.region)
            && ep.0 != f.to
        {
            priority = 4;
        }
        priorities.push(group.priority * 5 + priority);
    }
    for (group, p) in cla.endpoints.iter_mut().zip(compact(&priorities)) {
        group.priority = p;
    }
}

/// Maps priorities to 0..N in order, without gaps.
fn compact(priorities: &[u32]) -> Vec<u32> {
    let mut distinct: Vec<u32> = priorities.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    priorities
        .iter()
        .map(|p| u32::try_from(distinct.partition_point(|d| d < p)).unwrap_or(u32::MAX))
        .collect()
}

/// Istio's `applyFailoverPriorities`: each locality group is split by how many of the
/// `failoverPriority` labels (in order) an endpoint shares with the proxy; `label=value` entries
/// compare against the given value instead of the proxy's. A network mismatch (first label
/// `topology.istio.io/network`) only demotes below every same-network endpoint.
fn apply_failover_priorities(
    cla: &mut ClusterLoadAssignment,
    endpoints: &[Vec<&Endpoint>],
    proxy_labels: &BTreeMap<String, String>,
    failover_priority: &[String],
) {
    if proxy_labels.is_empty() || endpoints.is_empty() {
        return;
    }
    let lowest = u32::try_from(failover_priority.len()).unwrap_or(u32::MAX);
    let includes_network = failover_priority.first().is_some_and(|l| l == NETWORK_LABEL);
    let labels: Vec<(&str, Option<&str>)> = failover_priority
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (l.as_str(), None),
        })
        .collect();
    let mut out: Vec<LocalityLbEndpoints> = Vec::new();
    for (group, istio) in cla.endpoints.iter().zip(endpoints) {
        let mut by_priority: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, ep) in istio.iter().enumerate() {
            let mut priority = 0;
            let mut adjust = 0;
            for (j, (label, value)) in labels.iter().enumerate() {
                let want = value
                    .or_else(|| proxy_labels.get(*label).map(String::as_str))
                    .unwrap_or("");
                if ep.labels.get(*label).map_or("", String::as_str) != want {
                    if j == 0 && includes_network {
                        adjust = lowest;
                        continue;
                    }
                    priority = lowest - u32::try_from(j).unwrap_or(0);
                    break;
                }
            }
            by_priority.entry(priority + adjust).or_default().push(i);
        }
        for (priority, indexes) in by_priority {
            let lb_endpoints: Vec<_> = indexes
                .iter()
                .filter_map(|i| group.lb_endpoints.get(*i).cloned())
                .collect();
            let weight = lb_endpoints.iter().fold(0u32, |acc, e| {
                acc.saturating_add(e.load_balancing_weight.as_ref().map_or(0, |w| w.value))
            });
            out.push(LocalityLbEndpoints {
                locality: group.locality.clone(),
                lb_endpoints,
                load_balancing_weight: Some(pbwkt::UInt32Value { value: weight }),
                priority,
                ..Default::default()
            });
        }
    }
    let priorities: Vec<u32> = out.iter().map(|g| g.priority).collect();
    for (group, p) in out.iter_mut().zip(compact(&priorities)) {
        group.priority = p;
    }
    cla.endpoints = out;
}

/// The Envoy locality of a registry locality.
pub(crate) fn envoy_locality(l: &Locality) -> core::Locality {
    core::Locality {
        region: l.region.clone(),
        zone: l.zone.clone(),
        sub_zone: l.subzone.clone(),
    }
}
