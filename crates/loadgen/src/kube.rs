//! A Kubernetes-shaped mesh on the fake API server (test-support's): S Services with P Pods each
//! (spread over E EndpointSlices per Service, as the EndpointSlice controller splits large or
//! dual-stack services) in N namespaces. Measures pilot-discovery's start-up to `/ready`
//! (initial lists, conversion, first push snapshot), and pod churn: at R changes per second, a new
//! Pod replaces the oldest one of the next Service (the Pod created, the EndpointSlice updated,
//! the old Pod deleted, as a rolling update does), each timed from the slice update until a sidecar
//! (a real ADS client) has received EDS holding the new Pod's address, while `--proxies` - 1 more
//! sidecars (real ADS clients too, spread over the namespaces, ACKing everything) are pushed the
//! same changes. A long churn also reports the first and the last minute apart (lag p99, RSS), to
//! show growth.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use test_support::ads::AdsClient;
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::FakeApiServer;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::type_url;

use crate::report::{cpu_seconds, peak_rss_mb, percentile_ms};

#[derive(Debug, Clone)]
pub struct KubeOptions {
    pub services: usize,
    pub pods_per_service: usize,
    /// EndpointSlices per Service (the Pods dealt round robin over them).
    pub slices_per_service: usize,
    pub namespaces: usize,
    /// Pod replacements per second (0: no churn phase).
    pub churn_rate: f64,
    pub churn_seconds: f64,
    /// Sidecars connected during the churn phase (the measuring one included).
    pub proxies: usize,
    /// Clusters holding the mesh: the config cluster and `clusters - 1` remote ones (each its own
    /// fake API server with the same Services and Pods, named by a remote secret in the config
    /// cluster's `istio-system`, as a multi-primary mesh replicates its workloads).
    pub clusters: usize,
    pub discovery_bin: Option<PathBuf>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct KubeReport {
    pub clusters: usize,
    pub services: usize,
    pub pods: usize,
    pub endpoint_slices: usize,
    pub namespaces: usize,
    pub proxies: usize,
    /// From starting pilot-discovery to `/ready`.
    pub ready_seconds: f64,
    pub rss_mb_at_ready: Option<f64>,
    pub cpu_seconds_at_ready: Option<f64>,
    pub churn_changes: usize,
    pub churn_lag_p50_ms: Option<f64>,
    pub churn_lag_p99_ms: Option<f64>,
    pub churn_lag_max_ms: Option<f64>,
    /// Changes whose address never reached the sidecar within 30 s of the last change.
    pub churn_missed: usize,
    /// Lag p99 of the changes made in the churn's first and last 60 s (a churn of 2 minutes or more).
    pub churn_lag_first_minute_p99_ms: Option<f64>,
    pub churn_lag_last_minute_p99_ms: Option<f64>,
    /// pilot-discovery's resident memory 60 s into the churn and at its end.
    pub churn_rss_mb_after_first_minute: Option<f64>,
    pub churn_rss_mb_at_end: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub cpu_seconds: Option<f64>,
}

fn pod_ip(k: usize) -> String {
    format!("10.{}.{}.{}", 64 + k / 65536 % 64, k / 256 % 256, k % 256)
}

fn pod(ns: &str, svc: usize, k: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("svc-{svc}-{k}"), "namespace": ns, "labels": {"app": format!("svc-{svc}"), "version": "v1"}},
        "spec": {"nodeName": "node-1", "serviceAccountName": format!("svc-{svc}"), "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": pod_ip(k), "podIPs": [{"ip": pod_ip(k)}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn slice(ns: &str, svc: usize, index: usize, pods: &[usize]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|k| {
            json!({"addresses": [pod_ip(*k)], "conditions": {"ready": true}, "nodeName": "node-1",
                         "targetRef": {"kind": "Pod", "name": format!("svc-{svc}-{k}"), "namespace": ns}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{svc}-slice-{index}"), "namespace": ns, "labels": {"kubernetes.io/service-name": format!("svc-{svc}")}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

pub async fn run(opts: &KubeOptions) -> Result<KubeReport> {
    let api = FakeApiServer::start().await?;
    let mut cluster = Cluster::populate(&api, opts)?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config");
    std::fs::create_dir(&config)?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let _remotes = remote_clusters(&api, opts, dir.path()).await?;
    let t0 = Instant::now();
    let discovery = Discovery::start(
        &config,
        DiscoveryOptions {
            args: vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
            env: vec![("PILOT_DEBOUNCE_AFTER".into(), "100ms".into())],
            binary: opts.discovery_bin.clone(),
            ..Default::default()
        },
    )
    .await
    .context("pilot-discovery on the fake API server")?;
    let ready = t0.elapsed();
    let pid = discovery.pid();
    let mut report = KubeReport {
        clusters: opts.clusters.max(1),
        services: opts.services,
        pods: opts.services * opts.pods_per_service,
        endpoint_slices: opts.services * opts.slices_per_service.max(1),
        namespaces: opts.namespaces,
        proxies: opts.proxies.max(1),
        ready_seconds: ready.as_secs_f64(),
        rss_mb_at_ready: pid.and_then(peak_rss_mb),
        cpu_seconds_at_ready: pid.and_then(cpu_seconds),
        churn_changes: 0,
        churn_lag_p50_ms: None,
        churn_lag_p99_ms: None,
        churn_lag_max_ms: None,
        churn_missed: 0,
        churn_lag_first_minute_p99_ms: None,
        churn_lag_last_minute_p99_ms: None,
        churn_rss_mb_after_first_minute: None,
        churn_rss_mb_at_end: None,
        peak_rss_mb: None,
        cpu_seconds: None,
    };
    if opts.churn_rate > 0.0 {
        churn(&api, &discovery, opts, &mut cluster, &mut report).await?;
    }
    report.peak_rss_mb = pid.and_then(peak_rss_mb);
    report.cpu_seconds = pid.and_then(cpu_seconds);
    Ok(report)
}

/// The remote clusters of `opts`, populated, each named by a remote secret in `api`'s
/// `istio-system` (pilot-discovery's start-up to `/ready` waits for their initial lists).
async fn remote_clusters(api: &FakeApiServer, opts: &KubeOptions, dir: &std::path::Path) -> Result<Vec<FakeApiServer>> {
    if opts.clusters <= 1 {
        return Ok(Vec::new());
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    let mut remotes = Vec::new();
    for c in 1..opts.clusters {
        let remote = FakeApiServer::start().await?;
        Cluster::populate(&remote, opts)?;
        let path = dir.join(format!("cluster-{c}"));
        remote.write_kubeconfig(&path)?;
        use base64::Engine;
        let kubeconfig = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&path)?);
        api.apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("istio-remote-secret-cluster-{c}"), "namespace": "istio-system",
                         "labels": {"istio/multiCluster": "true"}},
            "data": {format!("cluster-{c}"): kubeconfig}}))?;
        remotes.push(remote);
    }
    Ok(remotes)
}

/// The synthetic cluster's Pods and EndpointSlices as the churn changes them.
struct Cluster {
    /// Per service, its pods' numbers, oldest first.
    pods: Vec<std::collections::VecDeque<usize>>,
    /// Per service, the pods of each of its slices.
    slices: Vec<Vec<Vec<usize>>>,
    next_pod: usize,
    namespaces: usize,
}

impl Cluster {
    /// The node, namespaces, Services, Pods and EndpointSlices of `opts`, applied.
    fn populate(api: &FakeApiServer, opts: &KubeOptions) -> Result<Cluster> {
        api.apply(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1",
            "labels": {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "z1"}}}),
        )?;
        for n in 0..opts.namespaces.max(1) {
            api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{n}")}}))?;
        }
        let mut cluster = Cluster {
            pods: Vec::with_capacity(opts.services),
            slices: Vec::with_capacity(opts.services),
            next_pod: 0,
            namespaces: opts.namespaces,
        };
        let per_service = opts.slices_per_service.max(1);
        for s in 0..opts.services {
            let ns = cluster.ns_of(s);
            api.apply(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{s}"), "namespace": ns},
                "spec": {"clusterIP": format!("10.96.{}.{}", s / 256 % 256, s % 256), "selector": {"app": format!("svc-{s}")},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))?;
            let mine: Vec<usize> = (cluster.next_pod..cluster.next_pod + opts.pods_per_service).collect();
            cluster.next_pod += opts.pods_per_service;
            for k in &mine {
                api.apply(pod(&ns, s, *k))?;
            }
            let mut dealt = vec![Vec::new(); per_service];
            for (i, k) in mine.iter().enumerate() {
                dealt[i % per_service].push(*k);
            }
            for (j, members) in dealt.iter().enumerate() {
                api.apply(slice(&ns, s, j, members))?;
            }
            cluster.slices.push(dealt);
            cluster.pods.push(mine.into_iter().collect());
        }
        Ok(cluster)
    }

    fn ns_of(&self, s: usize) -> String {
        format!("ns-{}", s % self.namespaces.max(1))
    }

    /// Service `s`'s oldest Pod replaced by a new one (which takes its place in its slice, or
    /// joins the first): the new Pod's IP, and when its slice was applied.
    fn replace_oldest(&mut self, api: &FakeApiServer, s: usize) -> Result<(String, Instant)> {
        let ns = self.ns_of(s);
        let new = self.next_pod;
        self.next_pod += 1;
        api.apply(pod(&ns, s, new))?;
        let old = self.pods[s].pop_front();
        self.pods[s].push_back(new);
        let j = old
            .and_then(|o| self.slices[s].iter().position(|members| members.contains(&o)))
            .unwrap_or(0);
        let members = &mut self.slices[s][j];
        members.retain(|k| Some(*k) != old);
        members.push(new);
        api.apply(slice(&ns, s, j, members))?;
        let applied = Instant::now();
        if let Some(old) = old {
            api.delete(&pod(&ns, s, old))?;
        }
        Ok((pod_ip(new), applied))
    }
}

/// Pods replaced at `churn_rate` for `churn_seconds` while one sidecar (of `proxies`) measures how
/// long each new endpoint takes to reach it; the lags and memory go into `report`.
async fn churn(
    api: &FakeApiServer,
    discovery: &Discovery,
    opts: &KubeOptions,
    cluster: &mut Cluster,
    report: &mut KubeReport,
) -> Result<()> {
    let pid = discovery.pid();
    let metadata = json!({"NAMESPACE": "ns-0", "LABELS": {"app": "client"}, "ISTIO_VERSION": "1.28.0"});
    let mut client = AdsClient::connect(
        discovery.grpc_addr,
        "sidecar~10.1.255.1~client-0.ns-0~ns-0.svc.cluster.local",
        metadata,
    )
    .await?;
    client.handshake(None).await?;
    let mut others = start_other_sidecars(discovery, opts).await?;
    let mut pending: HashMap<String, Instant> = HashMap::new();
    // (when the change was made, its lag)
    let mut lags: Vec<(Instant, Duration)> = Vec::new();
    let period = Duration::from_secs_f64(1.0 / opts.churn_rate);
    let churn_start = Instant::now();
    let end = churn_start + Duration::from_secs_f64(opts.churn_seconds);
    let minute = Duration::from_secs(60);
    let mut rss_after_first_minute = None;
    let mut tick = tokio::time::interval(period);
    let mut i = 0usize;
    let drain_until = |last: Instant| last + Duration::from_secs(30);
    let mut last_change = Instant::now();
    loop {
        let writing = Instant::now() < end;
        if !writing && (pending.is_empty() || Instant::now() > drain_until(last_change)) {
            break;
        }
        tokio::select! {
            _ = tick.tick(), if writing => {
                if rss_after_first_minute.is_none() && churn_start.elapsed() >= minute {
                    rss_after_first_minute = Some(pid.and_then(crate::report::rss_mb));
                }
                let (ip, applied) = cluster.replace_oldest(api, i % opts.services)?;
                i += 1;
                pending.insert(ip, applied);
                last_change = applied;
                report.churn_changes += 1;
            }
            r = client.recv() => {
                let r = r?;
                if r.type_url() == type_url::ENDPOINT {
                    let now = Instant::now();
                    for cla in r.decode::<ClusterLoadAssignment>()? {
                        for (a, _) in test_support::ads::endpoint_addresses(&cla) {
                            if let Some(made) = pending.remove(&a) {
                                lags.push((made, now - made));
                            }
                        }
                    }
                }
                client.ack_response(&r)?;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)), if !writing => {}
        }
    }
    report.churn_rss_mb_at_end = pid.and_then(crate::report::rss_mb);
    others.abort_all();
    report.churn_missed = pending.len();
    let all: Vec<Duration> = lags.iter().map(|(_, lag)| *lag).collect();
    report.churn_lag_p50_ms = percentile_ms(&all, 0.5);
    report.churn_lag_p99_ms = percentile_ms(&all, 0.99);
    report.churn_lag_max_ms = all.iter().max().map(|d| d.as_secs_f64() * 1000.0);
    if opts.churn_seconds >= 120.0 {
        let within = |from: Instant, to: Instant| -> Vec<Duration> {
            lags.iter()
                .filter(|(t, _)| *t >= from && *t < to)
                .map(|(_, lag)| *lag)
                .collect()
        };
        report.churn_lag_first_minute_p99_ms = percentile_ms(&within(churn_start, churn_start + minute), 0.99);
        report.churn_lag_last_minute_p99_ms = percentile_ms(&within(end - minute, end), 0.99);
        report.churn_rss_mb_after_first_minute = rss_after_first_minute.flatten();
    }
    Ok(())
}

/// The sidecars besides the measuring one: connected and synced before the churn starts, then
/// ACKing whatever they are pushed until aborted.
async fn start_other_sidecars(discovery: &Discovery, opts: &KubeOptions) -> Result<tokio::task::JoinSet<()>> {
    let mut set = tokio::task::JoinSet::new();
    for i in 1..opts.proxies.max(1) {
        let ns = format!("ns-{}", i % opts.namespaces.max(1));
        let id = format!(
            "sidecar~10.2.{}.{}~client-{i}.{ns}~{ns}.svc.cluster.local",
            i / 256 % 256,
            i % 256
        );
        let metadata = json!({"NAMESPACE": ns, "LABELS": {"app": "client"}, "ISTIO_VERSION": "1.28.0"});
        let mut client = AdsClient::connect(discovery.grpc_addr, &id, metadata).await?;
        client.handshake(None).await?;
        set.spawn(async move {
            while let Ok(r) = client.recv().await {
                if client.ack_response(&r).is_err() {
                    return;
                }
            }
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenario runs end to end on a small mesh and every churned Pod reaches the sidecar (no
    /// timing is asserted: figures come from release runs, docs/perf.md).
    #[tokio::test]
    async fn a_small_kubernetes_mesh_starts_and_every_churned_pod_converges() -> Result<()> {
        let report = run(&KubeOptions {
            services: 20,
            pods_per_service: 4,
            slices_per_service: 2,
            namespaces: 3,
            churn_rate: 10.0,
            churn_seconds: 1.0,
            proxies: 3,
            clusters: 2,
            discovery_bin: None,
        })
        .await?;
        assert_eq!(report.pods, 80);
        assert_eq!(report.clusters, 2);
        assert_eq!(report.endpoint_slices, 40);
        assert!(report.churn_changes >= 5, "{report:?}");
        assert_eq!(report.churn_missed, 0, "{report:?}");
        assert!(report.churn_lag_p50_ms.is_some());
        Ok(())
    }
}
