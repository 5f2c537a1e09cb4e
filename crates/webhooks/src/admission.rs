//! Kubernetes' AdmissionReview (`admission.k8s.io/v1` and `v1beta1`), the fields Istio's webhooks
//! read and write (`pkg/kube/adapter.go`), and reading one from an HTTP request as Istio's
//! `serve` does: at most `MaxRequestBodyBytes` (6 MiB), `Content-Type: application/json`, the
//! answer in the request's own apiVersion with the request's `uid`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Istio's `kube.MaxRequestBodyBytes`.
pub const MAX_REQUEST_BODY_BYTES: usize = 6 * 1024 * 1024;

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing)]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub kind: GroupVersionKind,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource: GroupVersionResource,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Go's `encoding/json` leaves a field as it is for a JSON `null`: the same here.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The request's `kind` (its group and version are not read).
#[derive(Debug, Default, Deserialize, Clone)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub kind: String,
}

/// The request's `resource`, the metrics' label (its group and version are not read).
#[derive(Debug, Default, Deserialize, Clone)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub resource: String,
}

#[derive(Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    /// Go's `Result *metav1.Status` is `status` on the wire.
    #[serde(rename = "status", skip_serializing_if = "Option::is_none")]
    pub result: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The mutating webhook's RFC 6902 patch, base64 on the wire as Go's `[]byte`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `JSONPatch` when `patch` is set.
    #[serde(rename = "patchType", skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
}

/// `metav1.Status`, as much of it as Istio fills.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Status {
    pub message: String,
}

impl AdmissionResponse {
    pub fn allowed() -> AdmissionResponse {
        AdmissionResponse {
            allowed: true,
            ..Default::default()
        }
    }

    /// Allowed with a JSON patch (`patchType: JSONPatch`), as Istio's injector answers.
    pub fn patched(json_patch: &[u8]) -> AdmissionResponse {
        use base64::Engine;
        AdmissionResponse {
            allowed: true,
            patch: Some(base64::engine::general_purpose::STANDARD.encode(json_patch)),
            patch_type: Some("JSONPatch".into()),
            ..Default::default()
        }
    }

    /// Istio's `toAdmissionResponse`: not allowed, with the error as the message.
    pub fn denied(message: impl Into<String>) -> AdmissionResponse {
        AdmissionResponse {
            result: Some(Status {
                message: message.into(),
            }),
            ..Default::default()
        }
    }
}

/// Why a request got no AdmissionReview back: an HTTP error, as Istio's `http.Error`.
#[derive(Debug, PartialEq)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

/// Checks the request as Istio's `serve` does, then answers the review `admit` makes of it:
/// an undecodable body is a denied review ("could not decode body: ..."), not an HTTP error.
pub fn serve(
    content_type: Option<&str>,
    body: &[u8],
    admit: impl FnOnce(&AdmissionRequest) -> AdmissionResponse,
) -> Result<Vec<u8>, HttpError> {
    if body.is_empty() {
        return Err(HttpError {
            status: 400,
            message: "no body found".into(),
        });
    }
    if body.len() > MAX_REQUEST_BODY_BYTES {
        return Err(HttpError {
            status: 413,
            message: format!("request entity too large: limit is {MAX_REQUEST_BODY_BYTES}"),
        });
    }
    if content_type != Some("application/json") {
        return Err(HttpError {
            status: 415,
            message: "invalid Content-Type, want `application/json`".into(),
        });
    }
    let review = match serde_json::from_slice::<AdmissionReview>(body) {
        Ok(r)
            if !matches!(
                r.api_version.as_str(),
                "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
            ) =>
        {
            Err(format!(
                "could not decode body: unsupported apiVersion {:?}",
                bounded(&r.api_version)
            ))
        }
        Ok(r) if r.kind != "AdmissionReview" => Err(format!(
            "could not decode body: kind {:?} is not AdmissionReview",
            bounded(&r.kind)
        )),
        Ok(r) => Ok(r),
        Err(e) => Err(format!("could not decode body: {e}")),
    };
    let answer = match review {
        Ok(review) => {
            let mut response = match &review.request {
                Some(request) => admit(request),
                None => AdmissionResponse::denied("could not decode object: the review has no request"),
            };
            response.uid = review.request.as_ref().map(|r| r.uid.clone()).unwrap_or_default();
            AdmissionReview {
                api_version: review.api_version,
                kind: review.kind,
                request: None,
                response: Some(response),
            }
        }
        // As Istio: a review without type meta, answered as admission.k8s.io/v1.
        Err(reason) => AdmissionReview {
            api_version: "admission.k8s.io/v1".into(),
            kind: "AdmissionReview".into(),
            request: None,
            response: Some(AdmissionResponse::denied(reason)),
        },
    };
    serde_json::to_vec(&answer).map_err(|e| HttpError {
        status: 500,
        message: format!("could encode response: {e}"),
    })
}

/// At most 100 characters of a value the caller sent, for messages.
pub fn bounded(s: &str) -> String {
    let mut out: String = s.chars().take(100).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}
