//! `ClusterWrapper`: a cluster under construction with its upstream HTTP protocol options, and
//! the upstream protocol choices (explicit h2, follow the downstream), as Istio's `clusterWrapper`.

use model::{Endpoint, Port, Protocol, Proxy};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig, explicit_http_config::ProtocolConfig,
};

use super::{HTTP_PROTOCOL_OPTIONS, STAT_PREFIX_DELIMITER};

/// A cluster under construction and its upstream HTTP protocol options, which are packed into
/// `typed_extension_protocol_options` at the end (Istio's `clusterWrapper`).
pub(crate) struct ClusterWrapper {
    pub(crate) cluster: Cluster,
    pub(crate) http: Option<HttpProtocolOptions>,
    /// For DNS clusters: the registry endpoints in `load_assignment` (Istio's
    /// `dnsWrappedLocalityLbEndpoints`).
    pub(crate) dns_endpoints: Vec<Endpoint>,
}

impl ClusterWrapper {
    pub(super) fn new(name: &str, discovery: cluster::DiscoveryType) -> ClusterWrapper {
        ClusterWrapper {
            cluster: Cluster {
                name: name.to_owned(),
                alt_stat_name: format!("{name}{STAT_PREFIX_DELIMITER}"),
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(discovery as i32)),
                common_lb_config: Some(cluster::CommonLbConfig::default()),
                ..Default::default()
            },
            http: None,
            dns_endpoints: Vec::new(),
        }
    }

    pub(crate) fn cluster_type(&self) -> cluster::DiscoveryType {
        match self.cluster.cluster_discovery_type {
            Some(cluster::ClusterDiscoveryType::Type(t)) => {
                cluster::DiscoveryType::try_from(t).unwrap_or(cluster::DiscoveryType::Static)
            }
            _ => cluster::DiscoveryType::Static,
        }
    }

    pub(crate) fn http_options(&mut self) -> &mut HttpProtocolOptions {
        self.http.get_or_insert_with(HttpProtocolOptions::default)
    }

    /// Whether the cluster speaks HTTP/2 upstream (explicit h2 config).
    pub(crate) fn is_http2(&self) -> bool {
        matches!(
            self.http.as_ref().and_then(|h| h.upstream_protocol_options.as_ref()),
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_))
            }))
        )
    }

    /// Istio's `setH2Options`: explicit HTTP/2 unless an upstream protocol is already chosen.
    pub(crate) fn set_h2(&mut self) {
        let options = self.http_options();
        if options.upstream_protocol_options.is_none() {
            options.upstream_protocol_options = Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                    core::Http2ProtocolOptions::default(),
                )),
            }));
        }
    }

    /// Istio's `setUseDownstreamProtocol`: HTTP/1.1 or HTTP/2 upstream as the downstream used.
    pub(crate) fn set_use_downstream_protocol(&mut self) {
        let options = self.http_options();
        let http1 = match options.upstream_protocol_options.take() {
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(h1)),
            })) => h1,
            _ => core::Http1ProtocolOptions::default(),
        };
        options.upstream_protocol_options = Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(http1),
                http2_protocol_options: Some(core::Http2ProtocolOptions::default()),
                ..Default::default()
            },
        ));
    }

    /// Istio's `setUpstreamProtocol`: h2 for HTTP2/gRPC ports; HTTP/1 header case kept on HTTP
    /// and sniffed ports when the proxy's `proxyHeaders.preserveHttp1HeaderCase` says so; sidecars
    /// follow the downstream protocol on ports whose protocol is sniffed.
    pub(super) fn set_upstream_protocol(&mut self, port: &Port, proxy: &Proxy, preserve_header_case: bool) {
        if port.protocol.is_http2() {
            self.set_h2();
            return;
        }
        let sniffed = port.protocol == Protocol::Unsupported;
        if (port.protocol.is_http() || sniffed) && preserve_header_case {
            self.http_options().upstream_protocol_options =
                Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        crate::proxy_headers::preserve_case_http1_options(),
                    )),
                }));
        }
        if sniffed && proxy.is_sidecar() {
            self.set_use_downstream_protocol();
        }
    }

    /// Packs the HTTP protocol options (defaulting to explicit HTTP/1.1, which Envoy requires).
    pub(super) fn build(mut self) -> Cluster {
        if let Some(mut options) = self.http.take() {
            if options.upstream_protocol_options.is_none() {
                options.upstream_protocol_options =
                    Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                            core::Http1ProtocolOptions::default(),
                        )),
                    }));
            }
            self.cluster
                .typed_extension_protocol_options
                .insert(HTTP_PROTOCOL_OPTIONS.into(), xds_api::pack(&options));
        }
        self.cluster
    }
}
