//! End-to-end: Kubernetes Ingress and the Istio kinds not yet supported, from the fake API server
//! (objects created with `kubectl`), served by a real pilot-discovery to a real Envoy gateway.
//! The README's Ingress example (class `istio`, a host, an Exact and a Prefix path, one backend by
//! port name) routes real requests to two loopback backends; an Ingress of another class is
//! ignored; deleting the Ingress takes its routes away; an EnvoyFilter and a Telemetry are listed
//! in `/debug/config_errors` as not yet supported, and so is an Ingress path whose port name does
//! not resolve (as a warning: the rest of that Ingress is served, on the same port 80).
//! pilot-discovery runs with the README's ClusterRole, which the fake API server enforces.
//!
//! Istio's Ingress gateway listens on port 80 (Gateway servers bind their own port here; see
//! generators' `merged_gateway.rs`): the test needs to bind it (root, or
//! `net.ipv4.ip_unprivileged_port_start` <= 80) and fails saying so otherwise.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{Ads, start_gateway_envoy};
use serde_json::{Value, json};
use test_support::backend::{Backend, http_get};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::{FakeApiServer, kubectl};

const HOST: &str = "bookinfo.example.com";

/// The README's YAML example that contains `kind`, as written.
fn readme_yaml(kind: &str) -> anyhow::Result<String> {
    let root = test_support::envoy::workspace_root()?;
    let readme = std::fs::read_to_string(root.join("README.md"))?;
    readme
        .split("```yaml\n")
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains(&format!("kind: {kind}\n")))
        .map(str::to_owned)
        .with_context(|| format!("README.md has no {kind} example"))
}

/// A Service `name` in `bookinfo` (port 9080 named `http`) and its EndpointSlice at `backend`.
fn service(name: &str, backend: &Backend) -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "bookinfo"},
            "spec": {"clusterIP": "10.96.0.30", "selector": {"app": name}, "ports": [{"name": "http", "port": 9080}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "bookinfo", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": backend.port(), "protocol": "TCP"}]}),
    ]
}

/// Istio kinds pilot-discovery keeps but does not act on, an Ingress of another class, and one
/// of class `istio` (by annotation) with a backend whose port name the Service does not have.
const OTHERS: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua, namespace: bookinfo}
spec:
  configPatches: []
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: logs, namespace: bookinfo}
spec:
  accessLogging: [{providers: [{name: envoy}]}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: other, namespace: bookinfo}
spec:
  ingressClassName: nginx
  rules:
  - host: other.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend: {service: {name: productpage, port: {number: 9080}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: half
  namespace: bookinfo
  annotations: {kubernetes.io/ingress.class: istio}
spec:
  rules:
  - host: half.example.com
    http:
      paths:
      - path: /grpc
        pathType: Prefix
        backend: {service: {name: reviews, port: {name: grpc}}}
      - path: /http
        pathType: Prefix
        backend: {service: {name: reviews, port: {name: http}}}
"#;

/// Who answers `path` for `host` on the gateway's port 80: the backend's name, else the status.
async fn who(host: &str, path: &str) -> String {
    match http_get(&format!("http://127.0.0.1:80{path}"), &[("host", host)]).await {
        Ok(r) if r.status == 200 => r
            .json()
            .ok()
            .and_then(|v| v["backend"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "200 without a backend".into()),
        Ok(r) => r.status.to_string(),
        Err(_) => "no answer".into(),
    }
}

/// Polls until `host` + `path` is answered by `want` 3 times in a row, within 20 s.
async fn routed(host: &str, path: &str, want: &str, discovery: &Discovery) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut in_a_row = 0;
    loop {
        let got = who(host, path).await;
        in_a_row = if got == want { in_a_row + 1 } else { 0 };
        if in_a_row == 3 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{host}{path}: wanted {want}, got {got} (within 20 s)\n{}",
                discovery.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Port 80 is free and this process may bind it.
fn require_port_80() {
    if let Err(e) = std::net::TcpListener::bind("0.0.0.0:80") {
        panic!(
            "the Ingress test needs port 80 for the gateway's listener: {e} (run as root, or set \
             net.ipv4.ip_unprivileged_port_start=80; is another gateway running?)"
        );
    }
}

#[tokio::test]
async fn an_istio_ingress_routes_through_a_real_gateway_and_other_kinds_are_reported() -> anyhow::Result<()> {
    require_port_80();
    let productpage = Backend::start("productpage").await?;
    let reviews = Backend::start("reviews").await?;
    let api = FakeApiServer::start().await?;
    for o in service("productpage", &productpage)
        .into_iter()
        .chain(service("reviews", &reviews))
    {
        api.apply(o)?;
    }
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let create = |name: &str, yaml: &str| -> anyhow::Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml)?;
        Ok(path)
    };
    let ingress = create("ingress.yaml", &readme_yaml("Ingress")?)?;
    let others = create("others.yaml", OTHERS)?;
    for file in [&ingress, &others] {
        let out = kubectl(&kubeconfig, &["create", "-f", &file.display().to_string()]).await?;
        assert!(out.contains("created"), "{out}");
    }

    // pilot-discovery runs as a service account with the README's ClusterRole.
    let restricted = dir.path().join("pilot-discovery.kubeconfig");
    api.write_kubeconfig_with_token(&restricted, "pilot-discovery")?;
    api.bind_cluster_role("pilot-discovery", &readme_yaml("ClusterRole")?)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), restricted.display().to_string()],
        env: vec![("PILOT_DEBOUNCE_AFTER".into(), "10ms".into())],
        ..Default::default()
    };
    let discovery = Discovery::start(Path::new(""), opts).await?;
    let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;

    // Exact /productpage; Prefix /reviews by path segment, its port resolved by name.
    routed(HOST, "/productpage", "productpage", &discovery).await?;
    routed(HOST, "/reviews", "reviews", &discovery).await?;
    routed(HOST, "/reviews/1", "reviews", &discovery).await?;
    assert_eq!(who(HOST, "/reviewsx").await, "404");
    assert_eq!(who(HOST, "/productpage/1").await, "404");
    // The Ingress of class nginx is not served.
    assert_eq!(who("other.example.com", "/").await, "404");
    // The path whose port does not resolve is not served; the rest of its Ingress is.
    routed("half.example.com", "/http", "reviews", &discovery).await?;
    assert_eq!(who("half.example.com", "/grpc").await, "404");

    let (_, configz) = discovery.get("/debug/configz", false).await?;
    let configz: Value = serde_json::from_str(&configz)?;
    let names: Vec<String> = configz
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {}/{}",
                c["kind"].as_str().unwrap_or(""),
                c["metadata"]["namespace"].as_str().unwrap_or(""),
                c["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    for made in [
        "Gateway istio-system/bookinfo-istio-autogenerated-k8s-ingress-bookinfo",
        "VirtualService bookinfo/bookinfo-example-com-bookinfo-istio-autogenerated-k8s-ingress",
    ] {
        assert!(names.iter().any(|n| n == made), "{made} in {names:#?}");
    }
    assert!(!names.iter().any(|n| n.contains("other")), "{names:#?}");

    let (_, errors) = discovery.get("/debug/config_errors", false).await?;
    let errors: Value = serde_json::from_str(&errors)?;
    for (resource, reason) in [
        ("EnvoyFilter bookinfo/lua", "kind not yet supported"),
        ("Telemetry bookinfo/logs", "kind not yet supported"),
        (
            "Ingress bookinfo/half",
            "Service bookinfo/reviews has no port named \"grpc\"",
        ),
    ] {
        let entry = errors["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["resource"] == resource)
            .with_context(|| format!("{resource} is not in /debug/config_errors: {errors}"))?;
        assert_eq!(entry["level"], "warning", "{entry}");
        assert!(entry["reason"].as_str().is_some_and(|r| r.contains(reason)), "{entry}");
    }

    // Deleting the Ingress through the API takes its routes away (the other Ingress of class
    // istio keeps port 80).
    kubectl(&kubeconfig, &["delete", "ingress", "bookinfo", "-n", "bookinfo"]).await?;
    routed(HOST, "/productpage", "404", &discovery).await?;
    routed("half.example.com", "/http", "reviews", &discovery).await?;

    assert_eq!(
        api.forbidden(),
        Vec::<String>::new(),
        "the README's ClusterRole does not allow what pilot-discovery asked"
    );
    assert_eq!(
        envoy.update_rejected_total().await?,
        0,
        "Envoy NACKed:\n{}",
        envoy.log_tail()
    );
    assert_eq!(discovery.metric("pilot_total_xds_rejects").await?, 0.0);
    Ok(())
}
