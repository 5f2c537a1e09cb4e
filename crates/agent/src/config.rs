//! Everything `pilot-agent proxy` needs to know, parsed once from flags, environment and the pod's
//! files into one [`AgentConfig`], as Istio's `pilot-agent` options, `ConstructProxyConfig` and
//! `GetNodeMetaData` do. Logged at start; every other module reads it, nothing reads the env again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use model::mesh::{MeshConfig, ProxyConfig};
use serde::Serialize;
use serde_json::Value;

mod args;
mod build;
mod env;
mod metadata;
mod proxy_config;
#[cfg(test)]
mod tests;

pub use args::{ProxyArgs, ProxyType, ServiceRegistry};
pub use env::{Env, Files, ProcessEnv, RealFiles};
pub use metadata::{parse_downward_api, proxy_config_json};
pub use proxy_config::PROXY_CONFIG_ANNOTATION;

/// Istio's pod labels file (Kubernetes downward API), relative to the working directory.
pub const POD_LABELS_PATH: &str = "./etc/istio/pod/labels";
/// Istio's pod annotations file (Kubernetes downward API).
pub const POD_ANNOTATIONS_PATH: &str = "./etc/istio/pod/annotations";
/// The directory of the workload SDS socket (`WORKLOAD_IDENTITY_SOCKET_FILE` names the socket).
pub const WORKLOAD_IDENTITY_DIR: &str = "./var/run/secrets/workload-spiffe-uds";
/// The bootstrap file name inside ProxyConfig's `configPath`.
pub const BOOTSTRAP_FILE: &str = "envoy-rev.json";

/// Why the agent cannot start. Each names the flag, variable or file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}={value:?}: {reason}")]
    Env { var: String, value: String, reason: String },
    #[error("{var}: must be set ({hint})")]
    MissingEnv { var: &'static str, hint: &'static str },
    #[error("--{flag}={value:?}: {reason}")]
    Flag {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("mesh config {path}: {reason}")]
    MeshConfig { path: PathBuf, reason: String },
    #[error("{source_name}: invalid ProxyConfig: {reason}")]
    ProxyConfig { source_name: &'static str, reason: String },
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason} (hint: Kubernetes downward-API format, key=\"value\" per line)")]
    PodInfo { path: PathBuf, reason: String },
}

impl ConfigError {
    pub(crate) fn env(var: &str, value: &str, reason: &str) -> Self {
        ConfigError::Env {
            var: var.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

/// The agent's whole configuration. `Serialize` so it can be logged at start and dumped.
#[derive(Clone, Debug, Serialize)]
pub struct AgentConfig {
    /// `sidecar` or `router`: the first field of the node ID.
    pub node_type: ProxyType,
    /// Envoy's node ID, Istio's `type~ip~pod.namespace~domain`.
    pub node_id: String,
    /// Envoy's `node.cluster` (`serviceCluster`, or `<app>.<namespace>`).
    pub service_cluster: String,
    /// Envoy's `node.locality`, from the `topology.istio.io/locality` label.
    pub locality: model::Locality,
    /// Envoy's node metadata: Istio's `NodeMetadata` JSON object.
    pub metadata: Value,
    pub pod_name: String,
    pub pod_namespace: String,
    pub service_account: String,
    /// `INSTANCE_IP` first (pilot takes the first as the pod IP), or loopback when unset.
    pub instance_ips: Vec<IpAddr>,
    /// DNS domain: `--domain`, or `<namespace>.svc.cluster.local`.
    pub domain: String,
    /// `ISTIO_META_CLUSTER_ID`; empty when unset.
    pub cluster_id: String,
    /// `TRUST_DOMAIN`, or the mesh's trustDomain.
    pub trust_domain: String,
    /// The pod's labels (`ISTIO_METAJSON_LABELS` overlaid by the pod labels file).
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations (pod annotations file).
    pub annotations: BTreeMap<String, String>,
    /// The mesh file (or Istio's defaults).
    pub mesh_config: MeshConfig,
    /// The effective ProxyConfig: mesh defaultConfig, `PROXY_CONFIG`, the annotation, the flags.
    pub proxy_config: ProxyConfig,
    /// pilot-discovery's `host:port` (ProxyConfig `discoveryAddress`).
    pub discovery_address: String,
    /// CA address: `CA_ADDR`, or the discovery address.
    pub ca_address: String,
    /// The workload certificate: its requested lifetime and when it is renewed.
    pub secrets: SecretConfig,
    /// Subject alt names expected of pilot-discovery when `controlPlaneAuthPolicy` is MUTUAL_TLS.
    pub pilot_san: Vec<String>,
    /// `ISTIOD_SAN`: overrides the server name checked on pilot-discovery's certificate.
    pub istiod_san: Option<String>,
    /// `XDS_ROOT_CA`: the root certificate file for the xDS connection (`SYSTEM` for public roots).
    pub xds_root_ca: Option<String>,
    /// Extra headers on the upstream xDS stream (`XDS_HEADERS`, `XDS_HEADER_*`).
    pub xds_headers: BTreeMap<String, String>,
    /// `ISTIO_DELTA_XDS` (Istio's default: true): Envoy speaks delta ADS to the agent.
    pub delta_xds: bool,
    /// `ISTIO_GPRC_MAXRECVMSGSIZE` (Istio's default: 4 MiB): the largest message Envoy may send the
    /// xDS proxy, as Istio's agent serves Envoy with `istiogrpc.ServerOptions`.
    pub xds_max_recv_msg_size: usize,
    pub paths: AgentPaths,
    pub log: LogConfig,
    /// Envoy's `--concurrency`; `None` lets Envoy use one worker per CPU.
    pub concurrency: Option<u32>,
    /// Envoy admin port on localhost (ProxyConfig `proxyAdminPort`, 15000).
    pub proxy_admin_port: u16,
    /// The agent's status server port (ProxyConfig `statusPort`, 15020); 0 disables it.
    pub status_port: u16,
    /// Envoy's readiness listener port (`ENVOY_STATUS_PORT`, 15021) routed to the status server.
    pub envoy_status_port: u16,
    /// Envoy's Prometheus listener port (`ENVOY_PROMETHEUS_PORT`, 15090).
    pub envoy_prometheus_port: u16,
    /// `--stsPort`: accepted, not served.
    pub sts_port: u16,
    pub drain: DrainConfig,
    pub dns: DnsConfig,
    /// `--outlierLogPath`.
    pub outlier_log_path: Option<String>,
    /// `ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS` or the `overload.global_downstream_max_connections`
    /// runtime value; Istio's default is `i32::MAX`.
    pub global_downstream_max_connections: u32,
}

/// Istio's workload certificate settings (`SECRET_TTL`, `SECRET_GRACE_PERIOD_RATIO`, ...).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SecretConfig {
    /// `SECRET_TTL` (24h): the lifetime asked of the CA.
    #[serde(serialize_with = "as_duration")]
    pub ttl: Duration,
    /// `SECRET_GRACE_PERIOD_RATIO` (0.5): renewed when this part of the lifetime is left.
    pub grace_period_ratio: f64,
    /// `SECRET_GRACE_PERIOD_RATIO_JITTER` (0.01): up to this much more, at random, so that
    /// workloads started together do not renew together.
    pub grace_period_ratio_jitter: f64,
    /// The workload key the agent makes for each CSR.
    pub key: WorkloadKey,
}

/// The kind of workload key: `ECC_SIGNATURE_ALGORITHM=ECDSA` (the default here: unset or empty)
/// with `ECC_CURVE` (`P256`, `P384`), any other value (e.g. `RSA`) RSA of `WORKLOAD_RSA_KEY_SIZE`
/// bits (2048), as Istio's agent chooses (Istio's own default, unset, is RSA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum WorkloadKey {
    EcdsaP256,
    EcdsaP384,
    Rsa(u32),
}

/// Files and sockets the agent and Envoy share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentPaths {
    /// ProxyConfig `configPath`: where the bootstrap is written.
    pub config_path: PathBuf,
    /// The bootstrap file: `<configPath>/envoy-rev.json`.
    pub bootstrap: PathBuf,
    /// Envoy's xDS socket served by the agent: `XDS_UDS_PATH`, or `<configPath>/XDS` (Istio's).
    pub xds_uds: PathBuf,
    /// Envoy's SDS socket: `SDS_UDS_PATH`, or `./var/run/secrets/workload-spiffe-uds/<socket file>`.
    pub sds_uds: PathBuf,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE` (`socket`): the SDS socket's file name, also in node metadata.
    pub workload_identity_socket_file: String,
    /// ProxyConfig `customConfigFile`: used as the bootstrap as is.
    pub custom_config_file: Option<PathBuf>,
    /// `--templateFile` (or `ISTIO_BOOTSTRAP`): a Go template rendered as the bootstrap.
    pub template_file: Option<PathBuf>,
    /// `--meshConfig`.
    pub mesh_config: PathBuf,
    pub pod_labels: PathBuf,
    pub pod_annotations: PathBuf,
}

/// Log levels of the agent and of Envoy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogConfig {
    /// Envoy's `-l` (`--proxyLogLevel`).
    pub proxy_log_level: String,
    /// Envoy's `--component-log-level` (`--proxyComponentLogLevel`).
    pub proxy_component_log_level: String,
    /// The agent's `--log_output_level`.
    pub output_level: String,
    /// `--log_as_json`: the agent's and Envoy's logs as JSON lines.
    pub as_json: bool,
}

/// How Envoy is drained and stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrainConfig {
    /// ProxyConfig `drainDuration` (45s): Envoy's `--drain-time-s` on hot restart.
    #[serde(serialize_with = "as_duration")]
    pub drain_duration: Duration,
    /// ProxyConfig `terminationDrainDuration` (5s): how long draining lasts at shutdown.
    #[serde(serialize_with = "as_duration")]
    pub termination_drain_duration: Duration,
    /// `MINIMUM_DRAIN_DURATION` (5s): the least drain time before checking active connections.
    #[serde(serialize_with = "as_duration")]
    pub minimum_drain_duration: Duration,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: stop as soon as no downstream connection is left.
    pub exit_on_zero_active_connections: bool,
}

/// The agent's DNS proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DnsConfig {
    /// `ISTIO_META_DNS_CAPTURE`: answer the workload's DNS from the mesh's name table.
    pub capture: bool,
    /// `ISTIO_META_DNS_AUTO_ALLOCATE`: pilot allocates VIPs for ServiceEntries without addresses.
    pub auto_allocate: bool,
    /// `ISTIO_META_ENABLE_DNS_SERVER`: run the DNS server on a gateway without capture.
    pub at_gateway: bool,
    /// `DNS_PROXY_ADDR` (`localhost:15053`).
    pub proxy_addr: String,
    /// `DNS_FORWARD_PARALLEL`: query every upstream resolver at once.
    pub forward_parallel: bool,
}

impl DnsConfig {
    /// Whether the agent runs its DNS server at all.
    pub fn enabled(&self) -> bool {
        self.capture || self.at_gateway
    }
}

fn as_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// `45s`, `1.5s`, `250ms`, as Istio logs durations.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_secs() == 0 && d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.subsec_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

impl AgentConfig {
    /// Parses everything once: flags, then environment through `env`, then the mesh file and the pod
    /// labels/annotations files through `files`.
    pub fn from_args(args: &ProxyArgs, env: &dyn Env, files: &dyn Files) -> Result<AgentConfig, ConfigError> {
        build::build(args, env, files)
    }

    /// [`AgentConfig::from_args`] on the process environment and the real file system.
    pub fn from_process(args: &ProxyArgs) -> Result<AgentConfig, ConfigError> {
        Self::from_args(args, &ProcessEnv, &RealFiles)
    }

    /// The IP of the node ID (the pod IP).
    pub fn pod_ip(&self) -> Option<IpAddr> {
        self.instance_ips.first().copied()
    }

    /// Istio's IP family choice: IPv6 only when every instance IP is IPv6.
    pub fn ipv6_only(&self) -> bool {
        !self.instance_ips.is_empty() && self.instance_ips.iter().all(IpAddr::is_ipv6)
    }

    /// Loopback of the proxy's IP family (`127.0.0.1` or `::1`): admin and agent addresses.
    pub fn localhost(&self) -> &'static str {
        if self.ipv6_only() { "::1" } else { "127.0.0.1" }
    }

    /// Wildcard of the proxy's IP family (`0.0.0.0` or `::`): Envoy's own listeners.
    pub fn wildcard(&self) -> &'static str {
        if self.ipv6_only() { "::" } else { "0.0.0.0" }
    }

    /// The config as pretty JSON, for the start-up log.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("<unserializable config: {e}>"))
    }
}
