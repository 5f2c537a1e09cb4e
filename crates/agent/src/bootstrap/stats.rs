//! Envoy's stats settings and runtime, as Istio's bootstrap: the stats tags Istio extracts, the
//! inclusion list (the stats the agent's readiness and drain need, plus ProxyConfig
//! `proxyStatsMatcher` or the pod's `sidecar.istio.io/statsInclusion*` annotations), histogram
//! buckets, flush and eviction intervals, the statsd sink, and the runtime flags.

use std::time::Duration;

use model::mesh::ProxyConfig;
use serde_json::{Map, Value, json};

use crate::config::AgentConfig;

/// Stats the agent itself reads (readiness, drain); always included.
const REQUIRED_PREFIXES: &str = "cluster_manager,listener_manager,server,cluster.xds-grpc,wasm";
const RBAC_SUFFIXES: &str = "rbac.allowed,rbac.denied,shadow_allowed,shadow_denied";
/// Needed to drain on zero active connections.
const DRAIN_SUFFIX: &str = "downstream_cx_active";
const REQUIRED_REGEX: &str = r"vhost\..*\.route\..*";

const EXTRA_STAT_TAGS_ANNOTATION: &str = "sidecar.istio.io/extraStatTags";
const PREFIXES_ANNOTATION: &str = "sidecar.istio.io/statsInclusionPrefixes";
const SUFFIXES_ANNOTATION: &str = "sidecar.istio.io/statsInclusionSuffixes";
const REGEXPS_ANNOTATION: &str = "sidecar.istio.io/statsInclusionRegexps";
const HISTOGRAM_BUCKETS_ANNOTATION: &str = "sidecar.istio.io/statsHistogramBuckets";
const FLUSH_INTERVAL_ANNOTATION: &str = "sidecar.istio.io/statsFlushInterval";
const EVICTION_INTERVAL_ANNOTATION: &str = "sidecar.istio.io/statsEvictionInterval";

/// Envoy's default stats flush interval, as Istio assumes it.
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// Istio's stats tags, in its order; extra tags go after `mongo_prefix`.
const STATS_TAGS_HEAD: [(&str, &str); 9] = [
    ("cluster_name", r"^cluster(\.(.+);)"),
    (
        "http_conn_manager_prefix",
        r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
    ),
    ("thread_name", r"^server(\.(.+))\.watchdog"),
    ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
    ("response_code", r"_rq(_(\d{3}))$"),
    ("response_code_class", r"_rq(_(\dxx))$"),
    (
        "http_conn_manager_listener_prefix",
        r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    ),
    (
        "listener_address",
        r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    ),
    (
        "mongo_prefix",
        r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
    ),
];
const STATS_TAGS_TAIL: [(&str, &str); 7] = [
    ("cache", r"(cache\.(.+?)\.)"),
    ("component", r"(component\.(.+?)\.)"),
    ("tag", r"(tag\.(.+?);\.)"),
    ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
    ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
    ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
    ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
];

fn split(list: &str) -> impl Iterator<Item = String> + '_ {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn matcher_list(pc: &ProxyConfig, field: &str) -> Vec<String> {
    pc.proxy_stats_matcher
        .as_ref()
        .and_then(|m| m.get(field))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Istio's `parseOption`: the annotation if set, else ProxyConfig's matcher, then the required
/// entries; `{pod_ip}` expands to each instance IP.
fn inclusion(cfg: &AgentConfig, annotation: &str, matcher_field: &str, required: &str) -> Vec<String> {
    let mut list: Vec<String> = match cfg.annotations.get(annotation).filter(|a| !a.is_empty()) {
        Some(a) => split(a).collect(),
        None => matcher_list(&cfg.proxy_config, matcher_field),
    };
    list.extend(split(required));
    let ips: Vec<String> = cfg.instance_ips.iter().map(ToString::to_string).collect();
    list.into_iter()
        .flat_map(|p| {
            if p.contains("{pod_ip}") {
                ips.iter().map(|ip| p.replace("{pod_ip}", ip)).collect()
            } else {
                vec![p]
            }
        })
        .collect()
}

/// The extra stat tags: ProxyConfig `extraStatTags`, then the annotation's, without repeats.
pub(super) fn extra_stat_tags(cfg: &AgentConfig) -> Vec<String> {
    let annotated = cfg.annotations.get(EXTRA_STAT_TAGS_ANNOTATION).map(String::as_str);
    let mut tags: Vec<String> = Vec::new();
    for tag in cfg
        .proxy_config
        .extra_stat_tags
        .iter()
        .cloned()
        .chain(split(annotated.unwrap_or_default()))
    {
        if !tag.is_empty() && !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    tags
}

/// The inclusion prefixes, suffixes and regexes, in Istio's order.
pub(super) fn inclusion_lists(cfg: &AgentConfig) -> (Vec<String>, Vec<String>, Vec<String>) {
    let suffixes = if cfg.drain.exit_on_zero_active_connections {
        format!("{RBAC_SUFFIXES},{DRAIN_SUFFIX}")
    } else {
        RBAC_SUFFIXES.to_owned()
    };
    (
        inclusion(cfg, PREFIXES_ANNOTATION, "inclusionPrefixes", REQUIRED_PREFIXES),
        inclusion(cfg, SUFFIXES_ANNOTATION, "inclusionSuffixes", &suffixes),
        inclusion(cfg, REGEXPS_ANNOTATION, "inclusionRegexps", REQUIRED_REGEX),
    )
}

/// `histogram_bucket_settings` from the annotation (a JSON map of prefix to buckets), by prefix.
pub(super) fn histogram_buckets(cfg: &AgentConfig) -> Option<Value> {
    let text = cfg.annotations.get(HISTOGRAM_BUCKETS_ANNOTATION)?;
    let buckets: std::collections::BTreeMap<String, Vec<f64>> = serde_json::from_str(text).ok()?;
    let settings: Vec<Value> = buckets
        .into_iter()
        .map(|(prefix, buckets)| json!({"match": {"prefix": prefix}, "buckets": buckets}))
        .collect();
    (!settings.is_empty()).then_some(Value::Array(settings))
}

pub(super) fn stats_config(cfg: &AgentConfig) -> Value {
    let tag = |(name, regex): (&str, &str)| json!({"tag_name": name, "regex": regex});
    let mut tags: Vec<Value> = STATS_TAGS_HEAD.into_iter().map(tag).collect();
    for extra in extra_stat_tags(cfg) {
        tags.push(json!({"regex": format!(r"({extra}=\.=(.*?);\.;)"), "tag_name": extra}));
    }
    tags.extend(STATS_TAGS_TAIL.into_iter().map(tag));

    let (prefixes, suffixes, regexps) = inclusion_lists(cfg);
    let mut patterns = vec![json!({"prefix": "reporter="})];
    patterns.extend(prefixes.into_iter().map(|p| json!({"prefix": p})));
    patterns.extend(suffixes.into_iter().map(|s| json!({"suffix": s})));
    patterns.extend(regexps.into_iter().map(|r| json!({"safe_regex": {"regex": r}})));
    patterns.push(json!({"prefix": "component"}));
    patterns.push(json!({"prefix": "istio"}));

    let mut config = json!({
        "use_all_default_tags": false,
        "stats_tags": tags,
        "stats_matcher": {"inclusion_list": {"patterns": patterns}},
    });
    if let (Some(obj), Some(buckets)) = (config.as_object_mut(), histogram_buckets(cfg)) {
        obj.insert("histogram_bucket_settings".into(), buckets);
    }
    config
}

fn annotated_duration(cfg: &AgentConfig, annotation: &str) -> Option<Duration> {
    model::duration::parse(cfg.annotations.get(annotation)?)
}

/// Protobuf JSON duration (`10s`, `0.500s`).
pub(super) fn proto_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
    }
}

/// `stats_flush_interval`, only when the pod annotation sets it (Envoy's default is 5s).
pub(super) fn flush_interval(cfg: &AgentConfig) -> Option<String> {
    annotated_duration(cfg, FLUSH_INTERVAL_ANNOTATION).map(proto_duration)
}

/// `stats_eviction_interval`, when annotated and a multiple of the flush interval (Envoy's rule).
pub(super) fn eviction_interval(cfg: &AgentConfig) -> Option<String> {
    let eviction = annotated_duration(cfg, EVICTION_INTERVAL_ANNOTATION)?;
    let flush = annotated_duration(cfg, FLUSH_INTERVAL_ANNOTATION).unwrap_or(DEFAULT_FLUSH_INTERVAL);
    let (e, f) = (eviction.as_nanos(), flush.as_nanos());
    (e > 0 && f > 0 && e.is_multiple_of(f)).then(|| format!("{}s", eviction.as_secs()))
}

/// The statsd sink for ProxyConfig `statsdUdpAddress`, when it is an `ip:port` (Istio resolves
/// names first; the agent takes addresses only).
pub(super) fn stats_sinks(cfg: &AgentConfig) -> Option<Value> {
    let address = cfg.proxy_config.extra.get("statsdUdpAddress")?.as_str()?;
    let addr: std::net::SocketAddr = address.parse().ok()?;
    Some(json!([{
        "name": "envoy.stat_sinks.statsd",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
            "address": {"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}},
        },
    }]))
}

/// Istio's default runtime flags, then ProxyConfig `runtimeValues` ("" removes a default; "true" and
/// "false" become booleans, which Envoy requires for feature flags).
pub(super) fn runtime_flags(pc: &ProxyConfig) -> Value {
    let mut flags = Map::new();
    flags.insert("re2.max_program_size.error_level".into(), "32768".into());
    flags.insert(
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst".into(),
        true.into(),
    );
    flags.insert(
        "envoy.reloadable_features.http_reject_path_with_fragment".into(),
        false.into(),
    );
    flags.insert("envoy.reloadable_features.fixed_heap_use_allocated".into(), true.into());
    flags.insert(
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update".into(),
        false.into(),
    );
    if let Some(values) = pc.extra.get("runtimeValues").and_then(Value::as_object) {
        for (k, v) in values {
            match v.as_str() {
                Some("") => {
                    flags.remove(k);
                }
                Some("true") => {
                    flags.insert(k.clone(), true.into());
                }
                Some("false") => {
                    flags.insert(k.clone(), false.into());
                }
                _ => {
                    flags.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Value::Object(flags)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// pilot-discovery's HCM stat prefixes end with Istio's `;` (`outbound_0.0.0.0_9080;`), which
    /// is what the `http_conn_manager_prefix` tag's regex extracts; without it the stat keeps the
    /// prefix in its name and dashboards lose the label.
    #[test]
    fn the_http_conn_manager_prefix_tag_takes_istios_delimited_stat_prefixes() {
        let (_, pattern) = super::STATS_TAGS_HEAD
            .iter()
            .find(|(name, _)| *name == "http_conn_manager_prefix")
            .unwrap();
        let re = regex::Regex::new(pattern).unwrap();
        for prefix in [
            "outbound_0.0.0.0_9080",
            "inbound_0.0.0.0_8080",
            "InboundPassthroughCluster",
        ] {
            let stat = format!("http.{prefix};.downstream_rq_total");
            let caps = re.captures(&stat).unwrap_or_else(|| panic!("{stat} is not tagged"));
            assert_eq!(&caps[2], prefix);
        }
        assert!(!re.is_match("http.outbound_0.0.0.0_9080.downstream_rq_total"));
    }
}
