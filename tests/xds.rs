//! End-to-end: the real pilot-discovery process against protocol-checking ADS clients (every
//! response is checked: unique nonces, versions, type URLs, only subscribed EDS/RDS names).
//! Shows the push rules (full pushes in CDS, EDS, LDS, RDS order; EDS-only pushes when only
//! endpoints moved; NACKs counted and never resent), refusal of a malformed node ID, and the
//! debug and monitoring endpoints.

mod common;

use std::time::Duration;

use common::{NODE_ID, gateway_yaml, services_yaml, virtual_service_yaml, workload_entry_yaml};
use serde_json::json;
use test_support::ads::{AdsClient, delta::DeltaAdsClient, endpoint_addresses};
use test_support::discovery::{Discovery, DiscoveryOptions};
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::type_url;

const V1: &str = "outbound|9080|v1|reviews.default.svc.cluster.local";
const V2: &str = "outbound|9080|v2|reviews.default.svc.cluster.local";

async fn start() -> anyhow::Result<(tempfile::TempDir, Discovery)> {
    let dir = tempfile::tempdir()?;
    let p = dir.path();
    std::fs::write(p.join("gateway.yaml"), gateway_yaml(18080))?;
    std::fs::write(p.join("services.yaml"), services_yaml(19083, 19084))?;
    std::fs::write(
        p.join("reviews-v1.yaml"),
        workload_entry_yaml("reviews-v1", "v1", 19081),
    )?;
    std::fs::write(
        p.join("reviews-v2.yaml"),
        workload_entry_yaml("reviews-v2", "v2", 19082),
    )?;
    std::fs::write(p.join("virtual-service.yaml"), virtual_service_yaml(75))?;
    let d = Discovery::start(p, DiscoveryOptions::default()).await?;
    Ok((dir, d))
}

fn metadata() -> serde_json::Value {
    json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "ISTIO_VERSION": "1.28.0"})
}

/// Ports of the endpoints of one ClusterLoadAssignment.
fn endpoint_ports(cla: &ClusterLoadAssignment) -> Vec<u32> {
    endpoint_addresses(cla).into_iter().map(|(_, p)| p).collect()
}

#[tokio::test]
async fn router_gets_gateway_config_and_debug_endpoints_show_it() -> anyhow::Result<()> {
    let (_dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    let hs = client.handshake(None).await?;
    let clusters = hs.clusters.expect("clusters").names;
    for want in [
        V1,
        V2,
        "outbound|9080||reviews.default.svc.cluster.local",
        "BlackHoleCluster",
    ] {
        assert!(clusters.iter().any(|c| c == want), "missing {want} in {clusters:?}");
    }
    assert_eq!(hs.listeners.expect("listeners").names, vec!["0.0.0.0_18080"]);
    assert_eq!(hs.routes.expect("routes").names, vec!["http.18080"]);
    let claims = hs.endpoints.expect("endpoints").decode::<ClusterLoadAssignment>()?;
    let v1 = claims.iter().find(|c| c.cluster_name == V1).expect("v1 endpoints");
    assert_eq!(endpoint_ports(v1), vec![19081]);

    let (status, adsz) = d.get("/debug/adsz", false).await?;
    assert_eq!(status, 200);
    assert!(adsz.contains(NODE_ID), "{adsz}");
    let (_, syncz) = d.get("/debug/syncz", false).await?;
    let syncz: serde_json::Value = serde_json::from_str(&syncz)?;
    assert_eq!(syncz[0]["cds_status"], "SYNCED", "{syncz}");
    assert_eq!(syncz[0]["lds_status"], "SYNCED", "{syncz}");
    let (status, dump) = d
        .get(
            "/debug/config_dump?proxyID=istio-ingressgateway-e2e.istio-system",
            false,
        )
        .await?;
    assert_eq!(status, 200, "{dump}");
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    let text = dump.to_string();
    assert!(text.contains("ClustersConfigDump") && text.contains(V1) && text.contains("connect_timeout"));
    assert!(text.contains("0.0.0.0_18080") && text.contains("RoutesConfigDump"));
    let (status, _) = d.get("/debug/config_dump?proxyID=nobody.nowhere", false).await?;
    assert_eq!(status, 404);
    let (_, registryz) = d.get("/debug/registryz", false).await?;
    assert!(registryz.contains("ratings.default.svc.cluster.local"), "{registryz}");
    // istiod's endpointShardz: hostname -> namespace -> Shards by "<provider>/<cluster>".
    let (_, shardz) = d.get("/debug/endpointShardz", false).await?;
    let shardz: serde_json::Value = serde_json::from_str(&shardz)?;
    let shards = &shardz["reviews.default.svc.cluster.local"]["default"]["Shards"];
    let ports: Vec<_> = shards
        .as_object()
        .into_iter()
        .flatten()
        .inspect(|(k, _)| assert!(k.starts_with("External/"), "{shardz}"))
        .flat_map(|(_, eps)| eps.as_array().into_iter().flatten())
        .map(|e| e["EndpointPort"].as_u64().unwrap_or_default())
        .collect();
    assert!(ports.contains(&19081) && ports.contains(&19082), "{shardz}");
    let (_, endpointz) = d.get("/debug/endpointz", false).await?;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&endpointz)?, shardz);
    let (_, push_status) = d.get("/debug/push_status", false).await?;
    assert!(push_status.contains("version"), "{push_status}");
    // Monitoring port: Istio's metric names, and /version.
    assert_eq!(d.metric("pilot_xds").await?, 1.0);
    assert_eq!(d.metric("pilot_services").await?, 3.0);
    assert_eq!(d.metric("pilot_virt_services").await?, 1.0);
    assert!(d.metric("pilot_xds_pushes").await? >= 4.0);
    let (_, metrics) = d.get("/metrics", true).await?;
    for name in [
        "pilot_xds_push_time",
        "pilot_proxy_convergence_time",
        "pilot_debounce_time",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    let (status, version) = d.get("/version", true).await?;
    assert_eq!(status, 200);
    assert!(!version.trim().is_empty());
    Ok(())
}

#[tokio::test]
async fn full_pushes_in_cds_eds_lds_rds_order_with_the_types_a_change_affects() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.handshake(None).await?;
    let mut pushed = async |n: usize| -> anyhow::Result<Vec<&'static str>> {
        let mut order = Vec::new();
        for _ in 0..n {
            let r = client.recv_ack().await?;
            order.push(type_url::short(r.type_url()));
        }
        client.expect_no_response(Duration::from_millis(500)).await?;
        Ok(order)
    };
    // A DestinationRule can change every type.
    std::fs::write(
        dir.path().join("ratings-dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: ratings, namespace: default}\n\
         spec: {host: ratings.default.svc.cluster.local, trafficPolicy: {loadBalancer: {simple: RANDOM}}}\n",
    )?;
    assert_eq!(pushed(4).await?, ["cds", "eds", "lds", "rds"], "{}", d.logs());
    // Routes never change endpoints: a VirtualService change skips EDS, as Istio's edsNeedsPush.
    std::fs::write(dir.path().join("virtual-service.yaml"), virtual_service_yaml(50))?;
    assert_eq!(pushed(3).await?, ["cds", "lds", "rds"], "{}", d.logs());
    Ok(())
}

#[tokio::test]
async fn endpoint_only_change_pushes_only_eds() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.handshake(None).await?;
    std::fs::write(
        dir.path().join("reviews-v2.yaml"),
        workload_entry_yaml("reviews-v2", "v2", 19099),
    )?;
    let r = client
        .expect_type(type_url::ENDPOINT)
        .await
        .map_err(|e| e.context(d.logs()))?;
    client.ack()?;
    let claims = r.decode::<ClusterLoadAssignment>()?;
    let v2 = claims.iter().find(|c| c.cluster_name == V2).expect("v2 endpoints");
    assert_eq!(endpoint_ports(v2), vec![19099]);
    // Only the clusters of the service whose endpoints moved, as Istio's incremental EDS.
    let names: Vec<&str> = claims.iter().map(|c| c.cluster_name.as_str()).collect();
    assert!(
        names.iter().all(|n| n.ends_with("|reviews.default.svc.cluster.local")),
        "{names:?}"
    );
    client.expect_no_response(Duration::from_millis(800)).await?;
    Ok(())
}

/// Delta: an endpoint change sends the assignments that changed and nothing else: subset v2's
/// and the whole service's, not subset v1's, whose endpoints stayed.
#[tokio::test]
async fn delta_endpoint_change_sends_only_the_changed_assignments() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let mut client = DeltaAdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.subscribe(type_url::CLUSTER, &[])?;
    let clusters = client.recv_ack().await?;
    let bodies: Vec<_> = clusters
        .raw
        .resources
        .iter()
        .filter_map(|r| r.resource.clone())
        .collect();
    let eds = test_support::ads::eds_cluster_names(&bodies);
    assert!(eds.iter().any(|n| n == V1) && eds.iter().any(|n| n == V2), "{eds:?}");
    let names: Vec<&str> = eds.iter().map(String::as_str).collect();
    client.subscribe(type_url::ENDPOINT, &names)?;
    let first = client.recv_ack().await?;
    assert_eq!(first.names().len(), eds.len(), "{:?}", first.names());

    std::fs::write(
        dir.path().join("reviews-v2.yaml"),
        workload_entry_yaml("reviews-v2", "v2", 19099),
    )?;
    let r = client.recv_ack().await.map_err(|e| e.context(d.logs()))?;
    assert_eq!(r.type_url(), type_url::ENDPOINT);
    let mut changed = r.names();
    changed.sort();
    assert_eq!(
        changed,
        [V2, "outbound|9080||reviews.default.svc.cluster.local"],
        "{}",
        d.logs()
    );
    assert!(r.removed().is_empty(), "{:?}", r.removed());
    client.expect_no_response(Duration::from_millis(800)).await?;
    Ok(())
}

#[tokio::test]
async fn nack_is_counted_shown_and_not_resent() -> anyhow::Result<()> {
    let (_dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.request(type_url::CLUSTER, &[])?;
    client.expect_type(type_url::CLUSTER).await?;
    client.nack("cluster outbound|9080||x: invalid thing")?;
    client.expect_no_response(Duration::from_millis(800)).await?;
    assert_eq!(d.metric("pilot_total_xds_rejects").await?, 1.0);
    assert!(d.metric("pilot_xds_cds_reject").await? >= 1.0);
    let (_, syncz) = d.get("/debug/syncz", false).await?;
    assert!(syncz.contains("NACKED") && syncz.contains("invalid thing"), "{syncz}");
    Ok(())
}

#[tokio::test]
async fn malformed_node_id_is_refused_with_a_reason() -> anyhow::Result<()> {
    let (_dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, "gateway~not-an-ip", json!({})).await?;
    client.request(type_url::CLUSTER, &[])?;
    let status = client.recv_status().await?;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("gateway~not-an-ip"), "{}", status.message());
    assert_eq!(d.metric("pilot_xds_invalid_node").await?, 1.0);
    Ok(())
}

#[tokio::test]
async fn delta_client_gets_wildcard_clusters_and_updates() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let mut client = DeltaAdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.subscribe(type_url::CLUSTER, &[])?;
    let r = client.recv_ack().await?;
    assert!(r.names().contains(&V1), "{:?}", r.names());
    // Removing the DestinationRule removes the subset clusters.
    std::fs::write(
        dir.path().join("services.yaml"),
        services_yaml(19083, 19084)
            .split("---\napiVersion: networking.istio.io/v1\nkind: DestinationRule")
            .next()
            .unwrap_or_default(),
    )?;
    let r = client.recv_ack().await.map_err(|e| e.context(d.logs()))?;
    assert!(r.removed().iter().any(|n| n == V1), "removed {:?}", r.removed());
    Ok(())
}

/// `ISTIO_GPRC_MAXSTREAMS` caps the concurrent streams of one connection: over it, HTTP/2 holds
/// the next stream until one closes, however many a client opens.
#[tokio::test]
async fn concurrent_streams_per_connection_are_capped() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("gateway.yaml"), gateway_yaml(18080))?;
    let opts = DiscoveryOptions {
        env: vec![("ISTIO_GPRC_MAXSTREAMS".into(), "2".into())],
        ..DiscoveryOptions::default()
    };
    let d = Discovery::start(dir.path(), opts).await?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", d.grpc_addr))?
        .connect()
        .await?;
    let mut first = AdsClient::on_channel(channel.clone(), NODE_ID, metadata()).await?;
    first.handshake(None).await?;
    let mut second = AdsClient::on_channel(channel.clone(), NODE_ID, metadata()).await?;
    second.handshake(None).await?;
    let third = AdsClient::on_channel(channel.clone(), NODE_ID, metadata());
    tokio::pin!(third);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut third)
            .await
            .is_err(),
        "a third stream opened on a connection capped at two"
    );
    drop(first);
    let mut third = tokio::time::timeout(Duration::from_secs(10), third).await??;
    third.handshake(None).await?;
    Ok(())
}

#[tokio::test]
async fn a_nack_is_traced_to_the_configs_that_produced_the_rejected_resources() -> anyhow::Result<()> {
    let (_dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    // Envoy's message names the rejected route configuration.
    client.request(type_url::ROUTE, &["http.18080"])?;
    client.expect_type(type_url::ROUTE).await?;
    client.nack("Error adding/updating route config http.18080: invalid regex")?;
    client.expect_no_response(Duration::from_millis(500)).await?;

    let (_, syncz) = d.get("/debug/syncz", false).await?;
    let syncz: serde_json::Value = serde_json::from_str(&syncz)?;
    assert_eq!(syncz[0]["rds_status"], "NACKED", "{syncz}");
    assert_eq!(syncz[0]["rds_rejected_resources"], json!(["http.18080"]), "{syncz}");
    assert_eq!(
        syncz[0]["rds_rejected_configs"],
        json!(["/apis/networking.istio.io/v1/namespaces/default/virtual-service/bookinfo"]),
        "{syncz}"
    );

    // configz is istiod's: a bare array of Kubernetes objects.
    let (status, configz) = d.get("/debug/configz", false).await?;
    assert_eq!(status, 200);
    let configz: serde_json::Value = serde_json::from_str(&configz)?;
    let configs = configz.as_array().expect("configz is an array");
    let vs = configs
        .iter()
        .find(|c| c["kind"] == "VirtualService" && c["metadata"]["name"] == "bookinfo")
        .expect("the VirtualService in configz");
    assert_eq!(vs["apiVersion"], "networking.istio.io/v1", "{vs}");
    assert_eq!(vs["metadata"]["namespace"], "default", "{vs}");
    assert!(vs["spec"]["hosts"].is_array(), "{vs}");

    // What the proxy rejected, traced to the config and its file.
    let (status, errors) = d.get("/debug/config_errors", false).await?;
    assert_eq!(status, 200);
    let errors: serde_json::Value = serde_json::from_str(&errors)?;
    let rejected = errors["rejected"].as_array().expect("rejected");
    assert_eq!(rejected.len(), 1, "{errors}");
    assert_eq!(rejected[0]["proxy"], NODE_ID, "{errors}");
    assert_eq!(rejected[0]["resources"], json!(["http.18080"]), "{errors}");
    assert_eq!(
        rejected[0]["configs"],
        json!(["/apis/networking.istio.io/v1/namespaces/default/virtual-service/bookinfo"]),
        "{errors}"
    );
    let sources = rejected[0]["sources"].as_array().expect("sources");
    assert!(
        sources.len() == 1 && sources[0].as_str().is_some_and(|f| f.ends_with(".yaml")),
        "{errors}"
    );
    Ok(())
}

/// What `istioctl proxy-status` and its control-plane diff ask over ADS, played as istioctl sends
/// it (an ADS client whose node says `GENERATOR: event`): `istio.io/debug/syncz` lists the
/// connected proxies with the sync state of each type, `istio.io/debug/config_dump` names one
/// and gets what it would be sent, as Envoy's admin config dumps.
#[tokio::test]
async fn istioctl_proxy_status_and_config_dump_over_xds() -> anyhow::Result<()> {
    use prost::Message;
    use xds_api::envoy::admin::v3 as admin;
    use xds_api::envoy::service::status::v3::{ClientConfig, ConfigStatus};

    let (_dir, d) = start().await?;
    let mut gateway = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    gateway.handshake(None).await?;

    let istioctl_node = "sidecar~127.0.0.1~istioctl-1.istio-system~istio-system.svc.cluster.local";
    // The handshake's last ACK reaches the server on the gateway's own stream, maybe after
    // istioctl's first question: ask again on a new stream until it has landed (a few ms), as a
    // user reruns `istioctl proxy-status`.
    let wanted = [
        type_url::CLUSTER,
        type_url::ENDPOINT,
        type_url::LISTENER,
        type_url::ROUTE,
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut istioctl, r, configs) = loop {
        let mut istioctl = AdsClient::connect(
            d.grpc_addr,
            istioctl_node,
            json!({"GENERATOR": "event", "NAMESPACE": "istio-system"}),
        )
        .await?;
        istioctl.request("istio.io/debug/syncz", &[])?;
        let r = istioctl.expect_type("istio.io/debug/syncz").await?;
        let configs: Vec<ClientConfig> = r.decode()?;
        let synced = |c: &ClientConfig| {
            wanted.iter().all(|t| {
                c.generic_xds_configs
                    .iter()
                    .any(|x| x.type_url == *t && x.config_status == ConfigStatus::Synced as i32)
            })
        };
        if configs.iter().all(synced) || std::time::Instant::now() > deadline {
            break (istioctl, r, configs);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(configs.len(), 1, "the gateway only, not istioctl: {configs:?}");
    let node = configs[0].node.as_ref().unwrap();
    assert_eq!(node.id, "istio-ingressgateway-e2e.istio-system");
    let fields = &node.metadata.as_ref().unwrap().fields;
    assert!(fields.contains_key("NAMESPACE") && fields.contains_key("ISTIO_VERSION"));
    let states: Vec<(&str, i32)> = configs[0]
        .generic_xds_configs
        .iter()
        .map(|c| (c.type_url.as_str(), c.config_status))
        .collect();
    for t in wanted {
        assert!(
            states.contains(&(t, ConfigStatus::Synced as i32)),
            "{t} not SYNCED in {states:?}"
        );
    }
    istioctl.ack_response(&r)?;

    istioctl.request("istio.io/debug/config_dump", &["istio-ingressgateway-e2e.istio-system"])?;
    let r = istioctl.expect_type("istio.io/debug/config_dump").await?;
    let types: Vec<&str> = r.raw.resources.iter().map(|a| a.type_url.as_str()).collect();
    assert_eq!(
        types,
        [
            "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ScopedRoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
            "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
        ]
    );
    let clusters = admin::ClustersConfigDump::decode(r.raw.resources[1].value.as_slice())?;
    assert!(clusters.dynamic_active_clusters.len() >= 3, "{clusters:?}");
    let listeners = admin::ListenersConfigDump::decode(r.raw.resources[2].value.as_slice())?;
    assert!(
        listeners.dynamic_listeners.iter().any(|l| l.name == "0.0.0.0_18080"),
        "{:?}",
        listeners.dynamic_listeners.iter().map(|l| &l.name).collect::<Vec<_>>()
    );
    istioctl.ack_response(&r)?;

    // An unknown proxy is refused with the reason, as istiod's "could not find connection".
    istioctl.request("istio.io/debug/config_dump", &["nobody.default"])?;
    let status = istioctl.recv_status().await?;
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    Ok(())
}

/// Every metric Istio's "Istio Control Plane Dashboard" (manifests/addons/dashboards/
/// pilot-dashboard.gen.json) and the list query is exported under Istio's name and type
/// once it has something to count (as istiod's, a metric appears with its first sample). Shown
/// elsewhere: the NACK families (`pilot_total_xds_rejects`, `pilot_xds_<type>_reject`, in
/// `nack_is_counted_shown_and_not_resent`) and `pilot_k8s_reg_events` / `pilot_k8s_cfg_events`
/// (tests/kubernetes.rs). Not ours, left blank on that dashboard: `container_*` (cAdvisor),
/// `go_*` (the Go runtime), `sidecar_injection_*` (the injection webhook), `envoy_*` (the
/// proxies' own stats).
#[tokio::test]
async fn the_control_plane_dashboard_finds_its_metrics() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let mut client = AdsClient::connect(d.grpc_addr, NODE_ID, metadata()).await?;
    client.handshake(None).await?;
    // A change (a push, triggered by config) and an invalid config (a validation failure).
    std::fs::write(dir.path().join("virtual-service.yaml"), virtual_service_yaml(50))?;
    std::fs::write(
        dir.path().join("broken.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec: {hosts: []}\n",
    )?;
    client.expect_type(type_url::CLUSTER).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (_, text) = d.get("/metrics", true).await?;
        if text.contains("galley_validation_failed{") && text.contains("pilot_push_triggers{") {
            break text;
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("no push trigger or validation failure counted:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let families = [
        ("istio_build", "gauge"),
        ("pilot_xds", "gauge"),
        ("pilot_xds_pushes", "counter"),
        ("pilot_push_triggers", "counter"),
        ("pilot_total_xds_internal_errors", "counter"),
        ("pilot_xds_push_time", "histogram"),
        ("pilot_xds_config_size_bytes", "histogram"),
        ("pilot_proxy_convergence_time", "histogram"),
        ("pilot_services", "gauge"),
        ("pilot_virt_services", "gauge"),
        ("galley_validation_passed", "counter"),
        ("galley_validation_failed", "counter"),
        ("process_cpu_seconds_total", "gauge"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
    ];
    for (name, kind) in families {
        assert!(
            text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
            "no {kind} {name} in /metrics:\n{text}"
        );
    }
    // Samples under the names and labels the dashboard's queries use.
    for sample in [
        "istio_build{component=\"pilot\"",
        "pilot_xds_pushes{type=\"cds\"}",
        "pilot_push_triggers{type=\"config\"}",
        "pilot_xds_config_size_bytes_bucket{",
        "pilot_xds_push_time_bucket{",
        "galley_validation_passed{resource=\"VirtualService\"}",
        "galley_validation_failed{resource=\"VirtualService\"",
        "pilot_total_xds_internal_errors 0",
    ] {
        assert!(text.contains(sample), "no sample {sample} in /metrics:\n{text}");
    }
    assert!(d.metric("process_resident_memory_bytes").await? > 0.0);
    Ok(())
}

/// NDS: a sidecar that captures DNS asks for its name table (as pilot-agent's DNS proxy does) and
/// gets the hosts it sees with their VIPs, a TCP ServiceEntry without addresses with an allocated
/// VIP; a new ServiceEntry is pushed as a new table; `/debug/ndsz` shows the same table.
#[tokio::test]
async fn a_sidecar_that_captures_dns_gets_its_name_table() -> anyhow::Result<()> {
    let (dir, d) = start().await?;
    let node = "sidecar~10.1.0.7~productpage-1.default~default.svc.cluster.local";
    let mut client = AdsClient::connect(
        d.grpc_addr,
        node,
        json!({"NAMESPACE": "default", "DNS_CAPTURE": "true", "ISTIO_VERSION": "1.28.0"}),
    )
    .await?;
    let table = async |client: &mut AdsClient| -> anyhow::Result<istio_api::nds::NameTable> {
        let r = client.recv().await?;
        anyhow::ensure!(r.type_url() == type_url::NAME_TABLE, "got {}", r.type_url());
        client.ack()?;
        r.decode::<istio_api::nds::NameTable>()?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("empty NDS response"))
    };
    client.request(type_url::NAME_TABLE, &[])?;
    let first = table(&mut client).await?;
    let reviews = &first.table["reviews.default.svc.cluster.local"];
    assert_eq!(reviews.registry, "External");
    assert!(!first.table.contains_key("db.example.com"));
    std::fs::write(
        dir.path().join("db.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: db, namespace: default}\n\
         spec: {hosts: [db.example.com], location: MESH_EXTERNAL, resolution: DNS,\n\
         \x20 ports: [{number: 5432, name: tcp, protocol: TCP}]}\n",
    )?;
    let second = table(&mut client).await?;
    let db = &second.table["db.example.com"].ips;
    assert!(db.len() == 1 && db[0].starts_with("240.240."), "{db:?}");
    let (status, ndsz) = d.get("/debug/ndsz?proxyID=productpage-1.default", false).await?;
    assert_eq!(status, 200, "{ndsz}");
    let ndsz: serde_json::Value = serde_json::from_str(&ndsz)?;
    assert_eq!(ndsz["table"]["db.example.com"]["ips"][0], db[0].as_str());
    Ok(())
}
