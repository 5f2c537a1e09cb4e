use std::net::{Ipv4Addr, SocketAddr};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use istio_api::nds::name_table::NameInfo;

use super::*;

fn name_table() -> NameTable {
    let mut nt = NameTable::default();
    nt.table.insert(
        "reviews.default.svc.cluster.local".into(),
        NameInfo {
            ips: vec!["240.240.0.10".into()],
            registry: "Kubernetes".into(),
            shortname: "reviews".into(),
            namespace: "default".into(),
            ..Default::default()
        },
    );
    nt
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

/// A resolver on loopback UDP and TCP that answers `external.example.com` A 203.0.113.7 and
/// `big.example.com` TXT with 60 strings (truncated over UDP, whole over TCP); it counts queries.
async fn fake_upstream() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // a UDP port whose TCP twin is free too (another process may hold it: try again)
    let mut attempts = 0;
    let (udp, addr, tcp) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        match TcpListener::bind(addr).await {
            Ok(tcp) => break (udp, addr, tcp),
            Err(e) if attempts < 20 => {
                attempts += 1;
                eprintln!("fake upstream: TCP {addr}: {e}; another port");
            }
            Err(e) => panic!("fake upstream: no UDP port with a free TCP twin after 20 tries: {e}"),
        }
    };
    let count = Arc::new(AtomicUsize::new(0));
    let answer = |q: &[u8], over_udp: bool| -> Vec<u8> {
        let req = Message::from_vec(q).unwrap();
        let mut r = Message::response(req.metadata.id, OpCode::Query);
        r.queries = req.queries.clone();
        let name = req.queries[0].name().clone();
        match name.to_ascii().as_str() {
            "external.example.com." => {
                r.add_answer(Record::from_rdata(name, 60, RData::A(A(Ipv4Addr::new(203, 0, 113, 7)))));
            }
            "big.example.com." if over_udp => r.metadata.truncation = true,
            "big.example.com." => {
                let txt = TXT::new((0..60).map(|i| format!("chunk-{i:02}-of-a-long-answer")).collect());
                r.add_answer(Record::from_rdata(name, 60, RData::TXT(txt)));
            }
            _ => r.metadata.response_code = ResponseCode::NXDomain,
        }
        r.to_vec().unwrap()
    };
    let c = count.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
            c.fetch_add(1, Ordering::SeqCst);
            let _ = udp.send_to(&answer(&buf[..n], true), peer).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let n = s.read_u16().await.unwrap();
            let mut q = vec![0u8; usize::from(n)];
            s.read_exact(&mut q).await.unwrap();
            let a = answer(&q, false);
            let mut framed = (a.len() as u16).to_be_bytes().to_vec();
            framed.extend(a);
            s.write_all(&framed).await.unwrap();
        }
    });
    (addr, count)
}

fn server(upstream: SocketAddr) -> Arc<LocalDnsServer> {
    let resolv = ResolvConf {
        servers: vec![upstream],
        search: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
    };
    Arc::new(LocalDnsServer::new(
        ProxyDomain::new("default", "default.svc.cluster.local"),
        resolv,
        false,
        DnsMetrics::default(),
    ))
}

async fn ask(s: &LocalDnsServer, name: &str, qtype: RecordType, udp: bool) -> Message {
    let bytes = s.answer(&query(name, qtype).to_vec().unwrap(), udp).await.unwrap();
    Message::from_vec(&bytes).unwrap()
}

#[tokio::test]
async fn mesh_names_answered_here_others_forwarded() {
    let (upstream, count) = fake_upstream().await;
    let s = server(upstream);
    // before the first name table: forwarded, not failed
    let r = ask(&s, "external.example.com.", RecordType::A, true).await;
    assert_eq!(r.answers.len(), 1);
    s.update(&name_table());
    for name in ["reviews.default.svc.cluster.local.", "reviews.", "reviews.default."] {
        let r = ask(&s, name, RecordType::A, true).await;
        assert_eq!(r.metadata.id, 4242);
        assert!(r.metadata.authoritative, "{name}");
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert_eq!(r.answers.len(), 1, "{name}: {r:?}");
        assert_eq!(r.answers[0].data, RData::A(A(Ipv4Addr::new(240, 240, 0, 10))));
        assert_eq!(
            r.answers[0].name.to_ascii(),
            name,
            "answered under the asked name, no CNAME"
        );
    }
    let before = count.load(std::sync::atomic::Ordering::SeqCst);
    // AAAA of a v4-only mesh host: an empty NOERROR, not forwarded
    let r = ask(&s, "reviews.default.svc.cluster.local.", RecordType::AAAA, true).await;
    assert_eq!((r.metadata.response_code, r.answers.len()), (ResponseCode::NoError, 0));
    assert_eq!(
        count.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "mesh names never leave"
    );
    // the rest: upstream's answer
    let r = ask(&s, "external.example.com.", RecordType::A, true).await;
    assert_eq!(r.answers[0].data, RData::A(A(Ipv4Addr::new(203, 0, 113, 7))));
    assert_eq!(
        ask(&s, "nope.example.com.", RecordType::A, true)
            .await
            .metadata
            .response_code,
        ResponseCode::NXDomain
    );
    // truncated upstream answer over UDP: asked again over TCP, then too big for 512 bytes
    let r = ask(&s, "big.example.com.", RecordType::TXT, true).await;
    assert!(r.metadata.truncation && r.answers.is_empty(), "{r:?}");
    let r = ask(&s, "big.example.com.", RecordType::TXT, false).await;
    assert!(!r.metadata.truncation && r.answers.len() == 1);
    // with EDNS, a larger UDP answer fits
    let mut q = query("big.example.com.", RecordType::TXT);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    q.set_edns(edns);
    let r = Message::from_vec(&s.answer(&q.to_vec().unwrap(), true).await.unwrap()).unwrap();
    assert!(!r.metadata.truncation && r.answers.len() == 1);
    assert!(s.metrics.requests.get() >= 9);
    assert!(s.metrics.upstream_requests.get() >= 5);
}

#[tokio::test]
async fn malformed_packets_are_dropped_and_counted_and_a_dead_upstream_is_servfail() {
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut s = LocalDnsServer::new(
        ProxyDomain::new("default", "default.svc.cluster.local"),
        ResolvConf {
            servers: vec![dead],
            search: vec![],
        },
        false,
        DnsMetrics::default(),
    );
    s.timeout = Duration::from_millis(300);
    for garbage in [
        &b""[..],
        b"\x00",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        assert!(s.answer(garbage, true).await.is_none());
    }
    assert_eq!(s.metrics.malformed.get(), 3);
    let bytes = s
        .answer(&query("external.example.com.", RecordType::A).to_vec().unwrap(), true)
        .await
        .unwrap();
    assert_eq!(
        Message::from_vec(&bytes).unwrap().metadata.response_code,
        ResponseCode::ServFail
    );
    assert_eq!(s.metrics.upstream_failures.get(), 1);
}

#[tokio::test]
async fn served_over_udp_and_tcp() {
    let (upstream, _) = fake_upstream().await;
    let s = server(upstream);
    s.update(&name_table());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let _tasks = s.clone().serve(&[addr]).await.unwrap();
    let q = query("reviews.", RecordType::A).to_vec().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&q, addr).await.unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(Message::from_vec(&buf[..n]).unwrap().answers.len(), 1);
    let answer = upstream::exchange(addr, &q, Duration::from_secs(2)).await.unwrap();
    assert_eq!(Message::from_vec(&answer).unwrap().answers.len(), 1);
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend(&q);
    tcp.write_all(&framed).await.unwrap();
    let n = tcp.read_u16().await.unwrap();
    let mut a = vec![0u8; usize::from(n)];
    tcp.read_exact(&mut a).await.unwrap();
    assert_eq!(Message::from_vec(&a).unwrap().answers.len(), 1);
}

#[test]
fn resolv_conf_and_listen_addresses() {
    let r = ResolvConf::parse(
        "# c\nnameserver 10.96.0.10\nnameserver fd00::a\nsearch a.svc.cluster.local svc.cluster.local\noptions ndots:5\n",
    );
    assert_eq!(r.servers.len(), 2);
    assert_eq!(r.search, ["a.svc.cluster.local", "svc.cluster.local"]);
    assert_eq!(
        listen_addresses("localhost:15053", &r).unwrap(),
        [
            "127.0.0.1:15053".parse::<SocketAddr>().unwrap(),
            "[::1]:15053".parse().unwrap()
        ]
    );
    assert_eq!(
        listen_addresses("localhost:15053", &ResolvConf::default())
            .unwrap()
            .len(),
        1
    );
    assert!(listen_addresses("nope", &r).is_err());
}
