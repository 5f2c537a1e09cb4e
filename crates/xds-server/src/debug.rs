//! Istio's xDS debug types, which `istioctl proxy-status` and `istioctl proxy-config`'s
//! control-plane diff ask for over ADS (pilot/pkg/xds/statusgen.go):
//!
//! - `istio.io/debug/syncz`: one `envoy.service.status.v3.ClientConfig` per connected proxy (named
//!   by its `pod.namespace` ID), with the sync state of each type it watches computed from the
//!   nonces as Istio's `debugSyncStatus`: ERROR after a NACK, NOT_SENT before a first response,
//!   SYNCED when the last response is ACKed, STALE otherwise.
//! - `istio.io/debug/config_dump` naming one proxy: what pilot-discovery would send it now, as the
//!   `envoy.admin.v3` config dumps of Envoy's `/config_dump` (bootstrap, clusters, listeners,
//!   scoped routes, routes, secrets, ECDS: Istio's order, without endpoints).
//!
//! Connections that are not proxies (istioctl's own, node metadata `GENERATOR: event`) are left
//! out of syncz. With `ENABLE_DEBUG_ENDPOINT_AUTH` (the default) Istio answers only
//! authenticated callers; pilot-discovery has no caller identities yet (workload certificates
//! come with the mTLS work), so it answers callers on loopback only (`kubectl port-forward`,
//! istioctl's way in) and refuses others with `UNAUTHENTICATED`.

use std::net::SocketAddr;
use std::sync::Arc;

use xds_api::envoy::admin::v3 as admin;
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::status::v3::{ClientConfig, ConfigStatus, client_config::GenericXdsConfig};
use xds_api::pbwkt::{self, Struct, Timestamp, Value, value::Kind};
use xds_api::{Resource, type_url};

use crate::connection::Connection;
use crate::current::CurrentResourcesError;
use crate::lock::lock;
use crate::snapshot::SnapshotBuilder;
use crate::state::ServerState;
use crate::type_filter::{CONFIG_DUMP, SYNCZ, is_debug_type};

impl<B: SnapshotBuilder> ServerState<B> {
    /// The resources answering a debug request of `requester` for `type_url` and `names`.
    pub(crate) fn debug_resources(
        &self,
        requester: &Connection<B::Snapshot>,
        type_url: &str,
        names: &[String],
    ) -> Result<Vec<Resource>, tonic::Status> {
        if self.debug_requires_loopback() && !is_loopback(&requester.peer) && !self.is_system_identity(requester) {
            tracing::warn!(
                "ADS: {} is not authorized to receive debug info: only callers proven to be of {} (or on \
                 loopback) are, while ENABLE_DEBUG_ENDPOINT_AUTH is on",
                requester.id,
                self.system_namespace()
            );
            return Err(tonic::Status::unauthenticated("authentication required"));
        }
        match type_url {
            SYNCZ => Ok(self.syncz()),
            CONFIG_DUMP => match names {
                [proxy_id] => self.config_dump(proxy_id),
                _ => Err(tonic::Status::invalid_argument(format!(
                    "{CONFIG_DUMP} takes one resource name, the proxy ID (pod.namespace); got {}",
                    names.len()
                ))),
            },
            other => Err(tonic::Status::invalid_argument(format!(
                "unknown debug type {other:?} (served: {SYNCZ}, {CONFIG_DUMP})"
            ))),
        }
    }

    fn syncz(&self) -> Vec<Resource> {
        let mut out = Vec::new();
        for c in self.connection_list() {
            let node = &c.node;
            if node.metadata.raw.get("GENERATOR").and_then(|g| g.as_str()) == Some("event") {
                continue;
            }
            let mut configs: Vec<GenericXdsConfig> = lock(&c.watched)
                .iter()
                .filter(|(t, _)| !is_debug_type(t))
                .map(|(t, w)| GenericXdsConfig {
                    type_url: t.clone(),
                    config_status: sync_status(&w.last_error, &w.nonce_sent, &w.nonce_acked) as i32,
                    last_updated: w.last_sent.map(timestamp),
                    error_state: (!w.last_error.is_empty()).then(|| admin::UpdateFailureState {
                        last_update_attempt: w.last_sent.map(timestamp),
                        details: w.last_error.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect();
            configs.sort_by(|a, b| a.type_url.cmp(&b.type_url));
            let mut metadata = Struct::default();
            for (k, v) in [
                ("CLUSTER_ID", node.metadata.cluster_id.clone()),
                ("NAMESPACE", Some(node.config_namespace.clone())),
                ("ISTIO_VERSION", node.metadata.istio_version.clone()),
            ] {
                if let Some(v) = v.filter(|v| !v.is_empty()) {
                    metadata.fields.insert(
                        k.to_owned(),
                        Value {
                            kind: Some(Kind::StringValue(v)),
                        },
                    );
                }
            }
            let config = ClientConfig {
                node: Some(Node {
                    id: node.id.clone(),
                    metadata: Some(metadata),
                    ..Default::default()
                }),
                generic_xds_configs: configs,
                ..Default::default()
            };
            out.push(Resource::new(node.id.clone(), &config));
        }
        out
    }

    fn config_dump(&self, proxy_id: &str) -> Result<Vec<Resource>, tonic::Status> {
        use CurrentResourcesError as E;
        let current = self
            .current_resources(proxy_id, &[type_url::CLUSTER, type_url::LISTENER, type_url::ROUTE])
            .map_err(|e| match e {
                E::NotConnected(_) => tonic::Status::not_found(format!(
                    "config dump could not find connection for proxyID {proxy_id:?}"
                )),
                E::NoPush => tonic::Status::unavailable(e.to_string()),
                E::Generate { .. } => tonic::Status::internal(e.to_string()),
            })?;
        let version = current.version.clone();
        let resources = |t: &str| current.of(t).iter().map(|r| r.resource.clone());
        let clusters = admin::ClustersConfigDump {
            version_info: version.clone(),
            dynamic_active_clusters: resources(type_url::CLUSTER)
                .map(|c| admin::clusters_config_dump::DynamicCluster {
                    cluster: Some(c.as_ref().clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let listeners = admin::ListenersConfigDump {
            version_info: version.clone(),
            dynamic_listeners: resources(type_url::LISTENER)
                .map(|l| admin::listeners_config_dump::DynamicListener {
                    name: resource_name::<xds_api::envoy::config::listener::v3::Listener>(&l),
                    active_state: Some(admin::listeners_config_dump::DynamicListenerState {
                        version_info: version.clone(),
                        listener: Some(l.as_ref().clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let routes = admin::RoutesConfigDump {
            dynamic_route_configs: resources(type_url::ROUTE)
                .map(|r| admin::routes_config_dump::DynamicRouteConfig {
                    version_info: version.clone(),
                    route_config: Some(r.as_ref().clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let configs = [
            xds_api::pack(&admin::BootstrapConfigDump::default()),
            xds_api::pack(&clusters),
            xds_api::pack(&listeners),
            xds_api::pack(&admin::ScopedRoutesConfigDump::default()),
            xds_api::pack(&routes),
            xds_api::pack(&admin::SecretsConfigDump::default()),
            xds_api::pack(&admin::EcdsConfigDump::default()),
        ];
        // Istio's `AnyToUnnamedResources`.
        Ok(configs
            .into_iter()
            .map(|a| Resource::from_any("", Arc::new(a)))
            .collect())
    }
}

/// Istio's `debugSyncStatus`.
fn sync_status(last_error: &str, nonce_sent: &str, nonce_acked: &str) -> ConfigStatus {
    if !last_error.is_empty() {
        ConfigStatus::Error
    } else if nonce_sent.is_empty() {
        ConfigStatus::NotSent
    } else if nonce_acked == nonce_sent {
        ConfigStatus::Synced
    } else {
        ConfigStatus::Stale
    }
}

fn timestamp(t: std::time::SystemTime) -> Timestamp {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The `name` of a packed resource.
fn resource_name<M: prost::Message + Default + HasName>(any: &pbwkt::Any) -> String {
    M::decode(any.value.as_slice())
        .map(|m| m.name().to_owned())
        .unwrap_or_default()
}

trait HasName {
    fn name(&self) -> &str;
}

impl HasName for xds_api::envoy::config::listener::v3::Listener {
    fn name(&self) -> &str {
        &self.name
    }
}

impl<B: SnapshotBuilder> ServerState<B> {
    /// Istio's debug authorization: a caller proven (secure port) to be of the system namespace.
    fn is_system_identity(&self, requester: &Connection<B::Snapshot>) -> bool {
        requester
            .verified_identity
            .as_deref()
            .and_then(identity_namespace)
            .is_some_and(|ns| ns == self.system_namespace())
    }
}

/// The namespace of `spiffe://<td>/ns/<ns>/sa/<sa>`.
fn identity_namespace(id: &str) -> Option<&str> {
    let rest = id.strip_prefix("spiffe://")?;
    let mut p = rest.split('/');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(_), Some("ns"), Some(ns), Some("sa")) if !ns.is_empty() => Some(ns),
        _ => None,
    }
}

fn is_loopback(peer: &str) -> bool {
    peer.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_status_as_istios() {
        assert_eq!(sync_status("", "", ""), ConfigStatus::NotSent);
        assert_eq!(sync_status("", "3", "3"), ConfigStatus::Synced);
        assert_eq!(sync_status("", "4", "3"), ConfigStatus::Stale);
        assert_eq!(sync_status("bad cluster", "4", "3"), ConfigStatus::Error);
        assert!(is_loopback("127.0.0.1:5000") && is_loopback("[::1]:5000"));
        assert!(!is_loopback("10.0.0.1:5000") && !is_loopback("unix:/x"));
        assert_eq!(
            identity_namespace("spiffe://cluster.local/ns/istio-system/sa/istioctl"),
            Some("istio-system")
        );
        assert_eq!(identity_namespace("spiffe://cluster.local/ns//sa/x"), None);
        assert_eq!(identity_namespace("https://cluster.local/ns/istio-system/sa/x"), None);
    }
}
