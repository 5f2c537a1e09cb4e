//! The delta ADS client (`DeltaAggregatedResources`): subscribes and unsubscribes like Envoy,
//! keeps what it has per type (name -> version), ACKs or NACKs by nonce, and checks the protocol
//! on every response.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Display;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use xds_api::envoy_types::pb::google::rpc::Status as RpcStatus;

use super::{
    DEFAULT_TIMEOUT, MAX_MESSAGE_SIZE, NACK_CODE, channel, is_named_type, node, resource_name, resource_name_light,
};

/// One checked delta response.
#[derive(Debug, Clone)]
pub struct DeltaResponse {
    pub raw: DeltaDiscoveryResponse,
}

impl DeltaResponse {
    pub fn type_url(&self) -> &str {
        &self.raw.type_url
    }
    pub fn nonce(&self) -> &str {
        &self.raw.nonce
    }
    /// Names of the resources added or changed, in order.
    pub fn names(&self) -> Vec<&str> {
        self.raw.resources.iter().map(|r| r.name.as_str()).collect()
    }
    pub fn removed(&self) -> &[String] {
        &self.raw.removed_resources
    }
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// Names a response may still carry: subscribed, or unsubscribed since the last response.
    allowed: BTreeSet<String>,
    /// What this client has: name -> version.
    resources: BTreeMap<String, String>,
}

/// A delta ADS client.
pub struct DeltaAdsClient {
    node: Node,
    node_sent: bool,
    tx: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    inbound: Streaming<DeltaDiscoveryResponse>,
    checker: DeltaChecker,
    last: Option<DeltaResponse>,
    pub timeout: Duration,
}

impl DeltaAdsClient {
    /// Checks responses' envelopes and resource names without decoding the resources
    /// ([`DeltaChecker::light`]).
    pub fn set_light(&mut self, light: bool) {
        self.checker.light = light;
    }

    /// Opens `DeltaAggregatedResources` to `addr`.
    pub async fn connect(addr: impl Display, node_id: &str, metadata: serde_json::Value) -> Result<DeltaAdsClient> {
        let mut client = AggregatedDiscoveryServiceClient::new(channel(addr).await?)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let (tx, rx) = mpsc::unbounded_channel();
        let inbound = client
            .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .context("opening DeltaAggregatedResources")?
            .into_inner();
        Ok(DeltaAdsClient {
            node: node(node_id, &metadata),
            node_sent: false,
            tx,
            inbound,
            checker: DeltaChecker::default(),
            last: None,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sends a raw request (the node is added to the first one).
    pub fn send_raw(&mut self, mut req: DeltaDiscoveryRequest) -> Result<()> {
        if !self.node_sent {
            req.node.get_or_insert_with(|| self.node.clone());
            self.node_sent = true;
        }
        self.tx.send(req).map_err(|_| anyhow!("delta ADS stream closed"))
    }

    /// Subscribes to `names`. The first request of a type with no names is a wildcard
    /// subscription (CDS/LDS); `initial` are the versions this client claims to have already.
    pub fn subscribe_with(&mut self, type_url: &str, names: &[&str], initial: &BTreeMap<String, String>) -> Result<()> {
        let first = self.checker.subscribe(type_url, names, initial);
        let req = DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
            initial_resource_versions: if first {
                initial.clone().into_iter().collect()
            } else {
                Default::default()
            },
            ..Default::default()
        };
        self.send_raw(req)
    }

    pub fn subscribe(&mut self, type_url: &str, names: &[&str]) -> Result<()> {
        self.subscribe_with(type_url, names, &BTreeMap::new())
    }

    /// Unsubscribes from `names` and forgets them.
    pub fn unsubscribe(&mut self, type_url: &str, names: &[&str]) -> Result<()> {
        self.checker.unsubscribe(type_url, names);
        let req = DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_unsubscribe: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        self.send_raw(req)
    }

    /// What this client has of `type_url`: name -> version.
    pub fn resources(&self, type_url: &str) -> BTreeMap<String, String> {
        self.checker.resources(type_url)
    }

    /// Receives the next response, checks it and applies it to what this client has.
    pub async fn recv(&mut self) -> Result<DeltaResponse> {
        let msg = tokio::time::timeout(self.timeout, self.inbound.message())
            .await
            .map_err(|_| anyhow!("no delta xDS response within {:?}", self.timeout))?
            .map_err(|s| anyhow!("delta ADS stream failed: {:?}: {}", s.code(), s.message()))?
            .ok_or_else(|| anyhow!("delta ADS stream closed by the server"))?;
        self.checker.check(&msg)?;
        let resp = DeltaResponse { raw: msg };
        self.last = Some(resp.clone());
        Ok(resp)
    }

    /// The gRPC status the stream ends with.
    pub async fn recv_status(&mut self) -> Result<tonic::Status> {
        super::end_status(&mut self.inbound, self.timeout, |r| &r.type_url).await
    }

    /// Fails if a response arrives within `wait`.
    pub async fn expect_no_response(&mut self, wait: Duration) -> Result<()> {
        match tokio::time::timeout(wait, self.inbound.message()).await {
            Err(_) => Ok(()),
            Ok(Ok(Some(r))) => bail!(
                "unexpected delta {} response: {:?} removed {:?}",
                r.type_url,
                r.resources.iter().map(|r| &r.name).collect::<Vec<_>>(),
                r.removed_resources
            ),
            Ok(Ok(None)) => bail!("delta ADS stream closed by the server"),
            Ok(Err(s)) => bail!("delta ADS stream failed: {:?}: {}", s.code(), s.message()),
        }
    }

    /// ACKs the last response.
    pub fn ack(&mut self) -> Result<()> {
        let last = self.last.take().ok_or_else(|| anyhow!("nothing to ACK"))?;
        self.send_raw(DeltaDiscoveryRequest {
            type_url: last.raw.type_url,
            response_nonce: last.raw.nonce,
            ..Default::default()
        })
    }

    /// NACKs the last response with `detail`.
    pub fn nack(&mut self, detail: &str) -> Result<()> {
        let last = self.last.take().ok_or_else(|| anyhow!("nothing to NACK"))?;
        self.send_raw(DeltaDiscoveryRequest {
            type_url: last.raw.type_url,
            response_nonce: last.raw.nonce,
            error_detail: Some(RpcStatus {
                code: NACK_CODE,
                message: detail.to_owned(),
                details: vec![],
            }),
            ..Default::default()
        })
    }

    pub async fn recv_ack(&mut self) -> Result<DeltaResponse> {
        let r = self.recv().await?;
        self.ack()?;
        Ok(r)
    }
}

/// The protocol checks of a delta stream and what the client has, usable on their own.
#[derive(Debug, Default)]
pub(crate) struct DeltaChecker {
    types: BTreeMap<String, TypeState>,
    nonces: HashSet<String>,
    /// Read resource names with [`resource_name_light`] instead of decoding every resource.
    pub light: bool,
}

impl DeltaChecker {
    /// Records a subscription; returns whether it is the first of its type (the one that
    /// carries `initial` versions and, with no names, means wildcard for CDS/LDS).
    pub(crate) fn subscribe(&mut self, type_url: &str, names: &[&str], initial: &BTreeMap<String, String>) -> bool {
        let first = !self.types.contains_key(type_url);
        let st = self.types.entry(type_url.to_owned()).or_default();
        if first {
            st.wildcard = names.is_empty() && !is_named_type(type_url) || names.contains(&"*");
            st.resources = initial.clone();
        }
        for n in names.iter().filter(|n| **n != "*") {
            st.names.insert(n.to_string());
            st.allowed.insert(n.to_string());
        }
        first
    }

    /// Records an unsubscription: the names are forgotten.
    pub(crate) fn unsubscribe(&mut self, type_url: &str, names: &[&str]) {
        let st = self.types.entry(type_url.to_owned()).or_default();
        for n in names {
            st.names.remove(*n);
            st.resources.remove(*n);
        }
    }

    /// What the client has of `type_url`: name -> version.
    pub(crate) fn resources(&self, type_url: &str) -> BTreeMap<String, String> {
        self.types
            .get(type_url)
            .map(|s| s.resources.clone())
            .unwrap_or_default()
    }

    /// Checks one response and applies it to what the client has.
    pub(crate) fn check(&mut self, raw: &DeltaDiscoveryResponse) -> Result<()> {
        let t = raw.type_url.as_str();
        let violation = |what: String| {
            anyhow!(
                "xDS protocol violation in delta {t} response (nonce {:?}): {what}",
                raw.nonce
            )
        };
        let Some(st) = self.types.get_mut(t) else {
            return Err(violation("type was never subscribed".into()));
        };
        if raw.nonce.is_empty() {
            return Err(violation("empty nonce".into()));
        }
        if !self.nonces.insert(raw.nonce.clone()) {
            return Err(violation("nonce reused on this stream".into()));
        }
        if raw.system_version_info.is_empty() {
            return Err(violation("empty system_version_info".into()));
        }
        let mut seen = BTreeSet::new();
        for r in &raw.resources {
            if r.name.is_empty() || r.version.is_empty() {
                return Err(violation(format!(
                    "resource {:?} without name or version {:?}",
                    r.name, r.version
                )));
            }
            let Some(any) = &r.resource else {
                return Err(violation(format!("resource {:?} has no body", r.name)));
            };
            if any.type_url != t {
                return Err(violation(format!(
                    "resource {:?} has type_url {}",
                    r.name, any.type_url
                )));
            }
            let name = if self.light {
                resource_name_light(any)
            } else {
                resource_name(any)
            };
            if let Some(n) = name.map_err(|e| violation(e.to_string()))?
                && n != r.name
            {
                return Err(violation(format!("resource named {:?} carries {n:?}", r.name)));
            }
            if !seen.insert(r.name.as_str()) {
                return Err(violation(format!("resource {:?} twice", r.name)));
            }
            if raw.removed_resources.contains(&r.name) {
                return Err(violation(format!("resource {:?} both sent and removed", r.name)));
            }
            if !st.wildcard && !st.allowed.contains(&r.name) {
                return Err(violation(format!(
                    "resource {:?} was not subscribed (subscribed: {:?})",
                    r.name, st.names
                )));
            }
        }
        for r in &raw.resources {
            st.resources.insert(r.name.clone(), r.version.clone());
        }
        for n in &raw.removed_resources {
            st.resources.remove(n);
        }
        st.allowed = st.names.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xds_api::envoy::config::cluster::v3::Cluster;
    use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use xds_api::envoy::service::discovery::v3::Resource;
    use xds_api::{pack, type_url};

    fn cluster(name: &str, version: &str) -> Resource {
        Resource {
            name: name.into(),
            version: version.into(),
            resource: Some(pack(&Cluster {
                name: name.into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn response(t: &str, nonce: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            type_url: t.into(),
            system_version_info: "v1".into(),
            nonce: nonce.into(),
            resources,
            removed_resources: removed.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn applies_resources_and_removals() {
        let mut c = DeltaChecker::default();
        let initial = BTreeMap::from([("old".to_string(), "1".to_string())]);
        assert!(c.subscribe(type_url::CLUSTER, &[], &initial));
        c.check(&response(
            type_url::CLUSTER,
            "1",
            vec![cluster("a", "1"), cluster("b", "1")],
            &["old"],
        ))
        .unwrap();
        c.check(&response(type_url::CLUSTER, "2", vec![cluster("a", "2")], &["b"]))
            .unwrap();
        assert_eq!(
            c.resources(type_url::CLUSTER),
            BTreeMap::from([("a".to_string(), "2".to_string())])
        );
    }

    #[test]
    fn reports_each_violation() {
        let mut c = DeltaChecker::default();
        c.subscribe(type_url::CLUSTER, &[], &BTreeMap::new());
        c.subscribe(type_url::ENDPOINT, &["a"], &BTreeMap::new());
        let mut err = |r: DeltaDiscoveryResponse| c.check(&r).unwrap_err().to_string();
        assert!(err(response(type_url::LISTENER, "1", vec![], &[])).contains("never subscribed"));
        assert!(err(response(type_url::CLUSTER, "", vec![], &[])).contains("empty nonce"));
        assert!(err(response(type_url::CLUSTER, "2", vec![cluster("a", "")], &[])).contains("without name or version"));
        assert!(err(response(type_url::CLUSTER, "2", vec![], &[])).contains("nonce reused"));
        assert!(
            err(response(type_url::CLUSTER, "3", vec![cluster("a", "1")], &["a"])).contains("both sent and removed")
        );
        assert!(err(response(type_url::ENDPOINT, "4", vec![cluster("a", "1")], &[])).contains("has type_url"));
        let cla = Resource {
            name: "z".into(),
            version: "1".into(),
            resource: Some(pack(&ClusterLoadAssignment {
                cluster_name: "z".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert!(err(response(type_url::ENDPOINT, "5", vec![cla], &[])).contains(r#""z" was not subscribed"#));
        let mut wrong_name = cluster("a", "1");
        wrong_name.name = "b".into();
        assert!(err(response(type_url::CLUSTER, "6", vec![wrong_name], &[])).contains("carries"));
    }
}
