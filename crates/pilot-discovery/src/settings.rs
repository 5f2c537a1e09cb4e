//! Istio's environment settings for pilot (`PILOT_DEBOUNCE_AFTER`, ...), read through a lookup
//! function so tests pass a map instead of the process environment.

use std::time::Duration;

/// Settings read from the environment, with Istio's defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Settings {
    /// PILOT_DEBOUNCE_AFTER: the shortest time between the starts of two pushes. Istio waits this
    /// long without a change before every push; here a change on an idle server is pushed at once
    /// and only changes within this of the last push wait (see `xds_server`'s debouncer).
    pub debounce_after: Duration,
    /// PILOT_ENABLE_EDS_DEBOUNCE: debounce endpoint-only changes too.
    pub enable_eds_debounce: bool,
    /// PILOT_PUSH_THROTTLE: concurrent pushes.
    pub push_throttle: usize,
    /// ISTIO_GPRC_MAXRECVMSGSIZE: largest xDS request, in bytes (Istio: 4 MiB).
    pub max_recv_msg_size: usize,
    /// ISTIO_GPRC_MAXSTREAMS: concurrent gRPC streams per connection (Istio: 100000; here 100,
    /// as one Envoy or agent opens one ADS stream).
    pub max_streams: u32,
    /// PILOT_XDS_MAX_RESOURCE_NAMES: most names one stream may watch of one type (no Istio
    /// equivalent; default `xds_server::DEFAULT_MAX_RESOURCE_NAMES`, 50000).
    pub max_resource_names: usize,
    /// ENABLE_DEBUG_ENDPOINT_AUTH: `/debug/*` only from loopback until callers can authenticate.
    pub enable_debug_endpoint_auth: bool,
    /// POD_NAMESPACE: istiod's own namespace.
    pub pod_namespace: String,
    /// `PILOT_REMOTE_CLUSTER_TIMEOUT` (30s): how long start-up waits for a remote cluster's
    /// initial lists before it goes on without them; 0 waits without bound.
    pub remote_cluster_timeout: Duration,
    /// `PILOT_MULTICLUSTER_KUBECONFIG_PATH`: a directory of remote kubeconfigs read instead of
    /// the remote secrets.
    pub multicluster_kubeconfig_path: String,
    /// POD_NAME: this replica's name, its identity in leader election.
    pub pod_name: String,
    /// RESOLVE_HOSTNAME_GATEWAYS (Istio's default true): a meshNetworks gateway address may be a
    /// DNS name.
    pub resolve_hostname_gateways: bool,
    /// REVISION: istiod's revision, its key in leader election (empty is `default`).
    pub revision: String,
    /// ENABLE_LEADER_ELECTION: the cluster-wide writers run only in the replica holding their
    /// lock (Istio's default); false runs them in every replica.
    pub enable_leader_election: bool,
    /// PILOT_LEADER_ELECTION_LEASE_DURATION (pilot-rs's own; istiod's is fixed at 30s): how long
    /// a leader election lock lasts without renewal, in whole seconds, at least 3.
    pub leader_lease: crate::leader::LeaseTiming,
    /// K8S_INGRESS_NS: the namespace of the Gateways made from Kubernetes Ingresses (Istio's
    /// default: `istio-system`).
    pub ingress_namespace: String,
    /// Istio's generation flags (`PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN`,
    /// `PILOT_JWT_ENABLE_REMOTE_JWKS`, `PILOT_HTTP10`, `PILOT_TRACE_SAMPLING`, ...).
    pub features: model::Features,
    /// PILOT_JWT_PUB_KEY_REFRESH_INTERVAL: how often the JWKS of RequestAuthentications are fetched
    /// again (Istio: 20m).
    pub jwks_refresh_interval: Duration,
}

/// A bad environment value: names the variable and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("environment variable {name}={value:?}: {reason}")]
pub struct SettingsError {
    pub name: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// Istio's typed environment variables, read through `get`: unset or empty is the default.
struct Env<F>(F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.is_empty())
    }

    fn duration(&self, name: &'static str, default: Duration) -> Result<Duration, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => model::duration::parse(&v).ok_or(SettingsError {
                name,
                value: v,
                reason: "not a duration (e.g. 100ms, 10s)",
            }),
        }
    }

    fn boolean(&self, name: &'static str, default: bool) -> Result<bool, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "t" => Ok(true),
                "false" | "0" | "f" => Ok(false),
                _ => Err(SettingsError {
                    name,
                    value: v,
                    reason: "not a boolean",
                }),
            },
        }
    }

    fn positive(&self, name: &'static str, default: usize) -> Result<usize, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(SettingsError {
                    name,
                    value: v,
                    reason: "not a positive integer",
                }),
            },
        }
    }

    /// `PILOT_PUSH_THROTTLE`: 0 or unset is Istio's default for the CPUs.
    fn push_throttle(&self) -> Result<usize, SettingsError> {
        match self.get("PILOT_PUSH_THROTTLE") {
            None => Ok(default_push_throttle()),
            Some(v) => match v.parse::<usize>() {
                Ok(0) => Ok(default_push_throttle()),
                Ok(n) => Ok(n),
                _ => Err(SettingsError {
                    name: "PILOT_PUSH_THROTTLE",
                    value: v,
                    reason: "not a non-negative integer",
                }),
            },
        }
    }

    /// Istio's generation flags.
    fn features(&self) -> Result<model::Features, SettingsError> {
        Ok(model::Features {
            enable_absolute_fqdn_vhost_domain: self.boolean("PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN", true)?,
            jwks_fetch_mode: model::features::JwksFetchMode::parse(
                &self.get("PILOT_JWT_ENABLE_REMOTE_JWKS").unwrap_or_default(),
            ),
            enable_multiple_custom_authz_providers: self
                .boolean("PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS", false)?,
            enable_ip_autoallocate: self.boolean("PILOT_ENABLE_IP_AUTOALLOCATE", true)?,
            enable_delta_vhds: self.boolean("PILOT_ENABLE_DELTA_VHDS", true)?,
            http10: self.boolean("PILOT_HTTP10", false)?,
            filter_gateway_cluster_config: self.boolean("PILOT_FILTER_GATEWAY_CLUSTER_CONFIG", false)?,
            trace_sampling_millipercent: match self.get("PILOT_TRACE_SAMPLING") {
                None => model::Features::ISTIO_DEFAULTS.trace_sampling_millipercent,
                Some(v) => model::Features::parse_trace_sampling(&v).ok_or(SettingsError {
                    name: "PILOT_TRACE_SAMPLING",
                    value: v,
                    reason: "not a percentage from 0.0 to 100.0",
                })?,
            },
        })
    }
}

impl Settings {
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let env = Env(get);
        Ok(Settings {
            debounce_after: env.duration("PILOT_DEBOUNCE_AFTER", Duration::from_millis(100))?,
            enable_eds_debounce: env.boolean("PILOT_ENABLE_EDS_DEBOUNCE", true)?,
            push_throttle: env.push_throttle()?,
            max_recv_msg_size: env.positive("ISTIO_GPRC_MAXRECVMSGSIZE", DEFAULT_MAX_RECV_MSG_SIZE)?,
            max_streams: u32::try_from(env.positive("ISTIO_GPRC_MAXSTREAMS", DEFAULT_MAX_STREAMS as usize)?)
                .unwrap_or(u32::MAX),
            max_resource_names: env.positive("PILOT_XDS_MAX_RESOURCE_NAMES", xds_server::DEFAULT_MAX_RESOURCE_NAMES)?,
            enable_debug_endpoint_auth: env.boolean("ENABLE_DEBUG_ENDPOINT_AUTH", true)?,
            pod_namespace: env.get("POD_NAMESPACE").unwrap_or_else(|| "istio-system".into()),
            pod_name: env.get("POD_NAME").unwrap_or_default(),
            revision: env.get("REVISION").unwrap_or_default(),
            resolve_hostname_gateways: env.boolean("RESOLVE_HOSTNAME_GATEWAYS", true)?,
            enable_leader_election: env.boolean("ENABLE_LEADER_ELECTION", true)?,
            leader_lease: lease_timing(&env.0)?,
            ingress_namespace: env
                .get("K8S_INGRESS_NS")
                .unwrap_or_else(|| ingress::DEFAULT_INGRESS_NAMESPACE.into()),
            jwks_refresh_interval: env.duration("PILOT_JWT_PUB_KEY_REFRESH_INTERVAL", Duration::from_secs(20 * 60))?,
            remote_cluster_timeout: env.duration("PILOT_REMOTE_CLUSTER_TIMEOUT", Duration::from_secs(30))?,
            multicluster_kubeconfig_path: env.get("PILOT_MULTICLUSTER_KUBECONFIG_PATH").unwrap_or_default(),
            features: env.features()?,
        })
    }
}

/// `PILOT_LEADER_ELECTION_LEASE_DURATION`: a duration of whole seconds, at least
/// [`LeaseTiming::MIN_SECS`](crate::leader::LeaseTiming::MIN_SECS); istiod's 30s when unset.
fn lease_timing(get: &impl Fn(&str) -> Option<String>) -> Result<crate::leader::LeaseTiming, SettingsError> {
    use crate::leader::LeaseTiming;
    const NAME: &str = "PILOT_LEADER_ELECTION_LEASE_DURATION";
    let Some(v) = get(NAME).filter(|v| !v.is_empty()) else {
        return Ok(LeaseTiming::ISTIOD);
    };
    match model::duration::parse(&v) {
        Some(d) if d.subsec_nanos() == 0 && d.as_secs() >= LeaseTiming::MIN_SECS => Ok(LeaseTiming {
            duration_secs: d.as_secs(),
        }),
        _ => Err(SettingsError {
            name: NAME,
            value: v,
            reason: "not a duration of whole seconds, at least 3s (e.g. 30s)",
        }),
    }
}

/// Istio's default for `ISTIO_GPRC_MAXRECVMSGSIZE`.
pub const DEFAULT_MAX_RECV_MSG_SIZE: usize = 4 * 1024 * 1024;
/// `ISTIO_GPRC_MAXSTREAMS` (Istio's default is 100000: tighter here, see `Settings::max_streams`).
pub const DEFAULT_MAX_STREAMS: u32 = 100;

/// Istio's default for `PILOT_PUSH_THROTTLE` unset or 0: scaled with the cores,
/// `min(15 + 5 * cores, 100)` (25 on 2 cores).
pub fn default_push_throttle() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (15 + 5 * cores).min(100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn istio_defaults() {
        let s = Settings::from_env(env(&[])).unwrap();
        assert_eq!(s.debounce_after, Duration::from_millis(100));
        assert!(s.enable_eds_debounce);
        assert_eq!(s.push_throttle, default_push_throttle());
        assert!((20..=100).contains(&s.push_throttle));
        assert_eq!(s.max_recv_msg_size, 4 * 1024 * 1024);
        assert_eq!(s.max_resource_names, 50_000);
        assert_eq!(s.max_streams, 100);
        assert!(s.enable_debug_endpoint_auth);
        assert_eq!(s.ingress_namespace, "istio-system");
        let s = Settings::from_env(env(&[("K8S_INGRESS_NS", "ingress")])).unwrap();
        assert_eq!(s.ingress_namespace, "ingress");
    }

    #[test]
    fn leader_election_as_istiod_unless_told() {
        let s = Settings::from_env(env(&[])).unwrap();
        assert!(s.enable_leader_election);
        assert_eq!(s.leader_lease, crate::leader::LeaseTiming::ISTIOD);
        assert_eq!(s.leader_lease.retry_period(), Duration::from_millis(7500));
        let s = Settings::from_env(env(&[
            ("ENABLE_LEADER_ELECTION", "false"),
            ("PILOT_LEADER_ELECTION_LEASE_DURATION", "4s"),
            ("POD_NAME", "istiod-1"),
        ]))
        .unwrap();
        assert!(!s.enable_leader_election);
        assert_eq!(s.leader_lease.duration_secs, 4);
        assert_eq!(s.pod_name, "istiod-1");
        for bad in ["2s", "1500ms", "soon"] {
            let e = Settings::from_env(env(&[("PILOT_LEADER_ELECTION_LEASE_DURATION", bad)])).unwrap_err();
            assert_eq!(e.name, "PILOT_LEADER_ELECTION_LEASE_DURATION");
        }
    }

    #[test]
    fn grpc_limits_from_istio_env() {
        let s = Settings::from_env(env(&[
            ("ISTIO_GPRC_MAXRECVMSGSIZE", "33554432"),
            ("ISTIO_GPRC_MAXSTREAMS", "150000"),
        ]))
        .unwrap();
        assert_eq!(s.max_recv_msg_size, 32 << 20);
        assert_eq!(s.max_streams, 150_000);
        let e = Settings::from_env(env(&[("ISTIO_GPRC_MAXRECVMSGSIZE", "0")])).unwrap_err();
        assert_eq!(e.name, "ISTIO_GPRC_MAXRECVMSGSIZE");
        assert!(Settings::from_env(env(&[("ISTIO_GPRC_MAXSTREAMS", "many")])).is_err());
    }

    #[test]
    fn overrides_and_errors() {
        let s = Settings::from_env(env(&[
            ("PILOT_DEBOUNCE_AFTER", "5ms"),
            ("PILOT_DEBOUNCE_MAX", "1s"),
            ("PILOT_ENABLE_EDS_DEBOUNCE", "false"),
            ("PILOT_PUSH_THROTTLE", "7"),
        ]))
        .unwrap();
        assert_eq!(s.debounce_after, Duration::from_millis(5));
        assert!(!s.enable_eds_debounce);
        assert_eq!(s.push_throttle, 7);
        let e = Settings::from_env(env(&[("PILOT_DEBOUNCE_AFTER", "soon")])).unwrap_err();
        assert_eq!(e.name, "PILOT_DEBOUNCE_AFTER");
        let auto = Settings::from_env(env(&[("PILOT_PUSH_THROTTLE", "0")])).unwrap();
        assert_eq!(auto.push_throttle, default_push_throttle());
        assert!(Settings::from_env(env(&[("PILOT_PUSH_THROTTLE", "-1")])).is_err());
        assert!(Settings::from_env(env(&[("PILOT_ENABLE_EDS_DEBOUNCE", "maybe")])).is_err());
        let features =
            |v: &str| Settings::from_env(env(&[("PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN", v)])).map(|s| s.features);
        assert_eq!(features(""), Ok(model::Features::default()));
        assert!(features("false").is_ok_and(|f| !f.enable_absolute_fqdn_vhost_domain));
    }

    /// The generation flags of Istio's install (`PILOT_TRACE_SAMPLING=1`) and the ones it can set.
    #[test]
    fn generation_flags() {
        let s = Settings::from_env(env(&[
            ("PILOT_TRACE_SAMPLING", "0.5"),
            ("PILOT_HTTP10", "1"),
            ("PILOT_FILTER_GATEWAY_CLUSTER_CONFIG", "true"),
        ]))
        .unwrap();
        assert_eq!(s.features.trace_sampling(), 0.5);
        assert!(s.features.http10 && s.features.filter_gateway_cluster_config);
        let defaults = Settings::from_env(env(&[])).unwrap().features;
        assert_eq!(defaults.trace_sampling(), 1.0);
        assert!(!defaults.http10 && !defaults.filter_gateway_cluster_config);
        for bad in ["101", "-1", "often"] {
            let e = Settings::from_env(env(&[("PILOT_TRACE_SAMPLING", bad)])).unwrap_err();
            assert_eq!(e.name, "PILOT_TRACE_SAMPLING");
        }
    }
}
