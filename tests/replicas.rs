//! Two pilot-discovery replicas on one cluster (the fake API server), as istiod's Deployment
//! runs them: both sign with the one root of the `istio-ca-secret` Secret, so a workload
//! certificate of either verifies with the root of the other, and the `istio-ca-root-cert`
//! ConfigMaps they both keep are written once, not fought over.
//!
//! Before the shared root each replica made its own in its `ROOT_CA_DIR` and the two overwrote
//! every namespace's ConfigMap in turn (34 writes in 2 s in the probe that found it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::FakeApiServer;
use test_support::ports::free_port;

async fn replica(api: &FakeApiServer, work: &Path, name: &str) -> anyhow::Result<(Discovery, std::path::PathBuf, u16)> {
    let dir = work.join(name);
    std::fs::create_dir_all(dir.join("config"))?;
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let secure = free_port();
    let ca_dir = dir.join("cacerts");
    let opts = DiscoveryOptions {
        args: vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--secureGrpcAddr".into(),
            format!("127.0.0.1:{secure}"),
        ],
        env: vec![("ROOT_CA_DIR".into(), ca_dir.display().to_string())],
        ..Default::default()
    };
    Ok((Discovery::start(&dir.join("config"), opts).await?, ca_dir, secure))
}

/// `openssl s_client` verifying the server on `port` with `root`: true if verification passed.
async fn verifies(port: u16, root: &Path) -> bool {
    let out = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "istiod.istio-system.svc",
        ])
        .args(["-verify_return_error", "-CAfile"])
        .arg(root)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("openssl is needed for this test");
    String::from_utf8_lossy(&out.stdout).contains("Verify return code: 0 (ok)")
}

fn config_map_writes(api: &FakeApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| (r.starts_with("PUT ") || r.starts_with("POST ")) && r.contains("/configmaps"))
        .count()
}

#[tokio::test]
async fn two_replicas_share_one_root_and_write_the_root_configmaps_once() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    let namespaces = ["default", "bookinfo", "istio-system"];
    for ns in namespaces {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    }
    let work = tempfile::tempdir()?;
    let ((a, a_dir, a_port), (b, b_dir, b_port)) =
        tokio::try_join!(replica(&api, work.path(), "a"), replica(&api, work.path(), "b"),)?;

    // One root, mirrored into each replica's ROOT_CA_DIR, in the Secret and in the ConfigMaps.
    let root_a = std::fs::read_to_string(a_dir.join("root-cert.pem"))?;
    let root_b = std::fs::read_to_string(b_dir.join("root-cert.pem"))?;
    assert_eq!(root_a, root_b, "both replicas sign with one root");
    let secrets = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST ") && r.contains("/secrets"))
        .count();
    assert!(
        (1..=2).contains(&secrets),
        "istio-ca-secret created once (a second try gets 409): {secrets}"
    );
    // Each replica's serving certificate verifies with the other's root.
    assert!(
        verifies(b_port, &a_dir.join("root-cert.pem")).await,
        "replica b with a's root"
    );
    assert!(
        verifies(a_port, &b_dir.join("root-cert.pem")).await,
        "replica a with b's root"
    );

    // The ConfigMaps settle: each namespace's written by one replica, then left alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = config_map_writes(&api);
    assert!(
        settled <= 2 * namespaces.len(),
        "{settled} ConfigMap writes for {} namespaces",
        namespaces.len()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        config_map_writes(&api),
        settled,
        "the replicas keep rewriting the root ConfigMaps"
    );
    for d in [&a, &b] {
        let lines = d.logs().lines().filter(|l| l.contains("istio-ca-root-cert")).count();
        assert!(lines <= 2 * namespaces.len(), "{lines} root ConfigMap log lines");
    }
    Ok(())
}

/// As istiod's Deployment, which mounts no mesh config file: the `istio` ConfigMap's `mesh` is the
/// mesh config (here its trust domain names the CA's new root); a later change is applied live,
/// but for fields read only at start (the trust domain), which are named in a warning and
/// counted, as is a change that does not parse.
#[tokio::test]
async fn the_mesh_config_comes_from_the_istio_configmap() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    let configmap = |mesh: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": mesh, "meshNetworks": "networks: {}"}})
    };
    api.apply(configmap("trustDomain: example.org\n"))?;
    let work = tempfile::tempdir()?;
    let (d, ca_dir, _) = replica(&api, work.path(), "a").await?;
    let out = tokio::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(ca_dir.join("root-cert.pem"))
        .output()
        .await
        .expect("openssl is needed for this test");
    let subject = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        subject.contains("O = example.org"),
        "the root is for the ConfigMap's trust domain: {subject}"
    );

    api.apply(configmap("trustDomain: example.com\n"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.metric("pilot_mesh_config_changes_ignored").await? < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the change not seen: {}",
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        d.logs().contains("mesh config fields read only at start changed"),
        "{}",
        d.logs()
    );
    let (_, running) = d.get("/debug/mesh", false).await?;
    assert!(
        running.contains("\"trustDomain\":\"example.org\""),
        "the CA's trust domain is kept: {running}"
    );

    // A change of what pushes read is applied live, without a restart, and counted nowhere.
    api.apply(configmap("trustDomain: example.org\nrootNamespace: mesh-root\n"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, running) = d.get("/debug/mesh", false).await?;
        if running.contains("\"rootNamespace\":\"mesh-root\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the live change applied: {running}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(d.metric("pilot_mesh_config_changes_ignored").await?, 1.0);
    // A mesh config that does not parse keeps the last valid one.
    api.apply(configmap("rootNamespace: [not, a, string]\n"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.metric("pilot_mesh_config_changes_ignored").await? < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the invalid change not seen: {}",
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, running) = d.get("/debug/mesh", false).await?;
    assert!(running.contains("\"rootNamespace\":\"mesh-root\""), "{running}");
    Ok(())
}
