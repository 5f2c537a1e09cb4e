//! A real Envoy whose ADS cluster points at the proxy's Unix socket, and a real pilot-discovery
//! upstream serving a Gateway, a VirtualService and a ServiceEntry: Envoy gets ready, has the
//! gateway listener, and routes a request to the backend.

use std::time::Duration;

use serde_json::json;
use test_support::backend::{Backend, http_get};
use test_support::bootstrap::{AdsBootstrap, INGRESS_GATEWAY_CLUSTER};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::{Envoy, listener_names};
use test_support::ports::free_port;

use super::{start_proxy, within};

const NODE_ID: &str = "router~127.0.0.1~istio-ingressgateway-1.istio-system~istio-system.svc.cluster.local";
const HOST: &str = "proxied.example.com";

fn mesh_config(gateway_port: u16, backend_port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: http, protocol: HTTP}}
    hosts: ["{HOST}"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: default}}
spec:
  hosts: [echo.default.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP, targetPort: {backend_port}}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: echo, namespace: default}}
spec:
  hosts: ["{HOST}"]
  gateways: [gw]
  http:
  - route:
    - destination: {{host: echo.default.svc.cluster.local, port: {{number: 9080}}}}
"#
    )
}

async fn envoy_through_the_proxy(delta: bool) -> anyhow::Result<()> {
    let backend = Backend::start("echo").await?;
    let gateway_port = free_port();
    let config_dir = tempfile::tempdir()?;
    std::fs::write(
        config_dir.path().join("mesh.yaml"),
        mesh_config(gateway_port, backend.port()),
    )?;
    let discovery = Discovery::start(config_dir.path(), DiscoveryOptions::default()).await?;
    let agent_dir = tempfile::tempdir()?;
    let proxy = start_proxy(agent_dir.path(), discovery.grpc_addr, |_| {}).await;
    let mut status = proxy.status();

    let metadata = json!({
        "NAMESPACE": "istio-system",
        "LABELS": {"istio": "ingressgateway", "app": "istio-ingressgateway"},
        "CLUSTER_ID": "Kubernetes",
        "ISTIO_VERSION": "1.28.0",
    });
    let mut bootstrap = AdsBootstrap::new(NODE_ID, INGRESS_GATEWAY_CLUSTER, metadata, discovery.grpc_addr);
    if delta {
        bootstrap = bootstrap.delta();
    }
    let mut bootstrap = bootstrap.build();
    // The xds-grpc cluster reaches the agent's socket instead of pilot-discovery.
    let endpoint = bootstrap
        .pointer_mut("/static_resources/clusters/0/load_assignment/endpoints/0/lb_endpoints/0/endpoint")
        .expect("xds-grpc endpoint");
    endpoint["address"] = json!({"pipe": {"path": proxy.uds_path()}});

    let envoy = Envoy::start(bootstrap).await?;
    if let Err(err) = envoy.wait_ready(Duration::from_secs(30)).await {
        anyhow::bail!("{err:#}\n--- pilot-discovery ---\n{}", discovery.logs());
    }
    let dump = envoy.config_dump().await?;
    let listeners = listener_names(&dump);
    assert!(
        listeners.contains(&format!("0.0.0.0_{gateway_port}")),
        "no gateway listener on {gateway_port}: {listeners:?}"
    );
    within("CDS and LDS ACKed", status.wait_for(|s| s.config_received())).await?;
    assert_eq!(status.borrow().last_nack, None);
    assert!(status.borrow().upstream_connected);

    let url = format!("http://127.0.0.1:{gateway_port}/hello");
    let mut last = None;
    for _ in 0..100 {
        match http_get(&url, &[("host", HOST)]).await {
            Ok(r) if r.status == 200 => {
                assert_eq!(backend.count(), 1, "the request reached the backend once");
                return Ok(());
            }
            other => last = Some(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("no 200 through the gateway: {last:?}\n{}", envoy.log_tail())
}

#[tokio::test]
async fn real_envoy_gets_its_config_from_pilot_discovery_through_the_proxy() -> anyhow::Result<()> {
    envoy_through_the_proxy(false).await
}

#[tokio::test]
async fn real_envoy_speaks_delta_through_the_proxy() -> anyhow::Result<()> {
    envoy_through_the_proxy(true).await
}
