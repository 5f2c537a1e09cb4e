//! Validating admission, as the API server runs it for every create and update: each
//! ValidatingWebhookConfiguration's webhooks whose `rules` (groups, versions, operations,
//! resources), `namespaceSelector` and `objectSelector` match the request are called with an
//! AdmissionReview v1 over HTTPS, verified with their `caBundle`; a denial fails the request
//! with `admission webhook "<name>" denied the request: <message>` (400), and a webhook that
//! cannot be called fails it (500) under `failurePolicy: Fail` and is skipped under `Ignore`.
//!
//! A webhook's `clientConfig.url` is called as written; a `clientConfig.service` is called at the
//! address a test routed it to ([`FakeApiServer::route_service`](super::FakeApiServer::route_service)),
//! as `https://<name>.<namespace>.svc:<port><path>`, so that the serving certificate is checked
//! for the service's DNS name as a cluster checks it. `dryRun=All` requests are admitted the same
//! and then not stored.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::http::labels;
use super::resources::{ResourceType, find};
use super::selector::Selector;
use super::store::{ApiError, res_index};
use super::{Shared, lock};

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// The request being admitted.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub rt: &'static ResourceType,
    pub version: &'a str,
    pub namespace: &'a str,
    pub operation: &'static str,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    pub dry_run: bool,
}

/// The API server's answer when webhook `name` denied the request with `response`.
pub(crate) fn denied(name: &str, response: &Value) -> ApiError {
    let message = response
        .pointer("/status/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let code = response.pointer("/status/code").and_then(Value::as_u64).unwrap_or(400);
    ApiError::new(
        u16::try_from(code).unwrap_or(400),
        "BadRequest",
        format!("admission webhook \"{name}\" denied the request: {message}"),
    )
}

/// The API server's answer when webhook `name` could not be called (and fails closed).
pub(crate) fn call_failed(name: &str, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("Internal error occurred: failed calling webhook \"{name}\": {e}"),
    )
}

/// Runs the validating webhooks that match `r`; `Err` is the API server's answer to the client.
pub(crate) async fn validate(s: &Shared, r: &Request<'_>) -> Result<(), ApiError> {
    let (configs, ns_labels) = configurations(s, "validatingwebhookconfigurations", r.namespace);
    for config in configs {
        for webhook in config.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
            if !matches(webhook, r, &ns_labels) {
                continue;
            }
            let name = webhook.get("name").and_then(Value::as_str).unwrap_or_default();
            let fail_open = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
            match call(s, webhook, r).await {
                Ok(response) if response.get("allowed") == Some(&Value::Bool(true)) => {}
                Ok(response) => return Err(denied(name, &response)),
                Err(_) if fail_open => {}
                Err(e) => return Err(call_failed(name, &e)),
            }
        }
    }
    Ok(())
}

/// The stored webhook configurations of `plural`, by name (the API server calls them in that
/// order), and the labels of the request's namespace.
pub(crate) fn configurations(
    s: &Shared,
    plural: &str,
    namespace: &str,
) -> (Vec<std::sync::Arc<Value>>, BTreeMap<String, String>) {
    let store = lock(&s.store);
    let list = |group: &str, plural: &str| {
        find(group, "v1", plural)
            .map(|rt| store.list(res_index(rt), None))
            .unwrap_or_default()
    };
    let mut configs = list("admissionregistration.k8s.io", plural);
    configs.sort_by(|a, b| {
        let name = |o: &Value| o.pointer("/metadata/name").and_then(Value::as_str).map(str::to_owned);
        name(a).cmp(&name(b))
    });
    let ns_labels = list("", "namespaces")
        .iter()
        .find(|n| n.pointer("/metadata/name").and_then(Value::as_str) == Some(namespace))
        .map(|n| labels(n))
        .unwrap_or_default();
    (configs, ns_labels)
}

pub(crate) fn matches(webhook: &Value, r: &Request<'_>, ns_labels: &BTreeMap<String, String>) -> bool {
    let has = |list: Option<&Value>, v: &str| {
        list.and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|x| x == "*" || x == v))
    };
    let rule = webhook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|rule| {
            has(rule.get("apiGroups"), r.rt.group)
                && has(rule.get("apiVersions"), r.version)
                && has(rule.get("operations"), r.operation)
                && has(rule.get("resources"), r.rt.plural)
        });
    let selected = |field: &str, labels: &BTreeMap<String, String>| {
        webhook
            .get(field)
            .map_or(Ok(Selector::default()), Selector::from_label_selector)
            .is_ok_and(|s| s.matches(labels))
    };
    let object_labels = labels(r.object);
    let ns_selected = !r.rt.namespaced || selected("namespaceSelector", ns_labels);
    rule && ns_selected && selected("objectSelector", &object_labels)
}

/// Calls one webhook; its `response`, or why it could not be called.
pub(crate) async fn call(s: &Shared, webhook: &Value, r: &Request<'_>) -> Result<Value, String> {
    let client_config = webhook.get("clientConfig").cloned().unwrap_or_default();
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(
        webhook.get("timeoutSeconds").and_then(Value::as_u64).unwrap_or(10),
    ));
    if let Some(bundle) = client_config.get("caBundle").and_then(Value::as_str) {
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| format!("caBundle is not base64: {e}"))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("caBundle: {e}"))? {
            client = client.add_root_certificate(cert);
        }
    }
    let url = match (client_config.get("url"), client_config.get("service")) {
        (Some(url), _) => url.as_str().unwrap_or_default().to_owned(),
        (None, Some(svc)) => {
            let text = |f: &str| svc.get(f).and_then(Value::as_str).unwrap_or_default().to_owned();
            let (name, namespace) = (text("name"), text("namespace"));
            let port = svc.get("port").and_then(Value::as_u64).unwrap_or(443);
            let host = format!("{name}.{namespace}.svc");
            let routed: Option<SocketAddr> = lock(&s.services).get(&(name.clone(), namespace.clone())).copied();
            let addr = routed.ok_or_else(|| format!("service \"{name}\" not found"))?;
            client = client.resolve(&host, addr);
            format!("https://{host}:{port}{}", text("path"))
        }
        (None, None) => return Err("clientConfig has neither url nor service".into()),
    };
    let client = client.build().map_err(|e| e.to_string())?;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{:012x}", NEXT_UID.fetch_add(1, Ordering::Relaxed)),
            "kind": {"group": r.rt.group, "version": r.version, "kind": r.rt.kind},
            "resource": {"group": r.rt.group, "version": r.version, "resource": r.rt.plural},
            "requestKind": {"group": r.rt.group, "version": r.version, "kind": r.rt.kind},
            "requestResource": {"group": r.rt.group, "version": r.version, "resource": r.rt.plural},
            // omitted (empty) for an object to be named from its generateName
            "name": r.object.pointer("/metadata/name").cloned().unwrap_or(json!("")),
            "namespace": r.namespace,
            "operation": r.operation,
            "userInfo": {"username": "kubernetes-admin"},
            "object": r.object,
            "oldObject": r.old,
            "dryRun": r.dry_run,
        }
    });
    let answer: Value = client
        .post(&url)
        .json(&review)
        .send()
        .await
        .map_err(|e| format!("Post \"{url}\": {}", error_chain(&e)))?
        .error_for_status()
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| format!("the answer is not an AdmissionReview: {e}"))?;
    let uid = &review["request"]["uid"];
    let response = answer
        .get("response")
        .cloned()
        .ok_or("the AdmissionReview has no response")?;
    if response.get("uid") != Some(uid) {
        return Err(format!("expected response.uid={uid}, got {:?}", response.get("uid")));
    }
    Ok(response)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
