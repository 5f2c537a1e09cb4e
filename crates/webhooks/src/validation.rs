//! The validating webhook, `/validate` (Istio's `pkg/webhooks/validation/server`): an Istio
//! object sent by the API server on CREATE or UPDATE is decoded and validated exactly as the same
//! object read from a file or the API server (`model::config::parse_config`), and denied with the
//! reason (naming the field) when it would be rejected there. Istio's answers and metric reasons:
//!
//! - another operation: allowed (`unsupported_operation`);
//! - an object that is not JSON with apiVersion/kind/metadata: "cannot decode configuration"
//!   (`yaml_decode_error`);
//! - a kind of an Istio group (`*.istio.io`) that Istio does not know: "unrecognized type"
//!   (`unknown_type`), as istiod; a kind of another group is not ours to judge and is allowed
//!   (the webhook configuration sends only Istio groups);
//! - a spec that does not decode: "error decoding configuration" (`crd_conversion_error`);
//! - an invalid one: "configuration is invalid" (`invalid_resource`);
//! - a top-level field other than apiVersion, kind, metadata, spec, status: "unknown field"
//!   (`invalid_resource`).
//!
//! Dry runs are answered the same, with " (dry run)" in the log, and are not counted as failures.

use model::ConfigKind;
use model::config::{ConfigError, parse_config};
use serde_json::Value;

use crate::admission::{AdmissionRequest, AdmissionResponse, bounded};

const VALID_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// Istio's `constants.AlwaysReject`: an object carrying it is always denied. The validation
/// controller dry-runs one to learn that the webhook answers before it makes it fail closed.
pub const ALWAYS_REJECT: &str = "internal.istio.io/webhook-always-reject";

/// What Istio counts of a review: `galley_validation_passed`, or `galley_validation_failed` with
/// the reason, labelled with the request's resource (e.g. `virtualservices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Count {
    Passed { resource: String },
    Failed { resource: String, reason: &'static str },
}

/// A review's answer and what to count of it (nothing for a failed dry run).
#[derive(Debug)]
pub struct Verdict {
    pub response: AdmissionResponse,
    pub count: Option<Count>,
}

/// One review's verdict.
pub fn validate(request: &AdmissionRequest) -> Verdict {
    let dry_run = request.dry_run == Some(true);
    let resource = &request.resource.resource;
    let failed = |reason: &'static str| {
        (!dry_run).then(|| Count::Failed {
            resource: resource.clone(),
            reason,
        })
    };
    let passed = || {
        Some(Count::Passed {
            resource: resource.clone(),
        })
    };
    let fail = |reason: &'static str, message: String| {
        tracing::info!(
            "validation webhook: {} {}/{} denied: {message}{}",
            bounded(&request.kind.kind),
            bounded(&request.namespace),
            bounded(&request.name),
            if dry_run { " (dry run)" } else { "" }
        );
        Verdict {
            response: AdmissionResponse::denied(message),
            count: failed(reason),
        }
    };
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") {
        tracing::warn!(
            "validation webhook: unsupported operation {:?}",
            bounded(&request.operation)
        );
        return Verdict {
            response: AdmissionResponse::allowed(),
            count: failed("unsupported_operation"),
        };
    }
    let Some(Value::Object(object)) = &request.object else {
        return fail(
            "yaml_decode_error",
            "cannot decode configuration: the object is not a JSON object".into(),
        );
    };
    let text = |f: &str| object.get(f).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    if api_version.is_empty() || kind.is_empty() {
        return fail(
            "yaml_decode_error",
            "cannot decode configuration: Object 'Kind' is missing or apiVersion is empty".into(),
        );
    }
    if ConfigKind::from_gvk(group, version, kind).is_none() && !group.ends_with(".istio.io") {
        return Verdict {
            response: AdmissionResponse::allowed(),
            count: passed(),
        };
    }
    // Istio's internal annotation: always rejected (istiod's readiness check sends it).
    if object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(ALWAYS_REJECT))
        .is_some()
    {
        return Verdict {
            response: AdmissionResponse::denied(format!(
                "configuration is invalid: {ALWAYS_REJECT:?} annotation found, rejecting"
            )),
            count: failed("invalid_resource"),
        };
    }
    // The namespace of a namespaced object created without one is the request's.
    let namespace = if request.namespace.is_empty() {
        "default"
    } else {
        &request.namespace
    };
    let outcome = parse_config(Value::Object(object.clone()), namespace);
    let gvk = || format!("{}/{}/{}", if group.is_empty() { "core" } else { group }, version, kind);
    match outcome {
        Ok(_) => {}
        Err(ConfigError::UnknownKind { .. }) => {
            return fail("unknown_type", format!("unrecognized type {}", bounded(&gvk())));
        }
        Err(ConfigError::NotAResource) => {
            return fail(
                "yaml_decode_error",
                "cannot decode configuration: not an object with apiVersion and kind".into(),
            );
        }
        Err(ConfigError::Decode { reason, .. }) => {
            return fail(
                "crd_conversion_error",
                format!("error decoding configuration: {reason}"),
            );
        }
        Err(ConfigError::Metadata { reason, .. }) => {
            return fail("invalid_resource", format!("configuration is invalid: {reason}"));
        }
        Err(ConfigError::Invalid { errors, .. }) => {
            return fail(
                "invalid_resource",
                format!("configuration is invalid: {}", errors.join("; ")),
            );
        }
    }
    if let Some(field) = object.keys().find(|k| !VALID_FIELDS.contains(&k.as_str())) {
        let name = object
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or(&request.name);
        return fail(
            "invalid_resource",
            format!(
                "unknown field {:?} on {} resource {}/{}",
                bounded(field),
                bounded(kind),
                bounded(&request.namespace),
                bounded(name)
            ),
        );
    }
    Verdict {
        response: AdmissionResponse::allowed(),
        count: passed(),
    }
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
