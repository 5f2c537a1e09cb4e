//! istiod's webhook port, `--httpsAddr` (15017): HTTPS with istiod's serving certificate (the one
//! of the secure gRPC port, signed by the mesh CA for `istiod.<namespace>.svc` and the other names
//! of Istio's `getDNSNames`), where the API server calls the validating webhook (`/validate`) and
//! the sidecar injector (`/inject`, `crate::injection`).
//!
//! Connections are set up as on the gRPC ports (`crate::accept`): the TLS handshake and a first
//! byte of the request within the connection timeout, else closed and counted. Requests are read
//! up to Istio's 6 MiB limit; answers and their metrics are Istio's (the `webhooks` crate).

pub mod patch;

use std::io;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use webhooks::admission;
use webhooks::validation::{self, Count};

use crate::accept::{Prefaced, Ready, Setup};
use crate::metrics::PipelineMetrics;

/// The webhooks' routes: Istio's `/validate` and `/validate/`, and the sidecar injector's
/// `/inject` ones when it is enabled (`crate::injection`).
pub fn router(metrics: PipelineMetrics, injector: Option<crate::injection::Injector>) -> Router {
    let validate = Router::new()
        .route("/validate", axum::routing::any(validate))
        .route("/validate/", axum::routing::any(validate))
        .with_state(metrics);
    match injector {
        Some(injector) => validate.merge(injector.routes()),
        None => validate,
    }
}

async fn validate(State(metrics): State<PipelineMetrics>, headers: HeaderMap, body: Body) -> Response {
    let http_error = |status: u16, message: String| {
        metrics.webhook_http_error(status);
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        (code, format!("{message}\n")).into_response()
    };
    let body = match crate::admission_body::read(body).await {
        Ok(b) => b,
        Err((status, message)) => return http_error(status.as_u16(), message),
    };
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let admit = |request: &admission::AdmissionRequest| {
        let verdict = validation::validate(request);
        match &verdict.count {
            Some(Count::Passed { resource }) => metrics.webhook_passed(resource),
            Some(Count::Failed { resource, reason }) => metrics.webhook_failed(resource, reason),
            None => {}
        }
        verdict.response
    };
    match admission::serve(content_type, &body, admit) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => http_error(e.status, e.message),
    }
}

/// Serves `router` over TLS on `listener` until the server fails.
pub async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    setup: Setup,
    router: Router,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let ready = crate::accept::tls(listener, acceptor, setup, Ready::FirstByte);
    tracing::info!(%addr, "webhooks (HTTPS) listening: /validate, /inject");
    axum::serve(
        ReadyListener {
            ready: Box::pin(ready),
            addr,
        },
        router.into_make_service(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("--httpsAddr {addr}: HTTPS server: {e}"))
}

type ReadyStream = std::pin::Pin<Box<dyn Stream<Item = io::Result<Prefaced<TlsStream<TcpStream>>>> + Send>>;

/// The connections `crate::accept` made ready, as an axum listener.
struct ReadyListener {
    ready: ReadyStream,
    addr: SocketAddr,
}

impl axum::serve::Listener for ReadyListener {
    type Io = Prefaced<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            match self.ready.next().await {
                Some(Ok(conn)) => {
                    let peer = conn.get_ref().get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (conn, peer);
                }
                Some(Err(e)) => {
                    tracing::debug!("--httpsAddr: accept: {e}");
                    // As axum's own listener: a short pause so that a full fd table is not spun on.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests;
