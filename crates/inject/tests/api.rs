//! The public API on small configs: what is skipped and why, what the path parameters set,
//! and that bad input (the Pod or a template) is an error naming the Pod, never a panic.

use std::collections::BTreeMap;

use inject::{ConfigError, Failure, InjectParams, InjectorConfig, MeshConfig, Outcome, SkipReason, inject};
use serde_json::{Value as Json, json};

const CONFIG: &str = r#"
policy: enabled
templates:
  sidecar: |
    metadata:
      labels:
        app-seen: {{ index .ObjectMeta.Labels "app" | default "none" | quote }}
    spec:
      containers:
      - name: istio-proxy
        image: {{ .ProxyImage }}
        env:
        - name: OWNER
          value: {{ .TypeMeta.Kind }}/{{ .DeploymentMeta.Name }}
  broken-yaml: |
    spec: [ {{ .Revision }}
  fails: |
    {{ index .Spec.Containers 5 }}
aliases:
  both: [sidecar, fails]
"#;

fn cfg() -> InjectorConfig {
    InjectorConfig::parse(CONFIG, r#"{"global": {"hub": "hub.example", "tag": "1.0"}}"#)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn params<'a>(pod: &'a Json, mesh: &'a MeshConfig, env: &'a BTreeMap<String, String>) -> InjectParams<'a> {
    InjectParams {
        pod,
        namespace: "ns",
        namespace_labels: None,
        openshift_namespace_annotations: None,
        mesh,
        revision: "default",
        path: "",
        native_sidecar: false,
        compliance_policy: "",
        env,
    }
}

fn pod() -> Json {
    json!({"metadata": {"name": "p", "labels": {"app": "a"}}, "spec": {"containers": [{"name": "app", "image": "x"}]}})
}

#[test]
fn injects_and_the_patch_gives_the_pod() {
    let (mesh, env, mut pod) = (MeshConfig::default(), BTreeMap::new(), pod());
    pod["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Update"}]);
    let out = inject(&cfg(), &params(&pod, &mesh, &env)).unwrap_or_else(|e| panic!("{e}"));
    let Outcome::Injected { pod: injected, patch } = out else {
        panic!("skipped: {out:?}")
    };
    assert_eq!(injected["metadata"]["labels"]["app-seen"], "a");
    let proxy = &injected["spec"]["containers"][1];
    assert_eq!(proxy["image"], "hub.example/proxyv2:1.0");
    assert_eq!(proxy["env"][0], json!({"name": "OWNER", "value": "Pod/p"}));
    // the request's namespace is not added to the pod
    assert!(injected["metadata"].get("namespace").is_none());
    let mut applied = pod.clone();
    json_patch::patch(&mut applied, &patch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(applied, injected);
    // managedFields are left alone
    assert!(
        !patch.0.iter().any(|op| format!("{op:?}").contains("managedFields")),
        "{patch:?}"
    );
    assert!(
        injected["metadata"]["annotations"]["sidecar.istio.io/status"]
            .as_str()
            .is_some_and(|s| s.contains("istio-proxy"))
    );
}

#[test]
fn skips_with_reasons() {
    let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
    let c = cfg();
    let host = json!({"metadata": {}, "spec": {"hostNetwork": true}});
    assert_eq!(
        inject(&c, &params(&host, &mesh, &env)),
        Ok(Outcome::Skipped(SkipReason::HostNetwork))
    );
    let mut p = params(&host, &mesh, &env);
    let plain = pod();
    p.pod = &plain;
    p.namespace = "kube-system";
    assert_eq!(
        inject(&c, &p),
        Ok(Outcome::Skipped(SkipReason::IgnoredNamespace("kube-system".into())))
    );
    let off = json!({"metadata": {"labels": {"sidecar.istio.io/inject": "false"}}, "spec": {}});
    assert_eq!(
        inject(&c, &params(&off, &mesh, &env)),
        Ok(Outcome::Skipped(SkipReason::Disabled))
    );
    // namespace labels given: the webhook's selectors decide first
    let labels: BTreeMap<String, String> = BTreeMap::new();
    let mut p = params(&plain, &mesh, &env);
    p.namespace_labels = Some(&labels);
    assert_eq!(inject(&c, &p), Ok(Outcome::Skipped(SkipReason::NotSelected)));
}

#[test]
fn path_parameters_set_cluster_and_network() {
    let (mesh, env, pod) = (MeshConfig::default(), BTreeMap::new(), pod());
    let mut p = params(&pod, &mesh, &env);
    p.path = "/inject/cluster/c1/net/n1";
    let Ok(Outcome::Injected { pod: injected, .. }) = inject(&cfg(), &p) else {
        panic!("not injected")
    };
    let env = &injected["spec"]["containers"][1]["env"];
    assert_eq!(env[1], json!({"name": "ISTIO_META_CLUSTER_ID", "value": "c1"}));
    assert_eq!(env[2], json!({"name": "ISTIO_META_NETWORK", "value": "n1"}));
    assert_eq!(injected["metadata"]["labels"]["topology.istio.io/network"], "n1");
}

fn failure(pod: &Json, annotations: Option<&str>) -> Failure {
    let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
    let mut pod = pod.clone();
    if let Some(t) = annotations {
        pod["metadata"]["annotations"] = json!({"inject.istio.io/templates": t});
    }
    match inject(&cfg(), &params(&pod, &mesh, &env)) {
        Err(e) => {
            assert!(e.to_string().contains("ns/p"), "{e}");
            e.reason
        }
        Ok(o) => panic!("injected: {o:?}"),
    }
}

#[test]
fn bad_templates_and_pods_are_errors_naming_the_pod() {
    assert!(matches!(failure(&pod(), Some("nope")), Failure::NoTemplate { ref name, .. } if name == "nope"));
    assert!(
        matches!(failure(&pod(), Some("broken-yaml")), Failure::RenderedYaml { ref name, .. } if name == "broken-yaml")
    );
    assert!(matches!(failure(&pod(), Some("both")), Failure::Template { ref name, .. } if name == "fails"));
    let mut bad = pod();
    bad["metadata"]["annotations"] = json!({"traffic.sidecar.istio.io/includeInboundPorts": "x"});
    assert!(matches!(failure(&bad, None), Failure::Annotations(ref m) if m.contains("includeInboundPorts")));
    let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
    for not_a_pod in [
        json!([1]),
        json!("x"),
        json!({"metadata": {}, "spec": [1]}),
        json!({"metadata": "m"}),
    ] {
        let r = inject(&cfg(), &params(&not_a_pod, &mesh, &env));
        assert!(
            matches!(r, Err(ref e) if matches!(e.reason, Failure::NotAPod(_))),
            "{r:?}"
        );
    }
}

#[test]
fn odd_pods_never_panic() {
    let (mesh, env) = (MeshConfig::default(), BTreeMap::new());
    let c = cfg();
    let odd = [
        json!({"metadata": {"labels": {"app": 1}, "annotations": {"sidecar.istio.io/status": "{bad"}}, "spec": {"containers": [1, "x", null]}}),
        json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{\"containers\":[\"app\"]}"}}, "spec": {"containers": {"a": 1}}}),
        json!({"metadata": {"annotations": {"proxy.istio.io/overrides": "[", "prometheus.io/port": "99999"}}, "spec": {}}),
        json!({"spec": {"containers": [{"name": "istio-proxy", "securityContext": 5, "readinessProbe": {"tcpSocket": {"port": "nope"}}}]}}),
        json!({}),
    ];
    for pod in odd {
        let _ = inject(&c, &params(&pod, &mesh, &env));
    }
}

#[test]
fn config_errors_name_the_template() {
    let bad = InjectorConfig::parse("templates:\n  sidecar: \"{{ undefinedFunc 1 }}\"\n", "{}");
    assert!(
        matches!(bad, Err(ConfigError::Template { ref name, .. }) if name == "sidecar"),
        "{bad:?}"
    );
}
