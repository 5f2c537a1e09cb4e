//! The Ingress controller's state, as Istio's ingress `Controller` without informers: the
//! Ingresses and IngressClasses seen (from config events), and the Gateways and VirtualServices
//! derived from them when last asked. [`IngressTranslator::translate`] derives everything again
//! (Ingresses are few) and says which configs changed, so the caller pushes only those.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use model::{Config, ConfigKey, ConfigKind};

use crate::input::{IngressInput, ingress_class_controller};
use crate::virtual_service::convert_ingress_virtual_services;
use crate::{IngressOptions, Problem, ServicePorts, convert_ingress_gateway, should_process_ingress_with_class};

/// What the served Ingresses make.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// The Gateways and VirtualServices, by key.
    pub configs: Arc<BTreeMap<ConfigKey, Arc<Config>>>,
    /// What was not served, per Ingress (or IngressClass), sorted.
    pub problems: Arc<Vec<Problem>>,
    /// `(hostname, namespace)` of the Services read for named ports.
    services_read: BTreeSet<(String, String)>,
}

/// The Ingresses and IngressClasses seen, and what they made.
#[derive(Debug, Default)]
pub struct IngressTranslator {
    /// By `(namespace, name)`; `Err` when the spec does not decode.
    ingresses: BTreeMap<(String, String), Result<IngressInput, String>>,
    /// Controller by IngressClass name; `Err` when the spec does not decode.
    classes: BTreeMap<String, Result<String, String>>,
    output: Output,
}

impl IngressTranslator {
    pub fn new() -> IngressTranslator {
        IngressTranslator::default()
    }

    /// Takes an added, updated (`deleted` false) or deleted config; true when it was an Ingress
    /// or an IngressClass (then the output may change: call [`translate`](Self::translate)).
    pub fn apply(&mut self, config: &Config, deleted: bool) -> bool {
        match config.kind {
            ConfigKind::Ingress => {
                let key = (config.meta.namespace.clone(), config.meta.name.clone());
                if deleted {
                    self.ingresses.remove(&key);
                } else {
                    self.ingresses.insert(key, IngressInput::from_config(config));
                }
                true
            }
            ConfigKind::IngressClass => {
                if deleted {
                    self.classes.remove(&config.meta.name);
                } else {
                    self.classes
                        .insert(config.meta.name.clone(), ingress_class_controller(config));
                }
                true
            }
            _ => false,
        }
    }

    /// Whether the output read Service `hostname` in `namespace` (a named port): a change to it
    /// calls for [`translate`](Self::translate).
    pub fn reads_service(&self, hostname: &str, namespace: &str) -> bool {
        !self.output.services_read.is_empty()
            && self
                .output
                .services_read
                .contains(&(hostname.to_owned(), namespace.to_owned()))
    }

    /// The Gateways and VirtualServices as of the last [`translate`](Self::translate).
    pub fn output(&self) -> &Output {
        &self.output
    }

    /// Derives the output again; returns the keys of the configs added, changed or removed.
    pub fn translate(&mut self, services: &dyn ServicePorts, opts: &IngressOptions) -> Vec<ConfigKey> {
        let mut problems = Vec::new();
        for (name, class) in &self.classes {
            if let Err(e) = class {
                problems.push(Problem {
                    resource: ConfigKey {
                        kind: ConfigKind::IngressClass,
                        namespace: String::new(),
                        name: name.clone(),
                    },
                    message: e.clone(),
                });
            }
        }
        let mut served = Vec::new();
        for ((namespace, name), ingress) in &self.ingresses {
            let ingress = match ingress {
                Ok(i) => i,
                Err(e) => {
                    problems.push(Problem::ingress(namespace, name, e.clone()));
                    continue;
                }
            };
            // A class that does not decode serves nothing; an unknown class is no class.
            let controller = ingress
                .spec
                .ingress_class_name
                .as_ref()
                .and_then(|c| self.classes.get(c))
                .map(|c| c.as_deref().unwrap_or(""));
            if should_process_ingress_with_class(opts, &ingress.annotations, controller) {
                served.push(ingress);
            }
        }
        let mut configs = BTreeMap::new();
        for ingress in &served {
            let (gateway, p) = convert_ingress_gateway(ingress, opts);
            problems.extend(p);
            configs.insert(gateway.key(), Arc::new(gateway));
        }
        let converted = convert_ingress_virtual_services(&served, services, opts);
        problems.extend(converted.problems);
        for vs in converted.configs {
            configs.insert(vs.key(), Arc::new(vs));
        }
        problems.sort();
        let old = &self.output.configs;
        let changed: Vec<ConfigKey> = old
            .iter()
            .filter(|(k, v)| configs.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .chain(configs.keys().filter(|k| !old.contains_key(*k)).cloned())
            .collect();
        self.output = Output {
            configs: Arc::new(configs),
            problems: Arc::new(problems),
            services_read: converted.services_read,
        };
        changed
    }
}

#[cfg(test)]
#[path = "translator_tests.rs"]
mod tests;
