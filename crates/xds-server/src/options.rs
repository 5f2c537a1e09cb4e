//! The server's settings, as Istio's `PILOT_*` features (`pilot/pkg/features/tuning.go`) that its
//! `DiscoveryServer` reads: debounce, push throttle, request and subscription limits, and who may
//! ask for the debug types. Reading the environment is the binary's job (pilot-discovery's
//! `settings.rs`); here they are plain fields with Istio's defaults.

use std::time::Duration;

/// Tuning of pushes, as Istio's `PILOT_*` settings. Reading the environment is the binary's job.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// PILOT_DEBOUNCE_AFTER: the shortest time between the starts of two pushes (a change on an
    /// idle server is pushed at once; see the debouncer).
    pub debounce_after: Duration,
    /// PILOT_ENABLE_EDS_DEBOUNCE: debounce EDS-only pushes too.
    pub enable_eds_debounce: bool,
    /// PILOT_PUSH_THROTTLE: concurrent push generations.
    pub push_throttle: usize,
    /// ISTIO_GPRC_MAXRECVMSGSIZE: largest request accepted, in bytes.
    pub max_recv_msg_size: usize,
    /// PILOT_XDS_MAX_RESOURCE_NAMES: most names one stream may watch of one type (what a request
    /// names, or a delta stream's subscriptions add up to).
    pub max_resource_names: usize,
    /// ENABLE_DEBUG_ENDPOINT_AUTH: the xDS debug types (`istio.io/debug/...`) are answered to
    /// authenticated callers only; without caller identities yet, to callers on loopback.
    pub debug_endpoint_auth: bool,
    /// pilot-discovery's own namespace (`POD_NAMESPACE`): callers proven to be of it may ask for
    /// the debug types (Istio's `SystemNamespace`).
    pub system_namespace: String,
}

/// Default of `PILOT_XDS_MAX_RESOURCE_NAMES`: above the EDS clusters of the largest meshes, far
/// below what a 4 MiB request can name (a million empty names built a 77 MB response).
pub const DEFAULT_MAX_RESOURCE_NAMES: usize = 50_000;

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            debounce_after: Duration::from_millis(100),
            enable_eds_debounce: true,
            push_throttle: 100,
            max_recv_msg_size: 4 * 1024 * 1024,
            max_resource_names: DEFAULT_MAX_RESOURCE_NAMES,
            debug_endpoint_auth: true,
            system_namespace: "istio-system".into(),
        }
    }
}
