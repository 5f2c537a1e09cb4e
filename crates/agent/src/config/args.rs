//! The flags of `pilot-agent proxy [sidecar|router]`, named and defaulted as Istio's
//! (`pilot/cmd/pilot-agent/app/cmd.go` and the `istio.io/pkg/log` flags).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// The proxy's role: the first field of the node ID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyType {
    /// Beside an application, intercepting its traffic.
    #[default]
    Sidecar,
    /// A standalone gateway.
    Router,
}

impl ProxyType {
    pub fn node_type(self) -> model::NodeType {
        match self {
            ProxyType::Sidecar => model::NodeType::SidecarProxy,
            ProxyType::Router => model::NodeType::Router,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.node_type().as_str()
    }
}

/// The platform the proxy's identity (node ID, domain) comes from: Istio 1.7's
/// `--serviceregistry`, whose values were the registries' names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ServiceRegistry {
    /// `POD_NAME.POD_NAMESPACE`, domain `POD_NAMESPACE.svc.cluster.local`.
    #[default]
    #[value(name = "Kubernetes")]
    Kubernetes,
    /// `IP.service.consul`, domain `service.consul`.
    #[value(name = "Consul")]
    Consul,
    /// `IP`, no domain.
    #[value(name = "Mock")]
    Mock,
}

/// `pilot-agent proxy` arguments. Environment variables are read separately (see
/// [`super::AgentConfig::from_args`]), so tests never touch the process environment.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct ProxyArgs {
    /// sidecar (beside an application) or router (a gateway).
    #[arg(value_enum, default_value_t = ProxyType::Sidecar)]
    pub proxy_type: ProxyType,

    /// DNS domain suffix. If not provided uses ${POD_NAMESPACE}.svc.cluster.local
    /// (service.consul with --serviceregistry Consul).
    #[arg(long, default_value = "")]
    pub domain: String,

    /// The platform of the service registry the proxy's identity comes from: Kubernetes,
    /// Consul or Mock.
    #[arg(long = "serviceregistry", value_enum, default_value_t = ServiceRegistry::Kubernetes)]
    pub service_registry: ServiceRegistry,

    /// File name for Istio mesh configuration. If absent, a default mesh is used. This may be
    /// overridden by the PROXY_CONFIG environment variable or the proxy.istio.io/config annotation.
    #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
    pub mesh_config: PathBuf,

    /// Service cluster (used when ProxyConfig's serviceCluster is empty).
    #[arg(long = "serviceCluster", default_value = "istio-proxy")]
    pub service_cluster: String,

    /// Envoy's log level: trace, debug, info, warning, error, critical, off; may include scopes, such
    /// as 'info,misc:error,upstream:debug'.
    #[arg(long = "proxyLogLevel", default_value = "warning")]
    pub proxy_log_level: String,

    /// Envoy's component log level (--component-log-level). Deprecated, use --proxyLogLevel.
    #[arg(long = "proxyComponentLogLevel", default_value = "misc:error")]
    pub proxy_component_log_level: String,

    /// Number of Envoy worker threads (legacy: prefer ProxyConfig concurrency). 0 = not set.
    #[arg(long, default_value_t = 0)]
    pub concurrency: u32,

    /// Go template of the Envoy bootstrap, rendered instead of the built-in bootstrap.
    #[arg(long = "templateFile")]
    pub template_file: Option<PathBuf>,

    /// The log path for outlier detection events.
    #[arg(long = "outlierLogPath", default_value = "")]
    pub outlier_log_path: String,

    /// HTTP port of the Security Token Service. Accepted for compatibility; not served.
    #[arg(long = "stsPort", default_value_t = 0)]
    pub sts_port: u16,

    /// Token provider plugin. Accepted for compatibility; unused.
    #[arg(long = "tokenManagerPlugin", default_value = "")]
    pub token_manager_plugin: String,

    /// Enable profiling via the status server. Accepted for compatibility.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub profiling: bool,

    /// Istio's logging flags (`--log_output_level`, `--log_as_json`, ...).
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

impl Default for ProxyArgs {
    fn default() -> Self {
        ProxyArgs {
            proxy_type: ProxyType::Sidecar,
            domain: String::new(),
            service_registry: ServiceRegistry::Kubernetes,
            mesh_config: PathBuf::from("./etc/istio/config/mesh"),
            service_cluster: "istio-proxy".into(),
            proxy_log_level: "warning".into(),
            proxy_component_log_level: "misc:error".into(),
            concurrency: 0,
            template_file: None,
            outlier_log_path: String::new(),
            sts_port: 0,
            token_manager_plugin: String::new(),
            profiling: true,
            log: crate::logging::LogArgs::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        proxy: ProxyArgs,
    }

    #[test]
    fn defaults_match_istio() {
        let cli = Cli::try_parse_from(["pilot-agent"]).unwrap();
        assert_eq!(cli.proxy, ProxyArgs::default());
    }

    #[test]
    fn flags_use_istio_names() {
        let cli = Cli::try_parse_from([
            "pilot-agent",
            "router",
            "--domain",
            "istio-system.svc.cluster.local",
            "--meshConfig",
            "/m",
            "--serviceCluster",
            "gw",
            "--proxyLogLevel=debug",
            "--proxyComponentLogLevel",
            "upstream:debug",
            "--concurrency",
            "2",
            "--templateFile",
            "/t.json",
            "--outlierLogPath",
            "/dev/stdout",
            "--stsPort",
            "15463",
            "--log_output_level",
            "default:debug",
            "--log_as_json",
            "--profiling=false",
        ])
        .unwrap();
        let p = cli.proxy;
        assert_eq!(p.proxy_type, ProxyType::Router);
        assert_eq!(p.proxy_type.as_str(), "router");
        assert_eq!(p.mesh_config, PathBuf::from("/m"));
        assert_eq!(p.concurrency, 2);
        assert_eq!(p.template_file, Some(PathBuf::from("/t.json")));
        assert_eq!(p.sts_port, 15463);
        assert!(p.log.as_json);
        assert!(!p.profiling);
        assert_eq!(p.proxy_log_level, "debug");
    }

    #[test]
    fn service_registry_takes_istios_names() {
        let cli = Cli::try_parse_from(["pilot-agent", "--serviceregistry", "Consul"]).unwrap();
        assert_eq!(cli.proxy.service_registry, ServiceRegistry::Consul);
        let cli = Cli::try_parse_from(["pilot-agent", "sidecar", "--serviceregistry=Mock"]).unwrap();
        assert_eq!(cli.proxy.service_registry, ServiceRegistry::Mock);
        assert!(Cli::try_parse_from(["pilot-agent", "--serviceregistry", "Eureka"]).is_err());
    }

    #[test]
    fn unknown_proxy_types_are_rejected() {
        assert!(Cli::try_parse_from(["pilot-agent", "ztunnel"]).is_err());
    }
}
