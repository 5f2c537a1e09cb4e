//! Behaviour tables for gateway route configurations: "a request to host H path P (headers ...)
//! reaches cluster C", evaluated over the generated RouteConfiguration the way Envoy would.

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::config::route::v3::{Route, RouteConfiguration, redirect_action, route_action};
use xds_api::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use xds_api::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort};

use super::build_route_configs_from;
use crate::route::testing::{FakePush, Outcome, Request, action, evaluate, service};
use crate::testing::{gateway_proxy, ingress_gateway};

fn http_server(hosts: &[&str]) -> Value {
    json!({"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": hosts})
}

/// A VirtualService bound to the gateway `istio-system/gw`.
fn vs(name: &str, ns: &str, hosts: &[&str], http: Value) -> Value {
    crate::testing::virtual_service(
        name,
        ns,
        json!({"hosts": hosts, "gateways": ["istio-system/gw"], "http": http}),
    )
}

fn to(host: &str) -> Value {
    json!([{"destination": {"host": host, "port": {"number": 80}}}])
}

/// One catch-all rule routing to `host`.
fn simple(host: &str) -> Value {
    json!([{"route": to(host)}])
}

fn config(docs: &[Value], name: &str) -> RouteConfiguration {
    let push =
        FakePush::with_configs(docs).with_service(service("reviews.bookinfo.svc.cluster.local", "bookinfo", &[9080]));
    build_route_configs_from(&gateway_proxy(), &push, &[name.to_owned()]).remove(0)
}

fn http80(docs: &[Value]) -> RouteConfiguration {
    config(docs, "http.80")
}

fn cluster(host: &str) -> Outcome {
    Outcome::Cluster(format!("outbound|80||{host}"))
}

fn reach(rc: &RouteConfiguration, req: Request) -> Outcome {
    evaluate(rc, &req).0
}

fn matched(rc: &RouteConfiguration, req: Request) -> &Route {
    evaluate(rc, &req).1.expect("a route matches")
}

#[test]
fn hosts_intersect_with_wildcards_and_namespaces() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*.example.com", "bookinfo/bookinfo.com"])])),
        vs(
            "a",
            "default",
            &["a.example.com", "other.org"],
            simple("a.default.svc.cluster.local"),
        ),
        vs(
            "w",
            "default",
            &["*.wild.example.com"],
            simple("w.default.svc.cluster.local"),
        ),
        vs(
            "bi",
            "bookinfo",
            &["bookinfo.com"],
            simple("productpage.bookinfo.svc.cluster.local"),
        ),
        vs(
            "intruder",
            "default",
            &["bookinfo.com"],
            simple("evil.default.svc.cluster.local"),
        ),
    ]);
    let table = [
        ("a.example.com", cluster("a.default.svc.cluster.local")),
        ("a.example.com:80", cluster("a.default.svc.cluster.local")),
        ("x.wild.example.com", cluster("w.default.svc.cluster.local")),
        ("b.example.com", Outcome::NotFound),
        ("other.org", Outcome::NotFound),
        ("bookinfo.com", cluster("productpage.bookinfo.svc.cluster.local")),
    ];
    for (host, want) in table {
        assert_eq!(reach(&rc, Request::get(host, "/")), want, "host {host}");
    }
    let names: Vec<_> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["*.wild.example.com:80", "a.example.com:80", "bookinfo.com:80"]);
    assert!(rc.ignore_port_in_host_matching);
    assert_eq!(rc.validate_clusters.map(|b| b.value), Some(false));
}

#[test]
fn a_second_virtual_service_for_a_host_appends_its_routes() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs(
            "first",
            "default",
            &["x.com"],
            json!([{"match": [{"uri": {"prefix": "/a"}}], "route": to("a")}]),
        ),
        vs(
            "second",
            "default",
            &["x.com"],
            json!([{"match": [{"uri": {"prefix": "/b"}}], "route": to("b")}]),
        ),
    ]);
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(
        reach(&rc, Request::get("x.com", "/a/1")),
        cluster("a.default.svc.cluster.local")
    );
    assert_eq!(
        reach(&rc, Request::get("x.com", "/b/1")),
        cluster("b.default.svc.cluster.local")
    );
    assert_eq!(reach(&rc, Request::get("x.com", "/c")), Outcome::NotFound);
}

#[test]
fn hosts_with_identical_routes_collapse_into_one_vhost() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs("v", "default", &["b.com", "a.com"], simple("a")),
    ]);
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(rc.virtual_hosts[0].name, "a.com:80");
    assert_eq!(rc.virtual_hosts[0].domains, ["a.com", "b.com"]);
}

#[test]
fn uri_header_method_and_query_matches() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs(
            "m",
            "default",
            &["m.com"],
            json!([
                {"match": [{"uri": {"exact": "/exact"}}], "route": to("exact")},
                {"match": [{"uri": {"regex": "/v[0-9]+/.*"}}], "route": to("regex")},
                {"match": [{"uri": {"prefix": "/CASE"}, "ignoreUriCase": true}], "route": to("nocase")},
                {"match": [{"headers": {"x-canary": {"exact": "yes"}}, "uri": {"prefix": "/h"}}], "route": to("canary")},
                {"match": [{"withoutHeaders": {"x-user": {}}, "uri": {"prefix": "/h"}}], "route": to("anonymous")},
                {"match": [{"method": {"exact": "POST"}}], "route": to("post")},
                {"match": [{"queryParams": {"debug": {"exact": "1"}}}], "route": to("debug")},
                {"route": to("default")}
            ]),
        ),
    ]);
    let c = |s: &str| cluster(&format!("{s}.default.svc.cluster.local"));
    let table = [
        (Request::get("m.com", "/exact"), c("exact")),
        (Request::get("m.com", "/exact/more"), c("default")),
        (Request::get("m.com", "/v2/items"), c("regex")),
        (Request::get("m.com", "/case/x"), c("nocase")),
        (Request::get("m.com", "/h").header("x-canary", "yes"), c("canary")),
        (Request::get("m.com", "/h").header("x-canary", "no"), c("anonymous")),
        (Request::get("m.com", "/h").header("x-user", "bob"), c("default")),
        (Request::get("m.com", "/x").method("POST"), c("post")),
        (Request::get("m.com", "/x?debug=1"), c("debug")),
        (Request::get("m.com", "/x?debug=2"), c("default")),
    ];
    for (req, want) in table {
        let label = format!("{} {} {:?}", req.method, req.path, req.headers);
        assert_eq!(reach(&rc, req), want, "{label}");
    }
}

#[test]
fn weighted_split_rewrite_redirect_and_direct_response() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs(
            "r",
            "default",
            &["r.com"],
            json!([
                {"match": [{"uri": {"prefix": "/split"}}], "route": [
                    {"destination": {"host": "reviews.bookinfo.svc.cluster.local", "subset": "v1"}, "weight": 75},
                    {"destination": {"host": "reviews.bookinfo.svc.cluster.local", "subset": "v2"}, "weight": 25}]},
                {"match": [{"uri": {"prefix": "/old"}}], "rewrite": {"uri": "/new", "authority": "backend.internal"}, "route": to("rw")},
                {"match": [{"uri": {"prefix": "/moved"}}], "redirect": {"uri": "/here", "authority": "new.com", "redirectCode": 302}},
                {"match": [{"uri": {"prefix": "/secure"}}], "redirect": {"scheme": "https", "port": 8443}},
                {"match": [{"uri": {"exact": "/health"}}], "directResponse": {"status": 200, "body": {"string": "ok"}}}
            ]),
        ),
    ]);
    assert_eq!(
        reach(&rc, Request::get("r.com", "/split")),
        Outcome::Weighted(vec![
            ("outbound|9080|v1|reviews.bookinfo.svc.cluster.local".into(), 75),
            ("outbound|9080|v2|reviews.bookinfo.svc.cluster.local".into(), 25)
        ])
    );
    let rw = action(matched(&rc, Request::get("r.com", "/old/x")));
    assert_eq!(rw.prefix_rewrite, "/new");
    assert_eq!(
        rw.host_rewrite_specifier,
        Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
            "backend.internal".into()
        ))
    );
    let Outcome::Redirect(moved) = reach(&rc, Request::get("r.com", "/moved")) else {
        panic!("redirect expected")
    };
    assert_eq!(moved.host_redirect, "new.com");
    assert_eq!(moved.response_code, redirect_action::RedirectResponseCode::Found as i32);
    assert_eq!(
        moved.path_rewrite_specifier,
        Some(redirect_action::PathRewriteSpecifier::PathRedirect("/here".into()))
    );
    let Outcome::Redirect(secure) = reach(&rc, Request::get("r.com", "/secure")) else {
        panic!("redirect expected")
    };
    assert_eq!(secure.port_redirect, 8443);
    assert_eq!(
        secure.scheme_rewrite_specifier,
        Some(redirect_action::SchemeRewriteSpecifier::SchemeRedirect("https".into()))
    );
    assert_eq!(
        reach(&rc, Request::get("r.com", "/health")),
        Outcome::Direct(200, Some("ok".into()))
    );
    assert_eq!(
        rc.max_direct_response_body_size_bytes.map(|v| v.value),
        Some(1024 * 1024)
    );
}

#[test]
fn timeouts_and_retries() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs(
            "t",
            "default",
            &["t.com"],
            json!([
                {"match": [{"uri": {"prefix": "/slow"}}], "timeout": "2.5s",
                 "retries": {"attempts": 4, "perTryTimeout": "1s", "retryOn": "5xx,429"}, "route": to("t")},
                {"match": [{"uri": {"prefix": "/once"}}], "retries": {"attempts": 0}, "route": to("t")},
                {"route": to("t")}
            ]),
        ),
    ]);
    let slow = action(matched(&rc, Request::get("t.com", "/slow")));
    assert_eq!(
        slow.timeout,
        Some(xds_api::pbwkt::Duration {
            seconds: 2,
            nanos: 500_000_000
        })
    );
    let retry = slow.retry_policy.as_ref().unwrap();
    assert_eq!(
        (retry.num_retries.unwrap().value, retry.retry_on.as_str()),
        (4, "5xx,retriable-status-codes")
    );
    assert_eq!(retry.retriable_status_codes, [429]);
    assert_eq!(retry.per_try_timeout.unwrap().seconds, 1);
    assert_eq!(action(matched(&rc, Request::get("t.com", "/once"))).retry_policy, None);
    let default = action(matched(&rc, Request::get("t.com", "/")));
    assert_eq!(
        default.timeout,
        Some(xds_api::pbwkt::Duration::default()),
        "Istio disables the route timeout"
    );
    let retry = default.retry_policy.as_ref().unwrap();
    assert_eq!(retry.num_retries.unwrap().value, 2);
    assert_eq!(retry.retry_on, crate::route::policy::DEFAULT_RETRY_ON);
    assert_eq!(retry.host_selection_retry_max_attempts, 5);
    assert_eq!(
        retry.retry_host_predicate[0].name,
        "envoy.retry_host_predicates.previous_hosts"
    );
}

#[test]
fn fault_mirror_headers_and_cors() {
    let rc = http80(&[
        ingress_gateway(json!([http_server(&["*"])])),
        vs(
            "f",
            "default",
            &["f.com"],
            json!([{
                "fault": {"delay": {"fixedDelay": "3s", "percentage": {"value": 50}},
                          "abort": {"httpStatus": 503, "percentage": {"value": 0.1}}},
                "mirror": {"host": "shadow"}, "mirrorPercentage": {"value": 10},
                "headers": {"request": {"set": {"x-set": "1"}, "add": {"x-add": "2"}, "remove": ["x-drop"]},
                            "response": {"set": {"x-resp": "3"}, "remove": ["server"]}},
                "corsPolicy": {"allowOrigins": [{"exact": "https://a.com"}, {"prefix": "https://b."}],
                               "allowMethods": ["GET", "POST"], "allowHeaders": ["x-a", "x-b"],
                               "exposeHeaders": ["x-c"], "maxAge": "24h", "allowCredentials": true},
                "route": to("f")
            }]),
        ),
    ]);
    let r = matched(&rc, Request::get("f.com", "/"));
    let fault = HttpFault::decode(r.typed_per_filter_config["envoy.filters.http.fault"].value.as_slice()).unwrap();
    let delay = fault.delay.unwrap();
    assert_eq!(delay.percentage.unwrap().numerator, 500_000, "50% of a million");
    let abort = fault.abort.unwrap();
    assert_eq!(abort.error_type, Some(fault_abort::ErrorType::HttpStatus(503)));
    assert_eq!(abort.percentage.unwrap().numerator, 1_000);

    let mirror = &action(r).request_mirror_policies[0];
    assert_eq!(mirror.cluster, "outbound|80||shadow.default.svc.cluster.local");
    assert_eq!(
        mirror
            .runtime_fraction
            .as_ref()
            .unwrap()
            .default_value
            .unwrap()
            .numerator,
        100_000
    );

    let added: Vec<_> = r
        .request_headers_to_add
        .iter()
        .map(|h| (h.header.as_ref().unwrap().key.as_str(), h.append_action))
        .collect();
    assert_eq!(
        added,
        [("x-set", 2), ("x-add", 0)],
        "OVERWRITE_IF_EXISTS_OR_ADD then APPEND_IF_EXISTS_OR_ADD"
    );
    assert_eq!(r.request_headers_to_remove, ["x-drop"]);
    assert_eq!(r.response_headers_to_add[0].header.as_ref().unwrap().key, "x-resp");
    assert_eq!(r.response_headers_to_remove, ["server"]);

    let cors = CorsPolicy::decode(r.typed_per_filter_config["envoy.filters.http.cors"].value.as_slice()).unwrap();
    assert_eq!(cors.allow_origin_string_match.len(), 2);
    assert_eq!(
        (cors.allow_methods.as_str(), cors.allow_headers.as_str()),
        ("GET,POST", "x-a,x-b")
    );
    assert_eq!((cors.expose_headers.as_str(), cors.max_age.as_str()), ("x-c", "86400"));
    assert_eq!(cors.allow_credentials.map(|b| b.value), Some(true));
}

#[test]
fn no_virtual_hosts_gives_a_404_blackhole_and_unknown_names_are_empty() {
    let rc = http80(&[ingress_gateway(json!([http_server(&["*"])]))]);
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(
        (
            rc.virtual_hosts[0].name.as_str(),
            rc.virtual_hosts[0].domains.as_slice()
        ),
        ("blackhole:80", &["*".to_owned()][..])
    );
    assert_eq!(reach(&rc, Request::get("any.com", "/")), Outcome::NotFound);

    let unknown = config(&[ingress_gateway(json!([http_server(&["*"])]))], "http.9999");
    assert_eq!(unknown.name, "http.9999");
    assert!(unknown.virtual_hosts.is_empty());
}

#[test]
fn https_redirect_requires_tls_even_without_virtual_services() {
    let redirecting = json!({"port": {"number": 80, "name": "http", "protocol": "HTTP"},
                             "hosts": ["secure.com", "plain.com"], "tls": {"httpsRedirect": true}});
    let rc = http80(&[
        ingress_gateway(json!([redirecting])),
        vs("s", "default", &["secure.com"], simple("s")),
    ]);
    assert_eq!(reach(&rc, Request::get("secure.com", "/")), Outcome::TlsRedirect);
    assert_eq!(reach(&rc, Request::get("plain.com", "/")), Outcome::TlsRedirect);
    let mut tls_req = Request::get("secure.com", "/");
    tls_req.scheme = "https";
    assert_eq!(reach(&rc, tls_req), cluster("s.default.svc.cluster.local"));
}

#[test]
fn https_server_routes_are_per_server() {
    let https = |name: &str, host: &str| {
        json!({"port": {"number": 443, "name": name, "protocol": "HTTPS"}, "hosts": [host],
               "tls": {"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}})
    };
    let docs = [
        ingress_gateway(json!([https("https-a", "a.com"), https("https-b", "b.com")])),
        vs("ab", "default", &["a.com", "b.com"], simple("ab")),
    ];
    let a = config(&docs, "https.443.https-a.gw.istio-system");
    assert_eq!(a.virtual_hosts.len(), 1);
    assert_eq!(a.virtual_hosts[0].domains, ["a.com"]);
    assert_eq!(
        reach(&a, Request::get("a.com", "/")),
        Outcome::Cluster("outbound|80||ab.default.svc.cluster.local".into())
    );
    assert_eq!(reach(&a, Request::get("b.com", "/")), Outcome::NotFound);
}

#[test]
fn entry_points_read_the_real_push_context() {
    let push = crate::testing::push(vec![
        ingress_gateway(json!([http_server(&["*"])])),
        vs("p", "bookinfo", &["shop.example.com"], simple("productpage")),
        crate::testing::service_entry(
            "productpage",
            "bookinfo",
            json!({"hosts": ["productpage.bookinfo.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                   "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
                   "endpoints": [{"address": "10.1.0.1"}]}),
        ),
    ]);
    let proxy = gateway_proxy();
    let listeners = crate::lds::build_listeners(&proxy, &push);
    assert_eq!(
        listeners.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["0.0.0.0_80"]
    );
    let rc = super::build_route_configs(&proxy, &push, &["http.80".to_owned(), "http.81".to_owned()]);
    assert_eq!(rc.len(), 2);
    assert_eq!(
        reach(&rc[0], Request::get("shop.example.com", "/")),
        Outcome::Cluster("outbound|80||productpage.bookinfo.svc.cluster.local".into())
    );
    assert!(rc[1].virtual_hosts.is_empty());
}
