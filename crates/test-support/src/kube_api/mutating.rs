//! Mutating admission, as the API server runs it before validating admission
//! (`k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`): the stored
//! MutatingWebhookConfigurations, by name, and their webhooks in order, each whose `rules`,
//! `namespaceSelector` and `objectSelector` match the request (`admission.rs`, as validating
//! webhooks) is called with the object as the previous webhooks left it. A denial fails the
//! request (`admission webhook "<name>" denied the request: <message>`); an allowed answer's
//! `patch` (`patchType: JSONPatch`, base64) is applied to the object; a webhook that cannot be
//! called fails the request under `failurePolicy: Fail` (the default) and is skipped under
//! `Ignore`; a patch that does not apply fails it (500). A `dryRun` request fails at a webhook
//! whose `sideEffects` is neither `None` nor `NoneOnDryRun`. `reinvocationPolicy` is not
//! honoured (no webhook is called twice).

use serde_json::Value;

use super::Shared;
use super::admission::{Request, call, configurations, matches};
use super::store::ApiError;

/// Runs the mutating webhooks that match `r`; the object they leave, or the API server's answer.
pub(crate) async fn mutate(s: &Shared, r: &Request<'_>) -> Result<Value, ApiError> {
    let (configs, ns_labels) = configurations(s, "mutatingwebhookconfigurations", r.namespace);
    let mut object = r.object.clone();
    for config in configs {
        for webhook in config.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
            let current = Request { object: &object, ..*r };
            if !matches(webhook, &current, &ns_labels) {
                continue;
            }
            let name = webhook.get("name").and_then(Value::as_str).unwrap_or_default();
            let side_effects = webhook.get("sideEffects").and_then(Value::as_str).unwrap_or("Unknown");
            if r.dry_run && !matches!(side_effects, "None" | "NoneOnDryRun") {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("admission webhook \"{name}\" has side effects and does not support dry run"),
                ));
            }
            let fail_open = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
            let response = match call(s, webhook, &current).await {
                Ok(response) => response,
                Err(_) if fail_open => continue,
                Err(e) => return Err(super::admission::call_failed(name, &e)),
            };
            if response.get("allowed") != Some(&Value::Bool(true)) {
                return Err(super::admission::denied(name, &response));
            }
            if let Some(patch) = response.get("patch").and_then(Value::as_str) {
                object = patched(object, patch, &response).map_err(|e| {
                    ApiError::new(
                        500,
                        "InternalError",
                        format!("Internal error occurred: admission webhook \"{name}\": {e}"),
                    )
                })?;
            }
        }
    }
    Ok(object)
}

fn patched(mut object: Value, patch: &str, response: &Value) -> Result<Value, String> {
    use base64::Engine;
    let patch_type = response.get("patchType").and_then(Value::as_str).unwrap_or_default();
    if patch_type != "JSONPatch" {
        return Err(format!("unsupported patch type {patch_type:?}"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).map_err(|e| format!("the patch is not a JSON patch: {e}"))?;
    json_patch::patch(&mut object, &patch).map_err(|e| format!("JSONPatch failed to apply: {e}"))?;
    Ok(object)
}
