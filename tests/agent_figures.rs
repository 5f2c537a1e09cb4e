//! `agent-figures`: pilot-agent's performance figures, measured by hand (a program, not a timed
//! test; see docs/perf.md): time from `pilot-agent proxy` start to `/healthz/ready` 200, the
//! agent's RSS with Envoy connected, and the latency the xDS proxy adds per forwarded message.
//! Prints a table, then the figures as one JSON line (`--json`: only that line).
//! Flags: `--runs N` (5), `--messages M` (2000), `--clusters C` (100), `--nagle` (the fake
//! pilot-discovery leaves Nagle's algorithm on, as tonic's `serve_with_incoming` does).

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent::xds_proxy::{XdsProxy, XdsProxyConfig};
use anyhow::{Context, bail};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use test_support::agent::{Agent, AgentOptions};
use test_support::backend::{Backend, http_get};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::envoy::workspace_root;
use test_support::figures::{memory_kib, rank, round, sorted};
use test_support::ports::free_port;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use xds_api::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy};
use xds_api::envoy::config::cluster::v3::{CircuitBreakers, Cluster};
use xds_api::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use xds_api::envoy::config::core::v3::{AggregatedConfigSource, ApiVersion, ConfigSource, Metadata, Node};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::pbwkt::{self, Any};
use xds_api::type_url::CLUSTER;

/// Marks the re-run child that already looks up this profile's binaries.
const PROFILE_ENV: &str = "AGENT_FIGURES_PROFILE";
/// Responses per path not counted: connection setup and first-use allocations.
const WARM_UP: usize = 100;

struct Args {
    runs: usize,
    messages: usize,
    clusters: usize,
    json_only: bool,
    nagle: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        runs: 5,
        messages: 2000,
        clusters: 100,
        json_only: false,
        nagle: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut number = |name: &str| -> anyhow::Result<usize> {
            let v = it.next().with_context(|| format!("{name} needs a value"))?;
            v.parse().with_context(|| format!("{name} {v}: not a number"))
        };
        match flag.as_str() {
            "--runs" => args.runs = number("--runs")?.max(1),
            "--messages" => args.messages = number("--messages")?.max(1),
            "--clusters" => args.clusters = number("--clusters")?,
            "--json" => args.json_only = true,
            "--nagle" => args.nagle = true,
            other => bail!("unknown flag {other} (flags: --runs N --messages M --clusters C --json --nagle)"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<ExitCode> {
    let args = parse_args()?;
    if let Some(code) = rerun_with_release_binaries()? {
        return Ok(code);
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let figures = runtime.block_on(measure(&args))?;
    if !args.json_only {
        print_table(&figures);
    }
    println!("{figures}");
    Ok(ExitCode::SUCCESS)
}

/// test-support runs `<target>/debug/{pilot-agent,pilot-discovery}`. A release build of this
/// program measures the release binaries: it re-runs itself with `CARGO_TARGET_DIR` naming a
/// temporary directory whose `debug` links to `<target>/release` (only for those lookups: both
/// binaries must exist, so test-support never builds into it).
fn rerun_with_release_binaries() -> anyhow::Result<Option<ExitCode>> {
    if cfg!(debug_assertions) || std::env::var_os(PROFILE_ENV).is_some() {
        return Ok(None);
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root()?.join("target"),
    };
    let release = target.join("release");
    for bin in ["pilot-agent", "pilot-discovery"] {
        if !release.join(bin).exists() {
            bail!(
                "{} is missing (hint: cargo build --release -p agent --bin pilot-agent -p pilot-discovery --bin pilot-discovery)",
                release.join(bin).display()
            );
        }
    }
    let link = tempfile::tempdir()?;
    std::os::unix::fs::symlink(&release, link.path().join("debug"))?;
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env("CARGO_TARGET_DIR", link.path())
        .env(PROFILE_ENV, "release")
        .status()?;
    Ok(Some(ExitCode::from(
        status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1),
    )))
}

async fn measure(args: &Args) -> anyhow::Result<Value> {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    // Other builds on a shared machine show up here; read before the runs.
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = loadavg.split_whitespace().next().and_then(|l| l.parse::<f64>().ok());
    let startup = measure_startup(args.runs).await?;
    let xds = measure_xds(args.messages, args.clusters, args.nagle).await?;
    Ok(json!({
        "profile": profile,
        "loadavg_1m_before": load,
        "cores": std::thread::available_parallelism().map(usize::from).unwrap_or(0),
        "startup": startup,
        "xds": xds,
    }))
}

// ---- figures 1 and 2: time to ready, memory ----

async fn measure_startup(runs: usize) -> anyhow::Result<Value> {
    let mut backends = BTreeMap::new();
    for name in ["reviews-v1", "reviews-v2", "ratings", "slow"] {
        backends.insert(name, Backend::start(name).await?);
    }
    let gateway_port = free_port();
    let dir = tempfile::tempdir()?;
    common::write_mesh_config(dir.path(), gateway_port, &backends)?;
    // the gateway's identity from pilot-discovery's CA, as an Istio gateway's
    let ca = test_support::mesh_ca::MeshCa::loopback()?;
    let discovery = Discovery::start(dir.path(), ca.serve(DiscoveryOptions::default())).await?;
    let (mut ready_ms, mut rss, mut hwm, mut envoy_rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut agent = Agent::start(ca.agent(AgentOptions::ingress_gateway(discovery.grpc_addr))).await?;
        let run = startup_run(&mut agent, gateway_port).await;
        // Also on failure: a killed agent would leave its Envoy running.
        stop(&mut agent).await?;
        let (ready, agent_rss, agent_hwm, envoy) = run?;
        ready_ms.push(ready);
        rss.push(agent_rss);
        hwm.push(agent_hwm);
        envoy_rss.push(envoy);
    }
    Ok(json!({
        "runs": runs,
        "ready_ms": spread(&ready_ms),
        "agent_rss_kib": spread(&rss),
        "agent_hwm_kib": spread(&hwm),
        "envoy_rss_kib": spread(&envoy_rss),
    }))
}

/// One agent's time to ready (ms), and its RSS, its peak RSS and its Envoy's RSS (KiB) once routing.
async fn startup_run(agent: &mut Agent, gateway_port: u16) -> anyhow::Result<(f64, f64, f64, f64)> {
    // `wait_ready` starts its clock right after the spawn and polls every 20ms.
    let ready = agent.wait_ready(Duration::from_secs(30)).await?;
    wait_routed(agent, gateway_port).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss, hwm) = memory_kib(agent.pid().context("pilot-agent exited")?)?;
    let envoys = agent.envoy_pids();
    anyhow::ensure!(envoys.len() == 1, "expected one Envoy, found {envoys:?}");
    let envoy = memory_kib(envoys[0])?.0;
    Ok((ready.as_secs_f64() * 1e3, rss as f64, hwm as f64, envoy as f64))
}

/// Until the gateway answers /reviews: Envoy has its listeners, routes and clusters.
async fn wait_routed(agent: &Agent, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = format!("http://127.0.0.1:{port}/reviews");
    while !http_get(&url, &[("host", common::HOST)])
        .await
        .is_ok_and(|r| r.status == 200)
    {
        if Instant::now() > deadline {
            bail!("the gateway never routed /reviews:\n{}", agent.logs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// SIGTERM and wait: the agent drains and stops Envoy, freeing the gateway port for the next run.
async fn stop(agent: &mut Agent) -> anyhow::Result<()> {
    if let Some(pid) = agent.pid() {
        Agent::signal(pid, "TERM")?;
    }
    let exited = agent.wait_exit(Duration::from_secs(20)).await;
    for pid in agent.envoy_pids() {
        Agent::signal(pid, "KILL")?;
    }
    exited.map(drop)
}

// ---- figure 3: latency added per forwarded xDS message ----

/// A fake pilot-discovery: on each SotW stream it sends CDS responses of `payload`, the next one
/// when the previous is ACKed, `total` in all, noting when each left and each ACK arrived.
struct FakePilot {
    payload: Arc<Vec<Any>>,
    total: usize,
    stamps: Arc<Mutex<Stamps>>,
}

/// One side's clock readings on one stream, by sequence number (the response nonce): when each
/// response and each ACK passed this side (the fake: sent, received; the client: received, sent).
#[derive(Default)]
struct Stamps {
    responses: Vec<Instant>,
    acks: Vec<Instant>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakePilot {
    type StreamAggregatedResourcesStream = UnboundedReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (payload, total, stamps) = (self.payload.clone(), self.total, self.stamps.clone());
        tokio::spawn(push_on_ack(request.into_inner(), tx, payload, total, stamps));
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("the figures use SotW"))
    }
}

async fn push_on_ack(
    mut requests: Streaming<DiscoveryRequest>,
    tx: mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>,
    payload: Arc<Vec<Any>>,
    total: usize,
    stamps: Arc<Mutex<Stamps>>,
) {
    let mut next = 0usize;
    while let Ok(Some(req)) = requests.message().await {
        let at = Instant::now();
        let lock = || stamps.lock().unwrap_or_else(|e| e.into_inner());
        if !req.response_nonce.is_empty() {
            lock().acks.push(at);
        }
        if next == total {
            continue;
        }
        let resp = DiscoveryResponse {
            version_info: next.to_string(),
            type_url: CLUSTER.to_owned(),
            nonce: next.to_string(),
            resources: payload.to_vec(),
            ..Default::default()
        };
        lock().responses.push(Instant::now());
        if tx.send(Ok(resp)).is_err() {
            return;
        }
        next += 1;
    }
}

/// The "Envoy": receives `total` responses on one stream and ACKs each at once.
/// Returns when each response arrived and when each ACK left.
async fn envoy_stream(endpoint: Endpoint, total: usize, stamps: &Mutex<Stamps>) -> anyhow::Result<Stamps> {
    let channel = endpoint.connect().await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let (tx, rx) = mpsc::unbounded_channel();
    let node = Node {
        id: "sidecar~127.0.0.1~bench.default~default.svc.cluster.local".into(),
        ..Default::default()
    };
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: CLUSTER.into(),
        ..Default::default()
    })?;
    let mut responses = client
        .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut mine = Stamps::default();
    for seq in 0..total {
        let resp = responses.message().await?.context("the stream ended early")?;
        mine.responses.push(Instant::now());
        anyhow::ensure!(
            resp.nonce == seq.to_string(),
            "response {} out of order (expected {seq})",
            resp.nonce
        );
        let ack = DiscoveryRequest {
            version_info: resp.version_info,
            response_nonce: resp.nonce,
            type_url: resp.type_url,
            ..Default::default()
        };
        mine.acks.push(Instant::now());
        tx.send(ack)?;
    }
    // Keep the stream open until the upstream has seen the last ACK.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stamps.lock().unwrap_or_else(|e| e.into_inner()).acks.len() < total {
        anyhow::ensure!(Instant::now() < deadline, "the upstream never saw the last ACK");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(mine)
}

/// Per-message latencies (µs) of one path, without the warm-up: pilot→Envoy and Envoy→pilot.
async fn path_latencies(
    endpoint: Endpoint,
    total: usize,
    stamps: &Mutex<Stamps>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    *stamps.lock().unwrap_or_else(|e| e.into_inner()) = Stamps::default();
    let envoy = envoy_stream(endpoint, total, stamps).await?;
    let upstream = std::mem::take(&mut *stamps.lock().unwrap_or_else(|e| e.into_inner()));
    let micros = |from: &[Instant], to: &[Instant]| -> Vec<f64> {
        from.iter()
            .zip(to)
            .skip(WARM_UP)
            .map(|(a, b)| b.duration_since(*a).as_secs_f64() * 1e6)
            .collect()
    };
    Ok((
        micros(&upstream.responses, &envoy.responses),
        micros(&envoy.acks, &upstream.acks),
    ))
}

async fn measure_xds(messages: usize, clusters: usize, nagle: bool) -> anyhow::Result<Value> {
    let payload: Vec<Any> = (0..clusters).map(|i| xds_api::pack(&cluster(i))).collect();
    let payload_bytes: usize = payload.iter().map(|a| a.value.len() + a.type_url.len()).sum();
    // Two blocks per path, in the order direct, agent, agent, direct, so that drift in the
    // machine's load (2 cores, shared) falls on both alike.
    let block = messages.div_ceil(2);
    let total = block + WARM_UP;
    let stamps = Arc::new(Mutex::new(Stamps::default()));
    let service = FakePilot {
        payload: Arc::new(payload),
        total,
        stamps: stamps.clone(),
    };
    // The fake pilot on its own runtime (one thread), as pilot-discovery is its own process.
    let pilot_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let server = Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(service).max_decoding_message_size(usize::MAX));
    pilot_rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        // tonic ignores `tcp_nodelay` for a given listener: set it per connection (`--nagle`: not).
        let incoming = TcpListenerStream::new(listener).map(move |conn| {
            if let Ok(conn) = &conn {
                let _ = conn.set_nodelay(!nagle);
            }
            conn
        });
        server.serve_with_incoming(incoming).await?;
        anyhow::Ok(())
    });
    let dir = tempfile::tempdir()?;
    let uds = dir.path().join("etc/istio/proxy/XDS");
    let proxy = XdsProxy::start(XdsProxyConfig::new(&uds, addr.to_string()), &mut Registry::default()).await?;
    let (mut direct, mut proxied) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for via_agent in [false, true, true, false] {
        let endpoint = match via_agent {
            true => Endpoint::from_shared(format!("unix://{}", uds.display()))?,
            false => Endpoint::from_shared(format!("http://{addr}"))?,
        };
        let (down, up) = path_latencies(endpoint, total, &stamps).await?;
        let path = if via_agent { &mut proxied } else { &mut direct };
        path.0.extend(down);
        path.1.extend(up);
    }
    proxy.shutdown().await;
    pilot_rt.shutdown_background();
    let figures = |(down, up): &(Vec<f64>, Vec<f64>)| json!({"down_us": percentiles(down), "up_us": percentiles(up)});
    let (direct, proxied) = (figures(&direct), figures(&proxied));
    let added = |dir: &str| {
        let pick = |v: &Value, p: &str| v[dir][p].as_f64().unwrap_or(f64::NAN);
        let diff = |p: &str| round(pick(&proxied, p) - pick(&direct, p));
        json!({"p50": diff("p50"), "p99": diff("p99")})
    };
    Ok(json!({
        "messages": 2 * block,
        "upstream_nodelay": !nagle,
        "clusters_per_response": clusters,
        "payload_bytes": payload_bytes,
        "direct": direct,
        "via_agent": proxied,
        "added_us": {"down": added("down_us"), "up": added("up_us")},
    }))
}

/// An outbound EDS cluster shaped like Istio's: ADS EDS config, circuit breakers, service metadata.
fn cluster(i: usize) -> Cluster {
    let host = format!("svc-{i}.ns-{}.svc.cluster.local", i % 10);
    let name = format!("outbound|8080||{host}");
    let max = Some(pbwkt::UInt32Value { value: u32::MAX });
    let string = |s: &str| pbwkt::Value {
        kind: Some(pbwkt::value::Kind::StringValue(s.to_owned())),
    };
    let service = pbwkt::Struct {
        fields: [("host", host.as_str()), ("name", "svc"), ("namespace", "ns")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), string(v)))
            .collect(),
    };
    let services = pbwkt::Value {
        kind: Some(pbwkt::value::Kind::ListValue(pbwkt::ListValue {
            values: vec![pbwkt::Value {
                kind: Some(pbwkt::value::Kind::StructValue(service)),
            }],
        })),
    };
    let istio = pbwkt::Struct {
        fields: [("services".to_owned(), services)].into_iter().collect(),
    };
    Cluster {
        name: name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            service_name: name,
            eds_config: Some(ConfigSource {
                config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource::default())),
                initial_fetch_timeout: Some(pbwkt::Duration::default()),
                resource_api_version: ApiVersion::V3 as i32,
                ..Default::default()
            }),
        }),
        connect_timeout: Some(pbwkt::Duration { seconds: 10, nanos: 0 }),
        lb_policy: LbPolicy::LeastRequest as i32,
        circuit_breakers: Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_connections: max,
                max_pending_requests: max,
                max_requests: max,
                max_retries: max,
                track_remaining: true,
                ..Default::default()
            }],
            ..Default::default()
        }),
        metadata: Some(Metadata {
            filter_metadata: [("istio".to_owned(), istio)].into_iter().collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---- statistics and output ----

fn spread(v: &[f64]) -> Value {
    let s = sorted(v);
    let all: Vec<f64> = v.iter().copied().map(round).collect();
    json!({"min": round(rank(&s, 0.0)), "median": round(rank(&s, 50.0)), "max": round(rank(&s, 100.0)), "all": all})
}

fn percentiles(v: &[f64]) -> Value {
    let s = sorted(v);
    json!({"p50": round(rank(&s, 50.0)), "p99": round(rank(&s, 99.0)), "max": round(rank(&s, 100.0))})
}

fn print_table(f: &Value) {
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let s = &f["startup"];
    let x = &f["xds"];
    let mib = |v: &Value| num(v) / 1024.0;
    println!(
        "pilot-agent figures ({} binaries, {} cores, 1-minute load average {} before the runs)",
        f["profile"].as_str().unwrap_or("?"),
        f["cores"],
        f["loadavg_1m_before"]
    );
    println!("{:<44} {:>10} {:>10} {:>10}", "figure", "min", "median", "max");
    let row = |name: &str, v: &Value, scale: &dyn Fn(&Value) -> f64| {
        println!(
            "{name:<44} {:>10.1} {:>10.1} {:>10.1}",
            scale(&v["min"]),
            scale(&v["median"]),
            scale(&v["max"])
        );
    };
    row(
        &format!("start to /healthz/ready, ms ({} runs)", s["runs"]),
        &s["ready_ms"],
        &num,
    );
    row("pilot-agent VmRSS, Envoy connected, MiB", &s["agent_rss_kib"], &mib);
    row("pilot-agent VmHWM (peak RSS), MiB", &s["agent_hwm_kib"], &mib);
    row("Envoy VmRSS (context), MiB", &s["envoy_rss_kib"], &mib);
    println!();
    println!(
        "xDS, {} CDS responses of {} clusters ({:.1} KiB), each sent when the last is ACKed; µs",
        x["messages"],
        x["clusters_per_response"],
        num(&x["payload_bytes"]) / 1024.0
    );
    println!("{:<44} {:>10} {:>10} {:>10}", "path", "p50", "p99", "max");
    for (name, v) in [
        ("pilot→Envoy direct (TCP loopback)", &x["direct"]["down_us"]),
        ("pilot→Envoy via pilot-agent (TCP + UDS)", &x["via_agent"]["down_us"]),
        ("Envoy→pilot ACK direct", &x["direct"]["up_us"]),
        ("Envoy→pilot ACK via pilot-agent", &x["via_agent"]["up_us"]),
    ] {
        println!(
            "{name:<44} {:>10.0} {:>10.0} {:>10.0}",
            num(&v["p50"]),
            num(&v["p99"]),
            num(&v["max"])
        );
    }
    for (name, v) in [
        ("added by the agent, pilot→Envoy", &x["added_us"]["down"]),
        ("added by the agent, Envoy→pilot", &x["added_us"]["up"]),
    ] {
        println!("{name:<44} {:>10.0} {:>10.0}", num(&v["p50"]), num(&v["p99"]));
    }
}
