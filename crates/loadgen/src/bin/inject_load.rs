//! `inject_load`: pilot-discovery's sidecar injector (`/inject` on `--httpsAddr`, Istio's
//! `serveInject`) under a steady rate of Pod admissions over HTTPS, as the API server calls it:
//! the injector config is the `istio-sidecar-injector` ConfigMap of Istio's rendered default
//! install (on the fake API server), each request a Deployment's Pod in an AdmissionReview v1.
//! Prints the latency percentiles of answered reviews (each checked: allowed, with a JSONPatch)
//! and pilot-discovery's resident memory before and after the ConfigMap is loaded (the parsed
//! templates and values). Starts the pilot-discovery next to its own executable, else
//! target/debug, or `--discovery-bin`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::FakeApiServer;
use test_support::ports::free_port;

#[derive(Debug, Parser)]
#[command(name = "inject_load", about = "Pod admissions against pilot-discovery's /inject")]
struct Args {
    /// Pods (AdmissionReviews) per second, sent on a fixed schedule whatever the answers' pace.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Istio's rendered install (its `istio-sidecar-injector` and `istio` ConfigMaps).
    #[arg(long)]
    install: Option<PathBuf>,
    #[arg(long)]
    discovery_bin: Option<PathBuf>,
}

const INSTALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml"
);

fn review(i: usize) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{i:012x}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps", "operation": "CREATE",
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "web-5d8f7c9b4-", "namespace": "apps",
                    "labels": {"app": "web", "version": "v1", "pod-template-hash": "5d8f7c9b4"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f7c9b4", "controller": true}]},
                "spec": {"serviceAccountName": "web", "containers": [{"name": "web", "image": "nginx:1.27",
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}]}
            }
        }
    })
}

fn rss_kib(pid: u32) -> u64 {
    test_support::figures::memory_kib(pid)
        .map(|(rss, _)| rss)
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let install = a.install.unwrap_or_else(|| PathBuf::from(INSTALL));
    let text =
        std::fs::read_to_string(&install).with_context(|| format!("Istio's rendered install {}", install.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)?;
    let configmap = |name: &str| {
        docs.iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
            .cloned()
    };
    let (Some(injector_cm), Some(mesh_cm)) = (configmap("istio-sidecar-injector"), configmap("istio")) else {
        bail!("{}: no istio-sidecar-injector or istio ConfigMap", install.display());
    };
    let api = FakeApiServer::start().await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    api.apply(mesh_cm)?;
    let work = tempfile::tempdir()?;
    let kubeconfig = work.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let https = free_port();
    let binary = a.discovery_bin.or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let bin = exe.parent()?.join("pilot-discovery");
        bin.is_file().then_some(bin)
    });
    let root_dir = work.path().join("cacerts");
    std::fs::create_dir(work.path().join("config"))?;
    let discovery = Discovery::start(
        &work.path().join("config"),
        DiscoveryOptions {
            args: vec![
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--secureGrpcAddr".into(),
                format!("127.0.0.1:{}", free_port()),
                "--httpsAddr".into(),
                format!("127.0.0.1:{https}"),
                "--log_output_level".into(),
                "default:warn".into(),
            ],
            env: vec![
                ("ROOT_CA_DIR".into(), root_dir.display().to_string()),
                ("ENABLE_NATIVE_SIDECARS".into(), "true".into()),
            ],
            binary,
            ..Default::default()
        },
    )
    .await?;
    let pid = discovery.pid().context("pilot-discovery's pid")?;
    let root = std::fs::read(root_dir.join("root-cert.pem")).context("the mesh root in ROOT_CA_DIR")?;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&root)?)
        .resolve("istiod.istio-system.svc", ([127, 0, 0, 1], https).into())
        .timeout(Duration::from_secs(30))
        .build()?;
    let url = format!("https://istiod.istio-system.svc:{https}/inject");
    let post = |client: reqwest::Client, body: Vec<u8>| {
        let url = url.clone();
        async move {
            let t0 = Instant::now();
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let status = r.status().as_u16();
            let answer: Value = r.json().await.unwrap_or_default();
            anyhow::Ok((t0.elapsed(), status, answer))
        }
    };

    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kib(pid);
    api.apply(injector_cm)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status, _) = post(client.clone(), serde_json::to_vec(&review(0))?).await?;
        if status == 200 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "/inject still answers {status} 30 s after the ConfigMap:\n{}",
                discovery.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_loaded = rss_kib(pid);

    let total = (a.rate * a.seconds).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / a.rate);
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 1..=total {
        ticker.tick().await;
        let body = serde_json::to_vec(&review(i))?;
        let (latencies, errors, request) = (latencies.clone(), errors.clone(), post(client.clone(), body));
        tasks.spawn(async move {
            match request.await {
                Ok((took, 200, answer))
                    if answer["response"]["allowed"] == true && answer["response"]["patchType"] == "JSONPatch" =>
                {
                    latencies
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(took);
                }
                Ok((_, status, answer)) => {
                    errors
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(format!(
                            "{status}: {}",
                            answer.to_string().chars().take(300).collect::<String>()
                        ))
                }
                Err(e) => errors
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(format!("{e:#}")),
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let rss_after = rss_kib(pid);
    let mut l = latencies
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    l.sort();
    let errors = errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let pct = |p: f64| -> f64 {
        if l.is_empty() {
            return f64::NAN;
        }
        let i = ((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    };
    let metrics = discovery.get("/metrics", true).await?.1;
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
            .unwrap_or_default()
            .to_owned()
    };
    println!(
        "inject_load: {} Pods at {:.0}/s over {:.1} s ({:.1}/s achieved); {} injected, {} errors",
        total,
        a.rate,
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        l.len(),
        errors.len()
    );
    println!(
        "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "pilot-discovery RSS MiB: {:.1} before the injector ConfigMap, {:.1} with it loaded (+{:.1}), {:.1} after the run",
        rss_before as f64 / 1024.0,
        rss_loaded as f64 / 1024.0,
        (rss_loaded as f64 - rss_before as f64) / 1024.0,
        rss_after as f64 / 1024.0
    );
    for m in [
        "sidecar_injection_requests_total",
        "sidecar_injection_success_total",
        "sidecar_injection_failure_total",
    ] {
        println!("{}", metric(m));
    }
    for e in errors.iter().take(5) {
        println!("error: {e}");
    }
    let out = json!({
        "pods": total, "rate": a.rate, "seconds": elapsed.as_secs_f64(), "injected": l.len(), "errors": errors.len(),
        "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99), "max_ms": pct(1.0),
        "rss_before_kib": rss_before, "rss_loaded_kib": rss_loaded, "rss_after_kib": rss_after,
    });
    println!("{out}");
    if !errors.is_empty() {
        bail!("{} of {total} admissions were not injected", errors.len());
    }
    Ok(())
}
