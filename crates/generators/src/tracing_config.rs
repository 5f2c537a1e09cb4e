//! HTTP connection manager tracing from the mesh config, as Istio's `configureTracingFromTelemetry`
//! when no Telemetry resource configures tracing (`pilot/pkg/networking/core/tracing.go`): with
//! meshConfig `enableTracing` (Istio's default), every HCM samples `PILOT_TRACE_SAMPLING` percent
//! of requests (or `defaultConfig.tracing.sampling`), traces every client-forced one, and tags
//! spans with Istio's service tags (`istio.canonical_service`, `istio.canonical_revision`,
//! `istio.mesh_id`, `istio.namespace`, `istio.cluster_id`), the dry-run authorization results and
//! `defaultConfig.tracing.customTags`. Spans go to the tracer of the proxy's bootstrap.

use model::{Features, MeshConfig, Proxy};
use serde_json::Value as Json;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use xds_api::envoy::r#type::metadata::v3::{MetadataKey, MetadataKind, metadata_key, metadata_kind};
use xds_api::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use xds_api::envoy::r#type::v3::Percent;

/// Labels and metadata the service tags read from a proxy (its LDS cache key holds them).
pub(crate) const CANONICAL_NAME_LABEL: &str = "service.istio.io/canonical-name";
pub(crate) const CANONICAL_REVISION_LABEL: &str = "service.istio.io/canonical-revision";

/// The tracing block of every HCM of `proxy`, `None` when the mesh turns tracing off.
pub(crate) fn hcm_tracing(mesh: &MeshConfig, features: &Features, proxy: &Proxy) -> Option<Tracing> {
    if !mesh.enable_tracing {
        return None;
    }
    let config = mesh.default_config.tracing.as_ref();
    let field = |name: &str| config.and_then(|t| t.get(name));
    // Istio's `proxyConfigSamplingValue`: the ProxyConfig's sampling when set (above 100: 1%)
    let sampling = match field("sampling").and_then(Json::as_f64).filter(|s| *s != 0.0) {
        Some(s) if s > 100.0 => 1.0,
        Some(s) => s,
        None => features.trace_sampling(),
    };
    let percent = |value: f64| Some(Percent { value });
    let mut tags = Vec::new();
    if field("enableIstioTags").and_then(Json::as_bool).unwrap_or(true) {
        tags.extend(service_tags(proxy));
        tags.extend(dry_run_tags());
    }
    if let Some(Json::Object(custom)) = field("customTags") {
        tags.extend(custom.iter().filter_map(|(name, tag)| custom_tag(name, tag)));
    }
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    Some(Tracing {
        client_sampling: percent(100.0),
        random_sampling: percent(sampling),
        overall_sampling: percent(100.0),
        custom_tags: tags,
        max_path_tag_length: field("maxPathTagLength")
            .and_then(Json::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v != 0)
            .map(|value| xds_api::pbwkt::UInt32Value { value }),
        ..Default::default()
    })
}

fn literal(tag: &str, value: &str) -> CustomTag {
    CustomTag {
        tag: tag.to_owned(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal {
            value: value.to_owned(),
        })),
    }
}

/// Istio's `buildServiceTags`.
fn service_tags(proxy: &Proxy) -> [CustomTag; 5] {
    let label = |k: &str, default: &str| proxy.labels.get(k).cloned().unwrap_or_else(|| default.to_owned());
    let md = &proxy.metadata;
    [
        literal("istio.canonical_revision", &label(CANONICAL_REVISION_LABEL, "latest")),
        literal("istio.canonical_service", &label(CANONICAL_NAME_LABEL, "unknown")),
        literal("istio.mesh_id", md.mesh_id.as_deref().unwrap_or("unknown")),
        literal("istio.namespace", md.namespace.as_deref().unwrap_or("default")),
        literal("istio.cluster_id", md.cluster_id.as_deref().unwrap_or("unknown")),
    ]
}

/// Istio's `optionalPolicyTags`: the shadow RBAC results of dry-run AuthorizationPolicies.
fn dry_run_tags() -> [CustomTag; 4] {
    let tag = |name: &str, key: &str| CustomTag {
        tag: name.to_owned(),
        r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Request(metadata_kind::Request {})),
            }),
            metadata_key: Some(MetadataKey {
                key: "envoy.filters.http.rbac".into(),
                path: vec![metadata_key::PathSegment {
                    segment: Some(metadata_key::path_segment::Segment::Key(key.to_owned())),
                }],
            }),
            ..Default::default()
        })),
    };
    [
        tag(
            "istio.authorization.dry_run.allow_policy.name",
            "istio_dry_run_allow_shadow_effective_policy_id",
        ),
        tag(
            "istio.authorization.dry_run.allow_policy.result",
            "istio_dry_run_allow_shadow_engine_result",
        ),
        tag(
            "istio.authorization.dry_run.deny_policy.name",
            "istio_dry_run_deny_shadow_effective_policy_id",
        ),
        tag(
            "istio.authorization.dry_run.deny_policy.result",
            "istio_dry_run_deny_shadow_engine_result",
        ),
    ]
}

/// Istio's `buildCustomTagsFromProxyConfig`: `literal`, `environment` or `header` tags; anything
/// else is left out.
fn custom_tag(name: &str, tag: &Json) -> Option<CustomTag> {
    let s = |v: &Json, k: &str| v.get(k).and_then(Json::as_str).unwrap_or_default().to_owned();
    let t = if let Some(l) = tag.get("literal") {
        custom_tag::Type::Literal(custom_tag::Literal { value: s(l, "value") })
    } else if let Some(e) = tag.get("environment") {
        custom_tag::Type::Environment(custom_tag::Environment {
            name: s(e, "name"),
            default_value: s(e, "defaultValue"),
        })
    } else if let Some(h) = tag.get("header") {
        custom_tag::Type::RequestHeader(custom_tag::Header {
            name: s(h, "name"),
            default_value: s(h, "defaultValue"),
        })
    } else {
        tracing::debug!(tag = name, "custom tag of an unknown kind left out");
        return None;
    };
    Some(CustomTag {
        tag: name.to_owned(),
        r#type: Some(t),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(t: &Tracing) -> Vec<&str> {
        t.custom_tags.iter().map(|t| t.tag.as_str()).collect()
    }

    #[test]
    fn istio_defaults_sample_one_percent_with_service_and_dry_run_tags() {
        let proxy = crate::testing::node(
            "sidecar",
            "10.0.0.9",
            "bookinfo",
            "bookinfo",
            json!({"LABELS": {"service.istio.io/canonical-name": "reviews"}, "MESH_ID": "mesh1", "CLUSTER_ID": "c1"}),
        );
        let t = hcm_tracing(&MeshConfig::default(), &Features::default(), &proxy).unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 1.0, "PILOT_TRACE_SAMPLING's default");
        assert_eq!(t.client_sampling.unwrap().value, 100.0);
        assert_eq!(t.overall_sampling.unwrap().value, 100.0);
        assert_eq!(
            names(&t),
            [
                "istio.authorization.dry_run.allow_policy.name",
                "istio.authorization.dry_run.allow_policy.result",
                "istio.authorization.dry_run.deny_policy.name",
                "istio.authorization.dry_run.deny_policy.result",
                "istio.canonical_revision",
                "istio.canonical_service",
                "istio.cluster_id",
                "istio.mesh_id",
                "istio.namespace",
            ]
        );
        let literal = |name: &str| match &t.custom_tags.iter().find(|c| c.tag == name).unwrap().r#type {
            Some(custom_tag::Type::Literal(l)) => l.value.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(literal("istio.canonical_service"), "reviews");
        assert_eq!(literal("istio.canonical_revision"), "latest");
        assert_eq!(literal("istio.namespace"), "bookinfo");
        assert_eq!(literal("istio.mesh_id"), "mesh1");
    }

    #[test]
    fn the_flag_then_the_proxy_config_set_sampling_and_tags() {
        let proxy = crate::testing::sidecar("default");
        let features = Features {
            trace_sampling_millipercent: 25_500,
            ..Default::default()
        };
        let t = hcm_tracing(&MeshConfig::default(), &features, &proxy).unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 25.5);

        let mut mesh = MeshConfig::default();
        mesh.default_config.tracing = Some(json!({
            "sampling": 150.0, "enableIstioTags": false, "maxPathTagLength": 99,
            "customTags": {"env": {"environment": {"name": "POD", "defaultValue": "x"}},
                           "hdr": {"header": {"name": "x-user"}}, "lit": {"literal": {"value": "v"}}}
        }));
        let t = hcm_tracing(&mesh, &features, &proxy).unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 1.0, "above 100 is Istio's 1%");
        assert_eq!(names(&t), ["env", "hdr", "lit"]);
        assert_eq!(t.max_path_tag_length.unwrap().value, 99);

        mesh.enable_tracing = false;
        assert!(hcm_tracing(&mesh, &features, &proxy).is_none());
    }
}
