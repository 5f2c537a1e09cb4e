//! The secure xDS port end to end in-process: the real environment and xDS server behind TLS with istiod's
//! certificate from a CA directory, a tonic client that trusts the mesh root, and one that
//! does not.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use xds_api::type_url;
use xds_server::{DiscoveryServer, ServerOptions};

use super::*;
use environment::Environment;
use registry::ServiceEntries;

const NODE_ID: &str = "router~127.0.0.1~gw.istio-system~istio-system.svc.cluster.local";

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| m.get(k).cloned()
}

#[test]
fn settings_from_env() {
    let s = CaSettings::from_env(env(&[])).unwrap();
    assert_eq!(s.root_ca_dir, PathBuf::from("./etc/cacerts"));
    assert!(s.custom_hosts.is_empty());
    assert_eq!(s.self_signed_ca_cert_ttl, ca::DEFAULT_SELF_SIGNED_CA_CERT_TTL);
    let s = CaSettings::from_env(env(&[
        ("ROOT_CA_DIR", "/tmp/ca"),
        ("ISTIOD_CUSTOM_HOST", "istiod.example.com, , pilot.example.com"),
        ("CITADEL_SELF_SIGNED_CA_CERT_TTL", "24h"),
    ]))
    .unwrap();
    assert_eq!(s.root_ca_dir, PathBuf::from("/tmp/ca"));
    assert_eq!(s.custom_hosts, vec!["istiod.example.com", "pilot.example.com"]);
    assert_eq!(s.self_signed_ca_cert_ttl, Duration::from_secs(24 * 3600));
    let e = CaSettings::from_env(env(&[("CITADEL_SELF_SIGNED_CA_CERT_TTL", "forever")])).unwrap_err();
    assert_eq!(e.name, "CITADEL_SELF_SIGNED_CA_CERT_TTL");
    assert!(CaSettings::from_env(env(&[("CITADEL_SELF_SIGNED_CA_CERT_TTL", "0s")])).is_err());
}

#[test]
fn istiod_names_as_istio_plus_loopback() {
    let settings = CaSettings::from_env(env(&[
        ("ISTIOD_CUSTOM_HOST", "istiod.example.com"),
        ("REVISION", "canary"),
    ]))
    .unwrap();
    let mesh = MeshConfig::default();
    let (dns, ips) = istiod_names(&settings, &mesh, "istio-system", "0.0.0.0:15012".parse().unwrap());
    assert_eq!(
        dns,
        vec![
            "istio-pilot.istio-system.svc",
            "istiod-canary.istio-system.svc",
            "istiod-remote.istio-system.svc",
            "istiod.example.com",
            "istiod.istio-system.svc",
            "localhost",
        ]
    );
    assert_eq!(ips, vec![IpAddr::from([127, 0, 0, 1]), IpAddr::V6(Ipv6Addr::LOCALHOST)]);

    // Another namespace, a discovery address by IP, a specific listen address.
    let mut mesh = MeshConfig::default();
    mesh.default_config.discovery_address = "10.1.2.3:15012".into();
    let settings = CaSettings::from_env(env(&[("REVISION", "default")])).unwrap();
    let (dns, ips) = istiod_names(&settings, &mesh, "mesh", "192.168.1.5:15012".parse().unwrap());
    assert_eq!(
        dns,
        vec![
            "istio-pilot.mesh.svc",
            "istiod-remote.mesh.svc",
            "istiod.mesh.svc",
            "localhost"
        ]
    );
    assert_eq!(ips[2..], [IpAddr::from([10, 1, 2, 3]), IpAddr::from([192, 168, 1, 5])]);
}

#[test]
fn discovery_host_forms() {
    assert_eq!(
        discovery_host("istiod.istio-system.svc:15012"),
        "istiod.istio-system.svc"
    );
    assert_eq!(discovery_host("[fd00::1]:15012"), "fd00::1");
    assert_eq!(discovery_host("istiod"), "istiod");
    assert_eq!(discovery_host("fd00::1"), "fd00::1");
}

/// The real environment (empty config) and xDS server behind TLS on 127.0.0.1:0.
/// The tokens of the tests' "cluster": `JWT_RULE` names this issuer's inline JWKS.
fn issuer() -> security::testing::TestIssuer {
    security::testing::TestIssuer::new("https://kubernetes.default.svc", "k1")
}

struct Started {
    addr: SocketAddr,
    root: String,
    registry: Arc<std::sync::Mutex<Registry>>,
}

async fn start(ca_dir: &std::path::Path, issuer: &security::testing::TestIssuer) -> Started {
    start_with_timeout(ca_dir, issuer, crate::accept::CONNECTION_TIMEOUT).await
}

async fn start_with_timeout(
    ca_dir: &std::path::Path,
    issuer: &security::testing::TestIssuer,
    timeout: Duration,
) -> Started {
    let mesh = Arc::new(MeshConfig::default());
    let mut registry = Registry::default();
    let environment = Arc::new(Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![Box::new(ServiceEntries::new(mesh.clone()))],
    ));
    let server = DiscoveryServer::new(environment, ServerOptions::default(), &mut registry);
    server.start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = ca_dir.display().to_string();
    let rule = serde_json::json!({"issuer": issuer.issuer, "jwks": issuer.jwks()}).to_string();
    let secure = SecureGrpc::init(
        addr,
        &mesh,
        "istio-system",
        env(&[
            ("ROOT_CA_DIR", &dir),
            ("JWT_RULE", &rule),
            ("MAX_WORKLOAD_CERT_TTL", "48h"),
        ]),
        &mut registry,
        None,
        crate::serving_cert::Source::Istiod,
    )
    .await
    .unwrap();
    // Clients trust what the CA directory distributes.
    let root = std::fs::read_to_string(ca_dir.join(ca::ROOT_CERT_FILE)).unwrap();
    let setup = crate::accept::Setup {
        timeout,
        metrics: crate::accept::SetupMetrics::register(&mut registry),
    };
    let ca_limit = crate::ca_limits::RequestLimit::register(4 << 20, &mut registry);
    tokio::spawn(secure.serve(
        tonic::transport::Server::builder(),
        listener,
        setup,
        ca_limit,
        server.ads_service(),
    ));
    server.wait_ready().await;
    Started {
        addr,
        root,
        registry: Arc::new(std::sync::Mutex::new(registry)),
    }
}

async fn tls_channel(addr: SocketAddr, root_pem: &str, domain: &str) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name(domain);
    Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test]
async fn ads_over_tls_serves_authenticated_callers_their_own_namespace_only() {
    let tmp = tempfile::tempdir().unwrap();
    let issuer = issuer();
    let s = start(tmp.path(), &issuer).await;
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(ca::ROOT_CERT_FILE)).unwrap(),
        s.root
    );
    let channel = || tls_channel(s.addr, &s.root, "istiod.istio-system.svc");
    let ads = test_support::ads::AdsClient::on_channel_with_token;

    // no token, no client certificate: refused before any config is read
    let e = ads(channel().await.unwrap(), None, NODE_ID, serde_json::json!({}))
        .await
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("authentication failure"), "{e:#}");

    // the gateway's own service account
    let token = issuer.token("istio-system", "gw", &["istio-ca"], 600);
    let mut client = ads(channel().await.unwrap(), Some(&token), NODE_ID, serde_json::json!({}))
        .await
        .unwrap();
    client.request(type_url::CLUSTER, &[]).unwrap();
    let names = client.expect_type(type_url::CLUSTER).await.unwrap().names;
    assert!(names.iter().any(|n| n == "BlackHoleCluster"), "{names:?}");

    // a workload of `default` naming a node of istio-system
    let other = issuer.token("default", "reviews", &["istio-ca"], 600);
    let mut client = ads(channel().await.unwrap(), Some(&other), NODE_ID, serde_json::json!({}))
        .await
        .unwrap();
    client.request(type_url::CLUSTER, &[]).unwrap();
    let e = client.expect_type(type_url::CLUSTER).await.err().unwrap();
    assert!(format!("{e:#}").contains("authorization failed"), "{e:#}");
}

/// A CSR as pilot-agent makes it: a new P-256 key, asking for `san`.
fn csr(san: &str) -> (rcgen::KeyPair, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(san.to_owned().try_into().unwrap())];
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (key, pem)
}

async fn create_certificate(
    channel: Channel,
    token: Option<&str>,
    csr: &str,
    ttl: i64,
) -> Result<Vec<String>, tonic::Status> {
    use istio_api::ca::IstioCertificateRequest;
    use istio_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_owned(),
        validity_duration: ttl,
        metadata: None,
    });
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .map(|r| r.into_inner().cert_chain)
}

fn uri_sans(cert_pem: &str) -> Vec<String> {
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    security::spiffe_uri_sans(der.as_ref()).unwrap()
}

#[tokio::test]
async fn the_ca_signs_for_the_proven_identity_only_and_says_why_it_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let issuer = issuer();
    let s = start(tmp.path(), &issuer).await;
    let channel = || tls_channel(s.addr, &s.root, "istiod.istio-system.svc");
    let alice = issuer.token("default", "alice", &["istio-ca"], 600);

    // a CSR asking for another identity yields a certificate for the caller's own
    let (key, admin_csr) = csr("spiffe://cluster.local/ns/istio-system/sa/admin");
    let chain = create_certificate(channel().await.unwrap(), Some(&alice), &admin_csr, 3600)
        .await
        .unwrap();
    assert_eq!(uri_sans(&chain[0]), ["spiffe://cluster.local/ns/default/sa/alice"]);
    assert_eq!(chain.last().unwrap(), &s.root, "the root is last");

    let e = create_certificate(channel().await.unwrap(), None, &admin_csr, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("no bearer token"), "{}", e.message());
    let expired = issuer.token("default", "alice", &["istio-ca"], -600);
    let e = create_certificate(channel().await.unwrap(), Some(&expired), &admin_csr, 0)
        .await
        .unwrap_err();
    assert!(e.message().contains("ExpiredSignature"), "{}", e.message());
    let e = create_certificate(channel().await.unwrap(), Some(&alice), "garbage", 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("CSR"), "{}", e.message());
    let e = create_certificate(channel().await.unwrap(), Some(&alice), &admin_csr, 72 * 3600)
        .await
        .unwrap_err();
    assert!(
        e.message().contains("greater than the max allowed TTL"),
        "{}",
        e.message()
    );

    // the certificate itself authenticates its holder (mTLS): a new CSR, and ADS for its namespace
    let mut identity_pem = chain[..chain.len() - 1].concat();
    identity_pem.push('\n');
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&s.root))
        .domain_name("istiod.istio-system.svc")
        .identity(tonic::transport::Identity::from_pem(&identity_pem, key.serialize_pem()));
    let mtls = Endpoint::from_shared(format!("https://{}", s.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (_, renewal) = csr("spiffe://cluster.local/ns/default/sa/alice");
    let renewed = create_certificate(mtls.clone(), None, &renewal, 0).await.unwrap();
    assert_eq!(uri_sans(&renewed[0]), ["spiffe://cluster.local/ns/default/sa/alice"]);
    let node = "sidecar~10.0.0.5~alice-1.default~default.svc.cluster.local";
    let mut client = test_support::ads::AdsClient::on_channel(mtls, node, serde_json::json!({}))
        .await
        .unwrap();
    client.request(type_url::CLUSTER, &[]).unwrap();
    assert!(client.expect_type(type_url::CLUSTER).await.is_ok());

    let metrics = monitoring::render(&s.registry.lock().unwrap()).unwrap();
    for want in [
        "citadel_server_csr_count 6",
        "citadel_server_success_cert_issuance_count 2",
        "citadel_server_authentication_failure_count 2",
        "citadel_server_csr_sign_err_count{error=\"TTL_ERROR\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in\n{metrics}");
    }
}

#[tokio::test]
async fn handshake_fails_with_another_root_or_a_name_not_in_the_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path(), &issuer()).await;
    let (addr, root) = (s.addr, s.root.clone());
    let other = tempfile::tempdir().unwrap();
    let other_root = ca::CertificateAuthority::load_or_create(other.path(), "cluster.local").unwrap();
    assert!(
        tls_channel(addr, other_root.root_cert_pem(), "istiod.istio-system.svc")
            .await
            .is_err()
    );
    assert!(tls_channel(addr, &root, "istiod.elsewhere.svc").await.is_err());
    // The server is still serving: localhost is one of its names.
    assert!(tls_channel(addr, &root, "localhost").await.is_ok());
}

#[tokio::test]
async fn unusable_ca_dir_names_the_flag_and_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(ca::CA_CERT_FILE), "garbage").unwrap();
    let dir = tmp.path().display().to_string();
    let err = SecureGrpc::init(
        "127.0.0.1:15012".parse().unwrap(),
        &MeshConfig::default(),
        "istio-system",
        env(&[("ROOT_CA_DIR", &dir)]),
        &mut Registry::default(),
        None,
        crate::serving_cert::Source::Istiod,
    )
    .await
    .err()
    .expect("an incomplete CA bundle is an error");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("--secureGrpcAddr") && msg.contains(&dir) && msg.contains("ca-key.pem"),
        "{msg}"
    );
}

/// Reads until the server closes the connection; false if it is still open after `wait`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(conn: &mut S, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    matches!(
        tokio::time::timeout(wait, conn.read_to_end(&mut got)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

/// grpc-go's ConnectionTimeout: a connection that does not finish TLS, or finishes it and sends no
/// HTTP/2 preface, is closed (here after 300 ms instead of 120 s); gRPC clients still get served.
#[tokio::test]
async fn connections_idle_before_or_after_the_handshake_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let issuer = issuer();
    let s = start_with_timeout(tmp.path(), &issuer, Duration::from_millis(300)).await;

    let mut before = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    {
        use rustls::pki_types::pem::PemObject;
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_slice(s.root.as_bytes()).unwrap())
            .unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut after = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the TLS handshake completes");

    assert!(
        closed_within(&mut before, Duration::from_secs(10)).await,
        "a connection without a handshake stays open"
    );
    assert!(
        closed_within(&mut after, Duration::from_secs(10)).await,
        "a TLS connection without HTTP/2 stays open"
    );
    let text = {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &s.registry.lock().unwrap()).unwrap();
        text
    };
    assert!(
        text.lines()
            .any(|l| l.starts_with("pilot_grpc_connection_setup_failures_total{")
                && l.contains("reason=\"timeout\"")
                && l.ends_with(" 2")),
        "{text}"
    );
    // A gRPC client is served as before.
    let channel = tls_channel(s.addr, &s.root, "localhost").await.unwrap();
    let (_, csr) = csr("spiffe://cluster.local/ns/default/sa/default");
    let token = issuer.token("default", "default", &["istio-ca"], 600);
    let chain = create_certificate(channel, Some(&token), &csr, 3600).await.unwrap();
    assert_eq!(uri_sans(&chain[0]), ["spiffe://cluster.local/ns/default/sa/default"]);
}

/// As istiod's grpc-go: a CSR over ISTIO_GPRC_MAXRECVMSGSIZE is RESOURCE_EXHAUSTED (tonic alone
/// says OUT_OF_RANGE), counted, and the CA goes on serving.
#[tokio::test]
async fn an_oversized_csr_is_resource_exhausted_as_istiods() {
    let tmp = tempfile::tempdir().unwrap();
    let issuer = issuer();
    let s = start(tmp.path(), &issuer).await;
    let token = issuer.token("default", "default", &["istio-ca"], 600);
    let channel = tls_channel(s.addr, &s.root, "localhost").await.unwrap();
    let huge = "x".repeat(5 << 20);
    let e = create_certificate(channel.clone(), Some(&token), &huge, 3600)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().starts_with("grpc: received message larger than max ("),
        "{}",
        e.message()
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &s.registry.lock().unwrap()).unwrap();
    assert!(text.contains("citadel_server_csr_too_large_count_total 1"), "{text}");
    let (_, csr) = csr("spiffe://cluster.local/ns/default/sa/default");
    assert!(create_certificate(channel, Some(&token), &csr, 3600).await.is_ok());
}
