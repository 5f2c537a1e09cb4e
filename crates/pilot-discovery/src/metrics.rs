//! Pilot's own gauges about config and services (`pilot_services`, `pilot_virt_services`) and the
//! count of rejected config (`pilot_config_invalid`, by kind). The xDS metrics live in xds-server.

use std::sync::Arc;

use config_sources::ConfigSnapshot;
use model::ConfigKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use registry::RegistrySnapshot;

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

    pub fn observe(&self, configs: &ConfigSnapshot, registry: &RegistrySnapshot) {
        self.services.set(registry.services.len() as i64);
        let vs = configs.keys().filter(|k| k.kind == ConfigKind::VirtualService).count();
        self.virtual_services.set(vs as i64);
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
