//! Where istiod's serving certificate comes from: Istio's `initIstiodCerts` and
//! `hasCustomTLSCerts` (pilot/pkg/bootstrap/server.go) with the well-known paths of
//! `pkg/config/constants` (`PilotWellKnownDNSCertPath`, `PilotWellKnownDNSCaCertPath`).
//!
//! The rule, in Istio's order: `--tlsCertFile`, `--tlsKeyFile` and `--caCertFile` when all three
//! are given (not checked for existence: a missing file is an error at start); else
//! `./var/run/secrets/istiod/tls/tls.crt` and `tls.key` with
//! `./var/run/secrets/istiod/ca/root-cert.pem` when the three are files; else the same pair with
//! `./var/run/secrets/istiod/tls/ca.crt`; else the mesh CA signs one (`PILOT_CERT_PROVIDER=istiod`).
//! The paths are relative to the working directory, as Istio's constants are (istiod runs in
//! `/`): Istio's install mounts the optional `istiod-tls` Secret and the `istio-ca-root-cert`
//! ConfigMap there, so without the Secret the mesh CA signs.

use std::path::{Path, PathBuf};

/// Istio's `PilotWellKnownDNSCertPath`.
pub const WELL_KNOWN_TLS_DIR: &str = "var/run/secrets/istiod/tls";
/// Istio's `PilotWellKnownDNSCaCertPath`.
pub const WELL_KNOWN_CA_DIR: &str = "var/run/secrets/istiod/ca";

/// Istio's `TLSOptions` flags: `--tlsCertFile`, `--tlsKeyFile`, `--caCertFile`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsFlags {
    pub cert_file: String,
    pub key_file: String,
    pub ca_cert_file: String,
}

/// Istio's `TLSOptions` as files: the certificate chain, its key and the CA bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Files given by flags or mounted at the well-known paths, watched for change.
    Files(TlsFiles),
    /// Signed by the mesh CA (`PILOT_CERT_PROVIDER=istiod`).
    Istiod,
}

impl Source {
    /// Istio's `hasCustomTLSCerts` with `base` as the working directory.
    pub fn detect(flags: &TlsFlags, base: &Path) -> Source {
        if !flags.cert_file.is_empty() && !flags.key_file.is_empty() && !flags.ca_cert_file.is_empty() {
            return Source::Files(TlsFiles {
                cert: flags.cert_file.clone().into(),
                key: flags.key_file.clone().into(),
                ca: flags.ca_cert_file.clone().into(),
            });
        }
        let tls = base.join(WELL_KNOWN_TLS_DIR);
        let (cert, key) = (tls.join("tls.crt"), tls.join("tls.key"));
        for ca in [base.join(WELL_KNOWN_CA_DIR).join("root-cert.pem"), tls.join("ca.crt")] {
            if [&cert, &key, &ca].iter().all(|p| p.is_file()) {
                return Source::Files(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    ca,
                });
            }
        }
        Source::Istiod
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(cert: &str, key: &str, ca: &str) -> TlsFlags {
        TlsFlags {
            cert_file: cert.into(),
            key_file: key.into(),
            ca_cert_file: ca.into(),
        }
    }

    #[test]
    fn the_flags_win_then_the_well_known_mounts_then_the_mesh_ca() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        assert_eq!(Source::detect(&TlsFlags::default(), base), Source::Istiod);
        // Istio's install mounts the istio-ca-root-cert ConfigMap at the CA path always: without
        // the optional istiod-tls Secret the mesh CA still signs.
        std::fs::create_dir_all(base.join(WELL_KNOWN_CA_DIR)).unwrap();
        std::fs::create_dir_all(base.join(WELL_KNOWN_TLS_DIR)).unwrap();
        std::fs::write(base.join(WELL_KNOWN_CA_DIR).join("root-cert.pem"), "x").unwrap();
        assert_eq!(Source::detect(&TlsFlags::default(), base), Source::Istiod);
        // The certificate without its key is not enough.
        std::fs::write(base.join(WELL_KNOWN_TLS_DIR).join("tls.crt"), "x").unwrap();
        assert_eq!(Source::detect(&TlsFlags::default(), base), Source::Istiod);
        std::fs::write(base.join(WELL_KNOWN_TLS_DIR).join("tls.key"), "x").unwrap();
        let tls = base.join(WELL_KNOWN_TLS_DIR);
        assert_eq!(
            Source::detect(&TlsFlags::default(), base),
            Source::Files(TlsFiles {
                cert: tls.join("tls.crt"),
                key: tls.join("tls.key"),
                ca: base.join(WELL_KNOWN_CA_DIR).join("root-cert.pem"),
            })
        );
        // No root-cert.pem: the Secret's own ca.crt (cert-manager's).
        std::fs::remove_file(base.join(WELL_KNOWN_CA_DIR).join("root-cert.pem")).unwrap();
        assert_eq!(Source::detect(&TlsFlags::default(), base), Source::Istiod);
        std::fs::write(tls.join("ca.crt"), "x").unwrap();
        assert!(matches!(Source::detect(&TlsFlags::default(), base), Source::Files(f) if f.ca == tls.join("ca.crt")));
        // All three flags take precedence, existing or not; two of three are ignored.
        assert_eq!(
            Source::detect(&flags("/c", "/k", "/ca"), base),
            Source::Files(TlsFiles {
                cert: "/c".into(),
                key: "/k".into(),
                ca: "/ca".into()
            })
        );
        assert!(
            matches!(Source::detect(&flags("/c", "/k", ""), base), Source::Files(f) if f.cert == tls.join("tls.crt"))
        );
    }
}
