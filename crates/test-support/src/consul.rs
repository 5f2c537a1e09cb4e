//! A fake Consul agent for tests: the catalog part of Consul's HTTP API on loopback, so that
//! pilot-discovery's Consul registry and a real Consul client (python-consul) both talk to it.
//!
//! It serves `GET /v1/catalog/services` and `GET /v1/catalog/service/<name>` as blocking queries
//! (`index` and `wait`: an answer as soon as the index of what was asked moves past `index`, or
//! when `wait` passes, Consul's default 5 minutes and at most 10; `X-Consul-Index` on every
//! answer), and `PUT /v1/catalog/register` and `PUT /v1/catalog/deregister` with Consul's
//! bodies (field names matched case-insensitively, as Consul's Go decoding does). Tests register
//! and deregister from code ([`FakeConsul::register`], [`FakeConsul::deregister`]), move the
//! index back as a restored snapshot would ([`FakeConsul::rewind`]), and make a path answer what
//! no Consul should ([`FakeConsul::fault`]: malformed JSON, a huge body, a slow answer, an HTTP
//! error).

mod catalog;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use catalog::Instance;
use catalog::{Catalog, field, instance_from_register, parse_go_duration};

use crate::kube_api::lock;

/// What a path answers instead of the catalog, until [`FakeConsul::clear_faults`].
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a body of this many bytes (the start of a JSON array that goes on).
    Huge(usize),
    /// The answer, this much later.
    Slow(Duration),
    /// This status, with a body of Consul's style (`rpc error ...`).
    Status(u16),
    /// 200 with this `X-Consul-Index` header; a number is also the index blocking queries
    /// compare with (a Consul whose index of that query is stuck at it).
    Index(String),
}

struct Shared {
    catalog: Mutex<Catalog>,
    /// The last write's index, for blocking queries to wait on.
    written: watch::Sender<u64>,
    /// By exact path.
    faults: Mutex<HashMap<String, Fault>>,
    /// `METHOD path?query` of every request.
    requests: Mutex<Vec<String>>,
}

/// A running fake Consul on `127.0.0.1:<port>`; stops when dropped.
pub struct FakeConsul {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FakeConsul {
    pub async fn start() -> anyhow::Result<FakeConsul> {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let catalog = Catalog::default();
        let shared = Arc::new(Shared {
            written: watch::Sender::new(catalog.index),
            catalog: Mutex::new(catalog),
            faults: Mutex::default(),
            requests: Mutex::default(),
        });
        let app = axum::Router::new()
            .route("/v1/catalog/services", get(services))
            .route("/v1/catalog/service/{name}", get(service))
            .route("/v1/catalog/register", put(register))
            .route("/v1/catalog/deregister", put(deregister))
            .fallback(|| async { (StatusCode::NOT_FOUND, "fake Consul: not served") })
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeConsul { shared, addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, what `--consulserverURL` takes.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Registers (or replaces) an instance and its node, as `PUT /v1/catalog/register` does.
    pub fn register(&self, instance: Instance) {
        self.write(|c| {
            c.register(instance);
            true
        });
    }

    /// Removes the instance `id` of `node`, as `PUT /v1/catalog/deregister` does; false when
    /// there is none.
    pub fn deregister(&self, node: &str, id: &str) -> bool {
        self.write(|c| c.deregister(node, Some(id)))
    }

    /// The instances of a service, as registered.
    pub fn instances(&self, service: &str) -> Vec<Instance> {
        lock(&self.shared.catalog).instances(service)
    }

    /// The last write's index.
    pub fn index(&self) -> u64 {
        lock(&self.shared.catalog).index
    }

    /// Every index back to at most `index`, as after restoring an older Raft snapshot; blocked
    /// queries answer.
    pub fn rewind(&self, index: u64) {
        self.write(|c| {
            c.rewind(index);
            true
        });
    }

    /// `path` (e.g. `/v1/catalog/service/web`) answers `fault` from now on.
    pub fn fault(&self, path: &str, fault: Fault) {
        lock(&self.shared.faults).insert(path.to_owned(), fault);
    }

    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.requests).clone()
    }

    fn write(&self, f: impl FnOnce(&mut Catalog) -> bool) -> bool {
        write(&self.shared, f)
    }
}

impl Drop for FakeConsul {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn write(shared: &Shared, f: impl FnOnce(&mut Catalog) -> bool) -> bool {
    let mut c = lock(&shared.catalog);
    let changed = f(&mut c);
    let index = c.index;
    drop(c);
    // wakes every blocked query, which looks at its own index again
    shared.written.send_replace(index);
    changed
}

type Params = Query<HashMap<String, String>>;

async fn services(State(shared): State<Arc<Shared>>, uri: Uri, Query(params): Params) -> Response {
    blocking(&shared, &uri, &params, |c| c.services()).await
}

async fn service(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Path(name): Path<String>,
    Query(params): Params,
) -> Response {
    blocking(&shared, &uri, &params, move |c| c.service(&name)).await
}

/// Answers `read` at once, or, with `index` > 0, once its index is past `index` or `wait` passed.
async fn blocking(
    shared: &Shared,
    uri: &Uri,
    params: &HashMap<String, String>,
    read: impl Fn(&Catalog) -> (u64, Value),
) -> Response {
    record(shared, "GET", uri);
    let min_index: u64 = match params.get("index").map(|i| i.parse()) {
        None => 0,
        Some(Ok(i)) => i,
        Some(Err(_)) => return (StatusCode::BAD_REQUEST, "Invalid index").into_response(),
    };
    let wait = match params.get("wait").map(|w| parse_go_duration(w)) {
        None => Duration::from_secs(300),
        Some(Some(w)) => w.min(Duration::from_secs(600)),
        Some(None) => return (StatusCode::BAD_REQUEST, "Invalid wait time").into_response(),
    };
    let fault = lock(&shared.faults).get(uri.path()).cloned();
    // a numeric `Fault::Index` is the index of what was asked, for blocking too
    let forced = match &fault {
        Some(Fault::Index(i)) => i.parse::<u64>().ok(),
        _ => None,
    };
    let mut written = shared.written.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    let rewinds = lock(&shared.catalog).rewinds;
    let (index, body) = loop {
        let (index, body, rewound) = {
            let c = lock(&shared.catalog);
            let (index, body) = read(&c);
            (forced.unwrap_or(index), body, c.rewinds != rewinds)
        };
        if min_index == 0 || index > min_index || rewound {
            break (index, body);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                let (index, body) = read(&lock(&shared.catalog));
                break (forced.unwrap_or(index), body);
            }
            changed = written.changed() => if changed.is_err() { break (index, body) },
        }
    };
    answer(index, body, fault).await
}

async fn answer(index: u64, body: Value, fault: Option<Fault>) -> Response {
    let mut index = HeaderValue::from(index);
    let (status, body) = match fault {
        None => (StatusCode::OK, Bytes::from(body.to_string())),
        Some(Fault::Malformed) => (StatusCode::OK, Bytes::from_static(b"{\"web\": [\"version|v1\"")),
        Some(Fault::Huge(n)) => {
            let mut b = vec![b' '; n];
            b[0] = b'[';
            (StatusCode::OK, Bytes::from(b))
        }
        Some(Fault::Slow(d)) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, Bytes::from(body.to_string()))
        }
        Some(Fault::Status(code)) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Bytes::from_static(b"rpc error making call: No cluster leader"),
        ),
        Some(Fault::Index(v)) => {
            index = HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("x"));
            (StatusCode::OK, Bytes::from(body.to_string()))
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-consul-index", index);
    headers.insert("x-consul-knownleader", HeaderValue::from_static("true"));
    headers.insert("x-consul-lastcontact", HeaderValue::from_static("0"));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    (status, headers, body).into_response()
}

async fn register(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    record(&shared, "PUT", &uri);
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("Request decode failed: {e}")).into_response(),
    };
    match instance_from_register(&parsed) {
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
        // a node without a service: nothing this fake keeps
        Ok(None) => "true".into_response(),
        Ok(Some(instance)) => {
            write(&shared, |c| {
                c.register(instance);
                true
            });
            "true".into_response()
        }
    }
}

async fn deregister(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    record(&shared, "PUT", &uri);
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("Request decode failed: {e}")).into_response(),
    };
    let Some(node) = field(&parsed, "Node").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "Must provide node").into_response();
    };
    let id = field(&parsed, "ServiceID")
        .and_then(Value::as_str)
        .filter(|i| !i.is_empty());
    write(&shared, |c| c.deregister(node, id));
    "true".into_response()
}

fn record(shared: &Shared, method: &str, uri: &Uri) {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or(uri.path());
    lock(&shared.requests).push(format!("{method} {path}"));
}
