//! Bootstrap tests: golden files for a sidecar and a router (refresh with `REFRESH_GOLDEN=true`), a
//! field-by-field comparison with Istio's own `default_golden.json`, real Envoy's `--mode validate`,
//! and writing the file (rendered, templated, custom).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;
use crate::config::{POD_ANNOTATIONS_PATH, POD_LABELS_PATH, ProxyArgs, ProxyType};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn sidecar() -> AgentConfig {
    let env = map(&[
        ("POD_NAME", "reviews-v1-7d9f8c-x2x4z"),
        ("POD_NAMESPACE", "bookinfo"),
        ("INSTANCE_IP", "10.244.0.12"),
        ("SERVICE_ACCOUNT", "bookinfo-reviews"),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_MESH_ID", "cluster.local"),
        ("ISTIO_META_ISTIO_VERSION", "1.28.0"),
        ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
        ("ISTIO_META_WORKLOAD_NAME", "reviews-v1"),
        ("ISTIO_METAJSON_LABELS", r#"{"app": "reviews", "version": "v1"}"#),
    ]);
    let files: BTreeMap<PathBuf, String> = [(
        PathBuf::from(POD_LABELS_PATH),
        "app=\"reviews\"\nversion=\"v1\"\npod-template-hash=\"7d9f8c\"\n".to_string(),
    )]
    .into();
    AgentConfig::from_args(&ProxyArgs::default(), &env, &files).unwrap()
}

/// A gateway with the optional parts on: SotW (from the mesh file's proxyMetadata), zipkin, statsd,
/// stats annotations, outlier log, extra stat tags and runtime values.
fn router() -> AgentConfig {
    let env = map(&[
        ("POD_NAME", "istio-ingressgateway-5c7b9-k2x8p"),
        ("POD_NAMESPACE", "istio-system"),
        ("INSTANCE_IP", "10.244.0.7"),
        ("SERVICE_ACCOUNT", "istio-ingressgateway-service-account"),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_ISTIO_VERSION", "1.28.0"),
    ]);
    let mesh = r#"
defaultConfig:
  discoveryAddress: istiod.istio-system.svc:15012
  tracing:
    zipkin:
      address: zipkin.istio-system:9411
  statsdUdpAddress: 10.0.0.9:9125
  extraStatTags: [request_protocol]
  runtimeValues:
    envoy.reloadable_features.http_reject_path_with_fragment: "true"
  proxyStatsMatcher:
    inclusionPrefixes: ["http.{pod_ip}_"]
  proxyMetadata:
    ISTIO_DELTA_XDS: "false"
    ISTIO_META_ROUTER_MODE: sni-dnat
"#;
    let files: BTreeMap<PathBuf, String> = [
        (PathBuf::from("./etc/istio/config/mesh"), mesh.to_string()),
        (
            PathBuf::from(POD_LABELS_PATH),
            "app=\"istio-ingressgateway\"\nistio=\"ingressgateway\"\n".to_string(),
        ),
        (
            PathBuf::from(POD_ANNOTATIONS_PATH),
            "sidecar.istio.io/statsFlushInterval=\"10s\"\nsidecar.istio.io/statsEvictionInterval=\"20s\"\n\
             sidecar.istio.io/statsHistogramBuckets=\"{\\\"istio\\\":[1,5,10]}\"\n"
                .to_string(),
        ),
    ]
    .into();
    let args = ProxyArgs {
        proxy_type: ProxyType::Router,
        outlier_log_path: "/dev/stdout".into(),
        ..ProxyArgs::default()
    };
    AgentConfig::from_args(&args, &env, &files).unwrap()
}

fn render(cfg: &AgentConfig) -> Value {
    Bootstrap::render(cfg, &BootstrapOptions::from_config(cfg))
}

fn check_golden(name: &str, actual: &Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name);
    if std::env::var("REFRESH_GOLDEN").is_ok_and(|v| v == "true") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with REFRESH_GOLDEN=true to create it)", path.display()));
    let expected: Value = serde_json::from_str(&text).unwrap();
    assert!(
        &expected == actual,
        "{} differs (REFRESH_GOLDEN=true to update):\n{}",
        path.display(),
        serde_json::to_string_pretty(actual).unwrap()
    );
}

#[test]
fn sidecar_golden() {
    check_golden("sidecar_bootstrap_golden.json", &render(&sidecar()));
}

#[test]
fn router_golden() {
    check_golden("router_bootstrap_golden.json", &render(&router()));
}

#[test]
fn sidecar_bootstrap_reaches_the_agent() {
    let b = render(&sidecar());
    assert_eq!(
        b["node"]["id"],
        "sidecar~10.244.0.12~reviews-v1-7d9f8c-x2x4z.bookinfo~bookinfo.svc.cluster.local"
    );
    assert_eq!(b["node"]["cluster"], "reviews.bookinfo");
    assert_eq!(
        b["node"]["metadata"]["LABELS"],
        json!({"app": "reviews", "version": "v1"})
    );
    assert_eq!(
        b["admin"]["address"]["socket_address"],
        json!({"address": "127.0.0.1", "port_value": 15000})
    );
    let ads = &b["dynamic_resources"]["ads_config"];
    assert_eq!(ads["api_type"], "DELTA_GRPC");
    assert_eq!(ads["grpc_services"][0]["envoy_grpc"]["cluster_name"], XDS_CLUSTER);
    assert_eq!(b["dynamic_resources"]["cds_config"]["initial_fetch_timeout"], "0s");
    assert_eq!(b["dynamic_resources"]["lds_config"]["ads"], json!({}));
    let clusters = &b["static_resources"]["clusters"];
    let xds = clusters
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == XDS_CLUSTER)
        .unwrap();
    let address = &xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    assert_eq!(address["pipe"]["path"], "./etc/istio/proxy/XDS");
    assert!(
        xds["typed_extension_protocol_options"]
            .to_string()
            .contains("http2_protocol_options")
    );
    let listeners: Vec<&str> = names(&b["static_resources"]["listeners"]);
    assert_eq!(listeners, ["0.0.0.0_15090", "0.0.0.0_15021"]);
    assert!(b.get("cluster_manager").is_none() && b.get("tracing").is_none());
}

#[test]
fn router_bootstrap_has_the_optional_parts() {
    let cfg = router();
    let b = render(&cfg);
    assert_eq!(b["dynamic_resources"]["ads_config"]["api_type"], "GRPC");
    assert_eq!(b["node"]["cluster"], "istio-ingressgateway.istio-system");
    assert_eq!(b["node"]["metadata"]["ROUTER_MODE"], "sni-dnat");
    assert_eq!(
        b["cluster_manager"]["outlier_detection"]["event_log_path"],
        "/dev/stdout"
    );
    assert_eq!(b["tracing"]["http"]["name"], "envoy.tracers.zipkin");
    assert_eq!(b["stats_sinks"][0]["name"], "envoy.stat_sinks.statsd");
    assert_eq!(
        (
            b["stats_flush_interval"].as_str(),
            b["stats_eviction_interval"].as_str()
        ),
        (Some("10s"), Some("20s"))
    );
    assert_eq!(
        b["stats_config"]["histogram_bucket_settings"],
        json!([{"match": {"prefix": "istio"}, "buckets": [1.0, 5.0, 10.0]}])
    );
    let patterns = b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"].to_string();
    assert!(patterns.contains(r#"{"prefix":"http.10.244.0.7_"}"#), "{patterns}");
    let tags = b["stats_config"]["stats_tags"].to_string();
    assert!(tags.contains(r#""tag_name":"request_protocol""#), "{tags}");
    assert_eq!(
        b["layered_runtime"]["layers"][0]["static_layer"]["envoy.reloadable_features.http_reject_path_with_fragment"],
        true
    );
    assert!(names(&b["static_resources"]["clusters"]).contains(&"zipkin"));
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|a| a.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
}

/// Istio's own golden for its default ProxyConfig, from the shared corpus beside the repo
/// (`../shared`); fails the test when it is missing.
fn istio_default_golden() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let path = root.join("shared/corpus/istio/pkg/bootstrap/testdata/default_golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "Istio's default_golden.json is missing: cannot read {} ({e}; \
             the tests read the shared corpus in ../shared)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

#[test]
fn covers_the_fields_of_istios_default_golden() {
    let istio = istio_default_golden();
    let ours = render(&sidecar());
    let mut missing = Vec::new();
    let mut compare = |what: &str, theirs: BTreeSet<String>, ours: BTreeSet<String>| {
        let lacking: Vec<_> = theirs.difference(&ours).cloned().collect();
        if !lacking.is_empty() {
            missing.push(format!("{what}: {lacking:?}"));
        }
        lacking
    };
    let top = compare("top-level keys", keys(&istio), keys(&ours));
    let to_set = |v: Vec<&str>| v.into_iter().map(String::from).collect::<BTreeSet<_>>();
    let clusters = compare(
        "static clusters",
        to_set(names(&istio["static_resources"]["clusters"])),
        to_set(names(&ours["static_resources"]["clusters"])),
    );
    let listeners = compare(
        "listeners",
        to_set(names(&istio["static_resources"]["listeners"])),
        to_set(names(&ours["static_resources"]["listeners"])),
    );
    let metadata = compare(
        "node metadata keys",
        keys(&istio["node"]["metadata"]),
        keys(&ours["node"]["metadata"]),
    );
    compare("admin", keys(&istio["admin"]), keys(&ours["admin"]));
    compare(
        "ads_config",
        keys(&istio["dynamic_resources"]["ads_config"]),
        keys(&ours["dynamic_resources"]["ads_config"]),
    );
    compare(
        "stats_config",
        keys(&istio["stats_config"]),
        keys(&ours["stats_config"]),
    );
    eprintln!("Istio's default bootstrap has, and ours lacks: {missing:#?}");

    // Istio's golden turns on the outlier log; ours does only with --outlierLogPath.
    assert!(
        top.iter().all(|k| k == "cluster_manager"),
        "top-level keys missing: {top:?}"
    );
    assert!(clusters.is_empty(), "{clusters:?}");
    assert!(listeners.is_empty(), "{listeners:?}");
    assert!(metadata.iter().all(|k| k == "OUTLIER_LOG_PATH"), "{metadata:?}");
    for path in [
        "/admin/address",
        "/dynamic_resources/ads_config",
        "/stats_config/stats_matcher",
    ] {
        assert!(ours.pointer(path).is_some(), "{path}");
    }
    let tag_names = |b: &Value| {
        b["stats_config"]["stats_tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tag_name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(tag_names(&ours), tag_names(&istio), "Istio's stats tags, in its order");
    assert_eq!(
        istio["stats_config"]["stats_matcher"], ours["stats_config"]["stats_matcher"],
        "the same inclusion list"
    );
    assert_eq!(
        istio["layered_runtime"]["layers"][0]["static_layer"],
        ours["layered_runtime"]["layers"][0]["static_layer"]
    );
    // With the outlier log on, the cluster manager is Istio's too.
    let with_outlier = render(&router());
    assert_eq!(with_outlier["cluster_manager"], istio["cluster_manager"]);
}

#[tokio::test]
async fn envoy_accepts_the_rendered_bootstraps() -> anyhow::Result<()> {
    test_support::envoy::validate(&render(&sidecar())).await?;
    test_support::envoy::validate(&render(&router())).await?;
    let mut json_logs = sidecar();
    json_logs.log.as_json = true;
    json_logs.delta_xds = false;
    test_support::envoy::validate(&render(&json_logs)).await
}

fn in_dir(cfg: &mut AgentConfig, dir: &Path) {
    cfg.paths.config_path = dir.join("proxy");
    cfg.paths.bootstrap = dir.join("proxy").join(crate::config::BOOTSTRAP_FILE);
}

#[test]
fn write_renders_into_the_config_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = sidecar();
    in_dir(&mut cfg, dir.path());
    let path = Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg)).unwrap();
    assert_eq!(path, dir.path().join("proxy/envoy-rev.json"));
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(written, render(&cfg));
    // Rewriting (a restart) replaces the file whole.
    cfg.proxy_admin_port = 15100;
    Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg)).unwrap();
    let rewritten: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(rewritten["admin"]["address"]["socket_address"]["port_value"], 15100);
}

#[test]
fn custom_config_file_is_used_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let custom = dir.path().join("custom.json");
    std::fs::write(&custom, "{}").unwrap();
    let mut cfg = sidecar();
    in_dir(&mut cfg, dir.path());
    cfg.paths.custom_config_file = Some(custom.clone());
    assert_eq!(
        Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg)).unwrap(),
        custom
    );
    assert!(!cfg.paths.bootstrap.exists());
    cfg.paths.custom_config_file = Some(dir.path().join("absent.json"));
    let err = Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg))
        .unwrap_err()
        .to_string();
    assert!(err.contains("customConfigFile") && err.contains("absent.json"), "{err}");
}

#[tokio::test]
async fn template_file_is_rendered_with_istio_parameter_names() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let template = dir.path().join("bootstrap.json.tmpl");
    std::fs::write(
        &template,
        r#"{
  "node": {"id": "{{ .nodeID }}", "cluster": "{{ .cluster }}", "metadata": {{ .meta_json_str }}},
  "admin": {"address": {"socket_address": {"address": "{{ .localhost }}", "port_value": {{ .config.ProxyAdminPort }}}}},
  "layered_runtime": {"layers": [{"name": "global config", "static_layer": {{ .runtime_flags }}}]},
  "dynamic_resources": {
    "ads_config": {"api_type": "{{ .xds_type }}", "transport_api_version": "V3",
                   "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]},
    "cds_config": {"ads": {}, "resource_api_version": "V3"},
    "lds_config": {"ads": {}, "resource_api_version": "V3"}
  },
  "static_resources": {"clusters": [{
    "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
      "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
      "explicit_http_config": {"http2_protocol_options": {}}}},
    "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
      {"pipe": {"path": "{{ .config.ConfigPath }}/XDS"}}}}]}]}
  }]},
  "stats_config": {"stats_matcher": {"inclusion_list": {"patterns": [
    {{- range $a, $s := .inclusionPrefix }}{"prefix": "{{ $s }}"},{{- end }}
    {{- range $a, $s := .inclusionRegexps }}{"safe_regex": {"regex": "{{ js $s }}"}},{{- end }}
    {"prefix": "istio"}]}}}
}"#,
    )?;
    let mut cfg = sidecar();
    in_dir(&mut cfg, dir.path());
    cfg.paths.template_file = Some(template);
    let path = Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg))?;
    assert_eq!(path, dir.path().join("proxy/envoy-rev.json"));
    let b: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    assert_eq!(b["node"]["id"], cfg.node_id);
    assert_eq!(b["node"]["metadata"], cfg.metadata);
    assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);
    assert_eq!(b["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
    let patterns = &b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"];
    assert_eq!(patterns[0], json!({"prefix": "cluster_manager"}));
    assert_eq!(patterns[5], json!({"safe_regex": {"regex": r"vhost\..*\.route\..*"}}));
    test_support::envoy::validate(&b).await?;

    // A template whose output is not JSON is an error that names the template.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"id\": {{ .nodeID }}}")?;
    cfg.paths.template_file = Some(broken);
    let err = Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg))
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken.json") && err.contains("not JSON"), "{err}");
    Ok(())
}
