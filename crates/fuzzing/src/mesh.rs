//! The mesh the xDS targets serve: the bookinfo example, as pilot-discovery would load it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use config_sources::{ConfigChange, ConfigEvent, parse_documents};
use environment::Environment;
use model::MeshConfig;
use prometheus_client::registry::Registry;
use registry::ServiceEntries;
use xds_server::{DiscoveryServer, ServerOptions};

pub(crate) const BOOKINFO: &[&str] = &[
    include_str!("../../../examples/bookinfo/services.yaml"),
    include_str!("../../../examples/bookinfo/destination-rules.yaml"),
    include_str!("../../../examples/bookinfo/virtual-services.yaml"),
    include_str!("../../../examples/bookinfo/gateway.yaml"),
];

/// A started, ready discovery server on the bookinfo example. Panics when the example does not
/// load: the targets are worthless without it.
pub(crate) async fn discovery_server() -> Arc<DiscoveryServer<Environment>> {
    let mesh = Arc::new(MeshConfig::default());
    let env = Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![Box::new(ServiceEntries::new(mesh))],
    );
    let mut events = Vec::new();
    for text in BOOKINFO {
        for c in parse_documents(text, Path::new("bookinfo.yaml")) {
            match c {
                Ok(c) => events.push(ConfigEvent::Added(Arc::new(c))),
                Err(e) => panic!("examples/bookinfo does not load: {e}"),
            }
        }
    }
    let _ = env.config_changed(&ConfigChange { events });
    let opts = ServerOptions {
        debounce_after: Duration::from_millis(1),
        enable_eds_debounce: false,
        push_throttle: 10,
        max_recv_msg_size: 4 << 20,
        max_resource_names: xds_server::DEFAULT_MAX_RESOURCE_NAMES,
        debug_endpoint_auth: true,
        ..Default::default()
    };
    let server = DiscoveryServer::new(Arc::new(env), opts, &mut Registry::default());
    server.start();
    while !server.ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server
}
