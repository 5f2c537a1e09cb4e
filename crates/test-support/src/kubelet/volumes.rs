//! A Pod's volumes as files, as the kubelet's volume plugins write them under
//! `/var/lib/kubelet/pods/<uid>/volumes` (`pkg/volume/emptydir`, `configmap`, `secret`,
//! `downwardapi`, `projected`): emptyDirs (also a volume with no source, which the API server
//! defaults to one), ConfigMaps and Secrets of the Pod's namespace read from the API server (an
//! absent optional one is an empty directory, an absent required one an error: the kubelet waits),
//! downward API files, and projected service account tokens issued by the API server for the
//! Pod's service account. Without `automountServiceAccountToken: false` the Pod also gets the
//! `kube-api-access` volume that the API server's ServiceAccount admission plugin adds (the fake
//! API server does not), mounted at `/var/run/secrets/kubernetes.io/serviceaccount`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

use super::Kubelet;
use super::env::field_ref;

/// Where the ServiceAccount admission plugin mounts the API credentials.
pub const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access";

/// One volume mount of a container: the volume's directory on the host at `path` in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub path: String,
    pub read_only: bool,
}

/// A Pod's volumes, written under one directory.
#[derive(Debug)]
pub struct Volumes {
    /// Volume name → its directory.
    pub dirs: BTreeMap<String, PathBuf>,
    /// ConfigMap, Secret, downward API and projected volumes, which the kubelet mounts read-only.
    api_data: Vec<String>,
    automount: bool,
}

impl Volumes {
    /// The container's `volumeMounts` (and the service account's), in the order given.
    pub fn mounts(&self, container: &Value) -> anyhow::Result<Vec<Mount>> {
        let mut out = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = m["name"].as_str().unwrap_or_default();
            let dir = self
                .dirs
                .get(name)
                .ok_or_else(|| anyhow!("volumeMount {name}: the Pod has no such volume"))?;
            let host = match m["subPath"].as_str() {
                Some(sub) if !sub.is_empty() => dir.join(sub),
                _ => dir.clone(),
            };
            out.push(Mount {
                host,
                path: m["mountPath"].as_str().unwrap_or_default().to_owned(),
                read_only: m["readOnly"].as_bool().unwrap_or(false) || self.api_data.iter().any(|v| v == name),
            });
        }
        if self.automount && !out.iter().any(|m| m.path == SERVICE_ACCOUNT_PATH) {
            out.push(Mount {
                host: self.dirs[SERVICE_ACCOUNT_VOLUME].clone(),
                path: SERVICE_ACCOUNT_PATH.into(),
                read_only: true,
            });
        }
        Ok(out)
    }
}

impl Kubelet<'_> {
    /// Writes the volumes of the stored `pod` under `dir`.
    pub fn volumes(&self, pod: &Value, dir: &Path) -> anyhow::Result<Volumes> {
        let mut volumes: Vec<Value> = pod["spec"]["volumes"].as_array().cloned().unwrap_or_default();
        let automount = pod["spec"]["automountServiceAccountToken"].as_bool() != Some(false);
        if automount {
            volumes.push(self.service_account_volume(pod)?);
        }
        let mut out = Volumes {
            dirs: BTreeMap::new(),
            api_data: Vec::new(),
            automount,
        };
        for volume in &volumes {
            let name = volume["name"]
                .as_str()
                .ok_or_else(|| anyhow!("a volume without a name"))?;
            let path = dir.join(name);
            std::fs::create_dir_all(&path)?;
            let api_data = self
                .write_volume(pod, volume, &path)
                .with_context(|| format!("volume {name}"))?;
            let mode = if api_data { 0o755 } else { 0o777 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            if api_data {
                out.api_data.push(name.to_owned());
            }
            out.dirs.insert(name.to_owned(), path);
        }
        Ok(out)
    }

    /// The ServiceAccount admission plugin's `kube-api-access` volume, and the
    /// `kube-root-ca.crt` ConfigMap it reads (kube-controller-manager's root CA publisher).
    fn service_account_volume(&self, pod: &Value) -> anyhow::Result<Value> {
        let namespace = field_ref(pod, "metadata.namespace")?;
        if self
            .api
            .get("v1", "ConfigMap", &namespace, "kube-root-ca.crt")
            .is_none()
        {
            self.api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": namespace},
                "data": {"ca.crt": self.api.ca_pem().unwrap_or_default()}}))?;
        }
        Ok(json!({"name": SERVICE_ACCOUNT_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}}))
    }

    /// Writes one volume; true for the API data kinds, which are mounted read-only.
    fn write_volume(&self, pod: &Value, volume: &Value, dir: &Path) -> anyhow::Result<bool> {
        if volume.get("emptyDir").is_some() || is_sourceless(volume) {
            return Ok(false);
        }
        if let Some(cm) = volume.get("configMap") {
            self.config_map(pod, cm, dir)?;
        } else if let Some(secret) = volume.get("secret") {
            self.secret(pod, secret, secret["secretName"].as_str(), dir)?;
        } else if let Some(d) = volume.get("downwardAPI") {
            downward_api(pod, d, dir)?;
        } else if let Some(p) = volume.get("projected") {
            for source in p["sources"].as_array().into_iter().flatten() {
                if let Some(token) = source.get("serviceAccountToken") {
                    let path = token["path"].as_str().unwrap_or("token");
                    write(dir, path, self.token(pod, token["audience"].as_str())?.as_bytes())?;
                } else if let Some(cm) = source.get("configMap") {
                    self.config_map(pod, cm, dir)?;
                } else if let Some(secret) = source.get("secret") {
                    self.secret(pod, secret, secret["name"].as_str(), dir)?;
                } else if let Some(d) = source.get("downwardAPI") {
                    downward_api(pod, d, dir)?;
                } else {
                    bail!("the test's kubelet does not project {source}");
                }
            }
        } else {
            bail!("the test's kubelet does not mount {volume}");
        }
        Ok(true)
    }

    /// A token of the Pod's service account for `audience` (else the API server's own, which
    /// RBAC then restricts to what the stored bindings grant that service account).
    fn token(&self, pod: &Value, audience: Option<&str>) -> anyhow::Result<String> {
        let namespace = field_ref(pod, "metadata.namespace")?;
        let account = field_ref(pod, "spec.serviceAccountName")?;
        let name = field_ref(pod, "metadata.name")?;
        Ok(match audience {
            Some(aud) => self.api.issue_token(&namespace, &account, &name, &[aud]),
            None => {
                let token = self.api.issue_token(
                    &namespace,
                    &account,
                    &name,
                    &["https://kubernetes.default.svc.cluster.local"],
                );
                self.api.authorize_by_bindings(&token, &namespace, &account);
                token
            }
        })
    }

    fn config_map(&self, pod: &Value, source: &Value, dir: &Path) -> anyhow::Result<()> {
        let name = source["name"].as_str().unwrap_or_default();
        let namespace = field_ref(pod, "metadata.namespace")?;
        let Some(cm) = self.api.get("v1", "ConfigMap", &namespace, name) else {
            if source["optional"].as_bool() == Some(true) {
                return Ok(());
            }
            bail!("ConfigMap {namespace}/{name} not found (the kubelet waits for it)");
        };
        let data = cm["data"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().as_bytes().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        write_items(dir, source, data)
    }

    fn secret(&self, pod: &Value, source: &Value, name: Option<&str>, dir: &Path) -> anyhow::Result<()> {
        use base64::Engine;
        let name = name.unwrap_or_default();
        let namespace = field_ref(pod, "metadata.namespace")?;
        let Some(secret) = self.api.get("v1", "Secret", &namespace, name) else {
            if source["optional"].as_bool() == Some(true) {
                return Ok(());
            }
            bail!("Secret {namespace}/{name} not found (the kubelet waits for it)");
        };
        let mut data = BTreeMap::new();
        for (k, v) in secret["data"].as_object().into_iter().flatten() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .with_context(|| format!("Secret {namespace}/{name} key {k}"))?;
            data.insert(k.clone(), bytes);
        }
        write_items(dir, source, data)
    }
}

fn is_sourceless(volume: &Value) -> bool {
    volume.as_object().is_some_and(|m| m.keys().all(|k| k == "name"))
}

/// All keys as files, or only `items` (`key` → `path`).
fn write_items(dir: &Path, source: &Value, mut data: BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    match source["items"].as_array() {
        Some(items) => {
            for item in items {
                let key = item["key"].as_str().unwrap_or_default();
                let bytes = data.remove(key).ok_or_else(|| anyhow!("no key {key}"))?;
                write(dir, item["path"].as_str().unwrap_or(key), &bytes)?;
            }
        }
        None => {
            for (key, bytes) in data {
                write(dir, &key, &bytes)?;
            }
        }
    }
    Ok(())
}

fn downward_api(pod: &Value, source: &Value, dir: &Path) -> anyhow::Result<()> {
    for item in source["items"].as_array().into_iter().flatten() {
        let path = item["path"].as_str().unwrap_or_default();
        let field = item
            .pointer("/fieldRef/fieldPath")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("downward API item {path}: the test's kubelet writes fieldRefs only"))?;
        write(dir, path, field_ref(pod, field)?.as_bytes())?;
    }
    Ok(())
}

/// A file of an API data volume (`defaultMode` 0644).
fn write(dir: &Path, rel: &str, bytes: &[u8]) -> anyhow::Result<()> {
    if rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|c| c == "..") {
        bail!("item path {rel:?} is not a relative path inside the volume");
    }
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}
