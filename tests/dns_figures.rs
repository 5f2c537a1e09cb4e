//! DNS proxy figures for docs/perf.md: the latency the agent's DNS proxy adds to a mesh lookup
//! (answered from the name table) and to a forwarded lookup (sent on to the pod's resolver), and
//! the memory its lookup table takes.
//!
//! In one process, on UDP loopback, three parts as three processes would be: a fake upstream
//! resolver (answers every A query from memory; its own single-thread runtime), an
//! `agent::dns::LocalDnsServer` serving a name table of `--hosts` services and forwarding to the
//! fake (its own runtime of 2 workers, as pilot-agent's), and a client on the main thread that
//! sends one query at a time on a blocking socket and waits for its answer. Three paths: the
//! client straight to the fake ("direct", what a pod without the proxy pays to a resolver that
//! answers at once), the client to the proxy for a mesh name, the client to the proxy for another
//! name. Blocks of `--queries` run in the order direct, mesh, forwarded, forwarded, mesh, direct;
//! each drops its first 100 as warm-up. "Added" is a path's percentile minus direct's.
//!
//! Prints a table, then the figures as one JSON line (`--json`: only that line).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use agent::dns::{DnsMetrics, LocalDnsServer, ProxyDomain, ResolvConf};
use anyhow::{Context, bail};
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use istio_api::nds::NameTable;
use istio_api::nds::name_table::NameInfo;
use serde_json::{Value, json};
use test_support::figures::{memory_kib, rank, round, sorted};
use tokio::net::UdpSocket;

const WARM_UP: usize = 100;

struct Args {
    hosts: usize,
    queries: usize,
    json_only: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        hosts: 1000,
        queries: 5000,
        json_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut number = || -> anyhow::Result<usize> {
            let v = it.next().with_context(|| format!("{flag} needs a number"))?;
            v.parse().with_context(|| format!("{flag} {v:?}: not a number"))
        };
        match flag.as_str() {
            "--hosts" => args.hosts = number()?,
            "--queries" => args.queries = number()?.max(WARM_UP + 1),
            "--json" => args.json_only = true,
            other => bail!("unknown flag {other} (flags: --hosts H --queries Q --json)"),
        }
    }
    Ok(args)
}

fn host(i: usize) -> String {
    format!("svc-{i}.ns-{}.svc.cluster.local", i % 50)
}

fn name_table(hosts: usize) -> NameTable {
    let mut nt = NameTable::default();
    for i in 0..hosts {
        nt.table.insert(
            host(i),
            NameInfo {
                ips: vec![format!("10.96.{}.{}", i / 250, i % 250 + 1)],
                registry: "Kubernetes".into(),
                shortname: format!("svc-{i}"),
                namespace: format!("ns-{}", i % 50),
                ..Default::default()
            },
        );
    }
    nt
}

/// The upstream resolver: every A query gets 203.0.113.7 at once.
async fn fake_upstream(rt: &tokio::runtime::Runtime) -> anyhow::Result<SocketAddr> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let addr = socket.local_addr()?;
    rt.spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::response(req.metadata.id, OpCode::Query);
            r.metadata.recursion_available = true;
            r.queries = req.queries.clone();
            if let Some(q) = req.queries.first() {
                r.add_answer(Record::from_rdata(
                    q.name().clone(),
                    30,
                    RData::A(A(Ipv4Addr::new(203, 0, 113, 7))),
                ));
            }
            if let Ok(bytes) = r.to_vec() {
                let _ = socket.send_to(&bytes, peer).await;
            }
        }
    });
    Ok(addr)
}

/// Sends `count` A queries for `name(i)` to `to`, one at a time; the round trips in µs (after
/// warm-up). Each answer is checked to carry one record.
fn block(to: SocketAddr, count: usize, name: impl Fn(usize) -> String) -> anyhow::Result<Vec<f64>> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(to)?;
    socket.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut buf = [0u8; 1500];
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let mut m = Message::new((i % 65536) as u16, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name(i))?, RecordType::A));
        let q = m.to_vec()?;
        let start = Instant::now();
        socket.send(&q)?;
        let n = socket.recv(&mut buf).context("no answer in 5 s")?;
        let took = start.elapsed().as_secs_f64() * 1e6;
        let r = Message::from_vec(&buf[..n])?;
        if r.answers.len() != 1 {
            bail!("{}: {} answers", name(i), r.answers.len());
        }
        if i >= WARM_UP {
            out.push(took);
        }
    }
    Ok(out)
}

fn vm_rss_kib() -> anyhow::Result<u64> {
    Ok(memory_kib(std::process::id())?.0)
}

fn percentiles(v: &[f64]) -> (f64, f64) {
    let s = sorted(v);
    (rank(&s, 50.0), rank(&s, 99.0))
}

fn main() -> anyhow::Result<ExitCode> {
    let args = parse_args()?;
    let upstream_rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let upstream = upstream_rt.block_on(fake_upstream(&upstream_rt))?;
    // the current-thread runtime runs its tasks only while a thread blocks on it
    let upstream_thread = std::thread::spawn(move || upstream_rt.block_on(std::future::pending::<()>()));
    let agent_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let table = name_table(args.hosts);

    let metrics = DnsMetrics::default();
    let rss_before = vm_rss_kib()?;
    let server = Arc::new(LocalDnsServer::new(
        ProxyDomain::new("default", "default.svc.cluster.local"),
        ResolvConf {
            servers: vec![upstream],
            search: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
                "cluster.local".into(),
            ],
        },
        false,
        metrics.clone(),
    ));
    server.update(&table);
    drop(table);
    let rss_table = vm_rss_kib()?.saturating_sub(rss_before);
    let proxy = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        socket.local_addr()?
    };
    let _tasks = agent_rt.block_on(server.clone().serve(&[proxy]))?;

    let n = args.queries;
    let hosts = args.hosts;
    let mesh = move |i: usize| host(i % hosts);
    let external = |i: usize| format!("name-{i}.example.com");
    let (mut direct, mut local, mut forwarded) = (Vec::new(), Vec::new(), Vec::new());
    direct.extend(block(upstream, n, external)?);
    local.extend(block(proxy, n, mesh)?);
    forwarded.extend(block(proxy, n, external)?);
    forwarded.extend(block(proxy, n, external)?);
    local.extend(block(proxy, n, mesh)?);
    direct.extend(block(upstream, n, external)?);
    let rss_after = vm_rss_kib()?;
    // the mesh names were answered by the proxy, the others went upstream
    let upstream_requests = metrics.upstream_requests.get();
    if upstream_requests != 2 * n as u64 {
        bail!("{upstream_requests} queries forwarded, expected {}", 2 * n);
    }
    drop(upstream_thread);

    let (d50, d99) = percentiles(&direct);
    let (m50, m99) = percentiles(&local);
    let (f50, f99) = percentiles(&forwarded);
    let figures = json!({
        "hosts": args.hosts,
        "queries_per_path": direct.len(),
        "direct_us": {"p50": round(d50), "p99": round(d99)},
        "mesh_us": {"p50": round(m50), "p99": round(m99)},
        "forwarded_us": {"p50": round(f50), "p99": round(f99)},
        "added_mesh_us": {"p50": round(m50 - d50), "p99": round(m99 - d99)},
        "added_forwarded_us": {"p50": round(f50 - d50), "p99": round(f99 - d99)},
        "table_rss_kib": rss_table,
        "process_rss_kib": rss_after,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if !args.json_only {
        print_table(&figures);
    }
    println!("{figures}");
    Ok(ExitCode::SUCCESS)
}

fn print_table(f: &Value) {
    println!(
        "DNS proxy ({} build), {} hosts in the name table, {} queries per path",
        f["profile"].as_str().unwrap_or("?"),
        f["hosts"],
        f["queries_per_path"]
    );
    println!("{:<34} {:>10} {:>10}", "path (µs per lookup)", "p50", "p99");
    for (label, key) in [
        ("direct to the resolver", "direct_us"),
        ("mesh name, through the proxy", "mesh_us"),
        ("other name, forwarded", "forwarded_us"),
        ("added: mesh", "added_mesh_us"),
        ("added: forwarded", "added_forwarded_us"),
    ] {
        println!("{label:<34} {:>10} {:>10}", f[key]["p50"], f[key]["p99"]);
    }
    println!(
        "lookup table: {} KiB RSS; whole process after the run: {} KiB",
        f["table_rss_kib"], f["process_rss_kib"]
    );
}
