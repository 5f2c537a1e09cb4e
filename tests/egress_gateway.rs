//! End-to-end: Istio's "Egress gateway for HTTPS traffic" task with pods in network namespaces.
//! An app's HTTPS request to `edition.cnn.com` is captured by its sidecar, sent by SNI (a mesh
//! `tls` route) to the egress gateway, a `pilot-agent proxy router` pod whose Gateway passes TLS
//! through on port 443 of its Service, which targets 8443 (the gateway runs unprivileged, as
//! Istio's); the gateway routes it by SNI to the external server (`openssl s_server` in a pod of its
//! own), whose certificate the app verifies. The egress gateway's Envoy counts the connection on
//! `outbound|443||edition.cnn.com`; nothing is rejected. Like the sidecar tests (module `netns`),
//! this needs root, `ip netns` and iptables; `scripts/test.sh` skips it on machines without them.

mod netns {
    use std::time::{Duration, Instant};

    use anyhow::{Context, ensure};
    use serde_json::json;
    use test_support::discovery::{Discovery, DiscoveryOptions};
    use test_support::mesh_ca::MeshCa;
    use test_support::netns::{Network, tail};
    use test_support::tls::TestCa;

    const HOST: &str = "edition.cnn.com";

    fn config(external: std::net::Ipv4Addr, egress: std::net::Ipv4Addr) -> String {
        format!(
            r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: cnn, namespace: default}}
spec:
  hosts: [{HOST}]
  ports: [{{number: 443, name: tls, protocol: TLS}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: {external}}}]
---
# The egress gateway's Service, as Istio's install makes it: 443 targets 8443.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: istio-egressgateway, namespace: istio-system}}
spec:
  hosts: [istio-egressgateway.istio-system.svc.cluster.local]
  ports: [{{number: 443, name: tls, protocol: TLS, targetPort: 8443}}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{address: {egress}, labels: {{istio: egressgateway}}}}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: istio-egressgateway, namespace: default}}
spec:
  selector: {{istio: egressgateway}}
  servers:
  - port: {{number: 443, name: tls, protocol: TLS}}
    hosts: [{HOST}]
    tls: {{mode: PASSTHROUGH}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: egressgateway-for-cnn, namespace: default}}
spec:
  host: istio-egressgateway.istio-system.svc.cluster.local
  subsets: [{{name: cnn}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: direct-cnn-through-egress-gateway, namespace: default}}
spec:
  hosts: [{HOST}]
  gateways: [mesh, istio-egressgateway]
  tls:
  - match: [{{gateways: [mesh], port: 443, sniHosts: [{HOST}]}}]
    route:
    - destination: {{host: istio-egressgateway.istio-system.svc.cluster.local, subset: cnn, port: {{number: 443}}}}
  - match: [{{gateways: [istio-egressgateway], port: 443, sniHosts: [{HOST}]}}]
    route:
    - destination: {{host: {HOST}, port: {{number: 443}}}}
      weight: 100
"#
        )
    }

    #[tokio::test]
    async fn https_to_an_external_host_leaves_through_the_egress_gateway() -> anyhow::Result<()> {
        if let Err(why) = test_support::netns::supported() {
            panic!("the egress gateway test needs network namespaces (root, `ip netns`, iptables): {why}");
        }
        let net = Network::create()?;
        let mut client = net.pod("sleep", &[])?;
        let mut egress = net.pod("istio-egressgateway", &[])?;
        let mut external = net.pod("cnn", &[])?;

        // The external server, with a certificate the app trusts.
        let ca = TestCa::new("external root")?;
        let cert = ca.issue_server(&[HOST])?;
        let files = cert.write(external.dir.path(), "cnn")?;
        let ca_file = client.dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.cert_pem())?;
        let (cert_path, key_path) = (files.cert.display().to_string(), files.key.display().to_string());
        external.spawn(
            "s_server.log",
            &[
                "openssl", "s_server", "-quiet", "-www", "-accept", "443", "-cert", &cert_path, "-key", &key_path,
            ],
            &[],
        )?;

        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("egress.yaml"), config(external.ip, egress.ip))?;
        let mesh_ca = MeshCa::new(net.host_ip())?;
        let opts = mesh_ca.serve(DiscoveryOptions {
            grpc_ip: Some(net.host_ip().into()),
            ..Default::default()
        });
        let discovery = Discovery::start(dir.path(), opts).await?;
        let xds = discovery.grpc_addr;

        egress.start_proxy(
            "router",
            xds,
            "istio-system",
            &json!({"istio": "egressgateway"}),
            Some(&mesh_ca.workload_identity("istio-system")?),
            &[],
        )?;
        client.capture()?;
        client.start_sidecar_with(
            xds,
            "default",
            &json!({"app": "sleep"}),
            Some(&mesh_ca.workload_identity("default")?),
        )?;

        let resolve = format!("{HOST}:443:{}", external.ip);
        let ca_arg = ca_file.display().to_string();
        let url = format!("https://{HOST}/");
        let deadline = Instant::now() + Duration::from_secs(20);
        let (code, body) = loop {
            let (code, body) = client.curl_app_with(&["--resolve", &resolve, "--cacert", &ca_arg], &url)?;
            if code == 200 || Instant::now() > deadline {
                break (code, body);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        ensure!(
            code == 200,
            "HTTPS through the egress gateway: {code} {body}\nsidecar:\n{}\negress gateway:\n{}",
            tail(&client.log("pilot-agent.log")),
            tail(&egress.log("pilot-agent.log"))
        );
        let through = egress
            .cluster_stat(&format!("outbound|443||{HOST}"), "upstream_cx_total")
            .context("egress gateway stats")?;
        ensure!(through >= 1, "the egress gateway opened no connection to {HOST}");
        let to_gateway = client.cluster_stat(
            "outbound|443|cnn|istio-egressgateway.istio-system.svc.cluster.local",
            "upstream_cx_total",
        )?;
        ensure!(to_gateway >= 1, "the sidecar did not send it to the egress gateway");
        client.assert_no_rejects()?;
        egress.assert_no_rejects()?;
        ensure!(
            discovery.metric("pilot_total_xds_rejects").await? == 0.0,
            "NACKs:\n{}",
            discovery.logs()
        );
        Ok(())
    }
}
