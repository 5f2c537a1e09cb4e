//! Golden tests: listeners and route configurations generated for a small gateway config, as
//! text (`{:#?}` with every `Any` decoded in place) under `testdata/golden/`, compared on each run
//! and rewritten when `REFRESH_GOLDEN=true`. The fixture is shared with the real-Envoy test.

use prost::{Message, Name};
use serde_json::json;
use xds_api::envoy::config::listener::v3::Listener;
use xds_api::envoy::config::route::v3::RouteConfiguration;

use crate::route::testing::{FakePush, service};
use crate::testing::{destination_rule, gateway, gateway_proxy, virtual_service};

/// A gateway with plaintext HTTP (with one httpsRedirect server) and a SIMPLE HTTPS server whose
/// certificate files live in `cert_dir`, and VirtualServices using most HTTP route features.
pub(crate) fn fixture(cert_dir: &str) -> FakePush {
    let gateway = gateway(
        "bookinfo-gateway",
        "istio-system",
        json!([
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*/bookinfo.example.com", "bookinfo/*.shop.example.com"]},
            {"port": {"number": 80, "name": "http-redirect", "protocol": "HTTP"}, "hosts": ["secure.example.com"], "tls": {"httpsRedirect": true}},
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "name": "bookinfo-https",
             "hosts": ["bookinfo/secure.example.com"],
             "tls": {"mode": "SIMPLE", "serverCertificate": format!("{cert_dir}/tls.crt"), "privateKey": format!("{cert_dir}/tls.key")}}
        ]),
    );
    let bookinfo = json!({
        "apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
        "metadata": {"name": "bookinfo", "namespace": "bookinfo"},
        "spec": {"hosts": ["bookinfo.example.com", "secure.example.com"], "gateways": ["istio-system/bookinfo-gateway"], "http": [
            {"name": "reviews", "match": [{"uri": {"prefix": "/reviews"}, "headers": {"end-user": {"exact": "jason"}}}],
             "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
             "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "gateway-error,503"}, "timeout": "10s"},
            {"name": "reviews-split", "match": [{"uri": {"prefix": "/reviews"}}],
             "route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 80,
                        "headers": {"response": {"add": {"x-version": "v1"}}}},
                       {"destination": {"host": "reviews", "subset": "v3"}, "weight": 20}],
             "fault": {"delay": {"fixedDelay": "1s", "percentage": {"value": 5}}}},
            {"name": "api", "match": [{"uri": {"regex": "/api/v[0-9]+/.*"}, "method": {"exact": "GET"}}],
             "rewrite": {"uri": "/", "authority": "api.internal"},
             "route": [{"destination": {"host": "api.bookinfo.svc.cluster.local", "port": {"number": 8080}}}],
             "mirror": {"host": "api-shadow"}, "mirrorPercentage": {"value": 25},
             "corsPolicy": {"allowOrigins": [{"exact": "https://bookinfo.example.com"}], "allowMethods": ["GET"], "maxAge": "1h"}},
            {"name": "old", "match": [{"uri": {"exact": "/old"}}], "redirect": {"uri": "/productpage", "redirectCode": 308}},
            {"name": "health", "match": [{"uri": {"exact": "/healthz"}}], "directResponse": {"status": 204}},
            {"name": "default", "route": [{"destination": {"host": "productpage"}}], "retries": {"attempts": 0}}
        ]}
    });
    let shop = virtual_service(
        "shop",
        "bookinfo",
        json!({"hosts": ["*.shop.example.com"], "gateways": ["istio-system/bookinfo-gateway"], "http": [
            {"route": [{"destination": {"host": "shop", "port": {"number": 80}}}]}
        ]}),
    );
    let reviews_dr = destination_rule(
        "productpage",
        "bookinfo",
        json!({"host": "productpage", "trafficPolicy": {"loadBalancer": {"consistentHash": {
            "httpCookie": {"name": "session", "ttl": "60s", "path": "/"}}}}}),
    );
    FakePush::with_configs(&[gateway, bookinfo, shop, reviews_dr])
        .with_service(service("reviews.bookinfo.svc.cluster.local", "bookinfo", &[9080]))
        .with_service(service("productpage.bookinfo.svc.cluster.local", "bookinfo", &[9080]))
}

/// The route names the fixture's listeners serve.
pub(crate) const FIXTURE_ROUTES: [&str; 2] = ["http.80", "https.443.https.bookinfo-gateway.istio-system"];

/// The fixture's gateway listeners, from the builder `lds::build_listeners` uses for routers.
pub(crate) fn fixture_listeners(push: &FakePush) -> Vec<Listener> {
    crate::lds::gateway::build_gateway_listeners(&gateway_proxy(), push, &Default::default())
}

pub(crate) fn fixture_routes(push: &FakePush) -> Vec<RouteConfiguration> {
    let names: Vec<String> = FIXTURE_ROUTES.iter().map(|s| s.to_string()).collect();
    super::build_route_configs_from(&gateway_proxy(), push, &names)
}

/// `{:#?}` of a decoded `Any` of a type the generators emit.
fn decode_any(type_url: &str, bytes: &[u8]) -> Option<String> {
    use xds_api::envoy::extensions::filters::{
        listener::tls_inspector::v3 as inspector, network::http_connection_manager::v3 as hcm,
    };
    use xds_api::envoy::extensions::{
        access_loggers::file::v3 as file, filters::http, retry, transport_sockets::tls::v3 as tls,
    };
    fn dec<M: Message + Name + Default + std::fmt::Debug>(url: &str, bytes: &[u8]) -> Option<String> {
        (url == M::type_url())
            .then(|| M::decode(bytes).map(|m| format!("{m:#?}")).ok())
            .flatten()
    }
    dec::<hcm::HttpConnectionManager>(type_url, bytes)
        .or_else(|| dec::<tls::DownstreamTlsContext>(type_url, bytes))
        .or_else(|| dec::<inspector::TlsInspector>(type_url, bytes))
        .or_else(|| dec::<http::fault::v3::HttpFault>(type_url, bytes))
        .or_else(|| dec::<http::cors::v3::Cors>(type_url, bytes))
        .or_else(|| dec::<http::cors::v3::CorsPolicy>(type_url, bytes))
        .or_else(|| dec::<http::router::v3::Router>(type_url, bytes))
        .or_else(|| dec::<file::FileAccessLog>(type_url, bytes))
        .or_else(|| dec::<retry::host::previous_hosts::v3::PreviousHostsPredicate>(type_url, bytes))
}

/// Replaces the byte list after each known `type_url` in pretty Debug text with the decoded message.
pub(crate) fn expand_any(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut url: Option<&str> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(rest) = trimmed.strip_prefix("type_url: \"") {
            url = rest.strip_suffix("\",");
        } else if let (Some(u), true) = (url.take(), trimmed.starts_with("value: [")) {
            let mut bytes = Vec::new();
            let mut j = i;
            if trimmed != "value: []," {
                j += 1;
                while j < lines.len() && lines[j].trim() != "]," {
                    bytes.push(lines[j].trim().trim_end_matches(',').parse::<u8>().unwrap_or(0));
                    j += 1;
                }
            }
            if let Some(decoded) = decode_any(u, &bytes) {
                let decoded = expand_any(&decoded);
                for (k, d) in decoded.lines().enumerate() {
                    out.push_str(if k == 0 { indent } else { "" });
                    out.push_str(if k == 0 { "value: " } else { indent });
                    out.push_str(d);
                    out.push('\n');
                }
                out.pop();
                out.push_str(",\n");
                i = j + 1;
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
        i += 1;
    }
    out
}

/// Drops fields at their proto3 default (`None`, `[]`, `""`, `false`, `0`, `{}`) so goldens show
/// what is set.
fn compact(text: &str) -> String {
    const DEFAULTS: [&str; 6] = [" None,", " [],", " \"\",", " false,", " 0,", " {},"];
    text.lines()
        .filter(|l| {
            let t = l.trim_start();
            let is_field = t
                .split_once(':')
                .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            !(is_field
                && DEFAULTS
                    .iter()
                    .any(|d| t.ends_with(d) && t.len() == t.find(':').unwrap_or(0) + 1 + d.len()))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn gateway_listeners_golden() {
    let push = fixture("/etc/istio/ingressgateway-certs");
    crate::testing::assert_golden(
        "gateway_listeners.golden",
        &compact(&expand_any(&format!("{:#?}", fixture_listeners(&push)))),
    );
}

#[test]
fn gateway_routes_golden() {
    let push = fixture("/etc/istio/ingressgateway-certs");
    crate::testing::assert_golden(
        "gateway_routes.golden",
        &compact(&expand_any(&format!("{:#?}", fixture_routes(&push)))),
    );
}

#[test]
fn any_expansion_decodes_nested_messages() {
    let listeners = fixture_listeners(&fixture("/certs"));
    let text = expand_any(&format!("{listeners:#?}"));
    assert!(text.contains("route_config_name: \"http.80\""), "HCM decoded");
    assert!(text.contains("\"/certs/tls.crt\""), "TLS context decoded");
    assert!(!text.contains("value: [\n"), "no byte lists left");
}
