//! End-to-end multicluster (issue 31): pilot-discovery reads its config cluster (a fake API
//! server) and, from a remote secret created there with kubectl as users do, a second cluster (a
//! second fake API server). A real Envoy gateway in cluster 1 reaches the Pods of cluster 2;
//! scaling in cluster 2 moves the traffic; deleting the secret takes cluster 2's endpoints away.

mod common;

use common::{Ads, answer, answered_by, gateway_yaml, reviews_virtual_service, start_gateway_envoy};
use serde_json::{Value, json};
use test_support::backend::Backend;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::{FakeApiServer, kubectl};
use test_support::ports::free_port;

fn slice(name: &str, port: u16) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}]})
}

#[tokio::test]
async fn a_gateway_in_cluster_1_reaches_the_pods_of_cluster_2_through_a_remote_secret() -> anyhow::Result<()> {
    let v1 = Backend::start("reviews-v1").await?;
    let v2 = Backend::start("reviews-v2").await?;
    let config_cluster = FakeApiServer::start().await?;
    config_cluster.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    // Cluster 2 has the reviews Service and its Pods; cluster 1 has neither.
    let cluster2 = FakeApiServer::start().await?;
    cluster2.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 9080}]}}),
    )?;
    cluster2.apply(slice("reviews-v1", v1.addr().port()))?;

    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config");
    std::fs::create_dir(&config)?;
    let gateway = free_port();
    std::fs::write(config.join("gateway.yaml"), gateway_yaml(gateway))?;
    std::fs::write(config.join("virtual-service.yaml"), reviews_virtual_service())?;
    let kubeconfig = dir.path().join("kubeconfig");
    config_cluster.write_kubeconfig(&kubeconfig)?;
    let remote_kubeconfig = dir.path().join("cluster-2");
    cluster2.write_kubeconfig(&remote_kubeconfig)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
        env: vec![
            ("PILOT_DEBOUNCE_AFTER".into(), "10ms".into()),
            ("POD_NAMESPACE".into(), "istio-system".into()),
        ],
        ..Default::default()
    };
    let discovery = Discovery::start(&config, opts).await?;
    let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
    assert_ne!(
        answer(gateway).await,
        "reviews-v1",
        "no cluster has the reviews Pods yet"
    );

    // The remote secret, as `istioctl create-remote-secret | kubectl apply -f -` makes it: a
    // Secret whose data key is the cluster ID and value its kubeconfig, labelled for istiod.
    let remote = remote_kubeconfig.display().to_string();
    let secret = kubectl(
        &kubeconfig,
        &[
            "-n",
            "istio-system",
            "create",
            "secret",
            "generic",
            "istio-remote-secret-cluster-2",
            &format!("--from-file=cluster-2={remote}"),
            "--dry-run=client",
            "-o",
            "json",
        ],
    )
    .await?;
    let mut secret: Value = serde_json::from_str(&secret)?;
    secret["metadata"]["labels"] = json!({"istio/multiCluster": "true"});
    let file = dir.path().join("remote-secret.json");
    std::fs::write(&file, secret.to_string())?;
    kubectl(&kubeconfig, &["apply", "-f", &file.display().to_string()]).await?;
    answered_by(gateway, "reviews-v1", &discovery).await?;

    let (_, clusterz) = discovery.get("/debug/clusterz", false).await?;
    let clusters: Value = serde_json::from_str(&clusterz)?;
    assert_eq!(
        clusters,
        json!([{"id": "Kubernetes", "secretName": "", "syncStatus": "synced"},
               {"id": "cluster-2", "secretName": "istio-system/istio-remote-secret-cluster-2", "syncStatus": "synced"}])
    );
    let (_, metrics) = discovery.get("/metrics", true).await?;
    assert!(
        metrics.contains("istiod_managed_clusters{cluster_type=\"remote\"} 1"),
        "{metrics}"
    );
    let (_, shards) = discovery.get("/debug/endpointShardz", false).await?;
    assert!(shards.contains("Kubernetes/cluster-2"), "{shards}");

    // Scaling in cluster 2 moves the traffic.
    cluster2.apply(slice("reviews-v2", v2.addr().port()))?;
    cluster2.delete(&slice("reviews-v1", 0))?;
    answered_by(gateway, "reviews-v2", &discovery).await?;

    // Deleting the secret takes cluster 2 away: nothing serves reviews any more.
    kubectl(
        &kubeconfig,
        &[
            "-n",
            "istio-system",
            "delete",
            "secret",
            "istio-remote-secret-cluster-2",
        ],
    )
    .await?;
    answered_by(gateway, "503", &discovery).await?;
    let (_, clusterz) = discovery.get("/debug/clusterz", false).await?;
    assert!(!clusterz.contains("cluster-2"), "{clusterz}");

    let stats = envoy.stats().await?;
    let rejected: Vec<_> = stats
        .iter()
        .filter(|(k, v)| k.contains("update_rejected") && **v != 0)
        .collect();
    assert!(rejected.is_empty(), "Envoy NACKed: {rejected:?}");
    Ok(())
}
