//! Where the simulated proxies connect: the ADS address, the loopback source address each
//! connection binds to, and how many proxies' streams share one HTTP/2 connection (one each, as
//! Envoy, unless the open-file limit forces sharing).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::sync::OnceCell;
use tonic::transport::{Channel, Endpoint};

/// Loopback connections per source address: past the first 10,000 connections, each further
/// 10,000 come from their own 127.0.0.x, so that tens of thousands of connections to one address
/// do not exhaust one source address's ephemeral ports.
const CONNECTIONS_PER_SOURCE: usize = 10_000;

/// The ADS server the proxies connect to (state of the world; the delta client dials `addr`
/// itself, one connection per proxy).
#[derive(Debug, Clone)]
pub struct Upstream {
    addr: String,
    streams_per_connection: usize,
    /// Shared connections by index, when `streams_per_connection` > 1.
    shared: Arc<Mutex<HashMap<usize, Arc<OnceCell<Channel>>>>>,
}

impl Upstream {
    /// `addr` is `host:port`; `streams_per_connection` proxies share each connection (0 means 1).
    pub fn new(addr: impl Into<String>, streams_per_connection: usize) -> Upstream {
        Upstream {
            addr: addr.into(),
            streams_per_connection: streams_per_connection.max(1),
            shared: Arc::default(),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The connection proxy `n` opens its stream on: its own, or its group's.
    pub async fn channel(&self, n: usize) -> Result<Channel> {
        let per = self.streams_per_connection;
        if per == 1 {
            return connect(&self.addr, n).await;
        }
        let index = n / per;
        let cell = {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared.entry(index).or_default().clone()
        };
        cell.get_or_try_init(|| connect(&self.addr, index)).await.cloned()
    }
}

async fn connect(addr: &str, index: usize) -> Result<Channel> {
    let source = source_ip(addr, index);
    Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("bad ADS address {addr}"))?
        .local_address(source)
        .connect()
        .await
        .with_context(|| match source {
            Some(ip) => format!("connecting to ADS at {addr} from {ip}"),
            None => format!("connecting to ADS at {addr}"),
        })
}

/// The source address connection `index` binds to before connecting to `addr`, if any (see
/// [`CONNECTIONS_PER_SOURCE`]).
pub fn source_ip(addr: &str, index: usize) -> Option<IpAddr> {
    let target: SocketAddr = addr.parse().ok()?;
    let spread = index / CONNECTIONS_PER_SOURCE;
    if spread == 0 || !target.ip().is_loopback() || !target.is_ipv4() {
        return None;
    }
    Some(Ipv4Addr::new(127, 0, 0, 1 + (spread % 254) as u8).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_connections_past_ten_thousand_come_from_further_addresses() {
        assert_eq!(source_ip("127.0.0.1:15010", 0), None);
        assert_eq!(source_ip("127.0.0.1:15010", 9_999), None);
        assert_eq!(source_ip("127.0.0.1:15010", 10_000), Some([127, 0, 0, 2].into()));
        assert_eq!(source_ip("127.0.0.1:15010", 24_999), Some([127, 0, 0, 3].into()));
        assert_eq!(source_ip("10.0.0.1:15010", 20_000), None);
        assert_eq!(source_ip("[::1]:15010", 20_000), None);
        assert_eq!(source_ip("localhost:15010", 20_000), None);
    }

    #[tokio::test]
    async fn proxies_of_a_group_share_one_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok(Ok((c, _))) =
                tokio::time::timeout(std::time::Duration::from_millis(300), listener.accept()).await
            {
                conns.push(c);
            }
            conns.len()
        });
        let upstream = Upstream::new(addr, 3);
        for n in 0..7 {
            upstream.channel(n).await.unwrap();
        }
        assert_eq!(accepted.await.unwrap(), 3, "7 proxies, 3 per connection");
    }
}
