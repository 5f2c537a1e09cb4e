//! HTTPS for the fake API server, as a cluster's API server serves: rustls with a certificate
//! of a test CA, HTTP/1.1 and HTTP/2 (ALPN) on each accepted connection.

use std::sync::Arc;

use anyhow::Context;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::tls::IssuedCert;

pub(crate) fn acceptor(cert: &IssuedCert) -> anyhow::Result<TlsAcceptor> {
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).context("the serving key")?;
    let chain: Vec<CertificateDer<'static>> = vec![cert.cert_der.clone()];
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the serving certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` over TLS on `listener` until the task is aborted; a failed handshake or
/// connection ends only that connection.
pub(crate) async fn serve(listener: TcpListener, acceptor: TlsAcceptor, app: axum::Router) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
        });
    }
}
