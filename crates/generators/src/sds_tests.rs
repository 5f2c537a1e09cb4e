//! Who gets which credential: Istio's `SecretGen.Generate` and `filterAuthorizedResources`, each
//! refusal and each allowed case, through `generate` as a stream asks.

use serde_json::json;

use super::*;
use crate::PushCache;
use crate::testing::{destination_rule, gateway_proxy, ingress_gateway, proxy, push, service_entry};

fn b64(s: &str) -> String {
    STANDARD.encode(s)
}

fn secret_doc(name: &str, ns: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/tls", "data": data})
}

fn tls_secret(name: &str, ns: &str) -> Value {
    secret_doc(
        name,
        ns,
        json!({"tls.crt": b64(&format!("CERT {ns}/{name}")), "tls.key": b64(&format!("KEY {ns}/{name}")),
               "ca.crt": b64(&format!("CA {ns}/{name}"))}),
    )
}

fn identity(ns: &str, sa: &str) -> Option<VerifiedIdentity> {
    VerifiedIdentity::from_spiffe(&format!("spiffe://cluster.local/ns/{ns}/sa/{sa}"))
}

/// The ingress gateway of istio-system, proven to be `istio-system/istio-ingressgateway`.
fn verified_gateway() -> Proxy {
    let mut p = gateway_proxy();
    p.verified_identity = identity("istio-system", "istio-ingressgateway");
    p
}

/// Istio-system's gateway serving `https` (SIMPLE, `credentialName: gw-cert`) and `mtls`
/// (MUTUAL, `credentialNames: [rsa, ecdsa]`, clients checked with `caCertCredentialName:
/// client-roots`), with their Secrets and some the gateway does not use.
fn gateway_push() -> PushContext {
    push(vec![
        ingress_gateway(json!([
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "SIMPLE", "credentialName": "gw-cert"}},
            {"port": {"number": 8443, "name": "mtls", "protocol": "HTTPS"}, "hosts": ["b.example.com"],
             "tls": {"mode": "MUTUAL", "credentialNames": ["rsa", "ecdsa"], "caCertCredentialName": "client-roots"}}
        ])),
        tls_secret("gw-cert", "istio-system"),
        tls_secret("rsa", "istio-system"),
        tls_secret("ecdsa", "istio-system"),
        tls_secret("client-roots", "istio-system"),
        tls_secret("istio-ca-secret", "istio-system"),
        tls_secret("gw-cert", "default"),
    ])
}

/// The names served to `proxy` of those it asks, and the metrics of the generation.
fn ask(push: &PushContext, proxy: &Proxy, names: &[&str]) -> (Vec<String>, SdsMetrics) {
    let metrics = SdsMetrics::default();
    let cache = PushCache::with_sds_metrics(metrics.clone());
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let served = crate::generate(push, &cache, proxy, xds_api::type_url::SECRET, &names).unwrap();
    (served.into_iter().map(|r| r.name).collect(), metrics)
}

fn decoded(push: &PushContext, proxy: &Proxy, name: &str) -> Secret {
    let cache = PushCache::default();
    let served = crate::generate(push, &cache, proxy, xds_api::type_url::SECRET, &[name.to_owned()]).unwrap();
    assert_eq!(served.len(), 1, "{name} served");
    Secret::decode(served[0].resource.value.as_slice()).unwrap()
}

/// Istio's "proxy is not authorized to receive credentials": no verified identity (the plaintext
/// port), nothing at all, whatever the node says of its namespace.
#[test]
fn a_proxy_without_a_verified_identity_gets_no_credential() {
    let p = gateway_push();
    let (served, metrics) = ask(
        &p,
        &gateway_proxy(),
        &["kubernetes://gw-cert", "kubernetes://gw-cert-cacert"],
    );
    assert!(served.is_empty(), "{served:?}");
    assert_eq!(metrics.denied(Denial::Unauthenticated), 2);
    assert_eq!(metrics.certificate_errors(), 0);
}

/// The certificates and CAs the gateway's own servers use are served: `credentialName`, each
/// of `credentialNames`, `caCertCredentialName`.
#[test]
fn a_verified_gateway_gets_the_credentials_its_servers_use() {
    let p = gateway_push();
    let asked = [
        "kubernetes://gw-cert",
        "kubernetes://rsa",
        "kubernetes://ecdsa",
        "kubernetes://client-roots",
    ];
    let (served, metrics) = ask(&p, &verified_gateway(), &asked);
    assert_eq!(served, asked);
    assert_eq!(metrics.certificate_errors(), 0);
    match decoded(&p, &verified_gateway(), "kubernetes://gw-cert").r#type {
        Some(secret::Type::TlsCertificate(c)) => {
            assert_eq!(
                c.certificate_chain.unwrap().specifier,
                Some(data_source::Specifier::InlineBytes(
                    b"CERT istio-system/gw-cert".to_vec()
                ))
            );
            assert_eq!(
                c.private_key.unwrap().specifier,
                Some(data_source::Specifier::InlineBytes(
                    b"KEY istio-system/gw-cert".to_vec()
                ))
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Istio: "CA Certs are public information": any `-cacert` of the identity's namespace is
/// served, used by the proxy's config or not, from `ca.crt` of `<name>` (or a Secret
/// `<name>-cacert`).
#[test]
fn cas_of_the_identitys_namespace_are_served_to_it() {
    let p = push(vec![
        tls_secret("istio-ca-secret", "istio-system"),
        secret_doc("split-cacert", "istio-system", json!({"cacert": b64("CA split")})),
    ]);
    let (served, metrics) = ask(
        &p,
        &verified_gateway(),
        &["kubernetes://istio-ca-secret-cacert", "kubernetes://split-cacert"],
    );
    assert_eq!(
        served,
        ["kubernetes://istio-ca-secret-cacert", "kubernetes://split-cacert"]
    );
    assert_eq!(metrics.certificate_errors(), 0);
    match decoded(&p, &verified_gateway(), "kubernetes://split-cacert").r#type {
        Some(secret::Type::ValidationContext(v)) => assert_eq!(
            v.trusted_ca.unwrap().specifier,
            Some(data_source::Specifier::InlineBytes(b"CA split".to_vec()))
        ),
        other => panic!("{other:?}"),
    }
}

/// A certificate and key of the identity's own namespace that no server or rule of the proxy
/// uses (the CA's own key, say) is refused.
#[test]
fn a_certificate_the_proxys_config_does_not_use_is_refused() {
    let p = gateway_push();
    let (served, metrics) = ask(
        &p,
        &verified_gateway(),
        &["kubernetes://gw-cert", "kubernetes://istio-ca-secret"],
    );
    assert_eq!(served, ["kubernetes://gw-cert"]);
    assert_eq!(metrics.denied(Denial::Unreferenced), 1);
    assert_eq!(metrics.certificate_errors(), 1);
}

/// Another namespace's Secret is refused, CA or not; `kubernetes://<name>` is looked up in the
/// verified identity's namespace, not the one the node names.
#[test]
fn secrets_are_those_of_the_verified_identitys_namespace() {
    let p = gateway_push();
    let (served, metrics) = ask(
        &p,
        &verified_gateway(),
        &["kubernetes://default/gw-cert", "kubernetes://default/gw-cert-cacert"],
    );
    assert!(served.is_empty(), "{served:?}");
    assert_eq!(metrics.denied(Denial::Namespace), 2);

    // a node that says `default` but proved `istio-system` reads istio-system's Secrets
    let mut claims_default = proxy("router", "default", json!({"istio": "ingressgateway"}));
    claims_default.verified_identity = identity("istio-system", "istio-ingressgateway");
    let ca = decoded(&p, &claims_default, "kubernetes://gw-cert-cacert");
    match ca.r#type {
        Some(secret::Type::ValidationContext(v)) => assert_eq!(
            v.trusted_ca.unwrap().specifier,
            Some(data_source::Specifier::InlineBytes(b"CA istio-system/gw-cert".to_vec()))
        ),
        other => panic!("{other:?}"),
    }
    // and an explicit `<namespace>/` of its own is served like the short form
    let (served, _) = ask(&p, &verified_gateway(), &["kubernetes://istio-system/gw-cert-cacert"]);
    assert_eq!(served, ["kubernetes://istio-system/gw-cert-cacert"]);
}

/// Names that are not `kubernetes://`, and Secrets that do not exist or lack a key, are errors
/// (Istio's `pilot_sds_certificate_errors_total`), not refusals.
#[test]
fn unknown_kinds_and_missing_secrets_are_certificate_errors() {
    let p = push(vec![
        ingress_gateway(json!([
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "SIMPLE", "credentialName": "missing"}},
            {"port": {"number": 8443, "name": "https-2", "protocol": "HTTPS"}, "hosts": ["b.example.com"],
             "tls": {"mode": "SIMPLE", "credentialName": "keyless"}}
        ])),
        secret_doc("keyless", "istio-system", json!({"tls.crt": b64("CERT")})),
    ]);
    let (served, metrics) = ask(
        &p,
        &verified_gateway(),
        &[
            "kubernetes://missing",
            "kubernetes://keyless",
            "configmap://istio-system/roots",
            "kubernetes://",
        ],
    );
    assert!(served.is_empty(), "{served:?}");
    assert_eq!(metrics.certificate_errors(), 4);
    for reason in [Denial::Unauthenticated, Denial::Namespace, Denial::Unreferenced] {
        assert_eq!(metrics.denied(reason), 0, "{reason:?}");
    }
}

/// DestinationRule `credentialName` (TLS origination): the client certificate of a MUTUAL rule
/// goes to the gateway it applies to and to the sidecars its `workloadSelector` picks; a sidecar
/// the rule does not hand the credential to (no selector, as Istio) is refused it.
#[test]
fn destination_rule_credentials_go_to_the_proxies_the_rule_applies_to() {
    let entry = |host: &str| {
        service_entry(
            host,
            "istio-system",
            json!({"hosts": [format!("{host}.example.com")], "resolution": "DNS", "location": "MESH_EXTERNAL",
                   "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        )
    };
    let rule = |host: &str, selector: Option<Value>, credential: &str| {
        let mut spec = json!({"host": format!("{host}.example.com"),
            "trafficPolicy": {"tls": {"mode": "MUTUAL", "credentialName": credential}}});
        if let Some(s) = selector {
            spec["workloadSelector"] = json!({"matchLabels": s});
        }
        destination_rule(host, "istio-system", spec)
    };
    let p = push(vec![
        entry("api"),
        entry("egress-api"),
        rule("api", None, "client"),
        rule("egress-api", Some(json!({"app": "egress"})), "egress-client"),
        tls_secret("client", "istio-system"),
        tls_secret("egress-client", "istio-system"),
    ]);
    let (served, _) = ask(&p, &verified_gateway(), &["kubernetes://client"]);
    assert_eq!(served, ["kubernetes://client"], "the gateway originates with it");
    let (served, _) = ask(&p, &verified_gateway(), &["kubernetes://egress-client"]);
    assert!(served.is_empty(), "a rule selecting other workloads: {served:?}");

    let mut selected = proxy("sidecar", "istio-system", json!({"app": "egress"}));
    selected.verified_identity = identity("istio-system", "egress");
    let (served, _) = ask(&p, &selected, &["kubernetes://egress-client"]);
    assert_eq!(
        served,
        ["kubernetes://egress-client"],
        "the selected sidecar originates with it"
    );

    let mut other = proxy("sidecar", "istio-system", json!({"app": "other"}));
    other.verified_identity = identity("istio-system", "other");
    let (served, metrics) = ask(&p, &other, &["kubernetes://client", "kubernetes://egress-client"]);
    assert!(served.is_empty(), "{served:?}");
    assert_eq!(metrics.denied(Denial::Unreferenced), 2);
}

/// The SDS names of a CDS and LDS response: certificates and CAs of TLS contexts, on transport
/// sockets of clusters (and their matches) and of listener filter chains.
#[test]
fn references_are_the_sds_names_of_the_proxys_tls_contexts() {
    let p = gateway_push();
    let cache = PushCache::default();
    let gw = verified_gateway();
    let clusters = crate::generate(&p, &cache, &gw, xds_api::type_url::CLUSTER, &[]).unwrap();
    let listeners = crate::generate(&p, &cache, &gw, xds_api::type_url::LISTENER, &[]).unwrap();
    let refs: Vec<String> = references(&clusters, &listeners).into_iter().collect();
    assert_eq!(
        refs,
        [
            "kubernetes://client-roots",
            "kubernetes://ecdsa",
            "kubernetes://gw-cert",
            "kubernetes://rsa"
        ]
    );
}

#[test]
fn logged_names_are_bounded_and_escaped() {
    let names: Vec<String> = ["a\nforged line", "b", "c", "d"].map(String::from).to_vec();
    assert_eq!(at_most_n(&names, 3), r#""a\nforged line", "b", "c", and 1 more"#);
    assert_eq!(bounded(&"x".repeat(1000)).len(), 256);
    assert_eq!(resource_name("gw-cert"), "kubernetes://gw-cert");
    assert_eq!(resource_name("kubernetes://ns/gw-cert"), "kubernetes://ns/gw-cert");
}

/// Istio's names once `monitoring::render` drops OpenMetrics' `_total`:
/// `pilot_sds_denied{reason}` and `pilot_sds_certificate_errors_total`.
#[test]
fn metrics_are_registered_under_istios_names() {
    let mut registry = Registry::default();
    let metrics = SdsMetrics::register(&mut registry);
    let (served, _) = {
        let cache = PushCache::with_sds_metrics(metrics.clone());
        let names = ["kubernetes://gw-cert".to_owned(), "other://x".to_owned()];
        let p = gateway_push();
        let unauthenticated =
            crate::generate(&p, &cache, &gateway_proxy(), xds_api::type_url::SECRET, &names[..1]).unwrap();
        let errors = crate::generate(&p, &cache, &verified_gateway(), xds_api::type_url::SECRET, &names[1..]).unwrap();
        (unauthenticated.len() + errors.len(), ())
    };
    assert_eq!(served, 0);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("pilot_sds_denied_total{reason=\"unauthenticated\"} 1"),
        "{text}"
    );
    assert!(text.contains("pilot_sds_certificate_errors_total_total 1"), "{text}");
}
