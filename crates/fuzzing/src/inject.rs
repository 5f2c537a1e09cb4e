//! Target `inject_review`: one request body sent to the sidecar injector on 15017 (`/inject`),
//! answered as pilot-discovery answers it (`webhooks::admission::serve` with
//! `webhooks::injection::admit`, Istio's `serveInject` and `inject`), with a small injector
//! config that reads the Pod's annotations, labels and containers as Istio's templates do. Any
//! body gets an HTTP error of Istio's or an AdmissionReview; an allowed answer with a patch has a
//! base64 RFC 6902 patch that applies to the request's Pod.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use inject::{InjectorConfig, MeshConfig};
use serde_json::{Value, json};
use webhooks::admission::{self, AdmissionRequest};
use webhooks::injection::{self, Context};

const CONFIG: &str = r#"
policy: enabled
neverInjectSelector:
- matchExpressions: [{key: never, operator: Exists}]
injectedAnnotations:
  injected.example.com/by: fuzz
templates:
  sidecar: |
    metadata:
      labels:
        service.istio.io/canonical-name: {{ index .ObjectMeta.Labels `app` | default .DeploymentMeta.Name | quote }}
    spec:
      initContainers:
      - name: istio-init
        image: {{ .ProxyImage }}
        args: ["istio-iptables", "-p", "15001", "-b", "{{ annotation .ObjectMeta `traffic.sidecar.istio.io/includeInboundPorts` `*` }}"]
      containers:
      - name: istio-proxy
        image: "{{ annotation .ObjectMeta `sidecar.istio.io/proxyImage` .ProxyImage }}"
        args: ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.{{ .Values.global.proxy.clusterDomain }}"]
        env:
        - name: ISTIO_META_APP_CONTAINERS
          value: "{{ $containers := list }}{{ range $i, $c := .Spec.Containers }}{{ $containers = append $containers $c.Name }}{{ end }}{{ join "," $containers }}"
        - name: PROXY_CONFIG
          value: |
            {{ protoToJSON .ProxyConfig }}
        {{- if .Values.global.proxy.resources }}
        resources:
          {{ toYaml .Values.global.proxy.resources | indent 10 }}
        {{- end }}
"#;

const VALUES: &str = r#"{"global": {"hub": "hub.example", "tag": "1.0",
  "proxy": {"image": "proxyv2", "clusterDomain": "cluster.local", "resources": {"requests": {"cpu": "100m"}}}}}"#;

fn config() -> &'static InjectorConfig {
    static CONFIG_ONCE: OnceLock<InjectorConfig> = OnceLock::new();
    CONFIG_ONCE.get_or_init(|| {
        InjectorConfig::parse(CONFIG, VALUES).unwrap_or_else(|e| panic!("the target's injector config: {e}"))
    })
}

pub fn inject_review(data: &[u8]) {
    let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
    let ctx = Context {
        mesh: &mesh,
        revision: "default",
        path: "/inject/cluster/c1/net/n1",
        compliance_policy: "",
        env: &env,
    };
    let mut asked: Option<Value> = None;
    let admit = |r: &AdmissionRequest| {
        asked = r.object.clone();
        injection::admit(config(), r, &ctx, |_| false).0
    };
    match admission::serve(Some("application/json"), data, admit) {
        Ok(out) => {
            let answer: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("the answer is not JSON: {e}"));
            let response = &answer["response"];
            assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
            assert!(response["allowed"].is_boolean(), "{answer}");
            if let Some(patch) = response.get("patch") {
                use base64::Engine;
                assert_eq!(response["allowed"], true, "{answer}");
                assert_eq!(response["patchType"], "JSONPatch", "{answer}");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(patch.as_str().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("the patch is not base64: {e}"));
                let patch: json_patch::Patch =
                    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not a JSON patch: {e}"));
                let mut pod = asked
                    .clone()
                    .unwrap_or_else(|| panic!("a patch without a Pod: {answer}"));
                json_patch::patch(&mut pod, &patch).unwrap_or_else(|e| panic!("the patch does not apply: {e}"));
            }
        }
        Err(e) => assert!(matches!(e.status, 400 | 413 | 415), "{e:?}"),
    }
}

/// Reviews of Pods as the API server sends them: a Deployment's, one with annotations the
/// templates read, one opted out, one in a host network, v1beta1.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let review = |version: &str, pod: Value| {
        json!({
            "apiVersion": version, "kind": "AdmissionReview",
            "request": {
                "uid": "5e3c1f0a-7b2d-4c8e-9f6a-1b2c3d4e5f60",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "apps", "operation": "CREATE", "object": pod,
            }
        })
        .to_string()
        .into_bytes()
    };
    let pod = |meta: Value, spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec});
    let containers = json!([{"name": "web", "image": "nginx", "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}]);
    vec![
        review(
            "admission.k8s.io/v1",
            pod(
                json!({"generateName": "web-5d8f-", "labels": {"app": "web", "pod-template-hash": "5d8f"},
                    "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f", "controller": true}]}),
                json!({"containers": containers}),
            ),
        ),
        review(
            "admission.k8s.io/v1",
            pod(
                json!({"name": "annotated", "annotations": {
                    "traffic.sidecar.istio.io/includeInboundPorts": "8080",
                    "sidecar.istio.io/proxyImage": "other/proxy:2",
                    "proxy.istio.io/config": "{\"concurrency\": 2}",
                    "prometheus.io/scrape": "true", "prometheus.io/port": "9090"}}),
                json!({"containers": containers}),
            ),
        ),
        review(
            "admission.k8s.io/v1",
            pod(
                json!({"name": "off", "labels": {"sidecar.istio.io/inject": "false"}}),
                json!({"containers": containers}),
            ),
        ),
        review(
            "admission.k8s.io/v1beta1",
            pod(
                json!({"name": "host"}),
                json!({"hostNetwork": true, "containers": containers}),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    /// The seeds reach the templates: the Deployment's and the annotated Pod are injected.
    #[test]
    fn seeds_are_injected_or_skipped() {
        let answer = |seed: &[u8]| -> serde_json::Value {
            let out = super::admission::serve(Some("application/json"), seed, |r| {
                let (mesh, env) = (super::MeshConfig::default(), super::BTreeMap::new());
                let ctx = super::Context {
                    mesh: &mesh,
                    revision: "default",
                    path: "/inject",
                    compliance_policy: "",
                    env: &env,
                };
                super::injection::admit(super::config(), r, &ctx, |_| false).0
            })
            .unwrap_or_default();
            serde_json::from_slice(&out).unwrap_or_default()
        };
        let seeds = super::seeds();
        for (i, patched) in [(0, true), (1, true), (2, false), (3, false)] {
            let a = answer(&seeds[i]);
            assert_eq!(a["response"]["allowed"], true, "seed {i}: {a}");
            assert_eq!(a["response"].get("patch").is_some(), patched, "seed {i}: {a}");
        }
    }
}
