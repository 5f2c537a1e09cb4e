//! End-to-end: DNS through pilot-agent's DNS proxy in network namespaces, as Istio's DNS capture.
//! The app pod has no /etc/hosts entries for the mesh; its resolv.conf names a resolver on the
//! host (a small fake one in this test) with Kubernetes' search list, `istio-iptables
//! --redirect-dns` captures its DNS to the agent (`ISTIO_META_DNS_CAPTURE=true`), which answers
//! the mesh's names from the NDS name table pilot-discovery sends and forwards the rest. The tests
//! (module `netns`) fail when this machine cannot run pods; `scripts/test.sh` skips them there.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use serde_json::json;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::netns::Network;

const VIP: &str = "240.240.0.30";
const EXTERNAL: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

fn config(reviews_ip: Ipv4Addr, with_gone: bool) -> String {
    let mut c = format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews.default.svc.cluster.local]
  addresses: [{VIP}]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews, namespace: default}}
spec: {{address: {reviews_ip}, labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: default}}
spec:
  hosts: [echo.tcp.example.com]
  location: MESH_INTERNAL
  ports: [{{number: 9090, name: tcp, protocol: TCP}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: reviews}}}}
"#
    );
    if with_gone {
        c.push_str(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: gone, namespace: default}\n\
             spec: {hosts: [gone.example.com], addresses: [240.240.0.31], location: MESH_EXTERNAL, resolution: STATIC,\n\
             \x20 ports: [{number: 80, name: http, protocol: HTTP}], endpoints: [{address: 10.255.0.1}]}\n",
        );
    }
    c
}

/// A resolver on `ip:53` (UDP) that knows `external.test` only; counts queries.
async fn fake_resolver(ip: Ipv4Addr) -> anyhow::Result<Arc<AtomicUsize>> {
    let socket = tokio::net::UdpSocket::bind(SocketAddr::from((ip, 53))).await?;
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            c.fetch_add(1, Ordering::SeqCst);
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::response(req.metadata.id, OpCode::Query);
            r.metadata.recursion_desired = req.metadata.recursion_desired;
            r.metadata.recursion_available = true;
            r.queries = req.queries.clone();
            match req.queries.first() {
                Some(q) if q.name().to_ascii() == "external.test." && q.query_type() == RecordType::A => {
                    r.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(EXTERNAL))));
                }
                Some(q) if q.name().to_ascii() == "external.test." => {}
                _ => r.metadata.response_code = ResponseCode::NXDomain,
            }
            if let Ok(bytes) = r.to_vec() {
                let _ = socket.send_to(&bytes, peer).await;
            }
        }
    });
    Ok(count)
}

fn require_netns() {
    if let Err(why) = test_support::netns::supported() {
        panic!(
            "the DNS tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why} \
             (scripts/test.sh skips them on such machines)"
        );
    }
}

/// Polls until `f` holds (config and name tables reach the pods asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> anyhow::Result<bool>, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(true) => return,
            Ok(false) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("{what}: {other:?}\n{}", logs()),
        }
    }
}

mod netns {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn mesh_names_resolve_through_the_agent_and_the_rest_upstream() {
        require_netns();
        let net = Network::create().unwrap();
        let upstream_queries = fake_resolver(net.host_ip()).await.unwrap();
        let mut app = net.pod("app", &[]).unwrap();
        let mut reviews = net.pod("reviews", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mesh.yaml"), config(reviews.ip, true)).unwrap();
        let ca = MeshCa::new(net.host_ip()).unwrap();
        let opts = ca.serve(DiscoveryOptions {
            grpc_ip: Some(net.host_ip().into()),
            ..Default::default()
        });
        let discovery = Discovery::start(dir.path(), opts).await.unwrap();
        let xds = discovery.grpc_addr;
        let identity = ca.workload_identity("default").unwrap();
        reviews.start_app(9080).unwrap();
        reviews.start_tcp_app(9090).unwrap();
        reviews.capture().unwrap();
        reviews
            .start_sidecar_with(xds, "default", &json!({"app": "reviews"}), Some(&identity))
            .unwrap();
        // Kubernetes' pod resolv.conf, pointing at the (fake) cluster resolver on the host
        app.set_resolv_conf(&format!(
            "nameserver {}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5 timeout:2 attempts:2\n",
            net.host_ip()
        ))
        .unwrap();
        app.capture_with(&["--redirect-dns"]).unwrap();
        app.start_sidecar_env(
            xds,
            "default",
            &json!({"app": "client"}),
            Some(&identity),
            &[("ISTIO_META_DNS_CAPTURE", "true")],
        )
        .unwrap();
        let logs = || {
            format!(
                "--- app agent ---\n{}\n--- pilot-discovery ---\n{}",
                app.log("pilot-agent.log"),
                discovery.logs()
            )
        };

        // the FQDN, and the short forms through the search list, resolve to the VIP
        eventually(
            "reviews resolves to its VIP",
            || Ok(app.resolve("reviews.default.svc.cluster.local")? == [VIP]),
            logs,
        );
        assert_eq!(app.resolve("reviews").unwrap(), [VIP]);
        assert_eq!(app.resolve("reviews.default").unwrap(), [VIP]);
        // ... and the app reaches the service by name through its sidecar
        let (code, body) = app.curl_app("http://reviews:9080/", &[]).unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("\"reviews\""), "{body}");
        // AAAA of a v4-only mesh host: an empty NOERROR, answered locally
        let before = upstream_queries.load(Ordering::SeqCst);
        assert_eq!(app.dns_query("reviews.default.svc.cluster.local", 28).unwrap(), (0, 0));
        assert_eq!(app.dns_query("reviews.default.svc.cluster.local", 1).unwrap(), (0, 1));
        assert_eq!(
            upstream_queries.load(Ordering::SeqCst),
            before,
            "mesh names never go upstream"
        );
        // an external name: the upstream resolver's answer, through the agent
        assert_eq!(app.resolve("external.test").unwrap(), [EXTERNAL.to_string()]);
        assert!(upstream_queries.load(Ordering::SeqCst) > before);
        assert_eq!(
            app.dns_query("nonexistent.test", 1).unwrap().0,
            3,
            "NXDOMAIN from upstream"
        );

        // a TCP ServiceEntry without addresses: an allocated VIP the app resolves and connects to
        let echo = app.resolve("echo.tcp.example.com").unwrap();
        assert!(echo.len() == 1 && echo[0].starts_with("240.240."), "{echo:?}");
        assert_eq!(
            app.tcp_app("echo.tcp.example.com", 9090, "ping").unwrap(),
            "reviews ping"
        );
        assert!(
            app.cluster_stat("outbound|9090||echo.tcp.example.com", "upstream_cx_total")
                .unwrap()
                >= 1,
            "through the sidecar's listener on the allocated VIP"
        );

        // a host removed from config stops resolving after the push
        assert_eq!(app.resolve("gone.example.com").unwrap(), ["240.240.0.31"]);
        std::fs::write(dir.path().join("mesh.yaml"), config(reviews.ip, false)).unwrap();
        eventually(
            "gone.example.com stops resolving",
            || Ok(app.resolve("gone.example.com")?.is_empty()),
            logs,
        );
        let (code, stats) = app.curl_root("http://127.0.0.1:15020/stats/prometheus").unwrap();
        let dns: Vec<&str> = stats.lines().filter(|l| l.starts_with("istio_agent_dns_")).collect();
        assert!(
            dns.iter()
                .any(|l| l.starts_with("istio_agent_dns_requests_total ") && !l.ends_with(" 0")),
            "DNS metrics on the agent's merged Prometheus endpoint: {code} {dns:?}"
        );
        app.assert_no_rejects().unwrap();
        reviews.assert_no_rejects().unwrap();
    }
}
