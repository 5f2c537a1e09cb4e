//! Target `config`: one config file as a user writes it. Parsed and validated as `--configDir`
//! does; whatever passes goes into an environment, is pushed, and CDS, EDS, LDS and RDS are
//! generated for a sidecar and a gateway. Nothing a file holds may panic any of it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use config_sources::{ConfigChange, ConfigEvent, parse_documents};
use environment::{Environment, PushRequest, TriggerReason};
use model::{Config, MeshConfig};
use registry::ServiceEntries;
use serde_json::json;
use xds_api::type_url;
use xds_server::{Names, PushSnapshot, SnapshotBuilder, WatchedResource};

pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut seen = HashSet::new();
    // The store keeps one config per key (the live one); so does this.
    let configs: Vec<Arc<Config>> = parse_documents(text, Path::new("fuzz.yaml"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|c| seen.insert(c.key()))
        .map(Arc::new)
        .collect();
    if configs.is_empty() {
        return;
    }
    let mesh = Arc::new(MeshConfig::default());
    let env = Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![Box::new(ServiceEntries::new(mesh))],
    );
    let _ = env.config_changed(&ConfigChange {
        events: configs.into_iter().map(ConfigEvent::Added).collect(),
    });
    let push = env.build(&PushRequest::full(TriggerReason::ConfigUpdate));
    for proxy in [
        model::testing::proxy("sidecar", "10.0.0.9", "default", json!({"app": "productpage"})),
        model::testing::proxy(
            "router",
            "10.0.0.10",
            "istio-system",
            json!({"istio": "ingressgateway"}),
        ),
    ] {
        let all = |t: &str| WatchedResource {
            type_url: t.to_owned(),
            names: Names::default(),
            wildcard: true,
        };
        let names = |t: &str, names: Vec<String>| WatchedResource {
            type_url: t.to_owned(),
            names: names.into_iter().collect(),
            wildcard: false,
        };
        let clusters = push
            .generate(&proxy, &all(type_url::CLUSTER), false)
            .unwrap_or_default();
        let eds: Vec<String> = clusters.iter().map(|r| r.name.clone()).collect();
        let _ = push.generate(&proxy, &names(type_url::ENDPOINT, eds), false);
        let listeners = push
            .generate(&proxy, &all(type_url::LISTENER), false)
            .unwrap_or_default();
        // Route names are ports, "http.<port>" on gateways, or hosts:port: ask for the likely ones.
        let mut routes: Vec<String> = ["80", "443", "8080", "9080", "http.80", "http.8080", "http.443"]
            .map(String::from)
            .to_vec();
        routes.extend(listeners.iter().map(|r| r.name.clone()));
        let _ = push.generate(&proxy, &names(type_url::ROUTE, routes.clone()), false);
        // and as a proxy on delta xDS gets them: without virtual hosts, which come over VHDS
        let _ = push.generate(&proxy, &names(type_url::ROUTE, routes.clone()), true);
        let _ = push.generate(&proxy, &names(type_url::VIRTUAL_HOST, routes), true);
    }
}
