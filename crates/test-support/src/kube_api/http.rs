//! The fake API server's HTTP protocol: discovery, list (resourceVersion, labelSelector,
//! fieldSelector, limit/continue), watch (ADDED/MODIFIED/DELETED/BOOKMARK, 410 as an ERROR event,
//! sendInitialEvents), get, create, replace, merge patch, server-side apply (`apply.rs`), delete;
//! creates go through mutating admission (`mutating.rs`), creates and updates through validating
//! admission (`admission.rs`), and `dryRun=All` ones stop there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::resources::{RESOURCES, ResourceType, find};
use super::selector::Selector;
use super::store::{ApiError, Event, EventType, merge_patch, res_index};
use super::{RawWatch, Shared, lock, rbac};

/// What a path names.
enum Target<'a> {
    Version,
    OpenApiRoot,
    OpenApi(&'a str),
    CoreVersions,
    Groups,
    Resources {
        group: &'a str,
        version: &'a str,
    },
    Collection {
        rt: &'static ResourceType,
        version: &'a str,
        ns: Option<&'a str>,
    },
    Object {
        rt: &'static ResourceType,
        version: &'a str,
        ns: &'a str,
        name: &'a str,
    },
}

fn parse_path(path: &str) -> Option<Target<'_>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Some(Target::Version),
        ["openapi", "v3"] => return Some(Target::OpenApiRoot),
        ["openapi", "v3", ..] => {
            return Some(Target::OpenApi(
                path.trim_start_matches('/').trim_start_matches("openapi/v3/"),
            ));
        }
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::Groups),
        ["api", v] => return Some(Target::Resources { group: "", version: v }),
        ["apis", g, v] => return Some(Target::Resources { group: g, version: v }),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, plural, name) = match rest {
        [plural] => (None, *plural, None),
        [plural, name] if !find(group, version, plural)?.namespaced => (None, *plural, Some(*name)),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        _ => return None,
    };
    let rt = find(group, version, plural)?;
    Some(match name {
        Some(name) => Target::Object {
            rt,
            version,
            ns: if rt.namespaced { ns.unwrap_or("default") } else { "" },
            name,
        },
        None => Target::Collection {
            rt,
            version,
            ns: ns.filter(|_| rt.namespaced),
        },
    })
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error(e: &ApiError) -> Response {
    json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| url_pairs(q).into_iter().collect::<BTreeMap<String, String>>())
        .unwrap_or_default()
}

/// `application/x-www-form-urlencoded` pairs.
fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The object as served at `version` (Istio kinds are stored once for all their versions).
fn at_version(obj: &Value, rt: &ResourceType, version: &str) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), json!(rt.api_version(version)));
        m.insert("kind".into(), json!(rt.kind));
    }
    o
}

/// An object's `metadata.labels` (string values only).
pub(crate) fn labels(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// `fieldSelector`: `metadata.name=x`, `metadata.namespace=y` (the fields every kind has).
fn field_matches(fs: &str, obj: &Value) -> bool {
    fs.split(',').filter(|t| !t.is_empty()).all(|t| {
        let (neg, (k, v)) = match t.split_once("!=") {
            Some(kv) => (true, kv),
            None => (
                false,
                t.split_once("==").or_else(|| t.split_once('=')).unwrap_or((t, "")),
            ),
        };
        let field = match k.trim() {
            "metadata.name" => obj.pointer("/metadata/name"),
            "metadata.namespace" => obj.pointer("/metadata/namespace"),
            _ => return true,
        };
        let eq = field.and_then(Value::as_str).unwrap_or("") == v.trim();
        eq != neg
    })
}

struct Filter {
    rt: &'static ResourceType,
    version: String,
    ns: Option<String>,
    labels: Selector,
    fields: String,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|ns| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns))
            && self.labels.matches(&labels(obj))
            && field_matches(&self.fields, obj)
    }

    /// The watch event line for `e`, if this watch sees it: an object that stops matching the
    /// selector is DELETED for this watch, one that starts matching ADDED, as the API server does.
    fn render(&self, e: &Event) -> Option<Bytes> {
        if e.res != res_index(self.rt) {
            return None;
        }
        let now = self.matches(&e.new);
        let before = e.old.as_deref().is_some_and(|o| self.matches(o));
        let kind = match e.kind {
            EventType::Deleted if before => EventType::Deleted,
            EventType::Deleted => return None,
            EventType::Added if now => EventType::Added,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            _ => return None,
        };
        Some(line(kind.as_str(), &at_version(&e.new, self.rt, &self.version)))
    }
}

fn line(kind: &str, obj: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": obj}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(rt: &ResourceType, version: &str, rv: u64, initial_end: bool) -> Bytes {
    let mut md = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": md}),
    )
}

/// Logs a write (not a dry run) as `METHOD path`, its path ending with the object's name (for a
/// create, taken from the body).
fn log_write(s: &Shared, token: String, method: &Method, uri: &Uri, body: &Bytes) {
    let write = matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
    if !write || uri.query().is_some_and(|q| q.contains("dryRun=All")) {
        return;
    }
    let mut path = uri.path().to_owned();
    if *method == Method::POST
        && let Some(name) = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.pointer("/metadata/name")?.as_str().map(str::to_owned))
    {
        path = format!("{path}/{name}");
    }
    lock(&s.writes).push((token, format!("{method} {path}")));
}

pub(crate) async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned();
    lock(&s.requests).push((token.clone(), format!("{method} {uri}")));
    log_write(&s, token, &method, &uri, &body);
    let Some(target) = parse_path(uri.path()) else {
        return error(&ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({})", uri.path()),
        ));
    };
    let q = query(&uri);
    if let Some(refused) = authorize(&s, &headers, &target, &method, &q, &uri) {
        return refused;
    }
    match (target, method) {
        (Target::Version, Method::GET) => json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake", "platform": "linux/amd64"}),
        ),
        (Target::OpenApiRoot, Method::GET) => json_response(StatusCode::OK, &openapi_root(&s)),
        (Target::OpenApi(gv), Method::GET) => match openapi_gv(gv) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => error(&ApiError::new(404, "NotFound", format!("no OpenAPI document for {gv}"))),
        },
        (Target::CoreVersions, Method::GET) => json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": s.addr.to_string()}]}),
        ),
        (Target::Groups, Method::GET) => json_response(StatusCode::OK, &groups(&s)),
        (Target::Resources { group, version }, Method::GET) => match resources(&s, group, version) {
            Some(v) => json_response(StatusCode::OK, &v),
            None => error(&ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({group}/{version})"),
            )),
        },
        (Target::Collection { rt, .. } | Target::Object { rt, .. }, _) if !lock(&s.store).installed(rt) => {
            error(&ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({}.{})",
                    rt.plural, rt.group
                ),
            ))
        }
        (Target::Collection { rt, version, ns }, Method::GET) => {
            let filter = match Selector::parse(q.get("labelSelector").map_or("", String::as_str)) {
                Ok(labels) => Filter {
                    rt,
                    version: version.to_owned(),
                    ns: ns.map(str::to_owned),
                    labels,
                    fields: q.get("fieldSelector").cloned().unwrap_or_default(),
                },
                Err(e) => {
                    return error(&ApiError::new(
                        400,
                        "BadRequest",
                        format!("unable to parse requirement: {e}"),
                    ));
                }
            };
            if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) {
                watch(s, filter, &q)
            } else {
                list(&s, &filter, &q)
            }
        }
        (Target::Collection { rt, .. }, Method::POST) if rt.plural == "tokenreviews" => {
            let review = match body_json(&headers, &body) {
                Ok(v) => v,
                Err(e) => return error(&e),
            };
            json_response(StatusCode::CREATED, &token_review(&s, review))
        }
        (Target::Collection { rt, version, ns }, Method::POST) => {
            let obj = match body_json(&headers, &body) {
                Ok(v) => v,
                Err(e) => return error(&e),
            };
            let namespace = ns.unwrap_or("");
            let obj = match mutate(&s, rt, version, namespace, &obj, &q).await {
                Ok(o) => o,
                Err(e) => return error(&e),
            };
            if let Err(e) = admit(&s, rt, version, namespace, "CREATE", &obj, None, &q).await {
                return error(&e);
            }
            if dry_run(&q) {
                return json_response(StatusCode::CREATED, &obj);
            }
            let now = s.now();
            let created = lock(&s.store).create(rt, namespace, obj, &now);
            respond(&s, created, rt, version, StatusCode::CREATED)
        }
        (Target::Object { rt, version, ns, name }, Method::GET) => match lock(&s.store).get(res_index(rt), ns, name) {
            Some(o) => json_response(StatusCode::OK, &at_version(&o, rt, version)),
            None => error(&ApiError::not_found(rt, name)),
        },
        (Target::Object { rt, version, ns, name }, Method::PUT) => {
            let obj = match body_json(&headers, &body) {
                Ok(v) => v,
                Err(e) => return error(&e),
            };
            let old = lock(&s.store).get(res_index(rt), ns, name);
            if let Err(e) = admit(&s, rt, version, ns, "UPDATE", &obj, old.as_deref(), &q).await {
                return error(&e);
            }
            if dry_run(&q) {
                return json_response(StatusCode::OK, &obj);
            }
            let mut obj = obj;
            if let Some(old) = &old {
                record_update(&s, old, &mut obj, rt, version, &q, &headers);
            }
            let replaced = lock(&s.store).replace(rt, ns, name, obj);
            respond(&s, replaced, rt, version, StatusCode::OK)
        }
        (Target::Object { rt, version, ns, name }, Method::PATCH) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if ct.starts_with("application/apply-patch+yaml") {
                return server_side_apply(&s, rt, version, ns, name, &body, &q).await;
            }
            if !(ct.starts_with("application/merge-patch+json")
                || ct.starts_with("application/strategic-merge-patch+json"))
            {
                return error(&ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the fake API server takes merge patches and server-side apply, not {ct:?}"),
                ));
            }
            let patch: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return error(&ApiError::new(400, "BadRequest", format!("invalid patch: {e}"))),
            };
            let Some(old) = lock(&s.store).get(res_index(rt), ns, name) else {
                return error(&ApiError::not_found(rt, name));
            };
            let mut obj = (*old).clone();
            merge_patch(&mut obj, &patch);
            if let Err(e) = admit(&s, rt, version, ns, "UPDATE", &obj, Some(&old), &q).await {
                return error(&e);
            }
            if dry_run(&q) {
                return json_response(StatusCode::OK, &obj);
            }
            record_update(&s, &old, &mut obj, rt, version, &q, &headers);
            let patched = lock(&s.store).replace(rt, ns, name, obj);
            respond(&s, patched, rt, version, StatusCode::OK)
        }
        (Target::Object { rt, version, ns, name }, Method::DELETE) => {
            let deleted = lock(&s.store).delete(rt, ns, name);
            respond(&s, deleted, rt, version, StatusCode::OK)
        }
        (_, m) => error(&ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported here"),
        )),
    }
}

/// 403 Forbidden when the request's bearer token is restricted (to a ClusterRole and Roles bound
/// with `FakeApiServer::bind_cluster_role` and `bind_role`, or to what the stored bindings grant
/// its service account, `FakeApiServer::authorize_by_bindings`) and no rule allows it; discovery
/// is open to all.
fn authorize(
    s: &Shared,
    headers: &HeaderMap,
    target: &Target<'_>,
    method: &Method,
    q: &BTreeMap<String, String>,
    uri: &Uri,
) -> Option<Response> {
    let (rt, ns, name) = match target {
        Target::Collection { rt, ns, .. } => (*rt, *ns, None),
        Target::Object { rt, ns, name, .. } => (*rt, Some(*ns).filter(|n| !n.is_empty()), Some(*name)),
        _ => return None,
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    let bound = lock(&s.roles).get(token).cloned();
    let roles = lock(&s.namespace_roles).get(token).cloned();
    let rules = match (bound, roles) {
        (None, None) => {
            let (sa_ns, sa_name) = lock(&s.by_bindings).get(token)?.clone();
            rbac::granted(&StoredRbac(s), &sa_ns, &sa_name, ns)
        }
        (cluster, roles) => {
            // A Role allows only within its namespace (never a list or watch across them).
            let mut rules = cluster.unwrap_or_default();
            for (role_ns, role_rules) in roles.into_iter().flatten() {
                if rt.namespaced && ns == Some(role_ns.as_str()) {
                    rules.extend(role_rules);
                }
            }
            rules
        }
    };
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = rbac::verb(method, name.is_some(), watch);
    // create names no object (Kubernetes never restricts it by resourceNames)
    let name = name.filter(|_| verb != "create");
    if rbac::allows(&rules, rt.group, rt.plural, verb, name) {
        return None;
    }
    let group = if rt.group.is_empty() { "\"\"" } else { rt.group };
    lock(&s.forbidden).push(format!("{method} {uri} ({verb} {}.{group})", rt.plural));
    Some(error(&ApiError::new(
        403,
        "Forbidden",
        format!(
            "{}.{group} is forbidden: User \"{token}\" cannot {verb} resource \"{}\" in API group {group}",
            rt.plural, rt.plural
        ),
    )))
}

/// The RBAC objects of the store.
struct StoredRbac<'a>(&'a Shared);

impl rbac::RbacObjects for StoredRbac<'_> {
    fn objects(&self, kind: &str, namespace: &str) -> Vec<Arc<Value>> {
        match crate::kube_api::resources::of_kind("rbac.authorization.k8s.io/v1", kind) {
            Some(rt) => lock(&self.0.store).list(res_index(rt), Some(namespace)),
            None => Vec::new(),
        }
    }
}

/// The API server's answer to a TokenReview: authenticated with the user and the audiences the
/// token and the review share, or not, saying why.
fn token_review(s: &Shared, mut review: Value) -> Value {
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let wanted: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let status = match lock(&s.tokens).get(&token) {
        None => json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]"}),
        Some((user, audiences)) => {
            let shared: Vec<&String> = audiences
                .iter()
                .filter(|a| wanted.is_empty() || wanted.contains(a))
                .collect();
            if shared.is_empty() {
                json!({"authenticated": false, "error": "[invalid bearer token, token audiences is invalid]"})
            } else {
                json!({"authenticated": true, "user": {"username": user}, "audiences": shared})
            }
        }
    };
    review["status"] = status;
    review
}

/// `dryRun=All`: admitted, not stored.
fn dry_run(q: &BTreeMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

/// Mutating admission of a create (`mutating.rs`): the object to validate and store.
async fn mutate(
    s: &Shared,
    rt: &'static ResourceType,
    version: &str,
    namespace: &str,
    object: &Value,
    q: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    let request = super::admission::Request {
        rt,
        version,
        namespace,
        operation: "CREATE",
        object,
        old: None,
        dry_run: dry_run(q),
    };
    super::mutating::mutate(s, &request).await
}

/// Validating admission of a create or update (`admission.rs`).
#[allow(clippy::too_many_arguments)]
async fn admit(
    s: &Shared,
    rt: &'static ResourceType,
    version: &str,
    namespace: &str,
    operation: &'static str,
    object: &Value,
    old: Option<&Value>,
    q: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    let request = super::admission::Request {
        rt,
        version,
        namespace,
        operation,
        object,
        old,
        dry_run: dry_run(q),
    };
    super::admission::validate(s, &request).await
}

fn body_json(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if !ct.contains("json") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the fake API server takes JSON, not {ct:?}"),
        ));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::new(400, "BadRequest", format!("invalid object: {e}")))
}

fn respond(
    s: &Shared,
    r: Result<(Value, Arc<Event>), ApiError>,
    rt: &ResourceType,
    version: &str,
    code: StatusCode,
) -> Response {
    match r {
        Ok((obj, event)) => {
            // Nobody listening is fine.
            let _ = s.events.send(event);
            json_response(code, &at_version(&obj, rt, version))
        }
        Err(e) => error(&e),
    }
}

/// `/openapi/v3`: a document per group version, so that kubectl (client-go's
/// `queryParamVerifierV3`) finds server-side field validation and does not validate client-side.
fn openapi_root(s: &Shared) -> Value {
    let store = lock(&s.store);
    let mut paths = serde_json::Map::new();
    for rt in RESOURCES.iter().filter(|r| store.installed(r)) {
        for v in rt.versions {
            let gv = if rt.group.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{}/{v}", rt.group)
            };
            paths.insert(
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=fake")}),
            );
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group version: the PATCH operation of each kind, with its
/// `x-kubernetes-group-version-kind` and the `fieldValidation` query parameter.
fn openapi_gv(gv: &str) -> Option<Value> {
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let mut paths = serde_json::Map::new();
    for rt in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.versions.contains(&version))
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{prefix}/{}/{{name}}", rt.plural)
        };
        paths.insert(
            path,
            json!({"patch": {
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": rt.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths}))
}

fn groups(s: &Shared) -> Value {
    let store = lock(&s.store);
    let mut groups: Vec<(&str, &[&str])> = Vec::new();
    for rt in RESOURCES.iter().filter(|r| !r.group.is_empty() && store.installed(r)) {
        if !groups.iter().any(|(g, _)| *g == rt.group) {
            groups.push((rt.group, rt.versions));
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": vs, "preferredVersion": vs[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resources(s: &Shared, group: &str, version: &str) -> Option<Value> {
    let store = lock(&s.store);
    let list: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.versions.contains(&version) && store.installed(r))
        .map(|r| {
            json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                   "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                   "shortNames": r.short_names})
        })
        .collect();
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}

/// A list, paged by `limit` with a `continue` token `<rv>.<offset>`; a token or an exact
/// `resourceVersion` older than the history kept is 410 Gone.
fn list(s: &Shared, f: &Filter, q: &BTreeMap<String, String>) -> Response {
    let store = lock(&s.store);
    let (rv, offset) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let parsed = token
                .split_once('.')
                .and_then(|(rv, off)| Some((rv.parse::<u64>().ok()?, off.parse::<usize>().ok()?)));
            match parsed {
                Some((rv, _)) if rv < store.compacted => {
                    return error(&ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                Some(p) => p,
                None => {
                    return error(&ApiError::new(
                        400,
                        "BadRequest",
                        format!("invalid continue token {token:?}"),
                    ));
                }
            }
        }
        None => {
            let exact = q.get("resourceVersionMatch").is_some_and(|m| m == "Exact");
            if let Some(want) = q.get("resourceVersion").and_then(|v| v.parse::<u64>().ok())
                && exact
                && want < store.compacted
            {
                return error(&ApiError::expired(format!(
                    "Timeout: Too large resource version: {want}, current: {}",
                    store.rv
                )));
            }
            (store.rv, 0)
        }
    };
    let all: Vec<Arc<Value>> = store
        .list(res_index(f.rt), f.ns.as_deref())
        .into_iter()
        .filter(|o| f.matches(o))
        .collect();
    drop(store);
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    // Only the page is copied out (at the asked version): copying every object for every page
    // made a paged list of 30,000 Pods quadratic (15 s of this server's CPU at start-up).
    let page: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|o| at_version(o, f.rt, &f.version))
        .collect();
    let next = offset.saturating_add(page.len());
    let mut md = json!({"resourceVersion": rv.to_string()});
    if next < all.len() {
        md["continue"] = json!(format!("{rv}.{next}"));
        md["remainingItemCount"] = json!(all.len() - next);
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", f.rt.kind), "apiVersion": f.rt.api_version(&f.version), "metadata": md, "items": page}),
    )
}

/// A watch: the history after `resourceVersion` (or, without one or with "0", ADDED for what
/// exists), then live events; BOOKMARKs when allowed; 410 as an ERROR event when the history
/// asked for is gone; ends at `timeoutSeconds`, or abruptly when the test drops watches.
fn watch(s: Arc<Shared>, f: Filter, q: &BTreeMap<String, String>) -> Response {
    let mut events = s.events.subscribe();
    let mut raw = s.raw.subscribe();
    let mut drops = s.drops.subscribe();
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let initial_events = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(3600), Duration::from_secs);
    let from = q
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|rv| *rv > 0);
    let (start, backlog, current) = {
        let store = lock(&s.store);
        let current: Vec<Arc<Value>> = if from.is_none() || initial_events {
            store
                .list(res_index(f.rt), f.ns.as_deref())
                .into_iter()
                .filter(|o| f.matches(o))
                .collect()
        } else {
            Vec::new()
        };
        match from {
            Some(rv) if !initial_events => match store.events_after(rv) {
                Some(b) => (rv, b, current),
                None => {
                    let e = ApiError::expired(format!("too old resource version: {rv} ({})", store.compacted + 1));
                    let body = line("ERROR", &e.status());
                    return (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response();
                }
            },
            _ => (store.rv, Vec::new(), current),
        }
    };
    let interval = s.bookmark_interval;
    let stream = async_stream::stream! {
        let mut seen = start;
        for o in &current {
            yield Ok::<Bytes, std::io::Error>(line("ADDED", &at_version(o, f.rt, &f.version)));
        }
        if initial_events {
            yield Ok(bookmark(f.rt, &f.version, seen, true));
        }
        for e in &backlog {
            seen = seen.max(e.rv);
            if let Some(l) = f.render(e) {
                yield Ok(l);
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                e = events.recv() => match e {
                    Ok(e) if e.rv > seen => {
                        seen = e.rv;
                        if let Some(l) = f.render(&e) {
                            yield Ok(l);
                        }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => {
                        yield Ok(line("ERROR", &ApiError::expired("watch fell behind").status()));
                        break;
                    }
                    Err(RecvError::Closed) => break,
                },
                r = raw.recv() => match r {
                    Ok((res, RawWatch::Line(text))) if res == res_index(f.rt) => {
                        yield Ok(Bytes::from(format!("{text}\n")));
                    }
                    Ok((res, RawWatch::Endless { bytes })) if res == res_index(f.rt) => {
                        let head = r#"{"type":"ADDED","object":{"metadata":{"name":""#;
                        yield Ok(Bytes::from_static(head.as_bytes()));
                        let chunk = Bytes::from(vec![b'x'; 64 << 10]);
                        let mut sent = head.len();
                        while sent < bytes {
                            let n = chunk.len().min(bytes - sent);
                            sent += n;
                            yield Ok(chunk.slice(..n));
                        }
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                },
                _ = tick.tick(), if bookmarks => yield Ok(bookmark(f.rt, &f.version, seen, false)),
                _ = drops.changed() => {
                    yield Err(std::io::Error::other("watch dropped by the test"));
                    break;
                }
                _ = &mut deadline => break,
            }
        }
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `PATCH` with `application/apply-patch+yaml`: creates the object when absent, else merges the
/// applied configuration, refusing with 409 Conflict a change of fields another manager owns
/// (`apply.rs`) unless `force=true`.
async fn server_side_apply(
    s: &Shared,
    rt: &'static ResourceType,
    version: &str,
    ns: &str,
    name: &str,
    body: &Bytes,
    q: &BTreeMap<String, String>,
) -> Response {
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
        return error(&ApiError::new(
            400,
            "BadRequest",
            "PATCH /apply requires fieldManager to be set",
        ));
    };
    let config: Value = match std::str::from_utf8(body)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_saphyr::from_str::<Value>(t).map_err(|e| e.to_string()))
    {
        Ok(v) if v.is_object() => v,
        Ok(_) => {
            return error(&ApiError::new(
                400,
                "BadRequest",
                "the applied configuration is not an object",
            ));
        }
        Err(e) => {
            return error(&ApiError::new(
                400,
                "BadRequest",
                format!("invalid apply configuration: {e}"),
            ));
        }
    };
    let api_version = rt.api_version(version);
    if config.get("apiVersion").and_then(Value::as_str) != Some(api_version.as_str())
        || config.get("kind").and_then(Value::as_str) != Some(rt.kind)
    {
        return error(&ApiError::new(
            400,
            "BadRequest",
            format!(
                "the applied configuration must have apiVersion {api_version} and kind {}",
                rt.kind
            ),
        ));
    }
    if config
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| n != name)
    {
        return error(&ApiError::new(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        ));
    }
    let now = s.now();
    let who = super::apply::Applier {
        manager,
        force: q.get("force").is_some_and(|f| f == "true"),
        api_version: &api_version,
        now: &now,
    };
    let old = lock(&s.store).get(res_index(rt), ns, name);
    let mut obj = match super::apply::apply(old.as_deref(), &config, &who) {
        Ok(o) => o,
        Err(e) => return error(&e),
    };
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    if let Err(e) = admit(s, rt, version, ns, operation, &obj, old.as_deref(), q).await {
        return error(&e);
    }
    if dry_run(q) {
        return json_response(StatusCode::OK, &obj);
    }
    if old.is_none() {
        let md = super::store::metadata(&mut obj);
        md.insert("name".into(), json!(name));
        let created = lock(&s.store).create(rt, ns, obj, &now);
        return respond(s, created, rt, version, StatusCode::CREATED);
    }
    let applied = lock(&s.store).replace(rt, ns, name, obj);
    respond(s, applied, rt, version, StatusCode::OK)
}

/// Field ownership of an update (`apply.rs`): `fieldManager`, else the User-Agent's name.
fn record_update(
    s: &Shared,
    old: &Value,
    new: &mut Value,
    rt: &ResourceType,
    version: &str,
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
) {
    let manager = q
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            super::apply::manager_from_user_agent(
                headers
                    .get(header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default(),
            )
        });
    let api_version = rt.api_version(version);
    let now = s.now();
    let who = super::apply::Applier {
        manager: &manager,
        force: false,
        api_version: &api_version,
        now: &now,
    };
    super::apply::record_update(old, new, &who);
}
