//! The client of one API server, as Istio's `pkg/kube` client: where its config comes from
//! (`--kubeconfig`, `KUBECONFIG`, in-cluster) and a connection checked by asking the version.

use std::time::Duration;

use kube::Client;

/// Where pilot-discovery finds its cluster, as the issue and Istio's flags say: `--kubeconfig`,
/// else `KUBECONFIG`, else the in-cluster service account. `None` when there is none of them.
pub async fn client_config(
    kubeconfig: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<kube::Config>, Error> {
    // An explicit --kubeconfig must exist; KUBECONFIG's files are skipped when missing, as
    // client-go's loading rules do (istiod's Deployment sets KUBECONFIG to an optional Secret's
    // mount, /var/run/secrets/remote/config, and runs in-cluster without it).
    let path = if !kubeconfig.is_empty() {
        Some(kubeconfig.to_owned())
    } else {
        let listed = env("KUBECONFIG").unwrap_or_default();
        let existing = listed
            .split(':')
            .find(|p| !p.is_empty() && std::path::Path::new(p).exists())
            .map(str::to_owned);
        if existing.is_none() && !listed.is_empty() {
            tracing::info!(KUBECONFIG = %listed, "KUBECONFIG names no existing file: using the in-cluster config if any");
        }
        existing
    };
    if let Some(path) = path {
        // KUBECONFIG may list several files; the first existing one is the one read here.
        let first = path.split(':').next().unwrap_or(&path).to_owned();
        let kc = kube::config::Kubeconfig::read_from(&first).map_err(|e| Error::Config {
            from: first.clone(),
            reason: e.to_string(),
        })?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Config {
                from: first,
                reason: e.to_string(),
            })?;
        return Ok(Some(cfg));
    }
    if env("KUBERNETES_SERVICE_HOST").is_some() {
        let cfg = kube::Config::incluster().map_err(|e| Error::Config {
            from: "in-cluster service account".into(),
            reason: e.to_string(),
        })?;
        return Ok(Some(cfg));
    }
    Ok(None)
}

/// A reason the cluster cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes client config from {from}: {reason}")]
    Config { from: String, reason: String },
    #[error("Kubernetes API server {address}: {reason}")]
    Unreachable { address: String, reason: String },
}

/// A client for `cfg`, checked by asking the server its version (within `timeout`).
pub async fn connect(cfg: kube::Config, timeout: Duration) -> Result<Client, Error> {
    let address = cfg.cluster_url.to_string();
    let client = Client::try_from(cfg).map_err(|e| Error::Unreachable {
        address: address.clone(),
        reason: e.to_string(),
    })?;
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(Error::Unreachable {
            address,
            reason: e.to_string(),
        }),
        Err(_) => Err(Error::Unreachable {
            address,
            reason: format!("no answer within {timeout:?}"),
        }),
    }
}

#[cfg(test)]
mod client_config_tests {
    use super::client_config;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"http://127.0.0.1:1\"}\n\
        contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\nusers:\n- name: u\n  user: {token: t}\n";

    #[tokio::test]
    async fn kubeconfig_files_as_client_go_loads_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, KUBECONFIG).unwrap();
        let missing = dir.path().join("absent").display().to_string();
        let no_env = |_: &str| None;
        // istiod's Deployment: KUBECONFIG names an optional Secret's mount that is absent, and
        // there is no in-cluster config here either: no cluster, not an error.
        let env = |k: &str| (k == "KUBECONFIG").then(|| missing.clone());
        assert!(client_config("", env).await.unwrap().is_none());
        // The first existing file of the list is read.
        let listed = format!("{missing}:{}", file.display());
        let env = |k: &str| (k == "KUBECONFIG").then(|| listed.clone());
        let cfg = client_config("", env).await.unwrap().unwrap();
        assert_eq!(cfg.cluster_url.to_string(), "http://127.0.0.1:1/");
        // An explicit --kubeconfig that is missing is an error naming it.
        let e = client_config(&missing, no_env).await.unwrap_err();
        assert!(e.to_string().contains(&missing), "{e}");
    }
}
