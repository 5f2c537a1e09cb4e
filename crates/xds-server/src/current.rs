//! What one connected proxy would be sent now: the resources of the current push for each type,
//! as the proxy watches them. One answer for every view of it: the xDS `istio.io/debug/config_dump`
//! (istioctl), the HTTP `/debug/config_dump`, and the tracing of NACKs to configs.

use std::sync::Arc;

use xds_api::Resource;

use crate::snapshot::{PushSnapshot, SnapshotBuilder};
use crate::state::ServerState;
use crate::watched::WatchedResource;

/// A proxy's current resources, per type in the order asked.
#[derive(Debug)]
pub struct CurrentResources {
    /// The push version they come from.
    pub version: String,
    pub by_type: Vec<(String, Vec<Resource>)>,
}

impl CurrentResources {
    /// The resources of `type_url` (none if it was not asked for).
    pub fn of(&self, type_url: &str) -> &[Resource] {
        self.by_type
            .iter()
            .find(|(t, _)| t == type_url)
            .map_or(&[], |(_, r)| r.as_slice())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CurrentResourcesError {
    #[error("proxy {0:?} is not connected")]
    NotConnected(String),
    #[error("no push context yet")]
    NoPush,
    #[error("generating {type_url} for {proxy}: {message}")]
    Generate {
        proxy: String,
        type_url: String,
        message: String,
    },
}

impl<B: SnapshotBuilder> ServerState<B> {
    /// The resources of `types` that the proxy `proxy_id` (connection ID, node ID or
    /// `pod.namespace`) would be sent now: the names it watches, or every resource of a type it
    /// watches by wildcard or does not watch at all.
    pub(crate) fn current_resources(
        &self,
        proxy_id: &str,
        types: &[&str],
    ) -> Result<CurrentResources, CurrentResourcesError> {
        let (proxy, status) = self
            .find_proxy(proxy_id)
            .ok_or_else(|| CurrentResourcesError::NotConnected(proxy_id.to_owned()))?;
        let snapshot = self.current_snapshot().ok_or(CurrentResourcesError::NoPush)?;
        let mut by_type = Vec::with_capacity(types.len());
        for &t in types {
            let watched = match status.watched.get(t) {
                Some(w) => WatchedResource {
                    type_url: t.to_owned(),
                    names: w.names.iter().map(|n| Arc::from(n.as_str())).collect(),
                    wildcard: w.wildcard,
                },
                None => WatchedResource {
                    type_url: t.to_owned(),
                    names: Default::default(),
                    wildcard: true,
                },
            };
            // The route configurations as Envoy merges them (virtual hosts inline, VHDS or not).
            let resources = snapshot
                .generate(&proxy, &watched, false)
                .map_err(|e| CurrentResourcesError::Generate {
                    proxy: status.node_id.clone(),
                    type_url: t.to_owned(),
                    message: e.to_string(),
                })?
                .into_iter()
                .filter(|r| watched.covers(&r.name))
                .collect();
            by_type.push((t.to_owned(), resources));
        }
        Ok(CurrentResources {
            version: snapshot.version().to_owned(),
            by_type,
        })
    }
}
