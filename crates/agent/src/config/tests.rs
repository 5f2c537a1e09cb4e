//! `AgentConfig::from_args` end to end on a map of env vars and a map of files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = [
        ("POD_NAME", "reviews-v1-abc"),
        ("POD_NAMESPACE", "bookinfo"),
        ("INSTANCE_IP", "10.1.2.3"),
        ("SERVICE_ACCOUNT", "bookinfo-reviews"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in pairs {
        if v.is_empty() {
            env.remove(*k);
        } else {
            env.insert(k.to_string(), v.to_string());
        }
    }
    env
}

fn files(pairs: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
    pairs.iter().map(|(k, v)| (PathBuf::from(k), v.to_string())).collect()
}

fn build(args: &ProxyArgs, env: &BTreeMap<String, String>, files: &BTreeMap<PathBuf, String>) -> AgentConfig {
    AgentConfig::from_args(args, env, files).unwrap()
}

fn error(env: &BTreeMap<String, String>, files: &BTreeMap<PathBuf, String>) -> String {
    AgentConfig::from_args(&ProxyArgs::default(), env, files)
        .unwrap_err()
        .to_string()
}

#[test]
fn sidecar_identity_and_defaults() {
    let cfg = build(&ProxyArgs::default(), &env(&[]), &files(&[]));
    assert_eq!(cfg.node_type, ProxyType::Sidecar);
    assert_eq!(
        cfg.node_id,
        "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local"
    );
    assert_eq!(cfg.domain, "bookinfo.svc.cluster.local");
    assert_eq!(cfg.service_cluster, "istio-proxy.bookinfo");
    assert_eq!(cfg.discovery_address, "istiod.istio-system.svc:15012");
    assert_eq!(cfg.ca_address, cfg.discovery_address);
    assert_eq!(cfg.pilot_san, vec!["istiod.istio-system.svc".to_string()]);
    assert_eq!((cfg.proxy_admin_port, cfg.status_port), (15000, 15020));
    assert_eq!((cfg.envoy_status_port, cfg.envoy_prometheus_port), (15021, 15090));
    assert!(cfg.delta_xds, "Istio's ISTIO_DELTA_XDS default is true");
    assert_eq!(
        cfg.xds_max_recv_msg_size,
        4 << 20,
        "Istio's ISTIO_GPRC_MAXRECVMSGSIZE default"
    );
    assert_eq!(cfg.concurrency, None);
    assert_eq!(cfg.paths.config_path, PathBuf::from("./etc/istio/proxy"));
    assert_eq!(cfg.paths.bootstrap, PathBuf::from("./etc/istio/proxy/envoy-rev.json"));
    assert_eq!(cfg.paths.xds_uds, PathBuf::from("./etc/istio/proxy/XDS"));
    assert_eq!(
        cfg.paths.sds_uds,
        PathBuf::from("./var/run/secrets/workload-spiffe-uds/socket")
    );
    assert_eq!(cfg.drain.drain_duration.as_secs(), 45);
    assert_eq!(cfg.drain.termination_drain_duration.as_secs(), 5);
    assert_eq!(cfg.drain.minimum_drain_duration.as_secs(), 5);
    assert_eq!(cfg.global_downstream_max_connections, i32::MAX as u32);
    assert_eq!(cfg.log.proxy_log_level, "warning");
    assert_eq!(cfg.localhost(), "127.0.0.1");

    let md = &cfg.metadata;
    assert_eq!(md["NAMESPACE"], "bookinfo");
    assert_eq!(md["NAME"], "reviews-v1-abc");
    assert_eq!(md["SERVICE_ACCOUNT"], "bookinfo-reviews");
    assert_eq!(md["INSTANCE_IPS"], "10.1.2.3");
    assert_eq!(md["ENVOY_STATUS_PORT"], 15021);
    assert_eq!(md["ENVOY_PROMETHEUS_PORT"], 15090);
    assert_eq!(md["WORKLOAD_IDENTITY_SOCKET_FILE"], "socket");
    assert_eq!(md["PILOT_SAN"], json!(["istiod.istio-system.svc"]));
    assert_eq!(md["PROXY_CONFIG"]["proxyAdminPort"], 15000);
    assert_eq!(md["ISTIO_VERSION"], env!("CARGO_PKG_VERSION"));
    assert!(md.get("LABELS").is_none(), "no labels anywhere: {md}");
    // The metadata pilot-discovery will parse.
    model::proxy::NodeMetadata::from_json(&cfg.node_id, md).unwrap();
}

#[test]
fn router_with_domain_and_no_instance_ip() {
    let args = ProxyArgs {
        proxy_type: ProxyType::Router,
        domain: "istio-system.svc.cluster.local".into(),
        ..ProxyArgs::default()
    };
    let cfg = build(
        &args,
        &env(&[("INSTANCE_IP", ""), ("POD_NAMESPACE", "istio-system")]),
        &files(&[]),
    );
    assert_eq!(
        cfg.node_id,
        "router~127.0.0.1~reviews-v1-abc.istio-system~istio-system.svc.cluster.local"
    );
}

/// The seeds' table and Istio 1.7's pilot-agent: under Consul the ID is `IP.service.consul` and
/// the domain `service.consul`; POD_NAME and POD_NAMESPACE are not needed there.
#[test]
fn consul_identity_is_the_ip_in_service_consul() {
    let args = ProxyArgs {
        service_registry: ServiceRegistry::Consul,
        ..ProxyArgs::default()
    };
    let e = env(&[("POD_NAME", ""), ("POD_NAMESPACE", ""), ("INSTANCE_IP", "10.0.0.7")]);
    let cfg = build(&args, &e, &files(&[]));
    assert_eq!(cfg.node_id, "sidecar~10.0.0.7~10.0.0.7.service.consul~service.consul");
    assert_eq!(cfg.domain, "service.consul");
    assert_eq!(cfg.metadata["NAMESPACE"], "default", "Consul's services are in default");
    let proxy = model::Proxy::parse(
        &cfg.node_id,
        model::proxy::NodeMetadata::from_json(&cfg.node_id, &cfg.metadata).unwrap(),
    )
    .unwrap();
    assert_eq!(proxy.id, "10.0.0.7.service.consul");
    assert_eq!(proxy.config_namespace, "default");

    // without INSTANCE_IP, 127.0.0.1; --domain wins; POD_NAMESPACE is kept when given
    let args = ProxyArgs {
        proxy_type: ProxyType::Router,
        domain: "consul.example".into(),
        ..args
    };
    let cfg = build(&args, &env(&[("INSTANCE_IP", "")]), &files(&[]));
    assert_eq!(cfg.node_id, "router~127.0.0.1~127.0.0.1.service.consul~consul.example");
    assert_eq!(cfg.metadata["NAMESPACE"], "bookinfo");
}

#[test]
fn mock_identity_is_the_ip_and_no_domain() {
    let args = ProxyArgs {
        service_registry: ServiceRegistry::Mock,
        ..ProxyArgs::default()
    };
    let cfg = build(
        &args,
        &env(&[("POD_NAME", ""), ("INSTANCE_IP", "10.0.0.8")]),
        &files(&[]),
    );
    assert_eq!(cfg.node_id, "sidecar~10.0.0.8~10.0.0.8~");
    assert_eq!(cfg.domain, "");
}

#[test]
fn istio_meta_variables_become_node_metadata() {
    let e = env(&[
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_MESH_ID", "mesh1"),
        ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
        ("ISTIO_META_WORKLOAD_NAME", "reviews-v1"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("ISTIO_META_NAMESPACE", "spoofed"),
        ("ISTIO_METAJSON_ANNOTATIONS", r#"{"sidecar.istio.io/inject": "true"}"#),
    ]);
    let cfg = build(&ProxyArgs::default(), &e, &files(&[]));
    let md = &cfg.metadata;
    assert_eq!(md["CLUSTER_ID"], "Kubernetes");
    assert_eq!(md["MESH_ID"], "mesh1");
    assert_eq!(md["INTERCEPTION_MODE"], "REDIRECT");
    assert_eq!(md["WORKLOAD_NAME"], "reviews-v1");
    assert_eq!(md["DNS_CAPTURE"], "true");
    assert_eq!(md["NAMESPACE"], "bookinfo", "typed fields win over ISTIO_META_*");
    assert_eq!(
        md["sidecar.istio.io/inject"], "true",
        "ISTIO_METAJSON_* merge at the top"
    );
    assert_eq!(cfg.cluster_id, "Kubernetes");
    assert!(cfg.dns.capture && cfg.dns.enabled());
    assert_eq!(
        cfg.service_cluster, "reviews-v1.bookinfo",
        "the workload name when no app label"
    );
}

#[test]
fn labels_from_env_then_the_pod_labels_file() {
    let e = env(&[(
        "ISTIO_METAJSON_LABELS",
        r#"{"app": "reviews", "version": "v0", "team": "a"}"#,
    )]);
    let cfg = build(&ProxyArgs::default(), &e, &files(&[]));
    assert_eq!(
        cfg.metadata["LABELS"],
        json!({"app": "reviews", "version": "v0", "team": "a"})
    );
    assert_eq!(cfg.metadata["STATIC_LABELS"], cfg.metadata["LABELS"]);
    assert_eq!(cfg.service_cluster, "reviews.bookinfo");

    let f = files(&[(
        POD_LABELS_PATH,
        "app=\"reviews\"\nversion=\"v1\"\npod-template-hash=\"5f9\"\ntopology.istio.io/locality=\"us-east.zone1\"\n",
    )]);
    let cfg = build(&ProxyArgs::default(), &e, &f);
    assert_eq!(
        cfg.metadata["LABELS"],
        json!({"app": "reviews", "version": "v1", "team": "a",
               "topology.istio.io/locality": "us-east.zone1", "istio-locality": "us-east/zone1"})
    );
    assert_eq!(
        (cfg.locality.region.as_str(), cfg.locality.zone.as_str()),
        ("us-east", "zone1")
    );
    assert_eq!(cfg.labels["version"], "v1");
}

#[test]
fn proxy_config_env_overrides_the_mesh_file() {
    let mesh = "defaultConfig:\n  discoveryAddress: pilot.example:15010\n  proxyAdminPort: 15100\n  \
                controlPlaneAuthPolicy: NONE\n  proxyMetadata:\n    ISTIO_META_MESH_ID: from-mesh\n    \
                ISTIO_DELTA_XDS: \"false\"\n";
    let e = env(&[(
        "PROXY_CONFIG",
        r#"{"proxyAdminPort": 15200, "concurrency": 2, "configPath": "/tmp/agent-x"}"#,
    )]);
    let cfg = build(&ProxyArgs::default(), &e, &files(&[("./etc/istio/config/mesh", mesh)]));
    assert_eq!(cfg.proxy_admin_port, 15200);
    assert_eq!(cfg.discovery_address, "pilot.example:15010");
    assert_eq!(cfg.concurrency, Some(2));
    assert!(cfg.pilot_san.is_empty(), "no SAN check without mTLS");
    assert!(!cfg.delta_xds, "proxyMetadata stands in for the injector's env");
    assert_eq!(cfg.metadata["MESH_ID"], "from-mesh");
    assert_eq!(cfg.metadata["PROXY_CONFIG"]["proxyAdminPort"], 15200);
    assert_eq!(cfg.paths.bootstrap, Path::new("/tmp/agent-x/envoy-rev.json"));
    assert_eq!(cfg.mesh_config.default_config.proxy_admin_port, 15100);
}

#[test]
fn concurrency_flag_and_cpu_limit() {
    let cfg = build(&ProxyArgs::default(), &env(&[("ISTIO_CPU_LIMIT", "3")]), &files(&[]));
    assert_eq!(cfg.concurrency, Some(3));
    let args = ProxyArgs {
        concurrency: 1,
        ..ProxyArgs::default()
    };
    let cfg = build(&args, &env(&[("ISTIO_CPU_LIMIT", "3")]), &files(&[]));
    assert_eq!(cfg.concurrency, Some(1));
    assert_eq!(cfg.metadata["PROXY_CONFIG"]["concurrency"], 1);
}

#[test]
fn socket_paths_and_headers_are_configurable() {
    let e = env(&[
        ("XDS_UDS_PATH", "/tmp/t/xds.sock"),
        ("WORKLOAD_IDENTITY_SOCKET_FILE", "spire"),
        ("XDS_HEADERS", "tenant=t1"),
    ]);
    let cfg = build(&ProxyArgs::default(), &e, &files(&[]));
    assert_eq!(cfg.paths.xds_uds, PathBuf::from("/tmp/t/xds.sock"));
    assert_eq!(
        cfg.paths.sds_uds,
        PathBuf::from("./var/run/secrets/workload-spiffe-uds/spire")
    );
    assert_eq!(cfg.metadata["WORKLOAD_IDENTITY_SOCKET_FILE"], "spire");
    assert_eq!(cfg.xds_headers.get("tenant").map(String::as_str), Some("t1"));
    let cfg = build(
        &ProxyArgs::default(),
        &env(&[("SDS_UDS_PATH", "/tmp/t/sds.sock")]),
        &files(&[]),
    );
    assert_eq!(cfg.paths.sds_uds, PathBuf::from("/tmp/t/sds.sock"));
}

#[test]
fn workload_certificate_settings() {
    let none = files(&[]);
    let cfg = build(&ProxyArgs::default(), &env(&[]), &none);
    assert_eq!(cfg.secrets.ttl, std::time::Duration::from_secs(24 * 3600));
    assert_eq!(
        (cfg.secrets.grace_period_ratio, cfg.secrets.grace_period_ratio_jitter),
        (0.5, 0.01)
    );
    let cfg = build(
        &ProxyArgs::default(),
        &env(&[
            ("SECRET_TTL", "1h"),
            ("SECRET_GRACE_PERIOD_RATIO", "0.25"),
            ("SECRET_GRACE_PERIOD_RATIO_JITTER", "0"),
        ]),
        &none,
    );
    assert_eq!(cfg.secrets.ttl, std::time::Duration::from_secs(3600));
    assert_eq!(
        (cfg.secrets.grace_period_ratio, cfg.secrets.grace_period_ratio_jitter),
        (0.25, 0.0)
    );
    assert!(error(&env(&[("SECRET_GRACE_PERIOD_RATIO", "1.5")]), &none).contains("SECRET_GRACE_PERIOD_RATIO"));
    assert!(error(&env(&[("SECRET_TTL", "soon")]), &none).contains("SECRET_TTL"));
}

#[test]
fn workload_key_kinds() {
    use crate::config::WorkloadKey;
    let none = files(&[]);
    let key = |vars: &[(&str, &str)]| build(&ProxyArgs::default(), &env(vars), &none).secrets.key;
    assert_eq!(key(&[]), WorkloadKey::EcdsaP256, "ECDSA P-256 by default here");
    assert_eq!(
        key(&[("ECC_SIGNATURE_ALGORITHM", "ECDSA"), ("ECC_CURVE", "P384")]),
        WorkloadKey::EcdsaP384
    );
    assert_eq!(key(&[("ECC_SIGNATURE_ALGORITHM", "RSA")]), WorkloadKey::Rsa(2048));
    assert_eq!(
        key(&[("ECC_SIGNATURE_ALGORITHM", "RSA"), ("WORKLOAD_RSA_KEY_SIZE", "4096")]),
        WorkloadKey::Rsa(4096)
    );
    assert!(error(&env(&[("ECC_CURVE", "P521")]), &none).contains("ECC_CURVE"));
    let small = env(&[("ECC_SIGNATURE_ALGORITHM", "RSA"), ("WORKLOAD_RSA_KEY_SIZE", "1024")]);
    assert!(error(&small, &none).contains("WORKLOAD_RSA_KEY_SIZE"));
}

#[test]
fn bad_inputs_are_clear_errors() {
    let none = files(&[]);
    type Case = (BTreeMap<String, String>, BTreeMap<PathBuf, String>, &'static str);
    let cases: Vec<Case> = vec![
        (
            env(&[("INSTANCE_IP", "10.1.2")]),
            none.clone(),
            "INSTANCE_IP=\"10.1.2\": not an IP address",
        ),
        (
            env(&[("PROXY_CONFIG", "{not: [yaml")]),
            none.clone(),
            "PROXY_CONFIG: invalid ProxyConfig",
        ),
        (
            env(&[("PROXY_CONFIG", "proxyAdminPort: -1")]),
            none.clone(),
            "PROXY_CONFIG: invalid ProxyConfig",
        ),
        (
            env(&[("XDS_HEADERS", "a=1,b")]),
            none.clone(),
            "XDS_HEADERS=\"a=1,b\": entry \"b\" is not key=value",
        ),
        (
            env(&[("POD_NAMESPACE", "")]),
            none.clone(),
            "POD_NAMESPACE: must be set",
        ),
        (
            env(&[("POD_NAME", "a~b")]),
            none.clone(),
            "POD_NAME=\"a~b\": must not contain '~'",
        ),
        (
            env(&[("ISTIO_METAJSON_LABELS", "app=x")]),
            none.clone(),
            "ISTIO_METAJSON_LABELS=\"app=x\": not a JSON object",
        ),
        (
            env(&[("ENVOY_STATUS_PORT", "15021x")]),
            none.clone(),
            "ENVOY_STATUS_PORT=\"15021x\": not a port",
        ),
        (
            env(&[("ISTIO_DELTA_XDS", "maybe")]),
            none.clone(),
            "ISTIO_DELTA_XDS=\"maybe\": not a boolean",
        ),
        (
            env(&[]),
            files(&[(POD_LABELS_PATH, "app=unquoted\n")]),
            "./etc/istio/pod/labels: line 1",
        ),
        (
            env(&[]),
            files(&[("./etc/istio/config/mesh", "outboundTrafficPolicy: {mode: SOMETIMES}")]),
            "mesh config ./etc/istio/config/mesh",
        ),
    ];
    for (e, f, want) in cases {
        let err = error(&e, &f);
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
}

#[test]
fn serializes_for_the_start_log() {
    let cfg = build(&ProxyArgs::default(), &env(&[]), &files(&[]));
    let v: serde_json::Value = serde_json::from_str(&cfg.to_json_pretty()).unwrap();
    assert_eq!(v["node_type"], "sidecar");
    assert_eq!(v["drain"]["drain_duration"], "45s");
    assert_eq!(v["instance_ips"], json!(["10.1.2.3"]));
    assert_eq!(v["paths"]["xds_uds"], "./etc/istio/proxy/XDS");
    assert_eq!(format_duration(std::time::Duration::from_millis(250)), "250ms");
    assert_eq!(format_duration(std::time::Duration::from_millis(1500)), "1.5s");
}

/// Istio's `createCitadel`: the CA is reached in plaintext exactly when its address ends in
/// `:15010`, over TLS with the mounted root (or `XDS_ROOT_CA`) otherwise; the token is always
/// Istio's path, sent when the file is there.
#[test]
fn ca_is_plaintext_exactly_on_port_15010() {
    use crate::sds::CaTls;
    let none = files(&[]);
    let ca = |pairs: &[(&str, &str)]| crate::proxy::ca_client(&build(&ProxyArgs::default(), &env(pairs), &none));

    // The README's gateway: discovery (and so the CA) on pilot-discovery's plaintext port.
    let readme = ca(&[("PROXY_CONFIG", r#"{"discoveryAddress":"127.0.0.1:15010"}"#)]);
    assert_eq!(readme.addr, "127.0.0.1:15010");
    assert_eq!(readme.tls, None);
    assert_eq!(readme.token, PathBuf::from("./var/run/secrets/tokens/istio-token"));

    // Istio's default: istiod's secure port, verified with the mounted root.
    let default = ca(&[]);
    assert_eq!(default.addr, "istiod.istio-system.svc:15012");
    assert_eq!(
        default.tls,
        Some(CaTls {
            root_cert: PathBuf::from("./var/run/secrets/istio/root-cert.pem"),
            server_name: "istiod.istio-system.svc".into(),
        })
    );

    // CA_ADDR decides, not the discovery address; any other port is TLS, as in Istio.
    let other = ca(&[
        ("PROXY_CONFIG", r#"{"discoveryAddress":"127.0.0.1:15010"}"#),
        ("CA_ADDR", "127.0.0.1:16010"),
        ("XDS_ROOT_CA", "/etc/mesh/root.pem"),
        ("ISTIOD_SAN", "pilot.example.com"),
    ]);
    assert_eq!(
        other.tls,
        Some(CaTls {
            root_cert: PathBuf::from("/etc/mesh/root.pem"),
            server_name: "pilot.example.com".into(),
        })
    );
    assert_eq!(ca(&[("CA_ADDR", "10.0.0.1:15010")]).tls, None);
}

#[test]
fn istio_gprc_maxrecvmsgsize_bounds_envoys_messages() {
    let cfg = build(
        &ProxyArgs::default(),
        &env(&[("ISTIO_GPRC_MAXRECVMSGSIZE", "33554432")]),
        &files(&[]),
    );
    assert_eq!(cfg.xds_max_recv_msg_size, 32 << 20);
    for bad in ["0", "-5", "4Mi"] {
        let err = error(&env(&[("ISTIO_GPRC_MAXRECVMSGSIZE", bad)]), &files(&[]));
        assert!(
            err.contains(&format!("ISTIO_GPRC_MAXRECVMSGSIZE={bad:?}")) && err.contains("positive integer"),
            "{bad}: {err}"
        );
    }
}
