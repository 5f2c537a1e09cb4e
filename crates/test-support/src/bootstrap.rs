//! Envoy v3 bootstraps for tests: an Istio gateway or sidecar fed by ADS from pilot-discovery on
//! loopback, over plaintext gRPC or, as an authenticated proxy, over TLS to the secure port with a
//! service account token ([`AdsBootstrap::secure`]), and a static proxy (one listener, one cluster)
//! with no control plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

/// The name of the bootstrap cluster that reaches pilot-discovery, as in Istio's bootstrap.
pub const XDS_CLUSTER: &str = "xds-grpc";

/// The node cluster of Istio's default ingress gateway (`<service account>.<namespace>`).
pub const INGRESS_GATEWAY_CLUSTER: &str = "istio-ingressgateway.istio-system";

/// Which ADS protocol Envoy speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdsApi {
    /// State of the world (`api_type: GRPC`).
    #[default]
    Sotw,
    /// Incremental (`api_type: DELTA_GRPC`).
    Delta,
}

/// A bootstrap whose listeners and clusters all come from ADS, like the one pilot-agent writes
/// (less the Istio-only extensions, the SDS cluster and tracing).
#[derive(Clone, Debug)]
pub struct AdsBootstrap {
    pub node_id: String,
    pub node_cluster: String,
    pub metadata: Value,
    pub xds_addr: SocketAddr,
    /// 0 lets Envoy pick; [`crate::envoy::Envoy`] reads the bound address back.
    pub admin_port: u16,
    pub api: AdsApi,
    /// `initial_fetch_timeout` of CDS and LDS; zero (Istio's choice) keeps `/ready` at 503 until xDS
    /// arrives.
    pub initial_fetch_timeout: Duration,
    /// Backoff of the ADS stream's reconnects; short so tests that restart the server stay fast.
    pub retry_base_interval: Duration,
    pub retry_max_interval: Duration,
    /// Set: ADS goes over TLS to pilot-discovery's secure port, as an authenticated proxy.
    pub secure: Option<SecureXds>,
}

/// How a bare Envoy proves who it is to pilot-discovery's secure port (15012), as pilot-agent
/// does for the Envoy beside it: TLS verifying istiod's certificate with the mesh root, and a
/// service account token as the gRPC `authorization` header.
#[derive(Clone, Debug)]
pub struct SecureXds {
    /// The mesh root (`$ROOT_CA_DIR/root-cert.pem`), to verify istiod with.
    pub root_cert: PathBuf,
    /// A service account token (a JWT), sent as `authorization: Bearer <token>`.
    pub token: String,
    /// The name istiod's certificate is checked for (and sent as SNI):
    /// `istiod.istio-system.svc`, as Istio's bootstrap.
    pub server_name: String,
}

impl SecureXds {
    pub fn new(root_cert: impl Into<PathBuf>, token: impl Into<String>) -> SecureXds {
        SecureXds {
            root_cert: root_cert.into(),
            token: token.into(),
            server_name: "istiod.istio-system.svc".into(),
        }
    }
}

impl AdsBootstrap {
    pub fn new(node_id: &str, node_cluster: &str, metadata: Value, xds_addr: SocketAddr) -> Self {
        Self {
            node_id: node_id.to_owned(),
            node_cluster: node_cluster.to_owned(),
            metadata,
            xds_addr,
            admin_port: 0,
            api: AdsApi::Sotw,
            initial_fetch_timeout: Duration::ZERO,
            retry_base_interval: Duration::from_millis(100),
            retry_max_interval: Duration::from_secs(1),
            secure: None,
        }
    }

    /// ADS over TLS with a token, to pilot-discovery's secure port (`xds_addr` must be it).
    pub fn secure(mut self, secure: SecureXds) -> Self {
        self.secure = Some(secure);
        self
    }

    /// Speak delta (incremental) xDS instead of state of the world.
    pub fn delta(mut self) -> Self {
        self.api = AdsApi::Delta;
        self
    }

    pub fn build(&self) -> Value {
        let api_type = match self.api {
            AdsApi::Sotw => "GRPC",
            AdsApi::Delta => "DELTA_GRPC",
        };
        let ads_source = json!({
            "ads": {},
            "resource_api_version": "V3",
            "initial_fetch_timeout": duration(self.initial_fetch_timeout),
        });
        let mut grpc_service = json!({
            "envoy_grpc": {
                "cluster_name": XDS_CLUSTER,
                "retry_policy": {
                    "retry_back_off": {
                        "base_interval": duration(self.retry_base_interval),
                        "max_interval": duration(self.retry_max_interval),
                    },
                },
            },
        });
        let mut xds_cluster = http2_cluster(XDS_CLUSTER, self.xds_addr);
        if let Some(secure) = &self.secure {
            grpc_service["initial_metadata"] =
                json!([{"key": "authorization", "value": format!("Bearer {}", secure.token)}]);
            xds_cluster["transport_socket"] = json!({
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    "sni": secure.server_name,
                    "common_tls_context": {
                        "alpn_protocols": ["h2"],
                        "validation_context": {
                            "trusted_ca": {"filename": secure.root_cert.display().to_string()},
                            "match_typed_subject_alt_names": [{
                                "san_type": "DNS",
                                "matcher": {"exact": secure.server_name},
                            }],
                        },
                    },
                },
            });
        }
        json!({
            "node": {
                "id": self.node_id,
                "cluster": self.node_cluster,
                "metadata": self.metadata,
            },
            "admin": admin(self.admin_port),
            "dynamic_resources": {
                "ads_config": {
                    "api_type": api_type,
                    "transport_api_version": "V3",
                    "grpc_services": [grpc_service],
                    "set_node_on_first_message_only": true,
                },
                "cds_config": ads_source,
                "lds_config": ads_source,
            },
            "static_resources": {
                "clusters": [xds_cluster],
            },
        })
    }
}

/// The bootstrap of an Istio ingress gateway (`istio-ingressgateway.istio-system`) fed by SotW ADS
/// from `xds_addr` over plaintext gRPC. `node_id` is Istio's `router~<ip>~<pod>.<ns>~<ns>.svc.<domain>`.
pub fn gateway_bootstrap(node_id: &str, metadata: Value, xds_addr: SocketAddr, admin_port: u16) -> Value {
    let mut bootstrap = AdsBootstrap::new(node_id, INGRESS_GATEWAY_CLUSTER, metadata, xds_addr);
    bootstrap.admin_port = admin_port;
    bootstrap.build()
}

/// A bootstrap with one HTTP listener `static_http` on 127.0.0.1:`listener_port` (0: Envoy picks,
/// see [`crate::envoy::Envoy::listener_address`]) that routes every request to the cluster
/// `static_backend` at `upstream`. No control plane.
pub fn static_proxy_bootstrap(listener_port: u16, upstream: SocketAddr) -> Value {
    json!({
        "node": {"id": "static-proxy", "cluster": "static-proxy"},
        "admin": admin(0),
        "static_resources": {
            "listeners": [{
                "name": "static_http",
                "address": socket_address("127.0.0.1", listener_port),
                "filter_chains": [{
                    "filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "static_http",
                            "route_config": {
                                "name": "static_route",
                                "virtual_hosts": [{
                                    "name": "all",
                                    "domains": ["*"],
                                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "static_backend"}}],
                                }],
                            },
                            "http_filters": [{
                                "name": "envoy.filters.http.router",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                                },
                            }],
                        },
                    }],
                }],
            }],
            "clusters": [{
                "name": "static_backend",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": load_assignment("static_backend", upstream),
            }],
        },
    })
}

fn admin(port: u16) -> Value {
    json!({"address": socket_address("127.0.0.1", port)})
}

fn socket_address(ip: &str, port: u16) -> Value {
    json!({"socket_address": {"address": ip, "port_value": port}})
}

fn load_assignment(cluster: &str, addr: SocketAddr) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{
            "lb_endpoints": [{"endpoint": {"address": socket_address(&addr.ip().to_string(), addr.port())}}],
        }],
    })
}

/// A STATIC cluster that speaks HTTP/2 (gRPC) to `addr`.
fn http2_cluster(name: &str, addr: SocketAddr) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": load_assignment(name, addr),
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
    })
}

/// A protobuf JSON `Duration` ("1.500s").
fn duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy;

    fn xds_addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 15010))
    }

    #[test]
    fn gateway_bootstrap_points_ads_at_the_xds_cluster() {
        let metadata = json!({"ISTIO_VERSION": "1.28.0", "CLUSTER_ID": "Kubernetes"});
        let node_id = "router~10.0.0.1~istio-ingressgateway-1.istio-system~istio-system.svc.cluster.local";
        let bootstrap = gateway_bootstrap(node_id, metadata.clone(), xds_addr(), 15000);
        assert_eq!(bootstrap["node"]["id"], node_id);
        assert_eq!(bootstrap["node"]["cluster"], INGRESS_GATEWAY_CLUSTER);
        assert_eq!(bootstrap["node"]["metadata"], metadata);
        assert_eq!(bootstrap["admin"]["address"]["socket_address"]["port_value"], 15000);
        let ads = &bootstrap["dynamic_resources"]["ads_config"];
        assert_eq!(ads["api_type"], "GRPC");
        assert_eq!(ads["grpc_services"][0]["envoy_grpc"]["cluster_name"], XDS_CLUSTER);
        assert_eq!(
            bootstrap["dynamic_resources"]["cds_config"]["initial_fetch_timeout"],
            "0s"
        );
        let cluster = &bootstrap["static_resources"]["clusters"][0];
        assert_eq!(cluster["name"], XDS_CLUSTER);
        let endpoint = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
        assert_eq!(endpoint["address"]["socket_address"]["port_value"], 15010);
    }

    #[test]
    fn delta_bootstrap_uses_delta_grpc() {
        let bootstrap = AdsBootstrap::new(
            "sidecar~10.0.0.2~a.ns~ns.svc.cluster.local",
            "a.ns",
            json!({}),
            xds_addr(),
        )
        .delta()
        .build();
        assert_eq!(bootstrap["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
        assert_eq!(bootstrap["node"]["cluster"], "a.ns");
    }

    /// A secure bootstrap verifies istiod with the mesh root and sends the token on the stream;
    /// Envoy accepts it.
    #[tokio::test]
    async fn secure_bootstrap_speaks_tls_with_a_token() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root-cert.pem");
        std::fs::write(&root, crate::tls::TestCa::new("root")?.cert_pem())?;
        let bootstrap = AdsBootstrap::new(
            "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local",
            INGRESS_GATEWAY_CLUSTER,
            json!({}),
            xds_addr(),
        )
        .secure(SecureXds::new(&root, "tok"))
        .build();
        let grpc = &bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0];
        assert_eq!(grpc["initial_metadata"][0]["key"], "authorization");
        assert_eq!(grpc["initial_metadata"][0]["value"], "Bearer tok");
        let tls = &bootstrap["static_resources"]["clusters"][0]["transport_socket"]["typed_config"];
        assert_eq!(tls["sni"], "istiod.istio-system.svc");
        assert_eq!(
            tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
            root.display().to_string()
        );
        envoy::validate(&bootstrap).await
    }

    #[test]
    fn durations_are_protobuf_json() {
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_millis(1500)), "1.500000000s");
    }

    #[tokio::test]
    async fn envoy_accepts_gateway_bootstraps() -> anyhow::Result<()> {
        let sotw = gateway_bootstrap(
            "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local",
            json!({}),
            xds_addr(),
            0,
        );
        envoy::validate(&sotw).await?;
        let delta = AdsBootstrap::new(
            "router~10.0.0.1~gw.istio-system~x",
            INGRESS_GATEWAY_CLUSTER,
            json!({}),
            xds_addr(),
        )
        .delta()
        .build();
        envoy::validate(&delta).await?;
        Ok(())
    }

    #[tokio::test]
    async fn envoy_rejects_a_broken_bootstrap() -> anyhow::Result<()> {
        let mut broken = gateway_bootstrap("router~10.0.0.1~gw.istio-system~x", json!({}), xds_addr(), 0);
        broken["dynamic_resources"]["ads_config"]["api_type"] = json!("NOT_AN_API");
        let err = envoy::validate(&broken)
            .await
            .expect_err("envoy must reject an unknown api_type");
        assert!(err.to_string().contains("NOT_AN_API"), "{err:#}");
        Ok(())
    }

    #[tokio::test]
    async fn envoy_accepts_the_static_proxy_bootstrap() -> anyhow::Result<()> {
        envoy::validate(&static_proxy_bootstrap(0, SocketAddr::from(([127, 0, 0, 1], 8080)))).await
    }
}
