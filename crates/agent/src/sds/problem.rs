//! Why the agent has no workload certificate, in one line that names what to set, and how often
//! it is said. Istio's agent logs each failed CSR ("failed to sign: ...") and retries; here the
//! secret manager turns the failure into one error line naming the file or variable to fix (the
//! token at `./var/run/secrets/tokens/istio-token`, pilot-discovery's `JWT_RULE`, `CA_ADDR`,
//! `XDS_ROOT_CA`, or certificates in `./etc/certs`), logs it at once and then at most every
//! [`REPEAT_EVERY`] while it keeps failing, and keeps it for `/healthz/ready` to show.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::ca_client::{CaClient, CaClientError};
use super::cache::SecretError;

/// A failure that does not change is logged again after this long.
pub(super) const REPEAT_EVERY: Duration = Duration::from_secs(30);

/// The line for a failure to get the workload certificate of `identity`.
pub(super) fn describe(identity: &str, error: &SecretError, ca: Option<&CaClient>, cert_dir: &Path) -> String {
    let head = format!("no workload certificate for {identity}");
    let certs = format!(
        "or put cert-chain.pem, key.pem and root-cert.pem in {}",
        cert_dir.display()
    );
    let SecretError::Ca(e) = error else {
        return format!("{head}: {error}");
    };
    let transport = |ca: Option<&CaClient>| match ca.map(|c| c.tls.is_some()) {
        Some(false) => "plaintext",
        _ => "TLS",
    };
    match e {
        CaClientError::Refused { addr, status, token } if status.code() == tonic::Code::Unauthenticated => {
            match token {
                None => format!(
                    "{head}: the CA at {addr} refused the CSR ({}) and there is no service account token at {}: \
                     write the pod's token there (pilot-discovery checks it with a Kubernetes TokenReview, or \
                     with its JWT_RULE when it runs without a cluster; scripts/dev-token.py prints a rule and \
                     writes a token), {certs}",
                    status.message(),
                    ca.map_or_else(|| "the token path".to_owned(), |c| c.token.display().to_string()),
                ),
                Some(path) => format!(
                    "{head}: the CA at {addr} refused the token at {} ({}): it must be a service account \
                     token pilot-discovery accepts (with a cluster, one its TokenReview passes; without, one \
                     of the issuer and keys of its JWT_RULE, audience istio-ca, not expired), {certs}",
                    path.display(),
                    status.message(),
                ),
            }
        }
        CaClientError::Refused { addr, status, .. } => format!(
            "{head}: the CA at {addr} ({}) refused the CSR: {}: {}; is CA_ADDR pilot-discovery's CA \
             (plaintext only on port 15010, with --secureGrpcAddr \"\"; else its --secureGrpcAddr)?",
            transport(ca),
            status.code(),
            status.message(),
        ),
        CaClientError::Connect { addr, reason } => format!(
            "{head}: cannot reach the CA at {addr} ({}): {reason}: set CA_ADDR (default: the discovery \
             address) to pilot-discovery's CA: its --secureGrpcAddr (TLS), or its --grpcAddr on port 15010 \
             when it runs with --secureGrpcAddr \"\" (plaintext), {certs}",
            transport(ca),
        ),
        CaClientError::RootCert { addr, path, source } => format!(
            "{head}: the CA at {addr} is reached over TLS (CA_ADDR is not on port 15010) and its root \
             certificate {} cannot be read ({source}): set XDS_ROOT_CA to pilot-discovery's \
             $ROOT_CA_DIR/root-cert.pem, or CA_ADDR to its plaintext port 15010 when it runs with \
             --secureGrpcAddr \"\", {certs}",
            path.display(),
        ),
        other => format!("{head}: {other}"),
    }
}

/// The current failure, shared with readiness, and when it was last logged.
#[derive(Clone, Default, Debug)]
pub struct Problem {
    inner: Arc<Mutex<State>>,
}

#[derive(Default, Debug)]
struct State {
    current: Option<String>,
    logged: Option<(String, Instant)>,
}

impl Problem {
    /// Records a failure; `true` when it is to be logged now (new, changed, or last logged
    /// [`REPEAT_EVERY`] ago).
    pub fn failed(&self, line: String) -> bool {
        let mut s = lock(&self.inner);
        let now = Instant::now();
        let due = match &s.logged {
            Some((last, at)) => *last != line || now.duration_since(*at) >= REPEAT_EVERY,
            None => true,
        };
        if due {
            s.logged = Some((line.clone(), now));
        }
        s.current = Some(line);
        due
    }

    /// The certificate came: nothing to report, and the next failure is logged at once.
    pub fn cleared(&self) {
        let mut s = lock(&self.inner);
        s.current = None;
        s.logged = None;
    }

    /// The failure of the last attempt, if it failed.
    pub fn current(&self) -> Option<String> {
        lock(&self.inner).current.clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::sds::ca_client::CaTls;

    const ID: &str = "spiffe://cluster.local/ns/istio-system/sa/default";
    const TOKEN: &str = "./var/run/secrets/tokens/istio-token";

    fn client(addr: &str) -> CaClient {
        let tls = CaTls {
            root_cert: "./var/run/secrets/istio/root-cert.pem".into(),
            server_name: "istiod.istio-system.svc".into(),
        };
        CaClient::new(addr, tls, TOKEN.into())
    }

    fn line(addr: &str, e: CaClientError) -> String {
        describe(ID, &SecretError::Ca(e), Some(&client(addr)), Path::new("./etc/certs"))
    }

    #[test]
    fn no_token_names_the_token_path_jwt_rule_and_etc_certs() {
        let e = CaClientError::Refused {
            addr: "127.0.0.1:15010".into(),
            status: tonic::Status::unauthenticated("request authenticate failure: no bearer token"),
            token: None,
        };
        let l = line("127.0.0.1:15010", e);
        assert!(l.starts_with(&format!("no workload certificate for {ID}: ")), "{l}");
        for want in [
            "the CA at 127.0.0.1:15010 refused the CSR (request authenticate failure: no bearer token)",
            "no service account token at ./var/run/secrets/tokens/istio-token",
            "JWT_RULE",
            "scripts/dev-token.py",
            "./etc/certs",
        ] {
            assert!(l.contains(want), "{want:?} in {l}");
        }
    }

    #[test]
    fn a_refused_token_names_the_file_and_what_pilot_checks() {
        let e = CaClientError::Refused {
            addr: "127.0.0.1:15010".into(),
            status: tonic::Status::unauthenticated("ExpiredSignature"),
            token: Some(PathBuf::from(TOKEN)),
        };
        let l = line("127.0.0.1:15010", e);
        for want in [
            "refused the token at ./var/run/secrets/tokens/istio-token (ExpiredSignature)",
            "JWT_RULE",
            "TokenReview",
            "audience istio-ca",
        ] {
            assert!(l.contains(want), "{want:?} in {l}");
        }
    }

    #[test]
    fn an_unreachable_ca_names_ca_addr_and_the_transport() {
        let e = CaClientError::Connect {
            addr: "127.0.0.1:15010".into(),
            reason: "transport error: Connection refused".into(),
        };
        let l = line("127.0.0.1:15010", e);
        assert!(
            l.contains("cannot reach the CA at 127.0.0.1:15010 (plaintext): transport error: Connection refused"),
            "{l}"
        );
        assert!(l.contains("set CA_ADDR"), "{l}");
        let e = CaClientError::Connect {
            addr: "127.0.0.1:15012".into(),
            reason: "refused".into(),
        };
        assert!(line("127.0.0.1:15012", e).contains("(TLS)"));
    }

    #[test]
    fn a_tls_ca_without_its_root_names_xds_root_ca() {
        let e = CaClientError::RootCert {
            addr: "127.0.0.1:15012".into(),
            path: "./var/run/secrets/istio/root-cert.pem".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let l = line("127.0.0.1:15012", e);
        for want in [
            "reached over TLS",
            "./var/run/secrets/istio/root-cert.pem cannot be read",
            "set XDS_ROOT_CA",
            "CA_ADDR to its plaintext port 15010",
        ] {
            assert!(l.contains(want), "{want:?} in {l}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_logged_at_once_then_at_most_every_30s_and_changes_at_once() {
        let p = Problem::default();
        assert!(p.failed("a".into()));
        assert!(!p.failed("a".into()));
        tokio::time::advance(REPEAT_EVERY - Duration::from_secs(1)).await;
        assert!(!p.failed("a".into()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(p.failed("a".into()));
        assert!(p.failed("b".into()), "a new reason is said at once");
        assert_eq!(p.current().as_deref(), Some("b"));
        p.cleared();
        assert_eq!(p.current(), None);
        assert!(
            p.failed("b".into()),
            "after a success, the next failure is said at once"
        );
    }
}
