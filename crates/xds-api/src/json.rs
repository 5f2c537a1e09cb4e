//! Envoy protos as proto3 JSON, for `/debug/config_dump` and readable golden files. The prost
//! structs from envoy-types carry no serde support, so messages go through bytes into
//! `prost-reflect` dynamic messages, described by a descriptor pool compiled from envoy-types'
//! `.proto` sources at build time (see `build.rs` for which files it holds).

use std::sync::LazyLock;

use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, ReflectMessage, SerializeOptions,
};

use crate::pbwkt;

static DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptor.bin"));

/// The pool decoded from `build.rs`'s descriptor set, once, on first use.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // The descriptor set is written by our own build script, never by a user.
    DescriptorPool::decode(DESCRIPTOR_SET).expect("envoy_descriptor.bin from build.rs is a valid FileDescriptorSet")
});

/// Why a message could not be rendered as JSON or parsed from it.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("unknown message type {type_url} (hint: add its .proto to ROOTS in crates/xds-api/build.rs)")]
    UnknownType { type_url: String },
    #[error("decoding {type_name}: {source}")]
    Decode {
        type_name: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("rendering {type_name} as JSON: {source}")]
    Render {
        type_name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("parsing JSON as {type_name}: {source}")]
    Parse {
        type_name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// How to render JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JsonOptions {
    /// Use the proto field names (`connect_timeout`), as Envoy's admin `config_dump` prints them,
    /// instead of the lowerCamelCase JSON names (`connectTimeout`).
    pub snake_case: bool,
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions { snake_case: true }
    }
}

impl JsonOptions {
    fn serialize_options(&self) -> SerializeOptions {
        SerializeOptions::new().use_proto_field_name(self.snake_case)
    }
}

/// Renders an `Any` as canonical proto3 JSON with default options: `@type` first, then the
/// message's fields, nested `Any`s (`typed_config`) expanded the same way.
pub fn any_to_json(any: &pbwkt::Any) -> Result<serde_json::Value, JsonError> {
    any_to_json_with(any, JsonOptions::default())
}

/// [`any_to_json`] with explicit options.
pub(crate) fn any_to_json_with(any: &pbwkt::Any, options: JsonOptions) -> Result<serde_json::Value, JsonError> {
    let type_name = any
        .type_url
        .rsplit_once('/')
        .map_or(any.type_url.as_str(), |(_, name)| name);
    if POOL.get_message_by_name(type_name).is_none() {
        return Err(JsonError::UnknownType {
            type_url: any.type_url.clone(),
        });
    }
    let any_desc = descriptor::<pbwkt::Any>()?;
    render(&decode(any_desc, &any.encode_to_vec())?, options)
}

/// Renders a prost message as canonical proto3 JSON with default options.
pub fn message_to_json<M: prost::Message + prost::Name>(m: &M) -> Result<serde_json::Value, JsonError> {
    message_to_json_with(m, JsonOptions::default())
}

/// [`message_to_json`] with explicit options.
pub(crate) fn message_to_json_with<M: prost::Message + prost::Name>(
    m: &M,
    options: JsonOptions,
) -> Result<serde_json::Value, JsonError> {
    let message = decode(descriptor::<M>()?, &m.encode_to_vec())?;
    render(&message, options)
}

/// Parses proto3 JSON (proto field names or JSON names) into a prost message. Unknown fields and
/// `Any`s of unknown types are errors.
pub fn json_to_message<M: prost::Message + prost::Name + Default>(v: &serde_json::Value) -> Result<M, JsonError> {
    let desc = descriptor::<M>()?;
    let message = DynamicMessage::deserialize_with_options(desc, v, &DeserializeOptions::new()).map_err(|source| {
        JsonError::Parse {
            type_name: M::full_name(),
            source,
        }
    })?;
    M::decode(message.encode_to_vec().as_slice()).map_err(|source| JsonError::Decode {
        type_name: M::full_name(),
        source,
    })
}

fn descriptor<M: prost::Name>() -> Result<MessageDescriptor, JsonError> {
    POOL.get_message_by_name(&M::full_name())
        .ok_or_else(|| JsonError::UnknownType {
            type_url: M::type_url(),
        })
}

fn decode(desc: MessageDescriptor, bytes: &[u8]) -> Result<DynamicMessage, JsonError> {
    let type_name = desc.full_name().to_string();
    DynamicMessage::decode(desc, bytes).map_err(|source| JsonError::Decode { type_name, source })
}

fn render(message: &DynamicMessage, options: JsonOptions) -> Result<serde_json::Value, JsonError> {
    message
        .serialize_with_options(serde_json::value::Serializer, &options.serialize_options())
        .map_err(|source| render_error(message.descriptor().full_name(), source))
}

/// prost-reflect reports a nested `Any` of a type outside the pool as `message 'NAME' not found`;
/// name it by type URL like a top-level one.
fn render_error(type_name: &str, source: serde_json::Error) -> JsonError {
    let text = source.to_string();
    match text
        .strip_prefix("message '")
        .and_then(|rest| rest.strip_suffix("' not found"))
    {
        Some(name) => JsonError::UnknownType {
            type_url: format!("type.googleapis.com/{name}"),
        },
        None => JsonError::Render {
            type_name: type_name.to_string(),
            source,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::envoy::config::bootstrap::v3::{Bootstrap, bootstrap::StaticResources};
    use crate::envoy::config::cluster::v3::{Cluster, cluster};
    use crate::envoy::config::core::v3::{Address, Http2ProtocolOptions, SocketAddress, address, socket_address};
    use crate::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    use crate::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use crate::envoy::config::route::v3::{
        Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action, route_match,
    };
    use crate::envoy::extensions::filters::http::router::v3::Router;
    use crate::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
    };
    use crate::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
    use crate::pack;
    use serde_json::json;

    fn socket(ip: &str, port: u32) -> Address {
        Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: ip.into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                ..Default::default()
            })),
        }
    }

    /// A static HTTP/2 cluster, as the agent's bootstrap has for xds-grpc.
    fn http2_cluster() -> Cluster {
        use http_protocol_options::{
            ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
        };
        let h2 = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
            })),
            ..Default::default()
        };
        let endpoint = LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(socket("127.0.0.1", 15010)),
                ..Default::default()
            })),
            ..Default::default()
        };
        Cluster {
            name: "xds-grpc".into(),
            connect_timeout: Some(pbwkt::Duration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Static as i32,
            )),
            load_assignment: Some(ClusterLoadAssignment {
                cluster_name: "xds-grpc".into(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: vec![endpoint],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            typed_extension_protocol_options: [(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
                pack(&h2),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// A listener whose HCM routes everything to `cluster`, with a typed Router filter.
    fn http_listener(cluster: &str) -> Listener {
        let route = Route {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        };
        let hcm = HttpConnectionManager {
            stat_prefix: "inbound_0.0.0.0_18080".into(),
            route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
                RouteConfiguration {
                    name: "local".into(),
                    virtual_hosts: vec![VirtualHost {
                        name: "all".into(),
                        domains: vec!["*".into()],
                        routes: vec![route],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            http_filters: vec![HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack(&Router::default()))),
                ..Default::default()
            }],
            ..Default::default()
        };
        Listener {
            name: "0.0.0.0_18080".into(),
            address: Some(socket("0.0.0.0", 18080)),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack(&hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn cluster_round_trips_with_typed_protocol_options() {
        let cluster = http2_cluster();
        let j = message_to_json(&cluster).unwrap();
        assert_eq!(j["name"], "xds-grpc");
        assert_eq!(j["connect_timeout"], "1.500s");
        assert_eq!(j["type"], "STATIC");
        let options = &j["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        assert_eq!(
            options["@type"],
            "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        );
        assert_eq!(options["explicit_http_config"]["http2_protocol_options"], json!({}));
        let endpoint = &j["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
        assert_eq!(
            endpoint["address"]["socket_address"],
            json!({"address": "127.0.0.1", "port_value": 15010})
        );

        let back: Cluster = json_to_message(&j).unwrap();
        assert_eq!(back, cluster);
        assert_eq!(message_to_json(&back).unwrap(), j);
    }

    #[test]
    fn listener_round_trips_with_nested_typed_configs() {
        let listener = http_listener("outbound|80||a.default.svc.cluster.local");
        let j = message_to_json(&listener).unwrap();
        let hcm = &j["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(
            hcm["@type"],
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        );
        assert_eq!(hcm["stat_prefix"], "inbound_0.0.0.0_18080");
        assert_eq!(
            hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"],
            "outbound|80||a.default.svc.cluster.local"
        );
        let router = &hcm["http_filters"][0]["typed_config"];
        assert_eq!(
            *router,
            json!({"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"})
        );

        let back: Listener = json_to_message(&j).unwrap();
        assert_eq!(back, listener);
        assert_eq!(message_to_json(&back).unwrap(), j);
    }

    #[test]
    fn camel_case_option_uses_json_names_and_both_parse() {
        let cluster = http2_cluster();
        let camel = message_to_json_with(&cluster, JsonOptions { snake_case: false }).unwrap();
        assert_eq!(camel["connectTimeout"], "1.500s");
        assert!(camel.get("connect_timeout").is_none());
        assert!(camel["typedExtensionProtocolOptions"].is_object());
        assert_eq!(json_to_message::<Cluster>(&camel).unwrap(), cluster);
    }

    #[test]
    fn any_renders_with_type_first() {
        let j = any_to_json(&pack(&http2_cluster())).unwrap();
        assert_eq!(j["@type"], "type.googleapis.com/envoy.config.cluster.v3.Cluster");
        assert_eq!(j["name"], "xds-grpc");
        assert_eq!(j.as_object().unwrap().keys().next().map(String::as_str), Some("@type"));
    }

    #[test]
    fn well_known_type_in_any_renders_as_value() {
        let any = pack(&pbwkt::Duration { seconds: 5, nanos: 0 });
        assert_eq!(
            any_to_json(&any).unwrap(),
            json!({"@type": "type.googleapis.com/google.protobuf.Duration", "value": "5s"})
        );
    }

    #[test]
    fn unknown_types_are_named_by_url() {
        let any = pbwkt::Any {
            type_url: "type.googleapis.com/istio.stats.PluginConfig".into(),
            value: vec![],
        };
        let err = any_to_json(&any).unwrap_err();
        assert!(
            matches!(&err, JsonError::UnknownType { type_url } if type_url == &any.type_url),
            "{err}"
        );

        let mut listener = http_listener("c");
        listener.filter_chains[0].filters[0].config_type = Some(filter::ConfigType::TypedConfig(any.clone()));
        let err = message_to_json(&listener).unwrap_err();
        assert!(
            matches!(&err, JsonError::UnknownType { type_url } if type_url == &any.type_url),
            "{err}"
        );
        assert!(err.to_string().contains("istio.stats.PluginConfig"));
    }

    #[test]
    fn json_with_unknown_field_is_rejected() {
        let err = json_to_message::<Cluster>(&json!({"name": "c", "no_such_field": 1})).unwrap_err();
        assert!(
            matches!(err, JsonError::Parse { ref type_name, .. } if type_name == "envoy.config.cluster.v3.Cluster")
        );
        assert!(err.to_string().contains("no_such_field"), "{err}");
    }

    #[test]
    fn bad_bytes_fail_to_decode() {
        let any = pbwkt::Any {
            type_url: crate::type_url::CLUSTER.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        assert!(any_to_json(&any).is_err());
    }

    /// The Envoy binary: `$ENVOY_BIN`, else the one `scripts/install-envoy.sh` put in the workspace's
    /// `.venv`; panics, failing the test, when there is none. (`test_support::envoy` has the full
    /// locator, but test-support depends on this crate.)
    fn envoy_bin() -> std::path::PathBuf {
        const HOW: &str = "run scripts/install-envoy.sh (it installs one into <workspace>/.venv) \
                           or set ENVOY_BIN to an envoy binary";
        if let Some(bin) = std::env::var_os("ENVOY_BIN").filter(|bin| !bin.is_empty()) {
            let bin = std::path::PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "this test needs an Envoy binary, and ENVOY_BIN={} is not a file: {HOW}",
                bin.display()
            );
            return bin;
        }
        let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
        std::fs::read_dir(&lib)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
            .map(|entry| entry.path().join("site-packages/envoy/_bin/envoy"))
            .find(|bin| bin.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "this test needs an Envoy binary: ENVOY_BIN is unset and {} holds none: {HOW}",
                    lib.display()
                )
            })
    }

    #[test]
    fn envoy_accepts_rendered_bootstrap() {
        let envoy = envoy_bin();
        let bootstrap = Bootstrap {
            static_resources: Some(StaticResources {
                clusters: vec![http2_cluster()],
                listeners: vec![http_listener("xds-grpc")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let j = message_to_json(&bootstrap).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
        let out = std::process::Command::new(envoy)
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy rejected the bootstrap:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
