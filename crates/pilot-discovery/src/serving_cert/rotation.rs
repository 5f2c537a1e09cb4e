//! istiod's serving certificate signed by the mesh CA (`PILOT_CERT_PROVIDER=istiod`), Istio's
//! `initDNSCertsIstiod` and its rotation (pilot/pkg/bootstrap/certcontroller.go): signed at
//! start for istiod's DNS names with the lifetime `CITADEL_SELF_SIGNED_CA_CERT_TTL` (clamped to
//! the CA's signing certificate), and signed again
//! - when the CA changes (Istio's `watchRootCertAndGenKeyCert` and `updateRootCertAndGenKeyCert`),
//!   with the CA's roots as the new CA bundle: a new plugged-in intermediate (`crate::cacerts`,
//!   Istio's `handleCACertsFileWatch`);
//! - before it expires: once half its lifetime is left (Istio's `defaultCertGracePeriodRatio`,
//!   0.5, which istiod applies to the certificate that Kubernetes signs for it,
//!   `RotateDNSCertForK8sCA`). istiod's own CA re-signs only on a root change, so a certificate
//!   clamped to a plugged-in intermediate that expires first would lapse; here it does not.
//!
//! A failed signing is logged, counted in `pilot_istiod_cert_errors_total`, and retried with
//! backoff while the current certificate keeps serving.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ca::CertificateAuthority;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use super::bundle::{Bundles, KeyCertBundle, log_loaded};

/// The current mesh CA; a new value when the plugged-in CA files are replaced.
pub(crate) type CaHandle = watch::Receiver<Arc<CertificateAuthority>>;

/// Istio's `defaultCertGracePeriodRatio`.
const GRACE_PERIOD_RATIO: f64 = 0.5;
/// The soonest a certificate is signed again after the last one (a CA whose signing
/// certificate is about to expire makes certificates that are at once within their grace).
const MIN_WAIT: Duration = Duration::from_secs(1);

/// What istiod's certificate names and how long it lives.
#[derive(Debug, Clone)]
pub struct Names {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub ttl: Duration,
}

fn sign(ca: &CertificateAuthority, names: &Names) -> anyhow::Result<KeyCertBundle> {
    let issued = ca.issue_server_cert(&names.dns, &names.ips, names.ttl)?;
    Ok(KeyCertBundle::new(
        issued.cert_chain_pem,
        issued.key_pem,
        ca.root_cert_pem().to_owned(),
    )?)
}

/// How long until `bundle` is within its grace period: half of its lifetime from when it was
/// signed (not from its back-dated `notBefore`) left.
pub fn renew_in(bundle: &KeyCertBundle, now: SystemTime) -> Duration {
    let start = bundle.not_before.max(bundle.loaded_at);
    let lifetime = bundle.not_after.duration_since(start).unwrap_or_default();
    let grace = lifetime.mul_f64(GRACE_PERIOD_RATIO);
    let left = bundle.not_after.duration_since(now).unwrap_or_default();
    left.saturating_sub(grace).max(MIN_WAIT)
}

/// Signs istiod's certificate with the current CA of `ca` and keeps it fresh for as long as the
/// returned receivers live.
pub fn rotate(ca: CaHandle, names: Names, errors: Counter) -> anyhow::Result<Bundles> {
    let first = sign(&ca.borrow(), &names).map_err(|e| anyhow::anyhow!("signing istiod's certificate: {e:#}"))?;
    log_loaded(&first, &format!("signed by the mesh CA for {:?}", names.dns));
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(keep_fresh(ca, names, tx, errors));
    Ok(rx)
}

async fn keep_fresh(mut ca: CaHandle, names: Names, tx: watch::Sender<Arc<KeyCertBundle>>, errors: Counter) {
    let mut ca_open = true;
    let mut retry: Option<Duration> = None;
    loop {
        let wait = retry.unwrap_or_else(|| renew_in(&tx.borrow(), SystemTime::now()));
        let why = tokio::select! {
            _ = tokio::time::sleep(wait) => if retry.is_some() { "retrying" } else { "half of its lifetime is left" },
            changed = ca.changed(), if ca_open => match changed {
                Ok(()) => "the mesh CA changed",
                Err(_) => {
                    ca_open = false;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        let current = ca.borrow_and_update().clone();
        match sign(&current, &names) {
            Ok(bundle) => {
                retry = None;
                log_loaded(&bundle, &format!("signed again ({why})"));
                tx.send_replace(Arc::new(bundle));
            }
            Err(e) => {
                errors.inc();
                let next = retry.map_or(Duration::from_secs(1), |d| (d * 2).min(Duration::from_secs(60)));
                retry = Some(next);
                tracing::warn!(
                    "signing istiod's certificate again ({why}): {e:#}; the current one keeps serving, retry in {next:?}"
                );
            }
        }
    }
}
