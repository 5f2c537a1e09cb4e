//! The `xds` mode of `hardening_figures`: the agent's xDS proxy (Istio's `xds_proxy.go`) alone in
//! this process, a child process playing both Envoy (one ADS stream on the proxy's Unix socket,
//! one `DiscoveryRequest` of `mb` MB) and pilot-discovery (an ADS server that takes any size and
//! counts what reaches it), so VmRSS/VmHWM here are the proxy's own. Kept in its own file so the
//! same code builds against an older agent for the "before" figure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent::xds_proxy::{XdsProxy, XdsProxyConfig};
use prometheus_client::registry::Registry;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0)
}

fn mib(key: &str) -> f64 {
    status_kib(key) as f64 / 1024.0
}

/// The parent: the proxy under test, measured while the child sends.
pub async fn run(mb: u64) {
    let dir = std::env::temp_dir().join(format!("hardening-xds-{}", std::process::id()));
    let uds = dir.join("XDS");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let upstream = SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = XdsProxy::start(
        XdsProxyConfig::new(&uds, upstream.to_string()),
        &mut Registry::default(),
    )
    .await
    .expect("start the xDS proxy");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // reset VmHWM to the current RSS (Linux clear_refs 5), so the high-water mark is this load's
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = mib("VmRSS:");

    let done = Arc::new(AtomicBool::new(false));
    let sampled_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak) = (done.clone(), sampled_peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(status_kib("VmRSS:"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let exe = std::env::current_exe().expect("own path");
    let child = tokio::process::Command::new(exe)
        .args([
            "xds-peer",
            &uds.display().to_string(),
            &port.to_string(),
            &mb.to_string(),
        ])
        .output()
        .await
        .expect("run the peer");
    let peak = mib("VmHWM:");
    tokio::time::sleep(Duration::from_secs(5)).await;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let after = mib("VmRSS:");
    let sampled = sampled_peak.load(Ordering::Relaxed) as f64 / 1024.0;
    let peak = peak.max(sampled);
    let outcome = String::from_utf8_lossy(&child.stdout).trim().to_owned();
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "xds: one {mb} MB request from Envoy: VmRSS {before:.1} MiB before, peak {peak:.1} MiB (VmHWM; sampled {sampled:.1}), {after:.1} MiB 5 s after (+{:.1} MiB peak); {outcome}",
        peak - before
    );
    println!(
        "{{\"case\":\"xds\",\"request_mb\":{mb},\"rss_before_mib\":{before:.1},\"rss_peak_mib\":{peak:.1},\"rss_after_mib\":{after:.1}}}"
    );
}

/// The child: pilot-discovery on `port` and Envoy on `uds`; prints what happened to the request.
pub async fn peer(uds: PathBuf, port: u16, mb: u64) {
    let received = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind upstream");
    let service =
        AggregatedDiscoveryServiceServer::new(CountingAds(received.clone())).max_decoding_message_size(usize::MAX);
    tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let outcome = envoy(&uds, mb).await;
    // give a forwarded request time to arrive whole
    for _ in 0..100 {
        if received.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upstream = received.load(Ordering::Relaxed);
    println!("Envoy's stream: {outcome}; bytes of it reaching pilot-discovery: {upstream}");
}

async fn envoy(uds: &Path, mb: u64) -> String {
    let channel = Endpoint::from_shared(format!("unix://{}", uds.display()))
        .expect("uds uri")
        .connect()
        .await
        .expect("connect to the proxy");
    let mut client = AggregatedDiscoveryServiceClient::new(channel).max_encoding_message_size(usize::MAX);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let request = DiscoveryRequest {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        resource_names: vec!["x".repeat((mb * 1_000_000) as usize)],
        ..Default::default()
    };
    let _ = tx.send(request).await;
    let mut responses = match client.stream_aggregated_resources(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return format!("refused at open: {:?} {}", status.code(), status.message()),
    };
    let ended = tokio::time::timeout(Duration::from_secs(10), responses.message()).await;
    drop(tx);
    match ended {
        Ok(Ok(Some(_))) => "a response".into(),
        Ok(Ok(None)) => "ended cleanly".into(),
        Ok(Err(status)) => format!("ended with {:?} \"{}\"", status.code(), status.message()),
        Err(_) => "open after 10 s (request accepted)".into(),
    }
}

struct CountingAds(Arc<AtomicU64>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for CountingAds {
    type StreamAggregatedResourcesStream = tokio_stream::Pending<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = tokio_stream::Pending<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let received = self.0.clone();
        let mut requests = request.into_inner();
        tokio::spawn(async move {
            while let Some(Ok(req)) = requests.next().await {
                let size = req.resource_names.iter().map(String::len).sum::<usize>();
                received.fetch_add(size as u64, Ordering::Relaxed);
            }
        });
        Ok(Response::new(tokio_stream::pending()))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(Response::new(tokio_stream::pending()))
    }
}
