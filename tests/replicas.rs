//! pilot-discovery replicas on one cluster (the fake API server), as istiod's Deployment runs
//! them: all sign with the one root of the `istio-ca-secret` Secret, so a workload certificate of
//! either verifies with the root of the other, and only the holder of each controller's lock
//! (Istio's ConfigMap locks and names) writes: the `istio-ca-root-cert` ConfigMaps once each, the webhook
//! configuration; a killed leader is replaced within the lease duration.
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

/// How long the replicas' locks last here (istiod's 30 s would make the takeover test slow).
const LEASE_SECS: u64 = 3;

/// A replica named `name` (its `POD_NAME`, and the bearer token of its requests to the API
/// server, so that the fake's request log tells the replicas apart), serving TLS and the
/// webhooks, with `LEASE_SECS` leader election locks.
async fn replica(api: &FakeApiServer, work: &Path, name: &str) -> anyhow::Result<(Discovery, std::path::PathBuf, u16)> {
    let dir = work.join(name);
    std::fs::create_dir_all(dir.join("config"))?;
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig_with_token(&kubeconfig, name)?;
    let secure = free_port();
    let ca_dir = dir.join("cacerts");
    let opts = DiscoveryOptions {
        args: vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--secureGrpcAddr".into(),
            format!("127.0.0.1:{secure}"),
            "--httpsAddr".into(),
            format!("127.0.0.1:{}", free_port()),
        ],
        env: vec![
            ("ROOT_CA_DIR".into(), ca_dir.display().to_string()),
            ("POD_NAME".into(), name.into()),
            ("PILOT_LEADER_ELECTION_LEASE_DURATION".into(), format!("{LEASE_SECS}s")),
        ],
        ..Default::default()
    };
    Ok((Discovery::start(&dir.join("config"), opts).await?, ca_dir, secure))
}

/// The ValidatingWebhookConfiguration of Istio's rendered default profile.
fn istio_validator() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("Istio's rendered install {} is needed ({e}): ../shared", path.display()));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("a ValidatingWebhookConfiguration in the rendered install")
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

/// The writes (create, update, patch, delete; dry runs are not writes) a replica made, as
/// `METHOD resource` (`POST configmaps`), from the fake API server's log, but for those of the
/// leader election locks (the ConfigMaps named `*-election`, renewed every retry period).
fn writes(api: &FakeApiServer, replica: &str) -> Vec<String> {
    api.writes_by(replica)
        .iter()
        .filter_map(|w| {
            let (method, path) = w.split_once(' ')?;
            let segs: Vec<&str> = path.split('/').collect();
            let (plural, name) = (segs.get(segs.len().checked_sub(2)?)?, segs.last()?);
            (!name.ends_with("-election")).then(|| format!("{method} {plural}"))
        })
        .collect()
}

/// The writes of `replica` to `resource` (`configmaps`).
fn writes_of(api: &FakeApiServer, replica: &str, resource: &str) -> usize {
    writes(api, replica)
        .iter()
        .filter(|w| w.ends_with(&format!(" {resource}")))
        .count()
}

/// The writes of `istio-ca-root-cert` in `namespace`, by anyone.
fn config_map_writes_in(api: &FakeApiServer, replicas: &[&str], namespace: &str) -> usize {
    let path = format!("/namespaces/{namespace}/configmaps/istio-ca-root-cert");
    replicas
        .iter()
        .flat_map(|r| api.writes_by(r))
        .filter(|w| w.starts_with("PUT ") || w.starts_with("POST "))
        .filter(|w| w.ends_with(&path))
        .count()
}

/// Which of `replicas` holds the lock of `lease` now, by their `leader_election_master_status`.
async fn holders(replicas: &[(&str, &Discovery)], lease: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, d) in replicas {
        if d.metric(&format!("leader_election_master_status{{name=\"{lease}\"}}"))
            .await?
            == 1.0
        {
            out.push((*name).to_owned());
        }
    }
    Ok(out)
}

/// Waits until exactly one of `replicas` holds `lease`, and names it.
async fn one_holder(replicas: &[(&str, &Discovery)], lease: &str) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let h = holders(replicas, lease).await?;
        anyhow::ensure!(h.len() <= 1, "{lease} held by {h:?} at once");
        if let [one] = h.as_slice() {
            return Ok(one.clone());
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "no holder of {lease} within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The root in `namespace`'s `istio-ca-root-cert`, read from the API server.
async fn root_in(api: &FakeApiServer, namespace: &str) -> Option<String> {
    let url = format!(
        "{}/api/v1/namespaces/{namespace}/configmaps/istio-ca-root-cert",
        api.url()
    );
    let cm: serde_json::Value = reqwest::get(url).await.ok()?.json().await.ok()?;
    cm.pointer("/data/root-cert.pem")?.as_str().map(str::to_owned)
}

const NAMESPACES: &str = "istio-namespace-controller-election";
const VALIDATION: &str = "istio-validation-controller-election";

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

    // Only the holder of istio-namespace-controller-election writes the ConfigMaps: once each,
    // then leaves them alone. The other writes only its lock (and tries to create the CA Secret).
    let replicas = [("a", &a), ("b", &b)];
    let leader = one_holder(&replicas, NAMESPACES).await?;
    let other = if leader == "a" { "b" } else { "a" };
    tokio::time::sleep(Duration::from_secs(2)).await;
    for ns in namespaces {
        assert_eq!(
            config_map_writes_in(&api, &["a", "b", "c"], ns),
            1,
            "istio-ca-root-cert of {ns} written once"
        );
    }
    assert_eq!(writes_of(&api, &leader, "configmaps"), namespaces.len());
    assert!(
        writes(&api, other).iter().all(|w| w == "POST secrets"),
        "the replica that is not the leader wrote {:?}",
        writes(&api, other)
    );
    for d in [&a, &b] {
        let lines = d.logs().lines().filter(|l| l.contains("istio-ca-root-cert")).count();
        assert!(lines <= namespaces.len(), "{lines} root ConfigMap log lines");
    }
    Ok(())
}

/// Three replicas: exactly one holds each lock and only it writes what that controller owns
/// (the root ConfigMaps, the webhook configuration). The leader is killed (SIGKILL: it cannot
/// give its lock up); meanwhile a namespace appears and a ConfigMap is deleted; another replica
/// takes over within the lease duration and writes exactly what changed: no ConfigMap is written
/// twice, none is lost.
#[tokio::test]
async fn three_replicas_one_writer_and_a_killed_leader_is_replaced_within_the_lease_duration() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    for ns in ["default", "bookinfo", "istio-system"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    }
    api.apply(istio_validator())?;
    let work = tempfile::tempdir()?;
    let (a, b, c) = tokio::try_join!(
        replica(&api, work.path(), "a"),
        replica(&api, work.path(), "b"),
        replica(&api, work.path(), "c"),
    )?;
    let mut running: Vec<(&str, Discovery)> = vec![("a", a.0), ("b", b.0), ("c", c.0)];
    let refs: Vec<(&str, &Discovery)> = running.iter().map(|(n, d)| (*n, d)).collect();
    let ns_leader = one_holder(&refs, NAMESPACES).await?;
    let webhook_leader = one_holder(&refs, VALIDATION).await?;
    // The webhook configuration gets the mesh root from its controller's holder.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while writes_of(&api, &webhook_leader, "validatingwebhookconfigurations") == 0 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the webhook configuration not patched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(LEASE_SECS)).await;
    for (name, _) in &refs {
        let w = writes(&api, name);
        let owned = |resource: &str| w.iter().filter(|x| x.ends_with(&format!(" {resource}"))).count();
        if *name != ns_leader.as_str() {
            assert_eq!(
                owned("configmaps"),
                0,
                "{name} is not the leader and wrote ConfigMaps: {w:?}"
            );
        }
        if *name != webhook_leader.as_str() {
            assert_eq!(
                owned("validatingwebhookconfigurations"),
                0,
                "{name} patched the webhook: {w:?}"
            );
        }
    }
    assert_eq!(writes_of(&api, &ns_leader, "configmaps"), 3);
    drop(refs);

    // SIGKILL the ConfigMaps' writer; meanwhile a namespace appears and a ConfigMap goes.
    let i = running.iter().position(|(n, _)| *n == ns_leader).unwrap_or_default();
    let (_, mut killed) = running.remove(i);
    killed.kill().await?;
    let killed_at = std::time::Instant::now();
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}))?;
    api.delete(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "bookinfo"}}))?;
    let root = root_in(&api, "default").await.expect("the root in default");
    loop {
        let late = root_in(&api, "late").await;
        let bookinfo = root_in(&api, "bookinfo").await;
        if late.is_some() && bookinfo.is_some() {
            assert_eq!(
                (late.as_deref(), bookinfo.as_deref()),
                (Some(root.as_str()), Some(root.as_str()))
            );
            break;
        }
        anyhow::ensure!(
            killed_at.elapsed() < Duration::from_secs(LEASE_SECS + 3),
            "no replica took over within {}s of the kill",
            LEASE_SECS + 3
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took_over = killed_at.elapsed();
    eprintln!("took over {took_over:?} after the leader was killed (lease {LEASE_SECS}s)");
    let refs: Vec<(&str, &Discovery)> = running.iter().map(|(n, d)| (*n, d)).collect();
    let new_leader = one_holder(&refs, NAMESPACES).await?;
    assert_ne!(new_leader, ns_leader);
    one_holder(&refs, VALIDATION).await?;
    tokio::time::sleep(Duration::from_secs(LEASE_SECS)).await;
    // Each ConfigMap written once, and the deleted one once more: none twice, none lost.
    for (ns, n) in [("default", 1), ("istio-system", 1), ("bookinfo", 2), ("late", 1)] {
        assert_eq!(
            config_map_writes_in(&api, &["a", "b", "c"], ns),
            n,
            "writes of istio-ca-root-cert in {ns}"
        );
    }
    assert_eq!(
        writes_of(&api, &new_leader, "configmaps"),
        2,
        "the new leader wrote what changed"
    );
    assert!(
        took_over <= Duration::from_secs(LEASE_SECS + 2),
        "taken over after {took_over:?}"
    );
    for (name, d) in &refs {
        assert_eq!(d.metric("pilot_leader_election_record_invalid").await?, 0.0, "{name}");
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

/// meshNetworks comes from the same ConfigMap (its `meshNetworks` key) and is followed live:
/// `/debug/networkz` lists the gateways it names by address, as istiod's; a change that does not
/// validate (Istio's `ValidateMeshNetworks`) is counted and the last valid one stays.
#[tokio::test]
async fn mesh_networks_come_from_the_istio_configmap_and_are_followed() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    let configmap = |networks: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": "", "meshNetworks": networks}})
    };
    api.apply(configmap(
        "networks:\n  network1:\n    endpoints:\n    - fromRegistry: Kubernetes\n    gateways:\n    - address: 192.168.100.1\n      port: 15443\n",
    ))?;
    let work = tempfile::tempdir()?;
    let (d, _, _) = replica(&api, work.path(), "a").await?;
    let networkz = || async {
        let (_, body) = d.get("/debug/networkz", false).await?;
        anyhow::Ok(serde_json::from_str::<serde_json::Value>(&body)?)
    };
    assert_eq!(
        networkz().await?,
        json!([{"Network": "network1", "Cluster": "", "Addr": "192.168.100.1", "Port": 15443, "HBONEPort": 0,
            "ServiceAccount": {"Namespace": "", "Name": ""}}])
    );
    api.apply(configmap(
        "networks:\n  network2:\n    gateways:\n    - address: 10.9.0.1\n      port: 443\n    - registryServiceName: eastwest.istio-system.svc.cluster.local\n      port: 15443\n",
    ))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while networkz().await?[0]["Network"] != "network2" {
        assert!(
            std::time::Instant::now() < deadline,
            "the change not followed: {}",
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(networkz().await?.as_array().map(Vec::len), Some(1));
    // Invalid: a CIDR that is none.
    api.apply(configmap(
        "networks:\n  network3:\n    endpoints:\n    - fromCidr: 10.0.0.0/40\n",
    ))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while d.metric("pilot_mesh_config_changes_ignored").await? < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the invalid change not counted: {}",
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        d.logs().contains("10.0.0.0/40 is not a valid CIDR block"),
        "{}",
        d.logs()
    );
    assert_eq!(networkz().await?[0]["Addr"], "10.9.0.1", "the last valid networks stay");
    Ok(())
}
