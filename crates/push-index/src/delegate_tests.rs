//! The delegate merge, with the inputs and expected results of Istio's own tables
//! (`TestMergeHttpRoutes`, `TestMergeHTTPMatchRequests`, `TestHasConflict`,
//! `TestControllerMergeVirtualServices`), written as the YAML users would write, in JSON.

use std::sync::Arc;

use model::networking::{HttpMatchRequest, HttpRoute, VirtualService};
use model::{Config, ConfigKey, ConfigKind, ConfigMeta, ConfigSpec};
use serde_json::{Value, json};

use super::*;

fn routes(v: Value) -> Vec<HttpRoute> {
    serde_json::from_value(v).unwrap()
}

fn route(v: Value) -> HttpRoute {
    serde_json::from_value(v).unwrap()
}

fn matches(v: Value) -> Vec<HttpMatchRequest> {
    serde_json::from_value(v).unwrap()
}

fn one_match(v: Value) -> HttpMatchRequest {
    serde_json::from_value(v).unwrap()
}

fn dst(subset: &str) -> Value {
    json!([{"destination": {"host": "productpage.org", "port": {"number": 80}, "subset": subset}}])
}

fn mirror(subset: &str) -> Value {
    json!([{"destination": {"host": "productpage-mirror.org", "port": {"number": 80}, "subset": subset}}])
}

#[test]
fn root_catch_all_passes_timeout_and_headers_to_every_delegate_route() {
    let headers = json!({"request": {"add": {"istio": "test"}, "remove": ["trace-id"]}});
    let root = route(json!({"timeout": "10s", "headers": headers,
        "delegate": {"name": "delegate", "namespace": "default"}}));
    let v2_matches = json!([
        {"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}},
        {"headers": {"version": {"exact": "v2"}}, "queryParams": {"version": {"exact": "v2"}}}
    ]);
    let delegate = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}}], "route": dst("v1")},
        {"match": v2_matches, "route": dst("v2")}
    ]));
    let expected = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}}],
         "route": dst("v1"), "timeout": "10s", "headers": headers},
        {"match": v2_matches, "route": dst("v2"), "timeout": "10s", "headers": headers}
    ]));
    assert_eq!(merge_http_routes(&root, &delegate), expected);
}

#[test]
fn root_match_completes_delegate_matches_and_a_delegate_default_route() {
    let root = route(json!({"match": [{"uri": {"prefix": "/productpage"}, "port": 8080}],
        "delegate": {"name": "delegate", "namespace": "default"}}));
    let delegate = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}}], "route": dst("v1")},
        {"match": [
            {"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}},
            {"headers": {"version": {"exact": "v2"}}, "queryParams": {"version": {"exact": "v2"}}}
        ], "route": dst("v2")},
        {"route": dst("v3")}
    ]));
    let expected = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}, "port": 8080}],
         "route": dst("v1")},
        {"match": [
            {"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}, "port": 8080},
            {"uri": {"prefix": "/productpage"}, "headers": {"version": {"exact": "v2"}},
             "queryParams": {"version": {"exact": "v2"}}, "port": 8080}
        ], "route": dst("v2")},
        {"match": [{"uri": {"prefix": "/productpage"}, "port": 8080}], "route": dst("v3")}
    ]));
    assert_eq!(merge_http_routes(&root, &delegate), expected);
}

#[test]
fn root_mirrors_apply_only_where_the_delegate_has_none() {
    let root = route(json!({"mirrors": mirror("v3"), "delegate": {"name": "delegate"}}));
    let delegate = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}}], "mirrors": mirror("v1"), "route": dst("v1")},
        {"route": dst("v3")}
    ]));
    let expected = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}}], "mirrors": mirror("v1"), "route": dst("v1")},
        {"mirrors": mirror("v3"), "route": dst("v3")}
    ]));
    assert_eq!(merge_http_routes(&root, &delegate), expected);
}

#[test]
fn each_root_match_yields_one_merged_match() {
    let root = route(json!({"match": [
        {"headers": {"header1": {"regex": "regex"}}},
        {"headers": {"header2": {"exact": "exact"}}}
    ], "delegate": {"name": "delegate"}}));
    let delegate = routes(json!([{"match": [{"uri": {"prefix": "/"}}]}]));
    let expected = routes(json!([{"match": [
        {"uri": {"prefix": "/"}, "headers": {"header1": {"regex": "regex"}}},
        {"uri": {"prefix": "/"}, "headers": {"header2": {"exact": "exact"}}}
    ]}]));
    assert_eq!(merge_http_routes(&root, &delegate), expected);
}

#[test]
fn names_join_and_root_policies_fill_gaps() {
    let root = route(
        json!({"name": "root", "match": [{"name": "rm", "uri": {"prefix": "/a"}}],
        "rewrite": {"uri": "/"}, "retries": {"attempts": 3}, "delegate": {"name": "d"}}),
    );
    let delegate = routes(json!([
        {"name": "leaf", "match": [{"name": "lm", "uri": {"prefix": "/a/b"}}], "route": dst("v1"), "timeout": "2s"},
        {"match": [{"uri": {"prefix": "/a/c"}}], "route": dst("v2"), "retries": {"attempts": 1}}
    ]));
    let got = merge_http_routes(&root, &delegate);
    assert_eq!(got[0].name, "root-leaf");
    assert_eq!(got[0].match_[0].name, "rm-lm");
    assert_eq!(
        got[0].match_[0].uri,
        Some(model::networking::StringMatch::prefix("/a/b"))
    );
    assert_eq!(got[0].rewrite, root.rewrite);
    assert_eq!(got[0].retries, root.retries);
    assert_eq!(got[0].timeout, delegate[0].timeout);
    assert_eq!(got[1].name, "root");
    assert_eq!(got[1].match_[0].name, "rm");
    assert_eq!(got[1].retries, delegate[1].retries);
    assert!(got.iter().all(|r| r.delegate.is_none()));
}

#[test]
fn a_conflicting_delegate_route_is_dropped_and_the_rest_kept() {
    let root = route(
        json!({"match": [{"uri": {"prefix": "/productpage"}}, {"uri": {"exact": "/login"}}],
        "delegate": {"name": "d"}}),
    );
    let delegate = routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}}], "route": dst("v1")},
        {"match": [{"name": "mismatch", "uri": {"prefix": "/mis-match/path"}}], "route": dst("v3")}
    ]));
    let expected = routes(json!([{"match": [{"uri": {"prefix": "/productpage/v1"}}], "route": dst("v1")}]));
    assert_eq!(merge_http_routes(&root, &delegate), expected);
}

#[test]
fn match_request_merge_table() {
    let cases = [
        (
            "url match",
            json!([{"uri": {"prefix": "/productpage"}}]),
            json!([{"uri": {"exact": "/productpage/v1"}}]),
            Some(json!([{"uri": {"exact": "/productpage/v1"}}])),
        ),
        (
            "url regex noconflict",
            json!([{"uri": {"regex": "^/productpage"}}]),
            json!([{}]),
            Some(json!([{"uri": {"regex": "^/productpage"}}])),
        ),
        (
            "url regex conflict",
            json!([{"uri": {"regex": "^/productpage"}}]),
            json!([{"uri": {"prefix": "/productpage"}}]),
            None,
        ),
        (
            "multi url match",
            json!([{"uri": {"prefix": "/productpage"}}, {"uri": {"prefix": "/reviews"}}]),
            json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews/v1"}}]),
            Some(json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews/v1"}}])),
        ),
        (
            "url mismatch",
            json!([{"uri": {"prefix": "/productpage"}}]),
            json!([{"uri": {"exact": "/reviews"}}]),
            None,
        ),
        (
            "one delegate match conflicts",
            json!([{"uri": {"prefix": "/productpage"}}]),
            json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews"}}]),
            None,
        ),
        (
            "headers, empty delegate",
            json!([{"headers": {"header": {"exact": "h1"}}}]),
            json!([]),
            Some(json!([{"headers": {"header": {"exact": "h1"}}}])),
        ),
        (
            "headers conflict",
            json!([{"headers": {"header": {"exact": "h1"}}}]),
            json!([{"headers": {"header": {"exact": "h2"}}}]),
            None,
        ),
        (
            "headers union",
            json!([{"headers": {"header": {"exact": "h1"}}}]),
            json!([{"headers": {"header-2": {"exact": "h2"}}}]),
            Some(json!([{"headers": {"header": {"exact": "h1"}, "header-2": {"exact": "h2"}}}])),
        ),
        (
            "delegate header narrows root prefix",
            json!([{"headers": {"h": {"prefix": "a"}}}]),
            json!([{"headers": {"h": {"exact": "ab"}}}]),
            Some(json!([{"headers": {"h": {"exact": "ab"}}}])),
        ),
        (
            "complicated merge",
            json!([{"uri": {"prefix": "/productpage"}, "headers": {"header": {"exact": "h1"}}, "port": 8080,
                 "authority": {"exact": "productpage.com"}}]),
            json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/productpage/v2"}}]),
            Some(json!([
             {"uri": {"exact": "/productpage/v1"}, "headers": {"header": {"exact": "h1"}}, "port": 8080,
              "authority": {"exact": "productpage.com"}},
             {"uri": {"exact": "/productpage/v2"}, "headers": {"header": {"exact": "h1"}}, "port": 8080,
              "authority": {"exact": "productpage.com"}}])),
        ),
        (
            "conflicted merge (port)",
            json!([{"uri": {"prefix": "/productpage"}, "port": 8080}]),
            json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/productpage/v2"}, "port": 9090}]),
            None,
        ),
        (
            "gateway merge",
            json!([{"uri": {"prefix": "/productpage"}, "gateways": ["ingress-gateway", "mesh"]}]),
            json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
            Some(
                json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                     {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
            ),
        ),
        (
            "gateway conflicted merge",
            json!([{"uri": {"prefix": "/productpage"}, "gateways": ["ingress-gateway"]}]),
            json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
            None,
        ),
        (
            "source labels merge",
            json!([{"sourceLabels": {"app": "test"}}]),
            json!([{"sourceLabels": {"version": "v1"}}]),
            Some(json!([{"sourceLabels": {"app": "test", "version": "v1"}}])),
        ),
    ];
    for (name, root, delegate, expected) in cases {
        let got = merge_http_match_requests(&matches(root), &matches(delegate));
        assert_eq!(got, expected.map(matches), "{name}");
    }
}

#[test]
fn has_conflict_table() {
    let cases = [
        (
            "regex uri",
            json!({"uri": {"regex": "^/productpage"}}),
            json!({"uri": {"prefix": "/productpage/v2"}}),
            true,
        ),
        (
            "regex root, no delegate uri",
            json!({"uri": {"regex": "^/productpage"}}),
            json!({}),
            false,
        ),
        (
            "regex delegate, no root uri",
            json!({}),
            json!({"uri": {"regex": "^/productpage"}}),
            false,
        ),
        (
            "regex root, prefix delegate",
            json!({"uri": {"regex": "^/p"}}),
            json!({"uri": {"prefix": "/p"}}),
            true,
        ),
        (
            "prefix root, regex delegate",
            json!({"uri": {"prefix": "/p"}}),
            json!({"uri": {"regex": "^/p"}}),
            true,
        ),
        (
            "match uri",
            json!({"uri": {"prefix": "/productpage"}}),
            json!({"uri": {"prefix": "/productpage/v2"}}),
            false,
        ),
        (
            "mismatch uri",
            json!({"uri": {"prefix": "/productpage/v2"}}),
            json!({"uri": {"prefix": "/productpage"}}),
            true,
        ),
        (
            "prefix root, exact delegate",
            json!({"uri": {"prefix": "/p/v2"}}),
            json!({"uri": {"exact": "/p/v2"}}),
            false,
        ),
        (
            "exact root, prefix delegate",
            json!({"uri": {"exact": "/p"}}),
            json!({"uri": {"prefix": "/p"}}),
            true,
        ),
        (
            "headers not equal",
            json!({"headers": {"h": {"exact": "h1"}}}),
            json!({"headers": {"h": {"exact": "h2"}}}),
            true,
        ),
        (
            "headers equal",
            json!({"headers": {"h": {"exact": "h1"}}}),
            json!({"headers": {"h": {"exact": "h1"}}}),
            false,
        ),
        (
            "headers match",
            json!({"headers": {"h": {"prefix": "h1"}}}),
            json!({"headers": {"h": {"exact": "h1-v1"}}}),
            false,
        ),
        (
            "headers mismatch",
            json!({"headers": {"h": {"prefix": "h1"}}}),
            json!({"headers": {"h": {"exact": "h2"}}}),
            true,
        ),
        (
            "headers prefix mismatch",
            json!({"headers": {"h": {"prefix": "h1"}}}),
            json!({"headers": {"h": {"prefix": "h2"}}}),
            true,
        ),
        (
            "diff headers",
            json!({"headers": {"h": {"exact": "h1"}}}),
            json!({"headers": {"h2": {"exact": "h2"}}}),
            false,
        ),
        (
            "withoutHeaders mismatch",
            json!({"withoutHeaders": {"h": {"prefix": "h1"}}}),
            json!({"withoutHeaders": {"h": {"exact": "h2"}}}),
            true,
        ),
        (
            "query param mismatch",
            json!({"queryParams": {"q": {"exact": "1"}}}),
            json!({"queryParams": {"q": {"exact": "2"}}}),
            true,
        ),
        ("ignoreUriCase differs", json!({"ignoreUriCase": true}), json!({}), true),
        ("port unset in root", json!({}), json!({"port": 8080}), false),
        ("port unset in delegate", json!({"port": 8080}), json!({}), false),
        ("port differs", json!({"port": 8080}), json!({"port": 8090}), true),
        (
            "sourceLabels mismatch",
            json!({"sourceLabels": {"a": "b"}}),
            json!({"sourceLabels": {"a": "c"}}),
            true,
        ),
        (
            "sourceNamespace mismatch",
            json!({"sourceNamespace": "test1"}),
            json!({"sourceNamespace": "test2"}),
            true,
        ),
        (
            "root has fewer gateways",
            json!({"gateways": ["ingress-gateway"]}),
            json!({"gateways": ["ingress-gateway", "mesh"]}),
            true,
        ),
    ];
    for (name, root, leaf, expected) in cases {
        assert_eq!(has_conflict(&one_match(root), &one_match(leaf)), expected, "{name}");
    }
}

// ---- whole VirtualServices, as Istio's TestControllerMergeVirtualServices ----

fn vs_config(name: &str, ns: &str, spec: Value) -> Arc<Config> {
    let spec: VirtualService = serde_json::from_value(spec).unwrap();
    Arc::new(Config {
        kind: ConfigKind::VirtualService,
        meta: ConfigMeta {
            name: name.into(),
            namespace: ns.into(),
            ..Default::default()
        },
        spec: ConfigSpec::VirtualService(spec),
    })
}

fn vs_key(ns: &str, name: &str) -> ConfigKey {
    ConfigKey {
        kind: ConfigKind::VirtualService,
        namespace: ns.into(),
        name: name.into(),
    }
}

fn example_route() -> Value {
    json!({"route": [{"destination": {"host": "example.org", "port": {"number": 80}}}]})
}

/// Istio's `rootVs` (namespace given by `delegate_ns`, `null` to leave it out).
fn root_vs(name: &str, ns: &str, delegate_ns: Option<&str>) -> Arc<Config> {
    let mut delegate = json!({"name": "productpage-vs"});
    if let Some(d) = delegate_ns {
        delegate["namespace"] = json!(d);
    }
    vs_config(
        name,
        ns,
        json!({"hosts": ["*.org"], "gateways": [format!("{ns}/gateway")], "http": [
            {"match": [{"uri": {"prefix": "/productpage"}}, {"uri": {"exact": "/login"}}], "delegate": delegate},
            example_route()
        ]}),
    )
}

/// Istio's `createDelegateVs`: v1, v2 by prefix, v3 as default.
fn delegate_vs(ns: &str, export_to: Value) -> Arc<Config> {
    vs_config(
        "productpage-vs",
        ns,
        json!({"exportTo": export_to, "http": [
            {"match": [{"uri": {"prefix": "/productpage/v1"}}], "route": dst("v1")},
            {"match": [{"uri": {"prefix": "/productpage/v2"}}], "route": dst("v2")},
            {"route": dst("v3")}
        ]}),
    )
}

fn http_of(cfg: &Config) -> Value {
    match &cfg.spec {
        ConfigSpec::VirtualService(vs) => serde_json::to_value(&vs.http).unwrap(),
        other => panic!("not a VirtualService: {other:?}"),
    }
}

fn merged_http() -> Value {
    serde_json::to_value(routes(json!([
        {"match": [{"uri": {"prefix": "/productpage/v1"}}], "route": dst("v1")},
        {"match": [{"uri": {"prefix": "/productpage/v2"}}], "route": dst("v2")},
        {"match": [{"uri": {"prefix": "/productpage"}}, {"uri": {"exact": "/login"}}], "route": dst("v3")},
        example_route()
    ])))
    .unwrap()
}

fn only_example_route() -> Value {
    serde_json::to_value(routes(json!([example_route()]))).unwrap()
}

fn merge(vses: Vec<Arc<Config>>, default_export_to: &[&str]) -> MergedVirtualServices {
    let default: Vec<String> = default_export_to.iter().map(|s| (*s).to_owned()).collect();
    merge_virtual_services_if_needed(vses, &default)
}

/// (case, VirtualServices, mesh default exportTo, expected `http` of each indexed VirtualService)
type ControllerCase = (&'static str, Vec<Arc<Config>>, &'static [&'static str], Vec<Value>);

#[test]
fn controller_cases() {
    let public: &[&str] = &["*"];
    let private: &[&str] = &["."];
    let cases: Vec<ControllerCase> = vec![
        (
            "one root vs: delegate missing, its route dropped",
            vec![root_vs("root-vs", "istio-system", Some("default"))],
            public,
            vec![only_example_route()],
        ),
        (
            "one delegate vs: nothing indexed",
            vec![delegate_vs("default", json!(["istio-system"]))],
            public,
            vec![],
        ),
        (
            "root and delegate",
            vec![
                root_vs("root-vs", "istio-system", Some("default")),
                delegate_vs("default", json!(["istio-system"])),
            ],
            public,
            vec![merged_http()],
        ),
        (
            "delegate namespace defaults to the root's, public by default",
            vec![
                root_vs("default-vs", "default", None),
                delegate_vs("default", json!([])),
            ],
            public,
            vec![merged_http()],
        ),
        (
            "delegate namespace defaults to the root's, private by default",
            vec![
                root_vs("default-vs", "default", None),
                delegate_vs("default", json!([])),
            ],
            private,
            vec![merged_http()],
        ),
        (
            "delegate exported to its own namespace only",
            vec![
                root_vs("root-vs", "istio-system", Some("default2")),
                delegate_vs("default2", json!(["."])),
            ],
            public,
            vec![only_example_route()],
        ),
        (
            "delegate private by mesh default, root elsewhere",
            vec![
                root_vs("root-vs", "istio-system", Some("default")),
                delegate_vs("default", json!([])),
            ],
            private,
            vec![only_example_route()],
        ),
        (
            "delegate exported to another namespace",
            vec![
                root_vs("root-vs", "istio-system", Some("default")),
                delegate_vs("default", json!(["other"])),
            ],
            public,
            vec![only_example_route()],
        ),
    ];
    for (name, vses, default_export_to, expected) in cases {
        let merged = merge(vses, default_export_to);
        let got: Vec<Value> = merged.virtual_services.iter().map(|c| http_of(c)).collect();
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn multiple_routes_delegate_to_one_and_each_keeps_its_own_root_policy() {
    let root = vs_config(
        "root-vs",
        "istio-system",
        json!({"hosts": ["*.org"], "http": [
            {"match": [{"uri": {"prefix": "/productpage"}}], "delegate": {"name": "productpage-vs", "namespace": "default"}},
            {"match": [{"uri": {"prefix": "/legacy/path"}}], "rewrite": {"uri": "/productpage"},
             "delegate": {"name": "productpage-vs", "namespace": "default"}}
        ]}),
    );
    let single = vs_config("productpage-vs", "default", json!({"http": [{"route": dst("v1")}]}));
    let merged = merge(vec![root, single], &["*"]);
    let expected = serde_json::to_value(routes(json!([
        {"match": [{"uri": {"prefix": "/productpage"}}], "route": dst("v1")},
        {"match": [{"uri": {"prefix": "/legacy/path"}}], "rewrite": {"uri": "/productpage"}, "route": dst("v1")}
    ])))
    .unwrap();
    assert_eq!(merged.virtual_services.len(), 1);
    assert_eq!(http_of(&merged.virtual_services[0]), expected);
    // named twice, recorded once
    assert_eq!(
        merged.delegates_by_root[&vs_key("istio-system", "root-vs")],
        [vs_key("default", "productpage-vs")]
    );
}

#[test]
fn order_is_kept_and_delegates_are_left_out() {
    let plain = vs_config(
        "virtual-service",
        "default",
        json!({"hosts": ["example.org"], "http": [example_route()]}),
    );
    let merged = merge(
        vec![
            root_vs("a-root", "istio-system", Some("default")),
            delegate_vs("default", json!([])),
            plain,
        ],
        &["*"],
    );
    let names: Vec<&str> = merged.virtual_services.iter().map(|c| c.meta.name.as_str()).collect();
    assert_eq!(names, ["a-root", "virtual-service"]);
    assert!(
        merged
            .delegates
            .contains_key(&("default".to_owned(), "productpage-vs".to_owned()))
    );
    assert!(
        !merged
            .delegates_by_root
            .contains_key(&vs_key("default", "virtual-service"))
    );
}

#[test]
fn a_delegate_that_delegates_is_ignored() {
    let root = root_vs("root-vs", "istio-system", Some("default"));
    let chained = vs_config(
        "productpage-vs",
        "default",
        json!({"http": [
            {"route": dst("v1")},
            {"delegate": {"name": "deeper", "namespace": "default"}}
        ]}),
    );
    let deeper = vs_config("deeper", "default", json!({"http": [{"route": dst("v9")}]}));
    let merged = merge(vec![root, chained, deeper], &["*"]);
    assert_eq!(http_of(&merged.virtual_services[0]), only_example_route());
    assert_eq!(
        merged.delegates_by_root[&vs_key("istio-system", "root-vs")],
        [vs_key("default", "productpage-vs")]
    );
}

#[test]
fn dependencies_name_missing_and_invisible_delegates_too() {
    let root = vs_config(
        "root",
        "apps",
        json!({"hosts": ["a.org"], "http": [
            {"match": [{"uri": {"prefix": "/x"}}], "delegate": {"name": "missing"}},
            {"match": [{"uri": {"prefix": "/y"}}], "delegate": {"name": "hidden", "namespace": "team"}},
            {"match": [{"uri": {"prefix": "/z"}}], "delegate": {"name": "ok", "namespace": "team"}}
        ]}),
    );
    let hidden = vs_config(
        "hidden",
        "team",
        json!({"exportTo": ["."], "http": [{"route": dst("h")}]}),
    );
    let ok = vs_config(
        "ok",
        "team",
        json!({"exportTo": ["apps"], "http": [{"route": dst("ok")}]}),
    );
    let merged = merge(vec![root, hidden, ok], &["*"]);
    assert_eq!(
        merged.delegates_by_root[&vs_key("apps", "root")],
        [
            vs_key("apps", "missing"),
            vs_key("team", "hidden"),
            vs_key("team", "ok")
        ]
    );
    let expected = serde_json::to_value(routes(
        json!([{"match": [{"uri": {"prefix": "/z"}}], "route": dst("ok")}]),
    ))
    .unwrap();
    assert_eq!(http_of(&merged.virtual_services[0]), expected);
}

#[test]
fn an_empty_mesh_default_export_to_means_public() {
    let merged = merge(
        vec![
            root_vs("root-vs", "istio-system", Some("default")),
            delegate_vs("default", json!([])),
        ],
        &[],
    );
    assert_eq!(http_of(&merged.virtual_services[0]), merged_http());
}

// ---- through the PushContext ----

use crate::testing::push;

fn vs_doc(name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

#[test]
fn push_context_merges_roots_resolves_delegates_in_their_namespace_and_lists_dependencies() {
    let p = push(vec![
        vs_doc(
            "root",
            "istio-system",
            json!({"hosts": ["shop.example.com"], "gateways": ["gw"], "http": [
                {"match": [{"uri": {"prefix": "/cart"}}], "delegate": {"name": "cart", "namespace": "shop"}}
            ]}),
        ),
        vs_doc(
            "cart",
            "shop",
            json!({"http": [{"match": [{"uri": {"prefix": "/cart/v2"}}],
            "route": [{"destination": {"host": "cart"}}]}]}),
        ),
        vs_doc(
            "plain",
            "default",
            json!({"hosts": ["plain.example.com"], "http": [
            {"route": [{"destination": {"host": "plain"}}]}]}),
        ),
    ]);
    let gw = p.virtual_services_for_gateway(&proxy_in("istio-system"), "istio-system/gw");
    assert_eq!(gw.len(), 1);
    let ConfigSpec::VirtualService(root) = &gw[0].spec else {
        panic!("a VirtualService")
    };
    assert_eq!(root.http.len(), 1);
    assert_eq!(root.http[0].route[0].destination.host, "cart.shop.svc.cluster.local");
    assert_eq!(
        root.http[0].match_[0].uri,
        Some(model::networking::StringMatch::prefix("/cart/v2"))
    );
    assert!(root.http[0].delegate.is_none());
    assert_eq!(p.delegate_virtual_services(&gw), [vs_key("shop", "cart")]);
    // the delegate itself is bound to no gateway, mesh included
    let mesh = p.virtual_services_for_gateway(&proxy_in("shop"), crate::MESH_GATEWAY);
    let names: Vec<&str> = mesh.iter().map(|c| c.meta.name.as_str()).collect();
    assert_eq!(names, ["plain"]);
    assert!(p.delegate_virtual_services(&mesh).is_empty());
    assert!(p.delegate_virtual_service("shop", "cart").is_some());
}

fn proxy_in(ns: &str) -> model::Proxy {
    model::testing::proxy("router", "10.0.0.9", ns, json!({}))
}
