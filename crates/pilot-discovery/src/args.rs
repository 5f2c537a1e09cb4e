//! Command line of `pilot-discovery`, with Istio's flag names and defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "pilot-discovery",
    about = "Istio Pilot: the service mesh control plane, in Rust",
    version
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the xDS discovery service.
    Discovery(Box<DiscoveryArgs>),
    /// Print build information.
    Version {
        /// Print only the version number.
        #[arg(short, long)]
        short: bool,
        /// Output format: json for a JSON object.
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
    },
    /// Make an HTTP request to Pilot's metrics/debug endpoint (127.0.0.1:15014).
    Request {
        /// HTTP method, e.g. GET.
        method: String,
        /// Path, e.g. /debug/syncz.
        path: String,
        /// Optional request body.
        body: Option<String>,
        /// Address of the monitoring/debug server.
        #[arg(long, default_value = "127.0.0.1:15014")]
        address: String,
    },
    /// Validate Istio configuration files offline; exits non-zero if any resource is invalid.
    Validate {
        /// Files or directories (recursive) of YAML/JSON.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct DiscoveryArgs {
    /// Directory to watch for Istio config in YAML/JSON files (replaces Kubernetes as config source).
    #[arg(long = "configDir", default_value = "")]
    pub config_dir: String,
    /// File name for Istio mesh configuration. If not specified, a default mesh is used.
    #[arg(long = "meshConfig", default_value = "./etc/istio/config/mesh")]
    pub mesh_config: String,
    /// File name for mesh networks configuration (else the `meshNetworks` key of the `istio`
    /// ConfigMap on a cluster).
    #[arg(long = "networksConfig", default_value = "./etc/istio/config/meshNetworks")]
    pub networks_config: String,
    /// DNS domain suffix.
    #[arg(long = "domain", default_value = "cluster.local")]
    pub domain: String,
    /// Discovery service gRPC address.
    #[arg(long = "grpcAddr", default_value = ":15010")]
    pub grpc_addr: String,
    /// Discovery service gRPC address, with TLS. An empty value disables it.
    #[arg(long = "secureGrpcAddr", default_value = ":15012")]
    pub secure_grpc_addr: String,
    /// The webhooks' HTTPS address (validation), with istiod's serving certificate. An empty value
    /// disables it; it is off without a secure gRPC port (no serving certificate).
    #[arg(long = "httpsAddr", default_value = ":15017")]
    pub https_addr: String,
    /// Discovery service HTTP address (debug endpoints, readiness).
    #[arg(long = "httpAddr", default_value = ":8080")]
    pub http_addr: String,
    /// HTTP address for Pilot's self-monitoring information (/metrics, /version).
    #[arg(long = "monitoringAddr", default_value = ":15014")]
    pub monitoring_addr: String,
    /// Comma separated list of platform service registries to read from (Kubernetes, Consul,
    /// Mock).
    #[arg(long = "registries", value_delimiter = ',', default_value = "Kubernetes",
          value_parser = clap::builder::PossibleValuesParser::new(["Kubernetes", "Consul", "Mock"]))]
    pub registries: Vec<String>,
    /// URL for the Consul server (with --registries Consul): host:port or http://host:port;
    /// 127.0.0.1:8500 when empty.
    #[arg(long = "consulserverURL", default_value = "")]
    pub consul_server_url: String,
    /// The ID of the cluster that this Istiod instance resides.
    #[arg(long = "clusterID", env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Use a Kubernetes configuration file instead of in-cluster configuration.
    #[arg(long = "kubeconfig", default_value = "")]
    pub kubeconfig: String,
    /// Maximum age of a gRPC connection before the server closes it (spreads proxies over replicas).
    #[arg(long = "keepaliveMaxServerConnectionAge", default_value = "30m")]
    pub keepalive_max_server_connection_age: String,
    /// Minimum per-scope logging level, as Istio's `default:info,ads:debug`.
    #[arg(long = "log_output_level", default_value = "default:info")]
    pub log_output_level: String,
    /// Log in JSON.
    #[arg(long = "log_as_json")]
    pub log_as_json: bool,
    /// File containing the x509 Certificate for HTTPS (istiod's serving certificate; with
    /// --tlsKeyFile and --caCertFile it replaces the one the mesh CA signs).
    #[arg(long = "tlsCertFile", default_value = "")]
    pub tls_cert_file: String,
    /// File containing the x509 private key matching --tlsCertFile.
    #[arg(long = "tlsKeyFile", default_value = "")]
    pub tls_key_file: String,
    /// File containing the x509 Server CA Certificate (the CA bundle of --tlsCertFile).
    #[arg(long = "caCertFile", default_value = "")]
    pub ca_cert_file: String,
}

impl DiscoveryArgs {
    /// Istio's `TLSOptions`.
    pub fn tls_flags(&self) -> crate::serving_cert::TlsFlags {
        crate::serving_cert::TlsFlags {
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            ca_cert_file: self.ca_cert_file.clone(),
        }
    }
}

/// Why an address flag could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("--{flag}: {value:?} is not an address of the form host:port or :port")]
pub struct AddrError {
    pub flag: &'static str,
    pub value: String,
}

/// Parses Go's listen address forms: `:15010` (all interfaces), `127.0.0.1:15010`, `[::1]:15010`,
/// `localhost:15010`. `Ok(None)` for an empty value (disabled).
pub fn parse_listen_addr(flag: &'static str, value: &str) -> Result<Option<SocketAddr>, AddrError> {
    let err = || AddrError {
        flag,
        value: value.to_owned(),
    };
    if value.is_empty() {
        return Ok(None);
    }
    if let Some(port) = value.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| err())?;
        return Ok(Some(SocketAddr::from(([0, 0, 0, 0], port))));
    }
    if let Ok(a) = value.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    if let Some(port) = value.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| err())?;
        return Ok(Some(SocketAddr::from(([127, 0, 0, 1], port))));
    }
    Err(err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_addresses() {
        assert_eq!(
            parse_listen_addr("grpcAddr", ":15010").unwrap(),
            Some("0.0.0.0:15010".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("grpcAddr", "127.0.0.1:1").unwrap(),
            Some("127.0.0.1:1".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("grpcAddr", "localhost:2").unwrap(),
            Some("127.0.0.1:2".parse().unwrap())
        );
        assert_eq!(parse_listen_addr("secureGrpcAddr", "").unwrap(), None);
        assert!(parse_listen_addr("grpcAddr", ":http").is_err());
        assert!(parse_listen_addr("grpcAddr", "example.com:80").is_err());
    }

    #[test]
    fn istio_flag_names_and_defaults() {
        let cli = Cli::try_parse_from(["pilot-discovery", "discovery", "--configDir", "/tmp/x"]).unwrap();
        let Command::Discovery(a) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(a.config_dir, "/tmp/x");
        assert_eq!(a.grpc_addr, ":15010");
        assert_eq!(a.secure_grpc_addr, ":15012");
        assert_eq!(a.http_addr, ":8080");
        assert_eq!(a.monitoring_addr, ":15014");
        assert_eq!(a.domain, "cluster.local");
        assert_eq!(a.registries, vec!["Kubernetes".to_string()]);
        let cli = Cli::try_parse_from([
            "pilot-discovery",
            "discovery",
            "--secureGrpcAddr",
            "",
            "--registries",
            "Kubernetes,Mock",
        ])
        .unwrap();
        let Command::Discovery(a) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(a.secure_grpc_addr, "");
        assert_eq!(a.registries.len(), 2);
        assert_eq!(a.consul_server_url, "");
        let cli = Cli::try_parse_from([
            "pilot-discovery",
            "discovery",
            "--registries",
            "Kubernetes,Consul",
            "--consulserverURL",
            "http://consul.local:8500",
        ])
        .unwrap();
        let Command::Discovery(a) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(a.registries, ["Kubernetes", "Consul"]);
        assert_eq!(a.consul_server_url, "http://consul.local:8500");
        assert!(Cli::try_parse_from(["pilot-discovery", "discovery", "--bogus"]).is_err());
        // A registry Istio does not have is refused, naming the ones there are.
        let Err(e) = Cli::try_parse_from(["pilot-discovery", "discovery", "--registries", "Kubernetes,Kubernets"])
        else {
            panic!("an unknown registry is refused")
        };
        assert!(
            e.to_string().contains("Kubernets") && e.to_string().contains("Mock"),
            "{e}"
        );
    }
}
