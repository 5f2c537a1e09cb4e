//! pilot-agent's DNS proxy, as Istio's (`pkg/dns/client`), with `ISTIO_META_DNS_CAPTURE=true`:
//! UDP and TCP on `DNS_PROXY_ADDR` (`localhost:15053`: 127.0.0.1, and ::1 when the pod has IPv6
//! resolvers), where the pod's DNS is captured. Names of the NDS name table pilot-discovery sends
//! are answered here (A/AAAA, authoritative, TTL 30 s; a known name without records of the asked
//! type gets an empty NOERROR answer); everything else goes to the resolvers of the pod's
//! resolv.conf (`upstream`). Before the first name table every query is forwarded. Answers larger
//! than the UDP size (512, or the query's EDNS size) are truncated and flagged TC. Packets that do
//! not parse are dropped and counted. Messages are hickory-proto's; sockets tokio's.
//!
//! Bounds (issue 28): at most [`MAX_FORWARDS_IN_FLIGHT`] queries are forwarded at once (each holds
//! a socket until its resolver answers or times out); past it a query is answered SERVFAIL at once
//! and counted, as a resolver's forward limit (dnsmasq's `dns-forward-max`). Over TCP, as Istio's
//! miekg/dns server (`dns.Server{}` defaults): a message must arrive whole within
//! [`TCP_READ_TIMEOUT`], a connection waits [`TCP_IDLE_TIMEOUT`] for the next one and serves at
//! most [`MAX_TCP_QUERIES`], and an answer must be written within [`TCP_WRITE_TIMEOUT`].

mod metrics;
pub mod table;
mod upstream;

#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use istio_api::nds::NameTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Semaphore;

pub use metrics::DnsMetrics;
pub use table::{LookupTable, ProxyDomain};

/// Istio's `defaultTTLInSeconds`.
const TTL: u32 = 30;
/// The classic DNS UDP limit, below any EDNS size.
const UDP_SIZE: usize = 512;
/// Queries forwarded at once, at most (dnsmasq's `dns-forward-max` default).
pub const MAX_FORWARDS_IN_FLIGHT: usize = 150;
/// miekg/dns's `dnsTimeout`: the server's read (per message) and write timeout.
pub const TCP_READ_TIMEOUT: Duration = Duration::from_secs(2);
pub const TCP_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// miekg/dns's `tcpIdleTimeout`: how long a TCP connection waits for its next query.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(8);
/// miekg/dns's `maxTCPQueries`: queries served on one TCP connection.
pub const MAX_TCP_QUERIES: usize = 128;

/// The resolvers and search list of a resolv.conf (port 53).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub servers: Vec<SocketAddr>,
    pub search: Vec<String>,
}

impl ResolvConf {
    pub fn parse(text: &str) -> ResolvConf {
        let mut out = ResolvConf::default();
        for line in text.lines().map(str::trim) {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) {
                        out.servers.push(SocketAddr::new(ip, 53));
                    }
                }
                // the last search (or domain) line wins, as libc
                Some("search") | Some("domain") => out.search = words.map(str::to_owned).collect(),
                _ => {}
            }
        }
        out
    }
}

pub struct LocalDnsServer {
    table: RwLock<Option<Arc<LookupTable>>>,
    proxy: ProxyDomain,
    resolv: ResolvConf,
    parallel: bool,
    timeout: Duration,
    /// Slots for forwarded queries ([`MAX_FORWARDS_IN_FLIGHT`]).
    forwards: Arc<Semaphore>,
    metrics: DnsMetrics,
}

impl LocalDnsServer {
    pub fn new(proxy: ProxyDomain, resolv: ResolvConf, parallel: bool, metrics: DnsMetrics) -> LocalDnsServer {
        LocalDnsServer {
            table: RwLock::new(None),
            proxy,
            resolv,
            parallel,
            timeout: upstream::UPSTREAM_TIMEOUT,
            forwards: Arc::new(Semaphore::new(MAX_FORWARDS_IN_FLIGHT)),
            metrics,
        }
    }

    /// Each upstream exchange bounded by `timeout` instead of Istio's 5 s (tests, fuzzing).
    pub fn with_upstream_timeout(mut self, timeout: Duration) -> LocalDnsServer {
        self.timeout = timeout;
        self
    }

    /// Answers from this name table from now on.
    pub fn update(&self, nt: &NameTable) {
        let table = LookupTable::build(nt, &self.proxy, &self.resolv.search);
        tracing::debug!(names = table.len(), "DNS lookup table updated");
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(table));
    }

    /// Whether a name table has arrived.
    pub fn ready(&self) -> bool {
        self.table.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    fn current(&self) -> Option<Arc<LookupTable>> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The answer to one query of at most `max_size` bytes on its transport (UDP: 512 or the
    /// query's EDNS size; TCP: 65535); `None` for a packet that does not parse (dropped).
    pub async fn answer(&self, query: &[u8], udp: bool) -> Option<Vec<u8>> {
        let request = match Message::from_vec(query) {
            Ok(m) => m,
            Err(e) => {
                self.metrics.malformed.inc();
                tracing::debug!("malformed DNS packet dropped: {e}");
                return None;
            }
        };
        self.metrics.requests.inc();
        let max = if udp {
            request
                .edns
                .as_ref()
                .map_or(UDP_SIZE, |e| usize::from(e.max_payload()).max(UDP_SIZE))
        } else {
            usize::from(u16::MAX)
        };
        let response = match self.local(&request) {
            Some(r) => r,
            None => self.forward(&request, query).await,
        };
        fit(response, max)
    }

    /// The local answer, if the name is the mesh's.
    fn local(&self, request: &Message) -> Option<Message> {
        let mut response = reply_to(request);
        let Some(q) = request.queries.first() else {
            response.metadata.response_code = ResponseCode::ServFail;
            return Some(response);
        };
        let table = self.current()?;
        let qtype = q.query_type();
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            return None;
        }
        let addresses = table.lookup(&q.name().to_ascii())?;
        response.metadata.authoritative = true;
        let name = q.name().clone();
        let records: Vec<Record> = if qtype == RecordType::A {
            addresses
                .v4
                .iter()
                .map(|ip| Record::from_rdata(name.clone(), TTL, RData::A(A(*ip))))
                .collect()
        } else {
            addresses
                .v6
                .iter()
                .map(|ip| Record::from_rdata(name.clone(), TTL, RData::AAAA(AAAA(*ip))))
                .collect()
        };
        response.answers = records;
        Some(response)
    }

    /// The upstream resolvers' answer, as they gave it, or SERVFAIL (also when
    /// [`MAX_FORWARDS_IN_FLIGHT`] queries are already forwarded).
    async fn forward(&self, request: &Message, query: &[u8]) -> Message {
        let Ok(_slot) = self.forwards.try_acquire() else {
            self.metrics.forward_limit.inc();
            tracing::debug!("DNS: {MAX_FORWARDS_IN_FLIGHT} queries already forwarded; SERVFAIL");
            let mut r = reply_to(request);
            r.metadata.response_code = ResponseCode::ServFail;
            return r;
        };
        self.metrics.upstream_requests.inc();
        let started = Instant::now();
        let answer = if self.parallel {
            self.forward_parallel(query).await
        } else {
            self.forward_each(query).await
        };
        self.metrics.upstream_duration.observe(started.elapsed().as_secs_f64());
        match answer.and_then(|bytes| Message::from_vec(&bytes).map_err(|e| format!("upstream answer: {e}"))) {
            Ok(m) => m,
            Err(e) => {
                self.metrics.upstream_failures.inc();
                tracing::debug!("DNS upstream failure: {e}");
                let mut r = reply_to(request);
                r.metadata.response_code = ResponseCode::ServFail;
                r
            }
        }
    }

    async fn forward_each(&self, query: &[u8]) -> Result<Vec<u8>, String> {
        let mut servers = self.resolv.servers.clone();
        // Istio shuffles the servers so that one slow resolver does not take every first try
        if servers.len() > 1 {
            let k = usize::from(query.first().copied().unwrap_or(0)) % servers.len();
            servers.rotate_left(k);
        }
        let mut last = "no resolvers in resolv.conf".to_owned();
        for server in servers {
            match upstream::exchange(server, query, self.timeout).await {
                Ok(a) => return Ok(a),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn forward_parallel(&self, query: &[u8]) -> Result<Vec<u8>, String> {
        if self.resolv.servers.is_empty() {
            return Err("no resolvers in resolv.conf".into());
        }
        let attempts = self
            .resolv
            .servers
            .iter()
            .map(|s| Box::pin(upstream::exchange(*s, query, self.timeout)));
        match futures::future::select_ok(attempts).await {
            Ok((answer, _)) => Ok(answer),
            Err(e) => Err(e),
        }
    }

    /// Serves UDP and TCP on each address until the task is dropped.
    pub async fn serve(self: Arc<Self>, addrs: &[SocketAddr]) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>> {
        let mut tasks = Vec::new();
        for addr in addrs {
            let udp = Arc::new(UdpSocket::bind(addr).await?);
            let tcp = TcpListener::bind(addr).await?;
            tracing::info!(%addr, "DNS proxy listening (UDP and TCP)");
            tasks.push(tokio::spawn(self.clone().serve_udp(udp)));
            tasks.push(tokio::spawn(self.clone().serve_tcp(tcp)));
        }
        Ok(tasks)
    }

    async fn serve_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        let mut buf = vec![0u8; 65535];
        loop {
            let (n, peer) = match socket.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("DNS UDP receive: {e}");
                    continue;
                }
            };
            let query = buf[..n].to_vec();
            let (server, socket) = (self.clone(), socket.clone());
            tokio::spawn(async move {
                if let Some(answer) = server.answer(&query, true).await {
                    let _ = socket.send_to(&answer, peer).await;
                }
            });
        }
    }

    async fn serve_tcp(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let server = self.clone();
            tokio::spawn(async move { server.serve_tcp_connection(&mut stream).await });
        }
    }
}

impl LocalDnsServer {
    /// Several length-prefixed queries on one connection, as miekg/dns's `serveTCPConn`: the first
    /// within the read timeout, each next within the idle timeout, each message whole within the
    /// read timeout once it started; the connection closes otherwise, or after `MAX_TCP_QUERIES`.
    async fn serve_tcp_connection(&self, stream: &mut tokio::net::TcpStream) {
        let mut wait = TCP_READ_TIMEOUT;
        for _ in 0..MAX_TCP_QUERIES {
            // the first byte within the wait, the rest of the message within the read timeout
            let mut first = [0u8; 1];
            match tokio::time::timeout(wait, stream.read(&mut first)).await {
                Ok(Ok(1)) => {}
                _ => return,
            }
            let message = async {
                let low = stream.read_u8().await?;
                let mut query = vec![0u8; usize::from(u16::from_be_bytes([first[0], low]))];
                stream.read_exact(&mut query).await?;
                Ok::<_, std::io::Error>(query)
            };
            let query = match tokio::time::timeout(TCP_READ_TIMEOUT, message).await {
                Ok(Ok(q)) => q,
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::debug!("DNS over TCP: message not received whole within {TCP_READ_TIMEOUT:?}; closing");
                    return;
                }
            };
            let Some(answer) = self.answer(&query, false).await else {
                return;
            };
            let Ok(n) = u16::try_from(answer.len()) else { return };
            let mut framed = n.to_be_bytes().to_vec();
            framed.extend_from_slice(&answer);
            if !matches!(
                tokio::time::timeout(TCP_WRITE_TIMEOUT, stream.write_all(&framed)).await,
                Ok(Ok(()))
            ) {
                return;
            }
            wait = TCP_IDLE_TIMEOUT;
        }
    }
}

/// A response to `request`: its ID, opcode, RD bit, question and EDNS.
fn reply_to(request: &Message) -> Message {
    let mut r = Message::response(request.metadata.id, request.metadata.op_code);
    r.metadata.recursion_desired = request.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    r.queries = request.queries.clone();
    r.edns = request.edns.clone();
    r
}

/// The encoded response, truncated (answers dropped, TC set) when larger than `max`.
fn fit(response: Message, max: usize) -> Option<Vec<u8>> {
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= max {
        return Some(bytes);
    }
    let mut truncated = response.truncate();
    truncated.metadata.id = response.metadata.id;
    truncated.to_vec().ok()
}

/// The addresses `DNS_PROXY_ADDR` listens on: `localhost` is 127.0.0.1, and ::1 when the pod
/// has IPv6 resolvers (Istio's `NewLocalDNSServer`).
pub fn listen_addresses(proxy_addr: &str, resolv: &ResolvConf) -> Result<Vec<SocketAddr>, String> {
    let (host, port) = proxy_addr
        .rsplit_once(':')
        .ok_or_else(|| format!("DNS_PROXY_ADDR {proxy_addr:?}: not host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("DNS_PROXY_ADDR {proxy_addr:?}: bad port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" {
        let mut out = vec![SocketAddr::from(([127, 0, 0, 1], port))];
        if resolv.servers.iter().any(SocketAddr::is_ipv6) {
            out.push(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port)));
        }
        return Ok(out);
    }
    let ip: IpAddr = host
        .parse()
        .map_err(|_| format!("DNS_PROXY_ADDR {proxy_addr:?}: not an IP or localhost"))?;
    Ok(vec![SocketAddr::new(ip, port)])
}
