//! End-to-end: a real Envoy ingress gateway fed by a real pilot-discovery from a config directory.
//! Routes by weight, header, rewrite, redirect, fault and timeout; picks up live config changes
//! without a restart; empties a subset when its workload goes; ignores invalid config. Envoy must
//! accept everything (update_rejected stays 0).

mod common;

use std::time::Duration;

use common::{Ads, GatewayMesh, virtual_service_yaml};

#[tokio::test]
async fn weighted_split_within_tolerance() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    let (mut v1, mut v2) = (0, 0);
    for _ in 0..200 {
        match mesh.who("/reviews", &[]).await?.as_deref() {
            Some("reviews-v1") => v1 += 1,
            Some("reviews-v2") => v2 += 1,
            other => anyhow::bail!("unexpected answer {other:?}"),
        }
    }
    // 75/25 split: binomial(200, 0.75) has sd ~6; allow a wide margin.
    assert!((125..=175).contains(&v1), "v1={v1} v2={v2}");
    assert_eq!(v1 + v2, 200);
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn header_match_selects_subset() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    for _ in 0..20 {
        assert_eq!(
            mesh.who("/reviews", &[("end-user", "jason")]).await?.as_deref(),
            Some("reviews-v2")
        );
    }
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn rewrite_and_request_headers() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    let r = mesh.get("/ratings/7", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    let seen = mesh.backend("ratings").last().expect("ratings got the request");
    assert_eq!(seen.path, "/v1/ratings/7");
    assert_eq!(seen.host, "ratings.internal");
    assert_eq!(seen.header("x-routed-by"), Some("pilot-rs"));
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn redirect() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    let r = mesh.get("/productpage-old", &[]).await?;
    assert_eq!(r.status, 302, "{r:?}");
    let location = r.header("location").unwrap_or_default();
    assert!(location.ends_with("/productpage"), "location {location:?}");
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn fault_abort() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    for _ in 0..10 {
        assert_eq!(mesh.get("/fault", &[]).await?.status, 418);
    }
    assert_eq!(
        mesh.backend("ratings").count(),
        0,
        "aborted requests must not reach the backend"
    );
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn timeout() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    let t0 = std::time::Instant::now();
    let r = mesh.get("/slow", &[]).await?;
    assert_eq!(r.status, 504, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    assert_eq!(mesh.backend("slow").count(), 1);
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn live_config_change_reaches_envoy_without_restart() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    mesh.write("virtual-service.yaml", &virtual_service_yaml(0))?;
    mesh.wait_for_backend("reviews-v2", 10, "/reviews", &[]).await?;
    for _ in 0..30 {
        assert_eq!(mesh.who("/reviews", &[]).await?.as_deref(), Some("reviews-v2"));
    }
    // Same Envoy process, new routes over RDS.
    assert!(mesh.envoy.exit_status().is_none(), "envoy exited");
    let rds_updates = mesh.envoy.rds_total("update_success").await?;
    assert!(rds_updates >= 2, "expected a second RDS update, stats: {rds_updates}");
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn removed_workload_empties_its_subset() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    assert_eq!(
        mesh.who("/reviews", &[("end-user", "jason")]).await?.as_deref(),
        Some("reviews-v2")
    );
    mesh.remove("reviews-v2.yaml")?;
    // No endpoint left in subset v2: Envoy answers 503 (no healthy upstream).
    mesh.wait_for(
        Duration::from_secs(15),
        |r| r.status == 503,
        "/reviews",
        &[("end-user", "jason")],
    )
    .await?;
    let before = mesh.backend("reviews-v2").count();
    for _ in 0..10 {
        assert_eq!(mesh.get("/reviews", &[("end-user", "jason")]).await?.status, 503);
    }
    assert_eq!(mesh.backend("reviews-v2").count(), before);
    // v1 still serves the rest of the split.
    mesh.wait_for_backend("reviews-v1", 1, "/reviews", &[]).await?;
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn invalid_config_leaves_routing_intact() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    // A new, invalid VirtualService in its own file; an invalid update of the existing one (kept at
    // its last valid version, as the API server would); a YAML syntax error in the services file.
    mesh.write(
        "bad-vs.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: bad, namespace: default}\n\
         spec:\n  hosts: [bookinfo.example.com]\n  gateways: [bookinfo-gateway]\n  http:\n  - route:\n    - destination: {host: reviews}\n      weight: -5\n",
    )?;
    mesh.write(
        "virtual-service.yaml",
        &virtual_service_yaml(75).replace("weight: 25", "weight: -25"),
    )?;
    mesh.write("services.yaml", "apiVersion: networking.istio.io/v1\nkind: [oops\n")?;
    // Wait until pilot has seen both files.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, configz) = mesh.discovery.get("/debug/config_errors", false).await?;
        if configz.contains("default/bad") && configz.contains("syntax error") && configz.contains("-25") {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "config_errors never showed the errors: {configz}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(mesh.discovery.metric("pilot_config_invalid").await? >= 2.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..20 {
        let who = mesh.who("/reviews", &[]).await?;
        assert!(matches!(who.as_deref(), Some("reviews-v1" | "reviews-v2")), "{who:?}");
    }
    assert_eq!(
        mesh.who("/reviews", &[("end-user", "jason")]).await?.as_deref(),
        Some("reviews-v2")
    );
    mesh.assert_no_rejects().await
}

#[tokio::test]
async fn delta_xds_routes_the_same() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start_with(Ads::Delta).await?;
    assert_eq!(
        mesh.who("/reviews", &[("end-user", "jason")]).await?.as_deref(),
        Some("reviews-v2")
    );
    // The initial split sends 75% to v1, so ten v1 answers in a row can happen before any change
    // lands: move everything to v2 first, then to v1, and each state is unmistakable.
    mesh.write("virtual-service.yaml", &virtual_service_yaml(0))?;
    mesh.wait_for_backend("reviews-v2", 10, "/reviews", &[]).await?;
    mesh.write("virtual-service.yaml", &virtual_service_yaml(100))?;
    mesh.wait_for_backend("reviews-v1", 10, "/reviews", &[]).await?;
    for _ in 0..20 {
        assert_eq!(mesh.who("/reviews", &[]).await?.as_deref(), Some("reviews-v1"));
    }
    mesh.assert_no_rejects().await
}

/// ProxyConfig `proxyHeaders` (Istio's `GetProxyHeaders`): by default the gateway says `server:
/// istio-envoy`, sends `x-request-id` and `x-envoy-attempt-count` upstream and Envoy's debug
/// headers downstream; a proxy whose ProxyConfig disables them sends none of them.
#[tokio::test]
async fn proxy_headers_follow_the_proxys_proxy_config() -> anyhow::Result<()> {
    let default = GatewayMesh::start().await?;
    let r = default.get("/ratings", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.headers.get("server").map(String::as_str),
        Some("istio-envoy"),
        "{r:?}"
    );
    assert!(r.headers.contains_key("x-envoy-upstream-service-time"), "{r:?}");
    let seen = &r.json()?["headers"];
    assert!(
        seen["x-request-id"].is_string() && seen["x-envoy-attempt-count"] == "1",
        "{seen}"
    );
    drop(default);

    let proxy_config = serde_json::json!({"PROXY_CONFIG": {"proxyHeaders": {
        "server": {"disabled": true}, "requestId": {"disabled": true},
        "attemptCount": {"disabled": true}, "envoyDebugHeaders": {"disabled": true},
        "xForwardedPort": {"enabled": true}, "xForwardedHost": {"enabled": true}}}});
    let quiet = GatewayMesh::start_with_metadata(Ads::Sotw, proxy_config).await?;
    let r = quiet.get("/ratings", &[]).await?;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(!r.headers.contains_key("server"), "{r:?}");
    assert!(!r.headers.contains_key("x-envoy-upstream-service-time"), "{r:?}");
    let seen = &r.json()?["headers"];
    for absent in ["x-request-id", "x-envoy-attempt-count"] {
        assert!(seen.get(absent).is_none(), "{absent} sent upstream: {seen}");
    }
    assert!(seen["x-forwarded-port"].is_string(), "{seen}");
    // `/ratings` rewrites the authority: the original host goes along as x-forwarded-host
    assert_eq!(seen["x-forwarded-host"], common::HOST, "{seen}");
    assert_eq!(quiet.envoy.update_rejected_total().await?, 0);
    Ok(())
}

/// AuthorizationPolicies that select the gateway (istio-system, `istio: ingressgateway`) run in
/// its HTTP connection manager: a DENY by path and header answers 403 with Envoy's RBAC denial
/// before routing (the backend never sees it), other requests still route; a policy for other
/// workloads leaves the gateway alone; removing the policy lifts the denial.
#[tokio::test]
async fn authorization_policies_selecting_the_gateway() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start().await?;
    mesh.write(
        "authz.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {name: gateway-deny, namespace: istio-system}\n\
         spec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  action: DENY\n  rules:\n\
         \x20 - to: [{operation: {paths: [\"/ratings*\"]}}]\n\
         \x20   when: [{key: \"request.headers[x-block]\", values: [\"yes\"]}]\n---\n\
         apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {name: other, namespace: istio-system}\n\
         spec:\n  selector: {matchLabels: {app: not-the-gateway}}\n  action: DENY\n  rules: [{}]\n",
    )?;
    let denied = mesh
        .wait_for(
            Duration::from_secs(15),
            |r| r.status == 403,
            "/ratings",
            &[("x-block", "yes")],
        )
        .await?;
    assert_eq!(denied.body, "RBAC: access denied");
    let before = mesh.backend("ratings").count();
    for _ in 0..5 {
        assert_eq!(mesh.get("/ratings", &[("x-block", "yes")]).await?.status, 403);
    }
    assert_eq!(mesh.backend("ratings").count(), before, "denied before routing");
    assert_eq!(mesh.get("/ratings", &[]).await?.status, 200);
    let stats = mesh.envoy.stats().await?;
    let denials: u64 = stats
        .iter()
        .filter(|(k, _)| k.ends_with(".rbac.denied"))
        .map(|(_, v)| *v)
        .sum();
    assert!(denials >= 6, "rbac.denied: {denials}");
    mesh.remove("authz.yaml")?;
    mesh.wait_for(
        Duration::from_secs(15),
        |r| r.status == 200,
        "/ratings",
        &[("x-block", "yes")],
    )
    .await?;
    mesh.assert_no_rejects().await
}

/// CUSTOM AuthorizationPolicy on the gateway: requests the policy matches are checked by the
/// mesh's ext_authz HTTP provider (a loopback server behind a ServiceEntry), whose 403 reaches
/// the client and whose 200 lets the request through; requests the policy does not match never
/// reach the provider. Switching the policy to another provider takes effect without restarts.
#[tokio::test]
async fn custom_policy_asks_the_mesh_ext_authz_provider() -> anyhow::Result<()> {
    use test_support::backend::{Backend, BackendOptions};
    let deny = Backend::start_with(
        "authz-deny",
        BackendOptions {
            status: 403,
            ..Default::default()
        },
    )
    .await?;
    let allow = Backend::start("authz-allow").await?;
    let mut backends = std::collections::BTreeMap::new();
    for name in ["reviews-v1", "reviews-v2", "ratings", "slow"] {
        backends.insert(name, Backend::start(name).await?);
    }
    let gateway_port = test_support::ports::free_port();
    let dir = tempfile::tempdir()?;
    common::write_mesh_config(dir.path(), gateway_port, &backends)?;
    let authz_service = |name: &str, port: u16| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  hosts: [{name}.default.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n\
             \x20 ports: [{{number: 9000, name: http, protocol: HTTP, targetPort: {port}}}]\n\
             \x20 endpoints: [{{address: 127.0.0.1}}]\n"
        )
    };
    std::fs::write(
        dir.path().join("authz-services.yaml"),
        format!(
            "{}---\n{}",
            authz_service("ext-authz-deny", deny.port()),
            authz_service("ext-authz-allow", allow.port())
        ),
    )?;
    let policy = |provider: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
             metadata: {{name: ext, namespace: istio-system}}\n\
             spec:\n  selector: {{matchLabels: {{istio: ingressgateway}}}}\n  action: CUSTOM\n\
             \x20 provider: {{name: {provider}}}\n  rules: [{{to: [{{operation: {{paths: [\"/ratings*\"]}}}}]}}]\n"
        )
    };
    std::fs::write(dir.path().join("authz.yaml"), policy("deny-all"))?;
    let mesh_dir = tempfile::tempdir()?;
    let mesh_config = mesh_dir.path().join("mesh.yaml");
    std::fs::write(
        &mesh_config,
        "extensionProviders:\n\
         - name: deny-all\n  envoyExtAuthzHttp: {service: ext-authz-deny.default.svc.cluster.local, port: 9000, pathPrefix: /check}\n\
         - name: allow-all\n  envoyExtAuthzHttp: {service: ext-authz-allow.default.svc.cluster.local, port: 9000}\n",
    )?;
    let discovery = test_support::discovery::Discovery::start(
        dir.path(),
        test_support::discovery::DiscoveryOptions {
            args: vec!["--meshConfig".into(), mesh_config.display().to_string()],
            ..Default::default()
        },
    )
    .await?;
    let envoy = common::start_gateway_envoy(&discovery, Ads::Sotw).await?;
    let mesh = GatewayMesh {
        dir,
        backends,
        discovery,
        envoy,
        gateway_port,
    };
    mesh.wait_for(Duration::from_secs(20), |r| r.status == 200, "/reviews", &[])
        .await?;
    let denied = mesh
        .wait_for(Duration::from_secs(15), |r| r.status == 403, "/ratings", &[])
        .await?;
    assert!(
        denied.body.contains("authz-deny"),
        "the provider's answer: {}",
        denied.body
    );
    let check = deny.last().expect("the provider was asked");
    assert_eq!(check.path, "/check/ratings", "pathPrefix, then the request's path");
    assert_eq!(mesh.backend("ratings").count(), 0, "denied before routing");
    let asked = deny.count();
    assert_eq!(mesh.get("/reviews", &[]).await?.status, 200);
    assert_eq!(
        deny.count(),
        asked,
        "requests the policy does not match are not checked"
    );

    std::fs::write(mesh.dir.path().join("authz.yaml"), policy("allow-all"))?;
    mesh.wait_for(Duration::from_secs(15), |r| r.status == 200, "/ratings", &[])
        .await?;
    assert!(allow.count() >= 1, "the other provider was asked");
    assert!(mesh.backend("ratings").count() >= 1);
    mesh.assert_no_rejects().await
}

/// Delta xDS with VHDS (`PILOT_ENABLE_DELTA_VHDS`, on by default): the gateway's route
/// configuration comes without its virtual hosts, each host over VHDS as
/// `<route configuration>/<host>`; Envoy merges them and routes by them as by inline ones, and a
/// change to one host's VirtualService sends that host alone (no route configuration, no other
/// host); hosts whose VirtualServices go are removed.
#[tokio::test]
async fn delta_xds_sends_a_changed_virtual_host_alone() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start_with(Ads::Delta).await?;
    let port = mesh.gateway_port;
    mesh.write("other.yaml", &other_host_yaml(port))?;
    let url = wait_for_other_host(&mesh, port).await?;

    let config = format!("http.{port}");
    let route_config = gateway_route_config(&mesh, &config).await?;
    assert!(
        route_config["vhds"]["config_source"]["ads"].is_object(),
        "{route_config}"
    );
    let hosts = host_names(&route_config);
    assert_eq!(
        hosts,
        [
            format!("{config}/bookinfo.example.com:{port}"),
            format!("{config}/other.example.com:{port}")
        ],
        "{route_config}"
    );

    // everything to v2: one host's routes change
    mesh.write("virtual-service.yaml", &virtual_service_yaml(0))?;
    mesh.wait_for_backend("reviews-v2", 10, "/reviews", &[]).await?;
    assert_last_push_sent(&mesh, serde_json::json!({"vhds": {"pushes": 1, "resources": 1}})).await?;

    // every VirtualService gone: the hosts are removed over VHDS (the route configuration keeps
    // Istio's 404 host), and come back with them
    mesh.remove("virtual-service.yaml")?;
    mesh.remove("other.yaml")?;
    mesh.wait_for(Duration::from_secs(15), |r| r.status == 404, "/reviews", &[])
        .await?;
    // the two removals may reach Envoy in two pushes: the other host goes with the second
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let other = test_support::backend::http_get(&url, &[("host", "other.example.com")]).await?;
        if other.status == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "other.example.com still routed 15 s after its VirtualService went: {other:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    mesh.write("virtual-service.yaml", &virtual_service_yaml(100))?;
    mesh.wait_for_backend("reviews-v1", 10, "/reviews", &[]).await?;
    mesh.assert_no_rejects().await
}

/// `PILOT_ENABLE_DELTA_VHDS=false`: delta xDS sends Istio's route configurations, hosts inline
/// under their own names, and a change resends the route configuration.
#[tokio::test]
async fn delta_xds_without_vhds_sends_route_configurations_whole() -> anyhow::Result<()> {
    let options = test_support::discovery::DiscoveryOptions {
        env: vec![("PILOT_ENABLE_DELTA_VHDS".into(), "false".into())],
        ..Default::default()
    };
    let mesh = GatewayMesh::start_with_options(Ads::Delta, serde_json::json!({}), options).await?;
    let port = mesh.gateway_port;
    let route_config = gateway_route_config(&mesh, &format!("http.{port}")).await?;
    assert!(route_config.get("vhds").is_none(), "{route_config}");
    assert_eq!(host_names(&route_config), [format!("bookinfo.example.com:{port}")]);
    mesh.write("virtual-service.yaml", &virtual_service_yaml(0))?;
    mesh.wait_for_backend("reviews-v2", 10, "/reviews", &[]).await?;
    assert_last_push_sent(&mesh, serde_json::json!({"rds": {"pushes": 1, "resources": 1}})).await?;
    mesh.assert_no_rejects().await
}

/// Polls `other.example.com` on `port` (see [`other_host_yaml`]) until ratings answers, within
/// 15 s; a listener not there yet counts as not routed. Returns the URL polled.
async fn wait_for_other_host(mesh: &GatewayMesh, port: u16) -> anyhow::Result<String> {
    let url = format!("http://127.0.0.1:{port}/ratings");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = test_support::backend::http_get(&url, &[("host", "other.example.com")]).await;
        let backend = r
            .as_ref()
            .ok()
            .and_then(|r| r.json().ok())
            .and_then(|v| v["backend"].as_str().map(str::to_owned));
        if backend.as_deref() == Some("ratings") {
            return Ok(url);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "port {port} never routed other.example.com: {r:?}\n{}",
            mesh.envoy.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts what pilot-discovery sent at its last push version (`/debug/push_status` `types`: per
/// type, responses and resources).
async fn assert_last_push_sent(mesh: &GatewayMesh, types: serde_json::Value) -> anyhow::Result<()> {
    let (_, status) = mesh.discovery.get("/debug/push_status", false).await?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    assert_eq!(status["types"], types, "{status}");
    Ok(())
}

/// The route configuration `name` as the gateway's Envoy has it (`/config_dump`).
async fn gateway_route_config(mesh: &GatewayMesh, name: &str) -> anyhow::Result<serde_json::Value> {
    let dump = mesh.envoy.config_dump().await?;
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["dynamic_route_configs"].as_array().into_iter().flatten())
        .map(|r| &r["route_config"])
        .find(|r| r["name"] == name)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no route configuration {name} in {dump}"))
}

/// The names of a route configuration's virtual hosts, sorted.
fn host_names(route_config: &serde_json::Value) -> Vec<String> {
    let mut hosts: Vec<String> = route_config["virtual_hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["name"].as_str().map(str::to_owned))
        .collect();
    hosts.sort();
    hosts
}

/// A route configuration that appears later (a Gateway server on a new port) gets its hosts over
/// VHDS right after its RDS answer: Envoy asks nothing more (its VHDS subscription has no names),
/// and its new listener would otherwise wait for them.
#[tokio::test]
async fn delta_xds_a_new_route_configuration_gets_its_hosts() -> anyhow::Result<()> {
    let mesh = GatewayMesh::start_with(Ads::Delta).await?;
    let port = test_support::ports::free_port();
    mesh.write("other.yaml", &other_host_yaml(port))?;
    wait_for_other_host(&mesh, port).await?;
    // the first port still routes, and its configuration was not disturbed
    assert!(matches!(
        mesh.who("/reviews", &[]).await?.as_deref(),
        Some("reviews-v1" | "reviews-v2")
    ));
    mesh.assert_no_rejects().await
}

/// A second host on the gateway's port: `other.example.com` to ratings.
fn other_host_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: other-gateway, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {port}, name: http-other, protocol: HTTP}}
    hosts: ["other.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: other, namespace: default}}
spec:
  hosts: ["other.example.com"]
  gateways: [other-gateway]
  http:
  - route:
    - destination: {{host: ratings.default.svc.cluster.local, port: {{number: 9080}}}}
"#
    )
}
