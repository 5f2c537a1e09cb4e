//! `pilot-discovery discovery`, step by step as istiod's `NewServer` and `Start`
//! (pilot/pkg/bootstrap/server.go): the listen addresses, the Kubernetes client, the mesh config
//! (`server/mesh.rs`), the config sources (`server/config.rs`), the registries and the
//! environment (`registries`), the xDS server, the CA (`server/ca.rs`) and the cluster-wide
//! writers behind leader election (`server/cluster_writers.rs`), the listeners
//! (`server/listeners.rs`), then the config task; until a signal or a task's end.
//!
//! The modules below `server` import nothing above them: `kubernetes`, `jwks` and the config
//! task hand their changes to the xDS server through `push::dispatch`.

mod ca;
mod cluster_writers;
mod config;
mod listeners;
mod mesh;

use listeners::Addresses;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use environment::Environment;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use registry::ServiceEntries;
use xds_server::{DiscoveryServer, ServerOptions};

use crate::args::DiscoveryArgs;
use crate::http::AppState;
use crate::metrics::PipelineMetrics;
use crate::settings::Settings;

pub async fn run(args: DiscoveryArgs, settings: Settings) -> anyhow::Result<()> {
    let addrs = Addresses::from_args(&args)?;
    tracing::info!(?settings, domain = %args.domain, cluster_id = %args.cluster_id, "starting pilot-discovery");
    let mut registry = Registry::default();
    let pipeline_metrics = PipelineMetrics::register(&mut registry);
    let watch_metrics = kclient::WatchMetrics::register(&mut registry);
    let kube_is_registry = args.registries.iter().any(|r| r == "Kubernetes");
    let client = kclient(&args, kube_is_registry).await?;
    let ignored = mesh_changes_ignored(&mut registry);
    let mesh = mesh::init(&args, &settings, client.as_ref(), ignored).await?;
    let sources = config::start_config_sources(
        &args,
        &mesh.config,
        client.as_ref(),
        kube_is_registry,
        &watch_metrics,
        &pipeline_metrics,
    )
    .await?;
    let (environment, server, jwks, multicluster) = init_discovery(
        &args,
        &settings,
        (&mesh.config, client.as_ref(), kube_is_registry),
        (&sources.initial, &mesh.networks),
        (&pipeline_metrics, watch_metrics),
        &mut registry,
    )
    .await?;
    let process = monitoring::process::ProcessMetrics::register(&mut registry);
    let (setup, ca_limit) = listeners::register(&mut registry, settings.max_recv_msg_size);
    let injector = crate::injection::start(&mut registry, client.as_ref(), mesh.injector, &settings.pod_namespace);
    let tls_source = crate::serving_cert::Source::detect(&args.tls_flags(), Path::new("."));
    let ca_addrs = (addrs.grpc, addrs.secure_grpc);
    let (secure, plaintext_ca) =
        ca::init_ca(ca_addrs, &mesh.config, &settings, &mut registry, &client, tls_source).await?;
    // The cluster-wide writers run only while this replica holds their lock.
    let leaderships = match &client {
        Some(client) => cluster_writers::start(
            client,
            &settings,
            &mut registry,
            (&secure, &plaintext_ca),
            &mesh.config,
            addrs.https.is_some(),
        ),
        None => Vec::new(),
    };
    let state = AppState {
        server: server.clone(),
        environment: environment.clone(),
        registry: Arc::new(registry),
        process,
        store: sources.state,
        networks: mesh.networks,
        clusters: multicluster,
        debug_auth: settings.enable_debug_endpoint_auth,
        dumps: AppState::dump_permits(),
    };
    let mut tasks = listeners::serve(listeners::Served {
        addrs: &addrs,
        max_streams: settings.max_streams,
        ads: &server,
        secure,
        plaintext_ca,
        injector,
        setup,
        ca_limit,
        pipeline_metrics: pipeline_metrics.clone(),
        state,
    })
    .await?;
    tasks.spawn(config::run(
        sources.changes,
        mesh.live,
        (environment, server),
        jwks,
        pipeline_metrics,
    ));
    until_signal_or_end(tasks, leaderships).await
}

/// Runs until a task ends (an error ends the process with it) or SIGTERM/Ctrl-C (the leader
/// election locks are released first, as istiod's ReleaseOnCancel: another replica need not wait
/// for them to expire).
async fn until_signal_or_end(
    mut tasks: tokio::task::JoinSet<anyhow::Result<()>>,
    leaderships: Vec<crate::leader::Leadership>,
) -> anyhow::Result<()> {
    tokio::select! {
        res = tasks.join_next() => match res {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        },
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            futures::future::join_all(leaderships.into_iter().map(|l| l.release(Duration::from_secs(2)))).await;
            Ok(())
        }
    }
}

/// The registries and the environment over them with the initial config applied, the xDS server
/// on it, the JWKS resolver, and the Kubernetes and Consul registries' followers (istiod's
/// `initServiceControllers`, `initDiscoveryService`, `initJwksResolver`).
async fn init_discovery(
    args: &DiscoveryArgs,
    settings: &Settings,
    (mesh, client, kube_is_registry): (&Arc<model::MeshConfig>, Option<&kube::Client>, bool),
    (initial, networks): (
        &config_sources::ConfigChange,
        &tokio::sync::watch::Receiver<Arc<model::mesh_networks::MeshNetworks>>,
    ),
    (pipeline_metrics, watch_metrics): (&PipelineMetrics, kclient::WatchMetrics),
    registry: &mut Registry,
) -> anyhow::Result<(
    Arc<Environment>,
    Arc<DiscoveryServer<Environment>>,
    Option<crate::jwks::JwksWake>,
    Option<Arc<crate::multicluster::Multicluster>>,
)> {
    let remote_watch_metrics = watch_metrics.clone();
    let mut kubernetes = match (client, kube_is_registry) {
        (Some(c), true) => {
            Some(crate::kubernetes::start(c.clone(), (args, &settings.pod_namespace), mesh, watch_metrics).await?)
        }
        _ => None,
    };
    let mut consul = if crate::consul::enabled(args) {
        Some(crate::consul::start(args, mesh, registry).await?)
    } else {
        None
    };
    let environment = init_environment(args, settings, mesh, (kubernetes.as_ref(), consul.as_ref()), registry);
    // The initial state; the server's first push covers everything.
    let _ = environment.config_changed(initial);
    let _ = environment.networks_changed(&networks.borrow());
    if let Some(k) = &mut kubernetes {
        k.apply_initial(&environment);
    }
    if let Some(c) = &mut consul {
        c.apply_initial(&environment);
    }
    pipeline_metrics.validated(initial);
    pipeline_metrics.observe(environment.stats());
    let server = start_discovery_server(&environment, settings, registry);
    let jwks_metrics = crate::jwks::JwksMetrics::register(registry);
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
    if let Some(c) = consul {
        c.follow(environment.clone(), server.clone());
    }
    follow_networks(networks.clone(), environment.clone(), server.clone());
    let multicluster = match (client, kube_is_registry) {
        (Some(c), true) => {
            let served = crate::multicluster::Served {
                environment: environment.clone(),
                server: server.clone(),
                context: crate::kubernetes::context(args, mesh, &settings.pod_namespace),
                watch_metrics: remote_watch_metrics,
                metrics: crate::multicluster::Metrics::register(registry),
                timeout: settings.remote_cluster_timeout,
            };
            Some(crate::multicluster::start(served, c.clone(), settings).await)
        }
        _ => None,
    };
    Ok((environment, server, jwks, multicluster))
}

/// Each new meshNetworks reaches the environment and, as a full push, every proxy.
fn follow_networks(
    mut networks: tokio::sync::watch::Receiver<Arc<model::mesh_networks::MeshNetworks>>,
    environment: Arc<Environment>,
    server: Arc<DiscoveryServer<Environment>>,
) {
    tokio::spawn(async move {
        while networks.changed().await.is_ok() {
            let current = networks.borrow_and_update().clone();
            crate::push::dispatch(&server, environment.networks_changed(&current));
        }
    });
}

/// `pilot_mesh_config_changes_ignored`, registered.
fn mesh_changes_ignored(registry: &mut Registry) -> Counter {
    let counter = Counter::default();
    registry.register(
        "pilot_mesh_config_changes_ignored",
        "Changes of the istio ConfigMap's mesh config or mesh networks not applied: invalid, or of fields read only at start",
        counter.clone(),
    );
    counter
}

/// The Kubernetes client when a cluster is a registry or the config source (no `--configDir`).
async fn kclient(args: &DiscoveryArgs, kube_is_registry: bool) -> anyhow::Result<Option<kube::Client>> {
    if kube_is_registry || args.config_dir.is_empty() {
        return crate::kubernetes::client(args).await;
    }
    tracing::info!(registries = ?args.registries, "Kubernetes is not a registry");
    Ok(None)
}

/// The registries, in Istio's order, composed into the environment (istiod's
/// `initServiceControllers` and `NewEnvironment`).
fn init_environment(
    args: &DiscoveryArgs,
    settings: &Settings,
    mesh: &Arc<model::MeshConfig>,
    (kubernetes, consul): (Option<&crate::kubernetes::Kubernetes>, Option<&crate::consul::Consul>),
    registry: &mut Registry,
) -> Arc<Environment> {
    // Kubernetes first: a Service takes precedence over a ServiceEntry of the same host and
    // namespace, as in Istio. Manifests of core Kubernetes objects in --configDir have their own
    // registry, fed by config events.
    // ServiceEntries select the Pods of both by workloadSelector.
    let mut kube: Vec<Arc<dyn registry::ServiceRegistry>> = Vec::new();
    if let Some(k) = kubernetes {
        kube.push(k.registry.clone());
    }
    kube.push(Arc::new(kube_registry::KubeRegistry::new(crate::kubernetes::context(
        args,
        mesh,
        &settings.pod_namespace,
    ))));
    let mut registries: Vec<Box<dyn registry::ServiceRegistry>> = kube
        .iter()
        .map(|r| Box::new(r.clone()) as Box<dyn registry::ServiceRegistry>)
        .collect();
    // Then Consul, as Istio 1.7 added it after Kubernetes, and the ServiceEntries last.
    if let Some(c) = consul {
        registries.push(Box::new(c.registry.clone()));
    }
    if args.registries.iter().any(|r| r == registry::SERVICE_REGISTRY_MOCK) {
        // Istio's `initMemoryRegistry`: an empty registry that code fills (tests).
        registries.push(Box::new(registry::MemoryRegistry::new()));
    }
    let workload_sources = registry::WorkloadSources::new(kube);
    registries.push(Box::new(ServiceEntries::with_workloads(
        mesh.clone(),
        workload_sources.clone(),
    )));
    Arc::new(
        Environment::new(mesh.clone(), args.domain.clone(), registries)
            .with_features(settings.features)
            .with_ingress_namespace(&settings.ingress_namespace)
            .with_workload_sources(workload_sources)
            .with_sds_metrics(generators::SdsMetrics::register(registry)),
    )
}

/// The xDS server over the environment, started (its debouncer and push queue).
fn start_discovery_server(
    environment: &Arc<Environment>,
    settings: &Settings,
    registry: &mut Registry,
) -> Arc<DiscoveryServer<Environment>> {
    let opts = ServerOptions {
        debounce_after: settings.debounce_after,
        enable_eds_debounce: settings.enable_eds_debounce,
        push_throttle: settings.push_throttle,
        max_recv_msg_size: settings.max_recv_msg_size,
        max_resource_names: settings.max_resource_names,
        debug_endpoint_auth: settings.enable_debug_endpoint_auth,
        system_namespace: settings.pod_namespace.clone(),
    };
    let server = DiscoveryServer::new(environment.clone(), opts, registry);
    server.start();
    server
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
