//! The resources the fake API server serves: core Kubernetes kinds pilot-discovery watches
//! (with networking.k8s.io Ingress and IngressClass, and coordination.k8s.io Lease), and every CRD of Istio's
//! `crd-all.gen.yaml` (each in every version Istio serves, one storage for all versions).

/// One resource type: `/api/v1/<plural>` or `/apis/<group>/<version>/<plural>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// "" for the core group.
    pub group: &'static str,
    pub versions: &'static [&'static str],
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
}

impl ResourceType {
    /// `apiVersion` for `version`: `v1` or `<group>/<version>`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn preferred_version(&self) -> &'static str {
        self.versions[0]
    }
}

const ISTIO_NETWORKING: &[&str] = &["v1", "v1beta1", "v1alpha3"];
const ISTIO_SECURITY: &[&str] = &["v1", "v1beta1"];
const V1ALPHA1: &[&str] = &["v1alpha1"];

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group: "",
        versions: &["v1"],
        plural,
        singular,
        kind,
        namespaced,
        short_names: short,
    }
}

const fn istio(
    group: &'static str,
    versions: &'static [&'static str],
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
) -> ResourceType {
    ResourceType {
        group,
        versions,
        plural,
        singular,
        kind,
        namespaced: true,
        short_names: &[],
    }
}

const V1: &[&str] = &["v1"];
const RBAC: &str = "rbac.authorization.k8s.io";

const fn group_kind(
    group: &'static str,
    versions: &'static [&'static str],
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        versions,
        plural,
        singular,
        kind,
        namespaced,
        short_names: short,
    }
}

/// Every resource type known to the fake (whether "installed" is per server).
pub const RESOURCES: &[ResourceType] = &[
    core("namespaces", "namespace", "Namespace", false, &["ns"]),
    core("nodes", "node", "Node", false, &["no"]),
    core("pods", "pod", "Pod", true, &["po"]),
    core("services", "service", "Service", true, &["svc"]),
    core("endpoints", "endpoints", "Endpoints", true, &["ep"]),
    core("configmaps", "configmap", "ConfigMap", true, &["cm"]),
    core("serviceaccounts", "serviceaccount", "ServiceAccount", true, &["sa"]),
    core("secrets", "secret", "Secret", true, &[]),
    // create-only: answered from the server's known tokens (`FakeApiServer::add_token`)
    ResourceType {
        group: "authentication.k8s.io",
        versions: &["v1"],
        plural: "tokenreviews",
        singular: "tokenreview",
        kind: "TokenReview",
        namespaced: false,
        short_names: &[],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        versions: &["v1"],
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        short_names: &[],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        versions: &["v1"],
        plural: "mutatingwebhookconfigurations",
        singular: "mutatingwebhookconfiguration",
        kind: "MutatingWebhookConfiguration",
        namespaced: false,
        short_names: &[],
    },
    // an install's own objects (stored only: no controller acts on them); RBAC objects are
    // enforced for tokens of `FakeApiServer::authorize_by_bindings`
    group_kind("apps", V1, "deployments", "deployment", "Deployment", true, &["deploy"]),
    group_kind(
        "autoscaling",
        &["v2"],
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
    ),
    group_kind(
        "policy",
        V1,
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
    ),
    group_kind(RBAC, V1, "clusterroles", "clusterrole", "ClusterRole", false, &[]),
    group_kind(
        RBAC,
        V1,
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
    ),
    group_kind(RBAC, V1, "roles", "role", "Role", true, &[]),
    group_kind(RBAC, V1, "rolebindings", "rolebinding", "RoleBinding", true, &[]),
    // leader election locks (istiod's status and gateway controllers use Leases)
    group_kind("coordination.k8s.io", V1, "leases", "lease", "Lease", true, &[]),
    ResourceType {
        group: "discovery.k8s.io",
        versions: &["v1"],
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short_names: &[],
    },
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "virtualservices",
        "virtualservice",
        "VirtualService",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "destinationrules",
        "destinationrule",
        "DestinationRule",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "gateways",
        "gateway",
        "Gateway",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "serviceentries",
        "serviceentry",
        "ServiceEntry",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "workloadentries",
        "workloadentry",
        "WorkloadEntry",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "sidecars",
        "sidecar",
        "Sidecar",
    ),
    istio(
        "networking.istio.io",
        ISTIO_NETWORKING,
        "workloadgroups",
        "workloadgroup",
        "WorkloadGroup",
    ),
    istio(
        "networking.istio.io",
        &["v1alpha3"],
        "envoyfilters",
        "envoyfilter",
        "EnvoyFilter",
    ),
    istio(
        "networking.istio.io",
        &["v1beta1"],
        "proxyconfigs",
        "proxyconfig",
        "ProxyConfig",
    ),
    istio(
        "telemetry.istio.io",
        &["v1", "v1alpha1"],
        "telemetries",
        "telemetry",
        "Telemetry",
    ),
    istio(
        "extensions.istio.io",
        V1ALPHA1,
        "wasmplugins",
        "wasmplugin",
        "WasmPlugin",
    ),
    istio(
        "extensions.istio.io",
        V1ALPHA1,
        "trafficextensions",
        "trafficextension",
        "TrafficExtension",
    ),
    ResourceType {
        group: "networking.k8s.io",
        versions: &["v1"],
        plural: "ingresses",
        singular: "ingress",
        kind: "Ingress",
        namespaced: true,
        short_names: &["ing"],
    },
    ResourceType {
        group: "networking.k8s.io",
        versions: &["v1"],
        plural: "ingressclasses",
        singular: "ingressclass",
        kind: "IngressClass",
        namespaced: false,
        short_names: &[],
    },
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "authorizationpolicies",
        "authorizationpolicy",
        "AuthorizationPolicy",
    ),
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "peerauthentications",
        "peerauthentication",
        "PeerAuthentication",
    ),
    istio(
        "security.istio.io",
        ISTIO_SECURITY,
        "requestauthentications",
        "requestauthentication",
        "RequestAuthentication",
    ),
];

/// The resource type of `group`/`version`/`plural`, if the fake knows it.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural && r.versions.contains(&version))
}

/// The resource type of an object's `apiVersion` and `kind`.
pub(crate) fn of_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind && r.versions.contains(&version))
}
