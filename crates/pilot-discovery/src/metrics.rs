//! Pilot's own gauges about config and services (`pilot_services`, `pilot_virt_services`), the
//! count of rejected config (`pilot_config_invalid`, by kind), the validation verdicts
//! (`galley_validation_passed` / `_failed`) and the build (`istio_build{component="pilot"}`) that
//! Istio's control plane dashboard queries. The xDS metrics live in xds-server.

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub component: &'static str,
    pub tag: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ValidationLabels {
    pub resource: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

#[derive(Clone, Debug)]
pub struct PipelineMetrics {
    services: Gauge,
    virtual_services: Gauge,
    invalid: Family<TypeLabel, Counter>,
    /// `galley_validation_passed` / `_failed`: Istio counts its admission webhook's verdicts; here
    /// every Istio config read (files or the API server) is validated the same way.
    validation_passed: Family<ResourceLabel, Counter>,
    validation_failed: Family<ValidationLabels, Counter>,
    validation_http_error: Family<StatusLabel, Counter>,
}

impl PipelineMetrics {
    pub fn register(registry: &mut Registry) -> PipelineMetrics {
        let m = PipelineMetrics {
            services: Gauge::default(),
            virtual_services: Gauge::default(),
            invalid: Family::default(),
            validation_passed: Family::default(),
            validation_failed: Family::default(),
            validation_http_error: Family::default(),
        };
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                component: "pilot",
                tag: crate::version::INFO.tag,
            })
            .set(1);
        registry.register("istio_build", "Istio component build info", build);
        registry.register(
            "galley_validation_passed",
            "Resource is valid.",
            m.validation_passed.clone(),
        );
        registry.register(
            "galley_validation_failed",
            "Resource validation failed.",
            m.validation_failed.clone(),
        );
        registry.register(
            "galley_validation_http_error",
            "Resource validation http serve errors",
            m.validation_http_error.clone(),
        );
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

    /// Configs that passed validation (each config event that added or updated one).
    pub fn validated(&self, change: &config_sources::ConfigChange) {
        for e in &change.events {
            if let Some(c) = e.current()
                && !c.kind.is_kubernetes()
            {
                self.validation_passed
                    .get_or_create(&ResourceLabel {
                        resource: c.kind.to_string(),
                    })
                    .inc();
            }
        }
    }

    /// A review the validation webhook allowed (Istio labels it by the request's resource).
    pub fn webhook_passed(&self, resource: &str) {
        self.validation_passed
            .get_or_create(&ResourceLabel {
                resource: resource.to_owned(),
            })
            .inc();
    }

    /// A review the validation webhook denied, or did not judge, with Istio's reason.
    pub fn webhook_failed(&self, resource: &str, reason: &'static str) {
        self.validation_failed
            .get_or_create(&ValidationLabels {
                resource: resource.to_owned(),
                reason,
            })
            .inc();
    }

    /// `galley_validation_http_error{status}`: requests answered with an HTTP error, not a review.
    pub fn webhook_http_error(&self, status: u16) {
        self.validation_http_error
            .get_or_create(&StatusLabel {
                status: status.to_string(),
            })
            .inc();
    }

    pub fn observe(&self, stats: EnvironmentStats) {
        self.services.set(stats.services as i64);
        self.virtual_services.set(stats.virtual_services as i64);
    }

    /// The observer the config store calls for every rejected resource.
    pub fn invalid_observer(&self) -> config_sources::InvalidObserver {
        let invalid = self.invalid.clone();
        let failed = self.validation_failed.clone();
        Arc::new(move |kind: &str| {
            invalid
                .get_or_create(&TypeLabel {
                    r#type: kind.to_owned(),
                })
                .inc();
            failed
                .get_or_create(&ValidationLabels {
                    resource: kind.to_owned(),
                    reason: "invalid_resource",
                })
                .inc();
        })
    }
}
