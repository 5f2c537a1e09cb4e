//! The kinds pilot-discovery reads from the API server as config, as Istio's config controller
//! does: every Istio kind of `manifests/charts/base/files/crd-all.gen.yaml` (served ones applied,
//! the others kept and reported as not yet supported), Secrets (gateway credentials), and
//! networking.k8s.io Ingress and IngressClass (turned into Gateways and VirtualServices by the
//! `ingress` crate). Each kind is read at the first of its versions the server serves.

use model::ConfigKind;

/// One kind read from the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigResource {
    pub kind: ConfigKind,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The versions, in preference order (Kubernetes' version priority: GA, beta, alpha).
    pub versions: &'static [&'static str],
    pub plural: &'static str,
}

const NETWORKING: &str = "networking.istio.io";
const NETWORKING_VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha3"];
const SECURITY: &str = "security.istio.io";
const SECURITY_VERSIONS: &[&str] = &["v1", "v1beta1"];
const EXTENSIONS: &str = "extensions.istio.io";
const KUBE_NETWORKING: &str = "networking.k8s.io";

const fn kind(
    kind: ConfigKind,
    group: &'static str,
    versions: &'static [&'static str],
    plural: &'static str,
) -> ConfigResource {
    ConfigResource {
        kind,
        group,
        versions,
        plural,
    }
}

/// Every kind read, in the order they are listed at start.
pub const CONFIG_KINDS: &[ConfigResource] = &[
    kind(
        ConfigKind::VirtualService,
        NETWORKING,
        NETWORKING_VERSIONS,
        "virtualservices",
    ),
    kind(
        ConfigKind::DestinationRule,
        NETWORKING,
        NETWORKING_VERSIONS,
        "destinationrules",
    ),
    kind(ConfigKind::Gateway, NETWORKING, NETWORKING_VERSIONS, "gateways"),
    kind(
        ConfigKind::ServiceEntry,
        NETWORKING,
        NETWORKING_VERSIONS,
        "serviceentries",
    ),
    kind(
        ConfigKind::WorkloadEntry,
        NETWORKING,
        NETWORKING_VERSIONS,
        "workloadentries",
    ),
    kind(
        ConfigKind::WorkloadGroup,
        NETWORKING,
        NETWORKING_VERSIONS,
        "workloadgroups",
    ),
    kind(ConfigKind::Sidecar, NETWORKING, NETWORKING_VERSIONS, "sidecars"),
    kind(ConfigKind::EnvoyFilter, NETWORKING, &["v1alpha3"], "envoyfilters"),
    kind(ConfigKind::ProxyConfig, NETWORKING, &["v1beta1"], "proxyconfigs"),
    kind(
        ConfigKind::PeerAuthentication,
        SECURITY,
        SECURITY_VERSIONS,
        "peerauthentications",
    ),
    kind(
        ConfigKind::AuthorizationPolicy,
        SECURITY,
        SECURITY_VERSIONS,
        "authorizationpolicies",
    ),
    kind(
        ConfigKind::RequestAuthentication,
        SECURITY,
        SECURITY_VERSIONS,
        "requestauthentications",
    ),
    kind(
        ConfigKind::Telemetry,
        "telemetry.istio.io",
        &["v1", "v1alpha1"],
        "telemetries",
    ),
    kind(ConfigKind::WasmPlugin, EXTENSIONS, &["v1alpha1"], "wasmplugins"),
    kind(
        ConfigKind::TrafficExtension,
        EXTENSIONS,
        &["v1alpha1"],
        "trafficextensions",
    ),
    kind(ConfigKind::Secret, "", &["v1"], "secrets"),
    kind(ConfigKind::Ingress, KUBE_NETWORKING, &["v1"], "ingresses"),
    kind(ConfigKind::IngressClass, KUBE_NETWORKING, &["v1"], "ingressclasses"),
];

/// `<group>/<first version>` of a kind read from the API server (`v1` for core kinds).
pub(crate) fn default_api_version(kind: ConfigKind) -> String {
    match CONFIG_KINDS.iter().find(|r| r.kind == kind) {
        Some(ConfigResource {
            group: "", versions, ..
        }) => versions.first().copied().unwrap_or("v1").to_owned(),
        Some(r) => format!("{}/{}", r.group, r.versions.first().copied().unwrap_or("v1")),
        None => format!("{NETWORKING}/v1"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// Kubernetes' version priority: GA before beta before alpha, higher numbers first.
    fn priority(v: &str) -> (u8, i64, i64) {
        let rest = v.trim_start_matches('v');
        let (major, stage, minor) = match rest.split_once("beta") {
            Some((m, n)) => (m, 1, n),
            None => match rest.split_once("alpha") {
                Some((m, n)) => (m, 0, n),
                None => (rest, 2, "0"),
            },
        };
        (stage, major.parse().unwrap_or(0), minor.parse().unwrap_or(0))
    }

    /// Every CRD of Istio's `crd-all.gen.yaml` (the corpus copy) is read, on its served versions
    /// in Kubernetes' priority order, and every served version decodes as its kind.
    #[test]
    fn every_kind_of_istio_crds_is_read() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/istio/crd-all.gen.yaml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "Istio's CRDs are missing: {} ({e}; the tests need ../shared beside the project)",
                path.display()
            )
        });
        let crds: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut seen = 0;
        for crd in crds.iter().filter(|c| c["kind"] == "CustomResourceDefinition") {
            let spec = &crd["spec"];
            let (group, kind_name, plural) = (
                spec["group"].as_str().unwrap_or_default(),
                spec["names"]["kind"].as_str().unwrap_or_default(),
                spec["names"]["plural"].as_str().unwrap_or_default(),
            );
            let mut served: Vec<&str> = spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["served"] == true)
                .filter_map(|v| v["name"].as_str())
                .collect();
            served.sort_by_key(|v| std::cmp::Reverse(priority(v)));
            let Some(r) = CONFIG_KINDS.iter().find(|r| r.group == group && r.plural == plural) else {
                panic!("{kind_name} ({plural}.{group}) is not read from the API server");
            };
            assert_eq!(r.kind.as_str(), kind_name, "{plural}.{group}");
            assert_eq!(
                r.versions,
                served.as_slice(),
                "{kind_name}: versions in preference order"
            );
            for v in &served {
                assert_eq!(
                    ConfigKind::from_gvk(group, v, kind_name),
                    Some(r.kind),
                    "{group}/{v} {kind_name}"
                );
            }
            seen += 1;
        }
        assert_eq!(
            seen,
            CONFIG_KINDS.iter().filter(|r| r.group.ends_with(".istio.io")).count(),
            "every Istio kind read is one of Istio's CRDs"
        );
    }

    #[test]
    fn version_priority_is_kubernetes_order() {
        let mut v = vec!["v1alpha1", "v1beta1", "v1", "v1alpha3", "v2"];
        v.sort_by_key(|v| std::cmp::Reverse(priority(v)));
        assert_eq!(v, ["v2", "v1", "v1beta1", "v1alpha3", "v1alpha1"]);
    }
}
