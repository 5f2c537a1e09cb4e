//! The fake Consul against a client not written here (python-consul, Debian's `python3-consul`),
//! and its blocking queries, faults and index rules from plain HTTP.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{FakeConsul, Fault, Instance};

/// The script python-consul runs against the fake: register, list, read, a blocking query that
/// times out and one that a registration answers, deregister. Prints one JSON object.
const SCRIPT: &str = r#"
import json, sys, threading, time
import consul

host, port = sys.argv[1], int(sys.argv[2])
c = consul.Consul(host=host, port=port)
out = {}
out["register"] = c.catalog.register(
    "node-py", "10.0.0.7",
    service={"Service": "web", "ID": "web-py", "Tags": ["version|v3"], "Port": 8080,
             "Address": "10.0.0.8", "Meta": {"protocol": "http"}})
i1, services = c.catalog.services()
out["services"], out["i1"] = services, int(i1)
i2, nodes = c.catalog.service("web")
out["web"], out["i2"] = nodes, int(i2)

t = time.monotonic()
i3, _ = c.catalog.services(index=i1, wait="1s")
out["timeout"] = {"elapsed": time.monotonic() - t, "index": int(i3)}

def later():
    time.sleep(0.3)
    consul.Consul(host=host, port=port).catalog.register(
        "node-py2", "10.0.0.9", service={"Service": "web", "ID": "web-py2", "Port": 8080})
threading.Thread(target=later).start()
t = time.monotonic()
i4, nodes = c.catalog.service("web", index=i2, wait="30s")
out["change"] = {"elapsed": time.monotonic() - t, "index": int(i4),
                 "ids": sorted(n["ServiceID"] for n in nodes)}

out["deregister"] = c.catalog.deregister("node-py2", service_id="web-py2")
_, nodes = c.catalog.service("web")
out["after_deregister"] = sorted(n["ServiceID"] for n in nodes)
print(json.dumps(out))
"#;

/// A Python 3 that imports python-consul: Debian's `/usr/bin/python3` (package
/// `python3-consul`), else `python3` on the PATH.
fn python_with_consul() -> Result<PathBuf, String> {
    for python in ["/usr/bin/python3", "python3"] {
        let ok = std::process::Command::new(python)
            .args(["-c", "import consul"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(PathBuf::from(python));
        }
    }
    Err(
        "no Python 3 with python-consul (`import consul` fails for /usr/bin/python3 and python3): \
         install Debian's python3-consul (`apt-get install python3-consul`; scripts/test.sh does \
         so as root) or `pip install python-consul`"
            .into(),
    )
}

#[tokio::test]
async fn python_consul_registers_lists_and_blocks_on_the_fake() -> anyhow::Result<()> {
    let python = python_with_consul().map_err(anyhow::Error::msg)?;
    let consul = FakeConsul::start().await?;
    // registered from test code: python-consul must see it
    consul.register(Instance::new("db", "db-1", "node-rs", "10.0.1.1", 5432).tag("role|primary"));
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(consul.addr().ip().to_string())
            .arg(consul.addr().port().to_string())
            .env("NO_PROXY", "*")
            .output(),
    )
    .await??;
    anyhow::ensure!(
        out.status.success(),
        "python-consul script failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout)?;

    assert_eq!(got["register"], true);
    assert_eq!(got["services"]["web"], serde_json::json!(["version|v3"]));
    assert_eq!(got["services"]["db"], serde_json::json!(["role|primary"]));
    let web = &got["web"][0];
    assert_eq!(web["ServiceID"], "web-py");
    assert_eq!(web["Node"], "node-py");
    assert_eq!(web["Address"], "10.0.0.7");
    assert_eq!(web["ServiceAddress"], "10.0.0.8");
    assert_eq!(web["ServicePort"], 8080);
    assert_eq!(web["ServiceMeta"]["protocol"], "http");
    assert_eq!(web["Datacenter"], "dc1");

    let timeout = &got["timeout"];
    let elapsed = timeout["elapsed"].as_f64().unwrap_or_default();
    assert!((0.9..5.0).contains(&elapsed), "wait=1s answered after {elapsed}s");
    assert_eq!(timeout["index"], got["i1"], "nothing changed: the same index");

    let change = &got["change"];
    let elapsed = change["elapsed"].as_f64().unwrap_or_default();
    assert!(
        elapsed < 5.0,
        "the registration answered the blocking query after {elapsed}s"
    );
    assert!(change["index"].as_u64() > got["i2"].as_u64(), "{change}");
    assert_eq!(change["ids"], serde_json::json!(["web-py", "web-py2"]));

    assert_eq!(got["deregister"], true);
    assert_eq!(got["after_deregister"], serde_json::json!(["web-py"]));
    // and what python-consul registered is in the catalog the test reads
    let web = consul.instances("web");
    assert_eq!(web.len(), 1);
    assert_eq!(
        (web[0].address.as_str(), web[0].port, &web[0].tags),
        ("10.0.0.8", 8080, &vec!["version|v3".to_owned()])
    );
    Ok(())
}

/// The status, `X-Consul-Index` and body of an answer.
type Answer = (u16, Option<u64>, String);

/// GET `base` + `path`.
async fn get(base: &str, path: &str) -> anyhow::Result<Answer> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(format!("{base}{path}"))
        .send()
        .await?;
    let index = r
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok((r.status().as_u16(), index, r.text().await?))
}

/// A blocking query started now, answered later: (how long it took, its answer).
fn start_query(base: &str, path: String) -> tokio::task::JoinHandle<(Duration, anyhow::Result<Answer>)> {
    let base = base.to_owned();
    tokio::spawn(async move {
        let t = Instant::now();
        let r = get(&base, &path).await;
        (t.elapsed(), r)
    })
}

#[tokio::test]
async fn blocking_queries_answer_on_change_and_after_wait() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    let base = consul.url();
    consul.register(Instance::new("web", "web-1", "a", "10.0.0.1", 80));
    let (status, Some(index), body) = get(&base, "/v1/catalog/service/web").await? else {
        anyhow::bail!("no X-Consul-Index");
    };
    assert_eq!(status, 200);
    assert!(body.contains("\"ServiceID\":\"web-1\""), "{body}");

    // nothing changes: answered after `wait`, same index
    let t = Instant::now();
    let (_, same, _) = get(&base, &format!("/v1/catalog/service/web?index={index}&wait=300ms")).await?;
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
    assert_eq!(same, Some(index));

    // another service's write does not answer a query on web; web's own does, at once
    let blocked = start_query(&base, format!("/v1/catalog/service/web?index={index}&wait=10s"));
    let list = start_query(&base, format!("/v1/catalog/services?index={index}&wait=10s"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    consul.register(Instance::new("db", "db-1", "b", "10.0.0.2", 5432));
    let (elapsed, r) = list.await?;
    let (_, list_index, list_body) = r?;
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(list_index > Some(index) && list_body.contains("\"db\""), "{list_body}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!blocked.is_finished(), "a write to db answered a query on web");
    let t = Instant::now();
    assert!(consul.deregister("a", "web-1"));
    let (_, r) = blocked.await?;
    let (_, web_index, web_body) = r?;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(web_index > list_index, "{web_index:?} {list_index:?}");
    assert_eq!(web_body, "[]");
    // the deregistered service keeps its own index, not the table's
    let (_, kept, _) = get(&base, "/v1/catalog/service/web").await?;
    assert_eq!(kept, web_index);
    let reqs = consul.requests();
    assert!(
        reqs.iter()
            .any(|r| r == &format!("GET /v1/catalog/services?index={index}&wait=10s")),
        "{reqs:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_rewind_answers_blocked_queries_with_a_lower_index() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    let base = consul.url();
    for i in 0..5 {
        consul.register(Instance::new("web", &format!("web-{i}"), "a", "10.0.0.1", 80 + i));
    }
    let (_, Some(index), _) = get(&base, "/v1/catalog/services").await? else {
        anyhow::bail!("no index");
    };
    let blocked = start_query(&base, format!("/v1/catalog/services?index={index}&wait=10s"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    consul.rewind(3);
    let (elapsed, r) = blocked.await?;
    let (_, got, _) = r?;
    assert!(elapsed < Duration::from_secs(5));
    assert_eq!(got, Some(3), "the index went backwards");
    Ok(())
}

#[tokio::test]
async fn faults_answer_what_no_consul_should() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    let base = consul.url();
    consul.register(Instance::new("web", "web-1", "a", "10.0.0.1", 80));
    let path = "/v1/catalog/service/web";
    consul.fault(path, Fault::Malformed);
    let (status, _, body) = get(&base, path).await?;
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).is_err(), "{body}");
    consul.fault(path, Fault::Huge(3 << 20));
    assert_eq!(get(&base, path).await?.2.len(), 3 << 20);
    consul.fault(path, Fault::Status(500));
    assert_eq!(get(&base, path).await?.0, 500);
    consul.fault(path, Fault::Index("x".into()));
    assert_eq!(get(&base, path).await?.1, None);
    consul.fault(path, Fault::Slow(Duration::from_millis(300)));
    let t = Instant::now();
    assert_eq!(get(&base, path).await?.0, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    // other paths are not touched; clearing ends the faults
    assert_eq!(get(&base, "/v1/catalog/services").await?.0, 200);
    consul.clear_faults();
    assert!(get(&base, path).await?.2.contains("web-1"));
    Ok(())
}

#[tokio::test]
async fn register_and_deregister_over_http_as_consuls_api() -> anyhow::Result<()> {
    let consul = FakeConsul::start().await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let put = |path: &str, body: Value| client.put(format!("{}{path}", consul.url())).json(&body).send();
    let r = put(
        "/v1/catalog/register",
        serde_json::json!({"Node": "n1", "Address": "10.0.0.1", "Datacenter": "east",
            "Service": {"Service": "api", "Port": 9000, "Tags": ["version|v1"]}}),
    )
    .await?;
    assert_eq!(r.status(), 200);
    let api = consul.instances("api");
    assert_eq!(api.len(), 1);
    assert_eq!(
        (api[0].id.as_str(), api[0].datacenter.as_str()),
        ("api", "east"),
        "ID defaults to the name"
    );
    // lower-case names, as python-consul sends them
    let r = put(
        "/v1/catalog/register",
        serde_json::json!({"node": "n2", "address": "10.0.0.2", "service": {"service": "api", "id": "api-2", "port": 9001}}),
    )
    .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(consul.instances("api").len(), 2);
    let bad = put("/v1/catalog/register", serde_json::json!({"Address": "10.0.0.3"})).await?;
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await?.contains("Must provide node"));
    let r = put(
        "/v1/catalog/deregister",
        serde_json::json!({"Node": "n2", "ServiceID": "api-2"}),
    )
    .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(consul.instances("api").len(), 1);
    // a node without a service ID: the node and all it runs
    put("/v1/catalog/deregister", serde_json::json!({"Node": "n1"})).await?;
    assert!(consul.instances("api").is_empty());
    let (_, _, list) = get(&consul.url(), "/v1/catalog/services").await?;
    assert_eq!(list, "{}");
    Ok(())
}

#[test]
fn go_durations() {
    use super::catalog::parse_go_duration as d;
    assert_eq!(d("10s"), Some(Duration::from_secs(10)));
    assert_eq!(d("1500ms"), Some(Duration::from_millis(1500)));
    assert_eq!(d("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(d("0.5s"), Some(Duration::from_millis(500)));
    assert_eq!(d("5"), None);
    assert_eq!(d(""), None);
    assert_eq!(d("1x"), None);
}
