//! Real-Envoy acceptance test: the fixture's gateway listeners, with each route configuration
//! put inline into its HTTP connection manager (validate mode does not fetch RDS) and a stub
//! cluster for every cluster a route names, go into a bootstrap that `envoy --mode validate`
//! must accept. Skipped, with a message, when no Envoy binary is found.

use std::path::Path;

use prost::Message;
use serde_json::json;
use xds_api::envoy::config::bootstrap::v3::{Bootstrap, bootstrap::StaticResources};
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::listener::v3::{Listener, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};

use crate::rds::golden_tests::{fixture, fixture_listeners, fixture_routes};

/// A throwaway self-signed certificate for `secure.example.com` (test only, never trusted anywhere).
const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBrzCCAVagAwIBAgIUeVwa1NZu3FBsUYRAfC4f2NOrwScwCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwSc2VjdXJlLmV4YW1wbGUuY29tMCAXDTI2MTEyMTIwMDIyNVoY
DzIxMjYxMDI4MjAwMjI1WjAdMRswGQYDVQQDDBJzZWN1cmUuZXhhbXBsZS5jb20w
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARD38ihidIbZpMDeDQr5YZh+FBmEbnU
xktFo23kSn9Blyy5/cbmZKmrzHm6Ok4WtzMD5Sysbe+CcG+CSNFMhvqgo3IwcDAd
BgNVHQ4EFgQUD6RbBQD+Uj7/kAEilIplIxRfRAYwHwYDVR0jBBgwFoAUD6RbBQD+
Uj7/kAEilIplIxRfRAYwDwYDVR0TAQH/BAUwAwEB/zAdBgNVHREEFjAUghJzZWN1
cmUuZXhhbXBsZS5jb20wCgYIKoZIzj0EAwIDRwAwRAIgWX+FXScNrua82YLrqDRT
yLNJb8D5WlKBMoLnthxiBCYCIAwdGlkIYrBUl7HMcrdqXbpI9Uv/362boAzI+UId
/w7Z
-----END CERTIFICATE-----
";
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgGZclhgGaUaFfFrU8
Ba/3d2Xucvk60X4S7kuotMoyobWhRANCAARD38ihidIbZpMDeDQr5YZh+FBmEbnU
xktFo23kSn9Blyy5/cbmZKmrzHm6Ok4WtzMD5Sysbe+CcG+CSNFMhvqg
-----END PRIVATE KEY-----
";

/// Replaces RDS in every HTTP connection manager of `listeners` with the route configuration
/// `route` gives for its name (validate mode does not fetch RDS).
pub(crate) fn inline_rds(listeners: &mut [Listener], mut route: impl FnMut(&str) -> RouteConfiguration) {
    for chain in listeners.iter_mut().flat_map(|l| l.filter_chains.iter_mut()) {
        for f in &mut chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if f.name != super::hcm::HTTP_CONNECTION_MANAGER {
                continue;
            }
            let mut h = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
            let Some(hcm::RouteSpecifier::Rds(rds)) = &h.route_specifier else {
                continue;
            };
            h.route_specifier = Some(hcm::RouteSpecifier::RouteConfig(route(&rds.route_config_name)));
            f.config_type = Some(filter::ConfigType::TypedConfig(xds_api::pack(&h)));
        }
    }
}

/// Replaces RDS with the named route configuration of `routes` in every HCM of `listeners`.
fn inline_routes(listeners: &mut [Listener], routes: &[RouteConfiguration]) {
    inline_rds(listeners, |name| {
        routes
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .expect("route config served")
    });
}

/// A route configuration `name` that validates its clusters and sends everything to
/// PassthroughCluster.
pub(crate) fn passthrough_route(name: &str) -> RouteConfiguration {
    let rc = json!({"name": name, "validateClusters": true, "virtualHosts": [{"name": "all", "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "PassthroughCluster"}}]}]});
    xds_api::json::json_to_message(&rc).unwrap()
}

/// Runs `envoy --mode validate` on static listeners and clusters: Ok with Envoy's log, or Err with it.
fn validate(envoy: &Path, listeners: Vec<Listener>, clusters: Vec<Cluster>) -> Result<String, String> {
    let bootstrap = Bootstrap {
        static_resources: Some(StaticResources {
            listeners,
            clusters,
            ..Default::default()
        }),
        ..Default::default()
    };
    crate::testing::envoy_validate(envoy, &bootstrap)
}

/// Asserts that Envoy accepts a proxy's listeners and clusters and loads every listener. The
/// bootstrap has the proxy's node and an ADS source (a static `xds-grpc` cluster), as EDS
/// clusters need; `what` names the config in the failure message.
pub(crate) fn assert_accepted_with_ads(
    envoy: &Path,
    node_id: &str,
    listeners: Vec<Listener>,
    clusters: Vec<Cluster>,
    what: &str,
) {
    let n = listeners.len();
    let mut bootstrap: Bootstrap = xds_api::json::json_to_message(&json!({
        "node": {"id": node_id, "cluster": "test"},
        "dynamicResources": {"adsConfig": {"apiType": "GRPC", "transportApiVersion": "V3",
            "grpcServices": [{"envoyGrpc": {"clusterName": "xds-grpc"}}]}},
        "staticResources": {"clusters": [{"name": "xds-grpc", "type": "STATIC", "connectTimeout": "1s",
            "typedExtensionProtocolOptions": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicitHttpConfig": {"http2ProtocolOptions": {}}}},
            "loadAssignment": {"clusterName": "xds-grpc", "endpoints": [{"lbEndpoints": [{"endpoint": {"address":
                {"socketAddress": {"address": "127.0.0.1", "portValue": 15010}}}}]}]}}]}
    }))
    .unwrap();
    let statics = bootstrap.static_resources.get_or_insert_with(StaticResources::default);
    statics.clusters.extend(clusters);
    statics.listeners = listeners;
    let log =
        crate::testing::envoy_validate(envoy, &bootstrap).unwrap_or_else(|log| panic!("envoy rejected {what}:\n{log}"));
    assert!(
        log.contains(&format!("loading {n} listener(s)")),
        "listeners not loaded:\n{log}"
    );
}

#[test]
fn envoy_accepts_generated_gateway_config() {
    let envoy = crate::testing::envoy_binary();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), TEST_CERT).unwrap();
    std::fs::write(dir.path().join("tls.key"), TEST_KEY).unwrap();
    let cert_dir = dir.path().to_str().unwrap();
    let mut push = fixture(cert_dir);
    push.mesh.access_log_file = "/dev/stdout".into();
    // a MUTUAL server too: client validation with a CA file and SAN matching, and Istio's newer
    // ecdhCurves and insecureSkipVerify
    let mtls = crate::testing::gateway(
        "mtls",
        "istio-system",
        json!([
            {"port": {"number": 8443, "name": "https-mtls", "protocol": "HTTPS"}, "hosts": ["mtls.example.com"],
             "tls": {"mode": "MUTUAL", "serverCertificate": format!("{cert_dir}/tls.crt"), "privateKey": format!("{cert_dir}/tls.key"),
                     "caCertificates": format!("{cert_dir}/tls.crt"), "subjectAltNames": ["spiffe://cluster.local/ns/a/sa/b"],
                     "minProtocolVersion": "TLSV1_2", "ecdhCurves": ["X25519", "P-256"], "insecureSkipVerify": true}}]),
    );
    push.configs.push(std::sync::Arc::new(
        model::config::parse_config(mtls, "default").unwrap(),
    ));

    let mut listeners = fixture_listeners(&push);
    assert_eq!(listeners.len(), 3, "80, 443 and 8443");
    let mut routes = fixture_routes(&push);
    routes.extend(crate::rds::build_route_configs_from(
        &crate::testing::gateway_proxy(),
        &push,
        &["https.8443.https-mtls.mtls.istio-system".to_owned()],
    ));
    inline_routes(&mut listeners, &routes);
    let clusters = crate::testing::stub_clusters(&routes);
    assert!(clusters.len() >= 5, "routes name real clusters: {clusters:?}");
    let log = validate(&envoy, listeners.clone(), clusters.clone())
        .unwrap_or_else(|log| panic!("envoy rejected the generated config:\n{log}"));
    // a binary bootstrap Envoy could not read would pass with nothing in it: check what it loaded
    assert!(log.contains("loading 3 listener(s)"), "listeners not loaded:\n{log}");
    assert!(log.contains("OK"), "{log}");

    // control: the same bootstrap with a route to a cluster that does not exist is refused, so
    // a pass above means Envoy really checked the routes
    let mut broken = routes.clone();
    let r = &mut broken[0].virtual_hosts[0].routes[0];
    if let Some(route::Action::Route(a)) = &mut r.action {
        a.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster("no-such-cluster".into()));
    }
    broken[0].validate_clusters = Some(xds_api::pbwkt::BoolValue { value: true });
    let mut listeners = fixture_listeners(&push);
    inline_routes(&mut listeners, &broken);
    let refused = validate(&envoy, listeners, clusters).expect_err("envoy must refuse unknown clusters");
    assert!(refused.contains("no-such-cluster"), "{refused}");
}
