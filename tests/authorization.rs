//! End-to-end: AuthorizationPolicy enforced by real sidecars in network namespaces, as Istio's.
//! Pods `productpage` and `ratings` (service accounts of the same names) call `reviews` (HTTP on
//! 9080, a TCP echo on 9090) through their sidecars; sidecars talk mutual TLS with identities from
//! pilot-discovery's CA, so the reviews sidecar's RBAC filters see each caller's SPIFFE principal.
//! Policies are files in the watched config directory, changed while the pods run. The tests
//! (module `netns`) fail when this machine cannot run pods; `scripts/test.sh` skips them there.

use std::time::{Duration, Instant};

use anyhow::bail;
use security::testing::TestIssuer;
use serde_json::json;
use test_support::backend::DocumentServer;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::netns::{Network, Pod, WorkloadIdentity, tail};

const VIP: &str = "240.240.0.20";
const TCP_VIP: &str = "240.240.0.21";
const HOST: &str = "reviews.default.svc.cluster.local";
const TCP_HOST: &str = "tcp-echo.default.svc.cluster.local";

const SERVICES: &str = r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  addresses: [240.240.0.20]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: tcp-echo, namespace: default}
spec:
  hosts: [tcp-echo.default.svc.cluster.local]
  addresses: [240.240.0.21]
  location: MESH_INTERNAL
  ports: [{number: 9090, name: tcp, protocol: TCP}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
"#;

/// ALLOW `who` (a service account of `default`) on both ports of reviews, DENY `/admin*` on the
/// HTTP port (with its port: a DENY of HTTP attributes alone would deny every TCP connection).
fn reviews_policies(who: &str) -> String {
    format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: reviews-viewer, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  action: ALLOW
  rules:
  - from: [{{source: {{principals: ["cluster.local/ns/default/sa/{who}"]}}}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-admin, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  action: DENY
  rules:
  - to: [{{operation: {{paths: ["/admin*"], ports: ["9080"]}}}}]
"#
    )
}

/// A mesh-wide (root namespace) DENY of `/blocked`: it wins over any ALLOW.
const MESH_DENY: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: mesh-deny, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: ["/blocked"], ports: ["9080"]}}]
"#;

/// A namespace-wide ALLOW without rules: allow nothing in `default`.
const ALLOW_NOTHING: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: default}
spec: {}
"#;

struct AuthzMesh {
    dir: tempfile::TempDir,
    // Field order is drop order: pods before the bridge.
    productpage: Pod,
    ratings: Pod,
    reviews: Pod,
    discovery: Discovery,
    _net: Network,
}

fn require_netns() {
    if let Err(why) = test_support::netns::supported() {
        panic!(
            "the authorization tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why} \
             (scripts/test.sh skips them on such machines)"
        );
    }
}

impl AuthzMesh {
    async fn start(policies: &str) -> anyhow::Result<AuthzMesh> {
        let net = Network::create()?;
        let hosts = [format!("{VIP} {HOST}"), format!("{TCP_VIP} {TCP_HOST}")];
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let mut productpage = net.pod("productpage", &hosts)?;
        let mut ratings = net.pod("ratings", &hosts)?;
        let mut reviews = net.pod("reviews", &hosts)?;

        let dir = tempfile::tempdir()?;
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir)?;
        let entry = format!(
            "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: reviews, namespace: default}}\n\
             spec: {{address: {}, labels: {{app: reviews}}, serviceAccount: reviews}}\n",
            reviews.ip
        );
        std::fs::write(config_dir.join("services.yaml"), format!("{SERVICES}---\n{entry}"))?;
        std::fs::write(config_dir.join("authz.yaml"), policies)?;
        let ca = MeshCa::new(net.host_ip())?;
        let opts = ca.serve(DiscoveryOptions {
            grpc_ip: Some(net.host_ip().into()),
            ..Default::default()
        });
        let discovery = Discovery::start(&config_dir, opts).await?;
        let xds = discovery.grpc_addr;
        let identity = |sa: &str| -> anyhow::Result<WorkloadIdentity> {
            Ok(WorkloadIdentity {
                ca: ca.addr,
                root_pem: std::fs::read_to_string(ca.root_cert())?,
                token: ca.token("default", sa),
            })
        };

        reviews.start_app(9080)?;
        reviews.start_tcp_app(9090)?;
        reviews.capture()?;
        reviews.start_sidecar_with(xds, "default", &json!({"app": "reviews"}), Some(&identity("reviews")?))?;
        for (pod, app) in [(&mut productpage, "productpage"), (&mut ratings, "ratings")] {
            pod.capture()?;
            pod.start_sidecar_with(xds, "default", &json!({ "app": app }), Some(&identity(app)?))?;
        }
        Ok(AuthzMesh {
            dir,
            productpage,
            ratings,
            reviews,
            discovery,
            _net: net,
        })
    }

    fn set_policies(&self, policies: &str) -> anyhow::Result<()> {
        Ok(std::fs::write(self.dir.path().join("config/authz.yaml"), policies)?)
    }

    /// Waits until `pod`'s request for `path` is answered `code`; the last answer.
    fn expect_http(&self, pod: &Pod, path: &str, code: u16) -> anyhow::Result<String> {
        let url = format!("http://{HOST}:9080{path}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (got, body) = pod.curl_app(&url, &[])?;
            if got == code {
                return Ok(body);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} GET {path}: {got} ({body}), not {code}, within 30s\n--- reviews agent ---\n{}\n--- pilot-discovery ---\n{}",
                    pod.name,
                    tail(&self.reviews.log("pilot-agent.log")),
                    tail(&self.discovery.logs())
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The sum of the reviews sidecar's stats whose names end with `suffix`.
    fn reviews_stat(&self, suffix: &str) -> anyhow::Result<u64> {
        self.reviews.stat_sum(suffix)
    }

    fn assert_no_rejects(&self) -> anyhow::Result<()> {
        for pod in [&self.productpage, &self.ratings, &self.reviews] {
            pod.assert_no_rejects()?;
        }
        Ok(())
    }
}

/// A RequestAuthentication for reviews whose keys pilot-discovery fetches from `jwks_uri`, and an
/// ALLOW that requires a request principal of that issuer, and a DENY of the claim `group: banned`.
fn jwt_policies(issuer: &str, jwks_uri: &str) -> String {
    format!(
        r#"apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: reviews-jwt, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: "{issuer}"
    jwksUri: "{jwks_uri}"
    outputClaimToHeaders: [{{header: x-jwt-group, claim: group}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: require-jwt, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  action: ALLOW
  rules:
  - from: [{{source: {{requestPrincipals: ["{issuer}/*"]}}}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-banned, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  action: DENY
  rules:
  - when: [{{key: "request.auth.claims[group]", values: [banned]}}]
"#
    )
}

mod netns {
    use super::*;

    /// RequestAuthentication with keys pilot-discovery fetched (Envoy never talks to the issuer):
    /// no token 403 (the ALLOW needs a request principal), a token of another key 401, a good
    /// token 200 (its claim forwarded as a header), a claim a DENY names 403, an expired token 401.
    #[tokio::test(flavor = "multi_thread")]
    async fn request_authentication_with_fetched_keys_and_a_policy_requiring_a_jwt() {
        require_netns();
        let issuer = TestIssuer::new("https://issuer.example.com", "k1");
        let impostor = TestIssuer::new("https://issuer.example.com", "k1");
        let jwks = DocumentServer::start(vec![("/jwks".into(), issuer.jwks())])
            .await
            .unwrap();
        let jwks_uri = format!("http://{}/jwks", jwks.addr);
        let mesh = AuthzMesh::start(&jwt_policies(&issuer.issuer, &jwks_uri))
            .await
            .unwrap();
        let bearer = |token: &str| format!("authorization: Bearer {token}");
        let get = |token: Option<&str>| {
            let header = token.map(bearer);
            let headers: Vec<&str> = header.iter().map(String::as_str).collect();
            mesh.productpage
                .curl_app(&format!("http://{HOST}:9080/"), &headers)
                .unwrap()
        };
        let good = issuer.token_with(json!({"sub": "alice", "group": "staff"}), 600);
        let deadline = Instant::now() + Duration::from_secs(30);
        let body = loop {
            let (code, body) = get(Some(&good));
            if code == 200 {
                break body;
            }
            assert!(Instant::now() < deadline, "a good token got {code}: {body}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(jwks.hits() >= 1, "pilot-discovery fetched the keys");
        let echoed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(echoed["headers"]["x-jwt-group"], "staff", "{body}");
        assert_eq!(get(None), (403, "RBAC: access denied".into()));
        let (code, body) = get(Some(&impostor.token_with(json!({"sub": "mallory"}), 600)));
        assert_eq!(code, 401, "{body}");
        assert_eq!(get(Some("not-a-jwt")).0, 401);
        assert_eq!(get(Some(&issuer.token_with(json!({"sub": "alice"}), -120))).0, 401);
        let banned = issuer.token_with(json!({"sub": "bob", "group": "banned"}), 600);
        assert_eq!(get(Some(&banned)), (403, "RBAC: access denied".into()));

        // An issuer whose JWKS cannot be fetched: its tokens are refused, never accepted.
        let unreachable = TestIssuer::new("https://unreachable.example.com", "k2");
        let closed = test_support::ports::free_port();
        mesh.set_policies(&jwt_policies(
            &unreachable.issuer,
            &format!("http://127.0.0.1:{closed}/jwks"),
        ))
        .unwrap();
        let token = unreachable.token_with(json!({"sub": "carol"}), 600);
        // once the reviews sidecar has the new rule (its keys: the unsignable placeholder) ...
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, dump) = mesh.reviews.curl_root("http://127.0.0.1:15000/config_dump").unwrap();
            if dump.contains("https://unreachable.example.com") {
                assert!(!dump.contains(&issuer.issuer), "the old rule is gone");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the new RequestAuthentication never reached Envoy"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // ... its tokens are refused
        let (code, body) = get(Some(&token));
        assert_eq!(code, 401, "{body}");
        assert_eq!(get(None).0, 403);
        mesh.assert_no_rejects().unwrap();
    }

    /// ALLOW by principal (the allowed caller gets 200, another meshed caller 403 with Envoy's
    /// RBAC denial), DENY by path before ALLOW, the same ALLOW on a TCP port (the other caller's
    /// connection is closed), a mesh-wide DENY over a namespace ALLOW, a policy change taking
    /// effect in the running sidecars, and the `rbac.allowed`/`rbac.denied` stats.
    #[tokio::test(flavor = "multi_thread")]
    async fn allow_by_principal_deny_by_path_tcp_and_changes_without_restarts() {
        require_netns();
        let mesh = AuthzMesh::start(&reviews_policies("productpage")).await.unwrap();
        let body = mesh.expect_http(&mesh.productpage, "/", 200).unwrap();
        assert!(body.contains("reviews"), "{body}");
        let denied = mesh.expect_http(&mesh.ratings, "/", 403).unwrap();
        assert_eq!(denied, "RBAC: access denied");
        mesh.expect_http(&mesh.productpage, "/admin/users", 403).unwrap();
        mesh.expect_http(&mesh.productpage, "/reviews/1", 200).unwrap();

        // TCP: the network RBAC filter of the reviews sidecar's 9090 chain
        let echo = mesh.productpage.tcp_app(TCP_HOST, 9090, "ping").unwrap();
        assert_eq!(echo, "reviews ping");
        let refused = mesh.ratings.tcp_app(TCP_HOST, 9090, "ping");
        assert!(
            refused.as_deref().map_or(true, str::is_empty),
            "ratings' TCP connection should be closed: {refused:?}"
        );
        assert!(mesh.reviews_stat("tcp.rbac.denied").unwrap() >= 1);
        assert!(mesh.reviews_stat("tcp.rbac.allowed").unwrap() >= 1);
        // HTTP: Istio's bootstrap keeps the rbac stats of the inbound connection managers
        assert!(mesh.reviews_stat(".rbac.allowed").unwrap() >= 2);
        assert!(mesh.reviews_stat(".rbac.denied").unwrap() >= 2);
        // and the agent's merged Prometheus endpoint shows them as Istio's tag extraction names them
        let (code, prom) = mesh
            .reviews
            .curl_root("http://127.0.0.1:15020/stats/prometheus")
            .unwrap();
        assert_eq!(code, 200);
        let rbac: Vec<&str> = prom
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("rbac"))
            .collect();
        for result in ["allowed", "denied"] {
            assert!(
                rbac.iter()
                    .any(|l| l.contains(&format!("authz_enforce_result=\"{result}\"")) && !l.ends_with(" 0")),
                "no {result} rbac series: {rbac:#?}"
            );
        }

        // The policy follows the file: now ratings is allowed and productpage is not.
        let started = mesh.reviews.envoy_uid().unwrap();
        mesh.set_policies(&reviews_policies("ratings")).unwrap();
        mesh.expect_http(&mesh.ratings, "/", 200).unwrap();
        mesh.expect_http(&mesh.productpage, "/", 403).unwrap();
        assert_eq!(mesh.reviews.envoy_uid().unwrap(), started);

        // A mesh-wide DENY (root namespace) wins over the namespace's ALLOW.
        mesh.set_policies(&format!("{}---\n{MESH_DENY}", reviews_policies("ratings")))
            .unwrap();
        mesh.expect_http(&mesh.ratings, "/blocked", 403).unwrap();
        mesh.expect_http(&mesh.ratings, "/", 200).unwrap();
        mesh.assert_no_rejects().unwrap();
    }

    /// A namespace-wide ALLOW policy without rules allows nothing, for every caller and port;
    /// removing it lets everything in again (no policy: allow).
    #[tokio::test(flavor = "multi_thread")]
    async fn allow_nothing_denies_all_and_no_policy_allows_all() {
        require_netns();
        let mesh = AuthzMesh::start(ALLOW_NOTHING).await.unwrap();
        let denied = mesh.expect_http(&mesh.productpage, "/", 403).unwrap();
        assert_eq!(denied, "RBAC: access denied");
        mesh.expect_http(&mesh.ratings, "/", 403).unwrap();
        let refused = mesh.productpage.tcp_app(TCP_HOST, 9090, "ping");
        assert!(refused.as_deref().map_or(true, str::is_empty), "{refused:?}");
        assert!(mesh.reviews_stat("tcp.rbac.denied").unwrap() >= 1, "closed by RBAC");
        mesh.set_policies("").unwrap();
        mesh.expect_http(&mesh.productpage, "/", 200).unwrap();
        mesh.expect_http(&mesh.ratings, "/", 200).unwrap();
        assert_eq!(
            mesh.productpage.tcp_app(TCP_HOST, 9090, "ping").unwrap(),
            "reviews ping"
        );
        mesh.assert_no_rejects().unwrap();
    }
}
