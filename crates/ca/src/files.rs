//! The CA directory (Istio's `ROOT_CA_DIR`, `./etc/cacerts`, where the `cacerts` Secret is
//! mounted): which signing bundle it holds and how the self-signed root is kept in it.
//!
//! Istio reads, in this order of preference:
//! - a plugged-in CA: `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`, all four;
//!   some but not all is an error ("incomplete signing CA bundle");
//! - otherwise a self-signed root. With Kubernetes, istiod keeps it in the `istio-ca-secret`
//!   Secret, or (`USE_CACERTS_FOR_SELF_SIGNED_CA`) in the `cacerts` Secret itself, marked by an
//!   `istio-generated` key; pilot-discovery keeps it in `istio-ca-secret` too (`shared.rs` and
//!   pilot-discovery's `ca_secret.rs`). Without Kubernetes Istio keeps it in memory only
//!   (`NewSelfSignedDebugIstioCAOptions`), so each restart makes a new root that every agent must
//!   fetch again. We do the file equivalent of `USE_CACERTS_FOR_SELF_SIGNED_CA` instead, with no
//!   new setting: the generated root goes into the CA directory as `ca-cert.pem`, `ca-key.pem`,
//!   `root-cert.pem` and an empty `istio-generated` marker, and the next start loads it back.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::KeyPair;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::{CaError, CaSource, certs, key};

pub const CA_CERT_FILE: &str = "ca-cert.pem";
pub const CA_PRIVATE_KEY_FILE: &str = "ca-key.pem";
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
pub const ISTIO_GENERATED: &str = "istio-generated";

/// What the CA directory yielded: the signing certificate and key, the chain sent after every
/// issued certificate, and the roots that clients trust.
pub(crate) struct SigningBundle {
    pub source: CaSource,
    pub signing_cert: CertificateDer<'static>,
    pub signing_key: KeyPair,
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub roots: Vec<CertificateDer<'static>>,
}

pub(crate) fn load_or_create(dir: &Path, trust_domain: &str, root_ttl: Duration) -> Result<SigningBundle, CaError> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(CaError::invalid(dir, "not a directory")),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return create_self_signed(dir, trust_domain, root_ttl),
        Err(e) => return Err(read_error(dir, e)),
    }
    if exists(&dir.join(ISTIO_GENERATED))? {
        return load_self_signed(dir);
    }
    match missing_plugged(dir)?.len() {
        0 => load_plugged(dir),
        n if n == PLUGGED.len() => create_self_signed(dir, trust_domain, root_ttl),
        _ => load_plugged_only(dir),
    }
}

/// The four files of a plugged-in CA.
const PLUGGED: [&str; 4] = [CA_CERT_FILE, CA_PRIVATE_KEY_FILE, ROOT_CERT_FILE, CERT_CHAIN_FILE];

fn missing_plugged(dir: &Path) -> Result<Vec<&'static str>, CaError> {
    let mut missing = Vec::new();
    for f in PLUGGED {
        if !exists(&dir.join(f))? {
            missing.push(f);
        }
    }
    Ok(missing)
}

/// The plugged-in CA of `dir`, all four files, and nothing else: never a self-signed root, even
/// when the files are gone (a rotation half done). What a reload of the `cacerts` mount reads.
pub(crate) fn load_plugged_only(dir: &Path) -> Result<SigningBundle, CaError> {
    let missing = missing_plugged(dir)?;
    if !missing.is_empty() {
        return Err(CaError::IncompleteBundle {
            dir: dir.to_path_buf(),
            missing: missing.join(", "),
        });
    }
    load_plugged(dir)
}

/// The roots of `dir`'s `root-cert.pem`.
pub(crate) fn read_roots(dir: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    read_certs(&dir.join(ROOT_CERT_FILE))
}

fn load_plugged(dir: &Path) -> Result<SigningBundle, CaError> {
    Ok(SigningBundle {
        source: CaSource::PluggedIn,
        signing_cert: first_cert(&dir.join(CA_CERT_FILE))?,
        signing_key: read_key(&dir.join(CA_PRIVATE_KEY_FILE))?,
        cert_chain: read_certs(&dir.join(CERT_CHAIN_FILE))?,
        roots: read_certs(&dir.join(ROOT_CERT_FILE))?,
    })
}

/// The root this CA generated on an earlier start. `root-cert.pem` may add roots (Istio appends
/// the roots of `root-cert.pem` to the self-signed one); it is written back if it went missing.
fn load_self_signed(dir: &Path) -> Result<SigningBundle, CaError> {
    let signing_cert = first_cert(&dir.join(CA_CERT_FILE))?;
    let signing_key = read_key(&dir.join(CA_PRIVATE_KEY_FILE))?;
    let root_path = dir.join(ROOT_CERT_FILE);
    let mut roots = vec![signing_cert.clone()];
    if exists(&root_path)? {
        roots.extend(read_certs(&root_path)?.into_iter().filter(|c| *c != signing_cert));
    } else {
        write_file(&root_path, pem(&roots).as_bytes(), 0o644)?;
    }
    tracing::info!(dir = %dir.display(), "loaded the self-signed root generated on an earlier start");
    Ok(SigningBundle {
        source: CaSource::SelfSignedLoaded,
        signing_cert,
        signing_key,
        cert_chain: Vec::new(),
        roots,
    })
}

fn create_self_signed(dir: &Path, trust_domain: &str, ttl: Duration) -> Result<SigningBundle, CaError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = certs::self_signed_root(trust_domain, ttl)?.self_signed(&key)?;
    save_self_signed(dir, cert.pem().as_bytes(), key.serialize_pem().as_bytes())?;
    tracing::info!(dir = %dir.display(), trust_domain, "generated a self-signed root and saved it for later starts");
    Ok(SigningBundle {
        source: CaSource::SelfSignedCreated,
        signing_cert: cert.der().clone(),
        signing_key: key,
        cert_chain: Vec::new(),
        roots: vec![cert.der().clone()],
    })
}

/// Writes a self-signed root and its key into `dir`, the root as `root-cert.pem` too. The marker
/// goes last: a directory left half-written fails to load instead of being taken for a
/// plugged-in CA.
pub(crate) fn save_self_signed(dir: &Path, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), CaError> {
    create_dir(dir)?;
    write_file(&dir.join(CA_PRIVATE_KEY_FILE), key_pem, 0o600)?;
    write_file(&dir.join(CA_CERT_FILE), cert_pem, 0o644)?;
    write_file(&dir.join(ROOT_CERT_FILE), cert_pem, 0o644)?;
    write_file(&dir.join(ISTIO_GENERATED), b"", 0o644)
}

/// Certificates as PEM, one after another.
pub(crate) fn pem(certs: &[CertificateDer<'_>]) -> String {
    certs.iter().map(|c| pem_block("CERTIFICATE", c.as_ref())).collect()
}

/// One PEM block, 64 base64 characters a line.
pub(crate) fn pem_block(label: &str, der: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn read(path: &Path) -> Result<Vec<u8>, CaError> {
    std::fs::read(path).map_err(|e| read_error(path, e))
}

fn read_error(path: &Path, source: std::io::Error) -> CaError {
    CaError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn read_key(path: &Path) -> Result<KeyPair, CaError> {
    key::parse_private_key(&read(path)?).map_err(|e| CaError::invalid(path, e))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaError::invalid(path, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(CaError::invalid(path, "no PEM certificate"));
    }
    Ok(certs)
}

fn first_cert(path: &Path) -> Result<CertificateDer<'static>, CaError> {
    let mut certs = read_certs(path)?;
    Ok(certs.swap_remove(0))
}

fn exists(path: &Path) -> Result<bool, CaError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(read_error(path, e)),
    }
}

fn create_dir(dir: &Path) -> Result<(), CaError> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).map_err(|source| CaError::Write {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `path` whole (a temporary file renamed over it), with `mode` on Unix.
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let err = |source| CaError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(contents).and_then(|()| f.sync_all()).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
