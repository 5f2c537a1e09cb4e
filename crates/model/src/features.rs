//! Istio's pilot feature flags (pilot/pkg/features) that change what is generated, read once from
//! the environment by pilot-discovery and carried by every push.

/// Generation switches, with Istio's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Features {
    /// `PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN` (Istio 1.27+, default true): virtual hosts also
    /// match the absolute FQDN (`reviews.default.svc.cluster.local.`).
    pub enable_absolute_fqdn_vhost_domain: bool,
    /// `PILOT_JWT_ENABLE_REMOTE_JWKS`: who fetches the JWKS of RequestAuthentication rules.
    pub jwks_fetch_mode: JwksFetchMode,
    /// `PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS` (default false): CUSTOM policies of more than
    /// one provider on a workload each get their ext_authz filter; without it they deny.
    pub enable_multiple_custom_authz_providers: bool,
    /// `PILOT_ENABLE_IP_AUTOALLOCATE` (default true): ServiceEntries without addresses get a VIP
    /// from 240.240.0.0/16 (and 2001:2::/48) for the proxies that capture DNS.
    pub enable_ip_autoallocate: bool,
    /// `PILOT_ENABLE_DELTA_VHDS` (this project's, default true; Istio has no VHDS): proxies on
    /// delta xDS get each route configuration without its virtual hosts, which come over VHDS one
    /// resource per virtual host (named `<route configuration>/<virtual host>`), so a change to one
    /// host sends that host only. Off: Istio's route configurations, virtual hosts inline.
    pub enable_delta_vhds: bool,
    /// `PILOT_HTTP10` (default false): every HTTP connection manager accepts HTTP/1.0, and the
    /// HTTP inspector's `http/1.0` is sent to the HTTP chains of sniffed ports.
    pub http10: bool,
    /// `PILOT_FILTER_GATEWAY_CLUSTER_CONFIG` (default false): gateways get clusters only for the
    /// services their VirtualServices route to (and the mesh's extension providers).
    pub filter_gateway_cluster_config: bool,
    /// `PILOT_TRACE_SAMPLING` (default 1.0 percent), in thousandths of a percent (so that the
    /// flags stay `Eq` and hashable): the random sampling of every HCM's tracing.
    pub trace_sampling_millipercent: u32,
}

/// Istio's `jwt.JwksFetchMode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum JwksFetchMode {
    /// `false`/`istiod` (default): pilot-discovery fetches the keys and inlines them; a JWKS that
    /// cannot be fetched becomes a key set nobody can sign for (tokens are rejected).
    #[default]
    Istiod,
    /// `hybrid`: Envoy fetches from the issuer's cluster when the mesh has one, else pilot-discovery.
    Hybrid,
    /// `true`/`envoy`: Envoy fetches (`remote_jwks`) through the cluster of the JWKS host.
    Envoy,
}

impl JwksFetchMode {
    /// Istio's `ConvertToJwksFetchMode`: unknown values are `istiod`.
    pub fn parse(s: &str) -> JwksFetchMode {
        match s.to_ascii_lowercase().as_str() {
            "true" | "envoy" => JwksFetchMode::Envoy,
            "hybrid" => JwksFetchMode::Hybrid,
            _ => JwksFetchMode::Istiod,
        }
    }
}

impl Features {
    pub const ISTIO_DEFAULTS: Features = Features {
        enable_absolute_fqdn_vhost_domain: true,
        jwks_fetch_mode: JwksFetchMode::Istiod,
        enable_multiple_custom_authz_providers: false,
        enable_ip_autoallocate: true,
        enable_delta_vhds: true,
        http10: false,
        filter_gateway_cluster_config: false,
        trace_sampling_millipercent: 1_000,
    };

    /// `PILOT_TRACE_SAMPLING` as a percentage.
    pub fn trace_sampling(&self) -> f64 {
        f64::from(self.trace_sampling_millipercent) / 1000.0
    }

    /// Istio's `PILOT_TRACE_SAMPLING` parsing: a percentage from 0.0 to 100.0; anything else is
    /// Istio's 1.0 (`None` says the value was refused).
    pub fn parse_trace_sampling(v: &str) -> Option<u32> {
        let p: f64 = v.trim().parse().ok()?;
        (0.0..=100.0).contains(&p).then(|| (p * 1000.0).round() as u32)
    }
}

impl Default for Features {
    fn default() -> Features {
        Features::ISTIO_DEFAULTS
    }
}
