//! Test support for the gateway builders: a `FakePush` over plain lists of config and services,
//! config from JSON, and `evaluate`, which walks a RouteConfiguration the way Envoy picks a virtual
//! host and the first matching route, so tests say "a request to H P reaches cluster C".

use std::sync::Arc;

use model::networking::DestinationRule;
use model::{Config, ConfigSpec, MeshConfig, Port, Protocol, Proxy, Service, ServiceAttributes};
use serde_json::Value as Json;
use xds_api::envoy::config::route::v3::{
    HeaderMatcher, RedirectAction, Route, RouteAction, RouteConfiguration, VirtualHost,
    header_matcher::HeaderMatchSpecifier, query_parameter_matcher::QueryParameterMatchSpecifier, route, route_action,
    route_match::PathSpecifier, virtual_host::TlsRequirementType,
};
use xds_api::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};

use super::{PushView, resolve_gateway_name, virtual_service};

/// A push over plain lists, in the order given.
#[derive(Default)]
pub(crate) struct FakePush {
    pub(crate) mesh: MeshConfig,
    pub(crate) configs: Vec<Arc<Config>>,
    pub(crate) services: Vec<Arc<Service>>,
    /// The gateway proxy's service targets (port translation).
    pub(crate) gateway_targets: Vec<crate::lds::merged_gateway::GatewayTarget>,
}

impl FakePush {
    /// Parses each JSON document as Istio config (namespace `default` when absent).
    pub(crate) fn with_configs(docs: &[Json]) -> FakePush {
        let configs = docs
            .iter()
            .map(|d| Arc::new(model::config::parse_config(d.clone(), "default").expect("valid test config")))
            .collect();
        FakePush {
            configs,
            ..Default::default()
        }
    }

    pub(crate) fn with_service(mut self, service: Service) -> FakePush {
        self.services.push(Arc::new(service));
        self
    }
}

impl PushView for FakePush {
    fn mesh(&self) -> &MeshConfig {
        &self.mesh
    }

    fn domain(&self) -> &str {
        "cluster.local"
    }

    fn features(&self) -> &model::Features {
        &model::Features::ISTIO_DEFAULTS
    }

    fn service_for_host(&self, _proxy: &Proxy, host: &str) -> Option<Arc<Service>> {
        self.services.iter().find(|s| s.hostname == host).cloned()
    }

    fn with_destination_rule<R>(
        &self,
        _proxy: &Proxy,
        service: &Service,
        f: impl FnOnce(&DestinationRule) -> R,
    ) -> Option<R> {
        self.configs
            .iter()
            .find_map(|c| match &c.spec {
                ConfigSpec::DestinationRule(dr)
                    if model::host::resolve_short_name(&dr.host, &c.meta.namespace, self.domain())
                        == service.hostname =>
                {
                    Some(dr)
                }
                _ => None,
            })
            .map(f)
    }

    fn gateways_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Config>> {
        self.configs
            .iter()
            .filter(|c| match &c.spec {
                ConfigSpec::Gateway(g) => g.selector.iter().all(|(k, v)| proxy.labels.get(k) == Some(v)),
                _ => false,
            })
            .cloned()
            .collect()
    }

    fn gateway_targets(&self, _proxy: &Proxy) -> Vec<crate::lds::merged_gateway::GatewayTarget> {
        self.gateway_targets.clone()
    }

    fn scope_services(&self, _proxy: &Proxy) -> Vec<Arc<Service>> {
        self.services.clone()
    }

    fn virtual_services_for_gateway(&self, _proxy: &Proxy, gateway: &str) -> Vec<Arc<Config>> {
        self.configs
            .iter()
            .filter(|c| {
                virtual_service(c).is_some_and(|vs| {
                    vs.gateways
                        .iter()
                        .any(|g| resolve_gateway_name(g, &c.meta.namespace) == gateway)
                })
            })
            .cloned()
            .collect()
    }
}

/// A service with one HTTP port per number given.
pub(crate) fn service(hostname: &str, namespace: &str, ports: &[u16]) -> Service {
    Service {
        cluster_vips: Default::default(),
        hostname: hostname.into(),
        ports: ports
            .iter()
            .map(|p| Port {
                name: format!("http-{p}"),
                port: *p,
                protocol: Protocol::Http,
            })
            .collect(),
        addresses: Vec::new(),
        resolution: Default::default(),
        mesh_external: false,
        attributes: ServiceAttributes {
            namespace: namespace.into(),
            ..Default::default()
        },
        origin: String::new(),
    }
}

/// A request as the router sees it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) scheme: &'static str,
    pub(crate) host: String,
    pub(crate) method: &'static str,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
}

impl Request {
    pub(crate) fn get(host: &str, path: &str) -> Request {
        Request {
            scheme: "http",
            host: host.into(),
            method: "GET",
            path: path.into(),
            headers: Vec::new(),
        }
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn method(mut self, method: &'static str) -> Request {
        self.method = method;
        self
    }

    fn header_value(&self, name: &str) -> Option<String> {
        match name {
            ":method" => Some(self.method.into()),
            ":authority" => Some(self.host.clone()),
            ":scheme" => Some(self.scheme.into()),
            ":path" => Some(self.path.clone()),
            _ => self
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone()),
        }
    }
}

/// Where a request ends up.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Cluster(String),
    Weighted(Vec<(String, u32)>),
    Redirect(RedirectAction),
    Direct(u32, Option<String>),
    /// `require_tls` sent the plaintext request to https.
    TlsRedirect,
    /// No virtual host or no route: 404.
    NotFound,
}

/// The action of a route that routes (panics on redirects and direct responses).
pub(crate) fn action(r: &Route) -> &RouteAction {
    match &r.action {
        Some(route::Action::Route(a)) => a,
        other => panic!("route action expected, got {other:?}"),
    }
}

/// The virtual host and route Envoy would pick, and the outcome.
pub(crate) fn evaluate<'a>(rc: &'a RouteConfiguration, req: &Request) -> (Outcome, Option<&'a Route>) {
    let host = if rc.ignore_port_in_host_matching {
        req.host.split(':').next().unwrap_or("")
    } else {
        &req.host
    };
    let Some(vh) = select_vhost(&rc.virtual_hosts, &host.to_ascii_lowercase()) else {
        return (Outcome::NotFound, None);
    };
    if vh.require_tls == TlsRequirementType::All as i32 && req.scheme == "http" {
        return (Outcome::TlsRedirect, None);
    }
    let Some(r) = vh.routes.iter().find(|r| route_matches(r, req)) else {
        return (Outcome::NotFound, None);
    };
    let outcome = match &r.action {
        Some(route::Action::Route(a)) => match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => Outcome::Cluster(c.clone()),
            Some(route_action::ClusterSpecifier::WeightedClusters(w)) => Outcome::Weighted(
                w.clusters
                    .iter()
                    .map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value)))
                    .collect(),
            ),
            _ => Outcome::NotFound,
        },
        Some(route::Action::Redirect(r)) => Outcome::Redirect(r.clone()),
        Some(route::Action::DirectResponse(d)) => Outcome::Direct(
            d.status,
            d.body.as_ref().and_then(|b| match &b.specifier {
                Some(xds_api::envoy::config::core::v3::data_source::Specifier::InlineString(s)) => Some(s.clone()),
                _ => None,
            }),
        ),
        _ => Outcome::NotFound,
    };
    (outcome, Some(r))
}

/// Envoy's order: exact domain, then the longest suffix wildcard, then prefix wildcards, then `*`.
fn select_vhost<'a>(vhosts: &'a [VirtualHost], host: &str) -> Option<&'a VirtualHost> {
    let domains: Vec<(&str, &VirtualHost)> = vhosts
        .iter()
        .flat_map(|v| v.domains.iter().map(move |d| (d.as_str(), v)))
        .collect();
    let longest = |pred: &dyn Fn(&str) -> bool| {
        domains
            .iter()
            .filter(|(d, _)| d.len() > 1 && pred(d))
            .max_by_key(|(d, _)| d.len())
            .map(|(_, v)| *v)
    };
    domains
        .iter()
        .find(|(d, _)| *d == host)
        .map(|(_, v)| *v)
        .or_else(|| longest(&|d| d.starts_with('*') && host.len() > d.len() - 1 && host.ends_with(&d[1..])))
        .or_else(|| longest(&|d| d.ends_with('*') && host.starts_with(&d[..d.len() - 1])))
        .or_else(|| domains.iter().find(|(d, _)| *d == "*").map(|(_, v)| *v))
}

fn route_matches(r: &Route, req: &Request) -> bool {
    let Some(m) = &r.r#match else {
        return false;
    };
    let case_sensitive = m.case_sensitive.as_ref().is_none_or(|b| b.value);
    let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
    let norm = |s: &str| {
        if case_sensitive {
            s.to_owned()
        } else {
            s.to_ascii_lowercase()
        }
    };
    let path_ok = match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) => norm(path).starts_with(&norm(p)),
        Some(PathSpecifier::PathSeparatedPrefix(p)) => {
            let (path, p) = (norm(path), norm(p));
            path.strip_prefix(&p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        }
        Some(PathSpecifier::Path(p)) => norm(path) == norm(p),
        Some(PathSpecifier::SafeRegex(re)) => full_match(&re.regex, path),
        _ => false,
    };
    let query: Vec<(&str, &str)> = query
        .split('&')
        .filter(|q| !q.is_empty())
        .map(|q| q.split_once('=').unwrap_or((q, "")))
        .collect();
    let query_ok = m.query_parameters.iter().all(|q| {
        let value = query.iter().find(|(k, _)| *k == q.name).map(|(_, v)| *v);
        match (&q.query_parameter_match_specifier, value) {
            (_, None) => false,
            (Some(QueryParameterMatchSpecifier::StringMatch(sm)), Some(v)) => string_match(sm, v),
            (_, Some(_)) => true,
        }
    });
    path_ok && query_ok && m.headers.iter().all(|h| header_matches(h, req))
}

fn header_matches(h: &HeaderMatcher, req: &Request) -> bool {
    let value = req
        .header_value(&h.name)
        .or_else(|| h.treat_missing_header_as_empty.then(String::new));
    let matched = match (&h.header_match_specifier, value) {
        (_, None) => false,
        (Some(HeaderMatchSpecifier::PresentMatch(p)), Some(_)) => *p,
        (Some(HeaderMatchSpecifier::StringMatch(sm)), Some(v)) => string_match(sm, &v),
        (_, Some(_)) => false,
    };
    matched != h.invert_match
}

fn string_match(sm: &StringMatcher, v: &str) -> bool {
    match &sm.match_pattern {
        Some(MatchPattern::Exact(e)) => v == e,
        Some(MatchPattern::Prefix(p)) => v.starts_with(p.as_str()),
        Some(MatchPattern::SafeRegex(re)) => full_match(&re.regex, v),
        _ => false,
    }
}

/// RE2 full match, as Envoy's safe_regex.
fn full_match(re: &str, v: &str) -> bool {
    regex::Regex::new(&format!("^(?:{re})$"))
        .expect("valid test regex")
        .is_match(v)
}
