//! The sidecar injector's verdict on one AdmissionRequest, as Istio's `(*Webhook).inject`
//! (`pkg/kube/inject/webhook.go`) gives it: a Pod the policy skips is allowed unchanged, an
//! injected one is allowed with the RFC 6902 patch (`patchType: JSONPatch`), and a Pod that
//! cannot be injected (not a Pod, bad annotations, a template that fails) is answered with
//! `toAdmissionResponse(err)`: not allowed, the error as the message. The webhook
//! configuration's `failurePolicy` has no say here: the API server refuses the Pod on a denied
//! review whatever the policy (the policy only covers a webhook that cannot be called).
//!
//! Pure: the server (pilot-discovery's `injection` module) passes the config and counts.

use std::collections::BTreeMap;

use inject::{InjectParams, InjectorConfig, MeshConfig, Outcome, SkipReason};
use serde_json::Value;

use crate::admission::{AdmissionRequest, AdmissionResponse};

/// What the injector knows besides the config and the request.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub mesh: &'a MeshConfig,
    /// istiod's revision (`REVISION`, `default` when empty).
    pub revision: &'a str,
    /// The request's URL path (`/inject/cluster/c1/net/n1`).
    pub path: &'a str,
    /// `COMPLIANCE_POLICY`, empty when unset.
    pub compliance_policy: &'a str,
    /// istiod's environment (the templates' `env` function).
    pub env: &'a BTreeMap<String, String>,
}

/// How a request went, for the metrics and the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Injected,
    Skipped(SkipReason),
    /// Denied with this message (Istio's `handleError`: counted as a failure).
    Failed(String),
}

/// Istio's `inject`: decides and, when required, injects the Pod of `request.object`.
/// `native_sidecar` says, for the Pod, whether the proxy runs as a native sidecar (Istio's
/// `DetectNativeSidecar`).
pub fn admit(
    cfg: &InjectorConfig,
    request: &AdmissionRequest,
    ctx: &Context<'_>,
    native_sidecar: impl FnOnce(&Value) -> bool,
) -> (AdmissionResponse, Verdict) {
    let fail = |message: String| (AdmissionResponse::denied(message.clone()), Verdict::Failed(message));
    let Some(pod) = request.object.as_ref() else {
        // Go's json.Unmarshal of an empty `object.raw`.
        return fail("unexpected end of JSON input".into());
    };
    let params = InjectParams {
        pod,
        namespace: &request.namespace,
        namespace_labels: None,
        openshift_namespace_annotations: None,
        mesh: ctx.mesh,
        revision: ctx.revision,
        path: ctx.path,
        native_sidecar: native_sidecar(pod),
        compliance_policy: ctx.compliance_policy,
        env: ctx.env,
    };
    match inject::inject(cfg, &params) {
        Ok(Outcome::Skipped(reason)) => (AdmissionResponse::allowed(), Verdict::Skipped(reason)),
        Ok(Outcome::Injected { patch, .. }) => match serde_json::to_vec(&patch) {
            Ok(bytes) => (AdmissionResponse::patched(&bytes), Verdict::Injected),
            Err(e) => fail(format!("encoding the patch: {e}")),
        },
        Err(e) => fail(e.to_string()),
    }
}

/// The name a Pod is logged by: `namespace/name`, or its `generateName` followed by `***` as
/// Istio's `potentialPodName`.
pub fn pod_name(request: &AdmissionRequest) -> String {
    let meta = request.object.as_ref().and_then(|o| o.get("metadata"));
    let text = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or_default();
    let namespace = match text("namespace") {
        "" => request.namespace.as_str(),
        ns => ns,
    };
    let name = match (text("name"), text("generateName")) {
        ("", "") => String::new(),
        ("", generate) => format!("{generate}***"),
        (name, _) => name.to_owned(),
    };
    crate::admission::bounded(&format!("{namespace}/{name}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CONFIG: &str = "policy: enabled\ntemplates:\n  sidecar: |\n    spec:\n      containers:\n      - name: istio-proxy\n        image: proxy\n  fails: |\n    {{ index .Spec.Containers 5 }}\n";

    fn request(object: Option<Value>) -> AdmissionRequest {
        AdmissionRequest {
            uid: "u".into(),
            namespace: "ns".into(),
            operation: "CREATE".into(),
            object,
            ..Default::default()
        }
    }

    fn run(object: Option<Value>) -> (AdmissionResponse, Verdict) {
        let cfg = InjectorConfig::parse(CONFIG, "{}").unwrap_or_else(|e| panic!("{e}"));
        let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
        let ctx = Context {
            mesh: &mesh,
            revision: "default",
            path: "/inject",
            compliance_policy: "",
            env: &env,
        };
        admit(&cfg, &request(object), &ctx, |_| false)
    }

    #[test]
    fn injected_pods_get_a_json_patch_that_adds_the_proxy() {
        use base64::Engine;
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "a"}]}});
        let (response, verdict) = run(Some(pod.clone()));
        assert_eq!(verdict, Verdict::Injected);
        assert!(response.allowed);
        assert_eq!(response.patch_type.as_deref(), Some("JSONPatch"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(response.patch.clone().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let mut patched = pod;
        json_patch::patch(&mut patched, &patch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(patched["spec"]["containers"][1]["name"], "istio-proxy");
        let wire = serde_json::to_value(&response).unwrap_or_default();
        assert_eq!(wire["patchType"], "JSONPatch");
    }

    #[test]
    fn skips_are_allowed_without_patch_and_failures_are_denied_naming_the_pod() {
        let off = json!({"metadata": {"name": "p", "labels": {"sidecar.istio.io/inject": "false"}}, "spec": {}});
        let (response, verdict) = run(Some(off));
        assert_eq!(verdict, Verdict::Skipped(SkipReason::Disabled));
        assert!(response.allowed && response.patch.is_none());

        let bad = json!({"metadata": {"name": "p", "annotations": {"inject.istio.io/templates": "fails"}}, "spec": {"containers": [{"name": "app"}]}});
        let (response, verdict) = run(Some(bad));
        assert!(!response.allowed);
        let message = response.result.map(|s| s.message).unwrap_or_default();
        assert!(message.contains("ns/p") && message.contains("fails"), "{message}");
        assert!(matches!(verdict, Verdict::Failed(_)));

        let (response, verdict) = run(None);
        assert!(!response.allowed);
        assert!(matches!(verdict, Verdict::Failed(_)));
        let (response, _) = run(Some(json!("not a pod")));
        assert!(!response.allowed);
    }

    #[test]
    fn null_fields_decode_as_go_decodes_them() {
        let r: Result<AdmissionRequest, _> =
            serde_json::from_value(json!({"uid": "u", "name": null, "namespace": null, "kind": null}));
        assert!(r.is_ok_and(|r| r.uid == "u" && r.name.is_empty()));
    }

    #[test]
    fn pods_are_named_as_istio_logs_them() {
        let r = request(Some(json!({"metadata": {"generateName": "web-5d8f-"}})));
        assert_eq!(pod_name(&r), "ns/web-5d8f-***");
        let r = request(Some(json!({"metadata": {"name": "p", "namespace": "other"}})));
        assert_eq!(pod_name(&r), "other/p");
    }
}
