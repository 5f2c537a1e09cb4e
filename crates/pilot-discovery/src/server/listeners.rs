//! The TCP listeners and gRPC server settings of istiod's ports (15010, 15012, 15017, 8080,
//! 15014), as Go's `net.Listen` and istiod's `grpcServerOptions` make them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use environment::Environment;
use tokio::net::TcpListener;
use xds_server::DiscoveryServer;

use crate::args::{DiscoveryArgs, parse_listen_addr};
use crate::ca_server::MeshCaServer;
use crate::http::{AppState, debug_router, monitoring_router};
use crate::metrics::PipelineMetrics;

/// A gRPC server with istiod's keepalive settings: a ping every 30s answered within 10s, and a
/// maximum connection age (`--keepaliveMaxServerConnectionAge`) with 10s grace, after which
/// proxies reconnect and spread over the replicas. At most `max_streams` concurrent streams per
/// connection (`ISTIO_GPRC_MAXSTREAMS`): HTTP/2 refuses the ones over it.
fn grpc_server(max_connection_age: Duration, max_streams: u32) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(max_streams))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_connection_age(max_connection_age)
        .max_connection_age_grace(Duration::from_secs(10))
}

/// Listens as Go's `net.Listen` does for istiod: SO_REUSEADDR, and the kernel's `somaxconn` as the
/// accept backlog (tokio's default of 1024 drops SYNs when thousands of proxies reconnect at once,
/// and each dropped SYN costs the proxy a 1 s retransmit).
async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(listen_backlog())
    };
    listen().with_context(|| format!("--{flag}: cannot listen on {addr} (hint: is the port in use?)"))
}

/// `/proc/sys/net/core/somaxconn` (Go reads the same), else 4096.
fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4096)
}

/// The addresses of istiod's ports (an empty flag turns a port off) and the gRPC connections'
/// maximum age.
pub(super) struct Addresses {
    pub(super) grpc: Option<SocketAddr>,
    pub(super) secure_grpc: Option<SocketAddr>,
    pub(super) http: Option<SocketAddr>,
    pub(super) https: Option<SocketAddr>,
    pub(super) monitoring: Option<SocketAddr>,
    pub(super) max_connection_age: Duration,
}

impl Addresses {
    pub(super) fn from_args(args: &DiscoveryArgs) -> anyhow::Result<Addresses> {
        let max_connection_age = model::duration::parse(&args.keepalive_max_server_connection_age)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--keepaliveMaxServerConnectionAge: {:?} is not a positive duration (e.g. 30m)",
                    args.keepalive_max_server_connection_age
                )
            })?;
        Ok(Addresses {
            grpc: parse_listen_addr("grpcAddr", &args.grpc_addr)?,
            secure_grpc: parse_listen_addr("secureGrpcAddr", &args.secure_grpc_addr)?,
            http: parse_listen_addr("httpAddr", &args.http_addr)?,
            https: parse_listen_addr("httpsAddr", &args.https_addr)?,
            monitoring: parse_listen_addr("monitoringAddr", &args.monitoring_addr)?,
            max_connection_age,
        })
    }
}

/// The connection setup (TLS handshake and preface timeouts, counted) and the CA's request size
/// limit (`ISTIO_GPRC_MAXRECVMSGSIZE`), with their metrics registered.
pub(super) fn register(
    registry: &mut prometheus_client::registry::Registry,
    max_recv_msg_size: usize,
) -> (crate::accept::Setup, crate::ca_limits::RequestLimit) {
    let setup = crate::accept::Setup {
        timeout: crate::accept::CONNECTION_TIMEOUT,
        metrics: crate::accept::SetupMetrics::register(registry),
    };
    (
        setup,
        crate::ca_limits::RequestLimit::register(max_recv_msg_size, registry),
    )
}

/// What the ports serve.
pub(super) struct Served<'a> {
    pub(super) addrs: &'a Addresses,
    /// `ISTIO_GPRC_MAXSTREAMS`
    pub(super) max_streams: u32,
    pub(super) ads: &'a Arc<DiscoveryServer<Environment>>,
    /// 15012 and the webhooks' serving certificate, when there is a secure port
    pub(super) secure: Option<crate::secure::SecureGrpc>,
    /// the CA on the plaintext port, when there is no secure one
    pub(super) plaintext_ca: Option<MeshCaServer>,
    pub(super) injector: Option<crate::injection::Injector>,
    pub(super) setup: crate::accept::Setup,
    pub(super) ca_limit: crate::ca_limits::RequestLimit,
    pub(super) pipeline_metrics: PipelineMetrics,
    pub(super) state: AppState,
}

/// Binds every port that has an address and serves it in a task of the set returned: xDS and
/// (without a secure port) the CA on 15010, xDS and the CA over TLS on 15012, the webhooks on
/// 15017, debug on 8080, metrics on 15014. A port that cannot be bound fails the start.
pub(super) async fn serve(s: Served<'_>) -> anyhow::Result<tokio::task::JoinSet<anyhow::Result<()>>> {
    let mut tasks = tokio::task::JoinSet::new();
    let addrs = s.addrs;
    if let Some(addr) = addrs.grpc {
        let listener = bind(addr, "grpcAddr").await?;
        let svc = s.ads.ads_service();
        let ca = s
            .plaintext_ca
            .map(|ca| crate::ca_limits::LimitedCa::new(ca.service, s.ca_limit.clone()));
        let mut builder = grpc_server(addrs.max_connection_age, s.max_streams);
        let setup = s.setup.clone();
        tasks.spawn(async move {
            builder
                .add_service(svc)
                .add_optional_service(ca)
                .serve_with_incoming(crate::accept::plaintext(listener, setup))
                .await
                .context("gRPC server")
        });
        tracing::info!(%addr, "xDS (plaintext) listening");
    }
    match (addrs.https, &s.secure) {
        (Some(addr), Some(secure)) => {
            let acceptor = secure
                .https_acceptor()
                .with_context(|| format!("--httpsAddr {addr}: TLS configuration"))?;
            let listener = bind(addr, "httpsAddr").await?;
            let router = crate::webhook::router(s.pipeline_metrics.clone(), s.injector);
            tasks.spawn(crate::webhook::serve(listener, acceptor, s.setup.clone(), router));
        }
        (Some(addr), None) => tracing::info!(
            %addr,
            "--httpsAddr: the webhooks are off: there is no serving certificate without --secureGrpcAddr"
        ),
        (None, _) => {}
    }
    if let (Some(addr), Some(secure)) = (addrs.secure_grpc, s.secure) {
        let listener = bind(addr, "secureGrpcAddr").await?;
        tasks.spawn(secure.serve(
            grpc_server(addrs.max_connection_age, s.max_streams),
            listener,
            s.setup,
            s.ca_limit,
            s.ads.ads_service(),
        ));
    }
    for (addr, flag, router) in [
        (addrs.http, "httpAddr", debug_router(s.state.clone())),
        (addrs.monitoring, "monitoringAddr", monitoring_router(s.state)),
    ] {
        if let Some(addr) = addr {
            let listener = bind(addr, flag).await?;
            tracing::info!(%addr, flag, "HTTP listening");
            let service = router.into_make_service_with_connect_info::<SocketAddr>();
            tasks.spawn(async move { axum::serve(listener, service).await.context("HTTP server") });
        }
    }
    Ok(tasks)
}
