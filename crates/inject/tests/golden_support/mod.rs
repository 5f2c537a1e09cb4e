//! Helpers of the injection golden test: the corpus, a case's settings (Istio's `setFlags`,
//! `.iop.yaml`, mesh changes, feature flags), the workload-to-Pod conversion of Istio's
//! `objectToPod`, and the comparison as objects.

mod compare;

use std::collections::BTreeMap;
use std::path::PathBuf;

use inject::{InjectParams, InjectorConfig, MeshConfig, Outcome};
use serde_json::{Value as Json, json};

pub use compare::compare;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/istio");
const INJECT_DIR: &str = "pkg/kube/inject/testdata/inject";
const CHART_FILES: &str = "manifests/charts/istio-control/istio-discovery/files";
/// The chart's `istio-sidecar-injector` ConfigMap: template name and the file it holds.
const CHART_TEMPLATES: &[(&str, &str)] = &[
    ("sidecar", "injection-template.yaml"),
    ("gateway", "gateway-injection-template.yaml"),
    ("grpc-simple", "grpc-simple.yaml"),
    ("grpc-agent", "grpc-agent.yaml"),
    ("waypoint", "waypoint.yaml"),
    ("kube-gateway", "kube-gateway.yaml"),
    ("agentgateway", "agentgateway.yaml"),
];
const INSTALL: &str = "operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml";

#[derive(Debug, Clone)]
pub struct Case {
    pub input: String,
    pub want: String,
    flags: Vec<String>,
    iop: Option<String>,
    mesh: Option<String>,
    native: bool,
    openshift: bool,
    compliance: String,
    skip_webhook: Option<&'static str>,
    error: Option<String>,
}

impl Case {
    pub fn new(input: &str, want: &str) -> Case {
        Case {
            input: input.into(),
            want: want.into(),
            flags: Vec::new(),
            iop: None,
            mesh: None,
            native: true,
            openshift: false,
            compliance: String::new(),
            skip_webhook: None,
            error: None,
        }
    }
    pub fn flags(mut self, f: &[&str]) -> Case {
        self.flags = f.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn iop(mut self, f: &str) -> Case {
        self.iop = Some(f.into());
        self
    }
    pub fn mesh(mut self, m: &str) -> Case {
        self.mesh = Some(m.into());
        self
    }
    /// `ENABLE_NATIVE_SIDECARS` off (or a node older than 1.33).
    pub fn not_native(mut self) -> Case {
        self.native = false;
        self
    }
    /// Istio's webhook on OpenShift: namespaces are read for the proxy's UID range.
    pub fn openshift(mut self) -> Case {
        self.openshift = true;
        self
    }
    pub fn compliance(mut self, c: &str) -> Case {
        self.compliance = c.into();
        self
    }
    pub fn skip_webhook(mut self, why: &'static str) -> Case {
        self.skip_webhook = Some(why);
        self
    }
    pub fn error(mut self, e: &str) -> Case {
        self.error = Some(e.into());
        self
    }
    pub fn want_or_input(&self) -> String {
        if self.want.is_empty() {
            format!("{}.injected", self.input)
        } else {
            self.want.clone()
        }
    }
    pub fn label(&self) -> String {
        let mut l = if self.want.is_empty() {
            self.input.clone()
        } else {
            format!("{} -> {}", self.input, self.want)
        };
        if !self.native && !self.want.contains("old-version") {
            l.push_str(" (no native sidecars)");
        }
        l
    }
}

/// The corpus files the test reads.
pub struct Corpus {
    /// The install's ConfigMap keys as they are.
    pub install_config: String,
    pub install_values: String,
    config: Json,
    values: Json,
    mesh: String,
}

fn read(rel: &str) -> String {
    let path = PathBuf::from(CORPUS).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the injection goldens are read from ../shared/corpus/istio beside the repository)",
            path.display()
        )
    })
}

fn yaml_docs(text: &str) -> Vec<Json> {
    // Istio's test splits on "\n---" (yamlSeparator) and skips empty parts.
    text.split("\n---")
        .map(|d| d.trim_start_matches("---"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_saphyr::from_str::<Json>(d).unwrap_or_else(|e| panic!("not YAML: {e}\n{d}")))
        .filter(|d| !d.is_null())
        .collect()
}

impl Corpus {
    pub fn load() -> Corpus {
        let mut config = None;
        let mut values = None;
        let mut raw = (String::new(), String::new());
        let mut mesh = None;
        for doc in yaml_docs(&read(INSTALL)) {
            let name = doc.pointer("/metadata/name").and_then(Json::as_str);
            if doc["kind"] != "ConfigMap" {
                continue;
            }
            match name {
                Some("istio-sidecar-injector") => {
                    let c = doc.pointer("/data/config").and_then(Json::as_str).unwrap_or_default();
                    raw.0 = c.to_string();
                    config = Some(serde_saphyr::from_str::<Json>(c).unwrap_or_else(|e| panic!("injector config: {e}")));
                    let v = doc.pointer("/data/values").and_then(Json::as_str).unwrap_or_default();
                    raw.1 = v.to_string();
                    values = Some(serde_json::from_str::<Json>(v).unwrap_or_else(|e| panic!("injector values: {e}")));
                }
                Some("istio") => mesh = doc.pointer("/data/mesh").and_then(Json::as_str).map(str::to_string),
                _ => {}
            }
        }
        let (Some(config), Some(mut values), Some(mesh)) = (config, values, mesh) else {
            panic!("{INSTALL}: no istio-sidecar-injector or istio ConfigMap");
        };
        // Istio's test renders the chart itself (profile=empty), whose images are these.
        values["global"]["hub"] = json!("registry.istio.io/testing");
        values["global"]["tag"] = json!("latest");
        // ... and whose templates are the chart's files: the install golden was rendered from
        // another version of them (its sidecar template sets GOMAXPROCS; the goldens' do not).
        let mut config = config;
        for (name, file) in CHART_TEMPLATES {
            config["templates"][*name] = json!(read(&format!("{CHART_FILES}/{file}")));
        }
        Corpus {
            install_config: raw.0,
            install_values: raw.1,
            config,
            values,
            mesh,
        }
    }

    /// The inputs of the golden directory (not the `.iop.yaml` settings).
    pub fn inputs() -> Vec<String> {
        let dir = PathBuf::from(CORPUS).join(INJECT_DIR);
        let mut out: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (the injection goldens are read from ../shared/corpus/istio)",
                    dir.display()
                )
            })
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".yaml") && !n.ends_with(".iop.yaml"))
            .collect();
        out.sort();
        out
    }

    pub fn exists(name: &str) -> bool {
        PathBuf::from(CORPUS).join(INJECT_DIR).join(name).exists()
    }
}

/// A Helm `--set` value: bools and integers typed, the rest a string.
fn set_value(v: &str) -> Json {
    match v {
        "true" => json!(true),
        "false" => json!(false),
        _ => v.parse::<i64>().map(Json::from).unwrap_or_else(|_| json!(v)),
    }
}

fn set_path(values: &mut Json, path: &str, v: Json) {
    let mut cur = values;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        if !cur[*p].is_object() {
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
    cur[parts[parts.len() - 1]] = v;
}

/// Helm's merge of user values: maps merge, `null` removes the default.
fn merge_values(target: &mut Json, overlay: &Json) {
    match (target, overlay) {
        (Json::Object(t), Json::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    t.remove(k);
                } else if let Some(slot) = t.get_mut(k).filter(|s| s.is_object() && v.is_object()) {
                    merge_values(slot, v);
                } else {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
        (t, o) => *t = o.clone(),
    }
}

/// The config a case runs with: the install's, with the case's flags and IstioOperator values.
fn case_config(corpus: &Corpus, case: &Case) -> (InjectorConfig, MeshConfig) {
    let mut values = corpus.values.clone();
    let mut config = corpus.config.clone();
    for f in &case.flags {
        let (k, v) = f.split_once('=').unwrap_or((f, ""));
        match k {
            // the operator propagates component enablement (render/manifest.go)
            "components.cni.enabled" => set_path(&mut values, "pilot.cni.enabled", set_value(v)),
            // the chart takes the CNI provider from values.cni
            "values.cni.provider" => set_path(&mut values, "pilot.cni.provider", set_value(v)),
            k => set_path(&mut values, k.strip_prefix("values.").unwrap_or(k), set_value(v)),
        }
    }
    if let Some(iop) = &case.iop {
        let doc = serde_saphyr::from_str::<Json>(&read(&format!("{INJECT_DIR}/{iop}")))
            .unwrap_or_else(|e| panic!("{iop}: {e}"));
        let overlay = doc.pointer("/spec/values").cloned().unwrap_or(Json::Null);
        merge_values(&mut values, &overlay);
        // the chart puts sidecarInjectorWebhook.templates into the config's templates
        if let Some(Json::Object(t)) = overlay.pointer("/sidecarInjectorWebhook/templates") {
            for (name, text) in t {
                config["templates"][name] = text.clone();
            }
        }
    }
    let cfg = InjectorConfig::parse(&config.to_string(), &values.to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
    let mut mesh = MeshConfig::parse(&corpus.mesh).unwrap_or_else(|e| panic!("mesh: {e}"));
    if let Some(m) = &case.mesh {
        mesh = mesh.apply(m).unwrap_or_else(|e| panic!("{}: mesh: {e}", case.label()));
    }
    (cfg, mesh)
}

/// The workloads of a golden file that get a pod (Istio's `getInjectableYamlDocs`).
fn injectable(docs: Vec<Json>) -> Vec<Json> {
    let mut out = Vec::new();
    for d in docs {
        match d["kind"].as_str() {
            Some(
                "Deployment"
                | "DeploymentConfig"
                | "DaemonSet"
                | "StatefulSet"
                | "Job"
                | "ReplicaSet"
                | "ReplicationController"
                | "CronJob"
                | "Pod",
            ) => out.push(d),
            Some("List") => out.extend(injectable(d["items"].as_array().cloned().unwrap_or_default())),
            _ => {}
        }
    }
    out
}

fn owner(meta: &mut Json, name: &str, api_version: &str, kind: &str) {
    meta["generateName"] = json!(name);
    meta["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind, "name": name, "controller": true}]);
}

/// Istio's `objectToPod`: the pod a workload's controller would create.
fn object_to_pod(obj: &Json) -> Json {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let api = obj["apiVersion"].as_str().unwrap_or_default();
    let name = obj.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default();
    let template = |p: &str| obj.pointer(p).cloned().unwrap_or_else(|| json!({}));
    let (mut meta, spec) = match kind {
        "Pod" => return obj.clone(),
        "CronJob" => (
            template("/spec/jobTemplate/spec/template/metadata"),
            template("/spec/jobTemplate/spec/template/spec"),
        ),
        _ => (template("/spec/template/metadata"), template("/spec/template/spec")),
    };
    if !meta.is_object() {
        meta = json!({});
    }
    if kind == "Deployment" {
        owner(&mut meta, &format!("{name}-fake"), "apps/v1", "ReplicaSet");
        meta["generateName"] = json!(format!("{name}-fake-"));
        if !meta["labels"].is_object() {
            meta["labels"] = json!({});
        }
        meta["labels"]["pod-template-hash"] = json!("fake");
    } else {
        owner(&mut meta, name, api, kind);
    }
    json!({"metadata": meta, "spec": spec})
}

/// What a case gave when it did not differ.
pub enum Verdict {
    Pass,
    /// Istio's webhook test does not run it either (`skipWebhook`), with why.
    Skipped(&'static str),
}

/// Runs one case as Istio's webhook test does; `Err` is a one-line summary of the difference.
pub fn run_case(corpus: &Corpus, case: &Case) -> Result<Verdict, String> {
    let (cfg, mesh) = case_config(corpus, case);
    let inputs = injectable(yaml_docs(&read(&format!("{INJECT_DIR}/{}", case.input))));
    if let Some(why) = case.skip_webhook {
        return Ok(Verdict::Skipped(why));
    }
    let wants = if case.error.is_some() {
        Vec::new()
    } else {
        injectable(yaml_docs(&read(&format!("{INJECT_DIR}/{}", case.want))))
    };
    if case.error.is_none() && wants.len() != inputs.len() {
        return Err(format!("{} pods in, {} in the golden", inputs.len(), wants.len()));
    }
    let test_ns: BTreeMap<String, String> = [
        (
            "openshift.io/sa.scc.uid-range".to_string(),
            "1000620000/10000".to_string(),
        ),
        (
            "openshift.io/sa.scc.supplemental-groups".to_string(),
            "1000620000/10000".to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let no_annotations = BTreeMap::new();
    let env = BTreeMap::new();
    for (i, input) in inputs.iter().enumerate() {
        let pod = object_to_pod(input);
        let namespace = input
            .pointer("/metadata/namespace")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let pod_ns = pod
            .pointer("/metadata/namespace")
            .and_then(Json::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(namespace);
        let params = InjectParams {
            pod: &pod,
            namespace,
            namespace_labels: None,
            openshift_namespace_annotations: case.openshift.then_some(if pod_ns == "test-ns" {
                &test_ns
            } else {
                &no_annotations
            }),
            mesh: &mesh,
            revision: "default",
            path: "",
            native_sidecar: case.native,
            compliance_policy: &case.compliance,
            env: &env,
        };
        let outcome = inject::inject(&cfg, &params);
        if let Some(want_err) = &case.error {
            return match outcome {
                Err(e) if e.to_string().to_lowercase().contains(want_err) => Ok(Verdict::Pass),
                Err(e) => Err(format!("error {e:?} does not name {want_err:?}")),
                Ok(_) => Err(format!("injected, expected an error naming {want_err:?}")),
            };
        }
        let got = match outcome {
            Ok(Outcome::Injected { pod: injected, patch }) => {
                let mut patched = pod.clone();
                json_patch::patch(&mut patched, &patch).map_err(|e| format!("patch does not apply: {e}"))?;
                if patched != injected {
                    return Err("the patch does not give the injected pod".into());
                }
                patched
            }
            Ok(Outcome::Skipped(_)) => pod.clone(),
            Err(e) => return Err(format!("error: {e}")),
        };
        compare(&got, &object_to_pod(&wants[i]))
            .map_err(|d| if inputs.len() > 1 { format!("pod {i}: {d}") } else { d })?;
    }
    Ok(Verdict::Pass)
}
