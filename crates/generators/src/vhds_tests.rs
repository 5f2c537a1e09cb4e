//! VHDS: a route configuration split for VHDS is the inline one, taken apart; a change to one
//! service's VirtualService changes that service's virtual host only.

use prost::Message;
use serde_json::json;
use xds_api::Resource;
use xds_api::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::type_url;

use crate::generate::{PushCache, generate_with_vhds};
use crate::testing::{push, service_entry, sidecar, virtual_service};

fn service(name: &str) -> serde_json::Value {
    service_entry(
        name,
        "default",
        json!({
            "hosts": [format!("{name}.default.svc.cluster.local")], "addresses": ["240.0.0.1"],
            "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": "10.1.0.1"}]
        }),
    )
}

fn mesh(reviews_timeout: &str) -> Vec<serde_json::Value> {
    vec![
        service("reviews"),
        service("ratings"),
        virtual_service(
            "reviews",
            "default",
            json!({"hosts": ["reviews.default.svc.cluster.local"],
                   "http": [{"timeout": reviews_timeout,
                             "route": [{"destination": {"host": "reviews.default.svc.cluster.local"}}]}]}),
        ),
    ]
}

fn generate(docs: Vec<serde_json::Value>, t: &str, vhds: bool) -> Vec<Resource> {
    let p = push(docs);
    let names = ["9080".to_owned()];
    generate_with_vhds(&p, &PushCache::default(), &sidecar("default"), t, &names, vhds).unwrap()
}

fn route_config(r: &Resource) -> RouteConfiguration {
    RouteConfiguration::decode(r.resource.value.as_slice()).unwrap()
}

#[test]
fn the_split_route_configuration_is_the_inline_one_taken_apart() {
    let inline = route_config(&generate(mesh("5s"), type_url::ROUTE, false)[0]);
    let [config] = &generate(mesh("5s"), type_url::ROUTE, true)[..] else {
        panic!("one route configuration");
    };
    let config = route_config(config);
    assert!(config.virtual_hosts.is_empty());
    let source = config.vhds.as_ref().and_then(|v| v.config_source.as_ref()).unwrap();
    assert!(matches!(
        source.config_source_specifier,
        Some(ConfigSourceSpecifier::Ads(_))
    ));
    assert_eq!(source.resource_api_version, 2, "V3");
    // everything but the hosts (and the pointer to VHDS) is the inline configuration's
    assert_eq!(
        RouteConfiguration {
            virtual_hosts: inline.virtual_hosts.clone(),
            vhds: None,
            ..config
        },
        inline
    );

    let hosts = generate(mesh("5s"), type_url::VIRTUAL_HOST, true);
    assert_eq!(hosts.len(), inline.virtual_hosts.len());
    assert!(hosts.len() >= 2, "{hosts:?}");
    for (resource, inline) in hosts.iter().zip(&inline.virtual_hosts) {
        assert_eq!(resource.resource.type_url, type_url::VIRTUAL_HOST);
        let host = VirtualHost::decode(resource.resource.value.as_slice()).unwrap();
        // Envoy removes a VHDS host by resource name and keys it by its own name: the same
        assert_eq!(resource.name, format!("9080/{}", inline.name));
        assert_eq!(host.name, resource.name);
        assert_eq!(
            VirtualHost {
                name: inline.name.clone(),
                ..host
            },
            *inline
        );
    }
}

#[test]
fn a_virtual_service_change_changes_its_host_only() {
    let before = generate(mesh("5s"), type_url::VIRTUAL_HOST, true);
    let after = generate(mesh("7s"), type_url::VIRTUAL_HOST, true);
    let changed: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| {
            assert_eq!(b.name, a.name);
            b.version() != a.version()
        })
        .map(|(b, _)| b.name.as_str())
        .collect();
    assert_eq!(changed, ["9080/reviews.default.svc.cluster.local:9080"]);
    // and the route configuration itself not at all
    let config = |docs| generate(docs, type_url::ROUTE, true)[0].version().to_owned();
    assert_eq!(config(mesh("5s")), config(mesh("7s")));
}
