//! Istio's feature flags (`env.Register` in `pilot/pkg/features` and `pkg/features` of istio/istio
//! at 86c9f01) and the rest of the environment of istiod's Deployment (`DEPLOYMENT_ENV`), and
//! which of them pilot-discovery honours. One warning at start names every variable that is set
//! and that pilot-discovery accepts and ignores, with why, so that an install moved from istiod
//! says what it loses instead of silently behaving otherwise. A test reads the Deployment of
//! Istio's rendered default install and checks that each of its variables is classified here.

/// Every feature flag of Istio's pilot, by name.
pub const ISTIO_FEATURE_FLAGS: &[&str] = &[
    "AMBIENT_SCOPED_ADDRESS_PUSHES",
    "BLOCKED_CIDRS_IN_JWKS_URIS",
    "BLOCKED_CIDRS_IN_WASM_FETCH",
    "CA_TRUSTED_NODE_ACCOUNTS",
    "CERT_SIGNER_DOMAIN",
    "CLUSTER_ID",
    "COMPLIANCE_POLICY",
    "DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES",
    "DISABLE_SHADOW_HOST_SUFFIX",
    "DISABLE_TRACK_REMAINING_CB_METRICS",
    "ENABLE_100_CONTINUE_HEADERS",
    "ENABLE_CA_SERVER",
    "ENABLE_CLUSTER_TRUST_BUNDLE_API",
    "ENABLE_DEBUG_ENDPOINT_AUTH",
    "ENABLE_DEBUG_ON_HTTP",
    "ENABLE_ENHANCED_DESTINATIONRULE_MERGE",
    "ENABLE_GATEWAY_API_INFERENCE_EXTENSION",
    "ENABLE_GATEWAY_API_MANUAL_DEPLOYMENT",
    "ENABLE_HCM_INTERNAL_NETWORKS",
    "ENABLE_LAYERED_WAYPOINT_AUTHORIZATION_POLICIES",
    "ENABLE_LAZY_SIDECAR_EVALUATION",
    "ENABLE_LEADER_ELECTION",
    "ENABLE_LOCALITY_WEIGHTED_LB_CONFIG",
    "ENABLE_MCS_AUTO_EXPORT",
    "ENABLE_MCS_CLUSTER_LOCAL",
    "ENABLE_MCS_HOST",
    "ENABLE_MCS_SERVICE_DISCOVERY",
    "ENABLE_MULTICLUSTER_HEADLESS",
    "ENABLE_NATIVE_SIDECARS",
    "ENABLE_PROXY_FIND_POD_BY_IP",
    "ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY",
    "ENABLE_TLS_ON_SIDECAR_INGRESS",
    "ENABLE_VTPROTOBUF",
    "ENABLE_WILDCARD_HOST_SERVICE_ENTRIES_FOR_TLS",
    "ENABLE_XDS_API_GENERATOR_AUTH",
    "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL",
    "EXTERNAL_ISTIOD",
    "INJECTION_WEBHOOK_CONFIG_NAME",
    "ISTIOD_CUSTOM_HOST",
    "ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION",
    "ISTIO_DELTA_XDS",
    "ISTIO_DUAL_STACK",
    "ISTIO_ENABLE_CONTROLLER_QUEUE_METRICS",
    "ISTIO_ENABLE_IPV4_OUTBOUND_LISTENER_FOR_IPV6_CLUSTERS",
    "ISTIO_GPRC_MAXRECVMSGSIZE",
    "ISTIO_GPRC_MAXSTREAMS",
    "ISTIO_KUBE_CLIENT_CONTENT_TYPE",
    "ISTIO_MULTIROOT_MESH",
    "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
    "ISTIO_WATCH_NAMESPACE",
    "ISTIO_WORKLOAD_ENTRY_VALIDATE_IDENTITY",
    "JWKS_RESOLVER_INSECURE_SKIP_VERIFY",
    "LABEL_CANONICAL_SERVICES_FOR_MESH_EXTERNAL_SERVICE_ENTRIES",
    "LOCAL_CLUSTER_SECRET_WATCHER",
    "MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP",
    "MCS_API_GROUP",
    "MCS_API_VERSION",
    "METRICS_LOCALHOST_ACCESS_ONLY",
    "MUTEX_PROFILE_FRACTION",
    "PILOT_AGENT_MERGE_ENVOY_STATS",
    "PILOT_ALLOW_ANY_DYNAMIC_DNS_MAX_HOSTS",
    "PILOT_ALLOW_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE",
    "PILOT_ANALYSIS_INTERVAL",
    "PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS",
    "PILOT_CA_CERT_CONFIGMAP",
    "PILOT_CERT_PROVIDER",
    "PILOT_CONVERT_SIDECAR_SCOPE_CONCURRENCY",
    "PILOT_CRL_CONFIGMAP",
    "PILOT_DEBOUNCE_AFTER",
    "PILOT_DEBOUNCE_MAX",
    "PILOT_DISABLE_MX_ALPN",
    "PILOT_DNS_CARES_UDP_MAX_QUERIES",
    "PILOT_DNS_JITTER_DURATION",
    "PILOT_DRAINING_LABEL",
    "PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN",
    "PILOT_ENABLE_AGENTGATEWAY",
    "PILOT_ENABLE_ALPN_FILTER",
    "PILOT_ENABLE_AMBIENT",
    "PILOT_ENABLE_ANALYSIS",
    "PILOT_ENABLE_CA_CRL",
    "PILOT_ENABLE_CDS_CACHE",
    "PILOT_ENABLE_CROSS_CLUSTER_WORKLOAD_ENTRY",
    "PILOT_ENABLE_EDS_DEBOUNCE",
    "PILOT_ENABLE_EDS_FOR_HEADLESS_SERVICES",
    "PILOT_ENABLE_GATEWAY_API",
    "PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS",
    "PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER",
    "PILOT_ENABLE_GATEWAY_API_GATEWAYCLASS_CONTROLLER",
    "PILOT_ENABLE_GATEWAY_API_STATUS",
    "PILOT_ENABLE_HEADLESS_FILTER_CHAIN_LISTENER",
    "PILOT_ENABLE_IP_AUTOALLOCATE",
    "PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES",
    "PILOT_ENABLE_METADATA_EXCHANGE",
    "PILOT_ENABLE_MONGO_FILTER",
    "PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS",
    "PILOT_ENABLE_MYSQL_FILTER",
    "PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS",
    "PILOT_ENABLE_PERSISTENT_SESSION_FILTER",
    "PILOT_ENABLE_QUIC_LISTENERS",
    "PILOT_ENABLE_RDS_CACHE",
    "PILOT_ENABLE_REDIS_FILTER",
    "PILOT_ENABLE_REMOTE_CREDENTIALS_CONTROLLER",
    "PILOT_ENABLE_ROUTE_COLLAPSE_OPTIMIZATION",
    "PILOT_ENABLE_SERVICEENTRY_SELECT_PODS",
    "PILOT_ENABLE_STRICT_GATEWAY_MERGING",
    "PILOT_ENABLE_TELEMETRY_LABEL",
    "PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION",
    "PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS",
    "PILOT_ENABLE_XDS_CACHE",
    "PILOT_ENABLE_XDS_IDENTITY_CHECK",
    "PILOT_ENDPOINT_TELEMETRY_LABEL",
    "PILOT_ENVOY_FILTER_STATS",
    "PILOT_FILTER_GATEWAY_CLUSTER_CONFIG",
    "PILOT_GATEWAY_API_CONTROLLER_NAME",
    "PILOT_GATEWAY_API_DEFAULT_GATEWAYCLASS_NAME",
    "PILOT_GATEWAY_TRANSPORT_SOCKET_CONNECT_TIMEOUT",
    "PILOT_HTTP10",
    "PILOT_IGNORE_RESOURCES",
    "PILOT_INCLUDE_RESOURCES",
    "PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS",
    "PILOT_IP_AUTOALLOCATE_IPV4_PREFIX",
    "PILOT_IP_AUTOALLOCATE_IPV6_PREFIX",
    "PILOT_JWT_ENABLE_REMOTE_JWKS",
    "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL",
    "PILOT_MAX_REQUESTS_PER_SECOND",
    "PILOT_MULTICLUSTER_KUBECONFIG_PATH",
    "PILOT_MULTI_NETWORK_DISCOVER_GATEWAY_API",
    "PILOT_MX_ADDITIONAL_LABELS",
    "PILOT_NODE_UNTAINT_CONTROLLERS_TAINT_NAME",
    "PILOT_PERSISTENT_SESSION_HEADER_LABEL",
    "PILOT_PERSISTENT_SESSION_LABEL",
    "PILOT_PUSH_THROTTLE",
    "PILOT_REMOTE_CLUSTER_TIMEOUT",
    "PILOT_SCOPE_GATEWAY_TO_NAMESPACE",
    "PILOT_SEND_UNHEALTHY_ENDPOINTS",
    "PILOT_SIDECAR_PICK_BEST_SERVICE_NAMESPACE",
    "PILOT_SIDECAR_USE_REMOTE_ADDRESS",
    "PILOT_SKIP_VALIDATE_TRUST_DOMAIN",
    "PILOT_STATUS_MAX_WORKERS",
    "PILOT_TRACE_SAMPLING",
    "PILOT_UNIFIED_SIDECAR_SCOPE",
    "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD",
    "PILOT_XDS_CACHE_INDEX_CLEAR_INTERVAL",
    "PILOT_XDS_CACHE_SIZE",
    "PILOT_XDS_CACHE_STATS",
    "PREFER_DESTINATIONRULE_TLS_FOR_EXTERNAL_SERVICES",
    "RESOLVE_HOSTNAME_GATEWAYS",
    "SHARED_MESH_CONFIG",
    "TRUSTED_GATEWAY_CIDR",
    "UNSAFE_ENABLE_ADMIN_ENDPOINTS",
    "UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS",
    "USE_CACERTS_FOR_SELF_SIGNED_CA",
    "VALIDATION_WEBHOOK_CONFIG_NAME",
    "XDS_AUTH",
];

/// Flags that Istio removed and that still appear in older installs, with why they do nothing.
pub const REMOVED: &[(&str, &str)] = &[
    (
        "PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND",
        "removed in Istio 1.19: ports of unknown protocol are always sniffed",
    ),
    (
        "PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_INBOUND",
        "removed in Istio 1.19: ports of unknown protocol are always sniffed",
    ),
];

/// The flags pilot-discovery reads and acts on (see `settings.rs`, `secure.rs` and `args.rs`).
pub const HONOURED: &[&str] = &[
    "CLUSTER_ID",
    "ENABLE_DEBUG_ENDPOINT_AUTH",
    "ENABLE_LEADER_ELECTION",
    // the sidecar injector's native sidecars (`injection/nodes.rs`)
    "ENABLE_NATIVE_SIDECARS",
    "INJECTION_WEBHOOK_CONFIG_NAME",
    "ISTIOD_CUSTOM_HOST",
    "ISTIO_GPRC_MAXRECVMSGSIZE",
    "ISTIO_GPRC_MAXSTREAMS",
    "PILOT_DEBOUNCE_AFTER",
    "PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN",
    "PILOT_ENABLE_EDS_DEBOUNCE",
    "PILOT_ENABLE_IP_AUTOALLOCATE",
    "PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS",
    "PILOT_FILTER_GATEWAY_CLUSTER_CONFIG",
    "PILOT_HTTP10",
    "PILOT_JWT_ENABLE_REMOTE_JWKS",
    "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL",
    "PILOT_MULTICLUSTER_KUBECONFIG_PATH",
    "PILOT_PUSH_THROTTLE",
    "PILOT_REMOTE_CLUSTER_TIMEOUT",
    "PILOT_TRACE_SAMPLING",
];

/// Flags whose value here is fixed: set to it, they are honoured; set otherwise, not.
pub const FIXED: &[(&str, &str)] = &[
    // the mesh CA signs istiod's own serving certificate, as `istiod`
    ("PILOT_CERT_PROVIDER", "istiod"),
    ("ENABLE_CA_SERVER", "true"),
    // no config analysis (Istio's default)
    ("PILOT_ENABLE_ANALYSIS", "false"),
    // no platform-specific behaviour (OpenShift, GCP)
    ("PLATFORM", ""),
];

/// The rest of the environment of istiod's Deployment (Istio's chart, `istiod`'s container), which
/// is not a feature flag: `None` when pilot-discovery honours it, else why it is accepted and
/// ignored. Those ignored and set are named in the start-up line of [`not_honoured`].
pub const DEPLOYMENT_ENV: &[(&str, Option<&str>)] = &[
    // `istio.io/rev` of the webhook configurations, `istiod-<rev>` names, `istio-<rev>` ConfigMap
    ("REVISION", None),
    // istiod's namespace: its Secrets, ConfigMaps and DNS names
    ("POD_NAMESPACE", None),
    // a missing file falls back to the in-cluster config, as client-go's loading rules
    ("KUBECONFIG", None),
    // the leader-election identity (istiod also names itself with it in the control_plane of its
    // xDS responses, which pilot-discovery does not send)
    ("POD_NAME", None),
    (
        "SERVICE_ACCOUNT",
        Some("istiod does not read it either (the chart sets it for the agent's settings shared with istiod)"),
    ),
    (
        "GOMAXPROCS",
        Some(
            "Go's scheduler threads; pilot-discovery sizes its runtime to the CPUs the process may use, cgroup limit included",
        ),
    ),
];

/// Flags that are read but have no effect here, with why.
pub const NO_EFFECT: &[(&str, &str)] = &[
    (
        "PILOT_DEBOUNCE_MAX",
        "no push waits longer than PILOT_DEBOUNCE_AFTER after the previous one",
    ),
    (
        "CA_TRUSTED_NODE_ACCOUNTS",
        "ambient mode's ztunnel is not supported, so no node account signs for others",
    ),
];

/// The flags set by `get` that pilot-discovery does not honour, each as `NAME=value` with why when
/// known, sorted; empty when everything set is honoured.
pub fn not_honoured(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    let fixed = |name: &str| FIXED.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    for name in ISTIO_FEATURE_FLAGS.iter().chain(FIXED.iter().map(|(n, _)| n)) {
        let Some(value) = get(name) else { continue };
        if HONOURED.contains(name) || out.iter().any(|o: &String| o.starts_with(&format!("{name}="))) {
            continue;
        }
        match (fixed(name), NO_EFFECT.iter().find(|(n, _)| n == name)) {
            (Some(v), _) if value.eq_ignore_ascii_case(v) => {}
            (Some(""), _) => out.push(format!("{name}={value} (only an empty value is supported)")),
            (Some(v), _) => out.push(format!("{name}={value} (only {v} is supported)")),
            (None, Some((_, why))) => out.push(format!("{name}={value} ({why})")),
            (None, None) => out.push(format!("{name}={value}")),
        }
    }
    let ignored = DEPLOYMENT_ENV.iter().filter_map(|(n, why)| why.map(|w| (*n, w)));
    for (name, why) in REMOVED.iter().copied().chain(ignored) {
        if let Some(value) = get(name) {
            out.push(format!("{name}={value} ({why})"));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The container `discovery` of Istio's rendered default install: its args and env names.
    fn istiod_container() -> (Vec<String>, Vec<String>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
        );
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("Istio's rendered install {} is needed ({e}): ../shared", path.display()));
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        let deployment = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "istiod")
            .expect("istiod's Deployment in the rendered install");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let strings = |v: &serde_json::Value, key: Option<&str>| -> Vec<String> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|e| key.map_or(e, |k| &e[k]).as_str().unwrap().to_owned())
                .collect()
        };
        (
            strings(&container["args"], None),
            strings(&container["env"], Some("name")),
        )
    }

    /// Every env variable of istiod's Deployment is honoured, or fixed to the value the install
    /// gives it, or named with why it is ignored; every flag parses (clap refuses unknown ones).
    #[test]
    fn every_env_variable_and_flag_of_istiods_deployment_is_classified() {
        let (args, env) = istiod_container();
        assert!(env.len() >= 12, "{env:?}");
        for name in &env {
            let classified = HONOURED.contains(&name.as_str())
                || FIXED.iter().any(|(n, _)| n == name)
                || NO_EFFECT.iter().any(|(n, _)| n == name)
                || DEPLOYMENT_ENV.iter().any(|(n, _)| n == name);
            assert!(
                classified,
                "{name} of istiod's Deployment is neither honoured nor named as ignored"
            );
        }
        let mut argv = vec!["pilot-discovery".to_owned()];
        argv.extend(args);
        let cli = <crate::args::Cli as clap::Parser>::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let crate::args::Command::Discovery(a) = cli.command else {
            panic!("the install runs `discovery`")
        };
        assert_eq!(a.monitoring_addr, ":15014");
        assert_eq!(a.log_output_level, "default:info");
        assert_eq!(a.domain, "cluster.local");
        assert_eq!(a.keepalive_max_server_connection_age, "30m");
    }

    /// With the install's values, the start-up line names exactly what is ignored, with why.
    #[test]
    fn istios_deployment_env_makes_one_line_of_what_is_ignored() {
        let install = env(&[
            ("REVISION", "default"),
            ("PILOT_CERT_PROVIDER", "istiod"),
            ("POD_NAME", "istiod-abc"),
            ("POD_NAMESPACE", "istio-system"),
            ("SERVICE_ACCOUNT", "istiod"),
            ("KUBECONFIG", "/var/run/secrets/remote/config"),
            ("CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel"),
            ("PILOT_TRACE_SAMPLING", "1"),
            ("PILOT_ENABLE_ANALYSIS", "false"),
            ("CLUSTER_ID", "Kubernetes"),
            ("GOMAXPROCS", "2"),
            ("PLATFORM", ""),
        ]);
        let names: Vec<String> = not_honoured(install)
            .iter()
            .map(|l| l.split('=').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(names, ["CA_TRUSTED_NODE_ACCOUNTS", "GOMAXPROCS", "SERVICE_ACCOUNT"]);
        assert_eq!(
            not_honoured(env(&[("PLATFORM", "openshift")])),
            ["PLATFORM=openshift (only an empty value is supported)"]
        );
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn honoured_and_fixed_flags_are_istios() {
        for name in HONOURED.iter().chain(NO_EFFECT.iter().map(|(n, _)| n)) {
            assert!(ISTIO_FEATURE_FLAGS.contains(name), "{name} is not one of Istio's flags");
        }
    }

    /// Istio's default install sets PILOT_TRACE_SAMPLING=1, PILOT_ENABLE_ANALYSIS=false,
    /// PILOT_CERT_PROVIDER=istiod and CA_TRUSTED_NODE_ACCOUNTS (for ztunnel).
    #[test]
    fn istios_install_warns_only_of_what_is_not_honoured() {
        let install = env(&[
            ("PILOT_TRACE_SAMPLING", "1"),
            ("PILOT_ENABLE_ANALYSIS", "false"),
            ("PILOT_CERT_PROVIDER", "istiod"),
            ("CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel"),
            ("CLUSTER_ID", "Kubernetes"),
            ("PATH", "/usr/bin"),
        ]);
        assert_eq!(
            not_honoured(install),
            [
                "CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel (ambient mode's ztunnel is not supported, so no node account signs for others)"
            ]
        );
        let more = env(&[
            ("PILOT_HTTP10", "true"),
            ("PILOT_ENABLE_QUIC_LISTENERS", "true"),
            ("PILOT_CERT_PROVIDER", "kubernetes"),
            ("PILOT_DEBOUNCE_MAX", "5s"),
            ("PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND", "false"),
        ]);
        assert_eq!(
            not_honoured(more),
            [
                "PILOT_CERT_PROVIDER=kubernetes (only istiod is supported)",
                "PILOT_DEBOUNCE_MAX=5s (no push waits longer than PILOT_DEBOUNCE_AFTER after the previous one)",
                "PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND=false (removed in Istio 1.19: ports of unknown protocol are always sniffed)",
                "PILOT_ENABLE_QUIC_LISTENERS=true",
            ]
        );
    }
}
