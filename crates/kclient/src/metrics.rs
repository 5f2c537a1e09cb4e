//! The metrics of everything read from the API server, as Istio's: events per kind
//! (`pilot_k8s_reg_events`, `pilot_k8s_cfg_events`), and pilot-discovery's own counts of failed
//! lists and watches and of objects that do not decode or convert.

/// Labels of `pilot_k8s_object_errors`: the kind and what is wrong (`undecodable`, `invalid_ip`,
/// `invalid_port`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ObjectErrorLabels {
    pub r#type: String,
    pub reason: String,
}

/// Labels of `pilot_k8s_watch_errors`: the kind and what failed (`list_failed`, `watch_failed`,
/// `line_too_long`, `not_json`, `error_event`, `page_too_large`, `unknown_event`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct WatchErrorLabels {
    pub r#type: String,
    pub reason: String,
}

/// Labels of `pilot_k8s_reg_events`, as Istio's: the kind (`Services`, `EndpointSlice`, `Pods`,
/// `Nodes`, `Namespaces`) and the event (`add`, `update`, `delete`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct EventLabels {
    pub r#type: String,
    pub event: String,
}

type Counters<L> = prometheus_client::metrics::family::Family<L, prometheus_client::metrics::counter::Counter>;

/// Istio's `pilot_k8s_reg_events` (registry events by kind and event) and `pilot_k8s_cfg_events`
/// (Istio config events from the API server); pilot-discovery's own `pilot_k8s_watch_errors`
/// (lists and watches that failed, by kind and why) and `pilot_k8s_object_errors` (registry
/// objects that do not decode or convert whole, by kind and why). Istio config that does not
/// decode is invalid config: `pilot_config_invalid` and `galley_validation_failed`, as from files.
#[derive(Clone, Debug, Default)]
pub struct WatchMetrics {
    pub events: Counters<EventLabels>,
    pub config_events: Counters<EventLabels>,
    pub watch_errors: Counters<WatchErrorLabels>,
    pub object_errors: Counters<ObjectErrorLabels>,
}

impl WatchMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> WatchMetrics {
        let m = WatchMetrics::default();
        registry.register(
            "pilot_k8s_reg_events",
            "Events from the Kubernetes registry.",
            m.events.clone(),
        );
        registry.register(
            "pilot_k8s_cfg_events",
            "Events from the Kubernetes config source.",
            m.config_events.clone(),
        );
        registry.register(
            "pilot_k8s_watch_errors",
            "Lists and watches of the Kubernetes API server that failed, by kind and reason.",
            m.watch_errors.clone(),
        );
        registry.register(
            "pilot_k8s_object_errors",
            "Kubernetes registry objects that do not decode or convert, by kind and reason.",
            m.object_errors.clone(),
        );
        m
    }

    pub fn watch_error(&self, kind: &str, reason: &str) {
        self.watch_errors
            .get_or_create(&WatchErrorLabels {
                r#type: kind.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn count_config(&self, kind: &str, event: &str) {
        self.config_events
            .get_or_create(&EventLabels {
                r#type: kind.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    pub fn count(&self, kind: &str, event: &str, n: u64) {
        if n > 0 {
            self.events
                .get_or_create(&EventLabels {
                    r#type: kind.to_owned(),
                    event: event.to_owned(),
                })
                .inc_by(n);
        }
    }
}
