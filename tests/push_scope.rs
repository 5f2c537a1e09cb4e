//! End-to-end: a proxy only gets pushes for changes it can see (Istio's `ProxyNeedsPush`), with
//! the real pilot-discovery and protocol-checking ADS clients as sidecars of two namespaces.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use test_support::ads::AdsClient;
use test_support::discovery::{Discovery, DiscoveryOptions};
use xds_api::type_url;

/// A push that is not coming: how long to wait to be sure (debounce is 100 ms in tests).
const QUIET: Duration = Duration::from_millis(1500);

fn service_entry(ns: &str, name: &str, export_to: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  hosts: [{name}.{ns}.svc.cluster.local]\n  exportTo: [\"{export_to}\"]\n  location: MESH_INTERNAL\n  \
         resolution: STATIC\n  ports: [{{number: 8080, name: http, protocol: HTTP}}]\n  \
         endpoints: [{{address: 10.1.0.1}}]\n"
    )
}

fn virtual_service(ns: &str, host: &str, export_to: &str, timeout: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: vs, namespace: {ns}}}\n\
         spec:\n  hosts: [{host}]\n  exportTo: [\"{export_to}\"]\n  http:\n  - timeout: {timeout}\n    \
         route: [{{destination: {{host: {host}}}}}]\n"
    )
}

fn write(dir: &Path, file: &str, yaml: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(tmp, dir.join(file))?;
    Ok(())
}

async fn sidecar(d: &Discovery, ns: &str, ip: &str) -> anyhow::Result<AdsClient> {
    labelled_sidecar(d, ns, ip, "app").await
}

async fn labelled_sidecar(d: &Discovery, ns: &str, ip: &str, app: &str) -> anyhow::Result<AdsClient> {
    let node = format!("sidecar~{ip}~{app}.{ns}~{ns}.svc.cluster.local");
    let md = json!({"NAMESPACE": ns, "LABELS": {"app": app}, "ISTIO_VERSION": "1.28.0"});
    let mut c = AdsClient::connect(d.grpc_addr, &node, md).await?;
    c.handshake(None).await?;
    Ok(c)
}

/// Receives one full push (CDS first) and ACKs every response of it.
async fn expect_full_push(c: &mut AdsClient) -> anyhow::Result<()> {
    c.expect_type(type_url::CLUSTER).await?;
    c.ack()?;
    loop {
        match tokio::time::timeout(Duration::from_millis(500), c.recv()).await {
            Ok(r) => {
                r?;
                c.ack()?;
            }
            Err(_) => return Ok(()),
        }
    }
}

#[tokio::test]
async fn only_proxies_that_see_a_change_are_pushed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = dir.path();
    write(p, "a.yaml", &service_entry("a", "svc", "."))?;
    write(p, "b.yaml", &service_entry("b", "svc", "*"))?;
    write(
        p,
        "vs.yaml",
        &virtual_service("a", "svc.a.svc.cluster.local", ".", "5s"),
    )?;
    let d = Discovery::start(p, DiscoveryOptions::default()).await?;
    let mut in_a = sidecar(&d, "a", "10.0.0.1").await?;
    let mut in_b = sidecar(&d, "b", "10.0.0.2").await?;

    // A VirtualService private to namespace a: only a's sidecar is pushed.
    write(
        p,
        "vs.yaml",
        &virtual_service("a", "svc.a.svc.cluster.local", ".", "7s"),
    )?;
    expect_full_push(&mut in_a).await.map_err(|e| e.context(d.logs()))?;
    in_b.expect_no_response(QUIET).await?;

    // A service exported everywhere: both.
    write(
        p,
        "b.yaml",
        &service_entry("b", "svc", "*")
            .replace("10.1.0.1", "10.1.0.2")
            .replace("8080", "8081"),
    )?;
    expect_full_push(&mut in_a).await?;
    expect_full_push(&mut in_b).await?;

    // The VirtualService becomes private to another namespace: a saw it before, so a is pushed
    // (and loses it); b still never saw it.
    write(
        p,
        "vs.yaml",
        &virtual_service("a", "svc.a.svc.cluster.local", "c", "7s"),
    )?;
    expect_full_push(&mut in_a).await?;
    in_b.expect_no_response(QUIET).await?;

    // Deleted: the push before had it private to c; nobody here sees it.
    std::fs::remove_file(p.join("vs.yaml"))?;
    in_a.expect_no_response(QUIET).await?;
    in_b.expect_no_response(Duration::ZERO).await?;
    assert_eq!(d.metric("pilot_total_xds_rejects").await?, 0.0);
    Ok(())
}

/// Proxies of one namespace share what they see unless a Sidecar's workload selector tells them
/// apart: then only the proxies it selects see what it imports.
#[tokio::test]
async fn a_sidecar_with_a_workload_selector_decides_what_its_proxies_are_pushed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = dir.path();
    write(p, "a.yaml", &service_entry("a", "svc", "*"))?;
    write(p, "b.yaml", &service_entry("b", "svc", "*"))?;
    write(
        p,
        "vs.yaml",
        &virtual_service("b", "svc.b.svc.cluster.local", "*", "5s"),
    )?;
    // Namespace a imports only itself, except for the `wide` workloads, which import b too.
    write(
        p,
        "sidecars.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: a}\n\
         spec:\n  egress: [{hosts: [\"./*\"]}]\n---\n\
         apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: wide, namespace: a}\n\
         spec:\n  workloadSelector: {labels: {app: wide}}\n  egress: [{hosts: [\"./*\", \"b/*\"]}]\n",
    )?;
    let d = Discovery::start(p, DiscoveryOptions::default()).await?;
    let mut narrow = labelled_sidecar(&d, "a", "10.0.0.1", "narrow").await?;
    let mut other_narrow = labelled_sidecar(&d, "a", "10.0.0.2", "other").await?;
    let mut wide = labelled_sidecar(&d, "a", "10.0.0.3", "wide").await?;

    // b's VirtualService: only the proxy whose Sidecar imports b.
    write(
        p,
        "vs.yaml",
        &virtual_service("b", "svc.b.svc.cluster.local", "*", "7s"),
    )?;
    expect_full_push(&mut wide).await.map_err(|e| e.context(d.logs()))?;
    narrow.expect_no_response(QUIET).await?;
    other_narrow.expect_no_response(Duration::ZERO).await?;

    // a's own service: every proxy of a, whatever its labels.
    write(
        p,
        "a.yaml",
        &service_entry("a", "svc", "*")
            .replace("10.1.0.1", "10.1.0.2")
            .replace("8080", "8081"),
    )?;
    for c in [&mut narrow, &mut other_narrow, &mut wide] {
        expect_full_push(c).await.map_err(|e| e.context(d.logs()))?;
    }
    assert_eq!(d.metric("pilot_total_xds_rejects").await?, 0.0);
    Ok(())
}
