//! Target `dns_message`: pilot-agent's DNS proxy (`agent::dns::LocalDnsServer`, Istio's
//! `pkg/dns/client`) on its real UDP and TCP sockets, handling the messages a workload in the pod
//! sends: parsing, answering from the NDS name table (reviews, ratings, a headless service), or
//! forwarding to the pod's resolver, here a stub on loopback whose answer the input also gives.
//! Any message is answered or dropped; an answer parses, carries the query's ID, is a response,
//! and over UDP fits the size asked or is flagged truncated.
//!
//! Input: `[mode]` then chunks (`input::chunks`). Mode bit 0: TCP (every message on one
//! connection, length-prefixed) instead of one UDP datagram each. Chunk tag bit 0 clear: a message
//! from the workload; set: the resolver's answer to forwarded queries (the first such chunk; its
//! first two bytes are replaced by the query's ID, so it is taken as the answer; without one the
//! resolver echoes the query as a response).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent::dns::{DnsMetrics, LocalDnsServer, ProxyDomain, ResolvConf};
use hickory_proto::op::{Message, MessageType};
use istio_api::nds::NameTable;
use istio_api::nds::name_table::NameInfo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::input::chunks;

/// Longest one message may take to be answered (the stub resolver answers at once).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// The classic UDP size, as the proxy uses without EDNS.
const UDP_SIZE: usize = 512;
/// Largest answer the stub sends over UDP (a datagram's payload limit, with room).
const MAX_STUB_ANSWER: usize = 65_000;

struct Harness {
    rt: tokio::runtime::Runtime,
    proxy: SocketAddr,
    /// What the stub resolver answers; `None`: the query echoed as a response.
    stub_answer: Arc<Mutex<Option<Vec<u8>>>>,
    _server: Arc<LocalDnsServer>,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The stub's answer to `query`: the input's answer (or the query, flagged a response) with the
/// query's ID.
fn stub_reply(query: &[u8], answer: Option<&[u8]>) -> Vec<u8> {
    let id = query.get(..2).unwrap_or(&[0, 0]);
    let mut out = id.to_vec();
    match answer {
        Some(a) => out.extend_from_slice(a.get(2..).unwrap_or_default()),
        None => {
            out.extend_from_slice(query.get(2..).unwrap_or_default());
            if let Some(flags) = out.get_mut(2) {
                *flags |= 0x80;
            }
        }
    }
    out.truncate(MAX_STUB_ANSWER);
    out
}

/// The pod's resolver: UDP and TCP on one loopback port.
async fn stub_resolver(answer: Arc<Mutex<Option<Vec<u8>>>>) -> SocketAddr {
    for _ in 0..20 {
        let Ok(udp) = UdpSocket::bind("127.0.0.1:0").await else {
            continue;
        };
        let Ok(addr) = udp.local_addr() else { continue };
        let Ok(tcp) = TcpListener::bind(addr).await else {
            continue;
        };
        let a = answer.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65535];
            while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
                let reply = stub_reply(&buf[..n], lock(&a).as_deref());
                let _ = udp.send_to(&reply, peer).await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                let a = answer.clone();
                tokio::spawn(async move {
                    let Ok(n) = s.read_u16().await else { return };
                    let mut query = vec![0u8; usize::from(n)];
                    if s.read_exact(&mut query).await.is_err() {
                        return;
                    }
                    let reply = stub_reply(&query, lock(&a).as_deref());
                    let len = u16::try_from(reply.len()).unwrap_or(u16::MAX);
                    let mut framed = len.to_be_bytes().to_vec();
                    framed.extend_from_slice(&reply[..usize::from(len)]);
                    let _ = s.write_all(&framed).await;
                });
            }
        });
        return addr;
    }
    panic!("no loopback port for the stub resolver");
}

fn name_table() -> NameTable {
    let mut nt = NameTable::default();
    let mut add = |host: &str, ips: &[&str], short: &str| {
        nt.table.insert(
            host.into(),
            NameInfo {
                ips: ips.iter().map(|s| s.to_string()).collect(),
                registry: "Kubernetes".into(),
                shortname: short.into(),
                namespace: "default".into(),
                ..Default::default()
            },
        );
    };
    add("reviews.default.svc.cluster.local", &["240.240.0.10"], "reviews");
    add(
        "ratings.default.svc.cluster.local",
        &["240.240.0.11", "2001:db8::11"],
        "ratings",
    );
    add(
        "db.default.svc.cluster.local",
        &["10.0.0.5", "10.0.0.6", "10.0.0.7"],
        "db",
    );
    add("api.example.com", &["240.240.0.20"], "");
    nt
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = crate::harness_runtime();
        let stub_answer = Arc::new(Mutex::new(None));
        let (proxy, server, tasks) = rt.block_on(async {
            let stub = stub_resolver(stub_answer.clone()).await;
            let resolv = ResolvConf {
                servers: vec![stub],
                search: vec![
                    "default.svc.cluster.local".into(),
                    "svc.cluster.local".into(),
                    "cluster.local".into(),
                ],
            };
            let server = Arc::new(
                LocalDnsServer::new(
                    ProxyDomain::new("default", "default.svc.cluster.local"),
                    resolv,
                    false,
                    DnsMetrics::default(),
                )
                // A resolver reply the proxy cannot take (not a response) is waited out: briefly,
                // so that libFuzzer does not report the input as a slow unit.
                .with_upstream_timeout(Duration::from_millis(300)),
            );
            server.update(&name_table());
            for _ in 0..20 {
                let port = std::net::UdpSocket::bind("127.0.0.1:0")
                    .and_then(|s| s.local_addr())
                    .map(|a| a.port())
                    .unwrap_or_else(|e| panic!("a loopback port: {e}"));
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                if let Ok(tasks) = server.clone().serve(&[addr]).await {
                    return (addr, server, tasks);
                }
            }
            panic!("no loopback port for the DNS proxy");
        });
        Harness {
            rt,
            proxy,
            stub_answer,
            _server: server,
            _tasks: tasks,
        }
    })
}

/// An answer of the proxy to `query` as the protocol wants it.
fn check_answer(query: &Message, answer: &[u8], udp_max: Option<usize>) {
    let parsed = Message::from_vec(answer).unwrap_or_else(|e| panic!("the proxy's answer does not parse: {e}"));
    assert_eq!(
        parsed.metadata.id, query.metadata.id,
        "the answer carries the query's ID"
    );
    assert_eq!(parsed.metadata.message_type, MessageType::Response, "{parsed:?}");
    if let Some(max) = udp_max {
        assert!(
            answer.len() <= max || parsed.metadata.truncation,
            "a {} byte UDP answer over the {max} bytes asked is not flagged truncated",
            answer.len()
        );
    }
}

pub fn dns_message(data: &[u8]) {
    exchange(data);
}

/// Sends the input's messages; returns how many were answered.
pub(crate) fn exchange(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let h = harness();
    let tcp = mode & 1 == 1;
    let parts = chunks(rest);
    let answer = parts.iter().find(|c| c.tag & 1 == 1).map(|c| c.bytes.to_vec());
    *lock(&h.stub_answer) = answer;
    let messages: Vec<&[u8]> = parts.iter().filter(|c| c.tag & 1 == 0).map(|c| c.bytes).collect();
    h.rt.block_on(async {
        if tcp {
            over_tcp(h.proxy, &messages).await
        } else {
            over_udp(h.proxy, &messages).await
        }
    })
}

async fn over_udp(proxy: SocketAddr, messages: &[&[u8]]) -> usize {
    let client = UdpSocket::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("client socket: {e}"));
    let mut answered = 0;
    let mut buf = vec![0u8; 65535];
    for m in messages {
        if client.send_to(m, proxy).await.is_err() {
            continue;
        }
        // a packet that does not parse is dropped (and counted); anything else is answered
        let Ok(query) = Message::from_vec(m) else { continue };
        let max = query
            .edns
            .as_ref()
            .map_or(UDP_SIZE, |e| usize::from(e.max_payload()).max(UDP_SIZE));
        let n = match tokio::time::timeout(ANSWER_WITHIN, client.recv(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => panic!("receiving the answer: {e}"),
            Err(_) => panic!("no answer within {ANSWER_WITHIN:?} to a query that parses: {query:?}"),
        };
        check_answer(&query, &buf[..n], Some(max));
        answered += 1;
    }
    answered
}

async fn over_tcp(proxy: SocketAddr, messages: &[&[u8]]) -> usize {
    let mut s = TcpStream::connect(proxy)
        .await
        .unwrap_or_else(|e| panic!("connecting to the DNS proxy: {e}"));
    let mut answered = 0;
    for m in messages {
        let len = u16::try_from(m.len()).unwrap_or(u16::MAX);
        let mut framed = len.to_be_bytes().to_vec();
        framed.extend_from_slice(&m[..usize::from(len)]);
        if s.write_all(&framed).await.is_err() {
            break;
        }
        let reply = tokio::time::timeout(ANSWER_WITHIN, async {
            let n = s.read_u16().await?;
            let mut answer = vec![0u8; usize::from(n)];
            s.read_exact(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        })
        .await
        .unwrap_or_else(|_| panic!("the proxy neither answered nor closed within {ANSWER_WITHIN:?}"));
        match (Message::from_vec(&m[..usize::from(len)]), reply) {
            (Ok(query), Ok(answer)) => {
                check_answer(&query, &answer, None);
                answered += 1;
            }
            // a message that does not parse closes the connection, as miekg/dns does
            (Err(_), Err(_)) => break,
            (Ok(query), Err(e)) => panic!("the connection closed ({e}) instead of answering {query:?}"),
            (Err(e), Ok(answer)) => panic!("a message that does not parse ({e}) was answered: {answer:?}"),
        }
    }
    answered
}

/// Queries a pod sends: mesh names (full, short, search-list forms), external names forwarded,
/// other types, EDNS, TCP, a truncated resolver answer, and a packet that does not parse.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    use crate::input::join;
    use hickory_proto::op::{Edns, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let query = |id: u16, name: &str, t: RecordType, edns: Option<u16>| -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        let name = Name::from_ascii(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        m.add_query(Query::query(name, t));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m.to_vec().unwrap_or_else(|e| panic!("{e}"))
    };
    let truncated_answer = {
        let mut m = Message::response(7, OpCode::Query);
        m.metadata.truncation = true;
        m.to_vec().unwrap_or_else(|e| panic!("{e}"))
    };
    vec![
        // UDP: a mesh name, A
        [
            vec![0],
            join(&[(0, query(1, "reviews.default.svc.cluster.local.", RecordType::A, None))]),
        ]
        .concat(),
        // UDP: short and search-list names, AAAA, EDNS
        [
            vec![0],
            join(&[
                (0, query(2, "ratings.", RecordType::AAAA, Some(1232))),
                (0, query(3, "db.default.", RecordType::A, None)),
                (0, query(4, "api.example.com.", RecordType::A, Some(4096))),
            ]),
        ]
        .concat(),
        // UDP: forwarded (not the mesh's; a TXT), the resolver's answer echoed
        [
            vec![0],
            join(&[
                (0, query(5, "www.example.org.", RecordType::A, None)),
                (0, query(6, "reviews.default.svc.cluster.local.", RecordType::TXT, None)),
            ]),
        ]
        .concat(),
        // UDP: the resolver says truncated: the proxy asks again over TCP
        [
            vec![0],
            join(&[
                (1, truncated_answer),
                (0, query(7, "big.example.org.", RecordType::TXT, None)),
            ]),
        ]
        .concat(),
        // TCP: several queries on one connection
        [
            vec![1],
            join(&[
                (0, query(8, "reviews.", RecordType::A, None)),
                (0, query(9, "www.example.org.", RecordType::AAAA, None)),
                (0, query(10, "db.default.svc.cluster.local.", RecordType::A, None)),
            ]),
        ]
        .concat(),
        // a packet that does not parse, then a query
        [
            vec![0],
            join(&[
                (0, vec![0x12, 0x34, 0x01]),
                (0, query(11, "reviews.default.svc.", RecordType::A, None)),
            ]),
        ]
        .concat(),
    ]
}
