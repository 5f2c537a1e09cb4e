//! Builds the [`AgentConfig`] in Istio's order: pod files, the effective ProxyConfig, the proxy's
//! identity (node ID, IPs, domain), then agent settings and the node metadata that carries them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use model::mesh::ProxyConfig;

use super::env::{Env, Files, Vars, xds_headers};
use super::metadata::{self, TypedMetadata};
use super::{
    AgentConfig, AgentPaths, BOOTSTRAP_FILE, ConfigError, DnsConfig, DrainConfig, LogConfig, POD_ANNOTATIONS_PATH,
    POD_LABELS_PATH, ProxyArgs, SecretConfig, ServiceRegistry, WORKLOAD_IDENTITY_DIR, WorkloadKey, proxy_config,
};

/// Istio's `math.MaxInt32`: no global downstream connection limit.
const UNLIMITED_CONNECTIONS: u32 = i32::MAX as u32;

pub(super) fn build(args: &ProxyArgs, env: &dyn Env, files: &dyn Files) -> Result<AgentConfig, ConfigError> {
    let pod_labels_path = PathBuf::from(POD_LABELS_PATH);
    let pod_annotations_path = PathBuf::from(POD_ANNOTATIONS_PATH);
    let annotations = read_pod_info(files, &pod_annotations_path)?.unwrap_or_default();
    let pod_labels = read_pod_info(files, &pod_labels_path)?;

    let vars = Vars::new(env);
    let (mesh_config, mut proxy) = proxy_config::construct(&args.mesh_config, &vars, files, &annotations)?;
    // From here on, settings an injector would have put in env may also come from proxyMetadata.
    let vars = Vars::new(env).with_proxy_metadata(&proxy.proxy_metadata);
    apply_concurrency_and_cluster(args, &vars, &mut proxy)?;
    let Identity {
        pod_name,
        pod_namespace,
        instance_ips,
        domain,
        node_id,
    } = identity(args, &vars)?;
    let (drain, dns) = drain_and_dns(&vars, &proxy)?;
    let paths = agent_paths(args, &vars, &proxy, pod_labels_path, pod_annotations_path)?;

    let pod = PodInfo {
        pod_name: &pod_name,
        pod_namespace: &pod_namespace,
        instance_ips: &instance_ips,
        annotations: &annotations,
        labels: pod_labels,
    };
    let node = node(args, &vars, &proxy, pod, &drain, &paths)?;
    let discovery_address = proxy.discovery_address.clone();
    Ok(AgentConfig {
        node_type: args.proxy_type,
        node_id,
        service_cluster: node.service_cluster,
        locality: node.locality,
        metadata: node.metadata,
        service_account: node.service_account,
        instance_ips,
        domain,
        cluster_id: vars.get("ISTIO_META_CLUSTER_ID").unwrap_or_default(),
        trust_domain: vars
            .get("TRUST_DOMAIN")
            .unwrap_or_else(|| mesh_config.trust_domain.clone()),
        labels: node.labels,
        annotations,
        ca_address: vars.get("CA_ADDR").unwrap_or_else(|| discovery_address.clone()),
        secrets: secret_config(&vars)?,
        discovery_address,
        pilot_san: node.pilot_san,
        istiod_san: vars.get("ISTIOD_SAN"),
        xds_root_ca: vars.get("XDS_ROOT_CA"),
        xds_headers: xds_headers(&vars)?,
        delta_xds: vars.bool("ISTIO_DELTA_XDS", true)?,
        xds_max_recv_msg_size: vars
            .positive("ISTIO_GPRC_MAXRECVMSGSIZE", crate::xds_proxy::DEFAULT_MAX_RECV_MSG_SIZE)?,
        paths,
        log: LogConfig {
            proxy_log_level: args.proxy_log_level.clone(),
            proxy_component_log_level: args.proxy_component_log_level.clone(),
            output_level: args.log.output_level.clone(),
            as_json: args.log.as_json,
        },
        concurrency: proxy.concurrency,
        proxy_admin_port: proxy.proxy_admin_port,
        status_port: proxy.status_port,
        envoy_status_port: node.envoy_status_port,
        envoy_prometheus_port: node.envoy_prometheus_port,
        sts_port: args.sts_port,
        drain,
        dns,
        outlier_log_path: node.outlier_log_path,
        global_downstream_max_connections: node.global_downstream_max_connections,
        pod_name,
        pod_namespace,
        mesh_config,
        proxy_config: proxy,
    })
}

/// What the pod files and the identity say of this pod.
struct PodInfo<'a> {
    pod_name: &'a str,
    pod_namespace: &'a str,
    instance_ips: &'a [IpAddr],
    annotations: &'a BTreeMap<String, String>,
    /// From the downward API file, when mounted.
    labels: Option<BTreeMap<String, String>>,
}

/// The node as Envoy's bootstrap and pilot-discovery see it: labels, locality, service cluster,
/// the agent's ports and limits, and the node metadata that carries them.
struct Node {
    labels: BTreeMap<String, String>,
    locality: model::Locality,
    service_cluster: String,
    pilot_san: Vec<String>,
    outlier_log_path: Option<String>,
    envoy_status_port: u16,
    envoy_prometheus_port: u16,
    service_account: String,
    global_downstream_max_connections: u32,
    metadata: serde_json::Value,
}

fn node(
    args: &ProxyArgs,
    vars: &Vars<'_>,
    proxy: &ProxyConfig,
    pod: PodInfo<'_>,
    drain: &DrainConfig,
    paths: &AgentPaths,
) -> Result<Node, ConfigError> {
    let static_labels = metadata::labels_from_env(vars)?;
    let mut labels = metadata::merge_labels(&static_labels, pod.labels);
    let locality = metadata::locality(&mut labels);
    let raw = metadata::raw_metadata(vars, proxy)?;
    let workload_name = raw.get("WORKLOAD_NAME").and_then(|v| v.as_str()).unwrap_or_default();
    let service_cluster = metadata::service_cluster(proxy, &labels, workload_name, pod.pod_namespace);
    let pilot_san = if proxy.control_plane_auth_policy == "MUTUAL_TLS" {
        vec![metadata::pilot_san(&proxy.discovery_address)]
    } else {
        Vec::new()
    };
    let outlier_log_path = Some(args.outlier_log_path.clone()).filter(|p| !p.is_empty());
    let envoy_status_port = vars.port("ENVOY_STATUS_PORT", 15021)?;
    let envoy_prometheus_port = vars.port("ENVOY_PROMETHEUS_PORT", 15090)?;
    let service_account = vars.get("SERVICE_ACCOUNT").unwrap_or_default();
    let global_downstream_max_connections = global_downstream_max_connections(proxy)?;

    let metadata = TypedMetadata {
        namespace: pod.pod_namespace,
        pod_name: pod.pod_name,
        service_account: &service_account,
        labels: &labels,
        static_labels: &static_labels,
        annotations: pod.annotations,
        instance_ips: pod.instance_ips,
        proxy_config: proxy,
        pilot_san: &pilot_san,
        outlier_log_path: outlier_log_path.as_deref(),
        envoy_status_port,
        envoy_prometheus_port,
        sts_port: args.sts_port,
        exit_on_zero_active_connections: drain.exit_on_zero_active_connections,
        workload_identity_socket_file: &paths.workload_identity_socket_file,
    }
    .into_json(raw);

    Ok(Node {
        labels,
        locality,
        service_cluster,
        pilot_san,
        outlier_log_path,
        envoy_status_port,
        envoy_prometheus_port,
        service_account,
        global_downstream_max_connections,
        metadata,
    })
}

/// Concurrency: ProxyConfig, else ISTIO_CPU_LIMIT, and the legacy flag wins when set; the
/// service cluster from the flag when ProxyConfig has none.
fn apply_concurrency_and_cluster(
    args: &ProxyArgs,
    vars: &Vars<'_>,
    proxy: &mut ProxyConfig,
) -> Result<(), ConfigError> {
    if proxy.concurrency.is_none() {
        let cpu_limit = vars.u32("ISTIO_CPU_LIMIT", 0)?;
        if cpu_limit > 0 {
            proxy.concurrency = Some(cpu_limit);
        }
    }
    if args.concurrency != 0 {
        proxy.concurrency = Some(args.concurrency);
    }
    if proxy.service_cluster.is_empty() {
        proxy.service_cluster = args.service_cluster.clone();
    }

    Ok(())
}

/// Who the proxy is: Istio's node ID `<type>~<ip>~<id>~<domain>`, and its parts.
struct Identity {
    pod_name: String,
    pod_namespace: String,
    instance_ips: Vec<IpAddr>,
    domain: String,
    node_id: String,
}

/// The node ID's parts per `--serviceregistry`, as the seeds' table and Istio 1.7's pilot-agent
/// make them: the IP from `INSTANCE_IP` (else 127.0.0.1); for Kubernetes, the ID
/// `POD_NAME.POD_NAMESPACE` (both required) and the domain `POD_NAMESPACE.svc.cluster.local`;
/// for Consul, `IP.service.consul` and `service.consul`; for Mock, the IP and no domain.
/// `--domain` replaces the domain. Outside Kubernetes `POD_NAME` (else `HOSTNAME`, else the IP)
/// and `POD_NAMESPACE` (else `default`, the namespace of Consul's services) are optional.
fn identity(args: &ProxyArgs, vars: &Vars<'_>) -> Result<Identity, ConfigError> {
    let instance_ips = match vars.ip("INSTANCE_IP")? {
        Some(ip) => vec![ip],
        None => vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    };
    let ip = instance_ips[0].to_string();
    let kubernetes = args.service_registry == ServiceRegistry::Kubernetes;
    let pod_name = match vars.get("POD_NAME").or_else(|| vars.get("HOSTNAME")) {
        Some(name) => name,
        None if !kubernetes => ip.clone(),
        None => {
            return Err(ConfigError::MissingEnv {
                var: "POD_NAME",
                hint: "the workload's name; Kubernetes sets it from metadata.name",
            });
        }
    };
    let pod_namespace = match vars.get("POD_NAMESPACE") {
        Some(ns) => ns,
        None if !kubernetes => "default".to_owned(),
        None => {
            return Err(ConfigError::MissingEnv {
                var: "POD_NAMESPACE",
                hint: "the workload's namespace; Kubernetes sets it from metadata.namespace",
            });
        }
    };
    for (var, value) in [("POD_NAME", &pod_name), ("POD_NAMESPACE", &pod_namespace)] {
        if value.contains('~') || value.contains(char::is_whitespace) {
            return Err(ConfigError::env(
                var,
                value,
                "must not contain '~' or spaces (it is part of the node ID)",
            ));
        }
    }
    let (id, default_domain) = match args.service_registry {
        ServiceRegistry::Kubernetes => (
            format!("{pod_name}.{pod_namespace}"),
            format!("{pod_namespace}.svc.cluster.local"),
        ),
        ServiceRegistry::Consul => (format!("{ip}.service.consul"), "service.consul".to_owned()),
        ServiceRegistry::Mock => (ip.clone(), String::new()),
    };
    let domain = if args.domain.is_empty() {
        default_domain
    } else {
        args.domain.clone()
    };
    let node_id = format!("{}~{ip}~{id}~{domain}", args.proxy_type.as_str());
    Ok(Identity {
        pod_name,
        pod_namespace,
        instance_ips,
        domain,
        node_id,
    })
}

/// The drain settings (ProxyConfig's durations, `MINIMUM_DRAIN_DURATION`,
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`) and the DNS proxy's.
fn drain_and_dns(vars: &Vars<'_>, proxy: &ProxyConfig) -> Result<(DrainConfig, DnsConfig), ConfigError> {
    let drain = DrainConfig {
        drain_duration: duration_field("drainDuration", &proxy.drain_duration)?,
        termination_drain_duration: duration_field("terminationDrainDuration", &proxy.termination_drain_duration)?,
        minimum_drain_duration: vars.duration("MINIMUM_DRAIN_DURATION", Duration::from_secs(5))?,
        exit_on_zero_active_connections: vars.bool("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false)?,
    };
    let dns = DnsConfig {
        capture: vars.bool("ISTIO_META_DNS_CAPTURE", false)?,
        auto_allocate: vars.bool("ISTIO_META_DNS_AUTO_ALLOCATE", false)?,
        at_gateway: vars.bool("ISTIO_META_ENABLE_DNS_SERVER", false)?,
        proxy_addr: vars.string("DNS_PROXY_ADDR", "localhost:15053"),
        forward_parallel: vars.bool("DNS_FORWARD_PARALLEL", false)?,
    };
    if !proxy_config::has_port(&dns.proxy_addr) {
        return Err(ConfigError::env("DNS_PROXY_ADDR", &dns.proxy_addr, "not host:port"));
    }
    Ok((drain, dns))
}

/// Where the agent reads and writes: ProxyConfig's `configPath`, the xDS and SDS sockets
/// (`XDS_UDS_PATH`, `SDS_UDS_PATH`, `WORKLOAD_IDENTITY_SOCKET_FILE`), the bootstrap template
/// (`ISTIO_BOOTSTRAP`, else `--templateFile`).
fn agent_paths(
    args: &ProxyArgs,
    vars: &Vars<'_>,
    proxy: &ProxyConfig,
    pod_labels: PathBuf,
    pod_annotations: PathBuf,
) -> Result<AgentPaths, ConfigError> {
    let config_path = PathBuf::from(&proxy.config_path);
    let workload_identity_socket_file = vars.string("WORKLOAD_IDENTITY_SOCKET_FILE", "socket");
    if workload_identity_socket_file.contains('/') {
        return Err(ConfigError::env(
            "WORKLOAD_IDENTITY_SOCKET_FILE",
            &workload_identity_socket_file,
            "must be a file name, not a path",
        ));
    }
    let custom_config_file = Some(proxy.custom_config_file.clone())
        .filter(|f| !f.is_empty())
        .map(PathBuf::from);
    let template_file = match vars.get("ISTIO_BOOTSTRAP") {
        Some(over) => Some(PathBuf::from(over)),
        None => args.template_file.clone(),
    };
    if let Some(t) = &template_file
        && t.as_os_str().is_empty()
    {
        return Err(ConfigError::Flag {
            flag: "templateFile",
            value: String::new(),
            reason: "empty path".into(),
        });
    }
    Ok(AgentPaths {
        bootstrap: config_path.join(BOOTSTRAP_FILE),
        xds_uds: vars
            .get("XDS_UDS_PATH")
            .map_or_else(|| config_path.join("XDS"), PathBuf::from),
        sds_uds: vars.get("SDS_UDS_PATH").map_or_else(
            || Path::new(WORKLOAD_IDENTITY_DIR).join(&workload_identity_socket_file),
            PathBuf::from,
        ),
        config_path,
        workload_identity_socket_file,
        custom_config_file,
        template_file,
        mesh_config: args.mesh_config.clone(),
        pod_labels,
        pod_annotations,
    })
}

/// Istio's `SECRET_TTL`, `SECRET_GRACE_PERIOD_RATIO` (in (0, 1)) and its jitter (in [0, 1)).
fn secret_config(vars: &Vars<'_>) -> Result<SecretConfig, ConfigError> {
    let ratio = |name: &'static str, default: f64, min_inclusive: bool| -> Result<f64, ConfigError> {
        match vars.get(name).filter(|v| !v.is_empty()) {
            None => Ok(default),
            Some(v) => match v.parse::<f64>() {
                Ok(r) if r < 1.0 && (r > 0.0 || (min_inclusive && r == 0.0)) => Ok(r),
                _ => Err(ConfigError::env(name, &v, "not a ratio between 0 and 1")),
            },
        }
    };
    let ttl = vars.duration("SECRET_TTL", Duration::from_secs(24 * 3600))?;
    if ttl.is_zero() {
        return Err(ConfigError::env("SECRET_TTL", "0s", "must be positive"));
    }
    Ok(SecretConfig {
        ttl,
        grace_period_ratio: ratio("SECRET_GRACE_PERIOD_RATIO", 0.5, false)?,
        grace_period_ratio_jitter: ratio("SECRET_GRACE_PERIOD_RATIO_JITTER", 0.01, true)?,
        key: workload_key(vars)?,
    })
}

/// `ECC_SIGNATURE_ALGORITHM` (unset or empty: `ECDSA` here; any other value, e.g. `RSA`: RSA),
/// `ECC_CURVE`, `WORKLOAD_RSA_KEY_SIZE`.
fn workload_key(vars: &Vars<'_>) -> Result<WorkloadKey, ConfigError> {
    let algorithm = vars.get("ECC_SIGNATURE_ALGORITHM");
    if algorithm.as_deref().is_none_or(|a| a.eq_ignore_ascii_case("ECDSA")) {
        return match vars.get("ECC_CURVE").filter(|v| !v.is_empty()).as_deref() {
            None | Some("P256") => Ok(WorkloadKey::EcdsaP256),
            Some("P384") => Ok(WorkloadKey::EcdsaP384),
            Some(other) => Err(ConfigError::env("ECC_CURVE", other, "not P256 or P384")),
        };
    }
    match vars.get("WORKLOAD_RSA_KEY_SIZE").filter(|v| !v.is_empty()) {
        None => Ok(WorkloadKey::Rsa(2048)),
        Some(v) => match v.parse::<u32>() {
            Ok(bits) if (2048..=8192).contains(&bits) && bits % 8 == 0 => Ok(WorkloadKey::Rsa(bits)),
            _ => Err(ConfigError::env(
                "WORKLOAD_RSA_KEY_SIZE",
                &v,
                "not a key size between 2048 and 8192 bits",
            )),
        },
    }
}

fn read_pod_info(files: &dyn Files, path: &Path) -> Result<Option<BTreeMap<String, String>>, ConfigError> {
    let text = files.read(path).map_err(|source| ConfigError::File {
        path: path.to_path_buf(),
        source,
    })?;
    text.map(|t| metadata::parse_downward_api(&t))
        .transpose()
        .map_err(|reason| ConfigError::PodInfo {
            path: path.to_path_buf(),
            reason,
        })
}

fn duration_field(field: &'static str, value: &str) -> Result<Duration, ConfigError> {
    model::duration::parse(value).ok_or_else(|| ConfigError::ProxyConfig {
        source_name: "effective ProxyConfig",
        reason: format!("{field}: {value:?} is not a duration"),
    })
}

/// Istio's precedence: `connectionSettings.globalDownstreamConnectionLimit`, then the
/// `ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS` proxyMetadata, then the deprecated runtime value.
fn global_downstream_max_connections(proxy: &model::mesh::ProxyConfig) -> Result<u32, ConfigError> {
    let limit = proxy
        .extra
        .get("connectionSettings")
        .and_then(|c| c.get("globalDownstreamConnectionLimit"))
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
        .filter(|v| *v > 0);
    if let Some(limit) = limit {
        return Ok(u32::try_from(limit).unwrap_or(UNLIMITED_CONNECTIONS));
    }
    if let Some(v) = proxy.proxy_metadata.get("ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS") {
        return v.trim().parse().map_err(|_| ConfigError::ProxyConfig {
            source_name: "effective ProxyConfig",
            reason: format!("proxyMetadata.ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: {v:?} is not a number"),
        });
    }
    let runtime = proxy
        .extra
        .get("runtimeValues")
        .and_then(|r| r.get("overload.global_downstream_max_connections"))
        .and_then(|v| v.as_str())
        .and_then(|v| v.trim().parse().ok());
    Ok(runtime.unwrap_or(UNLIMITED_CONNECTIONS))
}
