//! Secrets from files (`file-root:`, `file-cert:`, `./etc/certs`), read as Istio's secret cache
//! reads them (security/pkg/nodeagent/cache/secretcache.go `generateRootCertFromExistingFile`,
//! `generateKeyCertFromExistingFiles`): a root file must hold PEM certificates
//! (`pkiutil.ParseRootCerts`: the valid ones are served, re-encoded; none is an error), a
//! certificate and key must be a PEM chain and the private key of its leaf (`tls.LoadX509KeyPair`).
//!
//! The paths come from Envoy's SDS requests, so the reads are guarded here as well: off the async
//! workers (`spawn_blocking`), only regular files (a FIFO or a device is refused before it is read,
//! and opened non-blocking), at most [`MAX_SECRET_FILE`] bytes.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::pem::Pem;

/// The largest secret file read: certificate bundles are kilobytes; this leaves room for large
/// CA bundles (the system's is about 200 KiB).
pub const MAX_SECRET_FILE: u64 = 4 << 20;

/// Why a file cannot be served as a secret.
#[derive(Debug, thiserror::Error)]
pub enum FileSecretError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file ({kind}); secrets are read from regular files only")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: larger than {MAX_SECRET_FILE} bytes; not a certificate file")]
    TooLarge { path: PathBuf },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

fn invalid(path: &Path, reason: impl Into<String>) -> FileSecretError {
    FileSecretError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The root certificates of `path`: its valid PEM certificates, re-encoded (as Istio's
/// `ParseRootCerts`); an error when there are none.
pub(super) async fn read_root(path: PathBuf) -> Result<String, FileSecretError> {
    blocking(move || {
        let bytes = read_bounded(&path)?;
        let (valid, errors) = parse_root_certs(&bytes);
        if valid.is_empty() {
            let why = errors
                .first()
                .map_or("no PEM certificate in it".to_owned(), Clone::clone);
            return Err(invalid(&path, format!("not a PEM root certificate file: {why}")));
        }
        if !errors.is_empty() {
            tracing::error!(path = %path.display(), ?errors, "failed to parse some certs from file");
        }
        Ok(valid)
    })
    .await
}

/// The certificate chain and private key of `cert` and `key`, as written, once they parse and the
/// key is the leaf's (as `tls.LoadX509KeyPair`).
pub(super) async fn read_key_pair(cert: PathBuf, key: PathBuf) -> Result<(String, String), FileSecretError> {
    blocking(move || {
        let chain = read_bounded(&cert)?;
        let key_pem = read_bounded(&key)?;
        let leaf = CertificateDer::pem_slice_iter(&chain)
            .next()
            .ok_or_else(|| invalid(&cert, "no PEM certificate in it"))?
            .map_err(|e| invalid(&cert, format!("not a PEM certificate chain: {e}")))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&leaf)
            .map_err(|e| invalid(&cert, format!("not an X.509 certificate: {e}")))?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| invalid(&key, format!("not a PEM private key: {e}")))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&private)
            .map_err(|e| invalid(&key, format!("unsupported private key: {e}")))?;
        if let Some(public) = signing.public_key()
            && public.as_ref() != parsed.public_key().raw
        {
            return Err(invalid(
                &key,
                format!("private key does not match public key of {}", cert.display()),
            ));
        }
        let text =
            |bytes: Vec<u8>, path: &Path| String::from_utf8(bytes).map_err(|_| invalid(path, "not UTF-8 PEM text"));
        Ok((text(chain, &cert)?, text(key_pem, &key)?))
    })
    .await
}

async fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, FileSecretError> + Send + 'static,
) -> Result<T, FileSecretError> {
    tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
        Err(FileSecretError::Read {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })
}

/// The bytes of the regular file `path`, at most [`MAX_SECRET_FILE`]; a FIFO, socket or device
/// is refused before it is opened (and opened non-blocking, should it be swapped in between).
pub(super) fn read_bounded(path: &Path) -> Result<Vec<u8>, FileSecretError> {
    let read_err = |source| FileSecretError::Read {
        path: path.to_path_buf(),
        source,
    };
    regular(path, &std::fs::metadata(path).map_err(read_err)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(read_err)?;
    regular(path, &file.metadata().map_err(read_err)?)?;
    let mut bytes = Vec::new();
    Read::take(&file, MAX_SECRET_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(FileSecretError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), FileSecretError> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_file() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(FileSecretError::NotRegular {
        path: path.to_path_buf(),
        kind,
    })
}

/// Istio's `ParseRootCerts`: the PEM blocks that are X.509 certificates, re-encoded, and why the
/// others are not; a PEM encoding error ends the parse.
fn parse_root_certs(bytes: &[u8]) -> (String, Vec<String>) {
    let mut valid = String::new();
    let mut errors = Vec::new();
    for block in Pem::iter_from_buffer(bytes.trim_ascii()) {
        let block = match block {
            Ok(b) => b,
            Err(e) => {
                errors.push(format!("invalid PEM encoded certificate: {e}"));
                break;
            }
        };
        if let Err(e) = block.parse_x509() {
            errors.push(format!("{} block: {e}", block.label));
            continue;
        }
        valid.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(&block.contents);
        for line in b64.as_bytes().chunks(64) {
            valid.push_str(&String::from_utf8_lossy(line));
            valid.push('\n');
        }
        valid.push_str("-----END CERTIFICATE-----\n");
    }
    (valid, errors)
}
