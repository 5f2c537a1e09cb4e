//! Istio's own builder test data (`../shared/corpus/istio/pilot/pkg/security/authz/builder/testdata`):
//! for every input policy file, the RBAC filters we build for the workload `app=httpbin,version=v1`
//! in namespace `foo` must decide every request as Istio's expected output does. Filters are
//! compared semantically: the same action, the same policy names, and per policy the same
//! permissions and principals (map order aside). The case table (which input, which mesh config
//! and trust domains, which outputs) is the one of Istio's `builder_test.go`. The `extended-*`
//! files are not compared: Istio's own test never reads them (it verifies `tc.want`). CUSTOM cases
//! run with the table's mesh configs (ext_authz providers) and the table's one service,
//! `my-custom-ext-authz.foo.svc.cluster.local`; their ext_authz filters are compared whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;
use push_index::security_policies::{PolicyIndex, authorization_policy, authorization_scope, by_action};
use serde_json::{Value, json};
use xds_api::envoy::config::listener::v3::{Filter, filter};
use xds_api::envoy::config::rbac::v3::Rbac;
use xds_api::envoy::extensions::filters::http::ext_authz::v3::ExtAuthz as HttpExtAuthz;
use xds_api::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use xds_api::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{HttpFilter, http_filter};
use xds_api::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;

use super::{Builder, Bundle};

fn testdata() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/istio/pilot/pkg/security/authz/builder/testdata");
    assert!(
        dir.is_dir(),
        "Istio's authz builder test data is missing: {} (the tests need ../shared beside the project)",
        dir.display()
    );
    dir
}

/// One row of Istio's table.
struct Case {
    name: &'static str,
    input: &'static str,
    want: &'static [&'static str],
    /// The trust domain bundle (none: Go's zero `Bundle`, no trust domains).
    bundle: Option<(&'static str, &'static [&'static str])>,
    /// The mesh config's extension providers (Istio's `meshConfigGRPC`, ...).
    mesh: Mesh,
}

#[derive(Clone, Copy)]
enum Mesh {
    None,
    GrpcNoNamespace,
    Grpc,
    Http,
    Invalid,
}

/// The extension providers of Istio's `builder_test.go` mesh configs.
fn extension_providers(mesh: Mesh) -> Vec<Value> {
    let provider = match mesh {
        Mesh::None => return Vec::new(),
        Mesh::GrpcNoNamespace => json!({"envoyExtAuthzGrpc": {
            "service": "my-custom-ext-authz.foo.svc.cluster.local", "port": 9000,
            "failOpen": true, "statusOnError": "403"}}),
        Mesh::Grpc => json!({"envoyExtAuthzGrpc": {
            "service": "foo/my-custom-ext-authz.foo.svc.cluster.local", "port": 9000, "timeout": "0.002s",
            "failOpen": true, "statusOnError": "403",
            "includeRequestBodyInCheck": {"maxRequestBytes": 4096, "allowPartialMessage": true}}}),
        Mesh::Http => json!({"envoyExtAuthzHttp": {
            "service": "foo/my-custom-ext-authz.foo.svc.cluster.local", "port": 9000, "timeout": "10s",
            "failOpen": true, "statusOnError": "403", "pathPrefix": "/check",
            "includeRequestHeadersInCheck": ["x-custom-id", "x-prefix-*", "*-suffix"],
            "includeHeadersInCheck": ["should-not-include-when-IncludeRequestHeadersInCheck-is-set"],
            "includeAdditionalHeadersInCheck": {"x-header-1": "value-1", "x-header-2": "value-2"},
            "includeRequestBodyInCheck": {"maxRequestBytes": 2048, "allowPartialMessage": true, "packAsBytes": true},
            "headersToUpstreamOnAllow": ["Authorization", "x-prefix-*", "*-suffix"],
            "headersToDownstreamOnDeny": ["Set-cookie", "x-prefix-*", "*-suffix"],
            "headersToDownstreamOnAllow": ["Set-cookie", "x-prefix-*", "*-suffix"]}}),
        Mesh::Invalid => json!({"envoyExtAuthzHttp": {
            "service": "foo/my-custom-ext-authz", "port": 999999, "pathPrefix": "check", "statusOnError": "999"}}),
    };
    let mut p = provider;
    p["name"] = json!("default");
    vec![p]
}

/// Istio's test push: one service, `my-custom-ext-authz.foo.svc.cluster.local` in `foo`.
fn lookup(service: &str, port: u16) -> Result<(String, String), String> {
    const HOST: &str = "my-custom-ext-authz.foo.svc.cluster.local";
    match service.split_once('/') {
        Some(("foo", HOST)) | None if service.ends_with(HOST) => Ok((HOST.into(), format!("outbound|{port}||{HOST}"))),
        _ => Err(format!("could not find service {service} in Istio service registry")),
    }
}

const fn case(name: &'static str, input: &'static str, want: &'static [&'static str]) -> Case {
    Case {
        name,
        input,
        want,
        bundle: None,
        mesh: Mesh::None,
    }
}

const HTTP_CASES: &[Case] = &[
    case(
        "allow-empty-rule",
        "allow-empty-rule-in.yaml",
        &["allow-empty-rule-out.yaml"],
    ),
    case(
        "allow-full-rule",
        "allow-full-rule-in.yaml",
        &["allow-full-rule-out.yaml"],
    ),
    case("allow-nil-rule", "allow-nil-rule-in.yaml", &["allow-nil-rule-out.yaml"]),
    case("allow-path", "allow-path-in.yaml", &["allow-path-out.yaml"]),
    case(
        "audit-full-rule",
        "audit-full-rule-in.yaml",
        &["audit-full-rule-out.yaml"],
    ),
    Case {
        mesh: Mesh::GrpcNoNamespace,
        ..case(
            "custom-grpc-provider-no-namespace",
            "custom-simple-http-in.yaml",
            &[
                "custom-grpc-provider-no-namespace-out1.yaml",
                "custom-grpc-provider-no-namespace-out2.yaml",
            ],
        )
    },
    Case {
        mesh: Mesh::Grpc,
        ..case(
            "custom-grpc-provider",
            "custom-simple-http-in.yaml",
            &["custom-grpc-provider-out1.yaml", "custom-grpc-provider-out2.yaml"],
        )
    },
    Case {
        mesh: Mesh::Http,
        ..case(
            "custom-http-provider",
            "custom-simple-http-in.yaml",
            &["custom-http-provider-out1.yaml", "custom-http-provider-out2.yaml"],
        )
    },
    Case {
        mesh: Mesh::Http,
        ..case(
            "custom-bad-multiple-providers",
            "custom-bad-multiple-providers-in.yaml",
            &[
                "custom-bad-multiple-providers-out1.yaml",
                "custom-bad-multiple-providers-out2.yaml",
            ],
        )
    },
    Case {
        mesh: Mesh::Invalid,
        ..case(
            "custom-bad-invalid-config",
            "custom-simple-http-in.yaml",
            &["custom-bad-out.yaml"],
        )
    },
    case(
        "deny-and-allow",
        "deny-and-allow-in.yaml",
        &["deny-and-allow-out1.yaml", "deny-and-allow-out2.yaml"],
    ),
    case(
        "deny-empty-rule",
        "deny-empty-rule-in.yaml",
        &["deny-empty-rule-out.yaml"],
    ),
    case(
        "dry-run-allow-and-deny",
        "dry-run-allow-and-deny-in.yaml",
        &["dry-run-allow-and-deny-out1.yaml", "dry-run-allow-and-deny-out2.yaml"],
    ),
    case("dry-run-allow", "dry-run-allow-in.yaml", &["dry-run-allow-out.yaml"]),
    case("dry-run-mix", "dry-run-mix-in.yaml", &["dry-run-mix-out.yaml"]),
    case(
        "multiple-policies",
        "multiple-policies-in.yaml",
        &["multiple-policies-out.yaml"],
    ),
    case("single-policy", "single-policy-in.yaml", &["single-policy-out.yaml"]),
    Case {
        bundle: Some(("td1", &["cluster.local"])),
        ..case(
            "trust-domain-one-alias",
            "simple-policy-td-aliases-in.yaml",
            &["simple-policy-td-aliases-out.yaml"],
        )
    },
    Case {
        bundle: Some(("td1", &["cluster.local", "some-td"])),
        ..case(
            "trust-domain-multiple-aliases",
            "simple-policy-multiple-td-aliases-in.yaml",
            &["simple-policy-multiple-td-aliases-out.yaml"],
        )
    },
    Case {
        bundle: Some(("td1", &["foobar"])),
        ..case(
            "trust-domain-wildcard-in-principal",
            "simple-policy-principal-with-wildcard-in.yaml",
            &["simple-policy-principal-with-wildcard-out.yaml"],
        )
    },
    Case {
        bundle: Some(("new-td", &["old-td", "some-trustdomain"])),
        ..case(
            "trust-domain-aliases-in-source-principal",
            "td-aliases-source-principal-in.yaml",
            &["td-aliases-source-principal-out.yaml"],
        )
    },
    case(
        "trust-domains-field",
        "trust-domains-in.yaml",
        &["trust-domains-out.yaml"],
    ),
];

const TCP_CASES: &[Case] = &[
    case(
        "allow-both-http-tcp",
        "allow-both-http-tcp-in.yaml",
        &["allow-both-http-tcp-out.yaml"],
    ),
    case(
        "allow-only-http",
        "allow-only-http-in.yaml",
        &["allow-only-http-out.yaml"],
    ),
    case(
        "audit-both-http-tcp",
        "audit-both-http-tcp-in.yaml",
        &["audit-both-http-tcp-out.yaml"],
    ),
    Case {
        mesh: Mesh::Grpc,
        ..case(
            "custom-both-http-tcp",
            "custom-both-http-tcp-in.yaml",
            &["custom-both-http-tcp-out1.yaml", "custom-both-http-tcp-out2.yaml"],
        )
    },
    Case {
        mesh: Mesh::Http,
        ..case("custom-only-http", "custom-only-http-in.yaml", &[])
    },
    case(
        "deny-both-http-tcp",
        "deny-both-http-tcp-in.yaml",
        &["deny-both-http-tcp-out.yaml"],
    ),
    case("dry-run-mix", "dry-run-mix-in.yaml", &["dry-run-mix-out.yaml"]),
];

fn yaml_docs(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn builder(dir: &Path, c: &Case) -> Option<Builder> {
    let configs: Vec<Arc<model::Config>> = yaml_docs(&dir.join(c.input))
        .into_iter()
        .map(|d| Arc::new(model::config::parse_config(d, "default").unwrap_or_else(|e| panic!("{}: {e}", c.input))))
        .collect();
    let index = PolicyIndex::new(&configs, "istio-system", |c| authorization_policy(c).is_some());
    let labels: BTreeMap<String, String> = [("app", "httpbin"), ("version", "v1")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let policies = by_action(index.for_workload("foo", &labels, authorization_scope));
    let bundle = c.bundle.map_or_else(Bundle::default, |(td, aliases)| {
        Bundle::new(td, &aliases.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    });
    Builder::for_test(bundle, policies, &extension_providers(c.mesh), &lookup)
}

/// One filter, decoded: RBAC as (enforced rules, shadow rules, shadow stat prefix, stat prefix),
/// ext_authz whole.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a few per test case
enum Decided {
    Rbac(Option<Rbac>, Option<Rbac>, String, String),
    HttpExtAuthz(HttpExtAuthz),
    NetworkExtAuthz(NetworkExtAuthz),
}

fn http_filter(f: &HttpFilter) -> Decided {
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{}: no typed config", f.name)
    };
    match f.name.as_str() {
        "envoy.filters.http.rbac" => {
            let r = HttpRbac::decode(any.value.as_slice()).unwrap();
            Decided::Rbac(r.rules, r.shadow_rules, r.shadow_rules_stat_prefix, String::new())
        }
        "envoy.filters.http.ext_authz" => Decided::HttpExtAuthz(HttpExtAuthz::decode(any.value.as_slice()).unwrap()),
        other => panic!("unexpected HTTP filter {other}"),
    }
}

fn network_filter(f: &Filter) -> Decided {
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{}: no typed config", f.name)
    };
    match f.name.as_str() {
        "envoy.filters.network.rbac" => {
            let r = NetworkRbac::decode(any.value.as_slice()).unwrap();
            Decided::Rbac(r.rules, r.shadow_rules, r.shadow_rules_stat_prefix, r.stat_prefix)
        }
        "envoy.filters.network.ext_authz" => {
            Decided::NetworkExtAuthz(NetworkExtAuthz::decode(any.value.as_slice()).unwrap())
        }
        other => panic!("unexpected network filter {other}"),
    }
}

/// Where two rule sets differ, policy by policy; empty when they decide alike.
fn differences(what: &str, ours: &Option<Rbac>, istio: &Option<Rbac>) -> Vec<String> {
    match (ours, istio) {
        (None, None) => Vec::new(),
        (Some(_), None) | (None, Some(_)) => vec![format!(
            "{what}: ours {:?}, Istio's {:?}",
            ours.is_some(),
            istio.is_some()
        )],
        (Some(a), Some(b)) => {
            let mut out = Vec::new();
            if a.action != b.action {
                out.push(format!("{what}: action {} vs Istio's {}", a.action, b.action));
            }
            let names: std::collections::BTreeSet<&String> = a.policies.keys().chain(b.policies.keys()).collect();
            for name in names {
                match (a.policies.get(name), b.policies.get(name)) {
                    (Some(x), Some(y)) if x.permissions != y.permissions => out.push(format!(
                        "{what} {name}: permissions differ:\n ours {:?}\n istio {:?}",
                        x.permissions, y.permissions
                    )),
                    (Some(x), Some(y)) if x.principals != y.principals => out.push(format!(
                        "{what} {name}: principals differ:\n ours {:?}\n istio {:?}",
                        x.principals, y.principals
                    )),
                    (Some(_), Some(_)) => {}
                    (Some(_), None) => out.push(format!("{what} {name}: ours only")),
                    (None, _) => out.push(format!("{what} {name}: Istio's only")),
                }
            }
            out
        }
    }
}

fn compare(case: &str, ours: &[Decided], istio: &[Decided]) -> Vec<String> {
    if ours.len() != istio.len() {
        return vec![format!(
            "{case}: {} filters, Istio {}: {ours:?}",
            ours.len(),
            istio.len()
        )];
    }
    let mut out = Vec::new();
    for (i, (a, b)) in ours.iter().zip(istio).enumerate() {
        match (a, b) {
            (Decided::Rbac(r1, s1, sp1, p1), Decided::Rbac(r2, s2, sp2, p2)) => {
                out.extend(differences(&format!("{case} filter {i} rules"), r1, r2));
                out.extend(differences(&format!("{case} filter {i} shadow rules"), s1, s2));
                if (sp1, p1) != (sp2, p2) {
                    out.push(format!(
                        "{case} filter {i}: stat prefixes {:?} vs Istio's {:?}",
                        (sp1, p1),
                        (sp2, p2)
                    ));
                }
            }
            (Decided::HttpExtAuthz(x), Decided::HttpExtAuthz(y)) if x == y => {}
            (Decided::NetworkExtAuthz(x), Decided::NetworkExtAuthz(y)) if x == y => {}
            _ => out.push(format!("{case} filter {i}:\n ours  {a:?}\n istio {b:?}")),
        }
    }
    out
}

fn run(cases: &[Case], dir: &Path, for_tcp: bool) -> (usize, Vec<String>) {
    let (mut same, mut failures) = (0, Vec::new());
    for c in cases {
        let b = builder(dir, c);
        let ours: Vec<Decided> = match (&b, for_tcp) {
            (None, _) => Vec::new(),
            (Some(b), false) => b
                .custom_http_filters()
                .iter()
                .chain(&b.http_filters())
                .map(http_filter)
                .collect(),
            (Some(b), true) => b
                .custom_network_filters()
                .iter()
                .chain(&b.network_filters())
                .map(network_filter)
                .collect(),
        };
        let istio: Vec<Decided> = c
            .want
            .iter()
            .map(|w| {
                let doc = yaml_docs(&dir.join(w)).remove(0);
                if for_tcp {
                    network_filter(
                        &xds_api::json::json_to_message::<Filter>(&doc).unwrap_or_else(|e| panic!("{w}: {e}")),
                    )
                } else {
                    http_filter(
                        &xds_api::json::json_to_message::<HttpFilter>(&doc).unwrap_or_else(|e| panic!("{w}: {e}")),
                    )
                }
            })
            .collect();
        let diffs = compare(c.name, &ours, &istio);
        println!(
            "{}: {}",
            c.name,
            if diffs.is_empty() {
                "same decisions as Istio"
            } else {
                "DIFFERENT"
            }
        );
        if diffs.is_empty() {
            same += 1;
        }
        failures.extend(diffs);
    }
    (same, failures)
}

#[test]
fn http_filters_decide_as_istios_builder_goldens() {
    let dir = testdata().join("http");
    let (same, failures) = run(HTTP_CASES, &dir, false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(same, HTTP_CASES.len());
}

#[test]
fn tcp_filters_decide_as_istios_builder_goldens() {
    let dir = testdata().join("tcp");
    let (same, failures) = run(TCP_CASES, &dir, true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(same, TCP_CASES.len());
}

/// Inputs Istio's table no longer uses: the host matchers of proxies before Istio 1.11.
const UNUSED_INPUTS: &[&str] = &["allow-host-before-111-in.yaml"];

#[test]
fn every_input_file_is_in_a_case() {
    for (sub, cases) in [("http", HTTP_CASES), ("tcp", TCP_CASES)] {
        let dir = testdata().join(sub);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with("-in.yaml") && !UNUSED_INPUTS.contains(&name.as_str()) {
                assert!(cases.iter().any(|c| c.input == name), "{sub}/{name} is in no case");
            }
        }
    }
}
