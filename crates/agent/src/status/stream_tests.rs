//! The scrape under callers that do not read (issue 28): Envoy's body is streamed, scrapes in
//! progress are bounded, and a caller that stops reading has its connection closed, giving its
//! scrape slot back.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::routing::get;
use futures::StreamExt;
use prometheus_client::registry::Registry;
use test_support::backend::http_get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::tests::start;
use super::*;

/// A fake Envoy admin whose `/stats/prometheus` is `body`, or, for a `user-agent: hang` scrape,
/// one line and then nothing (a scrape that stays in progress).
async fn admin_with(body: Bytes) -> u16 {
    let app = Router::new().route(
        "/stats/prometheus",
        get(move |headers: HeaderMap| {
            let body = body.clone();
            async move {
                if headers.get("user-agent").is_some_and(|v| v == "hang") {
                    let first =
                        futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"envoy_a 1\n")) });
                    return Body::from_stream(first.chain(futures::stream::pending()));
                }
                Body::from(body)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Sends a scrape on a connection with a small receive window and returns it unread.
async fn scrape_without_reading(url: &str, headers: &str) -> TcpStream {
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let request = format!("GET /stats/prometheus HTTP/1.1\r\nhost: x\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

#[tokio::test]
async fn a_large_envoy_body_is_streamed_whole_and_merged() {
    let mut envoy = String::new();
    for i in 0..100_000 {
        envoy.push_str(&format!("envoy_metric_{i} {i}\n"));
    }
    envoy.push_str("envoy_last 1"); // no final newline: the merged body adds one
    let admin_port = admin_with(Bytes::from(envoy.clone())).await;
    let mut registry = Registry::default();
    let scrape_metrics = ScrapeMetrics::register(&mut registry);
    let options = StatusServerOptions {
        admin_port,
        scrape_metrics,
        ..Default::default()
    };
    let server = start(options, registry).await;
    let body = server.get("/stats/prometheus").await.body;
    let (agent, rest) = body.split_at(body.find("envoy_metric_0 0\n").expect("Envoy's text"));
    assert!(agent.contains("\nistio_agent_scrapes_total 1\n"), "{agent}");
    assert_eq!(rest, format!("{envoy}\n"));
}

#[tokio::test]
async fn scrapes_past_the_limit_are_refused_and_counted() {
    let admin_port = admin_with(Bytes::from_static(b"envoy_b 1\n")).await;
    let mut registry = Registry::default();
    let scrape_metrics = ScrapeMetrics::register(&mut registry);
    let options = StatusServerOptions {
        admin_port,
        scrape_metrics,
        ..Default::default()
    };
    let server = start(options, registry).await;

    // scrapes in progress (Envoy sends one line, then nothing for a second) hold every slot
    let mut hanging = Vec::new();
    for _ in 0..MAX_CONCURRENT_SCRAPES {
        let mut stream = scrape_without_reading(
            &server.url,
            "user-agent: hang\r\nx-prometheus-scrape-timeout-seconds: 1\r\n",
        )
        .await;
        // the headers and the agent's text arrive: this scrape holds its slot
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        hanging.push(stream);
    }
    let refused = server.get("/stats/prometheus").await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("too many concurrent scrapes"), "{}", refused.body);

    // their scrape timeout cuts them off; the slots come back
    for mut stream in hanging {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
            .await
            .expect("a timed-out scrape ends its response");
    }
    let body = server.get("/stats/prometheus").await.body;
    assert!(body.ends_with("envoy_b 1\n"), "{body}");
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"limit\"} 1\n"),
        "{body}"
    );
    assert!(body.contains("\nistio_agent_scrapes_total 6\n"), "{body}");
}

#[tokio::test]
async fn a_caller_that_stops_reading_is_disconnected_and_its_slot_freed() {
    // far more than the socket buffers between the agent and the caller hold
    let envoy = Bytes::from(vec![b'#'; 32 << 20]);
    let admin_port = admin_with(envoy.clone()).await;
    let options = StatusServerOptions {
        admin_port,
        write_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let server = start(options, Registry::default()).await;

    let mut stalled = Vec::new();
    for _ in 0..MAX_CONCURRENT_SCRAPES {
        stalled.push(scrape_without_reading(&server.url, "x-prometheus-scrape-timeout-seconds: 60\r\n").await);
    }
    // well past the write timeout, the callers read what they were sent: not the whole body,
    // their connections were closed
    tokio::time::sleep(Duration::from_secs(2)).await;
    for mut stream in stalled {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut got))
            .await
            .expect("the stalled connection was closed");
        assert!(
            read.is_err() || got.len() < envoy.len(),
            "a caller that stopped reading still got the whole body ({} bytes)",
            got.len()
        );
    }
    // and the slots they held serve new scrapes
    let response = http_get(&format!("{}/stats/prometheus", server.url), &[])
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert!(response.body.len() > envoy.len());
}
