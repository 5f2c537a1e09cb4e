//! istiod's self-signed CA on Kubernetes (Istio's `NewSelfSignedIstioCAOptions`,
//! security/pkg/pki/ca/ca.go): the root and its key live in the `istio-ca-secret` Secret of
//! istiod's namespace, so that every replica, and a restarted one, signs with the same root.
//!
//! As istiod: the Secret is read first; if it is absent a root is made and the Secret created;
//! if another replica created it in the meantime (409 AlreadyExists) the Secret is read again and
//! its root used, never overwritten. Other API errors are retried with backoff, as istiod does for
//! up to 20 minutes. A root this CA directory already held from an earlier start without the
//! cluster is published instead of a new one, so the workloads that trust it keep verifying.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use ca::{DirBundle, SelfSignedPem};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// Istio's `CASecret`.
pub const CA_SECRET: &str = "istio-ca-secret";
/// Istio's `istioCASecretType`.
const SECRET_TYPE: &str = "istio.io/ca-root";
/// istiod gives up after 20 minutes.
const GIVE_UP_AFTER: Duration = Duration::from_secs(20 * 60);

/// Where the shared root came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The Secret existed (another replica, or an earlier start, made it).
    Existing,
    /// This replica created the Secret with a new root.
    Created,
    /// This replica created the Secret with the root its CA directory held.
    Published,
}

/// The root every replica signs with: the Secret's, or one this call made and stored there.
pub async fn shared_root(
    client: kube::Client,
    namespace: &str,
    trust_domain: &str,
    local: &DirBundle,
    ttl: Duration,
) -> anyhow::Result<(SelfSignedPem, Origin)> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let started = std::time::Instant::now();
    let mut backoff = Duration::from_millis(200);
    loop {
        match attempt(&api, namespace, trust_domain, local, ttl).await {
            Ok(Some(found)) => return Ok(found),
            // Created by another replica meanwhile: read it again at once.
            Ok(None) => continue,
            Err(Retry::Fatal(e)) => return Err(e),
            Err(Retry::Later(e)) if started.elapsed() < GIVE_UP_AFTER => {
                tracing::warn!("the mesh CA's root in Secret {namespace}/{CA_SECRET}: {e:#}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(Retry::Later(e)) => return Err(e.context(format!("gave up after {GIVE_UP_AFTER:?}"))),
        }
    }
}

enum Retry {
    Later(anyhow::Error),
    Fatal(anyhow::Error),
}

/// One read (and create when absent); `Ok(None)` when another replica won the create.
async fn attempt(
    api: &Api<Secret>,
    namespace: &str,
    trust_domain: &str,
    local: &DirBundle,
    ttl: Duration,
) -> Result<Option<(SelfSignedPem, Origin)>, Retry> {
    match api.get(CA_SECRET).await {
        Ok(secret) => {
            let root = from_secret(&secret)
                .with_context(|| format!("Secret {namespace}/{CA_SECRET} (istiod's self-signed root)"))
                .map_err(Retry::Fatal)?;
            tracing::info!("the mesh CA signs with the root of Secret {namespace}/{CA_SECRET}");
            return Ok(Some((root, Origin::Existing)));
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Retry::Later(anyhow::Error::new(e).context("reading it"))),
    }
    let (root, origin) = match local {
        DirBundle::SelfSigned(root) => (root.clone(), Origin::Published),
        _ => (
            SelfSignedPem::generate(trust_domain, ttl).map_err(|e| Retry::Fatal(e.into()))?,
            Origin::Created,
        ),
    };
    match api.create(&PostParams::default(), &to_secret(namespace, &root)).await {
        Ok(_) => {
            tracing::info!(
                ?origin,
                "Secret {namespace}/{CA_SECRET} not found: created it with the mesh CA's root"
            );
            Ok(Some((root, origin)))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!("Secret {namespace}/{CA_SECRET} was created by another replica: using its root");
            Ok(None)
        }
        Err(e) => Err(Retry::Later(anyhow::Error::new(e).context("creating it"))),
    }
}

/// Istio's `BuildSecret(CASecret, ..., caCert, caCert, caKey)`: `ca-cert.pem`, `ca-key.pem`,
/// `root-cert.pem`, and empty `cert-chain.pem` and `key.pem`.
fn to_secret(namespace: &str, root: &SelfSignedPem) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let data = BTreeMap::from([
        ("cert-chain.pem".to_owned(), bytes("")),
        ("key.pem".to_owned(), bytes("")),
        ("root-cert.pem".to_owned(), bytes(&root.cert_pem)),
        ("ca-cert.pem".to_owned(), bytes(&root.cert_pem)),
        ("ca-key.pem".to_owned(), bytes(&root.key_pem)),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

fn from_secret(secret: &Secret) -> anyhow::Result<SelfSignedPem> {
    let data = secret.data.as_ref();
    let field = |k: &str| -> anyhow::Result<String> {
        let Some(v) = data.and_then(|d| d.get(k)) else {
            bail!("it has no {k}");
        };
        String::from_utf8(v.0.clone()).with_context(|| format!("its {k} is not PEM text"))
    };
    Ok(SelfSignedPem {
        cert_pem: field("ca-cert.pem")?,
        key_pem: field("ca-key.pem")?,
    })
}

/// Keeps `dir` (when writable) holding the shared root, for clients on this machine and for a
/// start without the cluster; in a Pod the directory is a read-only mount and this is skipped.
pub fn mirror(dir: &Path, local: &DirBundle, root: &SelfSignedPem) {
    if matches!(local, DirBundle::SelfSigned(r) if r == root) {
        return;
    }
    match ca::mirror(dir, root) {
        Ok(()) => tracing::info!(dir = %dir.display(), "the shared root is kept in ROOT_CA_DIR too"),
        Err(e) => tracing::debug!("ROOT_CA_DIR not written ({e}): the root is in Secret {CA_SECRET} only"),
    }
}

#[cfg(test)]
#[path = "ca_secret_tests.rs"]
mod tests;
