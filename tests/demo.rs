//! The demo mesh of the README: pilot-discovery on `examples/bookinfo`, a real Envoy as the Istio
//! ingress gateway, and loopback backends at the addresses the example's WorkloadEntries name.
//! Sends a few requests through the gateway and shows where they went. `--keep` keeps it running.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use test_support::backend::{Backend, BackendOptions, HttpResponse, http_get};
use test_support::bootstrap::AdsBootstrap;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::{Envoy, workspace_root};

const GATEWAY: &str = "http://127.0.0.1:18080";
const HOST: &str = "bookinfo.example.com";

async fn get(path: &str, headers: &[(&str, &str)]) -> anyhow::Result<HttpResponse> {
    let mut h = vec![("host", HOST)];
    h.extend_from_slice(headers);
    http_get(&format!("{GATEWAY}{path}"), &h).await
}

fn backend_of(r: &HttpResponse) -> String {
    r.json()
        .ok()
        .and_then(|v| v["backend"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("HTTP {}", r.status))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let keep = std::env::args().any(|a| a == "--keep");
    // --kubernetes: the same mesh described the Kubernetes way (Services, Pods, EndpointSlices).
    let example = if std::env::args().any(|a| a == "--kubernetes") {
        "examples/bookinfo-k8s"
    } else {
        "examples/bookinfo"
    };
    let root = workspace_root()?;
    let config_dir = root.join(example);
    let mut backends = Vec::new();
    for (name, port) in [("reviews-v1", 19081), ("reviews-v2", 19082), ("ratings", 19083)] {
        let opts = BackendOptions {
            port: Some(port),
            ..Default::default()
        };
        backends.push(Backend::start_with(name, opts).await?);
        println!("backend {name:<10} on 127.0.0.1:{port}");
    }
    let discovery = Discovery::start(&config_dir, DiscoveryOptions::default()).await?;
    println!(
        "pilot-discovery on {} (xDS {}, debug http://{})",
        config_dir.display(),
        discovery.grpc_addr,
        discovery.http_addr
    );

    let node_id = "router~127.0.0.1~istio-ingressgateway-demo.istio-system~istio-system.svc.cluster.local";
    let metadata =
        json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "CLUSTER_ID": "Kubernetes"});
    let bootstrap = AdsBootstrap::new(
        node_id,
        "istio-ingressgateway.istio-system",
        metadata,
        discovery.grpc_addr,
    )
    .build();
    let out_dir = root.join("target/demo");
    std::fs::create_dir_all(&out_dir)?;
    let bootstrap_path = out_dir.join("gateway-bootstrap.json");
    std::fs::write(&bootstrap_path, serde_json::to_string_pretty(&bootstrap)?)?;
    let envoy = Envoy::start(bootstrap).await?;
    envoy.wait_ready(Duration::from_secs(20)).await?;
    println!(
        "envoy gateway: listener {GATEWAY}, admin {} (bootstrap: {})",
        envoy.admin_url(),
        bootstrap_path.display()
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    while get("/reviews", &[]).await.map(|r| r.status != 200).unwrap_or(true) {
        if Instant::now() > deadline {
            bail!("the gateway never routed /reviews:\n{}", envoy.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!("\n$ for i in $(seq 20); do curl -s -H 'host: {HOST}' {GATEWAY}/reviews; done   # 80/20 split");
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..20 {
        *counts.entry(backend_of(&get("/reviews", &[]).await?)).or_default() += 1;
    }
    println!("  {counts:?}");
    println!("$ curl -H 'host: {HOST}' -H 'end-user: jason' {GATEWAY}/reviews   # header match");
    println!("  -> {}", backend_of(&get("/reviews", &[("end-user", "jason")]).await?));
    let r = get("/ratings/7", &[]).await?;
    let path = r
        .json()
        .ok()
        .and_then(|v| v["path"].as_str().map(str::to_owned))
        .unwrap_or_default();
    println!("$ curl -H 'host: {HOST}' {GATEWAY}/ratings/7   # rewrite to /v1/ratings");
    println!("  -> {} saw path {path}", backend_of(&r));
    let r = get("/productpage-old", &[]).await?;
    println!("$ curl -i -H 'host: {HOST}' {GATEWAY}/productpage-old   # redirect");
    println!("  -> {} location: {}", r.status, r.header("location").unwrap_or("-"));
    let rejected = envoy.update_rejected_total().await?;
    println!(
        "\nEnvoy update_rejected: {rejected}; try: curl http://{}/debug/syncz",
        discovery.http_addr
    );
    if rejected != 0 {
        bail!("Envoy rejected config:\n{}", envoy.log_tail());
    }
    if keep {
        println!(
            "running; edit {} and watch routing change. Ctrl-C to stop.",
            config_dir.display()
        );
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    }
    drop(envoy);
    drop(discovery);
    drop(backends);
    Ok(())
}
