//! Istio's pilot feature flags (pilot/pkg/features) that change what is generated, read once from
//! the environment by pilot-discovery and carried by every push.

/// Generation switches, with Istio's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Features {
    /// `PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN` (Istio 1.27+, default true): virtual hosts also
    /// match the absolute FQDN (`reviews.default.svc.cluster.local.`).
    pub enable_absolute_fqdn_vhost_domain: bool,
}

impl Features {
    pub const ISTIO_DEFAULTS: Features = Features {
        enable_absolute_fqdn_vhost_domain: true,
    };
}

impl Default for Features {
    fn default() -> Features {
        Features::ISTIO_DEFAULTS
    }
}
