//! Forwarding a query to the resolvers of the pod's resolv.conf, as Istio's `queryUpstream`: one
//! server after the other (shuffled), or all at once with `DNS_FORWARD_PARALLEL`; over UDP, and
//! again over TCP when the UDP answer is truncated; each exchange bounded by a timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Istio's `DefaultUpstreamTimeout`.
pub(super) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// The raw answer of one server to `query` (UDP, then TCP if truncated).
pub(super) async fn exchange(server: SocketAddr, query: &[u8], timeout: Duration) -> Result<Vec<u8>, String> {
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
        // The answer to this query: a response with its ID; anything else (a stray or spoofed
        // datagram, a query) is not it, and the wait goes on.
        if answers(query, &buf[..n]) {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

/// Whether `answer` is a DNS response (a whole header, QR set) carrying `query`'s ID.
fn answers(query: &[u8], answer: &[u8]) -> bool {
    const HEADER: usize = 12;
    answer.len() >= HEADER && query.len() >= 2 && answer[..2] == query[..2] && answer[2] & 0x80 != 0
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
    if !answers(query, &buf) {
        return Err(format!("{server} (TCP): the reply is not a response to the query"));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::answers;

    #[test]
    fn only_a_response_with_the_querys_id_answers_it() {
        let query = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        let mut answer = query;
        answer[2] = 0x81;
        assert!(answers(&query, &answer));
        // A query (QR clear), as the fuzzer's resolver sent back: not an answer.
        assert!(!answers(&query, &query));
        // Another ID, or less than a header.
        let mut other = answer;
        other[1] = 0x35;
        assert!(!answers(&query, &other));
        assert!(!answers(&query, &answer[..11]));
    }
}
