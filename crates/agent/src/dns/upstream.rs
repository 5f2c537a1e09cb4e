//! Forwarding a query to the resolvers of the pod's resolv.conf, as Istio's `queryUpstream`: one
//! server after the other (shuffled), or all at once with `DNS_FORWARD_PARALLEL`; over UDP, and
//! again over TCP when the UDP answer is truncated; each exchange bounded by a timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Istio's `DefaultUpstreamTimeout`.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// The raw answer of one server to `query` (UDP, then TCP if truncated).
pub async fn exchange(server: SocketAddr, query: &[u8], timeout: Duration) -> Result<Vec<u8>, String> {
    let answer = tokio::time::timeout(timeout, udp(server, query))
        .await
        .map_err(|_| format!("{server}: timed out after {timeout:?}"))??;
    // TC: the flags' second byte, bit 0x02 of byte 2
    if answer.len() > 2 && answer[2] & 0x02 != 0 {
        return tokio::time::timeout(timeout, tcp(server, query))
            .await
            .map_err(|_| format!("{server} (TCP): timed out after {timeout:?}"))?;
    }
    Ok(answer)
}

async fn udp(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let bind: SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = UdpSocket::bind(bind).await.map_err(|e| format!("{server}: {e}"))?;
    socket.connect(server).await.map_err(|e| format!("{server}: {e}"))?;
    socket.send(query).await.map_err(|e| format!("{server}: {e}"))?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = socket.recv(&mut buf).await.map_err(|e| format!("{server}: {e}"))?;
        // the answer to this query: same ID
        if n >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

async fn tcp(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect(server).await.map_err(|e| format!("{server}: {e}"))?;
    let len = u16::try_from(query.len()).map_err(|_| "query too long".to_owned())?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    s.write_all(&framed).await.map_err(|e| format!("{server}: {e}"))?;
    let n = s.read_u16().await.map_err(|e| format!("{server}: {e}"))?;
    let mut buf = vec![0u8; usize::from(n)];
    s.read_exact(&mut buf).await.map_err(|e| format!("{server}: {e}"))?;
    Ok(buf)
}
