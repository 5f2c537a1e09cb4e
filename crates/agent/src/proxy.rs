//! `pilot-agent proxy`: writes the bootstrap, starts the xDS proxy, the status server and Envoy,
//! and shuts them down in Istio's order on SIGTERM/SIGINT or `/quitquitquit` (drain Envoy's
//! listeners, wait, stop Envoy, exit with 0), or exits non-zero when Envoy cannot be kept up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::bootstrap::{Bootstrap, BootstrapOptions};
use crate::config::AgentConfig;
use crate::envoy::{EnvoyConfig, ExitReport, IpVersion, Supervisor};
use crate::status::{KubeAppProbers, ScrapeMetrics, StatusServer, StatusServerOptions};
use crate::xds_proxy::{UpstreamTls, XdsProxy, XdsProxyConfig};

/// Where Istio mounts the mesh root certificate for the xDS connection.
pub(crate) const DEFAULT_ROOT_CERT: &str = "./var/run/secrets/istio/root-cert.pem";
/// Istio's projected service-account token, sent as a bearer token to pilot-discovery.
pub(crate) const DEFAULT_TOKEN: &str = "./var/run/secrets/tokens/istio-token";
/// Certificates whose change triggers a hot restart when ENABLE_ENVOY_HOT_RESTART is on
/// (Istio's legacy `/etc/certs` mount, relative as Istio's other agent paths).
pub(crate) const CERT_WATCH_DIR: &str = "./etc/certs";

/// What `pilot-agent proxy` reads from its environment besides [`AgentConfig`].
#[derive(Debug, Clone, Default)]
pub struct ProxyRuntime {
    pub envoy_binary: Option<PathBuf>,
    pub hot_restart: bool,
    pub app_probers: KubeAppProbers,
}

/// The upstream TLS settings, as Istio's agent decides them: plaintext for pilot's plaintext port
/// (15010) or `controlPlaneAuthPolicy: NONE`; otherwise TLS verified with `XDS_ROOT_CA` (or
/// Istio's mounted root) and the istiod name (`ISTIOD_SAN`, else `istiod.istio-system.svc`).
pub(crate) fn upstream_tls(cfg: &AgentConfig) -> Option<UpstreamTls> {
    let port = cfg.discovery_address.rsplit(':').next().unwrap_or_default();
    if port == "15010" || cfg.proxy_config.control_plane_auth_policy == "NONE" {
        return None;
    }
    let root = cfg.xds_root_ca.clone().unwrap_or_else(|| DEFAULT_ROOT_CERT.to_owned());
    let mut tls = UpstreamTls::new(PathBuf::from(root));
    if let Some(san) = &cfg.istiod_san {
        tls.server_name = san.clone();
    }
    if Path::new(DEFAULT_TOKEN).exists() {
        tls = tls.with_token(PathBuf::from(DEFAULT_TOKEN));
    }
    Some(tls)
}

/// The agent's CA client, as Istio's `createCitadel`: `CA_ADDR` (default: the discovery address)
/// in plaintext when it ends in `:15010`, else over TLS verified with `XDS_ROOT_CA` (or Istio's
/// mounted root) and the istiod name (`ISTIOD_SAN`, else `istiod.istio-system.svc`); with the
/// pod's token from Istio's path whenever the file is there.
pub(crate) fn ca_client(cfg: &AgentConfig) -> crate::sds::CaClient {
    let root = cfg.xds_root_ca.clone().unwrap_or_else(|| DEFAULT_ROOT_CERT.to_owned());
    let defaults = UpstreamTls::new(PathBuf::from(&root));
    let tls = crate::sds::CaTls {
        root_cert: PathBuf::from(root),
        server_name: cfg.istiod_san.clone().unwrap_or(defaults.server_name),
    };
    crate::sds::CaClient::new(&cfg.ca_address, tls, PathBuf::from(DEFAULT_TOKEN))
}

/// The workload's SPIFFE identity: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`
/// (the `default` service account when none is given, as Kubernetes).
pub fn workload_identity(cfg: &AgentConfig) -> String {
    let sa = if cfg.service_account.is_empty() {
        "default"
    } else {
        cfg.service_account.as_str()
    };
    format!("spiffe://{}/ns/{}/sa/{sa}", cfg.trust_domain, cfg.pod_namespace)
}

pub(crate) fn envoy_config(cfg: &AgentConfig, bootstrap: PathBuf, runtime: &ProxyRuntime) -> EnvoyConfig {
    let binary = runtime
        .envoy_binary
        .clone()
        .unwrap_or_else(|| PathBuf::from(&cfg.proxy_config.binary_path));
    EnvoyConfig {
        binary_path: binary,
        config_path: bootstrap,
        drain_duration: cfg.drain.drain_duration,
        termination_drain_duration: cfg.drain.termination_drain_duration,
        concurrency: cfg.concurrency,
        log_level: cfg.log.proxy_log_level.clone(),
        component_log_level: cfg.log.proxy_component_log_level.clone(),
        service_cluster: cfg.service_cluster.clone(),
        service_node: cfg.node_id.clone(),
        local_address_ip_version: if cfg.ipv6_only() { IpVersion::V6 } else { IpVersion::V4 },
        admin_port: cfg.proxy_admin_port,
        status_port: cfg.envoy_status_port,
        prometheus_port: cfg.envoy_prometheus_port,
        hot_restart: runtime.hot_restart,
        node_type: cfg.node_type.node_type(),
        exit_on_zero_active_connections: cfg.drain.exit_on_zero_active_connections,
        minimum_drain_duration: cfg.drain.minimum_drain_duration,
        ..EnvoyConfig::default()
    }
}

/// Runs the agent until shutdown; `Ok` carries Envoy's exit report after a graceful stop.
pub async fn run(cfg: AgentConfig, runtime: ProxyRuntime) -> anyhow::Result<Option<ExitReport>> {
    tracing::info!(config = %cfg.to_json_pretty(), "pilot-agent starting");
    let bootstrap = match &cfg.paths.custom_config_file {
        Some(custom) => {
            tracing::info!(file = %custom.display(), "using customConfigFile as Envoy's bootstrap");
            custom.clone()
        }
        None => Bootstrap::write(&cfg, &BootstrapOptions::from_config(&cfg)).context("writing Envoy's bootstrap")?,
    };

    let mut registry = Registry::default();
    let mut xds_cfg = XdsProxyConfig::new(cfg.paths.xds_uds.clone(), cfg.discovery_address.clone());
    xds_cfg.tls = upstream_tls(&cfg);
    if !cfg.cluster_id.is_empty() {
        xds_cfg.cluster_id = cfg.cluster_id.clone();
    }
    xds_cfg.headers = cfg.xds_headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    xds_cfg.max_recv_msg_size = cfg.xds_max_recv_msg_size;
    let xds = XdsProxy::start(xds_cfg, &mut registry)
        .await
        .context("starting the xDS proxy")?;

    let _dns_tasks = if cfg.dns.enabled() {
        start_dns(&cfg, &xds, &mut registry).await?
    } else {
        Vec::new()
    };

    let ca = ca_client(&cfg);
    tracing::info!(
        ca_address = %ca.addr,
        tls = ca.tls.is_some(),
        token = %ca.token.display(),
        "workload certificates from the CA, unless {CERT_WATCH_DIR} holds them"
    );
    let secrets = crate::sds::SecretManager::new(
        workload_identity(&cfg),
        Some(ca),
        cfg.secrets.clone(),
        PathBuf::from(CERT_WATCH_DIR),
    );
    secrets.register_metrics(&mut registry);
    tokio::spawn(secrets.clone().run());
    let sds = crate::sds::SdsServer::start(&cfg.paths.sds_uds, secrets)
        .with_context(|| format!("SDS server on {}", cfg.paths.sds_uds.display()))?;

    let (shutdown_tx, mut shutdown_rx) = watch::channel(false);
    let status_task = if cfg.status_port != 0 {
        let options = StatusServerOptions {
            status_port: cfg.status_port,
            admin_port: cfg.proxy_admin_port,
            app_probers: runtime.app_probers.clone(),
            scrape_metrics: ScrapeMetrics::register(&mut registry),
            sds: Some(sds.status()),
            ..StatusServerOptions::default()
        };
        let status = StatusServer::new(options, xds.status(), Arc::new(registry), shutdown_tx.clone())
            .context("status server")?;
        let listener = status.bind().await.context("status server")?;
        let mut stop = shutdown_tx.subscribe();
        Some(tokio::spawn(async move {
            // Keep answering (readiness fails once shutting down) until the agent exits.
            let stop = async move {
                let _ = stop.wait_for(|s| *s).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            };
            if let Err(e) = status.serve(listener, stop).await {
                tracing::error!(error = %e, "status server failed");
            }
        }))
    } else {
        None
    };

    let envoy_cfg = envoy_config(&cfg, bootstrap, &runtime);
    let supervisor = Arc::new(Supervisor::start(envoy_cfg).context("starting Envoy")?);
    if runtime.hot_restart {
        tokio::spawn(watch_certs(supervisor.clone(), PathBuf::from(CERT_WATCH_DIR)));
    }

    let result = tokio::select! {
        exit = supervisor.wait() => {
            // Envoy exited on its own (cleanly) or could not be kept up.
            let _ = shutdown_tx.send(true);
            exit.map(Some).map_err(anyhow::Error::from)
        }
        signal = shutdown_signal() => {
            tracing::info!(signal, "received signal: draining Envoy");
            let _ = shutdown_tx.send(true);
            supervisor.drain_and_stop().await.map(Some).map_err(anyhow::Error::from)
        }
        _ = shutdown_rx.wait_for(|s| *s) => {
            tracing::info!("/quitquitquit: draining Envoy");
            supervisor.drain_and_stop().await.map(Some).map_err(anyhow::Error::from)
        }
    };
    xds.shutdown().await;
    drop(sds);
    if let Some(task) = status_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    if let Ok(Some(report)) = &result {
        tracing::info!(%report, "Envoy exited");
    }
    result
}

/// The DNS proxy (`ISTIO_META_DNS_CAPTURE`): answers from the NDS name table, which the xDS proxy
/// hands it (the agent subscribes to NDS once Envoy connects), the rest from the pod's resolvers.
async fn start_dns(
    cfg: &AgentConfig,
    xds: &XdsProxy,
    registry: &mut Registry,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    use prost::Message as _;
    let resolv = crate::dns::ResolvConf::parse(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    let addrs = crate::dns::listen_addresses(&cfg.dns.proxy_addr, &resolv).map_err(anyhow::Error::msg)?;
    let server = Arc::new(crate::dns::LocalDnsServer::new(
        crate::dns::ProxyDomain::new(&cfg.pod_namespace, &cfg.domain),
        resolv,
        cfg.dns.forward_parallel,
        crate::dns::DnsMetrics::register(registry),
    ));
    let table = server.clone();
    xds.register_handler(xds_api::type_url::NAME_TABLE, move |any| {
        let nt = istio_api::nds::NameTable::decode(any.value.as_slice())
            .map_err(|e| format!("NDS name table does not decode: {e}"))?;
        table.update(&nt);
        Ok(())
    });
    server
        .serve(&addrs)
        .await
        .with_context(|| format!("DNS proxy on {}", cfg.dns.proxy_addr))
}

/// Waits for SIGTERM or SIGINT; returns its name.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            tracing::warn!("cannot install signal handlers; only /quitquitquit stops the agent");
            std::future::pending().await
        }
    }
}

/// Polls `dir` for changed certificate files and hot-restarts Envoy when one changes.
async fn watch_certs(supervisor: Arc<Supervisor>, dir: PathBuf) {
    let mut last = dir_stamp(&dir);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = dir_stamp(&dir);
        if now != last {
            last = now;
            tracing::info!(dir = %dir.display(), "certificates changed: hot restarting Envoy");
            match supervisor.hot_restart().await {
                Ok(epoch) => tracing::info!(epoch, "Envoy hot restarted"),
                Err(e) => tracing::warn!(error = %e, "hot restart failed"),
            }
        }
    }
}

/// Names and modification times of the files in `dir` (empty when absent).
fn dir_stamp(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| (e.path(), e.metadata().and_then(|m| m.modified()).ok()))
        .collect();
    out.sort();
    out
}
