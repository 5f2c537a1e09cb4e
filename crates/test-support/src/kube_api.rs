//! A fake Kubernetes API server for tests: the real protocol over plain HTTP on loopback, so that
//! kube-rs (pilot-discovery) and `kubectl` (client-go) both talk to it unchanged.
//!
//! It serves discovery (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`, `/version`), and
//! for the resource types in [`resources::RESOURCES`]: list with `resourceVersion`,
//! `labelSelector`, `fieldSelector` and `limit`/`continue` paging; watch streams of
//! ADDED/MODIFIED/DELETED events with BOOKMARKs (`allowWatchBookmarks`), the streaming initial
//! list (`sendInitialEvents`), `timeoutSeconds`, and 410 Gone (an ERROR event on a watch, a
//! `Status` on a list) for a resourceVersion older than the history kept; get, create, replace,
//! merge patch and delete, with mutating admission of creates (MutatingWebhookConfigurations'
//! webhooks, their JSON patches applied; `mutating.rs`) and then validating admission
//! (ValidatingWebhookConfigurations' webhooks called over HTTPS as a cluster calls them,
//! `dryRun=All`; `admission.rs`), and server-side apply with field managers and their conflicts
//! (`apply.rs`; coordination.k8s.io Leases are applied so by leader election). A test changes
//! objects through the API or directly
//! ([`FakeApiServer::apply`]), expires the history ([`FakeApiServer::compact`]), drops every open
//! watch ([`FakeApiServer::drop_watches`]), uninstalls CRD groups
//! ([`FakeApiServer::uninstall_group`]) and restricts a bearer token to a ClusterRole and Roles, as
//! RBAC does ([`FakeApiServer::bind_cluster_role`], [`FakeApiServer::bind_role`]). To test a client against what no API server
//! should send, a test applies objects that do not decode as their kind (the store takes any
//! JSON object with a name, as etcd behind a lax CRD schema would) and sends raw lines on open
//! watches ([`FakeApiServer::send_raw`]: a truncated event, an event of an unknown type, a line
//! that never ends).

mod admission;
mod apply;
mod http;
mod https;
mod mutating;
mod rbac;
pub mod resources;
pub mod selector;
mod store;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

pub use store::ApiError;
use store::{Event, Store};

/// What a watch sends that no API server should ([`FakeApiServer::send_raw`]).
#[derive(Debug, Clone)]
pub enum RawWatch {
    /// This text and a newline: a truncated JSON event, an event of an unknown type...
    Line(String),
    /// The start of an ADDED event whose object's name never ends: `bytes` bytes in all, sent
    /// in 64 KiB chunks, without a newline (what follows on the watch is part of that line).
    Endless { bytes: usize },
}

pub(crate) struct Shared {
    store: Mutex<Store>,
    events: broadcast::Sender<Arc<Event>>,
    /// Raw watch lines, by resource type (index into `RESOURCES`).
    raw: broadcast::Sender<(usize, RawWatch)>,
    drops: watch::Sender<u64>,
    /// (bearer token, `METHOD path?query`) of every request.
    requests: Mutex<Vec<(String, String)>>,
    /// (bearer token, `METHOD path/name`) of every write that is not a dry run.
    writes: Mutex<Vec<(String, String)>>,
    addr: SocketAddr,
    bookmark_interval: Duration,
    /// TokenReview answers: token → (username, audiences).
    tokens: Mutex<std::collections::BTreeMap<String, (String, Vec<String>)>>,
    /// Bearer tokens restricted to a ClusterRole's rules.
    roles: Mutex<std::collections::BTreeMap<String, Vec<rbac::Rule>>>,
    /// The Roles bound to those tokens: (namespace, rules) each.
    namespace_roles: Mutex<std::collections::BTreeMap<String, Vec<rbac::NamespaceRole>>>,
    /// Bearer tokens restricted to what the stored bindings grant a service account
    /// (namespace, name).
    by_bindings: Mutex<std::collections::BTreeMap<String, (String, String)>>,
    /// Requests refused by those roles, as `METHOD path?query (verb resource.group)`.
    forbidden: Mutex<Vec<String>>,
    /// Where webhooks' `clientConfig.service` (name, namespace) are called.
    services: Mutex<std::collections::BTreeMap<(String, String), SocketAddr>>,
}

impl Shared {
    /// RFC 3339 UTC, seconds.
    fn now(&self) -> String {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Options of a [`FakeApiServer`].
#[derive(Debug, Clone)]
pub struct FakeApiOptions {
    /// How often watches that allow them get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// The address listened on (a random port).
    pub ip: std::net::IpAddr,
    /// HTTPS, as a cluster's API server, with a certificate for `ip` and `kubernetes.default.svc`
    /// from a CA of its own ([`FakeApiServer::ca_pem`]); plain HTTP otherwise.
    pub tls: bool,
}

impl Default for FakeApiOptions {
    fn default() -> Self {
        FakeApiOptions {
            bookmark_interval: Duration::from_millis(500),
            ip: std::net::Ipv4Addr::LOCALHOST.into(),
            tls: false,
        }
    }
}

/// A running fake API server on `127.0.0.1:<port>` (or [`FakeApiOptions::ip`]); stops when
/// dropped.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    /// The CA of its serving certificate, PEM, when it serves HTTPS.
    ca_pem: Option<String>,
}

impl FakeApiServer {
    pub async fn start() -> anyhow::Result<FakeApiServer> {
        FakeApiServer::start_with(FakeApiOptions::default()).await
    }

    pub async fn start_with(opts: FakeApiOptions) -> anyhow::Result<FakeApiServer> {
        let listener = tokio::net::TcpListener::bind((opts.ip, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::default(),
            events: broadcast::channel(65_536).0,
            raw: broadcast::channel(64).0,
            drops: watch::Sender::new(0),
            requests: Mutex::default(),
            writes: Mutex::default(),
            addr,
            bookmark_interval: opts.bookmark_interval,
            tokens: Mutex::default(),
            by_bindings: Mutex::default(),
            roles: Mutex::default(),
            namespace_roles: Mutex::default(),
            forbidden: Mutex::default(),
            services: Mutex::default(),
        });
        let app = axum::Router::new().fallback(http::handle).with_state(shared.clone());
        if opts.tls {
            let ca = crate::tls::TestCa::new("fake-kubernetes-ca")?;
            let ip = opts.ip.to_string();
            let cert = ca.issue_server(&["kubernetes.default.svc", "kubernetes", &ip, "127.0.0.1"])?;
            let acceptor = https::acceptor(&cert)?;
            let task = tokio::spawn(https::serve(listener, acceptor, app));
            return Ok(FakeApiServer {
                shared,
                task,
                ca_pem: Some(ca.cert_pem()),
            });
        }
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeApiServer {
            shared,
            task,
            ca_pem: None,
        })
    }

    /// Makes TokenReviews of `token` authenticate `username` (`system:serviceaccount:<ns>:<sa>`)
    /// for `audiences`, as the API server does for a projected service account token.
    pub fn add_token(&self, token: &str, username: &str, audiences: &[&str]) {
        lock(&self.shared.tokens).insert(
            token.to_owned(),
            (username.to_owned(), audiences.iter().map(|a| (*a).to_owned()).collect()),
        );
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A service account token as the API server's TokenRequest issues it for a Pod's projected
    /// `serviceAccountToken` volume: a JWT (unsigned here) with Kubernetes' claims (`sub`
    /// `system:serviceaccount:<ns>:<sa>`, `aud`, `exp`, `kubernetes.io` pod and service account)
    /// that TokenReviews then authenticate for `audiences` ([`add_token`](Self::add_token)).
    pub fn issue_token(&self, namespace: &str, service_account: &str, pod: &str, audiences: &[&str]) -> String {
        use base64::Engine;
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let username = format!("system:serviceaccount:{namespace}:{service_account}");
        let claims = serde_json::json!({
            "iss": "https://kubernetes.default.svc.cluster.local",
            "sub": username,
            "aud": audiences,
            "iat": now,
            "nbf": now,
            "exp": now + 43_200,
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod},
                "serviceaccount": {"name": service_account},
            },
        });
        let token = format!(
            "{}.{}.{}",
            b64(serde_json::json!({"alg": "RS256", "kid": "fake-kubernetes"})),
            b64(claims),
            b64(Value::from(format!("{pod}/{}", audiences.join(","))))
        );
        self.add_token(&token, &username, audiences);
        token
    }

    /// The stored object of `kind` (`api_version` names its group) `namespace/name` (`namespace`
    /// empty for a cluster-scoped kind), as a GET would answer.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let rt = resources::of_kind(api_version, kind)?;
        let obj = lock(&self.shared.store).get(store::res_index(rt), namespace, name)?;
        Some(Value::clone(&obj))
    }

    /// `http://127.0.0.1:<port>` (`https://` when it serves HTTPS).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The CA that signed its serving certificate, PEM (`ca.crt` of a service account), when it
    /// serves HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// Writes a kubeconfig for this server (context `fake`, namespace `default`) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        self.write_kubeconfig_with_token(path, "fake-token")
    }

    /// [`write_kubeconfig`](Self::write_kubeconfig) whose user presents `token`.
    pub fn write_kubeconfig_with_token(&self, path: &Path, token: &str) -> anyhow::Result<()> {
        let ca = match &self.ca_pem {
            Some(pem) => {
                use base64::Engine;
                format!(
                    "    certificate-authority-data: {}\n",
                    base64::engine::general_purpose::STANDARD.encode(pem)
                )
            }
            None => String::new(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n{ca}\
             users:\n- name: fake\n  user:\n    token: {token}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n",
            self.url()
        );
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Restricts requests bearing `token` to what the ClusterRole `cluster_role` (YAML) allows,
    /// as RBAC does for a service account bound to it: others get 403 Forbidden.
    pub fn bind_cluster_role(&self, token: &str, cluster_role: &str) -> anyhow::Result<()> {
        let rules = rbac::cluster_role_rules(cluster_role)?;
        lock(&self.shared.roles).insert(token.to_owned(), rules);
        Ok(())
    }

    /// Also allows requests bearing `token` what the Role `role` (YAML, with its
    /// `metadata.namespace`) allows in its namespace, as a RoleBinding does; restricts the token
    /// as [`bind_cluster_role`](Self::bind_cluster_role) does.
    pub fn bind_role(&self, token: &str, role: &str) -> anyhow::Result<()> {
        let (namespace, rules) = rbac::namespaced_role_rules(role)?;
        lock(&self.shared.namespace_roles)
            .entry(token.to_owned())
            .or_default()
            .push((namespace, rules));
        Ok(())
    }

    /// Restricts requests bearing `token` to what RBAC grants the service account
    /// `namespace/name` through the ClusterRoleBindings and RoleBindings stored in this server
    /// (applied like any object, e.g. an install's manifests with `kubectl apply`), read at each
    /// request; the token also authenticates as that service account in TokenReviews.
    pub fn authorize_by_bindings(&self, token: &str, namespace: &str, name: &str) {
        self.add_token(token, &format!("system:serviceaccount:{namespace}:{name}"), &[]);
        lock(&self.shared.by_bindings).insert(token.to_owned(), (namespace.to_owned(), name.to_owned()));
    }

    /// The requests refused by [`bind_cluster_role`](Self::bind_cluster_role),
    /// [`bind_role`](Self::bind_role) and [`authorize_by_bindings`](Self::authorize_by_bindings)
    /// so far.
    pub fn forbidden(&self) -> Vec<String> {
        lock(&self.shared.forbidden).clone()
    }

    /// Creates `obj`, or replaces the object of its kind, namespace and name; returns it as stored.
    pub fn apply(&self, obj: Value) -> anyhow::Result<Value> {
        let (rt, ns, name) = identify(&obj)?;
        let now = self.shared.now();
        let mut store = lock(&self.shared.store);
        let done = if store.get(store::res_index(rt), &ns, &name).is_some() {
            let mut obj = obj;
            if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                md.remove("resourceVersion");
            }
            store.replace(rt, &ns, &name, obj)
        } else {
            store.create(rt, &ns, obj, &now)
        };
        let (stored, event) = done.map_err(|e| anyhow!("{}", e.message))?;
        let _ = self.shared.events.send(event);
        Ok(stored)
    }

    /// Sends `raw` on every open watch of `kind` (`api_version` names its group); returns how
    /// many watches (of any kind) were open.
    pub fn send_raw(&self, api_version: &str, kind: &str, raw: RawWatch) -> anyhow::Result<usize> {
        let rt = resources::of_kind(api_version, kind)
            .ok_or_else(|| anyhow!("the fake API server has no {api_version} {kind}"))?;
        Ok(self.shared.raw.send((store::res_index(rt), raw)).unwrap_or(0))
    }

    /// Deletes the object of `obj`'s kind, namespace and name.
    pub fn delete(&self, obj: &Value) -> anyhow::Result<()> {
        let (rt, ns, name) = identify(obj)?;
        let (_, event) = lock(&self.shared.store)
            .delete(rt, &ns, &name)
            .map_err(|e| anyhow!("{}", e.message))?;
        let _ = self.shared.events.send(event);
        Ok(())
    }

    /// The current resourceVersion (the revision of the last change).
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv
    }

    /// Forgets the event history, as etcd compaction: a watch or list from an older
    /// resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        lock(&self.shared.store).compact();
    }

    /// Ends every open watch abruptly (the connection is cut mid-stream).
    pub fn drop_watches(&self) {
        self.shared.drops.send_modify(|g| *g += 1);
    }

    /// Makes a CRD group (e.g. `security.istio.io`) not installed: absent from discovery, 404.
    pub fn uninstall_group(&self, group: &'static str) {
        lock(&self.shared.store).uninstalled.insert(group);
    }

    /// Routes calls to the Service `name` in `namespace` (a webhook's `clientConfig.service`)
    /// to `addr`, as `https://<name>.<namespace>.svc:<port>` resolving there.
    pub fn route_service(&self, name: &str, namespace: &str, addr: SocketAddr) {
        lock(&self.shared.services).insert((name.to_owned(), namespace.to_owned()), addr);
    }

    /// Every request so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.requests).iter().map(|(_, r)| r.clone()).collect()
    }

    /// The requests so far that bore the bearer token `token` (a client's kubeconfig of
    /// [`write_kubeconfig_with_token`](Self::write_kubeconfig_with_token)), as `METHOD path?query`.
    pub fn requests_by(&self, token: &str) -> Vec<String> {
        by_token(&self.shared.requests, token)
    }

    /// The writes (create, update, patch, delete; not dry runs) so far that bore the bearer
    /// token `token`, as `METHOD path` where the path ends with the object's name, also for a
    /// create (`POST /api/v1/namespaces/default/configmaps/istio-ca-root-cert`), whose name is
    /// in the body.
    pub fn writes_by(&self, token: &str) -> Vec<String> {
        by_token(&self.shared.writes, token)
    }
}

/// The entries of a `(bearer token, line)` log that bore `token`.
fn by_token(log: &Mutex<Vec<(String, String)>>, token: &str) -> Vec<String> {
    lock(log)
        .iter()
        .filter(|(t, _)| t == token)
        .map(|(_, r)| r.clone())
        .collect()
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
        self.drop_watches();
    }
}

/// Runs `kubectl --kubeconfig <kubeconfig> <args>` (`$KUBECTL` if set) and returns its stdout; an
/// error, saying so, when kubectl is missing or fails.
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let bin = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let out = tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {bin} (install kubectl or set KUBECTL)"))?;
    if !out.status.success() {
        anyhow::bail!(
            "kubectl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn identify(obj: &Value) -> anyhow::Result<(&'static resources::ResourceType, String, String)> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let rt = resources::of_kind(api_version, kind)
        .ok_or_else(|| anyhow!("the fake API server has no {api_version} {kind}"))?;
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("{kind} without metadata.name"))?;
    let ns = if rt.namespaced {
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
    } else {
        ""
    };
    Ok((rt, ns.to_owned(), name.to_owned()))
}
