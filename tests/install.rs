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

fn corpus_install() -> PathBuf {
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
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};
    use test_support::kube_api::{FakeApiOptions, FakeApiServer, kubectl};
    use test_support::netns::{Network, Pod, tail};

    use super::corpus_install;

    /// The Pod's name and the node's CPUs, for the Deployment's `valueFrom` env.
    const POD_NAME: &str = "istiod-5f9c7d8b4-x2x7q";
    const NODE_CPUS: &str = "2";

    /// The container's env as the kubelet gives it: values, and `valueFrom` resolved for this Pod.
    fn container_env(container: &Value) -> Vec<(String, String)> {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_owned();
                if let Some(v) = e["value"].as_str() {
                    return (name, v.to_owned());
                }
                let value = match (
                    e.pointer("/valueFrom/fieldRef/fieldPath").and_then(Value::as_str),
                    e.pointer("/valueFrom/resourceFieldRef/resource")
                        .and_then(Value::as_str),
                ) {
                    (Some("metadata.name"), _) => POD_NAME,
                    (Some("metadata.namespace"), _) => "istio-system",
                    (Some("spec.serviceAccountName"), _) => "istiod",
                    // no limit set: the node's allocatable CPUs
                    (_, Some("limits.cpu")) => NODE_CPUS,
                    other => panic!("env {name}: the test does not resolve {other:?}"),
                };
                (name, value.to_owned())
            })
            .collect()
    }

    /// What the kubelet mounts under /var/run/secrets for istiod's Pod: the service account
    /// (`kubernetes.io/serviceaccount`), the projected `istio-token`, the `local-certs` emptyDir
    /// (`istio-dns`), and the optional Secrets and ConfigMap that do not exist in a fresh install,
    /// which are empty directories.
    fn secrets_volume(dir: &std::path::Path, api: &FakeApiServer) -> anyhow::Result<()> {
        let sa = dir.join("kubernetes.io/serviceaccount");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(sa.join("token"), "istiod-service-account-token")?;
        std::fs::write(sa.join("ca.crt"), api.ca_pem().unwrap_or_default())?;
        std::fs::write(sa.join("namespace"), "istio-system")?;
        std::fs::create_dir_all(dir.join("tokens"))?;
        std::fs::write(dir.join("tokens/istio-token"), "istiod-istio-ca-token")?;
        for empty in ["istio-dns", "remote", "istiod/tls", "istiod/ca"] {
            std::fs::create_dir_all(dir.join(empty))?;
        }
        // the emptyDir is writable by the container's user (fsGroup-less: world-writable here)
        std::fs::set_permissions(dir.join("istio-dns"), std::fs::Permissions::from_mode(0o777))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// In the Pod: a mount namespace whose root file system is read-only
    /// (`readOnlyRootFilesystem`), with `secrets` at /var/run/secrets, then the container's
    /// command as user and group 1337 (the image's `USER 1337:1337`) in `/`.
    const CONTAINER: &str = "set -e; secrets=$1; shift; \
        mount -t tmpfs tmpfs /run; mkdir -p /run/secrets; mount --bind \"$secrets\" /run/secrets; \
        mount -o remount,bind,ro /; cd /; \
        exec setpriv --reuid 1337 --regid 1337 --clear-groups \"$@\"";

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
        let api = FakeApiServer::start_with(FakeApiOptions {
            ip: net.host_ip().into(),
            tls: true,
            ..FakeApiOptions::default()
        })
        .await
        .unwrap();
        let work = tempfile::tempdir().unwrap();
        let admin = work.path().join("kubeconfig");
        api.write_kubeconfig(&admin).unwrap();
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))
            .unwrap();
        kubectl(&admin, &["apply", "-f", corpus_install().to_str().unwrap()])
            .await
            .unwrap();
        api.authorize_by_bindings("istiod-service-account-token", "istio-system", "istiod");
        api.add_token(
            "istiod-istio-ca-token",
            "system:serviceaccount:istio-system:istiod",
            &["istio-ca"],
        );
        let deployment: Value = serde_json::from_str(
            &kubectl(
                &admin,
                &["get", "deployment", "istiod", "-n", "istio-system", "-o", "json"],
            )
            .await
            .unwrap(),
        )
        .unwrap();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["name"], "discovery");
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let mut env = container_env(container);
        let addr = api.addr();
        env.push(("KUBERNETES_SERVICE_HOST".into(), addr.ip().to_string()));
        env.push(("KUBERNETES_SERVICE_PORT".into(), addr.port().to_string()));

        let secrets = work.path().join("secrets");
        secrets_volume(&secrets, &api).unwrap();
        let mut pod = net.pod("istiod", &[]).unwrap();
        api.route_service("istiod", "istio-system", (pod.ip, 15017).into());
        let binary = test_support::bin::cargo_bin("pilot-discovery", "pilot-discovery").unwrap();
        let mut command = vec![
            "unshare".to_owned(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            CONTAINER.into(),
            "sh".into(),
            secrets.display().to_string(),
            binary.display().to_string(),
        ];
        command.extend(args);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        // the container's environment is the image's and the Pod's, not the test's
        let mut full_env = vec![(
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        )];
        full_env.extend(env);
        pod.spawn_clean("istiod.log", &command, &full_env).unwrap();

        let deadline = Instant::now() + Duration::from_secs(60);
        while curl(&pod, "http://127.0.0.1:8080/ready") != "200" {
            assert!(
                Instant::now() < deadline,
                "istiod's readiness probe (:8080/ready) within 60 s; its log:\n{}",
                tail(&pod.log("istiod.log"))
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let listening = String::from_utf8_lossy(&pod.exec(&["ss", "-Hltn"]).unwrap().stdout).into_owned();
        for port in [8080, 15010, 15012, 15014, 15017] {
            assert!(
                listening.contains(&format!(":{port} ")),
                "the Deployment's containerPort {port} is served:\n{listening}"
            );
        }
        assert_eq!(curl(&pod, "http://127.0.0.1:15014/metrics"), "200");

        // istiod's cluster work, as its service account may do it
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = kubectl(
                &admin,
                &["get", "secret", "istio-ca-secret", "-n", "istio-system", "-o", "name"],
            )
            .await
            .is_ok()
                && kubectl(
                    &admin,
                    &[
                        "get",
                        "configmap",
                        "istio-ca-root-cert",
                        "-n",
                        "istio-system",
                        "-o",
                        "name",
                    ],
                )
                .await
                .is_ok()
                && kubectl(
                    &admin,
                    &[
                        "get",
                        "validatingwebhookconfiguration",
                        "istio-validator-istio-system",
                        "-o",
                        "jsonpath={.webhooks[0].failurePolicy}",
                    ],
                )
                .await
                .is_ok_and(|p| p == "Fail");
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the CA Secret, the root-cert ConfigMap and the validation webhook's failurePolicy Fail within 30 s; \
                 refused requests: {:?}; its log:\n{}",
                api.forbidden(),
                tail(&pod.log("istiod.log"))
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let log = pod.log("istiod.log");
        assert_eq!(
            api.forbidden(),
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
