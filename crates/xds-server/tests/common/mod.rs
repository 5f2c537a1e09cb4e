//! A fake push snapshot (a few Envoy clusters, endpoints, listeners, routes driven by the test)
//! and a server on 127.0.0.1:0 for the ADS behaviour tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use tokio_stream::wrappers::TcpListenerStream;
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ConfigSource, SocketAddress, address, config_source, socket_address,
};
use xds_api::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use xds_api::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager::RouteSpecifier,
};
use xds_api::type_url;
use xds_server::{
    DiscoveryServer, GenerateError, Proxy, PushRequest, PushSnapshot, Resource, ServerOptions, SnapshotBuilder,
    WatchedResource,
};

/// What the fake mesh has; tests change it and then call `config_update`.
#[derive(Debug, Clone, Default)]
pub struct Mesh {
    /// EDS cluster name -> endpoint IPs.
    pub clusters: BTreeMap<String, Vec<String>>,
    /// Listener name -> RDS route name.
    pub listeners: BTreeMap<String, String>,
    /// Route configuration names.
    pub routes: Vec<String>,
    /// Virtual host name -> its domain, in every route configuration (over VHDS as
    /// `<route>/<host>`).
    pub hosts: BTreeMap<String, String>,
    /// Bytes of padding in each cluster, to make responses large.
    pub padding: usize,
}

impl Mesh {
    pub fn basic() -> Mesh {
        Mesh {
            clusters: BTreeMap::from([
                (
                    "outbound|80||a.default.svc.cluster.local".into(),
                    vec!["10.0.0.1".into()],
                ),
                (
                    "outbound|80||b.default.svc.cluster.local".into(),
                    vec!["10.0.0.2".into()],
                ),
                (
                    "outbound|80||c.default.svc.cluster.local".into(),
                    vec!["10.0.0.3".into()],
                ),
            ]),
            listeners: BTreeMap::from([("0.0.0.0_80".into(), "80".into())]),
            routes: vec!["80".into(), "8080".into()],
            hosts: BTreeMap::from([
                ("a".into(), "a.example.com".into()),
                ("b".into(), "b.example.com".into()),
            ]),
            padding: 0,
        }
    }
}

pub const A: &str = "outbound|80||a.default.svc.cluster.local";
pub const B: &str = "outbound|80||b.default.svc.cluster.local";
pub const C: &str = "outbound|80||c.default.svc.cluster.local";

fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: 2,
        ..Default::default()
    })
}

pub struct FakeSnapshot {
    version: String,
    mesh: Mesh,
}

impl PushSnapshot for FakeSnapshot {
    fn version(&self) -> &str {
        &self.version
    }

    fn needs_push(&self, _proxy: &Proxy, _req: &PushRequest, _last_pushed: Option<&Self>) -> bool {
        true
    }

    fn generate(
        &self,
        _proxy: &Proxy,
        watched: &WatchedResource,
        _delta: bool,
    ) -> Result<Vec<Resource>, GenerateError> {
        // Every resource of the type, whatever was asked: the server must filter EDS/RDS.
        let m = &self.mesh;
        Ok(match watched.type_url.as_str() {
            type_url::CLUSTER => m
                .clusters
                .keys()
                .map(|name| {
                    let c = Cluster {
                        name: name.clone(),
                        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                            cluster::DiscoveryType::Eds as i32,
                        )),
                        eds_cluster_config: Some(cluster::EdsClusterConfig {
                            eds_config: ads(),
                            service_name: String::new(),
                        }),
                        alt_stat_name: "x".repeat(m.padding),
                        ..Default::default()
                    };
                    Resource::new(name.clone(), &c)
                })
                .collect(),
            type_url::ENDPOINT => m
                .clusters
                .iter()
                .map(|(name, ips)| {
                    let lb_endpoints = ips
                        .iter()
                        .map(|ip| LbEndpoint {
                            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                                address: Some(Address {
                                    address: Some(address::Address::SocketAddress(SocketAddress {
                                        address: ip.clone(),
                                        port_specifier: Some(socket_address::PortSpecifier::PortValue(80)),
                                        ..Default::default()
                                    })),
                                }),
                                ..Default::default()
                            })),
                            ..Default::default()
                        })
                        .collect();
                    let cla = ClusterLoadAssignment {
                        cluster_name: name.clone(),
                        endpoints: vec![LocalityLbEndpoints {
                            lb_endpoints,
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                    Resource::new(name.clone(), &cla)
                })
                .collect(),
            type_url::LISTENER => m
                .listeners
                .iter()
                .map(|(name, route)| {
                    let hcm = HttpConnectionManager {
                        stat_prefix: name.clone(),
                        route_specifier: Some(RouteSpecifier::Rds(Rds {
                            config_source: ads(),
                            route_config_name: route.clone(),
                        })),
                        ..Default::default()
                    };
                    let l = Listener {
                        name: name.clone(),
                        filter_chains: vec![FilterChain {
                            filters: vec![Filter {
                                name: "envoy.filters.network.http_connection_manager".into(),
                                config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&hcm))),
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                    Resource::new(name.clone(), &l)
                })
                .collect(),
            type_url::ROUTE => m
                .routes
                .iter()
                .map(|name| {
                    Resource::new(
                        name.clone(),
                        &RouteConfiguration {
                            name: name.clone(),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            // VHDS names the route configurations whose hosts it wants
            type_url::VIRTUAL_HOST => watched
                .names
                .iter()
                .filter(|route| m.routes.iter().any(|r| r == &***route))
                .flat_map(|route| {
                    m.hosts.iter().map(move |(host, domain)| {
                        let name = format!("{route}/{host}");
                        let vh = VirtualHost {
                            name: name.clone(),
                            domains: vec![domain.clone()],
                            ..Default::default()
                        };
                        Resource::new(name, &vh)
                    })
                })
                .collect(),
            other => return Err(GenerateError::UnsupportedType(other.into())),
        })
    }
}

/// Builds a `FakeSnapshot` of the current `Mesh`, versions `v1`, `v2`, ...; records each request.
pub struct FakeBuilder {
    pub mesh: Arc<Mutex<Mesh>>,
    pub builds: Arc<Mutex<Vec<(tokio::time::Instant, PushRequest)>>>,
    counter: AtomicU64,
}

impl SnapshotBuilder for FakeBuilder {
    type Snapshot = FakeSnapshot;

    fn build(&self, req: &PushRequest) -> Arc<FakeSnapshot> {
        self.builds
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), req.clone()));
        let n = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        Arc::new(FakeSnapshot {
            version: format!("v{n}"),
            mesh: self.mesh.lock().unwrap().clone(),
        })
    }
}

pub struct TestServer {
    pub server: Arc<DiscoveryServer<FakeBuilder>>,
    pub addr: SocketAddr,
    pub mesh: Arc<Mutex<Mesh>>,
    pub builds: Arc<Mutex<Vec<(tokio::time::Instant, PushRequest)>>>,
    pub registry: Registry,
}

pub fn fast_options() -> ServerOptions {
    ServerOptions {
        debounce_after: std::time::Duration::from_millis(10),
        ..ServerOptions::default()
    }
}

/// A started server without a network listener.
pub async fn server(mesh: Mesh, opts: ServerOptions) -> TestServer {
    let mesh = Arc::new(Mutex::new(mesh));
    let builds = Arc::new(Mutex::new(Vec::new()));
    let builder = FakeBuilder {
        mesh: mesh.clone(),
        builds: builds.clone(),
        counter: AtomicU64::new(0),
    };
    let mut registry = Registry::default();
    let server = DiscoveryServer::new(Arc::new(builder), opts, &mut registry);
    assert!(!server.ready());
    server.start();
    server.wait_ready().await;
    TestServer {
        server,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        mesh,
        builds,
        registry,
    }
}

/// A started server serving ADS on 127.0.0.1:<random port>.
pub async fn serve(mesh: Mesh, opts: ServerOptions) -> TestServer {
    let mut ts = server(mesh, opts).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    ts.addr = listener.local_addr().unwrap();
    let svc = ts.server.ads_service();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    ts
}

impl TestServer {
    pub fn metrics(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry).unwrap();
        s
    }

    /// The value of one exposed sample line, e.g. `pilot_xds_pushes_total{type="cds"}`.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
    }

    pub fn set_mesh(&self, f: impl FnOnce(&mut Mesh)) {
        f(&mut self.mesh.lock().unwrap());
    }
}

pub const NODE: &str = "sidecar~10.1.0.1~app-1.default~default.svc.cluster.local";

pub fn metadata() -> serde_json::Value {
    serde_json::json!({"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0", "LABELS": {"app": "app"}})
}
