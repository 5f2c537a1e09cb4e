//! Istio's VirtualService HTTP routes to Envoy routes, as `pilot/pkg/networking/core/route/route.go`
//! (`BuildHTTPRoutesForVirtualService`, `TranslateRoute` and friends), for the route
//! configurations of gateways and sidecars alike (`rds/`). Delegate VirtualServices arrive here
//! already merged into their root (`push_index::delegate`, Istio's `mergeVirtualServicesIfNeeded`).
//!
//! Not yet here: Gateway API semantics, stateful sessions.

pub(crate) mod destination;
pub(crate) mod hash;
pub(crate) mod matching;
pub(crate) mod policy;
pub(crate) mod push;

use std::collections::BTreeMap;
use std::sync::Arc;

use model::networking::{HttpMatchRequest, HttpRoute, VirtualService};
use model::{Config, ConfigSpec, Proxy, Service};
use xds_api::envoy::config::core::v3::Metadata;
use xds_api::envoy::config::route::v3::{Decorator, Route, route, route_action, route_match::PathSpecifier};
use xds_api::pbwkt::{Struct, Value, value::Kind};

pub(crate) use push::PushView;
/// Gateway names are resolved as the push index does (`ns/name`; `mesh` for sidecars).
pub(crate) use push_index::{MESH_GATEWAY, resolve_gateway_name};

/// Filter names whose per-route config a route may carry.
pub(crate) const FAULT_FILTER: &str = "envoy.filters.http.fault";
pub(crate) const CORS_FILTER: &str = "envoy.filters.http.cors";

/// The VirtualService spec of a config, if it is one.
pub(crate) fn virtual_service(config: &Config) -> Option<&VirtualService> {
    match &config.spec {
        ConfigSpec::VirtualService(vs) => Some(vs),
        _ => None,
    }
}

/// What the routes of one VirtualService are built for (Istio's `RouteOptions` plus the context).
pub(crate) struct RouteContext<'a, P: PushView> {
    pub(crate) push: &'a P,
    pub(crate) proxy: &'a Proxy,
    /// The VirtualService config (its namespace resolves short names; its name labels routes).
    pub(crate) config: &'a Config,
    /// The port the listener serves (the gateway server's port).
    pub(crate) listen_port: u32,
    /// Gateways (`ns/name`) the routes are built for; `match.gateways` must name one of them.
    pub(crate) gateway_names: &'a [String],
    /// Whether the listener terminates TLS (redirects then default to https).
    pub(crate) is_tls: bool,
    services: std::cell::RefCell<BTreeMap<String, Option<Arc<Service>>>>,
}

impl<'a, P: PushView> RouteContext<'a, P> {
    pub(crate) fn new(
        push: &'a P,
        proxy: &'a Proxy,
        config: &'a Config,
        listen_port: u32,
        gateway_names: &'a [String],
        is_tls: bool,
    ) -> Self {
        RouteContext {
            push,
            proxy,
            config,
            listen_port,
            gateway_names,
            is_tls,
            services: Default::default(),
        }
    }

    /// A host from the VirtualService, resolved to an FQDN in the VS namespace.
    pub(crate) fn resolve_host(&self, host: &str) -> String {
        model::host::resolve_short_name(host, &self.config.meta.namespace, self.push.domain())
    }

    /// The service behind a (resolved) host, looked up once per VirtualService.
    pub(crate) fn service(&self, host: &str) -> Option<Arc<Service>> {
        self.services
            .borrow_mut()
            .entry(host.to_owned())
            .or_insert_with(|| self.push.service_for_host(self.proxy, host))
            .clone()
    }
}

/// `BuildHTTPRoutesForVirtualService`: one route per HTTP match (a rule without matches is a
/// catch-all and ends the list). Empty when no rule applies to this port and gateway.
pub(crate) fn build_http_routes_for_virtual_service<P: PushView>(ctx: &RouteContext<'_, P>) -> Vec<Route> {
    let Some(vs) = virtual_service(ctx.config) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(vs.http.len());
    for http in &vs.http {
        if http.match_.is_empty() {
            out.extend(translate_route(ctx, http, None));
            break;
        }
        let mut catch_all = false;
        for m in &http.match_ {
            if let Some(r) = translate_route(ctx, http, Some(m)) {
                // routes match in order: nothing after a catch-all is ever reached
                catch_all = is_catch_all_route(&r);
                out.push(r);
                if catch_all {
                    break;
                }
            }
        }
        if catch_all {
            break;
        }
    }
    out
}

/// `TranslateRoute`: one Envoy route for one rule and one of its matches, or `None` when the
/// match does not apply here (port, gateway, source) or the rule cannot be expressed.
pub(crate) fn translate_route<P: PushView>(
    ctx: &RouteContext<'_, P>,
    http: &HttpRoute,
    m: Option<&HttpMatchRequest>,
) -> Option<Route> {
    if let Some(m) = m
        && m.port != 0
        && m.port != ctx.listen_port
    {
        return None;
    }
    if !source_match(ctx, m) {
        return None;
    }
    if http.delegate.is_some() {
        // The push index merges delegates into their roots (push-index/src/delegate.rs); a rule
        // still delegating here had no usable delegate, and Istio drops it too.
        tracing::debug!(vs = %ctx.config.key(), "delegating rule without a merged delegate skipped");
        return None;
    }
    let mut name = http.name.clone();
    if let Some(m) = m.filter(|m| !m.name.is_empty()) {
        name = format!("{name}.{}", m.name);
    }
    let mut route_match = matching::translate_route_match(m);
    if ctx.config.uses_ingress_semantics() {
        matching::path_separated(&mut route_match);
    }
    let mut out = Route {
        name,
        r#match: Some(route_match),
        metadata: Some(config_metadata(ctx.config)),
        stat_prefix: m.map(|m| m.stat_prefix.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let mut authority = String::new();
    if let Some(headers) = &http.headers {
        let ops = policy::translate_headers(headers);
        out.request_headers_to_add = ops.request_headers_to_add;
        out.response_headers_to_add = ops.response_headers_to_add;
        out.request_headers_to_remove = ops.request_headers_to_remove;
        out.response_headers_to_remove = ops.response_headers_to_remove;
        authority = ops.authority;
    }
    out.action = if let Some(redirect) = &http.redirect {
        Some(route::Action::Redirect(destination::redirect_action(
            redirect,
            ctx.listen_port,
            ctx.is_tls,
        )?))
    } else if let Some(direct) = &http.direct_response {
        Some(route::Action::DirectResponse(destination::direct_response_action(
            direct,
        )))
    } else {
        Some(route::Action::Route(destination::route_action(
            ctx, http, &mut out, authority,
        )?))
    };
    out.decorator = Some(Decorator {
        operation: route_operation(&out, &ctx.config.meta.name, ctx.listen_port),
        propagate: None,
    });
    if let Some(fault) = http.fault.as_ref().and_then(policy::translate_fault) {
        out.typed_per_filter_config
            .insert(FAULT_FILTER.into(), xds_api::pack(&fault));
    }
    if let Some(cors) = &http.cors_policy {
        out.typed_per_filter_config
            .insert(CORS_FILTER.into(), xds_api::pack(&policy::translate_cors(cors)));
    }
    Some(out)
}

/// `sourceMatchHTTP`: a match naming gateways applies only to them; otherwise its source labels
/// and namespace must fit the proxy.
fn source_match<P: PushView>(ctx: &RouteContext<'_, P>, m: Option<&HttpMatchRequest>) -> bool {
    let Some(m) = m else {
        return true;
    };
    if !m.gateways.is_empty() {
        // `mesh` stands for the sidecars; other names resolve against the VirtualService's namespace.
        return m
            .gateways
            .iter()
            .map(|g| resolve_gateway_name(g, &ctx.config.meta.namespace))
            .any(|g| ctx.gateway_names.contains(&g));
    }
    let labels_match = m.source_labels.iter().all(|(k, v)| ctx.proxy.labels.get(k) == Some(v));
    labels_match && (m.source_namespace.is_empty() || m.source_namespace == ctx.proxy.config_namespace)
}

/// `IsCatchAllRoute`: prefix `/` (or regex `.*`) with no header, query or metadata conditions.
pub(crate) fn is_catch_all_route(r: &Route) -> bool {
    let Some(m) = &r.r#match else {
        return false;
    };
    let path_catch_all = match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) | Some(PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
        Some(PathSpecifier::SafeRegex(re)) => re.regex == ".*",
        _ => false,
    };
    path_catch_all && m.headers.is_empty() && m.query_parameters.is_empty() && m.dynamic_metadata.is_empty()
}

/// `SortVHostRoutes`: catch-all routes move to the end, others keep their order.
pub(crate) fn sort_vhost_routes(routes: Vec<Route>) -> Vec<Route> {
    let (mut rest, catch_all): (Vec<Route>, Vec<Route>) = routes.into_iter().partition(|r| !is_catch_all_route(r));
    rest.extend(catch_all);
    rest
}

/// `GetRouteOperation`: `host:port/path` for a single cluster, else `vs-name:port/path` (tracing).
fn route_operation(r: &Route, vs_name: &str, port: u32) -> String {
    let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(re)) => re.regex.clone(),
        _ => "/*".to_owned(),
    };
    if let Some(route::Action::Route(action)) = &r.action
        && let Some(route_action::ClusterSpecifier::Cluster(c)) = &action.cluster_specifier
        && let Some((_, _, host, p)) = crate::names::parse_subset_key(c)
    {
        return format!("{host}:{p}{path}");
    }
    format!("{vs_name}:{port}{path}")
}

/// Istio's `BuildConfigInfoMetadata`: `filter_metadata.istio.config` names the VirtualService.
fn config_metadata(config: &Config) -> Metadata {
    let api_version = if config.meta.api_version.is_empty() {
        "networking.istio.io/v1"
    } else {
        &config.meta.api_version
    };
    let path = format!(
        "/apis/{api_version}/namespaces/{}/virtual-service/{}",
        config.meta.namespace, config.meta.name
    );
    let istio = Struct {
        fields: [(
            "config".to_owned(),
            Value {
                kind: Some(Kind::StringValue(path)),
            },
        )]
        .into(),
    };
    Metadata {
        filter_metadata: [("istio".to_owned(), istio)].into(),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
