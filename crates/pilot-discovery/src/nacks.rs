//! What a proxy rejected, traced back to the Istio configs that produced it, for `/debug/syncz`
//! and `/debug/config_errors`: validation is meant to let through only what Envoy accepts, and this is
//! the defence in depth for when it does not (a NACK otherwise leaves a proxy on its old routes
//! with nothing pointing at the config to fix).
//!
//! For each type a proxy NACKed, the resources it was sent are generated again from the current
//! push; those the NACK message names (all, if it names none) are the rejected ones, and the
//! configs are read off their Istio metadata (`filter_metadata.istio.config`, as Istio's
//! `BuildConfigInfoMetadata`: VirtualServices on routes, DestinationRules on clusters).

use std::collections::BTreeSet;

use environment::Environment;
use prost::Message;
use serde::Serialize;
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::core::v3::Metadata;
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::pbwkt::value::Kind;
use xds_api::type_url;
use xds_server::DiscoveryServer;

/// One NACKed type of one proxy.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    pub proxy: String,
    pub type_url: String,
    /// Envoy's message (bounded, as kept by the server).
    pub error: String,
    /// The rejected resources: those the message names, else all that were sent.
    pub resources: Vec<String>,
    /// Istio config paths (`/apis/<group>/<version>/namespaces/<ns>/<kind>/<name>`).
    pub configs: Vec<String>,
}

/// Every current NACK, traced.
pub fn rejections(server: &DiscoveryServer<Environment>) -> Vec<Rejection> {
    let mut out = Vec::new();
    for conn in server.connections() {
        let nacked: Vec<_> = conn.watched.iter().filter(|(_, w)| !w.last_error.is_empty()).collect();
        if nacked.is_empty() {
            continue;
        }
        let types: Vec<&str> = nacked.iter().map(|(t, _)| t.as_str()).collect();
        let Ok(current) = server.current_resources(&conn.connection_id, &types) else {
            continue;
        };
        for (t, w) in nacked {
            let sent = current.of(t);
            let named: Vec<_> = sent.iter().filter(|r| w.last_error.contains(r.name.as_str())).collect();
            let rejected = if named.is_empty() { sent.iter().collect() } else { named };
            let configs: BTreeSet<String> = rejected
                .iter()
                .flat_map(|r| config_paths(t, &r.resource.value))
                .collect();
            out.push(Rejection {
                proxy: conn.node_id.clone(),
                type_url: t.clone(),
                error: w.last_error.clone(),
                resources: rejected.iter().map(|r| r.name.clone()).collect(),
                configs: configs.into_iter().collect(),
            });
        }
    }
    out
}

/// The configs named in one resource's Istio metadata.
fn config_paths(t: &str, bytes: &[u8]) -> Vec<String> {
    match t {
        type_url::ROUTE => RouteConfiguration::decode(bytes)
            .map(|rc| {
                rc.virtual_hosts
                    .iter()
                    .flat_map(|vh| &vh.routes)
                    .filter_map(|r| istio_config(r.metadata.as_ref()))
                    .collect()
            })
            .unwrap_or_default(),
        type_url::VIRTUAL_HOST => VirtualHost::decode(bytes)
            .map(|vh| {
                vh.routes
                    .iter()
                    .filter_map(|r| istio_config(r.metadata.as_ref()))
                    .collect()
            })
            .unwrap_or_default(),
        type_url::CLUSTER => Cluster::decode(bytes)
            .ok()
            .and_then(|c| istio_config(c.metadata.as_ref()))
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

fn istio_config(md: Option<&Metadata>) -> Option<String> {
    let v = md?.filter_metadata.get("istio")?.fields.get("config")?;
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Whether an Istio config path names the config `kind`/`namespace`/`name` (any API version).
pub fn names_config(path: &str, kind: &str, namespace: &str, name: &str) -> bool {
    path.ends_with(&format!("/namespaces/{namespace}/{}/{name}", kebab(kind)))
}

/// `VirtualService` -> `virtual-service`, as Istio's config paths spell kinds.
fn kebab(kind: &str) -> String {
    let mut out = String::with_capacity(kind.len() + 2);
    for (i, c) in kind.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xds_api::envoy::config::route::v3::Route;
    use xds_api::pbwkt::{Struct, Value};

    fn metadata(path: &str) -> Option<Metadata> {
        let istio = Struct {
            fields: [(
                "config".to_owned(),
                Value {
                    kind: Some(Kind::StringValue(path.into())),
                },
            )]
            .into(),
        };
        Some(Metadata {
            filter_metadata: [("istio".to_owned(), istio)].into(),
            ..Default::default()
        })
    }

    #[test]
    fn routes_name_their_virtual_services_and_clusters_their_destination_rules() {
        let rc = RouteConfiguration {
            name: "http.8080".into(),
            virtual_hosts: vec![VirtualHost {
                routes: vec![
                    Route {
                        metadata: metadata("/apis/networking.istio.io/v1/namespaces/default/virtual-service/reviews"),
                        ..Default::default()
                    },
                    Route::default(),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            config_paths(type_url::ROUTE, &rc.encode_to_vec()),
            vec!["/apis/networking.istio.io/v1/namespaces/default/virtual-service/reviews"]
        );
        // the same host over VHDS
        assert_eq!(
            config_paths(type_url::VIRTUAL_HOST, &rc.virtual_hosts[0].encode_to_vec()),
            vec!["/apis/networking.istio.io/v1/namespaces/default/virtual-service/reviews"]
        );
        let c = Cluster {
            metadata: metadata("/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"),
            ..Default::default()
        };
        assert_eq!(config_paths(type_url::CLUSTER, &c.encode_to_vec()).len(), 1);
        assert!(config_paths(type_url::ROUTE, b"\xff\xff").is_empty());
    }

    #[test]
    fn paths_match_configs_of_any_api_version() {
        let p = "/apis/networking.istio.io/v1beta1/namespaces/default/virtual-service/reviews";
        assert!(names_config(p, "VirtualService", "default", "reviews"));
        assert!(!names_config(p, "VirtualService", "default", "review"));
        assert!(!names_config(p, "DestinationRule", "default", "reviews"));
        assert_eq!(kebab("ServiceEntry"), "service-entry");
    }
}
