//! Istio's template-level webhook tests (`TestMultipleInjectionTemplates`, `TestStrategicMerge`
//! in `pkg/kube/inject/inject_test.go`): templates given inline, values `{}`, a webhook with no
//! mesh config (status port 0).

#[path = "golden_support/compare.rs"]
mod compare;

use std::collections::BTreeMap;

use compare::compare;
use inject::{InjectParams, InjectorConfig, MeshConfig, Outcome, inject};
use serde_json::Value as Json;

fn yaml(text: &str) -> Json {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn run(config: &str, input: &str, want: &str) {
    let cfg = InjectorConfig::parse(config, "{}").unwrap_or_else(|e| panic!("{e}"));
    let mesh = MeshConfig::parse("defaultConfig:\n  statusPort: 0\n").unwrap_or_else(|e| panic!("{e}"));
    let env = BTreeMap::new();
    let pod = yaml(input);
    let params = InjectParams {
        pod: &pod,
        namespace: "default",
        namespace_labels: None,
        openshift_namespace_annotations: None,
        mesh: &mesh,
        revision: "",
        path: "",
        native_sidecar: false,
        compliance_policy: "",
        env: &env,
    };
    let got = match inject(&cfg, &params) {
        Ok(Outcome::Injected { pod, .. }) => pod,
        other => panic!("{other:?}"),
    };
    // Istio compares the pods' metadata and spec
    let part = |p: &Json| serde_json::json!({"metadata": p["metadata"], "spec": p["spec"]});
    compare(&part(&got), &part(&yaml(want))).unwrap_or_else(|d| panic!("{d}"));
}

const TWO_TEMPLATES: &str = r#"
policy: enabled
aliases:
  both: [sidecar, init]
templates:
  sidecar: |
    spec:
      containers:
      - name: istio-proxy
        image: proxy
  init: |
    spec:
     initContainers:
     - name: istio-init
       image: proxy
"#;

fn hello(templates: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: hello
  annotations:
    inject.istio.io/templates: {templates}
spec:
  containers:
  - name: hello
    image: "fake.docker.io/google-samples/hello-go-gke:1.0"
"#
    )
}

fn expected(templates: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  annotations:
    inject.istio.io/templates: {templates}
    prometheus.io/path: /stats/prometheus
    prometheus.io/port: "0"
    prometheus.io/scrape: "true"
  name: hello
spec:
  initContainers:
  - name: istio-init
    image: proxy
  containers:
    - name: hello
      image: fake.docker.io/google-samples/hello-go-gke:1.0
    - name: istio-proxy
      image: proxy
"#
    )
}

#[test]
fn multiple_injection_templates_and_aliases() {
    run(TWO_TEMPLATES, &hello("sidecar,init"), &expected("sidecar,init"));
    run(TWO_TEMPLATES, &hello("both"), &expected("both"));
}

#[test]
fn strategic_merge_directives_in_templates() {
    let config = r#"
policy: enabled
templates:
  sidecar: |
    metadata:
      labels:
        $patch: replace
        foo: bar
    spec:
      containers:
      - name: injected
        image: "fake.docker.io/google-samples/hello-go-gke:1.1"
"#;
    let input = r#"
apiVersion: v1
kind: Pod
metadata:
  name: hello
  labels:
    key: value
spec:
  containers:
  - name: hello
    image: "fake.docker.io/google-samples/hello-go-gke:1.0"
"#;
    let want = r#"
metadata:
  annotations:
    prometheus.io/path: /stats/prometheus
    prometheus.io/port: "0"
    prometheus.io/scrape: "true"
  labels:
    foo: bar
  name: hello
spec:
  containers:
  - name: injected
    image: "fake.docker.io/google-samples/hello-go-gke:1.1"
  - name: hello
    image: "fake.docker.io/google-samples/hello-go-gke:1.0"
"#;
    run(config, input, want);
}
