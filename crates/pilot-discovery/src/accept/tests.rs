use std::time::Duration;

use futures::StreamExt;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn setup(timeout: Duration) -> (Setup, Registry) {
    let mut registry = Registry::default();
    let metrics = SetupMetrics::register(&mut registry);
    (Setup { timeout, metrics }, registry)
}

fn failures(registry: &Registry, reason: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("pilot_grpc_connection_setup_failures_total{") && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Reads until the server closes the connection; `None` if it is still open after `wait`.
async fn closed_within(conn: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    tokio::time::timeout(wait, conn.read_to_end(&mut got))
        .await
        .ok()?
        .ok()?;
    Some(got)
}

#[tokio::test]
async fn an_idle_or_half_preface_connection_is_closed_after_the_timeout_and_counted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (setup, registry) = setup(Duration::from_millis(300));
    let mut ready = Box::pin(plaintext(listener, setup));

    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&PREFACE[..10]).await.unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)).await.is_some(),
        "an idle connection stays open"
    );
    assert!(
        closed_within(&mut half, Duration::from_secs(10)).await.is_some(),
        "half a preface stays open"
    );
    assert_eq!(failures(&registry, "timeout"), 2);
    // Neither was handed to the server.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), ready.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_client_that_sends_the_preface_is_handed_over_with_its_bytes_intact() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (setup, registry) = setup(Duration::from_millis(300));
    let mut ready = Box::pin(plaintext(listener, setup));

    // A slow client that stays silent does not delay the next one.
    let _silent = TcpStream::connect(addr).await.unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(PREFACE).await.unwrap();
    client.write_all(b"then frames").await.unwrap();
    let mut conn = tokio::time::timeout(Duration::from_millis(250), ready.next())
        .await
        .expect("the ready connection waits behind the silent one")
        .expect("the stream ended")
        .unwrap();
    let mut got = vec![0u8; PREFACE.len() + b"then frames".len()];
    conn.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..PREFACE.len()], PREFACE);
    assert_eq!(&got[PREFACE.len()..], b"then frames");
    // Writes reach the client.
    conn.write_all(b"settings").await.unwrap();
    let mut back = [0u8; 8];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"settings");
    // Past the timeout the handed-over connection is the server's: it stays open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    conn.write_all(b"!").await.unwrap();
    client.read_exact(&mut back[..1]).await.unwrap();
    assert_eq!(failures(&registry, "timeout"), 1, "only the silent client timed out");
}
