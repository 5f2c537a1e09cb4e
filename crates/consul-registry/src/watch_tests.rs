//! The watcher against test-support's fake Consul: changes arrive as soon as the blocking query
//! answers; malformed, huge and slow answers, HTTP errors and an index that goes backwards are
//! named, counted and retried while the services already read stay served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use registry::{RegistryDiff, ServiceRegistry};
use test_support::consul::{FakeConsul, Fault, Instance};
use tokio::sync::mpsc;

use crate::{Client, ClientOptions, ConsulMetrics, ConsulRegistry, WatchOptions};

const WEB: &str = "web.service.consul";

struct Harness {
    consul: FakeConsul,
    registry: Arc<ConsulRegistry>,
    metrics: ConsulMetrics,
    diffs: mpsc::UnboundedReceiver<RegistryDiff>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Short timeouts and backoffs; a `wait` far longer than any test step, so that a change that
/// arrives quickly arrived through a blocking query answering at once.
fn options() -> (ClientOptions, WatchOptions) {
    let client = ClientOptions {
        request_timeout: Duration::from_millis(500),
        max_body_bytes: 64 << 10,
    };
    let watch = WatchOptions {
        wait: Duration::from_secs(30),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        burst: 100,
        refill: Duration::from_millis(10),
        concurrency: 4,
    };
    (client, watch)
}

async fn start(consul: FakeConsul) -> anyhow::Result<Harness> {
    let (client_options, watch_options) = options();
    let client = Client::new(&consul.url(), client_options)?;
    let registry = Arc::new(ConsulRegistry::new("cluster.local"));
    let metrics = ConsulMetrics::default();
    let (tx, diffs) = mpsc::unbounded_channel();
    let (task, mut synced) = crate::spawn(registry.clone(), client, watch_options, metrics.clone(), tx);
    tokio::time::timeout(Duration::from_secs(5), synced.wait_for(|s| *s)).await??;
    Ok(Harness {
        consul,
        registry,
        metrics,
        diffs,
        task,
    })
}

impl Harness {
    /// The next change, within `within`.
    async fn diff(&mut self, within: Duration) -> anyhow::Result<RegistryDiff> {
        let d = tokio::time::timeout(within, self.diffs.recv()).await;
        let d =
            d.map_err(|_| anyhow::anyhow!("no change within {within:?}; requests: {:?}", self.consul.requests()))?;
        d.ok_or_else(|| anyhow::anyhow!("the watcher stopped"))
    }

    /// `address:port` of each endpoint of `host`.
    fn endpoints(&self, host: &str) -> Vec<String> {
        let snap = self.registry.snapshot();
        let key = model::ServiceKey::new(host, "default");
        snap.endpoints_of(&key)
            .iter()
            .map(|e| format!("{}:{}", e.address, e.endpoint_port))
            .collect()
    }

    /// Polls until the metric counts at least one error of `kind`.
    async fn counted(&self, kind: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.metrics.errors(kind) == 0 {
            anyhow::ensure!(Instant::now() < deadline, "no {kind} error counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

fn web(id: &str, ip: &str) -> Instance {
    Instance::new("web", id, id, ip, 8080)
        .meta("protocol", "http")
        .tag("app|web")
}

#[tokio::test]
async fn registrations_arrive_through_blocking_queries_at_once() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    let mut h = start(consul).await?;
    let first = h.diff(Duration::from_secs(1)).await?;
    assert!(first.services_changed.iter().any(|k| k.hostname == WEB), "{first:?}");
    assert_eq!(h.endpoints(WEB), ["10.0.0.1:8080"]);

    // a second instance: endpoints only (no full push), well within a second
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    h.consul.register(web("web-2", "10.0.0.2"));
    let d = h.diff(Duration::from_secs(1)).await?;
    let took = t.elapsed();
    assert!(!d.needs_full_push(), "{d:?}");
    assert_eq!(d.endpoints_changed.len(), 1);
    assert_eq!(h.endpoints(WEB), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert!(took < Duration::from_secs(1), "{took:?}");

    // the last instance gone: the service goes
    assert!(h.consul.deregister("web-1", "web-1"));
    h.diff(Duration::from_secs(1)).await?;
    assert!(h.consul.deregister("web-2", "web-2"));
    let d = h.diff(Duration::from_secs(1)).await?;
    assert!(d.needs_full_push());
    assert!(h.registry.snapshot().service(WEB, "default").is_none());

    let reqs = h.consul.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("GET /v1/catalog/services?index=") && r.ends_with("&wait=30s")),
        "blocking queries: {reqs:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_first_answer_with_index_zero_is_waited_on_as_one() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    consul.fault("/v1/catalog/services", Fault::Index("0".into()));
    let h = start(consul).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists = h
        .consul
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /v1/catalog/services"))
        .cloned()
        .collect::<Vec<_>>();
    assert!(lists.len() <= 3, "a busy loop: {lists:?}");
    assert!(lists.iter().any(|r| r.contains("index=1&")), "{lists:?}");
    Ok(())
}

#[tokio::test]
async fn an_index_that_goes_backwards_starts_again() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    for i in 1..=4 {
        consul.register(web(&format!("web-{i}"), &format!("10.0.0.{i}")));
    }
    let mut h = start(consul).await?;
    h.diff(Duration::from_secs(1)).await?;
    // a restore of an older snapshot (while the watcher's query blocks): lower index, then a
    // change after it
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.consul.rewind(3);
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.consul.register(web("web-9", "10.0.0.9"));
    h.diff(Duration::from_secs(2)).await?;
    assert!(h.endpoints(WEB).contains(&"10.0.0.9:8080".to_owned()));
    let reqs = h.consul.requests();
    let i = reqs
        .iter()
        .rposition(|r| r == "GET /v1/catalog/services")
        .ok_or_else(|| anyhow::anyhow!("no query with index 0 after the rewind: {reqs:?}"))?;
    assert!(i > 0, "{reqs:?}");
    Ok(())
}

/// For each bad answer of a service's read: the error is counted with its type, the service
/// keeps what it had, and once Consul answers well again the change lands.
#[tokio::test]
async fn malformed_huge_slow_and_failed_reads_keep_what_was_served() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    consul.register(Instance::new("db", "db-1", "db-1", "10.0.1.1", 5432));
    let mut h = start(consul).await?;
    h.diff(Duration::from_secs(1)).await?;
    let faults = [
        (Fault::Malformed, "malformed"),
        (Fault::Huge(1 << 20), "too_large"),
        (Fault::Slow(Duration::from_secs(3)), "timeout"),
        (Fault::Status(500), "status"),
        (Fault::Index("soon".into()), "malformed"),
    ];
    for (n, (fault, kind)) in faults.into_iter().enumerate() {
        let before = h.metrics.errors(kind);
        h.consul.fault("/v1/catalog/service/web", fault.clone());
        let ip = format!("10.0.2.{n}");
        h.consul.register(web(&format!("new-{n}"), &ip));
        h.consul
            .register(Instance::new("db", "db-1", "db-1", &format!("10.0.3.{n}"), 5432));
        // db's change lands; web's read fails and web stays as it was
        let d = h.diff(Duration::from_secs(5)).await?;
        assert!(
            d.endpoints_changed.iter().all(|k| k.hostname != WEB),
            "{fault:?}: {d:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.metrics.errors(kind) == before {
            anyhow::ensure!(Instant::now() < deadline, "{fault:?}: no {kind} error counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!h.endpoints(WEB).contains(&format!("{ip}:8080")), "{fault:?}");
        assert!(h.endpoints(WEB).contains(&"10.0.0.1:8080".to_owned()), "{fault:?}");
        h.consul.clear_faults();
        let d = h.diff(Duration::from_secs(5)).await?;
        assert!(
            d.endpoints_changed.iter().any(|k| k.hostname == WEB),
            "{fault:?}: {d:?}"
        );
        assert!(h.endpoints(WEB).contains(&format!("{ip}:8080")), "{fault:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_failing_list_keeps_every_service_and_recovers() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    let mut h = start(consul).await?;
    h.diff(Duration::from_secs(1)).await?;
    h.consul.fault("/v1/catalog/services", Fault::Malformed);
    h.consul.register(web("web-2", "10.0.0.2"));
    h.counted("malformed").await?;
    assert_eq!(h.endpoints(WEB), ["10.0.0.1:8080"]);
    h.consul.clear_faults();
    h.diff(Duration::from_secs(2)).await?;
    assert_eq!(h.endpoints(WEB), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_consul_is_counted_and_retried() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    let url = consul.url();
    drop(consul);
    let (client_options, watch_options) = options();
    let client = Client::new(&url, client_options)?;
    let registry = Arc::new(ConsulRegistry::new("cluster.local"));
    let metrics = ConsulMetrics::default();
    let (tx, _rx) = mpsc::unbounded_channel();
    let (task, synced) = crate::spawn(registry, client, watch_options, metrics.clone(), tx);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let n = metrics.errors("unreachable");
    task.abort();
    assert!((2..20).contains(&n), "retried with backoff: {n} attempts in 400ms");
    assert!(!*synced.borrow());
    Ok(())
}

#[tokio::test]
async fn instances_that_cannot_be_served_are_counted_once_and_left_out() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    let mut bad = web("web-dns", "10.0.0.2");
    bad.address = "web.internal".into();
    consul.register(bad);
    let mut h = start(consul).await?;
    h.diff(Duration::from_secs(1)).await?;
    assert_eq!(h.endpoints(WEB), ["10.0.0.1:8080"]);
    assert_eq!(h.metrics.errors("invalid_instance"), 1);
    h.consul.register(web("web-3", "10.0.0.3"));
    h.diff(Duration::from_secs(1)).await?;
    assert_eq!(h.metrics.errors("invalid_instance"), 1, "reported when new only");
    Ok(())
}

#[tokio::test]
async fn errors_name_the_url_of_the_service() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1"));
    let (client_options, _) = options();
    let client = Client::new(&consul.url(), client_options)?;
    let q = crate::client::Query {
        index: 0,
        wait: Duration::ZERO,
    };
    let url = format!("{}/v1/catalog/service/web", consul.url());
    for (fault, says) in [
        (Fault::Malformed, "not valid JSON"),
        (Fault::Huge(1 << 20), "larger than 65536 bytes"),
        (Fault::Slow(Duration::from_secs(2)), "no complete answer within 500ms"),
        (Fault::Status(403), "HTTP 403: rpc error"),
    ] {
        consul.fault("/v1/catalog/service/web", fault);
        let e = client
            .service("web", q)
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("no error"))?;
        let msg = e.to_string();
        assert!(msg.contains(&url) && msg.contains(says), "{msg}");
    }
    Ok(())
}

#[tokio::test]
async fn a_consul_workload_takes_its_tags_as_labels() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    consul.register(web("web-1", "10.0.0.1").tag("version|v1"));
    let h = start(consul).await?;
    let w = h
        .registry
        .workload("10.0.0.1", "10.0.0.1.service.consul", "default")
        .ok_or_else(|| anyhow::anyhow!("no workload"))?;
    assert_eq!(w.labels.get("version").map(String::as_str), Some("v1"));
    assert_eq!(w.locality, "dc1");
    assert!(
        h.registry
            .workload("10.0.0.1", "gw.istio-system", "istio-system")
            .is_none(),
        "a proxy that is no Consul workload keeps its own labels"
    );
    Ok(())
}
