use serde_json::json;

use crate::validation::errors_of;

fn authz(spec: serde_json::Value) -> Vec<String> {
    errors_of("AuthorizationPolicy", spec)
}

fn has(errs: &[String], needle: &str) -> bool {
    errs.iter().any(|e| e.contains(needle))
}

#[test]
fn allow_nothing_deny_all_and_custom_need_rules_as_istio_says() {
    assert!(authz(json!({})).is_empty(), "ALLOW without rules: allow nothing");
    assert!(authz(json!({"action": "DENY", "rules": [{}]})).is_empty(), "deny all");
    assert!(has(&authz(json!({"action": "DENY"})), "DENY action without `rules`"));
    assert!(has(
        &authz(json!({"action": "CUSTOM"})),
        "CUSTOM action without `rules`"
    ));
    assert!(has(
        &authz(json!({"action": "CUSTOM", "rules": [{}]})),
        "`provider.name` must not be empty"
    ));
    assert!(has(
        &authz(json!({"action": "DENY", "provider": {"name": "x"}, "rules": [{}]})),
        "`provider` must not be with non CUSTOM action, found DENY"
    ));
    let custom = authz(json!({"action": "CUSTOM", "provider": {"name": "x"},
        "rules": [{"from": [{"source": {"principals": ["a"]}}], "when": [{"key": "request.auth.claims[x]", "values": ["y"]}]}]}));
    assert!(
        has(&custom, "From.Principals is currently not supported with CUSTOM action"),
        "{custom:?}"
    );
    assert!(
        has(&custom, "request.auth.claims[x] is currently not supported"),
        "{custom:?}"
    );
}

#[test]
fn empty_or_null_parts_of_a_rule_are_named() {
    assert!(has(
        &authz(json!({"rules": [null]})),
        "`rule` must not be nil, found at rule 0"
    ));
    assert!(has(
        &authz(json!({"rules": [{"from": []}]})),
        "`from` must not be empty"
    ));
    assert!(has(
        &authz(json!({"rules": [{"from": [{}]}]})),
        "`from.source` must not be nil"
    ));
    assert!(has(
        &authz(json!({"rules": [{"from": [{"source": {}}]}]})),
        "`from.source` must not be empty"
    ));
    assert!(has(
        &authz(json!({"rules": [{"to": [{"operation": {}}]}]})),
        "`to.operation` must not be empty"
    ));
    assert!(has(
        &authz(json!({"rules": [{"when": [{"key": "source.ip"}]}]})),
        "at least one of `values`"
    ));
}

#[test]
fn values_are_checked_by_attribute() {
    let bad = |src: serde_json::Value| authz(json!({"rules": [{"from": [{"source": src}]}]}));
    assert!(has(&bad(json!({"ipBlocks": ["10.0.0.0/33"]})), "bad CIDR range"));
    assert!(has(&bad(json!({"remoteIpBlocks": ["nope"]})), "bad IP address"));
    assert!(has(
        &bad(json!({"principals": [""]})),
        "empty value not allowed, found in Principals"
    ));
    assert!(has(&bad(json!({"serviceAccounts": ["a/b/c"]})), "expected format"));
    assert!(has(
        &bad(json!({"serviceAccounts": ["sa"], "namespaces": ["ns"]})),
        "cannot set serviceAccounts"
    ));
    assert!(has(
        &bad(json!({"trustDomains": ["a*b"]})),
        "wildcard is only allowed at the start or end"
    ));
    let op = |op: serde_json::Value| authz(json!({"rules": [{"to": [{"operation": op}]}]}));
    assert!(has(&op(json!({"ports": ["+80"]})), "bad port (+80)"));
    assert!(has(&op(json!({"ports": ["65536"]})), "bad port"));
    assert!(op(json!({"paths": ["/a/{*}/b", "/{**}/x"]})).is_empty());
    assert!(has(
        &op(json!({"paths": ["/{**}/{*}"]})),
        "{**} is not the last operator"
    ));
    assert!(has(
        &op(json!({"paths": ["/a{b}/{*}"]})),
        "beyond a supported path template"
    ));
    let when =
        |key: &str, values: serde_json::Value| authz(json!({"rules": [{"when": [{"key": key, "values": values}]}]}));
    assert!(when("request.headers[x-a]", json!(["v"])).is_empty());
    assert!(has(&when("request.headers[]", json!(["v"])), "should have format a[b]"));
    assert!(has(&when("destination.port", json!(["http"])), "bad port"));
    assert!(has(
        &when("destination.labels[app]", json!(["v"])),
        "replaced by the workload selector"
    ));
    assert!(has(&when("nope", json!(["v"])), "unknown attribute: nope"));
}

#[test]
fn scope_is_one_of_selector_or_target_refs() {
    let both = authz(json!({"selector": {"matchLabels": {"a": "b"}},
        "targetRef": {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}}));
    assert!(has(&both, "only one of targetRefs or selector can be set"));
    assert!(
        authz(json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}]}))
            .is_empty()
    );
    assert!(has(
        &authz(json!({"targetRef": {"kind": "Pod", "name": "p"}})),
        "targetRef must be to one of"
    ));
    let ra = errors_of(
        "RequestAuthentication",
        json!({"targetRef": {"kind": "GatewayClass", "group": "gateway.networking.k8s.io", "name": "x"}}),
    );
    assert!(has(&ra, "targetRef must be to one of"), "{ra:?}");
}

#[test]
fn dry_run_annotation_is_for_authorization_policies() {
    let meta = json!({"name": "p", "namespace": "ns", "annotations": {"istio.io/dry-run": "true"}});
    assert!(crate::validation::errors_with_meta("AuthorizationPolicy", meta, json!({})).is_empty());
}

#[test]
fn jwt_rules_as_istio() {
    let ra = |rule: serde_json::Value| errors_of("RequestAuthentication", json!({"jwtRules": [rule]}));
    assert!(ra(json!({"issuer": "i", "jwksUri": "https://example.com:8443/jwks"})).is_empty());
    assert!(has(
        &ra(json!({"audiences": ["a"]})),
        "issuer or jwksUri must be non-empty"
    ));
    assert!(has(
        &ra(json!({"issuer": "i", "jwksUri": "ftp://x/y"})),
        "URI scheme \"ftp\" is not supported"
    ));
    assert!(has(
        &ra(json!({"issuer": "i", "jwks": "{\"keys\": [{}]}"})),
        "jwks parse error"
    ));
    assert!(has(&ra(json!({"issuer": "i", "jwks": "nope"})), "jwks parse error"));
    assert!(has(
        &ra(json!({"issuer": "i", "outputClaimToHeaders": [{"claim": "c", "header": "a b"}]})),
        "is not a valid header name"
    ));
    assert_eq!(
        crate::validation::parse_jwks_uri("http://[::1]/k").unwrap(),
        (false, "::1".to_owned(), 80)
    );
}
