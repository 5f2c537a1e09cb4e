//! The secure xDS port end to end in-process: the real environment and xDS server behind TLS with istiod's
//! certificate from a CA directory, a tonic client that trusts the mesh root, and one that
//! does not.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use xds_api::type_url;
use xds_server::{DiscoveryServer, ServerOptions};

use super::*;
use environment::{Environment, ServiceEntries};

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
async fn start(ca_dir: &std::path::Path) -> (SocketAddr, String) {
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
    let secure = SecureGrpc::init(addr, &mesh, "istio-system", env(&[("ROOT_CA_DIR", &dir)])).unwrap();
    // Clients trust what the CA directory distributes.
    let root = std::fs::read_to_string(ca_dir.join(ca::ROOT_CERT_FILE)).unwrap();
    tokio::spawn(secure.serve(tonic::transport::Server::builder(), listener, server.ads_service()));
    server.wait_ready().await;
    (addr, root)
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
async fn ads_over_tls_with_the_mesh_root() {
    let tmp = tempfile::tempdir().unwrap();
    let (addr, root) = start(tmp.path()).await;
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(ca::ROOT_CERT_FILE)).unwrap(),
        root
    );

    let channel = tls_channel(addr, &root, "istiod.istio-system.svc").await.unwrap();
    // The shared client checks the protocol on the response (nonce, version, type URLs).
    let mut client = test_support::ads::AdsClient::on_channel(channel, NODE_ID, serde_json::json!({}))
        .await
        .unwrap();
    client.request(type_url::CLUSTER, &[]).unwrap();
    let names = client.expect_type(type_url::CLUSTER).await.unwrap().names;
    assert!(names.iter().any(|n| n == "BlackHoleCluster"), "{names:?}");
}

#[tokio::test]
async fn handshake_fails_with_another_root_or_a_name_not_in_the_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let (addr, root) = start(tmp.path()).await;
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

#[test]
fn unusable_ca_dir_names_the_flag_and_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(ca::CA_CERT_FILE), "garbage").unwrap();
    let dir = tmp.path().display().to_string();
    let err = SecureGrpc::init(
        "127.0.0.1:15012".parse().unwrap(),
        &MeshConfig::default(),
        "istio-system",
        env(&[("ROOT_CA_DIR", &dir)]),
    )
    .err()
    .expect("an incomplete CA bundle is an error");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("--secureGrpcAddr") && msg.contains(&dir) && msg.contains("ca-key.pem"),
        "{msg}"
    );
}
