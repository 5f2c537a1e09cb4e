//! xDS API types and type URLs. Envoy's protos come from the `envoy-types` crate; this crate
//! names the type URLs pilot serves, packs resources into `Any`, and holds the encoded
//! [`Resource`] that generators make and the ADS server sends.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod canonical;
pub mod json;
mod resource;

pub use resource::{GenerateError, Resource};

pub use envoy_types;
pub use envoy_types::pb::envoy;
pub use envoy_types::pb::google::protobuf as pbwkt;

use prost::Name;

/// Type URLs, as Istio's `pkg/model/typeurl.go` (v3).
pub mod type_url {
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// Envoy's VHDS: the virtual hosts of route configurations, delta xDS only. Envoy subscribes
    /// without names (its namespace matching keeps route configuration names out of requests)
    /// and gives each resource, named `<route configuration>/<virtual host>`, to the route
    /// configuration named before the last `/`.
    pub const VIRTUAL_HOST: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    /// Istio's name table for the agent's DNS proxy.
    pub const NAME_TABLE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
    /// Istio's ProxyConfig delivered to the agent.
    pub const PROXY_CONFIG: &str = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig";

    /// Short name used in metrics and logs (`cds`, `eds`, ...), as Istio's `v3.GetShortType`.
    pub fn short(type_url: &str) -> &'static str {
        match type_url {
            CLUSTER => "cds",
            ENDPOINT => "eds",
            LISTENER => "lds",
            ROUTE => "rds",
            VIRTUAL_HOST => "vhds",
            SECRET => "sds",
            NAME_TABLE => "nds",
            PROXY_CONFIG => "pcds",
            _ => "unknown",
        }
    }

    /// Push order for a full push: CDS, EDS, LDS, RDS, VHDS, then the rest.
    pub fn push_order(type_url: &str) -> u8 {
        match type_url {
            CLUSTER => 0,
            ENDPOINT => 1,
            LISTENER => 2,
            ROUTE => 3,
            VIRTUAL_HOST => 4,
            SECRET => 5,
            _ => 6,
        }
    }
}

/// Packs a message into `Any` with its full type URL. Messages with map fields the generators
/// fill (routes, RBAC, jwt_authn) get their map entries in a stable order ([`canonical`]), so
/// equal messages pack to equal bytes.
pub fn pack<M: prost::Message + Name>(m: &M) -> pbwkt::Any {
    let type_url = M::type_url();
    let mut value = m.encode_to_vec();
    if let Some(fields) = canonical::map_fields(&type_url) {
        // prost's own output always parses; if it did not, the bytes (sorted or not) stay valid
        let sorted = canonical::sort_map_entries(&mut value, fields);
        debug_assert!(sorted.is_ok(), "{type_url}: {sorted:?}");
    }
    pbwkt::Any { type_url, value }
}

/// Converts a protobuf `Struct` (node metadata) to JSON.
pub fn struct_to_json(s: &pbwkt::Struct) -> serde_json::Value {
    serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect())
}

fn value_to_json(v: &pbwkt::Value) -> serde_json::Value {
    use pbwkt::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// Converts JSON to a protobuf `Struct` (for node metadata in clients and bootstraps).
pub fn json_to_struct(v: &serde_json::Value) -> pbwkt::Struct {
    match v {
        serde_json::Value::Object(m) => pbwkt::Struct {
            fields: m.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect(),
        },
        _ => pbwkt::Struct::default(),
    }
}

fn json_to_value(v: &serde_json::Value) -> pbwkt::Value {
    use pbwkt::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(pbwkt::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(v)),
    };
    pbwkt::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy::config::cluster::v3::Cluster;

    #[test]
    fn pack_uses_full_type_url() {
        let any = pack(&Cluster {
            name: "c".into(),
            ..Default::default()
        });
        assert_eq!(any.type_url, type_url::CLUSTER);
    }

    #[test]
    fn metadata_round_trip() {
        let j = serde_json::json!({"NAMESPACE": "ns", "LABELS": {"app": "a"}, "N": 1.0, "L": [true]});
        assert_eq!(struct_to_json(&json_to_struct(&j)), j);
    }
}
