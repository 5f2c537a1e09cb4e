//! Accepting connections on the gRPC ports (15010, 15012) as grpc-go's server does for istiod: a
//! connection must finish its TLS handshake (15012) and send the HTTP/2 client preface within the
//! connection timeout (on the webhooks' HTTPS port 15017: the handshake and a first byte) (grpc-go's `ConnectionTimeout`, 120 s by default, which istiod does not
//! change) or it is closed. tonic has no such deadline: a peer that opens a connection and sends
//! nothing, or completes TLS and stops, held a file descriptor for ever.
//!
//! Each accepted connection is set up in a task of its own (a slow one never delays the others);
//! connections that are ready go to tonic through a channel. The TLS handshake is made here
//! (tonic's own `tls_config` has no deadline), with tonic's settings: the `h2` ALPN and a client
//! certificate asked for, not required. The stream handed to tonic is tokio-rustls' `TlsStream`,
//! so tonic's `TlsConnectInfo` (the peer's certificates and address) reaches the services as before.
//!
//! Connections closed before they were ready are counted in
//! `pilot_grpc_connection_setup_failures_total{port, reason}` (`timeout`, `tls`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::server::ResolvesServerCert;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

/// grpc-go's default `ConnectionTimeout`: from accept to the HTTP/2 preface, TLS included.
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(120);

/// The client's connection preface (RFC 9113 §3.4), 24 bytes.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SetupLabels {
    port: String,
    reason: &'static str,
}

/// `pilot_grpc_connection_setup_failures_total`: connections closed before they were ready.
#[derive(Clone, Debug, Default)]
pub(crate) struct SetupMetrics(Family<SetupLabels, Counter>);

impl SetupMetrics {
    pub(crate) fn register(registry: &mut Registry) -> SetupMetrics {
        let m = SetupMetrics::default();
        registry.register(
            "pilot_grpc_connection_setup_failures",
            "Connections to the gRPC ports closed before their TLS handshake and HTTP/2 preface \
             completed, by port and reason (timeout, tls)",
            m.0.clone(),
        );
        m
    }

    fn failed(&self, port: u16, reason: &'static str) {
        self.0
            .get_or_create(&SetupLabels {
                port: port.to_string(),
                reason,
            })
            .inc();
    }
}

/// How the connections of one port are set up.
#[derive(Clone)]
pub(crate) struct Setup {
    pub timeout: Duration,
    pub metrics: SetupMetrics,
}

/// What a connection must send before it is handed over.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ready {
    /// gRPC: the HTTP/2 client preface.
    Http2Preface,
    /// HTTPS (HTTP/1.1 or HTTP/2, the webhooks' port): a first byte of the request.
    FirstByte,
}

impl Ready {
    fn bytes(self) -> usize {
        match self {
            Ready::Http2Preface => PREFACE.len(),
            Ready::FirstByte => 1,
        }
    }
}

/// The plaintext port's connections, ready once the client sent the HTTP/2 preface.
pub(crate) fn plaintext(
    listener: TcpListener,
    setup: Setup,
) -> impl futures::Stream<Item = io::Result<Prefaced<TcpStream>>> + Send + 'static {
    serve_ready(listener, setup, Ready::Http2Preface, |tcp| async move { Ok(tcp) })
}

/// A TLS port's connections, ready once the handshake completed and the client sent `ready`.
pub(crate) fn tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    setup: Setup,
    ready: Ready,
) -> impl futures::Stream<Item = io::Result<Prefaced<TlsStream<TcpStream>>>> + Send + 'static {
    serve_ready(listener, setup, ready, move |tcp| {
        let acceptor = acceptor.clone();
        async move { acceptor.accept(tcp).await.map_err(SetupError::Tls) }
    })
}

enum SetupError {
    Tls(io::Error),
    Preface(io::Error),
}

/// Accepts on `listener` until the receiving side is dropped; each connection is handshaken by
/// `handshake` and must then send what `ready` wants, all within `setup.timeout`.
fn serve_ready<S, H, F>(
    listener: TcpListener,
    setup: Setup,
    ready: Ready,
    handshake: H,
) -> impl futures::Stream<Item = io::Result<Prefaced<S>>> + Send + 'static
where
    S: AsyncRead + Unpin + Send + 'static,
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = Result<S, SetupError>> + Send + 'static,
{
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let (ready_tx, ready_rx) = tokio::sync::mpsc::channel::<io::Result<Prefaced<S>>>(64);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                accepted = listener.accept() => accepted,
                () = ready_tx.closed() => return,
            };
            let tcp = match tcp {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // As tonic's incoming: the error goes to the server, which logs it and goes on;
                    // a short pause so that a full descriptor table (EMFILE) is not spun on.
                    if ready_tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("set TCP_NODELAY: {e}");
            }
            let peer = tcp.peer_addr().ok();
            let set_up = handshake(tcp);
            let (ready_tx, setup) = (ready_tx.clone(), setup.clone());
            tokio::spawn(async move {
                let ready = tokio::time::timeout(setup.timeout, async move {
                    let mut io = set_up.await?;
                    let mut got = vec![0u8; ready.bytes()];
                    io.read_exact(&mut got).await.map_err(SetupError::Preface)?;
                    Ok::<_, SetupError>(Prefaced::new(io, got))
                })
                .await;
                match ready {
                    Ok(Ok(conn)) => {
                        let _ = ready_tx.send(Ok(conn)).await;
                    }
                    Ok(Err(SetupError::Tls(e))) => {
                        setup.metrics.failed(port, "tls");
                        tracing::debug!(?peer, port, "TLS handshake failed: {e}");
                    }
                    // The client went away before a request: nothing to count.
                    Ok(Err(SetupError::Preface(e))) => tracing::debug!(?peer, port, "closed before HTTP/2: {e}"),
                    Err(_) => {
                        setup.metrics.failed(port, "timeout");
                        tracing::debug!(?peer, port, timeout = ?setup.timeout, "connection not ready in time: closed");
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(ready_rx)
}

/// A connection whose first bytes (the preface) were read ahead; they are read again first.
pub(crate) struct Prefaced<S> {
    inner: S,
    ahead: Vec<u8>,
    served: usize,
}

impl<S> Prefaced<S> {
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Prefaced<S> {
    fn new(inner: S, ahead: Vec<u8>) -> Prefaced<S> {
        Prefaced {
            inner,
            ahead,
            served: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefaced<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.served < this.ahead.len() {
            let n = buf.remaining().min(this.ahead.len() - this.served);
            buf.put_slice(&this.ahead[this.served..this.served + n]);
            this.served += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefaced<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Prefaced<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// tonic's server TLS settings (`ServerTlsConfig` with `client_auth_optional`): istiod's
/// certificate from `cert` on every handshake, client certificates of `client_roots` asked for
/// but not required, ALPN `h2`.
pub(crate) fn acceptor(cert: Arc<dyn ResolvesServerCert>, client_roots_pem: &str) -> anyhow::Result<TlsAcceptor> {
    let mut config = server_config(cert, Some(client_roots_pem))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The webhooks' HTTPS port: istiod's certificate from `cert`, no client certificate, HTTP/2 or
/// HTTP/1.1 as the API server offers.
pub(crate) fn https_acceptor(cert: Arc<dyn ResolvesServerCert>) -> anyhow::Result<TlsAcceptor> {
    let mut config = server_config(cert, None)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn server_config(
    cert: Arc<dyn ResolvesServerCert>,
    client_roots_pem: Option<&str>,
) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context as _;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match client_roots_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for root in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(root.context("the mesh root")?).context("the mesh root")?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(builder.with_cert_resolver(cert))
}

#[cfg(test)]
mod tests;
