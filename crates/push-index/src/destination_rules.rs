//! DestinationRules of a push, merged and indexed as Istio's `destinationRuleIndex`: per namespace
//! (every rule a proxy of that namespace may use), exported per namespace, and the root
//! namespace's private rules; looked up by most specific host.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use model::networking::{DestinationRule, Subset};
use model::{Config, ConfigKey, ConfigSpec, MeshConfig};

/// One or more DestinationRules for the same host in one namespace, merged as Istio's
/// `ConsolidatedDestRule`: subsets concatenated (first wins per name), the first top-level
/// traffic policy kept.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedDestinationRule {
    /// The merged rule, with `host` resolved to an FQDN.
    pub rule: DestinationRule,
    /// The rules it was merged from, in merge order.
    pub from: Vec<ConfigKey>,
    /// Namespace of the rules.
    pub namespace: String,
    /// `exportTo` as written (a rule with a workload selector is private: `{"."}`).
    pub export_to: BTreeSet<String>,
}

impl MergedDestinationRule {
    pub fn subset(&self, name: &str) -> Option<&Subset> {
        self.rule.subsets.iter().find(|s| s.name == name)
    }

    fn selector(&self) -> Option<&BTreeMap<String, String>> {
        self.rule.workload_selector.as_ref().map(|s| &s.match_labels)
    }
}

type Rules = Vec<Arc<MergedDestinationRule>>;

/// Rules of one index bucket by host, split as Istio into exact and wildcard hosts.
#[derive(Debug, Default)]
struct Bucket {
    specific: HashMap<String, Rules>,
    wildcard: HashMap<String, Rules>,
}

impl Bucket {
    /// Istio's `MostSpecificHostMatch`: the exact host, else the longest wildcard whose suffix
    /// matches (a wildcard needle also matches broader wildcards).
    fn most_specific(&self, needle: &str) -> Option<&Rules> {
        let (exact, suffix_of) = match needle.strip_prefix('*') {
            Some(rest) => (self.wildcard.get(needle), rest),
            None => (self.specific.get(needle), needle),
        };
        if exact.is_some() {
            return exact;
        }
        self.wildcard
            .iter()
            .filter(|(h, _)| suffix_of.ends_with(&h[1..]))
            .max_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| b.cmp(a)))
            .map(|(_, rules)| rules)
    }
}

/// A bucket while it is being built: rules are still mutable.
#[derive(Default)]
struct BucketBuilder {
    by_host: HashMap<String, Vec<MergedDestinationRule>>,
}

impl BucketBuilder {
    /// Istio's `mergeDestinationRule` (with enhanced merge: rules with different `exportTo` are kept
    /// apart unless the new one exports to a superset).
    fn merge(&mut self, key: &ConfigKey, rule: &DestinationRule, export_to: &BTreeSet<String>) {
        let list = self.by_host.entry(rule.host.clone()).or_default();
        let fresh = || MergedDestinationRule {
            rule: rule.clone(),
            from: vec![key.clone()],
            namespace: key.namespace.clone(),
            export_to: export_to.clone(),
        };
        if list.is_empty() {
            list.push(fresh());
            return;
        }
        let mut append_separately = true;
        let incoming_selector = rule.workload_selector.as_ref().map(|s| &s.match_labels);
        for merged in list.iter_mut() {
            if *export_to == merged.export_to {
                append_separately = false;
            } else if merged.export_to.is_empty() || !export_to.is_superset(&merged.export_to) {
                append_separately = true;
                continue;
            } else {
                append_separately = true;
            }
            let existing_selector = merged.selector();
            let both_without = incoming_selector.is_none() && existing_selector.is_none();
            let both_with = incoming_selector.is_some() && existing_selector.is_some();
            let empty = BTreeMap::new();
            let selectors_match = incoming_selector.unwrap_or(&empty) == existing_selector.unwrap_or(&empty);
            if both_with && !selectors_match {
                append_separately = true;
                continue;
            }
            if both_without || (both_with && selectors_match) {
                append_separately = false;
            }
            merged.from.push(key.clone());
            for subset in &rule.subsets {
                if merged.subset(&subset.name).is_none() {
                    merged.rule.subsets.push(subset.clone());
                } else {
                    tracing::debug!(host = rule.host, subset = subset.name, from = %key, "duplicate subset ignored");
                }
            }
            if merged.rule.traffic_policy.is_none() && rule.traffic_policy.is_some() {
                merged.rule.traffic_policy = rule.traffic_policy.clone();
            }
        }
        if append_separately {
            list.push(fresh());
        }
    }

    fn build(self) -> Bucket {
        let mut out = Bucket::default();
        for (host, rules) in self.by_host {
            let rules: Rules = rules.into_iter().map(Arc::new).collect();
            if model::host::is_wildcard(&host) {
                out.wildcard.insert(host, rules);
            } else {
                out.specific.insert(host, rules);
            }
        }
        out
    }
}

/// Every DestinationRule of a push, indexed as Istio's `destinationRuleIndex`.
#[derive(Debug, Default)]
pub struct DestinationRuleIndex {
    /// Rules a proxy in the namespace may use: public and private rules of that namespace.
    namespace_local: HashMap<String, Bucket>,
    /// Rules exported beyond their namespace, by owning namespace.
    exported_by_namespace: HashMap<String, Bucket>,
    /// Private rules of the root namespace (apply to proxies in the root namespace only).
    root_namespace_local: Bucket,
    root_namespace: String,
}

impl DestinationRuleIndex {
    /// Indexes the DestinationRules among `configs`, oldest first (rules with a workload selector
    /// before those without, then creation order as in `crate::creation_order`).
    pub fn new(configs: &[Arc<Config>], mesh: &MeshConfig, domain: &str) -> DestinationRuleIndex {
        let mut rules: Vec<(&Config, DestinationRule)> = configs
            .iter()
            .filter_map(|c| match &c.spec {
                ConfigSpec::DestinationRule(dr) => {
                    let mut dr = dr.clone();
                    dr.host = model::host::resolve_short_name(&dr.host, &c.meta.namespace, domain);
                    Some((c.as_ref(), dr))
                }
                _ => None,
            })
            .collect();
        rules.sort_by(|(a, ar), (b, br)| {
            br.workload_selector
                .is_some()
                .cmp(&ar.workload_selector.is_some())
                .then_with(|| crate::creation_order(a, b))
        });
        let default_private = mesh.default_destination_rule_export_to.iter().any(|e| e == ".");
        let mut namespace_local: HashMap<String, BucketBuilder> = HashMap::new();
        let mut exported: HashMap<String, BucketBuilder> = HashMap::new();
        let mut root_local = BucketBuilder::default();
        for (cfg, rule) in &rules {
            let ns = cfg.meta.namespace.as_str();
            let key = cfg.key();
            // Rules with a workload selector are never exported to other namespaces.
            let export_to: BTreeSet<String> = if rule.workload_selector.is_some() {
                BTreeSet::from([".".to_owned()])
            } else {
                rule.export_to.iter().cloned().collect()
            };
            if export_to.is_empty() || export_to.contains("*") || export_to.contains(".") || export_to.contains(ns) {
                namespace_local
                    .entry(ns.to_owned())
                    .or_default()
                    .merge(&key, rule, &export_to);
            }
            let private_only = (export_to.is_empty() && default_private)
                || (export_to.len() == 1 && (export_to.contains(".") || export_to.contains(ns)));
            if !private_only {
                exported.entry(ns.to_owned()).or_default().merge(&key, rule, &export_to);
            } else if ns == mesh.root_namespace {
                root_local.merge(&key, rule, &export_to);
            }
        }
        DestinationRuleIndex {
            namespace_local: namespace_local.into_iter().map(|(k, v)| (k, v.build())).collect(),
            exported_by_namespace: exported.into_iter().map(|(k, v)| (k, v.build())).collect(),
            root_namespace_local: root_local.build(),
            root_namespace: mesh.root_namespace.clone(),
        }
    }

    /// The candidate rules for `hostname` (of a service in `service_namespace`) seen from a proxy
    /// in `proxy_namespace`, as Istio's `PushContext.destinationRule`: the proxy's namespace (the
    /// root namespace's private rules for proxies in the root namespace), then rules exported by
    /// the service's namespace, then rules exported by the root namespace.
    fn candidates(&self, proxy_namespace: &str, hostname: &str, service_namespace: &str) -> Option<Rules> {
        if proxy_namespace != self.root_namespace {
            if let Some(rules) = self
                .namespace_local
                .get(proxy_namespace)
                .and_then(|b| b.most_specific(hostname))
            {
                return Some(rules.clone());
            }
        } else if let Some(rules) = self.root_namespace_local.most_specific(hostname) {
            return Some(rules.clone());
        }
        if !service_namespace.is_empty()
            && let Some(rules) = self.exported_from(service_namespace, hostname, proxy_namespace)
        {
            return Some(rules);
        }
        self.exported_from(&self.root_namespace, hostname, proxy_namespace)
    }

    fn exported_from(&self, owner: &str, hostname: &str, client: &str) -> Option<Rules> {
        let rules = self.exported_by_namespace.get(owner)?.most_specific(hostname)?;
        let visible: Rules = rules
            .iter()
            .filter(|r| r.export_to.is_empty() || r.export_to.contains("*") || r.export_to.contains(client))
            .cloned()
            .collect();
        (!visible.is_empty()).then_some(visible)
    }

    /// The rule that applies to outbound traffic from a proxy (namespace and labels) to a service,
    /// as Istio's `SidecarScope.DestinationRule`: a rule of the proxy's namespace whose workload
    /// selector matches the proxy wins, else the rule without selector.
    /// The rule that applies to the proxy's own instances of a service (inbound): as `lookup`,
    /// but rules with a workload selector never apply (Istio honours them for outbound only).
    pub fn lookup_inbound(
        &self,
        proxy_namespace: &str,
        hostname: &str,
        service_namespace: &str,
    ) -> Option<Arc<MergedDestinationRule>> {
        let rules = self.candidates(proxy_namespace, hostname, service_namespace)?;
        rules.iter().rfind(|r| r.selector().is_none()).cloned()
    }

    pub fn lookup(
        &self,
        proxy_namespace: &str,
        proxy_labels: &BTreeMap<String, String>,
        hostname: &str,
        service_namespace: &str,
    ) -> Option<Arc<MergedDestinationRule>> {
        let rules = self.candidates(proxy_namespace, hostname, service_namespace)?;
        let mut catch_all = None;
        for r in &rules {
            match r.selector() {
                None => catch_all = Some(r.clone()),
                Some(sel) => {
                    if r.namespace == proxy_namespace && sel.iter().all(|(k, v)| proxy_labels.get(k) == Some(v)) {
                        return Some(r.clone());
                    }
                }
            }
        }
        catch_all
    }
}
