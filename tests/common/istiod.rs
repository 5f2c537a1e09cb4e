//! A cluster with istiod installed as Istio installs it: the fake API server over HTTPS on a test
//! network's bridge, Istio's rendered default install
//! (`operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml` in
//! ../shared/corpus) applied with `kubectl`, and istiod's Pod, made from the install's Deployment
//! as its ReplicaSet makes it, run by the test kubelet ([`test_support::kubelet`]) exactly as
//! written in its own network namespace: pilot-discovery from the pilot image with the
//! container's args and env, its volumes, its service account's RBAC, user 1337 and a read-only
//! root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use serde_json::{Value, json};
use test_support::kube_api::{FakeApiOptions, FakeApiServer, kubectl};
use test_support::kubelet::Kubelet;
use test_support::netns::{Image, Network, Pod, tail};

/// Where Pods reach istiod (the `istiod` Service), and what its serving certificate names.
pub const ISTIOD_HOST: &str = "istiod.istio-system.svc";

/// Istio's rendered default install (fails, saying so, without ../shared).
pub fn corpus_install() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml",
    );
    assert!(
        path.exists(),
        "Istio's rendered install {} is needed: ../shared (the corpus) is missing",
        path.display()
    );
    path
}

/// The fake API server with Istio's install applied, and an admin kubeconfig for `kubectl`.
pub struct Cluster {
    pub api: FakeApiServer,
    pub work: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// The API server on `net`'s bridge (where Pods reach it), HTTPS; the `istio-system`
    /// Namespace and Istio's rendered install applied with `kubectl apply -f`.
    pub async fn install(net: &Network) -> anyhow::Result<Cluster> {
        let api = FakeApiServer::start_with(FakeApiOptions {
            ip: net.host_ip().into(),
            tls: true,
            ..FakeApiOptions::default()
        })
        .await?;
        let work = tempfile::tempdir()?;
        let kubeconfig = work.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
        let cluster = Cluster { api, work, kubeconfig };
        let install = corpus_install();
        cluster
            .kubectl(&["apply", "-f", &install.display().to_string()])
            .await?;
        Ok(cluster)
    }

    /// The kubelet of this cluster's one node, `node-1` on the host side of `net`, with `cpus`
    /// and 8 GiB, registered.
    pub fn kubelet<'a>(&'a self, net: &Network, cpus: u32) -> anyhow::Result<Kubelet<'a>> {
        let kubelet = Kubelet::new(
            &self.api,
            test_support::kubelet::Node {
                name: "node-1".into(),
                ip: net.host_ip().into(),
                cpus,
                memory: 8 << 30,
            },
        );
        kubelet.register()?;
        Ok(kubelet)
    }

    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubeconfig, args).await
    }

    /// `kubectl get <kind> <name> -n <namespace> -o json`.
    pub async fn get(&self, kind: &str, namespace: &str, name: &str) -> anyhow::Result<Value> {
        let out = self
            .kubectl(&["get", kind, name, "-n", namespace, "-o", "json"])
            .await?;
        Ok(serde_json::from_str(&out)?)
    }

    /// `kubectl apply -f` of `docs` (written to `<file>`, a `.yaml`, as one YAML stream of JSON
    /// documents).
    pub async fn apply(&self, file: &str, docs: &[Value]) -> anyhow::Result<String> {
        let path = self.work.path().join(file);
        // each document after `---`: a stream starting with `{` is read as one JSON object
        let stream: String = docs.iter().map(|d| format!("---\n{d}\n")).collect();
        std::fs::write(&path, stream)?;
        self.kubectl(&["apply", "-f", &path.display().to_string()]).await
    }

    /// `kubectl create -f` of a Pod; the Pod as the API server stored it (after admission).
    pub async fn create_pod(&self, pod: &Value) -> anyhow::Result<Value> {
        let name = pod["metadata"]["name"].as_str().context("the Pod has a name")?;
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let path = self.work.path().join(format!("pod-{namespace}-{name}.json"));
        std::fs::write(&path, pod.to_string())?;
        self.kubectl(&["create", "-f", &path.display().to_string()]).await?;
        self.get("pod", namespace, name).await
    }
}

/// istiod's Pod, running.
pub struct Istiod {
    pub pod: Pod,
    /// The Pod as stored (bound, with its status).
    pub stored: Value,
    /// How long from starting pilot-discovery until its readiness probe passed.
    pub ready_after: Duration,
    _image: Image,
}

impl Istiod {
    /// Makes istiod's Pod from the install's Deployment (as its ReplicaSet: the template, a
    /// generated name, the `pod-template-hash` label, the owner), runs it on `net` with
    /// `kubelet` and waits for its readiness probe. The `istiod` Service's port 443 (the
    /// webhooks' `clientConfig`) leads to the Pod's 15017.
    pub async fn start(cluster: &Cluster, net: &Network, kubelet: &Kubelet<'_>) -> anyhow::Result<Istiod> {
        let deployment = cluster.get("deployment", "istio-system", "istiod").await?;
        let template = &deployment["spec"]["template"];
        let mut labels = template["metadata"]["labels"].clone();
        labels["pod-template-hash"] = json!("5f9c7d8b4");
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "istiod-5f9c7d8b4-x2x7q", "namespace": "istio-system", "labels": labels,
                "annotations": template["metadata"]["annotations"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "istiod-5f9c7d8b4",
                    "uid": "4d6c1f0e-8a2b-4c3d-9e5f-6a7b8c9d0e1f", "controller": true}]},
            "spec": template["spec"]});
        // No webhook selects istiod's own Pod: stored as the ReplicaSet controller's create would be.
        let stored = cluster.api.apply(pod)?;
        let mut pod = net.pod("istiod", &[])?;
        cluster
            .api
            .route_service("istiod", "istio-system", (pod.ip, 15017).into());
        let stored = kubelet.bind(&stored, pod.ip)?;
        let image = Image::pilot()?;
        let volumes = kubelet.volumes(&stored, &pod.dir.path().join("volumes"))?;
        let container = kubelet.container(&stored, "discovery", &image, &volumes)?;
        pod.start_container(&container)?;
        let ready_after = kubelet
            .wait_probe(&stored, "discovery", "readinessProbe", Duration::from_secs(60), || {
                format!("istiod's log:\n{}", tail(&pod.log("discovery.log")))
            })
            .await?;
        let stored = kubelet.set_ready(&stored)?;
        Ok(Istiod {
            pod,
            stored,
            ready_after,
            _image: image,
        })
    }

    /// pilot-discovery's log.
    pub fn log(&self) -> String {
        self.pod.log("discovery.log")
    }

    /// The `/etc/hosts` line by which Pods reach istiod as [`ISTIOD_HOST`].
    pub fn hosts_line(&self) -> String {
        format!("{} {ISTIOD_HOST}", self.pod.ip)
    }

    /// The sum of the samples of `name` on istiod's monitoring port (15014), 0 when absent.
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let url = format!("http://{}:15014/metrics", self.pod.ip);
        let r = test_support::backend::http_get(&url, &[]).await?;
        if r.status != 200 {
            return Err(anyhow!("{url}: {}", r.status));
        }
        Ok(r.body
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}
