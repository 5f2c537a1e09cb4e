//! Delegate VirtualServices, as Istio's `mergeVirtualServicesIfNeeded`: a root VirtualService (one
//! with hosts) hands an HTTP route to a delegate (one without hosts) through `http[].delegate`;
//! the root's route is replaced by the delegate's routes, each with its matches merged into the
//! root's (`mergeHTTPRoutes`, `mergeHTTPMatchRequests`, `hasConflict`). Delegates are never used
//! on their own, and which delegates each root names is kept so a delegate change can push the root.

use std::collections::HashMap;
use std::sync::Arc;

use model::networking::{HttpMatchRequest, HttpRoute, MatchType, StringMatch, VirtualService};
use model::{Config, ConfigKey, ConfigKind, ConfigSpec};

/// (namespace, name) of a delegate VirtualService.
pub(crate) type DelegateName = (String, String);

/// A delegate VirtualService and the namespaces it is exported to (`.` already replaced by its own
/// namespace; `*` for all), as Istio's `DelegateVirtualService`.
#[derive(Debug, Clone)]
pub(crate) struct DelegateVirtualService {
    pub config: Arc<Config>,
    export_to: Vec<String>,
}

impl DelegateVirtualService {
    /// `default_export_to` is the mesh's `defaultVirtualServiceExportTo`, used when the delegate
    /// names none; an empty default means public, as Istio.
    pub(crate) fn new(
        config: Arc<Config>,
        export_to: &[String],
        default_export_to: &[String],
    ) -> DelegateVirtualService {
        let list = if export_to.is_empty() {
            default_export_to
        } else {
            export_to
        };
        let export_to = if list.is_empty() {
            vec!["*".to_owned()]
        } else {
            list.iter()
                .map(|e| {
                    if e == "." {
                        config.meta.namespace.clone()
                    } else {
                        e.clone()
                    }
                })
                .collect()
        };
        DelegateVirtualService { config, export_to }
    }

    /// Whether a root VirtualService in `namespace` may use this delegate.
    pub(crate) fn visible_to(&self, namespace: &str) -> bool {
        self.export_to.iter().any(|e| e == "*" || e == namespace)
    }

    fn spec(&self) -> Option<&VirtualService> {
        match &self.config.spec {
            ConfigSpec::VirtualService(vs) => Some(vs),
            _ => None,
        }
    }
}

/// What `merge_virtual_services_if_needed` produces.
#[derive(Debug, Default)]
pub(crate) struct MergedVirtualServices {
    /// VirtualServices with hosts, roots merged with their delegates, in the order given.
    pub virtual_services: Vec<Arc<Config>>,
    /// Every delegate (no hosts) by namespace and name.
    pub delegates: HashMap<DelegateName, DelegateVirtualService>,
    /// For each root, the delegates it names (found or not), in route order, each once.
    pub delegates_by_root: HashMap<ConfigKey, Vec<ConfigKey>>,
}

/// Istio's `mergeVirtualServicesIfNeeded` over VirtualServices whose short names are already
/// resolved (each in its own namespace), in creation order. A delegating route is dropped when its
/// delegate is missing, not exported to the root's namespace, or itself delegates (Istio's
/// validation rejects such a delegate, so it never reaches the index).
pub(crate) fn merge_virtual_services_if_needed(
    vses: Vec<Arc<Config>>,
    default_export_to: &[String],
) -> MergedVirtualServices {
    let mut out = MergedVirtualServices::default();
    let mut ordered: Vec<(Arc<Config>, bool)> = Vec::with_capacity(vses.len());
    for cfg in vses {
        let ConfigSpec::VirtualService(vs) = &cfg.spec else {
            continue;
        };
        if vs.hosts.is_empty() {
            let delegate = DelegateVirtualService::new(cfg.clone(), &vs.export_to, default_export_to);
            out.delegates
                .insert((cfg.meta.namespace.clone(), cfg.meta.name.clone()), delegate);
            continue;
        }
        let root = vs.http.iter().any(|h| h.delegate.is_some());
        ordered.push((cfg, root));
    }
    for (cfg, root) in ordered {
        if !root {
            out.virtual_services.push(cfg);
            continue;
        }
        let (merged, dependencies) = merge_root(&cfg, &out.delegates);
        out.delegates_by_root.insert(cfg.key(), dependencies);
        out.virtual_services.push(merged);
    }
    out
}

/// One root with its delegating routes replaced; and the delegates it names.
fn merge_root(
    root: &Arc<Config>,
    delegates: &HashMap<DelegateName, DelegateVirtualService>,
) -> (Arc<Config>, Vec<ConfigKey>) {
    let ConfigSpec::VirtualService(vs) = &root.spec else {
        return (root.clone(), Vec::new());
    };
    let root_ns = &root.meta.namespace;
    let mut dependencies: Vec<ConfigKey> = Vec::new();
    let mut merged_routes = Vec::with_capacity(vs.http.len());
    for route in &vs.http {
        let Some(delegate) = &route.delegate else {
            merged_routes.push(route.clone());
            continue;
        };
        let namespace = if delegate.namespace.is_empty() {
            root_ns.clone()
        } else {
            delegate.namespace.clone()
        };
        let key = ConfigKey {
            kind: ConfigKind::VirtualService,
            namespace: namespace.clone(),
            name: delegate.name.clone(),
        };
        if !dependencies.contains(&key) {
            dependencies.push(key);
        }
        let Some(found) = delegates.get(&(namespace.clone(), delegate.name.clone())) else {
            tracing::warn!(root = %root.key(), "delegate virtual service {namespace}/{} not found", delegate.name);
            continue;
        };
        if !found.visible_to(root_ns) {
            tracing::warn!(root = %root.key(), "delegate virtual service {namespace}/{} is not exported to {root_ns}", delegate.name);
            continue;
        }
        let Some(spec) = found.spec() else {
            continue;
        };
        if spec.http.iter().any(|h| h.delegate.is_some()) {
            tracing::warn!(root = %root.key(), "delegate virtual service {namespace}/{} delegates again; ignored", delegate.name);
            continue;
        }
        merged_routes.extend(merge_http_routes(route, &spec.http));
    }
    let mut merged = vs.clone();
    merged.http = merged_routes;
    let config = Arc::new(Config {
        kind: root.kind,
        meta: root.meta.clone(),
        spec: ConfigSpec::VirtualService(merged),
    });
    (config, dependencies)
}

/// Istio's `MergeHTTPRoutes`: the delegate's routes, each merged with the root's route; a route
/// whose matches conflict with the root's is left out.
pub(crate) fn merge_http_routes(root: &HttpRoute, delegate: &[HttpRoute]) -> Vec<HttpRoute> {
    delegate.iter().filter_map(|d| merge_http_route(root, d)).collect()
}

/// Istio's `mergeHTTPRoute`: the delegate's route with merged matches, its name prefixed by the
/// root's, and the root's policies (rewrite, direct response, timeout, retries, fault, mirrors,
/// CORS, headers) where the delegate sets none. `None` on a match conflict.
fn merge_http_route(root: &HttpRoute, delegate: &HttpRoute) -> Option<HttpRoute> {
    let Some(matches) = merge_http_match_requests(&root.match_, &delegate.match_) else {
        tracing::warn!(
            "HTTPMatchRequests conflict: root route {}, delegate route {}",
            root.name,
            delegate.name
        );
        return None;
    };
    let mut out = delegate.clone();
    out.match_ = matches;
    out.name = joined_name(&root.name, &delegate.name);
    fn inherit<T: Clone>(field: &mut Option<T>, root: &Option<T>) {
        if field.is_none() {
            field.clone_from(root);
        }
    }
    inherit(&mut out.rewrite, &root.rewrite);
    inherit(&mut out.direct_response, &root.direct_response);
    inherit(&mut out.timeout, &root.timeout);
    inherit(&mut out.retries, &root.retries);
    inherit(&mut out.fault, &root.fault);
    inherit(&mut out.mirror, &root.mirror);
    inherit(&mut out.mirror_percent, &root.mirror_percent);
    inherit(&mut out.mirror_percentage, &root.mirror_percentage);
    inherit(&mut out.cors_policy, &root.cors_policy);
    inherit(&mut out.headers, &root.headers);
    if out.mirrors.is_empty() {
        out.mirrors.clone_from(&root.mirrors);
    }
    Some(out)
}

/// The delegate's name, else the root's; both set: `root-delegate`.
fn joined_name(root: &str, delegate: &str) -> String {
    match (root.is_empty(), delegate.is_empty()) {
        (_, true) => root.to_owned(),
        (true, false) => delegate.to_owned(),
        (false, false) => format!("{root}-{delegate}"),
    }
}

/// Istio's `mergeHTTPMatchRequests`: with either side empty, the other side; otherwise every
/// delegate match merged with each root match it does not conflict with. `None` (a conflict) when
/// some delegate match conflicts with every root match.
pub(crate) fn merge_http_match_requests(
    root: &[HttpMatchRequest],
    delegate: &[HttpMatchRequest],
) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(delegate.to_vec());
    }
    if delegate.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for sub in delegate {
        let before = out.len();
        for r in root {
            if has_conflict(r, sub) {
                tracing::debug!(root = ?r, delegate = ?sub, "HTTPMatchRequests conflict");
                continue;
            }
            out.push(merge_http_match_request(r, sub));
        }
        if out.len() == before {
            return None;
        }
    }
    Some(out)
}

/// Istio's `mergeHTTPMatchRequest`: the delegate's match, completed from the root's; for headers,
/// withoutHeaders, queryParams and sourceLabels the union, the delegate's entry winning a shared key.
fn merge_http_match_request(root: &HttpMatchRequest, delegate: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = delegate.clone();
    out.name = joined_name(&root.name, &delegate.name);
    for (field, root) in [
        (&mut out.uri, &root.uri),
        (&mut out.scheme, &root.scheme),
        (&mut out.method, &root.method),
        (&mut out.authority, &root.authority),
    ] {
        if field.is_none() {
            field.clone_from(root);
        }
    }
    for (field, root) in [
        (&mut out.headers, &root.headers),
        (&mut out.without_headers, &root.without_headers),
        (&mut out.query_params, &root.query_params),
    ] {
        for (k, v) in root {
            field.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    for (k, v) in &root.source_labels {
        out.source_labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if out.port == 0 {
        out.port = root.port;
    }
    if out.source_namespace.is_empty() {
        out.source_namespace.clone_from(&root.source_namespace);
    }
    if out.gateways.is_empty() {
        out.gateways.clone_from(&root.gateways);
    }
    if out.stat_prefix.is_empty() {
        out.stat_prefix.clone_from(&root.stat_prefix);
    }
    out
}

/// Istio's `hasConflict`: whether the delegate (`leaf`) match can not be narrowed from the root's.
pub(crate) fn has_conflict(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let pairs = [
        (&root.uri, &leaf.uri),
        (&root.scheme, &leaf.scheme),
        (&root.method, &leaf.method),
        (&root.authority, &leaf.authority),
    ];
    if pairs.iter().any(|(r, l)| string_match_conflict(r.as_ref(), l.as_ref())) {
        return true;
    }
    for (root_map, leaf_map) in [
        (&root.headers, &leaf.headers),
        (&root.without_headers, &leaf.without_headers),
        (&root.query_params, &leaf.query_params),
    ] {
        if leaf_map
            .iter()
            .any(|(k, l)| string_match_conflict(root_map.get(k), Some(l)))
        {
            return true;
        }
    }
    if root.ignore_uri_case != leaf.ignore_uri_case {
        return true;
    }
    if root.port > 0 && leaf.port > 0 && root.port != leaf.port {
        return true;
    }
    if !root.source_namespace.is_empty() && leaf.source_namespace != root.source_namespace {
        return true;
    }
    if leaf
        .source_labels
        .iter()
        .any(|(k, v)| root.source_labels.get(k).is_some_and(|r| r != v))
    {
        return true;
    }
    // the root's gateways must be a superset of the delegate's
    if !root.gateways.is_empty() && !leaf.gateways.is_empty() {
        return root.gateways.len() < leaf.gateways.len() || leaf.gateways.iter().any(|g| !root.gateways.contains(g));
    }
    false
}

/// Istio's `stringMatchConflict`: no conflict when either side is unset; otherwise only an equal
/// exact, or a prefix/exact that extends the root's prefix, narrows the root. Regexes always conflict.
fn string_match_conflict(root: Option<&StringMatch>, leaf: Option<&StringMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else {
        return false;
    };
    match (kind(root), kind(leaf)) {
        (Some(MatchType::Exact(r)), Some(MatchType::Exact(l))) => r != l,
        (Some(MatchType::Prefix(r)), Some(MatchType::Prefix(l) | MatchType::Exact(l))) => !l.starts_with(r),
        _ => true,
    }
}

/// The match a `StringMatch` holds; an empty string counts as unset, as in Istio's protobuf.
fn kind(m: &StringMatch) -> Option<MatchType<'_>> {
    m.match_type().filter(|t| match t {
        MatchType::Exact(s) | MatchType::Prefix(s) | MatchType::Regex(s) => !s.is_empty(),
    })
}

#[cfg(test)]
#[path = "delegate_tests.rs"]
mod tests;
