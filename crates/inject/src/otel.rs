//! Istio's `otelResourceAttributes` template function (`pkg/kube/inject/template.go`): the
//! `OTEL_RESOURCE_ATTRIBUTES` of a pod when an OpenTelemetry provider asks for the OTel
//! semantic conventions.

use crate::template::value::Value;

pub(crate) fn resource_attributes(mc: &Value, anns: &Value, labels: &Value, ns: &Value, containers: &Value) -> String {
    let enabled = match mc.field("ExtensionProviders") {
        Value::List(ps) => ps.iter().any(|p| {
            p.field("Opentelemetry").field("ServiceAttributeEnrichment").to_text() == "OTEL_SEMANTIC_CONVENTIONS"
        }),
        _ => false,
    };
    if !enabled {
        return String::new();
    }
    let get = |m: &Value, k: &str| match m.field(k) {
        Value::Str(s) if !s.is_empty() => Some(s),
        _ => None,
    };
    let ns = match ns {
        Value::Str(s) => s.clone(),
        _ => String::new(),
    };
    let containers: Vec<Value> = match containers {
        Value::List(l) => l.as_ref().clone(),
        _ => Vec::new(),
    };
    let mut attrs = Vec::new();
    if let Some(v) = get(anns, "resource.opentelemetry.io/service.namespace") {
        attrs.push(format!("service.namespace={v}"));
    } else if !ns.is_empty() {
        attrs.push(format!("service.namespace={ns}"));
    }
    if let Some(v) =
        get(anns, "resource.opentelemetry.io/service.version").or_else(|| get(labels, "app.kubernetes.io/version"))
    {
        attrs.push(format!("service.version={v}"));
    } else if let [only] = containers.as_slice() {
        let (tag, digest) = image_tag_digest(&only.field("Image").to_text());
        match (tag.is_empty(), digest.is_empty()) {
            (false, false) => attrs.push(format!("service.version={tag}@{digest}")),
            (true, false) => attrs.push(format!("service.version={digest}")),
            (false, true) => attrs.push(format!("service.version={tag}")),
            (true, true) => {}
        }
    }
    if let Some(v) = get(anns, "resource.opentelemetry.io/service.instance.id") {
        attrs.push(format!("service.instance.id={v}"));
    } else if let Some(first) = containers.first() {
        attrs.push(format!(
            "service.instance.id={ns}.$(POD_NAME).{}",
            first.field("Name").to_text()
        ));
    }
    attrs.join(",")
}

/// The tag and digest of an image reference (`[registry[:port]/]name[:tag][@digest]`).
fn image_tag_digest(image: &str) -> (String, String) {
    let (image, digest) = match image.split_once('@') {
        Some((i, d)) => (i, d.to_string()),
        None => (image, String::new()),
    };
    let slash = image.rfind('/');
    let tag = match image.rfind(':') {
        Some(c) if slash.is_none_or(|s| c > s) => image[c + 1..].to_string(),
        _ => String::new(),
    };
    (tag, digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        assert_eq!(
            image_tag_digest("registry:5000/nginx:1.21"),
            ("1.21".into(), String::new())
        );
        assert_eq!(
            image_tag_digest("nginx@sha256:abc"),
            (String::new(), "sha256:abc".into())
        );
        assert_eq!(image_tag_digest("registry:5000/nginx"), (String::new(), String::new()));
    }
}
