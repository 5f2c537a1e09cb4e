//! Errors of the mesh CA: each names the file or directory at fault and what to check.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("reading {path}: {source} (hint: is ROOT_CA_DIR readable by pilot-discovery?)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "writing {path}: {source} (hint: the self-signed root is kept in ROOT_CA_DIR so that restarts keep \
         the same root; point ROOT_CA_DIR at a writable directory)"
    )]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{dir}: incomplete signing CA bundle, missing {missing} (hint: plug in ca-cert.pem, ca-key.pem, \
         root-cert.pem and cert-chain.pem together, or remove them all to use a self-signed root)"
    )]
    IncompleteBundle { dir: PathBuf, missing: String },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "{dir}: the signing certificate does not chain to root-cert.pem: {reason} (hint: cert-chain.pem must \
         hold ca-cert.pem and every intermediate up to a root in root-cert.pem)"
    )]
    Chain { dir: PathBuf, reason: String },
    #[error("issuing a certificate: {0}")]
    Issue(String),
}

impl CaError {
    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> CaError {
        CaError::Invalid {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}

impl From<rcgen::Error> for CaError {
    fn from(e: rcgen::Error) -> CaError {
        CaError::Issue(e.to_string())
    }
}
