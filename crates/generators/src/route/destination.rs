//! Route actions of an Istio `HTTPRoute`: forwarding to destinations (`applyHTTPRouteDestination`,
//! `GetDestinationCluster`), redirects (`ApplyRedirect`) and direct responses (`ApplyDirectResponse`).

use model::Service;
use model::networking::{Destination, HttpBody, HttpDirectResponse, HttpRedirect, HttpRoute, HttpRouteDestination};
use xds_api::envoy::config::core::v3::{DataSource, data_source};
use xds_api::envoy::config::route::v3::{
    DirectResponseAction, RedirectAction, Route, RouteAction, WeightedCluster, redirect_action, route_action,
    weighted_cluster,
};
use xds_api::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;
use xds_api::pbwkt::{BoolValue, UInt32Value};

use super::{PushView, RouteContext, hash, matching, policy};
use crate::names::{TrafficDirection, subset_key};
use crate::proxy_headers::{ListenerClass, ProxyHeaders};

/// Cluster name Istio uses when a destination has no host.
pub(crate) const UNKNOWN_SERVICE: &str = "UnknownService";

/// `GetDestinationCluster`: `outbound|<port>|<subset>|<host>`, the port being the destination's,
/// else the service's only port, else the listener port (also for unknown services).
pub(crate) fn destination_cluster(
    destination: &Destination,
    host: &str,
    service: Option<&Service>,
    listen_port: u32,
) -> String {
    if host.is_empty() {
        return UNKNOWN_SERVICE.to_owned();
    }
    let port = match (&destination.port, service) {
        (Some(p), _) => p.number,
        (None, Some(svc)) if svc.ports.len() == 1 => u32::from(svc.ports[0].port),
        _ => listen_port,
    };
    subset_key(
        TrafficDirection::Outbound,
        &destination.subset,
        host,
        u16::try_from(port).unwrap_or(0),
    )
}

/// `applyHTTPRouteDestination`: cluster or weighted clusters, timeout, rewrite, mirrors, retries
/// and hash policy. Destination-level headers of a single destination go on `out` (the route).
/// `None` when the rule has no usable destination (Envoy would reject the route).
pub(crate) fn route_action<P: PushView>(
    ctx: &RouteContext<'_, P>,
    http: &HttpRoute,
    out: &mut Route,
    authority: String,
) -> Option<RouteAction> {
    let mut action = RouteAction::default();
    let timeout = policy::parse_duration(http.timeout.as_deref()).unwrap_or_default();
    // a zero timeout disables both; gRPC's grpc-timeout header is honoured up to the route timeout.
    // Istio keeps the deprecated field: max_stream_duration had regressions.
    #[allow(deprecated)]
    {
        action.max_grpc_timeout = Some(timeout);
    }
    action.timeout = Some(timeout);

    rewrite(ctx, http, &mut action, authority);
    mirrors(ctx, http, &mut action);
    let consistent_hash = match http.route.as_slice() {
        [] => return None,
        [single] => single_destination(ctx, single, &mut action, out),
        many => weighted_destinations(ctx, many, &mut action)?,
    };
    let retries = http
        .retries
        .as_ref()
        .or(ctx.push.mesh().default_http_retry_policy.as_ref());
    action.retry_policy = policy::retry_policy(retries, consistent_hash);
    Some(action)
}

/// The route's rewrite (URI prefix or regex, authority) and the authority it sends.
fn rewrite<P: PushView>(ctx: &RouteContext<'_, P>, http: &HttpRoute, action: &mut RouteAction, mut authority: String) {
    if let Some(rewrite) = &http.rewrite {
        action.append_x_forwarded_host =
            ProxyHeaders::of(ctx.proxy, ctx.push.mesh(), ListenerClass::SidecarOutbound).x_forwarded_host;
        if let Some(regex) = &rewrite.uri_regex_rewrite {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(matching::regex_matcher(&regex.match_)),
                substitution: regex.rewrite.clone(),
            });
        } else if !rewrite.uri.is_empty() {
            action.prefix_rewrite = rewrite.uri.clone();
        }
        if !rewrite.authority.is_empty() {
            authority = rewrite.authority.clone();
        }
    }
    if !authority.is_empty() {
        action.host_rewrite_specifier = Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(authority));
    }
}

/// `mirror` with `mirrorPercentage` (or the deprecated `mirrorPercent`), then `mirrors`.
fn mirrors<P: PushView>(ctx: &RouteContext<'_, P>, http: &HttpRoute, action: &mut RouteAction) {
    let mirrors = http
        .mirror
        .iter()
        .filter_map(|m| {
            Some((
                m,
                policy::mirror_fraction(http.mirror_percentage.as_ref(), http.mirror_percent)?,
            ))
        })
        .chain(
            http.mirrors
                .iter()
                .filter_map(|m| Some((&m.destination, policy::mirror_fraction(m.percentage.as_ref(), None)?))),
        );
    for (mirror, fraction) in mirrors {
        let host = ctx.resolve_host(&mirror.host);
        let service = ctx.service(&host);
        action.request_mirror_policies.push(route_action::RequestMirrorPolicy {
            cluster: destination_cluster(mirror, &host, service.as_deref(), ctx.listen_port),
            runtime_fraction: Some(fraction),
            trace_sampled: Some(BoolValue { value: false }),
            ..Default::default()
        });
    }
}

/// One destination: its cluster, its headers on the route, its hash policy. Whether the
/// destination hashes consistently (retries then keep the host).
fn single_destination<P: PushView>(
    ctx: &RouteContext<'_, P>,
    single: &HttpRouteDestination,
    action: &mut RouteAction,
    out: &mut Route,
) -> bool {
    let host = ctx.resolve_host(&single.destination.host);
    let service = ctx.service(&host);
    let cluster = destination_cluster(&single.destination, &host, service.as_deref(), ctx.listen_port);
    action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(cluster));
    if let Some(headers) = &single.headers {
        let ops = policy::translate_headers(headers);
        out.request_headers_to_add.extend(ops.request_headers_to_add);
        out.request_headers_to_remove.extend(ops.request_headers_to_remove);
        out.response_headers_to_add.extend(ops.response_headers_to_add);
        out.response_headers_to_remove.extend(ops.response_headers_to_remove);
        // the route-level rewrite wins, as Istio (consistent with weighted destinations)
        if !ops.authority.is_empty() && action.host_rewrite_specifier.is_none() {
            action.host_rewrite_specifier = Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(ops.authority));
        }
    }
    match destination_hash(ctx, &single.destination, service.as_deref()) {
        Some(h) => {
            action.hash_policy.extend(hash::hash_policy(&h));
            true
        }
        None => false,
    }
}

/// Weighted clusters (destinations of weight 0 left out; `None` when none is left), each with
/// its headers; the hash policies of all. Never consistent-hash for retries, as Istio.
fn weighted_destinations<P: PushView>(
    ctx: &RouteContext<'_, P>,
    many: &[HttpRouteDestination],
    action: &mut RouteAction,
) -> Option<bool> {
    let mut clusters = Vec::with_capacity(many.len());
    for dst in many.iter().filter(|d| d.weight > 0) {
        let host = ctx.resolve_host(&dst.destination.host);
        let service = ctx.service(&host);
        let mut cw = weighted_cluster::ClusterWeight {
            name: destination_cluster(&dst.destination, &host, service.as_deref(), ctx.listen_port),
            weight: Some(UInt32Value {
                value: dst.weight as u32,
            }),
            ..Default::default()
        };
        if let Some(headers) = &dst.headers {
            let ops = policy::translate_headers(headers);
            cw.request_headers_to_add = ops.request_headers_to_add;
            cw.request_headers_to_remove = ops.request_headers_to_remove;
            cw.response_headers_to_add = ops.response_headers_to_add;
            cw.response_headers_to_remove = ops.response_headers_to_remove;
            if !ops.authority.is_empty() {
                cw.host_rewrite_specifier =
                    Some(weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(ops.authority));
            }
        }
        if let Some(h) = destination_hash(ctx, &dst.destination, service.as_deref()) {
            action.hash_policy.extend(hash::hash_policy(&h));
        }
        clusters.push(cw);
    }
    if clusters.is_empty() {
        return None;
    }
    // no total_weight: deprecated in v3, Envoy uses the sum of the weights
    action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
        clusters,
        ..Default::default()
    }));
    Some(false)
}

/// The consistent hash the destination's DestinationRule asks for, if any.
fn destination_hash<P: PushView>(
    ctx: &RouteContext<'_, P>,
    destination: &Destination,
    service: Option<&Service>,
) -> Option<model::networking::ConsistentHashLb> {
    let service = service?;
    ctx.push
        .with_destination_rule(ctx.proxy, service, |rule| {
            hash::consistent_hash_for_destination(rule, destination)
        })
        .flatten()
}

/// `ApplyRedirect`; `None` for a redirect code Envoy cannot send (the route is then dropped).
pub(crate) fn redirect_action(redirect: &HttpRedirect, listen_port: u32, is_tls: bool) -> Option<RedirectAction> {
    use redirect_action::RedirectResponseCode as Code;
    let response_code = match redirect.redirect_code {
        0 | 301 => Code::MovedPermanently,
        302 => Code::Found,
        303 => Code::SeeOther,
        307 => Code::TemporaryRedirect,
        308 => Code::PermanentRedirect,
        other => {
            tracing::warn!("redirect code {other} is not supported; route dropped");
            return None;
        }
    };
    let mut out = RedirectAction {
        host_redirect: redirect.authority.clone(),
        // Istio's `ApplyRedirect`: the prefix rewrite if set, else the whole path.
        path_rewrite_specifier: Some(if redirect.prefix_rewrite.is_empty() {
            redirect_action::PathRewriteSpecifier::PathRedirect(redirect.uri.clone())
        } else {
            redirect_action::PathRewriteSpecifier::PrefixRewrite(redirect.prefix_rewrite.clone())
        }),
        response_code: response_code as i32,
        ..Default::default()
    };
    if !redirect.scheme.is_empty() {
        out.scheme_rewrite_specifier = Some(redirect_action::SchemeRewriteSpecifier::SchemeRedirect(
            redirect.scheme.clone(),
        ));
    }
    if redirect.port.is_some() || redirect.derive_port.is_some() {
        out.port_redirect = match (redirect.port, redirect.derive_port.as_deref()) {
            (Some(p), _) => p,
            // Envoy cannot derive the port, but routes are built per listener port
            (None, Some("FROM_REQUEST_PORT")) => listen_port,
            // FROM_PROTOCOL_DEFAULT is Envoy's behaviour without a port
            _ => 0,
        };
        let scheme = match redirect.scheme.as_str() {
            "" if is_tls => "https",
            "" => "http",
            s => s,
        };
        // no explicit :80 or :443 for http and https
        if (out.port_redirect == 80 && scheme == "http") || (out.port_redirect == 443 && scheme == "https") {
            out.port_redirect = 0;
        }
    }
    Some(out)
}

/// `ApplyDirectResponse`: status and an inline body (string, or base64 bytes).
pub(crate) fn direct_response_action(direct: &HttpDirectResponse) -> DirectResponseAction {
    let body = direct.body.as_ref().map(|b| {
        let specifier = match b {
            HttpBody::String(s) => data_source::Specifier::InlineString(s.clone()),
            HttpBody::Bytes(b64) => data_source::Specifier::InlineBytes(decode_base64(b64).unwrap_or_else(|| {
                tracing::warn!("directResponse body bytes are not valid base64; sent as written");
                b64.as_bytes().to_vec()
            })),
        };
        DataSource {
            specifier: Some(specifier),
            ..Default::default()
        }
    });
    DirectResponseAction {
        status: direct.status,
        body,
        body_format: None,
    }
}

/// Standard base64 (with or without padding), as protobuf JSON encodes `bytes`.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    }
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        out.extend_from_slice(&acc.to_be_bytes()[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::networking::PortSelector;
    use model::{Port, Protocol};

    fn svc(ports: &[u16]) -> Service {
        let mut s = crate::route::testing::service("r.ns.svc.cluster.local", "ns", &[]);
        s.ports = ports
            .iter()
            .map(|p| Port {
                name: format!("http-{p}"),
                port: *p,
                protocol: Protocol::Http,
            })
            .collect();
        s
    }

    #[test]
    fn destination_cluster_port_rules() {
        let d = |port: Option<u32>, subset: &str| Destination {
            host: "r.ns.svc.cluster.local".into(),
            subset: subset.into(),
            port: port.map(|number| PortSelector { number }),
        };
        let host = "r.ns.svc.cluster.local";
        assert_eq!(
            destination_cluster(&d(Some(9080), "v1"), host, None, 80),
            "outbound|9080|v1|r.ns.svc.cluster.local"
        );
        assert_eq!(
            destination_cluster(&d(None, ""), host, Some(&svc(&[8000])), 80),
            "outbound|8000||r.ns.svc.cluster.local"
        );
        assert_eq!(
            destination_cluster(&d(None, ""), host, Some(&svc(&[1, 2])), 80),
            "outbound|80||r.ns.svc.cluster.local"
        );
        assert_eq!(
            destination_cluster(&d(None, ""), host, None, 443),
            "outbound|443||r.ns.svc.cluster.local"
        );
        assert_eq!(destination_cluster(&d(None, ""), "", None, 443), UNKNOWN_SERVICE);
    }

    /// `prefixRewrite` replaces the matched prefix instead of the whole path (Istio's `ApplyRedirect`).
    #[test]
    fn redirect_prefix_rewrite() {
        let r = HttpRedirect {
            prefix_rewrite: "/v2/".into(),
            ..Default::default()
        };
        let a = redirect_action(&r, 80, false).unwrap();
        assert_eq!(
            a.path_rewrite_specifier,
            Some(redirect_action::PathRewriteSpecifier::PrefixRewrite("/v2/".into()))
        );
    }

    #[test]
    fn redirect_ports_and_codes() {
        let r = HttpRedirect {
            uri: "/new".into(),
            port: Some(443),
            scheme: "https".into(),
            ..Default::default()
        };
        let a = redirect_action(&r, 80, false).unwrap();
        assert_eq!(a.port_redirect, 0);
        assert_eq!(
            a.response_code,
            redirect_action::RedirectResponseCode::MovedPermanently as i32
        );
        let derived = HttpRedirect {
            derive_port: Some("FROM_REQUEST_PORT".into()),
            ..Default::default()
        };
        assert_eq!(redirect_action(&derived, 8080, false).unwrap().port_redirect, 8080);
        assert_eq!(
            redirect_action(
                &HttpRedirect {
                    redirect_code: 399,
                    ..Default::default()
                },
                80,
                false
            ),
            None
        );
    }

    #[test]
    fn base64_bodies() {
        assert_eq!(decode_base64("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_base64("a$"), None);
    }
}
