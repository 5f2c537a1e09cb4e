//! End-to-end: DestinationRule changes reach running sidecars over delta and state-of-the-world
//! xDS alike, as in Istio. Pods in network namespaces as in `tests/sidecar.rs`: reviews-v1 and
//! reviews-v2 serve `reviews` (a ServiceEntry VIP) behind their sidecars, and two clients call it
//! through theirs: productpage with pilot-agent's default, delta xDS, and details with state of
//! the world (`ISTIO_DELTA_XDS=false`), under a mesh-wide STRICT PeerAuthentication. The
//! `reviews` DestinationRule's TLS mode, subsets and load balancer change in turn in the watched
//! directory; after each change both Envoys' `config_dump` has the new clusters active (none left
//! warming for an assignment that never comes), traffic behaves as in Istio (plaintext towards
//! STRICT: 503) and no Envoy rejects anything. The tests (module `netns`) fail when this machine
//! cannot run pods; `scripts/test.sh` skips them there.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{Value, json};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::netns::{ADMIN_PORT, Network, Pod, tail};

const VIP: &str = "240.240.0.30";
const HOST: &str = "reviews.default.svc.cluster.local";
const URL: &str = "http://reviews.default.svc.cluster.local:9080/";
const DEFAULT: &str = "outbound|9080||reviews.default.svc.cluster.local";
const WAIT: Duration = Duration::from_secs(30);

fn subset(name: &str) -> String {
    format!("outbound|9080|{name}|{HOST}")
}

const SERVICE: &str = r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  addresses: [240.240.0.30]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
"#;

/// Every request to subset v2, whatever the rule's subsets are.
const ROUTES: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
"#;

const STRICT: &str = r#"apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
"#;

/// A second rule for the same host, merged into `reviews` as Istio merges them: it gives the
/// traffic policy when `reviews` has none.
const PLAINTEXT: &str = r#"apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-plaintext, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  trafficPolicy: {tls: {mode: DISABLE}}
"#;

/// The `reviews` rule: `subsets` as (name, version label), and a simple load balancer if any.
fn destination_rule(subsets: &[(&str, &str)], load_balancer: Option<&str>) -> String {
    let mut out = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n\
         metadata: {{name: reviews, namespace: default}}\nspec:\n  host: {HOST}\n  subsets:\n"
    );
    for (name, version) in subsets {
        out.push_str(&format!("  - {{name: {name}, labels: {{version: {version}}}}}\n"));
    }
    if let Some(lb) = load_balancer {
        out.push_str(&format!("  trafficPolicy: {{loadBalancer: {{simple: {lb}}}}}\n"));
    }
    out
}

fn workload_entry(pod: &Pod, version: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n\
         metadata: {{name: {}, namespace: default}}\n\
         spec: {{address: {}, labels: {{app: reviews, version: {version}}}, serviceAccount: default}}\n",
        pod.name, pod.ip
    )
}

/// Fails the test, saying what is missing, when this machine cannot run pods.
fn require_netns() {
    if let Err(why) = test_support::netns::supported() {
        panic!(
            "the DestinationRule tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why} \
             (scripts/test.sh skips them on such machines)"
        );
    }
}

struct Mesh {
    dir: tempfile::TempDir,
    // Field order is drop order: pods (and their processes) before the bridge.
    /// (xDS flavour, client pod): delta first.
    clients: [(&'static str, Pod); 2],
    servers: Vec<Pod>,
    discovery: Discovery,
    _net: Network,
}

impl Mesh {
    async fn start() -> anyhow::Result<Mesh> {
        let net = Network::create()?;
        let hosts = [format!("{VIP} {HOST} reviews")];
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let mut productpage = net.pod("productpage", &hosts)?;
        let mut details = net.pod("details", &hosts)?;
        let mut servers = vec![net.pod("reviews-v1", &hosts)?, net.pod("reviews-v2", &hosts)?];

        let dir = tempfile::tempdir()?;
        let config = dir.path().join("config");
        std::fs::create_dir(&config)?;
        let entries: Vec<String> = servers
            .iter()
            .zip(["v1", "v2"])
            .map(|(pod, version)| workload_entry(pod, version))
            .collect();
        std::fs::write(
            config.join("service.yaml"),
            format!("{SERVICE}---\n{}", entries.join("---\n")),
        )?;
        std::fs::write(
            config.join("reviews-dr.yaml"),
            destination_rule(&[("v1", "v1"), ("v2", "v2")], None),
        )?;
        std::fs::write(config.join("routes.yaml"), ROUTES)?;
        std::fs::write(config.join("peer-authentication.yaml"), STRICT)?;
        let ca = MeshCa::new(net.host_ip())?;
        let opts = ca.serve(DiscoveryOptions {
            grpc_ip: Some(net.host_ip().into()),
            ..Default::default()
        });
        let discovery = Discovery::start(&config, opts).await?;
        let xds = discovery.grpc_addr;
        let identity = ca.workload_identity("default")?;

        for (pod, version) in servers.iter_mut().zip(["v1", "v2"]) {
            pod.start_app(9080)?;
            pod.capture()?;
            let labels = json!({"app": "reviews", "version": version});
            pod.start_sidecar_with(xds, "default", &labels, Some(&identity))?;
        }
        productpage.capture()?;
        productpage.start_sidecar_with(xds, "default", &json!({"app": "productpage"}), Some(&identity))?;
        details.capture()?;
        let sotw = [("ISTIO_DELTA_XDS", "false")];
        details.start_sidecar_env(xds, "default", &json!({"app": "details"}), Some(&identity), &sotw)?;
        Ok(Mesh {
            dir,
            clients: [("delta", productpage), ("sotw", details)],
            servers,
            discovery,
            _net: net,
        })
    }

    /// Writes a file of the config directory whole (a rename), as `kubectl apply` would change it.
    fn write(&self, file: &str, yaml: &str) -> anyhow::Result<()> {
        let config = self.dir.path().join("config");
        let tmp = config.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, config.join(file))?;
        Ok(())
    }

    fn remove(&self, file: &str) -> anyhow::Result<()> {
        std::fs::remove_file(self.dir.path().join("config").join(file))?;
        Ok(())
    }

    /// Waits until `client`'s Envoy has no cluster warming and its active clusters satisfy
    /// `what`; returns them.
    fn wait_for_clusters(
        &self,
        client: &(&str, Pod),
        what: &str,
        pred: impl Fn(&BTreeMap<String, Value>) -> bool,
    ) -> anyhow::Result<BTreeMap<String, Value>> {
        let (flavour, pod) = client;
        let deadline = Instant::now() + WAIT;
        loop {
            let active = clusters(pod, "dynamic_active_clusters")?;
            let warming = clusters(pod, "dynamic_warming_clusters")?;
            if warming.is_empty() && pred(&active) {
                return Ok(active);
            }
            if Instant::now() > deadline {
                let reviews = |m: &BTreeMap<String, Value>| -> Vec<Value> {
                    m.iter()
                        .filter(|(n, _)| n.ends_with(HOST))
                        .map(|(_, c)| c.clone())
                        .collect()
                };
                bail!(
                    "{} ({flavour}): not {what} within {WAIT:?}\nactive: {:#}\nwarming: {:#}\n\
                     --- agent ---\n{}\n--- pilot-discovery ---\n{}",
                    pod.name,
                    json!(reviews(&active)),
                    json!(reviews(&warming)),
                    tail(&pod.log("pilot-agent.log")),
                    tail(&self.discovery.logs())
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until `client`'s request to reviews is answered `status` (by `backend`, if given)
    /// three times in a row.
    fn wait_for_answer(&self, client: &(&str, Pod), status: u16, backend: Option<&str>) -> anyhow::Result<()> {
        let (flavour, pod) = client;
        let deadline = Instant::now() + WAIT;
        let mut in_a_row = 0;
        loop {
            let (code, body) = pod.curl_app(URL, &[])?;
            let who: Option<String> = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["backend"].as_str().map(str::to_owned));
            if code == status && (backend.is_none() || who.as_deref() == backend) {
                in_a_row += 1;
                if in_a_row == 3 {
                    return Ok(());
                }
                continue;
            }
            in_a_row = 0;
            if Instant::now() > deadline {
                bail!(
                    "{} ({flavour}): not answered {status} {backend:?} within {WAIT:?} (last: {code} {body})\n\
                     --- agent ---\n{}",
                    pod.name,
                    tail(&pod.log("pilot-agent.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// No Envoy rejected any config, and pilot-discovery counted no NACK.
    async fn assert_no_rejects(&self) -> anyhow::Result<()> {
        for pod in self.clients.iter().map(|(_, p)| p).chain(&self.servers) {
            pod.assert_no_rejects()?;
        }
        let nacks = self.discovery.metric("pilot_total_xds_rejects").await?;
        if nacks != 0.0 {
            bail!("pilot counted {nacks} NACKs:\n{}", tail(&self.discovery.logs()));
        }
        Ok(())
    }
}

/// Envoy's clusters of a `config_dump` resource (`dynamic_active_clusters`, ...) in `pod`, by name.
fn clusters(pod: &Pod, resource: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let url = format!("http://127.0.0.1:{ADMIN_PORT}/config_dump?resource={resource}");
    let (code, body) = pod.curl_root(&url)?;
    if code != 200 {
        bail!("{} {url}: {code} {body}", pod.name);
    }
    let dump: Value = serde_json::from_str(&body)?;
    Ok(dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["cluster"]["name"].as_str()?.to_owned(), c.clone())))
        .collect())
}

/// Istio's auto mTLS: the cluster picks TLS for endpoints labelled `tlsMode: istio`.
fn auto_mtls(cluster: &Value) -> bool {
    cluster["cluster"]["transport_socket_matches"]
        .as_array()
        .is_some_and(|m| !m.is_empty())
}

/// Neither a transport socket nor matches: plaintext to every endpoint.
fn plaintext(cluster: &Value) -> bool {
    !auto_mtls(cluster) && cluster["cluster"]["transport_socket"].is_null()
}

/// The cluster's `lb_policy` (Envoy leaves out its default, ROUND_ROBIN).
fn lb_policy(cluster: &Value) -> &str {
    cluster["cluster"]["lb_policy"].as_str().unwrap_or("ROUND_ROBIN")
}

/// The addresses of the endpoints Envoy holds for `cluster` in `pod`.
fn endpoint_addresses(pod: &Pod, cluster: &str) -> anyhow::Result<Vec<String>> {
    let url = format!("http://127.0.0.1:{ADMIN_PORT}/config_dump?resource=dynamic_endpoint_configs&include_eds");
    let (code, body) = pod.curl_root(&url)?;
    if code != 200 {
        bail!("{} {url}: {code} {body}", pod.name);
    }
    let dump: Value = serde_json::from_str(&body)?;
    let configs = dump["configs"].as_array().into_iter().flatten();
    let Some(assignment) = configs
        .map(|c| &c["endpoint_config"])
        .find(|e| e["cluster_name"] == cluster)
    else {
        return Ok(Vec::new());
    };
    let endpoints = assignment["endpoints"].as_array().into_iter().flatten();
    Ok(endpoints
        .flat_map(|l| l["lb_endpoints"].as_array().into_iter().flatten())
        .filter_map(|e| e["endpoint"]["address"]["socket_address"]["address"].as_str())
        .map(str::to_owned)
        .collect())
}

/// The tests, named `netns::*` so that `scripts/test.sh` can skip them where pods cannot run.
mod netns {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn destination_rule_tls_subsets_and_load_balancer_reach_running_delta_and_sotw_sidecars() {
        require_netns();
        let mesh = Mesh::start().await.unwrap();
        let (v1, v2, v3) = (subset("v1"), subset("v2"), subset("v3"));
        let v2_ip = mesh.servers[1].ip.to_string();
        let adsz: Value = serde_json::from_str(&mesh.discovery.get("/debug/adsz", false).await.unwrap().1).unwrap();
        let mut before = Vec::new();
        for client in &mesh.clients {
            let delta = adsz["clients"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["proxy_id"] == format!("{}.default", client.1.name))
                .map(|c| c["delta"].clone());
            assert_eq!(delta, Some(json!(client.0 == "delta")), "{}: {adsz:#}", client.1.name);
            mesh.wait_for_answer(client, 200, Some("reviews-v2")).unwrap();
            let clusters = mesh
                .wait_for_clusters(client, "auto mTLS", |c| {
                    [DEFAULT, &v2].iter().all(|n| c.get(*n).is_some_and(auto_mtls))
                })
                .unwrap();
            before.push(clusters);
        }

        // TLS mode: a new rule turns TLS off. The server sidecars are STRICT: plaintext is
        // refused, the client gets 503, as in Istio.
        mesh.write("reviews-plaintext.yaml", PLAINTEXT).unwrap();
        for (client, before) in mesh.clients.iter().zip(&before) {
            let now = mesh
                .wait_for_clusters(client, "plaintext", |c| {
                    [DEFAULT, &v1, &v2].iter().all(|n| c.get(*n).is_some_and(plaintext))
                })
                .unwrap();
            assert_ne!(
                now[DEFAULT]["last_updated"], before[DEFAULT]["last_updated"],
                "{}: the cluster was replaced",
                client.1.name
            );
            mesh.wait_for_answer(client, 503, None).unwrap();
        }
        // and deleted: auto mTLS again
        mesh.remove("reviews-plaintext.yaml").unwrap();
        for client in &mesh.clients {
            mesh.wait_for_clusters(client, "auto mTLS again", |c| {
                [DEFAULT, &v1, &v2].iter().all(|n| c.get(*n).is_some_and(auto_mtls))
            })
            .unwrap();
            mesh.wait_for_answer(client, 200, Some("reviews-v2")).unwrap();
        }

        // Subsets, in the rule's own file: v1 goes, v3 (the v2 pod) comes with its endpoint.
        let subsets = [("v2", "v2"), ("v3", "v2")];
        mesh.write("reviews-dr.yaml", &destination_rule(&subsets, None))
            .unwrap();
        for client in &mesh.clients {
            mesh.wait_for_clusters(client, "subsets v2 and v3", |c| {
                !c.contains_key(&v1) && c.contains_key(&v2) && c.contains_key(&v3)
            })
            .unwrap();
            assert_eq!(endpoint_addresses(&client.1, &v3).unwrap(), [v2_ip.as_str()]);
            mesh.wait_for_answer(client, 200, Some("reviews-v2")).unwrap();
        }

        // Load balancer: every cluster of the host, subsets included, as Istio merges policies.
        let before: Vec<_> = mesh
            .clients
            .iter()
            .map(|client| mesh.wait_for_clusters(client, "settled", |_| true).unwrap())
            .collect();
        mesh.write("reviews-dr.yaml", &destination_rule(&subsets, Some("RANDOM")))
            .unwrap();
        for (client, before) in mesh.clients.iter().zip(&before) {
            let now = mesh
                .wait_for_clusters(client, "RANDOM", |c| {
                    [DEFAULT, &v2, &v3]
                        .iter()
                        .all(|n| c.get(*n).is_some_and(|c| lb_policy(c) == "RANDOM"))
                })
                .unwrap();
            assert!(
                [DEFAULT, &v2, &v3].iter().all(|n| auto_mtls(&now[*n])),
                "{}: TLS as it was",
                client.1.name
            );
            assert_ne!(now[&v2]["last_updated"], before[&v2]["last_updated"]);
            // the replaced v2 cluster serves: it got its endpoints
            assert_eq!(endpoint_addresses(&client.1, &v2).unwrap(), [v2_ip.as_str()]);
            mesh.wait_for_answer(client, 200, Some("reviews-v2")).unwrap();
        }

        // Two changes within one debounce interval: Istio's default load balancer again, and TLS
        // off (the second rule's policy applies once `reviews` has none).
        mesh.write("reviews-dr.yaml", &destination_rule(&subsets, None))
            .unwrap();
        mesh.write("reviews-plaintext.yaml", PLAINTEXT).unwrap();
        for client in &mesh.clients {
            mesh.wait_for_clusters(client, "LEAST_REQUEST and plaintext", |c| {
                [DEFAULT, &v2, &v3].iter().all(|n| {
                    c.get(*n)
                        .is_some_and(|c| lb_policy(c) == "LEAST_REQUEST" && plaintext(c))
                })
            })
            .unwrap();
            mesh.wait_for_answer(client, 503, None).unwrap();
        }
        mesh.assert_no_rejects().await.unwrap();
    }
}
