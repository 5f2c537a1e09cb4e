//! Prometheus metrics of the xDS server, under Istio's names (`pilot/pkg/xds/monitoring.go`).
//!
//! Istio exports through OpenTelemetry with `WithoutCounterSuffixes` and `WithoutUnits`, so its
//! counters appear as e.g. `pilot_xds_pushes`. prometheus-client writes a counter as
//! `<name>_total` (OpenMetrics requires it); `monitoring::render` turns that back into Istio's
//! names for `/metrics`. Gauges and histograms are registered under Istio's exact names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use xds_api::type_url;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TypeLabel {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabel {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RejectLabels {
    pub node: String,
    pub err: String,
}

type HistogramFamily = Family<TypeLabel, Histogram, fn() -> Histogram>;

fn push_time_histogram() -> Histogram {
    Histogram::new([0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0])
}

/// Istio's `configSizeBytes` buckets.
fn config_size_histogram() -> Histogram {
    Histogram::new([1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0])
}

/// The server's metrics. Cheap to clone (every field is an `Arc` inside).
#[derive(Clone)]
pub(crate) struct Metrics {
    /// `pilot_xds`: connected proxies by Istio version.
    pub xds_clients: Family<VersionLabel, Gauge>,
    /// `pilot_xds_pushes`: responses sent by type, and `<type>_senderr` for pushes not delivered.
    pub pushes: Family<TypeLabel, Counter>,
    pub push_time: HistogramFamily,
    pub convergence: Histogram,
    pub debounce_time: Histogram,
    pub push_triggers: Family<TypeLabel, Counter>,
    pub cds_reject: Family<RejectLabels, Gauge>,
    pub eds_reject: Family<RejectLabels, Gauge>,
    pub lds_reject: Family<RejectLabels, Gauge>,
    pub rds_reject: Family<RejectLabels, Gauge>,
    pub total_rejects: Family<TypeLabel, Counter>,
    pub expired_nonce: Family<TypeLabel, Counter>,
    /// Streams refused for a malformed node ID or metadata.
    pub invalid_nodes: Counter,
    /// `pilot_xds_invalid_request`: streams ended for a request that could not be read, by
    /// reason (`malformed`, `too_large`, `compressed`).
    pub invalid_requests: Family<ReasonLabel, Counter>,
    /// `pilot_xds_auth_failures`: secure-port streams refused, by reason (`authentication`:
    /// no proven caller; `authorization`: a node of another identity).
    pub auth_failures: Family<ReasonLabel, Counter>,
    /// `pilot_total_xds_internal_errors`: generation failures (nothing sent for the type).
    pub internal_errors: Counter,
    /// `pilot_xds_config_size_bytes`: size of each response, by type.
    pub config_size: HistogramFamily,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub reason: &'static str,
}

pub(crate) fn type_label(type_url: &str) -> TypeLabel {
    TypeLabel {
        r#type: type_url::short(type_url).to_owned(),
    }
}

impl Metrics {
    pub(crate) fn new(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            xds_clients: Family::default(),
            pushes: Family::default(),
            push_time: Family::new_with_constructor(push_time_histogram),
            convergence: Histogram::new([0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
            debounce_time: Histogram::new([0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
            push_triggers: Family::default(),
            cds_reject: Family::default(),
            eds_reject: Family::default(),
            lds_reject: Family::default(),
            rds_reject: Family::default(),
            total_rejects: Family::default(),
            expired_nonce: Family::default(),
            invalid_nodes: Counter::default(),
            invalid_requests: Family::default(),
            auth_failures: Family::default(),
            internal_errors: Counter::default(),
            config_size: Family::new_with_constructor(config_size_histogram),
        };
        registry.register(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot.",
            m.internal_errors.clone(),
        );
        registry.register(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            m.config_size.clone(),
        );
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS.",
            m.xds_clients.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds.",
            m.pushes.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
            m.push_time.clone(),
        );
        registry.register(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration.",
            m.convergence.clone(),
        );
        registry.register(
            "pilot_debounce_time",
            "Delay in seconds between the first config enters debouncing and the merged push request is pushed \
             into the push queue.",
            m.debounce_time.clone(),
        );
        registry.register(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            m.push_triggers.clone(),
        );
        registry.register(
            "pilot_xds_cds_reject",
            "Pilot rejected CDS configs.",
            m.cds_reject.clone(),
        );
        registry.register("pilot_xds_eds_reject", "Pilot rejected EDS.", m.eds_reject.clone());
        registry.register("pilot_xds_lds_reject", "Pilot rejected LDS.", m.lds_reject.clone());
        registry.register("pilot_xds_rds_reject", "Pilot rejected RDS.", m.rds_reject.clone());
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            m.total_rejects.clone(),
        );
        registry.register(
            "pilot_xds_invalid_node",
            "Total number of xDS streams refused for a malformed node ID or node metadata.",
            m.invalid_nodes.clone(),
        );
        registry.register(
            "pilot_xds_auth_failures",
            "Total number of xDS streams refused on the secure port: the caller could not be authenticated, or announced a node of another identity.",
            m.auth_failures.clone(),
        );
        registry.register(
            "pilot_xds_invalid_request",
            "Total number of xDS streams ended for a request that could not be read (malformed, too large, compressed).",
            m.invalid_requests.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            m.expired_nonce.clone(),
        );
        m
    }

    fn reject_family(&self, type_url: &str) -> Option<&Family<RejectLabels, Gauge>> {
        match type_url {
            type_url::CLUSTER => Some(&self.cds_reject),
            type_url::ENDPOINT => Some(&self.eds_reject),
            type_url::LISTENER => Some(&self.lds_reject),
            // a virtual host over VHDS is part of a route configuration
            type_url::ROUTE | type_url::VIRTUAL_HOST => Some(&self.rds_reject),
            _ => None,
        }
    }

    /// A NACK, as Istio's `IncrementXDSRejects`: the total by type, and the per type gauge set to
    /// 1 for (node, gRPC code name). The per node series are removed when the proxy disconnects,
    /// so their number stays bounded by the connected proxies.
    pub(crate) fn record_reject(&self, type_url: &str, node: &str, code: i32) {
        self.total_rejects.get_or_create(&type_label(type_url)).inc();
        if let Some(f) = self.reject_family(type_url) {
            f.get_or_create(&RejectLabels {
                node: node.to_owned(),
                err: code_name(code).to_owned(),
            })
            .set(1);
        }
    }

    /// Drops the reject series of a node that went away.
    pub(crate) fn forget_rejects(&self, type_url: &str, node: &str, code: i32) {
        if let Some(f) = self.reject_family(type_url) {
            f.remove(&RejectLabels {
                node: node.to_owned(),
                err: code_name(code).to_owned(),
            });
        }
    }

    pub(crate) fn record_push(&self, type_url: &str, seconds: f64, bytes: usize) {
        let l = type_label(type_url);
        self.pushes.get_or_create(&l).inc();
        self.push_time.get_or_create(&l).observe(seconds);
        self.config_size.get_or_create(&l).observe(bytes as f64);
    }

    pub(crate) fn record_send_error(&self, type_url: &str) {
        let t = format!("{}_senderr", type_url::short(type_url));
        self.pushes.get_or_create(&TypeLabel { r#type: t }).inc();
    }
}

/// gRPC status code names as Go's `codes.Code.String()` (Istio's `err` label).
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Code(unknown)",
    }
}
