//! End-to-end: sidecars in network namespaces. Pods (test_support::netns) run an HTTP app, Istio's
//! iptables capture and `pilot-agent proxy sidecar` with real Envoy, fed by a real pilot-discovery
//! on the host. A client pod's request to `reviews.default.svc.cluster.local:9080` (a ServiceEntry
//! VIP) is captured by its sidecar, routed by a mesh VirtualService to a subset, and captured again
//! by the server pod's sidecar (its inbound cluster counts it). Envoy runs as uid 1337, which the
//! capture excludes, as in an injected pod. The tests (module `netns`) fail when not root or when
//! `ip netns`/iptables are missing; `scripts/test.sh` skips them on such machines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::netns::{Network, Pod, tail};

const VIP: &str = "240.240.0.10";
const TCP_VIP: &str = "240.240.0.11";
const TCP_HOST: &str = "tcp-echo.default.svc.cluster.local";
const GREETER_VIP: &str = "240.240.0.12";
const GREETER_HOST: &str = "greeter.default.svc.cluster.local";
const URL: &str = "http://reviews.default.svc.cluster.local:9080/";

struct SidecarMesh {
    dir: tempfile::TempDir,
    // Field order is drop order: pods (and their processes) before the bridge.
    client: Pod,
    reviews: BTreeMap<&'static str, Pod>,
    discovery: Discovery,
    net: Network,
}

/// Fails the test, saying what is missing, when this machine cannot run pods.
fn require_netns() {
    if let Err(why) = test_support::netns::supported() {
        panic!(
            "the sidecar tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why} \
             (scripts/test.sh skips them on such machines)"
        );
    }
}

fn workload_entry(name: &str, version: &str, ip: std::net::Ipv4Addr) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: default}}
spec:
  address: {ip}
  labels: {{app: reviews, version: {version}}}
  serviceAccount: default
"#
    )
}

fn virtual_service(v1_weight: u32) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - route:
    - destination: {{host: reviews.default.svc.cluster.local, subset: v1}}
      weight: {v1_weight}
    - destination: {{host: reviews.default.svc.cluster.local, subset: v2}}
      weight: {}
"#,
        100 - v1_weight
    )
}

const SERVICES: &str = r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  addresses: [240.240.0.10]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: tcp-echo, namespace: default}
spec:
  hosts: [tcp-echo.default.svc.cluster.local]
  addresses: [240.240.0.11]
  location: MESH_INTERNAL
  ports: [{number: 9090, name: tcp, protocol: TCP}]
  resolution: STATIC
  workloadSelector: {labels: {version: v1}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: default}
spec:
  hosts: [greeter.default.svc.cluster.local]
  addresses: [240.240.0.12]
  location: MESH_INTERNAL
  ports: [{number: 9091, name: tcp-greeter, protocol: TCP}]
  resolution: STATIC
  workloadSelector: {labels: {version: v1}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: default}
spec:
  hosts: [web.example.com]
  addresses: [240.240.0.13]
  location: MESH_EXTERNAL
  ports: [{number: 9092, name: http-web, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.255.0.1}]
"#;

impl SidecarMesh {
    async fn start(v1_weight: u32, outbound_policy: &str) -> anyhow::Result<SidecarMesh> {
        SidecarMesh::start_with(&virtual_service(v1_weight), outbound_policy).await
    }

    /// Pods productpage (client), reviews-v1 (also the TCP app on 9090, a server-first one on 9091,
    /// a TCP app on 9092 where web.example.com declares HTTP, and an HTTP app on 7777 that no
    /// service declares) and reviews-v2, with `virtual_service` for reviews.
    async fn start_with(virtual_service: &str, outbound_policy: &str) -> anyhow::Result<SidecarMesh> {
        SidecarMesh::start_full(virtual_service, outbound_policy, "").await
    }

    /// As [`start_with`](Self::start_with), with `extra` config documents (PeerAuthentication, ...).
    /// Every sidecar has its workload identity from pilot-discovery's CA (secure port on the
    /// host, tokens checked by `JWT_RULE`), so sidecars talk mutual TLS as Istio's do.
    async fn start_full(virtual_service: &str, outbound_policy: &str, extra: &str) -> anyhow::Result<SidecarMesh> {
        SidecarMesh::start_ca(virtual_service, outbound_policy, extra, false).await
    }

    /// As [`start_full`](Self::start_full); with `plaintext`, pilot-discovery runs as the README
    /// runs it, without a secure port (`--secureGrpcAddr ""`): xDS and the CA on the plaintext
    /// port 15010 of the host; each sidecar's `CA_ADDR` is that discovery address (the default),
    /// reached without TLS as Istio's agent does on 15010, with its pod's token.
    async fn start_ca(
        virtual_service: &str,
        outbound_policy: &str,
        extra: &str,
        plaintext: bool,
    ) -> anyhow::Result<SidecarMesh> {
        let net = Network::create()?;
        let hosts = [
            format!("{VIP} reviews.default.svc.cluster.local reviews"),
            format!("{TCP_VIP} {TCP_HOST}"),
            format!("{GREETER_VIP} {GREETER_HOST}"),
        ];
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let mut client = net.pod("productpage", &hosts)?;
        let mut reviews = BTreeMap::new();
        reviews.insert("v1", net.pod("reviews-v1", &hosts)?);
        reviews.insert("v2", net.pod("reviews-v2", &hosts)?);

        let dir = tempfile::tempdir()?;
        let mut config = SERVICES.to_owned();
        for (version, pod) in &reviews {
            config.push_str("---\n");
            config.push_str(&workload_entry(&pod.name, version, pod.ip));
        }
        std::fs::write(dir.path().join("services.yaml"), config)?;
        std::fs::write(dir.path().join("vs.yaml"), format!("{virtual_service}\n---\n{extra}"))?;
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(&mesh, format!("outboundTrafficPolicy: {{mode: {outbound_policy}}}\n"))?;
        let ca = if plaintext {
            MeshCa::plaintext(net.host_ip())?
        } else {
            MeshCa::new(net.host_ip())?
        };
        let opts = ca.serve(DiscoveryOptions {
            grpc_ip: Some(net.host_ip().into()),
            args: vec!["--meshConfig".into(), mesh.to_string_lossy().into_owned()],
            ..Default::default()
        });
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir)?;
        for f in ["services.yaml", "vs.yaml"] {
            std::fs::rename(dir.path().join(f), config_dir.join(f))?;
        }
        let discovery = Discovery::start(&config_dir, opts).await?;
        let xds = discovery.grpc_addr;
        let identity = ca.workload_identity("default")?;

        for (version, pod) in reviews.iter_mut() {
            pod.start_app(9080)?;
            if *version == "v1" {
                pod.start_tcp_app(9090)?;
                pod.start_greeter_app(9091)?;
                // raw TCP on a port a mesh service (web.example.com) declares HTTP
                pod.start_tcp_app(9092)?;
                pod.start_app(7777)?;
            }
            pod.capture()?;
            pod.start_sidecar_with(
                xds,
                "default",
                &json!({"app": "reviews", "version": version}),
                Some(&identity),
            )?;
        }
        client.capture()?;
        client.start_sidecar_with(xds, "default", &json!({"app": "productpage"}), Some(&identity))?;
        Ok(SidecarMesh {
            dir,
            client,
            reviews,
            discovery,
            net,
        })
    }

    fn pods(&self) -> impl Iterator<Item = &Pod> {
        std::iter::once(&self.client).chain(self.reviews.values())
    }

    /// The app that answered the client's captured request, if any.
    fn who(&self) -> Option<String> {
        let (code, body) = self.client.curl_app(URL, &[]).ok()?;
        if code != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["backend"].as_str().map(str::to_owned)
    }

    fn wait_for_backend(&self, backend: &str, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut in_a_row = 0;
        while in_a_row < n {
            let who = self.who();
            if who.as_deref() == Some(backend) {
                in_a_row += 1;
            } else {
                in_a_row = 0;
                std::thread::sleep(Duration::from_millis(200));
            }
            if Instant::now() > deadline {
                bail!(
                    "not routed to {backend} within 30s (last: {who:?}; curl: {:?})\n--- client agent ---\n{}\n--- pilot-discovery ---\n{}",
                    self.client.curl_app(URL, &[]),
                    tail(&self.client.log("pilot-agent.log")),
                    tail(&self.discovery.logs())
                );
            }
        }
        Ok(())
    }

    fn inbound_requests(&self, version: &str) -> anyhow::Result<u64> {
        self.reviews[version].cluster_stat("inbound|9080||", "upstream_rq_total")
    }

    /// No Envoy rejected any config pilot sent.
    fn assert_no_rejects(&self) -> anyhow::Result<()> {
        for pod in self.pods() {
            pod.assert_no_rejects()?;
        }
        Ok(())
    }
}

const HTTP_FEATURES: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
  - match: [{uri: {prefix: /fault}}]
    fault: {abort: {httpStatus: 418, percentage: {value: 100}}}
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - match: [{uri: {prefix: /delay}}]
    timeout: 1s
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - match: [{uri: {prefix: /status}}]
    retries: {attempts: 3, retryOn: 5xx, perTryTimeout: 2s}
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
"#;

/// How many requests the app on `port` of `pod` got for `path` (read from inside the pod, as
/// root, so not captured).
fn app_requests(pod: &Pod, port: u16, path: &str) -> anyhow::Result<u64> {
    let (code, body) = pod.curl_root(&format!("http://127.0.0.1:{port}/requests"))?;
    if code != 200 {
        bail!("/requests answered {code}: {body}");
    }
    let seen: serde_json::Value = serde_json::from_str(&body)?;
    Ok(seen[path].as_u64().unwrap_or(0))
}

/// The tests, named `netns::*` so that `scripts/test.sh` can skip them where pods cannot run.
mod netns {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn mesh_virtual_service_routes_captured_traffic_between_sidecars() {
        require_netns();
        let mesh = SidecarMesh::start(0, "ALLOW_ANY").await.unwrap();
        mesh.wait_for_backend("reviews-v2", 5).unwrap();
        // Envoy runs as istio-proxy, the uid the capture excludes.
        assert_eq!(mesh.client.envoy_uid().unwrap(), 1337);
        // The server side saw the requests through its own sidecar (inbound capture), v1 none.
        let v2_stats = mesh.reviews["v2"].envoy_stats().unwrap();
        let inbound: Vec<_> = v2_stats
            .iter()
            .filter(|(k, v)| k.contains("inbound") && **v > 0)
            .collect();
        assert!(
            mesh.inbound_requests("v2").unwrap() >= 5,
            "v2 inbound stats: {inbound:?}"
        );
        assert_eq!(mesh.inbound_requests("v1").unwrap(), 0);
        let v2 = "outbound|9080|v2|reviews.default.svc.cluster.local";
        assert!(
            mesh.client.cluster_stat(v2, "upstream_rq_total").unwrap() >= 5,
            "client outbound v2 stats"
        );
        mesh.assert_no_rejects().unwrap();

        // Moving all traffic to v1 lands in the running sidecars.
        std::fs::write(mesh.dir.path().join("config/vs.yaml"), virtual_service(100)).unwrap();
        mesh.wait_for_backend("reviews-v1", 5).unwrap();
        assert!(mesh.inbound_requests("v1").unwrap() >= 5);
        mesh.assert_no_rejects().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn weighted_split_follows_the_weights_over_200_requests() {
        require_netns();
        // 80/20: v1 should answer 160 of 200 (binomial sd 5.7); accept 4 sd either way.
        let mesh = SidecarMesh::start(80, "ALLOW_ANY").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = BTreeMap::<String, usize>::new();
        while seen.values().sum::<usize>() < 200 {
            if let Some(who) = mesh.who() {
                *seen.entry(who).or_default() += 1;
            } else {
                std::thread::sleep(Duration::from_millis(200));
            }
            assert!(Instant::now() < deadline, "only {seen:?} answered within 60s");
        }
        let v1 = seen.get("reviews-v1").copied().unwrap_or(0);
        let v2 = seen.get("reviews-v2").copied().unwrap_or(0);
        assert_eq!(v1 + v2, 200, "{seen:?}");
        assert!(
            (137..=183).contains(&v1),
            "v1 answered {v1} of 200 for a weight of 80: {seen:?}"
        );
        mesh.assert_no_rejects().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn registry_only_blocks_unknown_hosts() {
        require_netns();
        let mesh = SidecarMesh::start(0, "REGISTRY_ONLY").await.unwrap();
        mesh.wait_for_backend("reviews-v2", 3).unwrap();
        // An address no service declares (on-link in the pod, so nothing leaves the test bridge).
        let (code, _) = mesh.client.curl_app("http://240.240.9.9:7777/", &[]).unwrap();
        assert_ne!(code, 200);
        let stats = mesh.client.envoy_stats().unwrap();
        assert!(
            mesh.client
                .cluster_stat("BlackHoleCluster", "upstream_cx_none_healthy")
                .unwrap()
                >= 1,
            "BlackHoleCluster not used: {:?}",
            stats
                .iter()
                .filter(|(k, _)| k.contains("BlackHole") || k.contains("Passthrough"))
                .collect::<Vec<_>>()
        );
        mesh.assert_no_rejects().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn header_match_fault_timeout_and_retries_between_sidecars() {
        require_netns();
        let mesh = SidecarMesh::start_with(HTTP_FEATURES, "ALLOW_ANY").await.unwrap();
        mesh.wait_for_backend("reviews-v2", 3).unwrap();

        // Header match to a subset.
        for _ in 0..5 {
            let (code, body) = mesh.client.curl_app(URL, &["end-user: jason"]).unwrap();
            assert_eq!(code, 200, "{body}");
            assert!(body.contains("reviews-v1"), "{body}");
        }

        // Fault abort: answered by the client's sidecar, the backend never sees it.
        let (code, _) = mesh.client.curl_app(&format!("{URL}fault/x"), &[]).unwrap();
        assert_eq!(code, 418);
        assert_eq!(app_requests(&mesh.reviews["v2"], 9080, "/fault/x").unwrap(), 0);

        // Timeout: the backend answers after 3s, the route gives up after 1s with 504.
        let t0 = Instant::now();
        let (code, _) = mesh.client.curl_app(&format!("{URL}delay/3000"), &[]).unwrap();
        let took = t0.elapsed();
        assert_eq!(code, 504);
        assert!(took < Duration::from_millis(2500), "timed out after {took:?}");
        assert_eq!(app_requests(&mesh.reviews["v2"], 9080, "/delay/3000").unwrap(), 1);

        // Retries: one request and three retries on 5xx reach the backend.
        let (code, _) = mesh.client.curl_app(&format!("{URL}status/503"), &[]).unwrap();
        assert_eq!(code, 503);
        assert_eq!(app_requests(&mesh.reviews["v2"], 9080, "/status/503").unwrap(), 4);
        let v2 = "outbound|9080|v2|reviews.default.svc.cluster.local";
        assert!(mesh.client.cluster_stat(v2, "upstream_rq_retry").unwrap() >= 3);
        mesh.assert_no_rejects().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tcp_service_through_tcp_proxy_and_allow_any_passthrough() {
        require_netns();
        let mesh = SidecarMesh::start(0, "ALLOW_ANY").await.unwrap();
        mesh.wait_for_backend("reviews-v2", 3).unwrap();

        // A TCP service: the client's `240.240.0.11_9090` tcp_proxy, then reviews-v1's inbound chain.
        let answer = mesh.client.tcp_app(TCP_HOST, 9090, "ping").unwrap();
        assert_eq!(answer, "reviews-v1 ping");
        let outbound = format!("outbound|9090||{TCP_HOST}");
        assert!(mesh.client.cluster_stat(&outbound, "upstream_cx_total").unwrap() >= 1);
        assert!(
            mesh.reviews["v1"]
                .cluster_stat("inbound|9090||", "upstream_cx_total")
                .unwrap()
                >= 1
        );

        // A server-first TCP service (the server speaks first, as MySQL does): the greeting comes
        // through at once, as no inspector waits for client bytes on a port declared TCP.
        let greeting = mesh.client.tcp_app_greeting(GREETER_HOST, 9091).unwrap();
        assert_eq!(greeting, "reviews-v1 ready");

        // Raw TCP to a port that a mesh service declares HTTP, at an address that is no service:
        // not parsed as HTTP, but passed through to its destination, as Istio sniffs it. (At least
        // the 5 bytes of a TLS record header: the server side's passthrough chains accept mTLS too,
        // and Envoy's TLS inspector, as in Istio's PERMISSIVE mode, waits for that much.)
        let other = mesh.reviews["v1"].ip.to_string();
        let answer = mesh.client.tcp_app(&other, 9092, "raw bytes").unwrap();
        assert_eq!(answer, "reviews-v1 raw bytes");

        // ALLOW_ANY: an address and port no service declares passes through to its destination.
        let url = format!("http://{}:7777/", mesh.reviews["v1"].ip);
        let (code, body) = mesh.client.curl_app(&url, &[]).unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("reviews-v1"), "{body}");
        assert!(
            mesh.client
                .cluster_stat("PassthroughCluster", "upstream_cx_total")
                .unwrap()
                >= 1
        );
        mesh.assert_no_rejects().unwrap();
    }

    const STRICT_MESH: &str = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n\
        metadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}\n";

    /// Mutual TLS as Istio's: every sidecar holds its SPIFFE certificate from the CA, sidecars
    /// reach each other over mTLS (the server's inbound TLS handshakes count it); PERMISSIVE lets a
    /// pod without sidecar in, mesh-wide STRICT keeps it out while meshed clients still get
    /// through.
    #[tokio::test(flavor = "multi_thread")]
    async fn sidecars_talk_mutual_tls_and_strict_keeps_plaintext_out() {
        require_netns();
        let handshakes = |pod: &Pod| -> u64 {
            pod.envoy_stats()
                .unwrap()
                .iter()
                .filter(|(k, _)| k.starts_with("listener.") && k.ends_with(".ssl.handshake"))
                .map(|(_, v)| v)
                .sum()
        };
        // PERMISSIVE (no PeerAuthentication)
        let mesh = SidecarMesh::start(0, "ALLOW_ANY").await.unwrap();
        mesh.wait_for_backend("reviews-v2", 3).unwrap();
        let (_, certs) = mesh.client.curl_root("http://127.0.0.1:15000/certs").unwrap();
        assert!(
            certs.contains("spiffe://cluster.local/ns/default/sa/default"),
            "{certs}"
        );
        // the client's sidecar keeps its connection: one handshake for the requests so far
        assert!(handshakes(&mesh.reviews["v2"]) >= 1, "sidecar to sidecar is mTLS");
        let hosts: [&str; 0] = [];
        let legacy = mesh.net.pod("legacy", &hosts).unwrap();
        let direct = format!("http://{}:9080/", mesh.reviews["v2"].ip);
        let (code, _) = legacy.curl_root(&direct).unwrap();
        assert_eq!(code, 200, "PERMISSIVE takes plaintext from a pod without sidecar");
        mesh.assert_no_rejects().unwrap();
        drop(legacy);
        drop(mesh);

        // mesh-wide STRICT
        let mesh = SidecarMesh::start_full(&virtual_service(0), "ALLOW_ANY", STRICT_MESH)
            .await
            .unwrap();
        mesh.wait_for_backend("reviews-v2", 3).unwrap();
        let legacy = mesh.net.pod("legacy", &hosts).unwrap();
        let direct = format!("http://{}:9080/", mesh.reviews["v2"].ip);
        let (code, _) = legacy.curl_root(&direct).unwrap();
        assert_eq!(
            code, 0,
            "STRICT refuses plaintext (the connection is closed, no HTTP answer)"
        );
        assert!(
            mesh.who().as_deref() == Some("reviews-v2"),
            "meshed clients still get through"
        );
        mesh.assert_no_rejects().unwrap();
    }

    /// pilot-discovery without a secure port, as the README runs it: the sidecars (xDS in
    /// plaintext on 15010, their pod's token) get their certificates from the CA on that port,
    /// become ready and talk mutual TLS.
    #[tokio::test(flavor = "multi_thread")]
    async fn sidecars_get_their_certificates_from_the_ca_on_the_plaintext_port() {
        require_netns();
        let mesh = SidecarMesh::start_ca(&virtual_service(0), "ALLOW_ANY", "", true)
            .await
            .unwrap();
        assert_eq!(mesh.discovery.grpc_addr.port(), 15010);
        mesh.wait_for_backend("reviews-v2", 3).unwrap();
        let (_, certs) = mesh.client.curl_root("http://127.0.0.1:15000/certs").unwrap();
        assert!(
            certs.contains("spiffe://cluster.local/ns/default/sa/default"),
            "{certs}"
        );
        let handshakes: u64 = mesh.reviews["v2"]
            .envoy_stats()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("listener.") && k.ends_with(".ssl.handshake"))
            .map(|(_, v)| v)
            .sum();
        assert!(handshakes >= 1, "sidecar to sidecar is mTLS");
        mesh.assert_no_rejects().unwrap();
    }

    /// A DestinationRule that turns TLS off towards a STRICT workload fails as in Istio: the
    /// client's plaintext is refused by the server sidecar, the client gets 503.
    #[tokio::test(flavor = "multi_thread")]
    async fn destination_rule_disable_towards_strict_fails_as_in_istio() {
        require_netns();
        let disable = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n\
            metadata: {name: reviews-plaintext, namespace: default}\n\
            spec: {host: reviews.default.svc.cluster.local, trafficPolicy: {tls: {mode: DISABLE}}}\n";
        let mesh = SidecarMesh::start_full(
            &virtual_service(0),
            "ALLOW_ANY",
            &format!("{STRICT_MESH}---\n{disable}"),
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, _) = mesh.client.curl_app(URL, &[]).unwrap();
            if code == 503 {
                break;
            }
            assert!(Instant::now() < deadline, "plaintext to a STRICT sidecar got {code}");
            std::thread::sleep(Duration::from_millis(200));
        }
        mesh.assert_no_rejects().unwrap();
    }
}
