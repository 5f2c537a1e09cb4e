//! The DNS proxy's bounds (issue 28): forwarded queries in flight are capped (SERVFAIL past the
//! cap, counted), and a TCP connection that stalls in the middle of a message, or sends nothing,
//! is closed.

use std::sync::atomic::{AtomicUsize, Ordering};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

use super::*;

fn query(name: &str) -> Vec<u8> {
    let mut m = Message::new(7, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

/// A resolver that takes queries, counts them and never answers.
async fn silent_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        while socket.recv_from(&mut buf).await.is_ok() {
            c.fetch_add(1, Ordering::Relaxed);
        }
    });
    (addr, count)
}

fn server(upstream: SocketAddr) -> LocalDnsServer {
    LocalDnsServer::new(
        ProxyDomain::new("default", "default.svc.cluster.local"),
        ResolvConf {
            servers: vec![upstream],
            search: vec![],
        },
        false,
        DnsMetrics::default(),
    )
}

#[tokio::test]
async fn forwards_past_the_limit_are_servfail_and_counted() {
    let (upstream, received) = silent_upstream().await;
    let mut s = server(upstream);
    s.timeout = Duration::from_secs(120);
    let s = Arc::new(s);
    let pending: Vec<_> = (0..MAX_FORWARDS_IN_FLIGHT)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.answer(&query(&format!("q{i}.example.com.")), true).await })
        })
        .collect();
    // every slot is taken once the resolver has every query
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < MAX_FORWARDS_IN_FLIGHT {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queries did not reach the resolver"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(30), s.answer(&query("one.more.example.com."), true))
        .await
        .expect("a query past the limit is answered at once, not forwarded")
        .unwrap();
    let answer = Message::from_vec(&answer).unwrap();
    assert_eq!(answer.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(answer.metadata.id, 7);
    assert_eq!(s.metrics.forward_limit.get(), 1);
    assert_eq!(received.load(Ordering::Relaxed), MAX_FORWARDS_IN_FLIGHT);
    for p in pending {
        p.abort();
    }
}

#[tokio::test]
async fn tcp_connections_stalled_mid_message_or_silent_are_closed() {
    let (upstream, _) = silent_upstream().await;
    let s = Arc::new(server(upstream));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let _tasks = s.clone().serve(&[addr]).await.unwrap();

    // a length of 100, then 10 bytes of it, then nothing
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0, 100]).await.unwrap();
    half.write_all(&[0u8; 10]).await.unwrap();
    // a connection that sends nothing
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    for stream in [&mut half, &mut silent] {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("the proxy closed the stalled connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}
