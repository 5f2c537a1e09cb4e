//! End-to-end on Kubernetes without a cluster: pilot-discovery watches the fake API server
//! (test-support's, proven with kubectl) for Services, EndpointSlices, Pods, Nodes (and
//! Ingresses: the same objects as API objects and as manifests give the same xDS), and a real
//! Envoy gateway routes by them (Istio Gateway and VirtualService from --configDir); scaling the
//! EndpointSlices moves the traffic, and a dropped watch followed by 410 Gone loses no update.
//! Objects that do not decode as their kind do not stop start-up: they are named and counted,
//! and the others are served (issue 28).

mod common;

use std::time::{Duration, Instant};

use anyhow::bail;
use common::{Ads, HOST, answered_by, gateway_yaml, reviews_virtual_service, start_gateway_envoy};
use serde_json::{Value, json};
use test_support::ads::AdsClient;
use test_support::backend::{Backend, http_get};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::FakeApiServer;
use test_support::ports::free_port;
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::config::listener::v3::Listener;
use xds_api::envoy::config::route::v3::RouteConfiguration;

fn pod(name: &str, version: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "reviews", "version": version}},
        "spec": {"nodeName": "node-1", "serviceAccountName": "bookinfo-reviews", "containers": [{"name": "reviews", "image": "reviews"}]},
        "status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})
}

/// One EndpointSlice per version: the backend of that version, ready or not.
fn slice(version: &str, port: u16, ready: bool) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("reviews-{version}"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready},
                       "targetRef": {"kind": "Pod", "name": format!("reviews-{version}"), "namespace": "default"}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}]})
}

#[tokio::test]
async fn a_gateway_routes_by_services_and_endpoint_slices_from_the_api_server() -> anyhow::Result<()> {
    let v1 = Backend::start("reviews-v1").await?;
    let v2 = Backend::start("reviews-v2").await?;
    let api = FakeApiServer::start().await?;
    api.apply(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1",
        "labels": {"topology.kubernetes.io/region": "us-east1", "topology.kubernetes.io/zone": "us-east1-b"}}}),
    )?;
    api.apply(pod("reviews-v1", "v1"))?;
    api.apply(pod("reviews-v2", "v2"))?;
    api.apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}))?;
    api.apply(slice("v1", v1.addr().port(), true))?;
    api.apply(slice("v2", v2.addr().port(), false))?;

    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config");
    std::fs::create_dir(&config)?;
    let gateway = free_port();
    std::fs::write(config.join("gateway.yaml"), gateway_yaml(gateway))?;
    std::fs::write(config.join("virtual-service.yaml"), reviews_virtual_service())?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
        env: vec![("PILOT_DEBOUNCE_AFTER".into(), "10ms".into())],
        ..Default::default()
    };
    let discovery = Discovery::start(&config, opts).await?;
    let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;

    // Only v1 is ready.
    answered_by(gateway, "reviews-v1", &discovery).await?;
    let (_, registryz) = discovery.get("/debug/registryz", false).await?;
    assert!(
        registryz.contains("reviews.default.svc.cluster.local") && registryz.contains("Kubernetes"),
        "{registryz}"
    );

    // Scale: v2 becomes ready, v1 goes away.
    api.apply(slice("v2", v2.addr().port(), true))?;
    api.delete(&slice("v1", 0, true))?;
    answered_by(gateway, "reviews-v2", &discovery).await?;

    // The watches are cut and the history expires before they come back: 410, re-list, and the
    // change made in between still lands.
    api.drop_watches();
    api.apply(slice("v1", v1.addr().port(), true))?;
    api.delete(&slice("v2", 0, true))?;
    api.compact();
    answered_by(gateway, "reviews-v1", &discovery).await?;

    let stats = envoy.stats().await?;
    let rejected: Vec<_> = stats
        .iter()
        .filter(|(k, v)| k.contains("update_rejected") && **v != 0)
        .collect();
    assert!(rejected.is_empty(), "Envoy NACKed: {rejected:?}");
    Ok(())
}

/// The cluster's objects of the manifests test: bookinfo's reviews (EndpointSlices) and ratings.
fn cluster_objects(ratings_as_endpoints: bool) -> Vec<Value> {
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1",
            "labels": {"topology.kubernetes.io/region": "us-east1", "topology.kubernetes.io/zone": "us-east1-b"}}}),
        pod("reviews-v1", "v1"),
        pod("reviews-v2", "v2"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}),
        slice("v1", 19081, true),
        slice("v2", 19082, true),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ratings", "namespace": "default",
            "annotations": {"networking.istio.io/exportTo": "*"}},
            "spec": {"clusterIP": "10.96.0.11", "ports": [{"name": "grpc", "port": 9090, "appProtocol": "grpc"}]}}),
        // Istio's Ingress controller reads the cluster's Ingresses with --configDir too.
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "istio"},
            "spec": {"controller": "istio.io/ingress-controller"}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"ingressClassName": "istio", "rules": [{"host": "reviews.example.com", "http": {"paths": [
                {"path": "/reviews", "pathType": "Prefix", "backend": {"service": {"name": "reviews", "port": {"name": "http"}}}}]}}]}}),
    ];
    objects.push(if ratings_as_endpoints {
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "ratings", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.1.0.9"}], "notReadyAddresses": [{"ip": "10.1.0.10"}],
                         "ports": [{"name": "grpc", "port": 19090}]}]})
    } else {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "ratings-7xk2p", "namespace": "default", "labels": {"kubernetes.io/service-name": "ratings"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.9"], "conditions": {"ready": true}},
                          {"addresses": ["10.1.0.10"], "conditions": {"ready": false}}],
            "ports": [{"name": "grpc", "port": 19090}]})
    });
    objects
}

/// CDS, EDS, LDS and RDS as a gateway gets them, decoded.
async fn gateway_xds(
    d: &Discovery,
) -> anyhow::Result<(
    Vec<Cluster>,
    Vec<ClusterLoadAssignment>,
    Vec<Listener>,
    Vec<RouteConfiguration>,
)> {
    let metadata =
        json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "ISTIO_VERSION": "1.28.0"});
    let mut client = AdsClient::connect(d.grpc_addr, common::NODE_ID, metadata).await?;
    let hs = client.handshake(None).await?;
    let decode = |r: Option<test_support::ads::Response>| r.ok_or_else(|| anyhow::anyhow!("missing type"));
    Ok((
        decode(hs.clusters)?.decode()?,
        decode(hs.endpoints)?.decode()?,
        decode(hs.listeners)?.decode()?,
        decode(hs.routes)?.decode()?,
    ))
}

#[tokio::test]
async fn the_same_mesh_as_manifests_in_config_dir_gives_the_same_xds() -> anyhow::Result<()> {
    let gateway = free_port();
    let istio_config = |dir: &std::path::Path| -> anyhow::Result<()> {
        std::fs::write(dir.join("gateway.yaml"), gateway_yaml(gateway))?;
        std::fs::write(dir.join("virtual-service.yaml"), reviews_virtual_service())?;
        Ok(())
    };
    // Through the API server.
    let api = FakeApiServer::start().await?;
    for o in cluster_objects(false) {
        api.apply(o)?;
    }
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let from_api = dir.path().join("api");
    std::fs::create_dir(&from_api)?;
    istio_config(&from_api)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
        ..Default::default()
    };
    let d1 = Discovery::start(&from_api, opts).await?;

    // The same objects as manifests (one `kind: List`, ratings as v1 Endpoints), no cluster.
    let from_files = dir.path().join("files");
    std::fs::create_dir(&from_files)?;
    istio_config(&from_files)?;
    let list = json!({"apiVersion": "v1", "kind": "List", "items": cluster_objects(true)});
    std::fs::write(from_files.join("cluster.json"), serde_json::to_vec_pretty(&list)?)?;
    let d2 = Discovery::start(&from_files, DiscoveryOptions::default()).await?;

    let (a, b) = (gateway_xds(&d1).await?, gateway_xds(&d2).await?);
    let names = |c: &[Cluster]| c.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    assert!(
        names(&a.0).contains(&"outbound|9080||reviews.default.svc.cluster.local".to_owned()),
        "{:?}",
        names(&a.0)
    );
    assert!(
        names(&a.0).contains(&"outbound|9090||ratings.default.svc.cluster.local".to_owned()),
        "{:?}",
        names(&a.0)
    );
    let routes: Vec<&str> = a.3.iter().map(|r| r.name.as_str()).collect();
    assert!(routes.contains(&"http.80"), "the Ingress's gateway route: {routes:?}");
    let ingress_host =
        a.3.iter()
            .flat_map(|r| &r.virtual_hosts)
            .any(|v| v.name == "reviews.example.com:80");
    assert!(ingress_host, "{:?}", a.3);
    assert_eq!(a.0, b.0, "CDS differs");
    assert_eq!(a.1, b.1, "EDS differs");
    assert_eq!(a.2, b.2, "LDS differs");
    assert_eq!(a.3, b.3, "RDS differs");
    let ratings =
        a.1.iter()
            .find(|c| c.cluster_name.contains("ratings"))
            .expect("ratings endpoints");
    assert_eq!(
        ratings.endpoints.iter().map(|l| l.lb_endpoints.len()).sum::<usize>(),
        1,
        "only the ready address"
    );
    Ok(())
}

/// (cluster, sorted endpoint ports) from EDS.
fn endpoint_ports(clas: &[ClusterLoadAssignment]) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = clas
        .iter()
        .map(|c| {
            let mut ports: Vec<u32> = test_support::ads::endpoint_addresses(c)
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            ports.sort();
            (c.cluster_name.clone(), ports)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn the_kubernetes_bookinfo_example_serves_what_the_service_entry_one_does() -> anyhow::Result<()> {
    let root = test_support::envoy::workspace_root()?;
    let k8s = Discovery::start(&root.join("examples/bookinfo-k8s"), DiscoveryOptions::default()).await?;
    let se = Discovery::start(&root.join("examples/bookinfo"), DiscoveryOptions::default()).await?;
    let (a, b) = (gateway_xds(&k8s).await?, gateway_xds(&se).await?);
    let names = |c: &[Cluster]| {
        let mut n: Vec<String> = c.iter().map(|c| c.name.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&a.0), names(&b.0));
    let eds = endpoint_ports(&a.1);
    assert_eq!(eds, endpoint_ports(&b.1));
    assert!(
        eds.contains(&("outbound|9080|v2|reviews.default.svc.cluster.local".into(), vec![19082])),
        "{eds:?}"
    );
    assert_eq!(a.3, b.3, "RDS differs");
    Ok(())
}

/// pilot-discovery without --configDir on the fake API server: Istio config and services from it.
async fn discovery_on_the_api_server(api: &FakeApiServer) -> anyhow::Result<(tempfile::TempDir, Discovery)> {
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let opts = DiscoveryOptions {
        args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
        ..Default::default()
    };
    let discovery = Discovery::start(std::path::Path::new(""), opts).await?;
    Ok((dir, discovery))
}

fn istio(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": kind,
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

fn reviews_to(subset: &str) -> Value {
    istio(
        "VirtualService",
        "bookinfo",
        json!({"hosts": [HOST], "gateways": ["bookinfo-gateway"],
               "http": [{"route": [{"destination": {"host": "reviews.default.svc.cluster.local", "subset": subset}}]}]}),
    )
}

#[tokio::test]
async fn without_config_dir_istio_config_comes_from_the_api_server() -> anyhow::Result<()> {
    let v1 = Backend::start("reviews-v1").await?;
    let v2 = Backend::start("reviews-v2").await?;
    let gateway = free_port();
    let api = FakeApiServer::start().await?;
    for o in [
        pod("reviews-v1", "v1"),
        pod("reviews-v2", "v2"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}),
        slice("v1", v1.addr().port(), true),
        slice("v2", v2.addr().port(), true),
        istio(
            "Gateway",
            "bookinfo-gateway",
            json!({"selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": gateway, "name": "http", "protocol": "HTTP"}, "hosts": [HOST]}]}),
        ),
        istio(
            "DestinationRule",
            "reviews",
            json!({"host": "reviews.default.svc.cluster.local",
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        ),
        reviews_to("v1"),
    ] {
        api.apply(o)?;
    }
    let (_dir, discovery) = discovery_on_the_api_server(&api).await?;
    let _envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
    answered_by(gateway, "reviews-v1", &discovery).await?;

    // A VirtualService update through the API moves the traffic.
    api.apply(reviews_to("v2"))?;
    answered_by(gateway, "reviews-v2", &discovery).await?;

    // An invalid VirtualService is dropped, named in /debug/config_errors, and disturbs nothing.
    api.apply(istio("VirtualService", "broken", json!({"hosts": ["other.example.com"], "gateways": ["bookinfo-gateway"],
        "http": [{"match": [{"uri": {"regex": "/a{1001}"}}], "route": [{"destination": {"host": "reviews.default.svc.cluster.local"}}]}]})))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, errors) = discovery.get("/debug/config_errors", false).await?;
        if errors.contains("VirtualService default/broken") && errors.contains("invalid repetition size") {
            let (_, configz) = discovery.get("/debug/configz", false).await?;
            let configz: Value = serde_json::from_str(&configz)?;
            let names: Vec<_> = configz
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["kind"] == "VirtualService")
                .map(|c| c["metadata"]["name"].as_str().unwrap_or_default())
                .collect();
            assert!(names.contains(&"bookinfo") && !names.contains(&"broken"), "{configz}");
            // istiod's object metadata: the API server's resourceVersion and creationTimestamp.
            let bookinfo = configz
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["metadata"]["name"] == "bookinfo")
                .cloned()
                .unwrap_or_default();
            let md = &bookinfo["metadata"];
            assert!(
                md["resourceVersion"].is_string() && md["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
                "{bookinfo}"
            );
            break;
        }
        if Instant::now() > deadline {
            bail!("the invalid VirtualService is not in /debug/config_errors:\n{errors}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answered_by(gateway, "reviews-v2", &discovery).await?;
    let (_, metrics) = discovery.get("/metrics", true).await?;
    assert!(
        metrics.contains(r#"pilot_k8s_cfg_events{type="VirtualService",event="update"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"pilot_k8s_reg_events{type="Services",event="add"} 1"#),
        "{metrics}"
    );
    Ok(())
}

/// Issue 28: a VirtualService that does not decode as a Kubernetes object (labels a list) among
/// good ones, and a Service whose ports are a map: pilot-discovery becomes ready, serves the good
/// ones, names the bad ones in /debug/config_errors and counts them; Envoy NACKs nothing.
#[tokio::test]
async fn undecodable_objects_are_named_and_the_others_served() -> anyhow::Result<()> {
    let v1 = Backend::start("reviews-v1").await?;
    let gateway = free_port();
    let api = FakeApiServer::start().await?;
    let mut broken_vs = istio(
        "VirtualService",
        "a-broken",
        json!({"hosts": ["other.example.com"], "gateways": ["bookinfo-gateway"],
               "http": [{"route": [{"destination": {"host": "reviews.default.svc.cluster.local"}}]}]}),
    );
    broken_vs["metadata"]["labels"] = json!(["app", "reviews"]);
    for o in [
        pod("reviews-v1", "v1"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a-broken", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.11", "ports": {"http": 9080}}}),
        slice("v1", v1.addr().port(), true),
        istio(
            "Gateway",
            "bookinfo-gateway",
            json!({"selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": gateway, "name": "http", "protocol": "HTTP"}, "hosts": [HOST]}]}),
        ),
        broken_vs,
        reviews_to("v1"),
        istio(
            "DestinationRule",
            "reviews",
            json!({"host": "reviews.default.svc.cluster.local", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        ),
    ] {
        api.apply(o)?;
    }
    let (_dir, discovery) = discovery_on_the_api_server(&api).await?;
    let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
    answered_by(gateway, "reviews-v1", &discovery).await?;
    let (_, errors) = discovery.get("/debug/config_errors", false).await?;
    let errors: Value = serde_json::from_str(&errors)?;
    let reasons: Vec<&str> = errors["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.starts_with(
            "VirtualService default/a-broken: does not decode as a Kubernetes object: invalid type: sequence"
        )),
        "{errors:#}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("Service default/a-broken: does not decode as a Service: invalid type: map")),
        "{errors:#}"
    );
    let (_, metrics) = discovery.get("/metrics", true).await?;
    assert!(
        metrics.contains(r#"pilot_config_invalid{type="VirtualService"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"pilot_k8s_object_errors{type="Service",reason="undecodable"} 1"#),
        "{metrics}"
    );
    // No list body dumped to the log.
    let logs = discovery.logs();
    assert!(!logs.contains(r#""items":["#), "{logs}");
    assert_eq!(envoy.update_rejected_total().await?, 0, "Envoy NACKed");
    Ok(())
}

/// A ready Pod at 127.0.0.1.
fn ready_pod(name: &str, namespace: &str, labels: Value, http_port: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"serviceAccountName": name, "containers": [{"name": "app", "image": "app",
                 "ports": [{"name": "http", "containerPort": http_port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// Istio's Pod workloads: a ServiceEntry selects a Pod by its labels (its named container port
/// is the endpoint port), and the gateway's own Pod labels decide which Gateway configures it; a
/// label change through the API re-labels the connected Envoy and pushes it at once.
#[tokio::test]
async fn pod_labels_select_service_entry_endpoints_and_relabel_the_gateway() -> anyhow::Result<()> {
    let legacy = Backend::start("legacy").await?;
    let (port_a, port_b) = (free_port(), free_port());
    let api = FakeApiServer::start().await?;
    let gateway_pod = |istio: &str| {
        ready_pod(
            "istio-ingressgateway-e2e",
            "istio-system",
            json!({"istio": istio}),
            8080,
        )
    };
    let gateway = |name: &str, selects: &str, port: u16| {
        istio(
            "Gateway",
            name,
            json!({"selector": {"istio": selects},
            "servers": [{"port": {"number": port, "name": "http", "protocol": "HTTP"}, "hosts": [HOST]}]}),
        )
    };
    for o in [
        ready_pod("legacy-1", "default", json!({"app": "legacy"}), legacy.addr().port()),
        gateway_pod("ingressgateway"),
        gateway("gateway-a", "ingressgateway", port_a),
        gateway("gateway-b", "canary", port_b),
        istio(
            "ServiceEntry",
            "legacy",
            json!({"hosts": ["legacy.example.com"], "location": "MESH_INTERNAL",
            "resolution": "STATIC", "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "workloadSelector": {"labels": {"app": "legacy"}}}),
        ),
        istio(
            "VirtualService",
            "legacy",
            json!({"hosts": [HOST], "gateways": ["gateway-a", "gateway-b"],
            "http": [{"route": [{"destination": {"host": "legacy.example.com", "port": {"number": 80}}}]}]}),
        ),
    ] {
        api.apply(o)?;
    }
    let (_dir, discovery) = discovery_on_the_api_server(&api).await?;
    let envoy = start_gateway_envoy(&discovery, Ads::Sotw).await?;
    // The ServiceEntry's endpoint is the Pod, on its container port named `http`.
    answered_by(port_a, "legacy", &discovery).await?;

    // The gateway's Pod is relabelled: gateway-b selects it now, gateway-a no longer does.
    api.apply(gateway_pod("canary"))?;
    answered_by(port_b, "legacy", &discovery).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(&format!("http://127.0.0.1:{port_a}/"), &[("host", HOST)])
        .await
        .is_ok()
    {
        if Instant::now() > deadline {
            bail!("gateway-a's listener is still there\n{}", discovery.logs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        discovery
            .logs()
            .contains("proxy update for istio-ingressgateway-e2e.istio-system")
    );
    assert_eq!(envoy.update_rejected_total().await?, 0, "Envoy NACKed");
    Ok(())
}
