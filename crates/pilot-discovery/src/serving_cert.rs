//! istiod's serving certificate, the one of the secure gRPC port (15012) and the webhooks' HTTPS
//! port (15017): Istio's `pilot/pkg/keycertbundle` (the bundle and its watcher) and
//! `pilot/pkg/bootstrap/certcontroller.go` with `initIstiodCerts` of `server.go` (where it comes
//! from and how it is kept fresh).
//!
//! The current bundle (certificate chain, key and the CA bundle that clients trust) is published
//! on a `tokio::sync::watch` channel, Istio's `keycertbundle.Watcher`. Both TLS ports take the
//! certificate of every new handshake from it ([`Resolver`], rustls' `ResolvesServerCert`), so a
//! new certificate is served without a restart while established connections keep theirs; the
//! webhook patchers and whoever else publishes the CA bundle follow the same channel.
//!
//! Where it comes from, as `initIstiodCerts` decides (`source.rs`): files given by
//! `--tlsCertFile`, `--tlsKeyFile` and `--caCertFile` (all three), else the well-known mounts
//! `./var/run/secrets/istiod/tls/tls.{crt,key}` with `./var/run/secrets/istiod/ca/root-cert.pem`
//! or `./var/run/secrets/istiod/tls/ca.crt` (all present), watched for change (`files.rs`); else
//! signed by the mesh CA (`PILOT_CERT_PROVIDER=istiod`) and re-signed before it expires or when
//! the CA's signing certificate changes (`rotation.rs`).

mod bundle;
mod files;
mod rotation;
mod source;

#[cfg(test)]
pub use bundle::KeyCertBundle;
pub use bundle::{Bundles, Resolver};
pub use files::watch_files;
pub use rotation::{Names, rotate};
pub use source::{Source, TlsFlags};

#[cfg(test)]
mod tests;
