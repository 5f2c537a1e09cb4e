//! `pilot-discovery discovery`: loads the mesh config, reads and watches the config directory,
//! starts the xDS server and the HTTP servers, and feeds config changes into pushes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use environment::{Environment, ServiceEntries};
use model::{ConfigKind, MeshConfig};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use xds_server::{DiscoveryServer, ServerOptions};

use crate::args::{DiscoveryArgs, parse_listen_addr};
use crate::ca_server::{CaTransport, MeshCaServer};
use crate::http::{AppState, debug_router, monitoring_router};
use crate::metrics::PipelineMetrics;
use crate::settings::Settings;

/// Reads the mesh config file; Istio's defaults when the file does not exist.
pub fn load_mesh_config(path: &str) -> anyhow::Result<MeshConfig> {
    let p = Path::new(path);
    if path.is_empty() || !p.exists() {
        tracing::info!(path, "mesh config file not found, using Istio's defaults");
        return Ok(MeshConfig::default());
    }
    let text = std::fs::read_to_string(p).with_context(|| format!("reading mesh config {path}"))?;
    let value: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(&text).with_context(|| format!("parsing mesh config {path}"))?
    };
    MeshConfig::from_value(value).with_context(|| format!("mesh config {path}"))
}

pub async fn run(args: DiscoveryArgs, settings: Settings) -> anyhow::Result<()> {
    let grpc_addr = parse_listen_addr("grpcAddr", &args.grpc_addr)?;
    let secure_grpc_addr = parse_listen_addr("secureGrpcAddr", &args.secure_grpc_addr)?;
    let http_addr = parse_listen_addr("httpAddr", &args.http_addr)?;
    let https_addr = parse_listen_addr("httpsAddr", &args.https_addr)?;
    let monitoring_addr = parse_listen_addr("monitoringAddr", &args.monitoring_addr)?;
    let max_connection_age = model::duration::parse(&args.keepalive_max_server_connection_age)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--keepaliveMaxServerConnectionAge: {:?} is not a positive duration (e.g. 30m)",
                args.keepalive_max_server_connection_age
            )
        })?;
    let mesh_file = !args.mesh_config.is_empty() && Path::new(&args.mesh_config).exists();
    let mut mesh = load_mesh_config(&args.mesh_config)?;
    tracing::info!(?settings, domain = %args.domain, cluster_id = %args.cluster_id, "starting pilot-discovery");

    let mut registry = Registry::default();
    let mesh_changes_ignored = prometheus_client::metrics::counter::Counter::default();
    registry.register(
        "pilot_mesh_config_changes_ignored",
        "Changes of the istio ConfigMap's mesh config not applied: invalid, or of fields read only at start",
        mesh_changes_ignored.clone(),
    );
    let pipeline_metrics = PipelineMetrics::register(&mut registry);
    let watch_metrics = kube_registry::watch::WatchMetrics::register(&mut registry);
    let kube_is_registry = args.registries.iter().any(|r| r == "Kubernetes");
    let client = if kube_is_registry || args.config_dir.is_empty() {
        crate::kubernetes::client(&args).await?
    } else {
        tracing::info!(registries = ?args.registries, "Kubernetes is not a registry");
        None
    };
    // As istiod without a mounted mesh config file: the `istio` ConfigMap's, followed live.
    let mut live_mesh = None;
    if let (false, Some(client)) = (mesh_file, &client) {
        let revision = std::env::var("REVISION").unwrap_or_default();
        let yaml = match crate::mesh_configmap::load(client, &settings.pod_namespace, &revision).await? {
            Some((from_cluster, text)) => {
                mesh = from_cluster;
                text
            }
            None => String::new(),
        };
        let started = Arc::new(mesh.clone());
        let (tx, rx) = tokio::sync::watch::channel(crate::mesh_configmap::LiveMesh {
            mesh: started.clone(),
            yaml: yaml.into(),
        });
        live_mesh = Some(rx);
        tokio::spawn(crate::mesh_configmap::follow(
            client.clone(),
            settings.pod_namespace.clone(),
            revision,
            started,
            tx,
            mesh_changes_ignored.clone(),
        ));
    }
    // The injector's mesh: the same, or the mounted file's text (read at start).
    let injector_mesh = match &live_mesh {
        Some(rx) => crate::injection::MeshSource::Live(rx.clone()),
        None if mesh_file => crate::injection::MeshSource::Fixed(
            std::fs::read_to_string(&args.mesh_config)
                .with_context(|| format!("reading mesh config {}", args.mesh_config))?,
        ),
        None => crate::injection::MeshSource::Fixed(String::new()),
    };
    let mesh = Arc::new(mesh);

    let ConfigSources {
        initial: initial_change,
        state: store_state,
        mut changes,
    } = start_config_sources(
        &args,
        &mesh,
        client.as_ref(),
        kube_is_registry,
        &watch_metrics,
        &pipeline_metrics,
    )
    .await?;

    let mut kubernetes = match (client.clone(), kube_is_registry) {
        (Some(c), true) => Some(crate::kubernetes::start(c, &args, &mesh, watch_metrics).await?),
        _ => None,
    };
    // Kubernetes first: a Service takes precedence over a ServiceEntry of the same host and
    // namespace, as in Istio. Manifests of core Kubernetes objects in --configDir have their own
    // registry, fed by config events.
    // ServiceEntries select the Pods of both by workloadSelector.
    let mut kube: Vec<Arc<dyn environment::ServiceRegistry>> = Vec::new();
    if let Some(k) = &kubernetes {
        kube.push(k.registry.clone());
    }
    kube.push(Arc::new(kube_registry::KubeRegistry::new(crate::kubernetes::context(
        &args, &mesh,
    ))));
    let mut registries: Vec<Box<dyn environment::ServiceRegistry>> = kube
        .iter()
        .map(|r| Box::new(r.clone()) as Box<dyn environment::ServiceRegistry>)
        .collect();
    registries.push(Box::new(ServiceEntries::with_workloads(mesh.clone(), kube)));
    let environment = Arc::new(
        Environment::new(mesh.clone(), args.domain.clone(), registries)
            .with_features(settings.features)
            .with_ingress_namespace(&settings.ingress_namespace)
            .with_sds_metrics(generators::SdsMetrics::register(&mut registry)),
    );
    // The initial state; the server's first push covers everything.
    let _ = environment.config_changed(&initial_change);
    if let Some(k) = &mut kubernetes {
        k.apply_initial(&environment);
    }
    pipeline_metrics.validated(&initial_change);
    pipeline_metrics.observe(environment.stats());
    let opts = ServerOptions {
        debounce_after: settings.debounce_after,
        enable_eds_debounce: settings.enable_eds_debounce,
        push_throttle: settings.push_throttle,
        max_recv_msg_size: settings.max_recv_msg_size,
        max_resource_names: settings.max_resource_names,
        debug_endpoint_auth: settings.enable_debug_endpoint_auth,
        system_namespace: settings.pod_namespace.clone(),
    };
    let server = DiscoveryServer::new(environment.clone(), opts, &mut registry);
    server.start();
    let jwks_metrics = crate::jwks::JwksMetrics::register(&mut registry);
    let jwks = (settings.features.jwks_fetch_mode != model::features::JwksFetchMode::Envoy).then(|| {
        crate::jwks::spawn(
            environment.clone(),
            server.clone(),
            settings.jwks_refresh_interval,
            jwks_metrics,
        )
    });
    if let Some(k) = kubernetes {
        k.follow(environment.clone(), server.clone());
    }

    let process = monitoring::process::ProcessMetrics::register(&mut registry);
    let setup = crate::accept::Setup {
        timeout: crate::accept::CONNECTION_TIMEOUT,
        metrics: crate::accept::SetupMetrics::register(&mut registry),
    };
    let ca_limit = crate::ca_limits::RequestLimit::register(settings.max_recv_msg_size, &mut registry);
    let webhook_patch_metrics = (
        crate::webhook::patch::PatchMetrics::register(&mut registry),
        crate::webhook::patch::MutatingMetrics::register(&mut registry),
    );
    let injector = crate::injection::start(&mut registry, client.as_ref(), injector_mesh, &settings.pod_namespace);
    let tls_source = crate::serving_cert::Source::detect(&args.tls_flags(), Path::new("."));
    let (secure, plaintext_ca) = init_ca(
        (grpc_addr, secure_grpc_addr),
        &mesh,
        &settings,
        &mut registry,
        &client,
        tls_source,
    )
    .await?;
    // With a cluster, every namespace gets the mesh root (Istio's `istio-ca-root-cert`).
    let root_pem = secure
        .as_ref()
        .map(crate::secure::SecureGrpc::root_pem)
        .or_else(|| plaintext_ca.as_ref().map(MeshCaServer::root_pem));
    // The cluster-wide writers run only while this replica holds their Lease.
    let elections = client
        .as_ref()
        .map(|c| elections(c, &settings, crate::leader::LeaderMetrics::register(&mut registry)));
    let mut leaderships = Vec::new();
    if let (Some(root_pem), Some(client), Some(elections)) = (root_pem, &client, &elections) {
        let (client, mesh) = (client.clone(), mesh.clone());
        leaderships.push(elections.spawn(crate::leader::NAMESPACE_CONTROLLER, move || {
            crate::root_cert::publish(client.clone(), root_pem.clone(), mesh.clone())
        }));
    }
    let state = AppState {
        server: server.clone(),
        environment: environment.clone(),
        registry: Arc::new(registry),
        process,
        store: store_state,
        debug_auth: settings.enable_debug_endpoint_auth,
        dumps: AppState::dump_permits(),
    };

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = grpc_addr {
        let listener = bind(addr, "grpcAddr").await?;
        let svc = server.ads_service();
        let ca = plaintext_ca.map(|ca| crate::ca_limits::LimitedCa::new(ca.service, ca_limit.clone()));
        let mut builder = grpc_server(max_connection_age, settings.max_streams);
        let setup = setup.clone();
        tasks.spawn(async move {
            builder
                .add_service(svc)
                .add_optional_service(ca)
                .serve_with_incoming(crate::accept::plaintext(listener, setup))
                .await
                .context("gRPC server")
        });
        tracing::info!(%addr, "xDS (plaintext) listening");
    }
    match (https_addr, &secure) {
        (Some(addr), Some(secure)) => {
            let acceptor = secure
                .https_acceptor()
                .with_context(|| format!("--httpsAddr {addr}: TLS configuration"))?;
            let listener = bind(addr, "httpsAddr").await?;
            let router = crate::webhook::router(pipeline_metrics.clone(), injector);
            tasks.spawn(crate::webhook::serve(listener, acceptor, setup.clone(), router));
            if let (Some(client), Some(elections)) = (&client, &elections) {
                leaderships.push(start_webhook_patchers(
                    client,
                    elections,
                    secure,
                    &settings.pod_namespace,
                    &webhook_patch_metrics,
                ));
            }
        }
        (Some(addr), None) => tracing::info!(
            %addr,
            "--httpsAddr: the webhooks are off: there is no serving certificate without --secureGrpcAddr"
        ),
        (None, _) => {}
    }
    if let (Some(addr), Some(secure)) = (secure_grpc_addr, secure) {
        let listener = bind(addr, "secureGrpcAddr").await?;
        tasks.spawn(secure.serve(
            grpc_server(max_connection_age, settings.max_streams),
            listener,
            setup,
            ca_limit,
            server.ads_service(),
        ));
    }
    for (addr, flag, router) in [
        (http_addr, "httpAddr", debug_router(state.clone())),
        (monitoring_addr, "monitoringAddr", monitoring_router(state.clone())),
    ] {
        if let Some(addr) = addr {
            let listener = bind(addr, flag).await?;
            tracing::info!(%addr, flag, "HTTP listening");
            let service = router.into_make_service_with_connect_info::<SocketAddr>();
            tasks.spawn(async move { axum::serve(listener, service).await.context("HTTP server") });
        }
    }

    // Config changes into pushes.
    let env = environment.clone();
    let srv = server.clone();
    tasks.spawn(async move {
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                mesh = next_mesh(&mut live_mesh) => {
                    dispatch(&srv, env.mesh_changed(mesh));
                    continue;
                }
            };
            let Some(change) = change else { break };
            tracing::info!(events = change.events.len(), "config changed: {}", summarize(&change));
            for e in &change.events {
                tracing::debug!(config = %e.key(), event = event_name(e), "config changed");
            }
            pipeline_metrics.validated(&change);
            dispatch(&srv, env.config_changed(&change));
            if let Some(jwks) = &jwks {
                jwks.configs_changed();
            }
            pipeline_metrics.observe(env.stats());
        }
        bail!("the config source stopped")
    });

    tokio::select! {
        res = tasks.join_next() => match res {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        },
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            // As istiod's ReleaseOnCancel: another replica need not wait for the Leases to expire.
            futures::future::join_all(leaderships.into_iter().map(|l| l.release(Duration::from_secs(2)))).await;
            Ok(())
        }
    }
}

/// istiod's webhook configuration patchers, both following the serving certificate's CA bundle:
/// the validation controller, only while this replica holds its Lease (a new leader proves the
/// webhook again before `Fail`), and (Istio's `INJECTION_WEBHOOK_CONFIG_NAME`, by default
/// `istio-sidecar-injector`, not empty) the injector's webhook cert patcher, in every replica as
/// istiod's ("No leader election - different istiod revisions will patch their own cert").
fn start_webhook_patchers(
    client: &kube::Client,
    elections: &crate::leader::Elections,
    secure: &crate::secure::SecureGrpc,
    namespace: &str,
    (validating, mutating): &(
        crate::webhook::patch::PatchMetrics,
        crate::webhook::patch::MutatingMetrics,
    ),
) -> crate::leader::Leadership {
    use crate::webhook::patch::{MutatingPatcher, ValidatingPatcher, run};
    let (c, revision, namespace, metrics, bundles) = (
        client.clone(),
        secure.revision(),
        namespace.to_owned(),
        validating.clone(),
        secure.bundles(),
    );
    let validation = elections.spawn(crate::leader::VALIDATION_CONTROLLER, move || {
        let patcher = ValidatingPatcher {
            client: c.clone(),
            revision: revision.clone(),
            namespace: namespace.clone(),
            metrics: metrics.clone(),
            ready_for_fail_close: Default::default(),
        };
        run(patcher, c.clone(), bundles.clone())
    });
    let injection_config =
        std::env::var("INJECTION_WEBHOOK_CONFIG_NAME").unwrap_or_else(|_| "istio-sidecar-injector".into());
    if injection_config.is_empty() {
        tracing::info!("INJECTION_WEBHOOK_CONFIG_NAME is empty: the injector's webhook configurations are not patched");
        return validation;
    }
    let injection = MutatingPatcher {
        revision: secure.revision(),
        metrics: mutating.clone(),
    };
    tokio::spawn(run(injection, client.clone(), secure.bundles()));
    validation
}

/// Leader election for this replica (`leader.rs`): `POD_NAME` in `POD_NAMESPACE`.
fn elections(
    client: &kube::Client,
    settings: &Settings,
    metrics: crate::leader::LeaderMetrics,
) -> crate::leader::Elections {
    let e = crate::leader::Elections {
        client: client.clone(),
        namespace: settings.pod_namespace.clone(),
        identity: crate::leader::identity(&settings.pod_name),
        timing: settings.leader_lease,
        enabled: settings.enable_leader_election,
        metrics,
    };
    if e.enabled && settings.pod_name.is_empty() {
        tracing::warn!(
            identity = %e.identity,
            "POD_NAME is not set: leader election names this replica after its host, as istiod; \
             replicas that share a host name would all think they lead (set POD_NAME)"
        );
    }
    tracing::info!(
        identity = %e.identity,
        namespace = %e.namespace,
        enabled = e.enabled,
        lease_duration_secs = e.timing.duration_secs,
        "leader election"
    );
    e
}

/// The mesh CA, where istiod's `startCA` puts it: on the secure gRPC server when there is one
/// (with istiod's serving certificate), else on the plaintext one (the second value), where only
/// bearer tokens authenticate callers. Neither when no gRPC port is served.
async fn init_ca(
    (grpc_addr, secure_grpc_addr): (Option<SocketAddr>, Option<SocketAddr>),
    mesh: &MeshConfig,
    settings: &Settings,
    registry: &mut Registry,
    client: &Option<kube::Client>,
    tls_source: crate::serving_cert::Source,
) -> anyhow::Result<(Option<crate::secure::SecureGrpc>, Option<MeshCaServer>)> {
    let env = |k: &str| std::env::var(k).ok();
    match (secure_grpc_addr, grpc_addr) {
        (Some(addr), _) => Ok((
            Some(
                crate::secure::SecureGrpc::init(
                    addr,
                    mesh,
                    &settings.pod_namespace,
                    env,
                    registry,
                    client.clone(),
                    tls_source,
                )
                .await?,
            ),
            None,
        )),
        (None, Some(addr)) => {
            let served_on = format!("--grpcAddr {addr} (plaintext: --secureGrpcAddr is empty)");
            let ca = MeshCaServer::init(
                CaTransport::Plaintext,
                &served_on,
                mesh,
                &settings.pod_namespace,
                env,
                registry,
                client.clone(),
            )
            .await?;
            Ok((None, Some(ca)))
        }
        (None, None) => Ok((None, None)),
    }
}

/// Where config comes from: the initial state, the state for the debug endpoints, and the
/// changes after it.
struct ConfigSources {
    initial: config_sources::ConfigChange,
    state: tokio::sync::watch::Receiver<config_sources::StoreSnapshot>,
    changes: tokio::sync::mpsc::UnboundedReceiver<config_sources::ConfigChange>,
}

/// Istio config from `--configDir`, else from the API server. As Istio's ingress controller,
/// Kubernetes Ingresses and IngressClasses are read from the cluster whenever Kubernetes is a
/// registry and meshConfig `ingressControllerMode` is not `OFF`, with `--configDir` too (whose
/// Ingress manifests are read as well).
async fn start_config_sources(
    args: &DiscoveryArgs,
    mesh: &MeshConfig,
    client: Option<&kube::Client>,
    kube_is_registry: bool,
    watch_metrics: &kube_registry::watch::WatchMetrics,
    pipeline_metrics: &PipelineMetrics,
) -> anyhow::Result<ConfigSources> {
    use kube_registry::crdclient::{CONFIG_KINDS, ConfigResource};
    let (changes_tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let ingresses = kube_is_registry && mesh.ingress_controller_mode != "OFF";
    let is_ingress = |r: &&ConfigResource| matches!(r.kind, ConfigKind::Ingress | ConfigKind::IngressClass);
    let kube_source = |kinds: Vec<ConfigResource>, client: kube::Client| {
        kube_registry::crdclient::start(
            client,
            kinds,
            watch_metrics.clone(),
            mesh.discovery_selectors.clone(),
            Some(pipeline_metrics.invalid_observer()),
        )
    };
    if !args.config_dir.is_empty() {
        if !Path::new(&args.config_dir).is_dir() {
            bail!("--configDir {}: not a readable directory", args.config_dir);
        }
        let mut store = config_sources::FileConfigStore::new(&args.config_dir);
        store.set_invalid_observer(pipeline_metrics.invalid_observer());
        let mut initial = store.rescan();
        for e in store.errors() {
            tracing::warn!(error = ?e, "config problem");
        }
        tracing::info!(configs = initial.events.len(), dir = %args.config_dir, "loaded config directory");
        let dir_watch = config_sources::watch_store(store).context("watching --configDir")?;
        forward(
            tokio_stream::wrappers::ReceiverStream::new(dir_watch.changes),
            changes_tx.clone(),
        );
        if let (Some(c), true) = (client, ingresses) {
            let source = kube_source(CONFIG_KINDS.iter().filter(is_ingress).copied().collect(), c.clone()).await;
            tracing::info!(
                configs = source.initial.events.len(),
                "loaded Ingresses and IngressClasses from the Kubernetes API server"
            );
            initial.events.extend(source.initial.events);
            forward(
                tokio_stream::wrappers::UnboundedReceiverStream::new(source.changes),
                changes_tx,
            );
        }
        return Ok(ConfigSources {
            initial,
            state: dir_watch.state,
            changes,
        });
    }
    let Some(c) = client else {
        bail!(
            "no config source: give --configDir, or a Kubernetes cluster to read Istio config from \
             (--kubeconfig, KUBECONFIG, or in-cluster)"
        );
    };
    let kinds = CONFIG_KINDS
        .iter()
        .filter(|r| ingresses || !is_ingress(r))
        .copied()
        .collect();
    let source = kube_source(kinds, c.clone()).await;
    tracing::info!(
        configs = source.initial.events.len(),
        "loaded Istio config from the Kubernetes API server"
    );
    forward(
        tokio_stream::wrappers::UnboundedReceiverStream::new(source.changes),
        changes_tx,
    );
    Ok(ConfigSources {
        initial: source.initial,
        state: source.state,
        changes,
    })
}

/// Hands every change of one source on to the config task.
fn forward(
    from: impl futures::Stream<Item = config_sources::ConfigChange> + Send + 'static,
    to: tokio::sync::mpsc::UnboundedSender<config_sources::ConfigChange>,
) {
    use futures::StreamExt;
    tokio::spawn(async move {
        futures::pin_mut!(from);
        while let Some(c) = from.next().await {
            if to.send(c).is_err() {
                return;
            }
        }
    });
}

/// One line for a batch of config events: counts by kind and action, e.g.
/// `VirtualService: 2 updated; ServiceEntry: 1 added, 1 deleted` (a batch may hold thousands).
fn summarize(change: &config_sources::ConfigChange) -> String {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
    for e in &change.events {
        *counts
            .entry(e.key().kind.to_string())
            .or_default()
            .entry(event_name(e))
            .or_default() += 1;
    }
    counts
        .iter()
        .map(|(kind, actions)| {
            let actions: Vec<String> = actions.iter().map(|(a, n)| format!("{n} {a}")).collect();
            format!("{kind}: {}", actions.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn event_name(e: &config_sources::ConfigEvent) -> &'static str {
    match e {
        config_sources::ConfigEvent::Added(_) => "added",
        config_sources::ConfigEvent::Updated { .. } => "updated",
        config_sources::ConfigEvent::Deleted(_) => "deleted",
    }
}

/// A gRPC server with istiod's keepalive settings: a ping every 30s answered within 10s, and a
/// maximum connection age (`--keepaliveMaxServerConnectionAge`) with 10s grace, after which
/// proxies reconnect and spread over the replicas. At most `max_streams` concurrent streams per
/// connection (`ISTIO_GPRC_MAXSTREAMS`): HTTP/2 refuses the ones over it.
fn grpc_server(max_connection_age: Duration, max_streams: u32) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(max_streams))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_connection_age(max_connection_age)
        .max_connection_age_grace(Duration::from_secs(10))
}

/// Listens as Go's `net.Listen` does for istiod: SO_REUSEADDR, and the kernel's `somaxconn` as the
/// accept backlog (tokio's default of 1024 drops SYNs when thousands of proxies reconnect at once,
/// and each dropped SYN costs the proxy a 1 s retransmit).
async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(listen_backlog())
    };
    listen().with_context(|| format!("--{flag}: cannot listen on {addr} (hint: is the port in use?)"))
}

/// `/proc/sys/net/core/somaxconn` (Go reads the same), else 4096.
fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4096)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Hands what a change calls for to the xDS server: the push to the debouncer, the proxies whose
/// workload changed to `proxy_update`.
/// The next mesh config the `istio` ConfigMap's follower sends; never, without one.
async fn next_mesh(
    live: &mut Option<tokio::sync::watch::Receiver<crate::mesh_configmap::LiveMesh>>,
) -> Arc<model::MeshConfig> {
    if let Some(rx) = live {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().mesh.clone();
        }
        *live = None;
    }
    std::future::pending().await
}

pub(crate) fn dispatch(server: &DiscoveryServer<Environment>, update: environment::Update) {
    if let Some(req) = update.push {
        server.config_update(req);
    }
    if !update.proxies.is_empty() {
        server.proxy_update(&update.proxies);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_sources::{ConfigChange, ConfigEvent};

    fn config(kind: &str, name: &str) -> std::sync::Arc<model::Config> {
        let spec = match kind {
            "VirtualService" => serde_json::json!({"hosts": ["a.example.com"],
                "http": [{"route": [{"destination": {"host": "a.example.com"}}]}]}),
            _ => serde_json::json!({"hosts": ["a.example.com"], "ports": [{"number": 80, "name": "http"}]}),
        };
        model::testing::config(serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
    }

    #[test]
    fn a_batch_of_config_events_is_one_line_of_counts() {
        let change = ConfigChange {
            events: vec![
                ConfigEvent::Added(config("ServiceEntry", "a")),
                ConfigEvent::Added(config("ServiceEntry", "b")),
                ConfigEvent::Deleted(config("ServiceEntry", "c")),
                ConfigEvent::Updated {
                    old: config("VirtualService", "v"),
                    new: config("VirtualService", "v"),
                },
            ],
        };
        assert_eq!(
            summarize(&change),
            "ServiceEntry: 2 added, 1 deleted; VirtualService: 1 updated"
        );
    }
}
