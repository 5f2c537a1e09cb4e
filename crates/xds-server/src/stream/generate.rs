//! Generation for one stream, as Istio's `pushXds` calling its generator (`pilot/pkg/xds/xdsgen.go`):
//! the watches a push or an answer covers, generated from the push snapshot in the blocking pool,
//! limited to the names each watch covers, with each resource's version for delta.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xds_api::type_url;

use crate::snapshot::PushSnapshot;
use crate::watched::{Version, WatchedResource};
use crate::{GenerateError, Proxy, Resource};

/// The resources generated for one watch.
pub(crate) struct Generated {
    pub watched: WatchedResource,
    pub resources: Result<Vec<Resource>, GenerateError>,
    /// Delta only: the version of each resource (a hash of its bytes, computed once per shared
    /// resource, shared with it), same order.
    pub versions: Vec<Version>,
    pub elapsed: Duration,
}

/// Generates `targets` in the blocking pool, so a large generation never stalls the runtime.
/// Resources of non-wildcard types are limited to the watched names.
pub(crate) async fn generate<S: PushSnapshot>(
    snapshot: Arc<S>,
    proxy: Arc<Proxy>,
    targets: Vec<WatchedResource>,
    delta: bool,
) -> Vec<Generated> {
    let work = move || {
        targets
            .into_iter()
            .map(|watched| {
                let t0 = Instant::now();
                let resources = snapshot.generate(&proxy, &watched, delta).map(|mut rs| {
                    if !watched.wildcard {
                        rs.retain(|r| watched.covers(&r.name));
                    }
                    rs
                });
                let versions = match (&resources, delta) {
                    (Ok(rs), true) => rs
                        .iter()
                        .map(|r| {
                            r.version();
                            r.version.clone()
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                Generated {
                    watched,
                    resources,
                    versions,
                    elapsed: t0.elapsed(),
                }
            })
            .collect()
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("xDS generation panicked: {e}");
            Vec::new()
        }
    }
}

/// Logs why nothing was sent for a type: a type the generators do not serve (e.g. a proxy asking
/// for SDS) at debug, as it repeats on every push; a failure at warn.
pub(crate) fn log_generate_error(conn_id: &str, t: &str, e: &GenerateError) {
    match e {
        GenerateError::UnsupportedType { .. } => {
            tracing::debug!("ADS:{}: {conn_id} nothing sent: {e}", type_url::short(t))
        }
        GenerateError::Failed { .. } => tracing::warn!("ADS:{}: {conn_id} nothing sent: {e}", type_url::short(t)),
    }
}
