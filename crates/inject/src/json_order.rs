//! JSON text with Go's field order, where the injected text is compared as a string: Go's
//! `encoding/json` writes struct fields in declaration order (`structToJSON` of a
//! `corev1.ContainerPort`), protojson in the `.proto`'s (`protoToJSON` of a ProxyConfig).

use serde_json::Value as Json;

/// `istio.mesh.v1alpha1.ProxyConfig`'s fields in declaration order (protojson's order).
pub(crate) const PROXY_CONFIG_ORDER: &[&str] = &[
    "configPath",
    "binaryPath",
    "serviceCluster",
    "tracingServiceName",
    "drainDuration",
    "parentShutdownDuration",
    "discoveryAddress",
    "discoveryRefreshDelay",
    "zipkinAddress",
    "statsdUdpAddress",
    "envoyMetricsServiceAddress",
    "proxyAdminPort",
    "availabilityZone",
    "controlPlaneAuthPolicy",
    "customConfigFile",
    "statNameLength",
    "concurrency",
    "proxyBootstrapTemplatePath",
    "interceptionMode",
    "tracing",
    "envoyAccessLogService",
    "envoyMetricsService",
    "proxyMetadata",
    "runtimeValues",
    "statusPort",
    "extraStatTags",
    "gatewayTopology",
    "terminationDrainDuration",
    "meshId",
    "readinessProbe",
    "proxyStatsMatcher",
    "holdApplicationUntilProxyStarts",
    "caCertificatesPem",
    "image",
    "privateKeyProvider",
    "proxyHeaders",
    "fileFlushInterval",
    "fileFlushMinSizeKb",
];

/// Kubernetes structs' fields in declaration order, for those whose JSON is compared as text.
const KUBE_ORDER: &[&str] = &["name", "hostPort", "containerPort", "protocol", "hostIP"];

/// `corev1.Container`'s fields (and those of its `securityContext`, `resources`) in declaration
/// order, for the `proxy.istio.io/overrides` annotation.
pub(crate) fn container_field_order(key: &str) -> Option<usize> {
    const ORDER: &[&str] = &[
        "containers",
        "initContainers",
        "name",
        "image",
        "command",
        "args",
        "workingDir",
        "ports",
        "envFrom",
        "env",
        "resources",
        "resizePolicy",
        "restartPolicy",
        "volumeMounts",
        "volumeDevices",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "imagePullPolicy",
        "securityContext",
        "stdin",
        "stdinOnce",
        "tty",
        "limits",
        "requests",
        "capabilities",
        "privileged",
        "seLinuxOptions",
        "windowsOptions",
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "readOnlyRootFilesystem",
        "allowPrivilegeEscalation",
        "procMount",
        "seccompProfile",
    ];
    ORDER.iter().position(|k| *k == key)
}

pub(crate) fn go_struct_order(key: &str) -> Option<usize> {
    KUBE_ORDER.iter().position(|k| *k == key)
}

/// Compact JSON whose object keys come in `order` (unknown keys after, sorted).
pub(crate) fn to_ordered_json(v: &Json, order: fn(&str) -> Option<usize>) -> String {
    let mut out = String::new();
    write(v, order, &mut out);
    out
}

fn write(v: &Json, order: fn(&str) -> Option<usize>, out: &mut String) {
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| (order(k).unwrap_or(usize::MAX), (*k).clone()));
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Json::String((*k).clone()).to_string());
                out.push(':');
                write(&m[*k], order, out);
            }
            out.push('}');
        }
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, order, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_port_in_go_order() {
        let p = json!({"protocol": "TCP", "containerPort": 8080, "name": "http"});
        assert_eq!(
            to_ordered_json(&p, go_struct_order),
            r#"{"name":"http","containerPort":8080,"protocol":"TCP"}"#
        );
    }
}
