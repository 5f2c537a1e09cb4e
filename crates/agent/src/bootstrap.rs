//! Envoy's v3 bootstrap, as Istio's `tools/packaging/common/envoy_bootstrap.json` template renders
//! it, less Istio-proxy-only extensions (upstream Envoy has no `istio.*` filters or stats sinks):
//! the node, admin on localhost, ADS over the agent's Unix socket, the SDS socket, the Prometheus
//! (15090) and readiness (15021) listeners, stats tags and matchers, runtime and overload limits.
//! Writes `<configPath>/envoy-rev.json`, or renders a user's `--templateFile`, or points at
//! ProxyConfig's `customConfigFile` as is.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::AgentConfig;

mod static_resources;
mod stats;
mod template;

#[cfg(test)]
mod golden_tests;

pub use template::template_params;

/// The bootstrap cluster that reaches the agent's xDS proxy, as Istio names it.
pub const XDS_CLUSTER: &str = "xds-grpc";
/// The bootstrap cluster that reaches the agent's SDS server.
pub const SDS_CLUSTER: &str = "sds-grpc";
/// The cluster routing `/stats/prometheus` on the Prometheus listener to Envoy's admin.
pub const PROMETHEUS_STATS_CLUSTER: &str = "prometheus_stats";
/// The cluster routing `/healthz/ready` on the readiness listener to the agent's status server.
pub const AGENT_CLUSTER: &str = "agent";

/// Which ADS protocol Envoy speaks to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum AdsApi {
    /// State of the world (`GRPC`).
    Sotw,
    /// Incremental (`DELTA_GRPC`), Istio's default since 1.22 (`ISTIO_DELTA_XDS`).
    Delta,
}

impl AdsApi {
    pub fn api_type(self) -> &'static str {
        match self {
            AdsApi::Sotw => "GRPC",
            AdsApi::Delta => "DELTA_GRPC",
        }
    }
}

/// Choices about the bootstrap that are not part of the agent's config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapOptions {
    pub ads_api: AdsApi,
    /// Envoy's application log as JSON lines (`--log_as_json`).
    pub log_as_json: bool,
}

impl BootstrapOptions {
    /// What the config asks for: `ISTIO_DELTA_XDS` and `--log_as_json`.
    pub fn from_config(cfg: &AgentConfig) -> Self {
        BootstrapOptions {
            ads_api: if cfg.delta_xds { AdsApi::Delta } else { AdsApi::Sotw },
            log_as_json: cfg.log.as_json,
        }
    }
}

/// Why the bootstrap could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("creating the bootstrap directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the bootstrap {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "customConfigFile {path}: {source} (hint: ProxyConfig customConfigFile must name an existing Envoy bootstrap)"
    )]
    CustomConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading bootstrap template {path}: {source}")]
    ReadTemplate {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bootstrap template {path}: {reason}")]
    Template { path: PathBuf, reason: String },
}

/// Envoy's bootstrap for one agent.
pub struct Bootstrap;

impl Bootstrap {
    /// The bootstrap as Istio's template renders it, with upstream Envoy extensions only.
    pub fn render(cfg: &AgentConfig, opts: &BootstrapOptions) -> Value {
        let mut bootstrap = json!({
            "application_log_config": application_log_config(opts.log_as_json),
            "node": node(cfg),
            "layered_runtime": {
                "layers": [
                    {"name": "global config", "static_layer": stats::runtime_flags(&cfg.proxy_config)},
                    {"name": "admin", "admin_layer": {}},
                ],
            },
            "bootstrap_extensions": [{
                "name": "envoy.bootstrap.internal_listener",
                "typed_config": {
                    "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                    "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                    "value": {"buffer_size_kb": 64},
                },
            }],
            "stats_config": stats::stats_config(cfg),
            "admin": {
                "access_log": [{
                    "name": "envoy.access_loggers.file",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                        "path": "/dev/null",
                    },
                }],
                "profile_path": "/var/lib/istio/data/envoy.prof",
                "address": {"socket_address": {"address": cfg.localhost(), "port_value": cfg.proxy_admin_port}},
            },
            "dynamic_resources": dynamic_resources(opts.ads_api),
            "static_resources": static_resources::static_resources(cfg),
            "overload_manager": {
                "resource_monitors": [{
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                        "max_active_downstream_connections": cfg.global_downstream_max_connections,
                    },
                }],
            },
            "deferred_stat_options": {"enable_deferred_creation_stats": true},
        });
        let Some(top) = bootstrap.as_object_mut() else {
            return bootstrap;
        };
        if let Some(interval) = stats::flush_interval(cfg) {
            top.insert("stats_flush_interval".into(), interval.into());
        }
        if let Some(interval) = stats::eviction_interval(cfg) {
            top.insert("stats_eviction_interval".into(), interval.into());
        }
        if let Some(tracing) = static_resources::tracing(cfg) {
            top.insert("tracing".into(), tracing);
        }
        if let Some(sinks) = stats::stats_sinks(cfg) {
            top.insert("stats_sinks".into(), sinks);
        }
        if let Some(path) = &cfg.outlier_log_path {
            top.insert(
                "cluster_manager".into(),
                json!({"outlier_detection": {"event_log_path": path}, "enable_deferred_cluster_creation": true}),
            );
        }
        bootstrap
    }

    /// Writes the bootstrap Envoy should start on and returns its path: ProxyConfig's
    /// `customConfigFile` as is; else the `--templateFile` rendered; else [`Bootstrap::render`]. The
    /// rendered file goes to `<configPath>/envoy-rev.json` (`.yaml` for a YAML template), written
    /// whole before it replaces the previous one.
    pub fn write(cfg: &AgentConfig, opts: &BootstrapOptions) -> Result<PathBuf, BootstrapError> {
        if let Some(custom) = &cfg.paths.custom_config_file {
            std::fs::metadata(custom).map_err(|source| BootstrapError::CustomConfig {
                path: custom.clone(),
                source,
            })?;
            return Ok(custom.clone());
        }
        let (path, text) = match &cfg.paths.template_file {
            Some(template) => {
                let text = template::render_file(template, cfg, opts)?;
                (template::output_path(&cfg.paths.config_path, template), text)
            }
            None => {
                let text = serde_json::to_string_pretty(&Self::render(cfg, opts)).unwrap_or_default();
                (cfg.paths.bootstrap.clone(), text)
            }
        };
        write_whole(&path, text.as_bytes())?;
        Ok(path)
    }
}

fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), BootstrapError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| BootstrapError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write_err = |source| BootstrapError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, bytes).map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
}

fn application_log_config(as_json: bool) -> Value {
    let format = if as_json {
        json!({"json_format": {
            "time": "%Y-%m-%dT%T.%fZ",
            "level": "%l",
            "scope": "envoy %n",
            "msg": "%j",
            "caller": "%g:%#",
            "thread": "%t",
        }})
    } else {
        json!({"text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"})
    };
    json!({"log_format": format})
}

fn node(cfg: &AgentConfig) -> Value {
    let mut locality = serde_json::Map::new();
    for (key, value) in [
        ("region", &cfg.locality.region),
        ("zone", &cfg.locality.zone),
        ("sub_zone", &cfg.locality.subzone),
    ] {
        if !value.is_empty() {
            locality.insert(key.into(), value.as_str().into());
        }
    }
    json!({
        "id": cfg.node_id,
        "cluster": cfg.service_cluster,
        "locality": locality,
        "metadata": cfg.metadata,
    })
}

fn dynamic_resources(api: AdsApi) -> Value {
    let ads_source = json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"});
    json!({
        "lds_config": ads_source,
        "cds_config": ads_source,
        "ads_config": {
            "api_type": api.api_type(),
            "set_node_on_first_message_only": true,
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
        },
    })
}
