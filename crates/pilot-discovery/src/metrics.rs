//! Pilot's own gauges about config and services (`pilot_services`, `pilot_virt_services`) and the
//! count of rejected config (`pilot_config_invalid`, by kind). The xDS metrics live in xds-server.

use std::sync::Arc;

use environment::EnvironmentStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: String,
}

#[derive(Clone, Debug)]
pub struct PipelineMetrics {
    services: Gauge,
    virtual_services: Gauge,
    invalid: Family<TypeLabel, Counter>,
}

impl PipelineMetrics {
    pub fn register(registry: &mut Registry) -> PipelineMetrics {
        let m = PipelineMetrics {
            services: Gauge::default(),
            virtual_services: Gauge::default(),
            invalid: Family::default(),
        };
        registry.register("pilot_services", "Total services known to pilot.", m.services.clone());
        registry.register(
            "pilot_virt_services",
            "Total virtual services known to pilot.",
            m.virtual_services.clone(),
        );
        registry.register(
            "pilot_config_invalid",
            "Istio config resources rejected as invalid, by kind.",
            m.invalid.clone(),
        );
        m
    }

    pub fn observe(&self, stats: EnvironmentStats) {
        self.services.set(stats.services as i64);
        self.virtual_services.set(stats.virtual_services as i64);
    }

    /// The observer the config store calls for every rejected resource.
    pub fn invalid_observer(&self) -> config_sources::InvalidObserver {
        let invalid = self.invalid.clone();
        Arc::new(move |kind: &str| {
            invalid
                .get_or_create(&TypeLabel {
                    r#type: kind.to_owned(),
                })
                .inc();
        })
    }
}
