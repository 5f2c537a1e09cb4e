//! Istio's own builder test data (`../shared/corpus/istio/pilot/pkg/security/authz/builder/testdata`):
//! for every input policy file, the RBAC filters we build for the workload `app=httpbin,version=v1`
//! in namespace `foo` must decide every request as Istio's expected output does. Filters are
//! compared semantically: the same action, the same policy names, and per policy the same
//! permissions and principals (map order aside). The case table (which input, which mesh config
//! and trust domains, which outputs) is the one of Istio's `builder_test.go`. The `extended-*`
//! files are not compared: Istio's own test never reads them (it verifies `tc.want`).
//! CUSTOM policies whose provider Istio can use are reported as not yet built: we fail closed
//! (the policy's rules as DENY, as Istio does for a provider it cannot use) and check that.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;
use push_index::security_policies::{PolicyIndex, authorization_policy, authorization_scope, by_action};
use xds_api::envoy::config::listener::v3::{Filter, filter};
use xds_api::envoy::config::rbac::v3::Rbac;
use xds_api::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{HttpFilter, http_filter};
use xds_api::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;

use super::{BAD_CUSTOM_SUFFIX, Builder, Bundle};

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
    /// Whether the mesh config names a usable ext_authz provider (CUSTOM built by Istio).
    custom_provider: bool,
}

const fn case(name: &'static str, input: &'static str, want: &'static [&'static str]) -> Case {
    Case {
        name,
        input,
        want,
        bundle: None,
        custom_provider: false,
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
        custom_provider: true,
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
        custom_provider: true,
        ..case(
            "custom-grpc-provider",
            "custom-simple-http-in.yaml",
            &["custom-grpc-provider-out1.yaml", "custom-grpc-provider-out2.yaml"],
        )
    },
    Case {
        custom_provider: true,
        ..case(
            "custom-http-provider",
            "custom-simple-http-in.yaml",
            &["custom-http-provider-out1.yaml", "custom-http-provider-out2.yaml"],
        )
    },
    Case {
        custom_provider: true,
        ..case(
            "custom-bad-multiple-providers",
            "custom-bad-multiple-providers-in.yaml",
            &[
                "custom-bad-multiple-providers-out1.yaml",
                "custom-bad-multiple-providers-out2.yaml",
            ],
        )
    },
    case(
        "custom-bad-invalid-config",
        "custom-simple-http-in.yaml",
        &["custom-bad-out.yaml"],
    ),
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
        custom_provider: true,
        ..case(
            "custom-both-http-tcp",
            "custom-both-http-tcp-in.yaml",
            &["custom-both-http-tcp-out1.yaml", "custom-both-http-tcp-out2.yaml"],
        )
    },
    Case {
        custom_provider: true,
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
    Builder::with_bundle(bundle, policies)
}

/// (enforced rules, shadow rules, shadow stat prefix, stat prefix) of one RBAC filter.
type Decided = (Option<Rbac>, Option<Rbac>, String, String);

fn http_rbac(f: &HttpFilter) -> Decided {
    assert_eq!(f.name, "envoy.filters.http.rbac");
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{}: no typed config", f.name)
    };
    let r = HttpRbac::decode(any.value.as_slice()).unwrap();
    (r.rules, r.shadow_rules, r.shadow_rules_stat_prefix, String::new())
}

fn network_rbac(f: &Filter) -> Decided {
    assert_eq!(f.name, "envoy.filters.network.rbac");
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{}: no typed config", f.name)
    };
    let r = NetworkRbac::decode(any.value.as_slice()).unwrap();
    (r.rules, r.shadow_rules, r.shadow_rules_stat_prefix, r.stat_prefix)
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
        return vec![format!("{case}: {} filters, Istio {}", ours.len(), istio.len())];
    }
    let mut out = Vec::new();
    for (i, (a, b)) in ours.iter().zip(istio).enumerate() {
        out.extend(differences(&format!("{case} filter {i} rules"), &a.0, &b.0));
        out.extend(differences(&format!("{case} filter {i} shadow rules"), &a.1, &b.1));
        if a.2 != b.2 || a.3 != b.3 {
            out.push(format!(
                "{case} filter {i}: stat prefixes {:?} vs Istio's {:?}",
                (&a.2, &a.3),
                (&b.2, &b.3)
            ));
        }
    }
    out
}

/// We fail closed on a CUSTOM policy: one DENY filter holding every rule of it.
fn check_fail_closed(case: &str, ours: &[Decided]) -> Vec<String> {
    match ours.first() {
        Some((Some(rules), None, _, _))
            if rules.action == xds_api::envoy::config::rbac::v3::rbac::Action::Deny as i32
                && !rules.policies.is_empty()
                && rules.policies.keys().all(|k| k.ends_with(BAD_CUSTOM_SUFFIX)) =>
        {
            Vec::new()
        }
        other => vec![format!("{case}: CUSTOM does not fail closed: {other:?}")],
    }
}

fn run(cases: &[Case], dir: &Path, for_tcp: bool) -> (usize, Vec<String>, Vec<String>) {
    let (mut same, mut custom, mut failures) = (0, Vec::new(), Vec::new());
    for c in cases {
        let b = builder(dir, c);
        let ours: Vec<Decided> = match (&b, for_tcp) {
            (None, _) => Vec::new(),
            (Some(b), false) => b.http_filters().iter().map(http_rbac).collect(),
            (Some(b), true) => b.network_filters().iter().map(network_rbac).collect(),
        };
        if c.custom_provider {
            let f = check_fail_closed(c.name, &ours);
            println!(
                "{}: CUSTOM provider (ext_authz) not built; fails closed: {}",
                c.name,
                f.is_empty()
            );
            custom.push(c.name.to_owned());
            failures.extend(f);
            continue;
        }
        let istio: Vec<Decided> = c
            .want
            .iter()
            .map(|w| {
                let doc = yaml_docs(&dir.join(w)).remove(0);
                if for_tcp {
                    network_rbac(&xds_api::json::json_to_message::<Filter>(&doc).unwrap_or_else(|e| panic!("{w}: {e}")))
                } else {
                    http_rbac(
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
    (same, custom, failures)
}

#[test]
fn http_filters_decide_as_istios_builder_goldens() {
    let dir = testdata().join("http");
    let (same, custom, failures) = run(HTTP_CASES, &dir, false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(same + custom.len(), HTTP_CASES.len());
    assert!(same >= 18, "only {same} HTTP cases compared");
}

#[test]
fn tcp_filters_decide_as_istios_builder_goldens() {
    let dir = testdata().join("tcp");
    let (same, custom, failures) = run(TCP_CASES, &dir, true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(same + custom.len(), TCP_CASES.len());
    assert!(same >= 5, "only {same} TCP cases compared");
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
