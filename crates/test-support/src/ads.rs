//! An ADS client for tests, end-to-end checks and the load generator: state of the world here,
//! delta in [`delta`]. It subscribes and ACKs like Envoy, NACKs on demand, and checks the xDS
//! protocol on every response (unique non-empty nonces, non-empty versions, resource type URLs
//! equal to the response's, EDS/RDS only for subscribed names): a violation is an error whose
//! message starts with "xDS protocol violation".

pub mod delta;
mod outgoing;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Display;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::config::listener::v3::{Listener, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use xds_api::envoy::extensions::transport_sockets::tls::v3::Secret;
use xds_api::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use xds_api::envoy_types::pb::google::rpc::Status as RpcStatus;
use xds_api::{pbwkt, type_url};

use outgoing::{Outgoing, encode_names};

/// Largest message accepted, as the server's limit.
pub const MAX_MESSAGE_SIZE: usize = 100 * 1024 * 1024;
/// How long `recv` waits by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// gRPC INTERNAL, the code Envoy puts in a NACK's `error_detail`.
const NACK_CODE: i32 = 13;

/// Connects a tonic channel to `addr` (`host:port`, or a full `http://` URL).
pub async fn channel(addr: impl Display) -> Result<tonic::transport::Channel> {
    let addr = addr.to_string();
    let url = if addr.contains("://") {
        addr
    } else {
        format!("http://{addr}")
    };
    tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("bad ADS address {url}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to ADS at {url}"))
}

/// The gRPC status a stream ends with within `timeout`; a response instead is an error.
pub(crate) async fn end_status<T>(
    inbound: &mut Streaming<T>,
    timeout: Duration,
    type_url: impl Fn(&T) -> &str,
) -> Result<tonic::Status> {
    match tokio::time::timeout(timeout, inbound.message()).await {
        Err(_) => bail!("the stream did not end within {timeout:?}"),
        Ok(Err(s)) => Ok(s),
        Ok(Ok(Some(r))) => bail!("expected the stream to end, got a {} response", type_url(&r)),
        Ok(Ok(None)) => Ok(tonic::Status::ok("")),
    }
}

/// The node Envoy sends: ID plus metadata (a JSON object).
pub fn node(node_id: &str, metadata: &serde_json::Value) -> Node {
    Node {
        id: node_id.to_owned(),
        cluster: "test".to_owned(),
        metadata: Some(xds_api::json_to_struct(metadata)),
        user_agent_name: "envoy".to_owned(),
        ..Default::default()
    }
}

/// Types whose responses may only carry subscribed names (xDS: not wildcard).
pub(crate) fn is_named_type(t: &str) -> bool {
    matches!(t, type_url::ENDPOINT | type_url::ROUTE | type_url::SECRET)
}

/// The name of a resource of a known type, `None` for types this client does not know.
pub fn resource_name(any: &pbwkt::Any) -> Result<Option<String>> {
    let v = any.value.as_slice();
    let name = match any.type_url.as_str() {
        type_url::CLUSTER => Cluster::decode(v).map(|m| m.name),
        type_url::ENDPOINT => ClusterLoadAssignment::decode(v).map(|m| m.cluster_name),
        type_url::LISTENER => Listener::decode(v).map(|m| m.name),
        type_url::ROUTE => RouteConfiguration::decode(v).map(|m| m.name),
        type_url::VIRTUAL_HOST => VirtualHost::decode(v).map(|m| m.name),
        type_url::SECRET => Secret::decode(v).map(|m| m.name),
        _ => return Ok(None),
    };
    name.map(Some)
        .map_err(|e| anyhow!("a {} resource does not decode: {e}", any.type_url))
}

/// [`resource_name`] without decoding the resource: walks its top-level fields (each must be
/// well formed) and takes field 1, the name of every type this client knows (Cluster, Listener,
/// RouteConfiguration, VirtualHost, Secret `name`; ClusterLoadAssignment `cluster_name`). For load
/// generators that check the envelope of many responses, not their contents.
pub(crate) fn resource_name_light(any: &pbwkt::Any) -> Result<Option<String>> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    if !matches!(
        any.type_url.as_str(),
        type_url::CLUSTER
            | type_url::ENDPOINT
            | type_url::LISTENER
            | type_url::ROUTE
            | type_url::VIRTUAL_HOST
            | type_url::SECRET
    ) {
        return Ok(None);
    }
    let bad = |e: &dyn std::fmt::Display| anyhow!("a {} resource does not decode: {e}", any.type_url);
    let mut buf = any.value.as_slice();
    let mut name = String::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| bad(&e))?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            let len = usize::try_from(decode_varint(&mut buf).map_err(|e| bad(&e))?).unwrap_or(usize::MAX);
            if len > buf.len() {
                return Err(bad(&"field 1 runs past the end"));
            }
            let (bytes, rest) = buf.split_at(len);
            name = String::from_utf8(bytes.to_vec()).map_err(|e| bad(&e))?;
            buf = rest;
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).map_err(|e| bad(&e))?;
        }
    }
    Ok(Some(name))
}

/// Whether a RouteConfiguration gets its virtual hosts over VHDS (its `vhds`, field 9, is set),
/// read without decoding it. Envoy then subscribes to VHDS.
pub fn uses_vhds(any: &pbwkt::Any) -> bool {
    use prost::encoding::{DecodeContext, decode_key, skip_field};
    let mut buf = any.value.as_slice();
    while !buf.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut buf) else {
            return false;
        };
        if tag == 9 {
            return true;
        }
        if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
            return false;
        }
    }
    false
}

/// The socket addresses (address, port) of a ClusterLoadAssignment's endpoints, in order.
pub fn endpoint_addresses(cla: &ClusterLoadAssignment) -> Vec<(String, u32)> {
    use xds_api::envoy::config::core::v3::address::Address;
    use xds_api::envoy::config::core::v3::socket_address::PortSpecifier;
    use xds_api::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(Address::SocketAddress(sa)) => {
                let port = match sa.port_specifier {
                    Some(PortSpecifier::PortValue(p)) => p,
                    _ => 0,
                };
                Some((sa.address.clone(), port))
            }
            _ => None,
        })
        .collect()
}

pub fn eds_cluster_names(clusters: &[pbwkt::Any]) -> Vec<String> {
    let eds = cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32);
    clusters
        .iter()
        .filter_map(|a| Cluster::decode(a.value.as_slice()).ok())
        .filter(|c| c.cluster_discovery_type.as_ref() == Some(&eds))
        .map(|c| match c.eds_cluster_config {
            Some(e) if !e.service_name.is_empty() => e.service_name,
            _ => c.name,
        })
        .collect()
}

/// Route configuration names that listeners' HTTP connection managers load over RDS.
pub fn rds_route_names(listeners: &[pbwkt::Any]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for l in listeners
        .iter()
        .filter_map(|a| Listener::decode(a.value.as_slice()).ok())
    {
        for fc in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
            for f in &fc.filters {
                let Some(filter::ConfigType::TypedConfig(tc)) = &f.config_type else {
                    continue;
                };
                let Ok(hcm) = HttpConnectionManager::decode(tc.value.as_slice()) else {
                    continue;
                };
                if let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier {
                    names.insert(rds.route_config_name);
                }
            }
        }
    }
    names.into_iter().collect()
}

/// One checked response.
#[derive(Debug, Clone)]
pub struct Response {
    pub raw: DiscoveryResponse,
    /// Resource names in order (empty for types this client cannot decode).
    pub names: Vec<String>,
}

impl Response {
    pub fn type_url(&self) -> &str {
        &self.raw.type_url
    }
    pub fn version(&self) -> &str {
        &self.raw.version_info
    }
    pub fn nonce(&self) -> &str {
        &self.raw.nonce
    }
    /// Decodes every resource as `M`.
    pub fn decode<M: Message + Default>(&self) -> Result<Vec<M>> {
        self.raw
            .resources
            .iter()
            .map(|a| M::decode(a.value.as_slice()).map_err(Into::into))
            .collect()
    }
}

#[derive(Debug, Default)]
struct TypeState {
    names: BTreeSet<String>,
    /// `names` encoded for requests, once per subscription.
    encoded_names: bytes::Bytes,
    /// Names of older subscriptions that a response may still carry, until a response shows
    /// that the server has caught up with the latest.
    stale: BTreeSet<String>,
    acked_version: String,
    last_nonce: String,
}

/// What an Envoy-like handshake received, already ACKed.
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    pub clusters: Option<Response>,
    pub endpoints: Option<Response>,
    pub listeners: Option<Response>,
    pub routes: Option<Response>,
}

/// A state-of-the-world ADS client.
pub struct AdsClient {
    node: Node,
    node_sent: bool,
    tx: mpsc::UnboundedSender<Outgoing>,
    inbound: Streaming<DiscoveryResponse>,
    checker: SotwChecker,
    last: Option<Response>,
    /// How long `recv` waits.
    pub timeout: Duration,
}

impl AdsClient {
    /// Opens `StreamAggregatedResources` to `addr`. Nothing is sent until the first request.
    pub async fn connect(addr: impl Display, node_id: &str, metadata: serde_json::Value) -> Result<AdsClient> {
        Self::on_channel(channel(addr).await?, node_id, metadata).await
    }

    /// Opens `StreamAggregatedResources` on an existing channel (e.g. one with TLS).
    pub async fn on_channel(
        channel: tonic::transport::Channel,
        node_id: &str,
        metadata: serde_json::Value,
    ) -> Result<AdsClient> {
        Self::on_channel_with_token(channel, None, node_id, metadata).await
    }

    /// [`on_channel`](Self::on_channel) with `authorization: Bearer <token>`, as pilot-agent
    /// authenticates to the secure port.
    pub async fn on_channel_with_token(
        channel: tonic::transport::Channel,
        token: Option<&str>,
        node_id: &str,
        metadata: serde_json::Value,
    ) -> Result<AdsClient> {
        let mut client = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().context("token")?);
        }
        client.ready().await.context("opening StreamAggregatedResources")?;
        let codec = tonic_prost::ProstCodec::<Outgoing, DiscoveryResponse>::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        );
        let inbound = client
            .streaming(request, path, codec)
            .await
            .context("opening StreamAggregatedResources")?
            .into_inner();
        Ok(AdsClient {
            node: node(node_id, &metadata),
            node_sent: false,
            tx,
            inbound,
            checker: SotwChecker::default(),
            last: None,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sends a raw request as is (the node is added to the first one). For tests of odd input.
    pub fn send_raw(&mut self, req: DiscoveryRequest) -> Result<()> {
        self.send(req.into())
    }

    fn send(&mut self, mut out: Outgoing) -> Result<()> {
        if !self.node_sent {
            out.req.node.get_or_insert_with(|| self.node.clone());
            self.node_sent = true;
        }
        self.tx.send(out).map_err(|_| anyhow!("ADS stream closed"))
    }

    /// A request for `type_url` with the current subscription's names.
    fn with_names(&mut self, type_url: &str, req: DiscoveryRequest) -> Result<()> {
        let names = self
            .checker
            .types
            .get(type_url)
            .map(|st| st.encoded_names.clone())
            .unwrap_or_default();
        self.send(Outgoing { req, names })
    }

    /// Subscribes to `names` of `type_url` (empty = wildcard for CDS/LDS), as Envoy does when its
    /// subscription changes: with the last ACKed version and the last nonce received.
    pub fn request(&mut self, type_url: &str, names: &[&str]) -> Result<()> {
        self.checker.subscribe(type_url, names);
        let st = self.checker.types.entry(type_url.to_owned()).or_default();
        let req = DiscoveryRequest {
            version_info: st.acked_version.clone(),
            type_url: type_url.to_owned(),
            response_nonce: st.last_nonce.clone(),
            ..Default::default()
        };
        self.with_names(type_url, req)
    }

    /// Checks responses' envelopes and resource names without decoding the resources
    /// ([`SotwChecker::light`]).
    pub fn set_light(&mut self, light: bool) {
        self.checker.light = light;
    }

    /// Receives the next response and checks it; waits at most `self.timeout`.
    pub async fn recv(&mut self) -> Result<Response> {
        let msg = tokio::time::timeout(self.timeout, self.inbound.message())
            .await
            .map_err(|_| anyhow!("no xDS response within {:?}", self.timeout))?
            .map_err(|s| anyhow!("ADS stream failed: {:?}: {}", s.code(), s.message()))?
            .ok_or_else(|| anyhow!("ADS stream closed by the server"))?;
        let resp = self.checker.check(msg)?;
        self.last = Some(resp.clone());
        Ok(resp)
    }

    /// The gRPC status the stream ends with (e.g. a refused node), within `self.timeout`.
    pub async fn recv_status(&mut self) -> Result<tonic::Status> {
        end_status(&mut self.inbound, self.timeout, |r| &r.type_url).await
    }

    /// Fails if a response arrives within `wait`.
    pub async fn expect_no_response(&mut self, wait: Duration) -> Result<()> {
        match tokio::time::timeout(wait, self.inbound.message()).await {
            Err(_) => Ok(()),
            Ok(Ok(Some(r))) => bail!(
                "unexpected {} response, version {} nonce {}",
                r.type_url,
                r.version_info,
                r.nonce
            ),
            Ok(Ok(None)) => bail!("ADS stream closed by the server"),
            Ok(Err(s)) => bail!("ADS stream failed: {:?}: {}", s.code(), s.message()),
        }
    }

    /// ACKs the last response received.
    pub fn ack(&mut self) -> Result<()> {
        let last = self.last.take().ok_or_else(|| anyhow!("nothing to ACK"))?;
        self.ack_response(&last)
    }

    /// ACKs `resp` as Envoy: its version and nonce, the current subscription.
    pub fn ack_response(&mut self, resp: &Response) -> Result<()> {
        let st = self.checker.types.entry(resp.type_url().to_owned()).or_default();
        st.acked_version = resp.version().to_owned();
        let req = DiscoveryRequest {
            version_info: resp.version().to_owned(),
            type_url: resp.type_url().to_owned(),
            response_nonce: resp.nonce().to_owned(),
            ..Default::default()
        };
        self.with_names(resp.type_url(), req)
    }

    /// NACKs the last response received as Envoy: the previous version, its nonce, `detail`.
    pub fn nack(&mut self, detail: &str) -> Result<()> {
        let last = self.last.take().ok_or_else(|| anyhow!("nothing to NACK"))?;
        let st = self.checker.types.entry(last.type_url().to_owned()).or_default();
        let req = DiscoveryRequest {
            version_info: st.acked_version.clone(),
            type_url: last.type_url().to_owned(),
            response_nonce: last.nonce().to_owned(),
            error_detail: Some(RpcStatus {
                code: NACK_CODE,
                message: detail.to_owned(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.with_names(last.type_url(), req)
    }

    /// Receives and ACKs one response.
    pub async fn recv_ack(&mut self) -> Result<Response> {
        let r = self.recv().await?;
        self.ack()?;
        Ok(r)
    }

    /// Envoy's start: CDS wildcard; EDS for the EDS clusters (before ACKing CDS); LDS wildcard;
    /// then RDS for `routes`, or for the listeners' RDS names if `routes` is `None`.
    pub async fn handshake(&mut self, routes: Option<&[&str]>) -> Result<Handshake> {
        let mut hs = Handshake::default();
        self.request(type_url::CLUSTER, &[])?;
        let cds = self.expect_type(type_url::CLUSTER).await?;
        let eds_names = eds_cluster_names(&cds.raw.resources);
        if !eds_names.is_empty() {
            let names: Vec<&str> = eds_names.iter().map(String::as_str).collect();
            self.request(type_url::ENDPOINT, &names)?;
        }
        self.ack_response(&cds)?;
        if !eds_names.is_empty() {
            hs.endpoints = Some(self.expect_type(type_url::ENDPOINT).await?);
            self.ack()?;
        }
        hs.clusters = Some(cds);
        self.request(type_url::LISTENER, &[])?;
        let lds = self.expect_type(type_url::LISTENER).await?;
        let route_names = match routes {
            Some(r) => r.iter().map(|s| s.to_string()).collect(),
            None => rds_route_names(&lds.raw.resources),
        };
        if !route_names.is_empty() {
            let names: Vec<&str> = route_names.iter().map(String::as_str).collect();
            self.request(type_url::ROUTE, &names)?;
        }
        self.ack_response(&lds)?;
        hs.listeners = Some(lds);
        if !route_names.is_empty() {
            hs.routes = Some(self.expect_type(type_url::ROUTE).await?);
            self.ack()?;
        }
        Ok(hs)
    }

    /// Receives one response and fails unless it is of `type_url`.
    pub async fn expect_type(&mut self, type_url: &str) -> Result<Response> {
        let r = self.recv().await?;
        if r.type_url() != type_url {
            bail!(
                "expected a {type_url} response, got {} (version {})",
                r.type_url(),
                r.version()
            );
        }
        Ok(r)
    }
}

/// The protocol checks of a state-of-the-world stream, usable on their own (e.g. by a load
/// generator with its own stream handling).
#[derive(Debug, Default)]
pub(crate) struct SotwChecker {
    types: BTreeMap<String, TypeState>,
    nonces: HashSet<String>,
    /// Read resource names with [`resource_name_light`] instead of decoding every resource.
    pub light: bool,
}

impl SotwChecker {
    /// Records a subscription sent for `type_url`.
    pub(crate) fn subscribe(&mut self, type_url: &str, names: &[&str]) {
        let st = self.types.entry(type_url.to_owned()).or_default();
        let old = std::mem::replace(&mut st.names, names.iter().map(|s| s.to_string()).collect());
        st.stale.extend(old);
        st.stale.retain(|n| !st.names.contains(n));
        st.encoded_names = encode_names(&st.names);
    }

    /// Checks one response against the protocol and what was subscribed.
    pub(crate) fn check(&mut self, raw: DiscoveryResponse) -> Result<Response> {
        let t = raw.type_url.clone();
        let violation =
            |what: String| anyhow!("xDS protocol violation in {t} response (nonce {:?}): {what}", raw.nonce);
        let Some(st) = self.types.get_mut(&t) else {
            return Err(violation("type was never requested".into()));
        };
        if raw.nonce.is_empty() {
            return Err(violation("empty nonce".into()));
        }
        if !self.nonces.insert(raw.nonce.clone()) {
            return Err(violation("nonce reused on this stream".into()));
        }
        if raw.version_info.is_empty() {
            return Err(violation("empty version_info".into()));
        }
        let mut names = Vec::with_capacity(raw.resources.len());
        // Istio's debug types (`istio.io/debug/...`) carry other messages (ClientConfig, admin
        // config dumps), as istiod sends them.
        let debug = t.starts_with("istio.io/debug/");
        for (i, any) in raw.resources.iter().enumerate() {
            if debug {
                continue;
            }
            if any.type_url != t {
                return Err(violation(format!("resource {i} has type_url {}", any.type_url)));
            }
            let name = if self.light {
                resource_name_light(any)
            } else {
                resource_name(any)
            };
            if let Some(n) = name.map_err(|e| violation(e.to_string()))? {
                names.push(n);
            }
        }
        let unique: BTreeSet<&String> = names.iter().collect();
        if unique.len() != names.len() {
            return Err(violation(format!("duplicate resource names in {names:?}")));
        }
        if is_named_type(&t) {
            if let Some(n) = names.iter().find(|n| !st.names.contains(*n) && !st.stale.contains(*n)) {
                return Err(violation(format!(
                    "resource {n:?} was not subscribed (subscribed: {:?})",
                    st.names
                )));
            }
            if names.iter().all(|n| st.names.contains(n)) {
                st.stale.clear();
            }
        }
        st.last_nonce = raw.nonce.clone();
        Ok(Response { raw, names })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xds_api::pack;

    fn response(t: &str, nonce: &str, resources: Vec<pbwkt::Any>) -> DiscoveryResponse {
        DiscoveryResponse {
            type_url: t.into(),
            version_info: "v1".into(),
            nonce: nonce.into(),
            resources,
            ..Default::default()
        }
    }

    fn cla(name: &str) -> pbwkt::Any {
        pack(&ClusterLoadAssignment {
            cluster_name: name.into(),
            ..Default::default()
        })
    }

    #[test]
    fn light_names_are_the_decoded_names_and_malformed_bytes_an_error() {
        use xds_api::envoy::config::cluster::v3::Cluster;
        use xds_api::envoy::config::listener::v3::Listener;
        use xds_api::envoy::config::route::v3::RouteConfiguration;
        let resources = [
            pack(&Cluster {
                name: "outbound|80||a.default.svc.cluster.local".into(),
                connect_timeout: Some(pbwkt::Duration { seconds: 10, nanos: 0 }),
                ..Default::default()
            }),
            pack(&ClusterLoadAssignment {
                cluster_name: "outbound|80||a".into(),
                endpoints: vec![Default::default()],
                ..Default::default()
            }),
            pack(&Listener {
                stat_prefix: "before the name".into(),
                name: "0.0.0.0_80".into(),
                ..Default::default()
            }),
            pack(&RouteConfiguration {
                name: "80".into(),
                validate_clusters: Some(pbwkt::BoolValue { value: true }),
                ..Default::default()
            }),
            pbwkt::Any {
                type_url: "type.googleapis.com/other".into(),
                value: vec![1, 2, 3],
            },
        ];
        for r in &resources {
            assert_eq!(
                resource_name_light(r).unwrap(),
                resource_name(r).unwrap(),
                "{}",
                r.type_url
            );
        }
        let mut truncated = resources[0].clone();
        truncated.value.truncate(truncated.value.len() - 3);
        assert!(resource_name_light(&truncated).is_err());
        let mut light = SotwChecker {
            light: true,
            ..Default::default()
        };
        light.subscribe(type_url::ENDPOINT, &["a"]);
        let r = light.check(response(type_url::ENDPOINT, "1", vec![cla("a")])).unwrap();
        assert_eq!(r.names, vec!["a"]);
        assert!(light.check(response(type_url::ENDPOINT, "2", vec![cla("b")])).is_err());
    }

    #[test]
    fn accepts_a_good_response_and_names_its_resources() {
        let mut c = SotwChecker::default();
        c.subscribe(type_url::ENDPOINT, &["a", "b"]);
        let r = c
            .check(response(type_url::ENDPOINT, "1", vec![cla("a"), cla("b")]))
            .unwrap();
        assert_eq!(r.names, vec!["a", "b"]);
    }

    #[test]
    fn reports_each_violation() {
        let mut c = SotwChecker::default();
        c.subscribe(type_url::ENDPOINT, &["a"]);
        c.subscribe(type_url::CLUSTER, &[]);
        let err = |c: &mut SotwChecker, r| c.check(r).unwrap_err().to_string();
        assert!(err(&mut c, response(type_url::LISTENER, "1", vec![])).contains("never requested"));
        assert!(err(&mut c, response(type_url::ENDPOINT, "", vec![])).contains("empty nonce"));
        let mut no_version = response(type_url::ENDPOINT, "2", vec![]);
        no_version.version_info.clear();
        assert!(err(&mut c, no_version).contains("empty version_info"));
        assert!(err(&mut c, response(type_url::ENDPOINT, "2", vec![])).contains("nonce reused"));
        let e = err(&mut c, response(type_url::CLUSTER, "3", vec![cla("a")]));
        assert!(
            e.starts_with("xDS protocol violation") && e.contains("has type_url"),
            "{e}"
        );
        let e = err(&mut c, response(type_url::ENDPOINT, "4", vec![cla("a"), cla("z")]));
        assert!(e.contains(r#"resource "z" was not subscribed"#), "{e}");
        let e = err(&mut c, response(type_url::ENDPOINT, "5", vec![cla("a"), cla("a")]));
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn names_of_an_older_subscription_are_allowed_until_the_server_catches_up() {
        let mut c = SotwChecker::default();
        c.subscribe(type_url::ENDPOINT, &["a", "b"]);
        c.subscribe(type_url::ENDPOINT, &["a"]);
        c.check(response(type_url::ENDPOINT, "1", vec![cla("a"), cla("b")]))
            .unwrap();
        c.check(response(type_url::ENDPOINT, "2", vec![cla("a")])).unwrap();
        assert!(c.check(response(type_url::ENDPOINT, "3", vec![cla("b")])).is_err());
    }

    #[test]
    fn finds_eds_clusters_and_rds_names() {
        let eds = Cluster {
            name: "c1".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
            ..Default::default()
        };
        let dns = Cluster {
            name: "c2".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::StrictDns as i32,
            )),
            ..Default::default()
        };
        assert_eq!(eds_cluster_names(&[pack(&eds), pack(&dns)]), vec!["c1"]);
        let hcm = HttpConnectionManager {
            route_specifier: Some(RouteSpecifier::Rds(
                xds_api::envoy::extensions::filters::network::http_connection_manager::v3::Rds {
                    route_config_name: "80".into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        let l = Listener {
            name: "l".into(),
            filter_chains: vec![xds_api::envoy::config::listener::v3::FilterChain {
                filters: vec![xds_api::envoy::config::listener::v3::Filter {
                    name: "hcm".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack(&hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(rds_route_names(&[pack(&l)]), vec!["80"]);
    }
}
