//! Issue 28's memory figures for the agent, by hand (not a timed test): the resident memory
//! (`VmRSS` of this process, which runs the agent's server under test) and its open descriptors
//! under the outside probe's load.
//!
//! ```sh
//! cargo run -p agent --example hardening_figures -- status [callers] [body_kib]
//! cargo run -p agent --example hardening_figures -- dns [queries] [per_second]
//! cargo run -p agent --example hardening_figures -- xds [megabytes]
//! ```
//!
//! `status`: a fake Envoy admin serves a `/stats/prometheus` body of `body_kib` KiB (4096); that
//! many callers (300) open the status port, send a scrape and never read.
//! `dns`: `queries` (20000) UDP queries at `per_second` (4000) to the DNS proxy, whose only
//! resolver never answers.
//! `xds`: a child process, on the xDS proxy's Unix socket as Envoy, sends one `DiscoveryRequest`
//! of `megabytes` MB (200); the same child is pilot-discovery, counting what reaches it (see
//! `hardening/xds.rs`).

#[path = "hardening/xds.rs"]
mod xds;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::dns::{DnsMetrics, LocalDnsServer, ProxyDomain, ResolvConf};
use agent::readiness::XdsStatus;
use agent::status::{StatusServer, StatusServerOptions};
use prometheus_client::registry::Registry;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;

fn status_line(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0)
}

fn rss_mib() -> f64 {
    status_line("VmRSS:") as f64 / 1024.0
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn arg(n: usize, default: u64) -> u64 {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

async fn status(callers: u64, body_kib: u64) {
    let line = "envoy_cluster_upstream_cx_total{cluster_name=\"outbound|80||svc.ns.svc.cluster.local\"} 1\n";
    let mut body = String::new();
    while body.len() < (body_kib * 1024) as usize {
        body.push_str(line);
    }
    let body = axum::body::Bytes::from(body);
    let app = axum::Router::new().route(
        "/stats/prometheus",
        axum::routing::get(move || {
            let body = body.clone();
            async move { body }
        }),
    );
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
    let admin_port = admin.local_addr().expect("admin addr").port();
    tokio::spawn(async move { axum::serve(admin, app).await });

    let (_xds, xds_rx) = watch::channel(XdsStatus::default());
    let (shutdown, _) = watch::channel(false);
    let options = StatusServerOptions {
        status_port: 0,
        admin_port,
        ..Default::default()
    };
    let server = StatusServer::new(options, xds_rx, Arc::new(Registry::default()), shutdown).expect("status server");
    let listener = server.bind().await.expect("bind status");
    let port = listener.local_addr().expect("status addr").port();
    tokio::spawn(server.serve(listener, std::future::pending()));

    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_mib();
    let mut held = Vec::new();
    for _ in 0..callers {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        s.write_all(b"GET /stats/prometheus HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("send");
        held.push(s);
    }
    let mut peak = before;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(rss_mib());
    }
    let after = rss_mib();
    println!(
        "status: {callers} callers not reading, Envoy body {body_kib} KiB: VmRSS {before:.1} MiB before, peak {peak:.1} MiB, {after:.1} MiB after 15 s (+{:.1} MiB)",
        peak - before
    );
    println!(
        "{{\"case\":\"status\",\"callers\":{callers},\"body_kib\":{body_kib},\"rss_before_mib\":{before:.1},\"rss_peak_mib\":{peak:.1},\"rss_after_mib\":{after:.1}}}"
    );
    drop(held);
}

async fn dns(queries: u64, per_second: u64) {
    // a resolver that takes queries and never answers
    let blackhole = UdpSocket::bind("127.0.0.1:0").await.expect("bind upstream");
    let upstream = blackhole.local_addr().expect("upstream addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        while blackhole.recv_from(&mut buf).await.is_ok() {}
    });
    let port = {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").expect("probe port");
        probe.local_addr().expect("probe addr").port()
    };
    let resolv = ResolvConf {
        servers: vec![upstream],
        search: vec![],
    };
    let server = Arc::new(LocalDnsServer::new(
        ProxyDomain::new("ns", "ns.svc.cluster.local"),
        resolv,
        false,
        DnsMetrics::default(),
    ));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let _tasks = server.serve(&[addr]).await.expect("serve dns");

    tokio::time::sleep(Duration::from_millis(200)).await;
    let (before, fds_before) = (rss_mib(), open_fds());
    let client = UdpSocket::bind("127.0.0.1:0").await.expect("client");
    let gap = Duration::from_secs_f64(1.0 / per_second as f64);
    let started = Instant::now();
    let (mut peak, mut peak_fds) = (before, fds_before);
    for i in 0..queries {
        let id = (i % 65536) as u16;
        let mut query = id.to_be_bytes().to_vec();
        // RD, one question: q<i>.example.com A IN
        query.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        let label = format!("q{i}");
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
        query.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
        let _ = client.send_to(&query, addr).await;
        if i % 200 == 0 {
            peak = peak.max(rss_mib());
            peak_fds = peak_fds.max(open_fds());
        }
        let due = gap * (i as u32 + 1);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    peak = peak.max(rss_mib());
    peak_fds = peak_fds.max(open_fds());
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (after, fds_after) = (rss_mib(), open_fds());
    println!(
        "dns: {queries} queries at {per_second}/s to a resolver that never answers: VmRSS {before:.1} MiB before, peak {peak:.1} MiB, {after:.1} MiB 12 s after; descriptors {fds_before} before, peak {peak_fds}, {fds_after} after"
    );
    println!(
        "{{\"case\":\"dns\",\"queries\":{queries},\"per_second\":{per_second},\"rss_before_mib\":{before:.1},\"rss_peak_mib\":{peak:.1},\"rss_after_mib\":{after:.1},\"fds_before\":{fds_before},\"fds_peak\":{peak_fds},\"fds_after\":{fds_after}}}"
    );
}

#[tokio::main]
async fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("status") => status(arg(2, 300), arg(3, 4096)).await,
        Some("dns") => dns(arg(2, 20_000), arg(3, 4_000)).await,
        Some("xds") => xds::run(arg(2, 200)).await,
        Some("xds-peer") => {
            let uds = std::env::args().nth(2).unwrap_or_default();
            xds::peer(uds.into(), arg(3, 0) as u16, arg(4, 200)).await
        }
        _ => eprintln!(
            "usage: hardening_figures status [callers] [body_kib] | dns [queries] [per_second] | xds [megabytes]"
        ),
    }
}
