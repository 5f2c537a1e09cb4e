//! Test fixtures for the crates above this one (feature `testing`): a push from configs.

use std::sync::Arc;

use model::{Config, MeshConfig};
use serde_json::Value;

use crate::{PushContext, PushInput};

/// The push of these documents with Istio's default mesh config, version `v1`.
pub fn push(docs: impl IntoIterator<Item = Value>) -> PushContext {
    push_with(Arc::new(MeshConfig::default()), docs)
}

/// The push of these documents with this mesh config, version `v1`.
pub fn push_with(mesh: Arc<MeshConfig>, docs: impl IntoIterator<Item = Value>) -> PushContext {
    let configs: Vec<Arc<Config>> = docs.into_iter().map(model::testing::config).collect();
    let registry = Arc::new(registry::build(&configs, &mesh));
    PushContext::new(input(mesh, configs, registry, "v1"))
}

/// A push input of these configs and registry, domain `cluster.local`, default features.
pub fn input(
    mesh: Arc<MeshConfig>,
    configs: Vec<Arc<Config>>,
    registry: Arc<registry::RegistrySnapshot>,
    version: &str,
) -> PushInput {
    PushInput {
        mesh,
        domain: "cluster.local".into(),
        configs,
        registry,
        version: version.into(),
        features: Default::default(),
        jwks: Default::default(),
    }
}
