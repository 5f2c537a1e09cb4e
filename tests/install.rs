//! pilot-discovery installed as istiod: Istio's rendered default install
//! (`operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml` in
//! ../shared/corpus) applied with `kubectl` to the fake API server, as is and through the
//! project's kustomize overlay (deploy/kustomize), and istiod's Deployment run as written: its
//! container's args and env, its volumes' files, its service account's RBAC as the install binds
//! it, the in-cluster Kubernetes config, a read-only root file system and user 1337.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::Value;
use test_support::kube_api::{FakeApiServer, kubectl};

mod common;
use common::istiod::corpus_install;

fn project_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The install's objects as `kind/name` (kubectl's `-o name` spelling), sorted.
fn install_names(yaml: &str) -> Vec<String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    let mut names: Vec<String> = docs
        .iter()
        .filter(|d| d.is_object())
        .map(|d| {
            let kind = d["kind"].as_str().unwrap().to_lowercase();
            let group = d["apiVersion"].as_str().unwrap().rsplit_once('/').map(|(g, _)| g);
            let kind = match group {
                Some(g) => format!("{kind}.{g}"),
                None => kind,
            };
            format!("{kind}/{}", d["metadata"]["name"].as_str().unwrap())
        })
        .collect();
    names.sort();
    names
}

async fn applied_names(kubeconfig: &Path) -> Vec<String> {
    let out = kubectl(
        kubeconfig,
        &[
            "get",
            "serviceaccounts,configmaps,services,deployments.apps,horizontalpodautoscalers.autoscaling,\
             roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io",
            "-n",
            "istio-system",
            "-o",
            "name",
        ],
    )
    .await
    .unwrap();
    let cluster = kubectl(
        kubeconfig,
        &[
            "get",
            "clusterroles.rbac.authorization.k8s.io,clusterrolebindings.rbac.authorization.k8s.io,\
             mutatingwebhookconfigurations.admissionregistration.k8s.io,\
             validatingwebhookconfigurations.admissionregistration.k8s.io",
            "-o",
            "name",
        ],
    )
    .await
    .unwrap();
    let mut names: Vec<String> = out.lines().chain(cluster.lines()).map(str::to_owned).collect();
    names.sort();
    names
}

/// `kubectl apply -f` of Istio's rendered install creates every object in it, and applying it
/// again (kubectl's patch path) changes nothing.
#[tokio::test]
async fn kubectl_applies_istios_rendered_install() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let install = corpus_install();
    api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))
        .unwrap();
    let out = kubectl(&kubeconfig, &["apply", "-f", install.to_str().unwrap()])
        .await
        .unwrap();
    let expected = install_names(&std::fs::read_to_string(&install).unwrap());
    assert_eq!(applied_names(&kubeconfig).await, expected, "kubectl apply said:\n{out}");
    let again = kubectl(&kubeconfig, &["apply", "-f", install.to_str().unwrap()])
        .await
        .unwrap();
    assert!(
        again.lines().all(|l| l.ends_with(" unchanged")),
        "a second apply changes nothing:\n{again}"
    );
}

/// The ```sh blocks of README.md's section "Installing in place of istiod", in order.
fn readme_install_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(project_file("README.md")).unwrap();
    let section = readme
        .split_once("\n### Installing in place of istiod\n")
        .expect("README.md has the section \"Installing in place of istiod\"")
        .1;
    let section = section.split("\n#").next().unwrap_or_default();
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split_once("```").expect("a closed ```sh block").0.to_owned())
        .collect()
}

/// The README's kustomize example, run as written with bash: `istioctl manifest generate`
/// (here a stand-in that prints Istio's own recorded output of it for the default profile,
/// the corpus file) into `deploy/kustomize/istiod.yaml`, then `kubectl apply -k` to the fake API
/// server. The overlay changes the image of istiod's container and nothing else, and adds the
/// Namespace.
#[tokio::test]
async fn readme_kustomize_example_swaps_only_istiods_image() {
    let blocks = readme_install_blocks();
    assert_eq!(blocks.len(), 2, "the image and the kustomize examples: {blocks:?}");
    let work = tempfile::tempdir().unwrap();
    let overlay = work.path().join("deploy/kustomize");
    std::fs::create_dir_all(&overlay).unwrap();
    for file in ["kustomization.yaml", "namespace.yaml"] {
        std::fs::copy(project_file(&format!("deploy/kustomize/{file}")), overlay.join(file)).unwrap();
    }
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let istioctl = bin.join("istioctl");
    std::fs::write(
        &istioctl,
        format!(
            "#!/bin/sh\n[ \"$*\" = \"manifest generate --set profile=default\" ] || {{ echo \"unexpected: $*\" >&2; exit 2; }}\ncat '{}'\n",
            corpus_install().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&istioctl, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let api = FakeApiServer::start().await.unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &blocks[1]])
        .current_dir(work.path())
        .env("PATH", path)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the README's kustomize example failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let install = std::fs::read_to_string(corpus_install()).unwrap();
    let rendered = kubectl(&kubeconfig, &["kustomize", overlay.to_str().unwrap()])
        .await
        .unwrap();
    let mut before: Vec<Value> = serde_saphyr::from_multiple(&install).unwrap();
    before.retain(Value::is_object);
    let after: Vec<Value> = serde_saphyr::from_multiple(&rendered).unwrap();
    assert_eq!(
        after.len(),
        before.len() + 1,
        "every object of the install is kept, and the Namespace added"
    );
    assert!(
        after
            .iter()
            .any(|a| a["kind"] == "Namespace" && a["metadata"]["name"] == "istio-system")
    );
    let key = |d: &Value| format!("{}/{}", d["kind"], d["metadata"]["name"]);
    for mut b in before {
        let a = after
            .iter()
            .find(|a| key(a) == key(&b))
            .unwrap_or_else(|| panic!("{} is kept", key(&b)));
        if b["kind"] == "Deployment" {
            assert_eq!(
                a.pointer("/spec/template/spec/containers/0/image"),
                Some(&Value::from("pilot-discovery:dev"))
            );
            b["spec"]["template"]["spec"]["containers"][0]["image"] = "pilot-discovery:dev".into();
        }
        assert_eq!(a, &b, "{} is Istio's but for the image", key(&b));
    }
    let image = kubectl(
        &kubeconfig,
        &[
            "get",
            "deployment",
            "istiod",
            "-n",
            "istio-system",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
    )
    .await
    .unwrap();
    assert_eq!(image, "pilot-discovery:dev");
}

/// The README's image example, run as written: see [`docker::readme_image_example_builds`].
mod docker {
    use std::process::Command;

    /// `docker build` in the project's root gives an image laid out as Istio's pilot image
    /// (entrypoint `/usr/local/bin/pilot-discovery`, user 1337:1337) that runs
    /// `pilot-discovery version`, and one laid out as Istio's proxyv2 (pilot-agent, Envoy,
    /// iptables). It needs a Docker engine; `scripts/test.sh` skips it, saying
    /// so, where `docker info` fails.
    #[test]
    fn readme_image_example_builds() {
        let engine = Command::new("docker").arg("info").output();
        assert!(
            engine.is_ok_and(|o| o.status.success()),
            "the README's image example needs a Docker engine (`docker info` fails; scripts/test.sh skips this test on such machines)"
        );
        let blocks = super::readme_install_blocks();
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &blocks[0]])
            .current_dir(super::project_file(""))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the README's image example failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let inspect = Command::new("docker")
            .args([
                "image",
                "inspect",
                "pilot-discovery:dev",
                "--format",
                "{{.Config.User}} {{json .Config.Entrypoint}}",
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&inspect.stdout).trim(),
            "1337:1337 [\"/usr/local/bin/pilot-discovery\"]"
        );
        let version = Command::new("docker")
            .args(["run", "--rm", "pilot-discovery:dev", "version"])
            .output()
            .unwrap();
        assert!(version.status.success(), "{}", String::from_utf8_lossy(&version.stderr));
        let proxy = Command::new("docker")
            .args([
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                "pilot-proxyv2:dev",
                "-c",
                "/usr/local/bin/pilot-agent version && /usr/local/bin/envoy --version && iptables-restore --version",
            ])
            .output()
            .unwrap();
        assert!(proxy.status.success(), "{}", String::from_utf8_lossy(&proxy.stderr));
    }
}

/// istiod's Deployment, run as a Pod would run it: see [`netns::istiods_deployment_runs_as_written`].
mod netns {
    use std::time::{Duration, Instant};

    use test_support::netns::{Network, Pod, tail};

    use crate::common::istiod::{Cluster, Istiod};

    fn curl(pod: &Pod, url: &str) -> String {
        let out = pod
            .exec(&["curl", "-s", "-m", "2", "-o", "/dev/null", "-w", "%{http_code}", url])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// pilot-discovery with exactly the args and env of the Deployment in Istio's rendered
    /// default install, on its ports, with its volumes, under the RBAC the install binds to
    /// istiod's service account, talking to the cluster with the in-cluster config (KUBECONFIG
    /// names the absent optional Secret's file): it becomes ready on 8080, serves 15010, 15012,
    /// 15014 and 15017, is never refused by the API server, writes nothing outside its volumes,
    /// and does istiod's cluster work (the CA Secret, the root-cert ConfigMap, the validation
    /// webhook's caBundle and failurePolicy).
    #[tokio::test(flavor = "multi_thread")]
    async fn istiods_deployment_runs_as_written() {
        if let Err(why) = test_support::netns::supported() {
            panic!("this test runs istiod's Pod in a network namespace (root, `ip netns`, setpriv, curl): {why}");
        }
        let net = Network::create().unwrap();
        let cluster = Cluster::install(&net).await.unwrap();
        let kubelet = cluster.kubelet(&net, 2).unwrap();
        let istiod = Istiod::start(&cluster, &net, &kubelet).await.unwrap();
        let pod = &istiod.pod;
        let listening = String::from_utf8_lossy(&pod.exec(&["ss", "-Hltn"]).unwrap().stdout).into_owned();
        for port in [8080, 15010, 15012, 15014, 15017] {
            assert!(
                listening.contains(&format!(":{port} ")),
                "the Deployment's containerPort {port} is served:\n{listening}"
            );
        }
        assert_eq!(curl(pod, "http://127.0.0.1:15014/metrics"), "200");

        // istiod's cluster work, as its service account may do it
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = cluster
                .kubectl(&["get", "secret", "istio-ca-secret", "-n", "istio-system", "-o", "name"])
                .await
                .is_ok()
                && cluster
                    .kubectl(&[
                        "get",
                        "configmap",
                        "istio-ca-root-cert",
                        "-n",
                        "istio-system",
                        "-o",
                        "name",
                    ])
                    .await
                    .is_ok()
                && cluster
                    .kubectl(&[
                        "get",
                        "validatingwebhookconfiguration",
                        "istio-validator-istio-system",
                        "-o",
                        "jsonpath={.webhooks[0].failurePolicy}",
                    ])
                    .await
                    .is_ok_and(|p| p == "Fail");
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the CA Secret, the root-cert ConfigMap and the validation webhook's failurePolicy Fail within 30 s; \
                 refused requests: {:?}; its log:\n{}",
                cluster.api.forbidden(),
                tail(&istiod.log())
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let log = istiod.log();
        assert_eq!(
            cluster.api.forbidden(),
            Vec::<String>::new(),
            "istiod's RBAC allows all it asks; its log:\n{}",
            tail(&log)
        );
        assert!(
            !log.contains("Read-only file system") && !log.contains("os error 30"),
            "nothing is written outside the Pod's volumes:\n{}",
            tail(&log)
        );
        assert!(!log.contains("ERROR"), "no errors in its log:\n{}", tail(&log));
        assert!(!log.contains('\u{1b}'), "a container's log has no terminal colours");
    }
}
