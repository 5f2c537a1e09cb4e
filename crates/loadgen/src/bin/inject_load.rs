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
    let install = a.install.clone().unwrap_or_else(|| PathBuf::from(INSTALL));
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
    let work = tempfile::tempdir()?;
    let istiod = Istiod::start(&a, mesh_cm, work.path()).await?;
    let pid = istiod.discovery.pid().context("pilot-discovery's pid")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kib(pid);
    istiod.api.apply(injector_cm)?;
    istiod.wait_for_injection().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_loaded = rss_kib(pid);
    let run = istiod.load(a.rate, a.seconds).await?;
    let rss_after = rss_kib(pid);
    let metrics = istiod.discovery.get("/metrics", true).await?.1;
    report(&a, run, metrics, [rss_before, rss_loaded, rss_after])
}

/// pilot-discovery as istiod, on a fake API server with the install's `istio` ConfigMap, and an
/// HTTPS client of its injector that trusts the mesh root.
struct Istiod {
    api: FakeApiServer,
    discovery: Discovery,
    client: reqwest::Client,
    url: String,
}

/// What a run measured: each injected Pod's latency (sorted), the errors, the time it took.
struct Run {
    total: usize,
    latencies: Vec<Duration>,
    errors: Vec<String>,
    elapsed: Duration,
}

impl Istiod {
    async fn start(a: &Args, mesh_cm: Value, work: &std::path::Path) -> Result<Istiod> {
        let api = FakeApiServer::start().await?;
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
        api.apply(mesh_cm)?;
        let kubeconfig = work.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        let https = free_port();
        let binary = a.discovery_bin.clone().or_else(|| {
            let exe = std::env::current_exe().ok()?;
            let bin = exe.parent()?.join("pilot-discovery");
            bin.is_file().then_some(bin)
        });
        let root_dir = work.join("cacerts");
        std::fs::create_dir(work.join("config"))?;
        let discovery = Discovery::start(
            &work.join("config"),
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
        let root = std::fs::read(root_dir.join("root-cert.pem")).context("the mesh root in ROOT_CA_DIR")?;
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&root)?)
            .resolve("istiod.istio-system.svc", ([127, 0, 0, 1], https).into())
            .timeout(Duration::from_secs(30))
            .build()?;
        let url = format!("https://istiod.istio-system.svc:{https}/inject");
        Ok(Istiod {
            api,
            discovery,
            client,
            url,
        })
    }

    /// One AdmissionReview posted: the time to the answer, its status and body.
    async fn post(&self, body: Vec<u8>) -> Result<(Duration, u16, Value)> {
        post(self.client.clone(), self.url.clone(), body).await
    }

    /// Until `/inject` answers 200 (the ConfigMap read), at most 30 s.
    async fn wait_for_injection(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, status, _) = self.post(serde_json::to_vec(&review(0))?).await?;
            if status == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "/inject still answers {status} 30 s after the ConfigMap:\n{}",
                    self.discovery.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `rate` Pods a second for `seconds`, each its own request, not waiting for the answers.
    async fn load(&self, rate: f64, seconds: f64) -> Result<Run> {
        let total = (rate * seconds).round() as usize;
        let interval = Duration::from_secs_f64(1.0 / rate);
        let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        let start = Instant::now();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for i in 1..=total {
            ticker.tick().await;
            let body = serde_json::to_vec(&review(i))?;
            let request = post(self.client.clone(), self.url.clone(), body);
            let (latencies, errors) = (latencies.clone(), errors.clone());
            tasks.spawn(async move {
                let outcome = match request.await {
                    Ok((took, 200, answer))
                        if answer["response"]["allowed"] == true && answer["response"]["patchType"] == "JSONPatch" =>
                    {
                        Ok(took)
                    }
                    Ok((_, status, answer)) => Err(format!(
                        "{status}: {}",
                        answer.to_string().chars().take(300).collect::<String>()
                    )),
                    Err(e) => Err(format!("{e:#}")),
                };
                match outcome {
                    Ok(took) => latencies
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(took),
                    Err(e) => errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(e),
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let elapsed = start.elapsed();
        let mut latencies = latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        latencies.sort();
        let errors = errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Ok(Run {
            total,
            latencies,
            errors,
            elapsed,
        })
    }
}

async fn post(client: reqwest::Client, url: String, body: Vec<u8>) -> Result<(Duration, u16, Value)> {
    let t0 = Instant::now();
    let r = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap_or_default();
    Ok((t0.elapsed(), status, answer))
}

/// The figures, as lines and as one JSON object; an error when any admission was not injected.
fn report(a: &Args, run: Run, metrics: String, [rss_before, rss_loaded, rss_after]: [u64; 3]) -> Result<()> {
    let Run {
        total,
        latencies: l,
        errors,
        elapsed,
    } = run;
    let pct = |p: f64| -> f64 {
        if l.is_empty() {
            return f64::NAN;
        }
        let i = ((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    };
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
