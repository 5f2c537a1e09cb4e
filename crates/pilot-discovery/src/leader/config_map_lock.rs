//! client-go's `ConfigMapLock`, the lock of istiod's prioritized elections: the record is an
//! annotation of a ConfigMap named after the election in istiod's namespace. Every write goes
//! with the `resourceVersion` last read, so that of two replicas writing at once the API server
//! refuses the second with 409 Conflict: one holder at a time.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use super::record::{ANNOTATION, Record};

pub struct ConfigMapLock {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// The ConfigMap as last read or written, whose `resourceVersion` the next update carries.
    config_map: Option<ConfigMap>,
}

/// Why a read or write of the lock failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another replica wrote first (409): a race lost, not a fault.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Api(kube::Error),
}

impl From<kube::Error> for LockError {
    fn from(e: kube::Error) -> LockError {
        match e {
            kube::Error::Api(s) if s.code == 409 => LockError::Conflict(s.message.clone()),
            e => LockError::Api(e),
        }
    }
}

impl LockError {
    /// Whether another replica wrote first.
    pub fn is_conflict(&self) -> bool {
        matches!(self, LockError::Conflict(_))
    }
}

impl ConfigMapLock {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> ConfigMapLock {
        ConfigMapLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            config_map: None,
        }
    }

    /// `namespace/name`, for the log.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The record's annotation as stored (`Some("")` when the ConfigMap has none), or `None`
    /// when there is no ConfigMap.
    pub async fn get(&mut self) -> Result<Option<String>, LockError> {
        self.config_map = self.api.get_opt(&self.name).await?;
        Ok(self.config_map.as_ref().map(|cm| {
            cm.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION))
                .cloned()
                .unwrap_or_default()
        }))
    }

    /// Creates the ConfigMap with `record`; a 409 means another replica created it first.
    pub async fn create(&mut self, record: &Record) -> Result<(), LockError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                annotations: Some(BTreeMap::from([(ANNOTATION.to_owned(), record.encode())])),
                ..Default::default()
            },
            ..Default::default()
        };
        self.config_map = Some(self.api.create(&PostParams::default(), &cm).await?);
        Ok(())
    }

    /// Writes `record` over the ConfigMap last read, only if no one has written it since.
    pub async fn update(&mut self, record: &Record) -> Result<(), LockError> {
        let Some(mut cm) = self.config_map.clone() else {
            return Err(LockError::Conflict("the lock was not read before the update".into()));
        };
        cm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION.to_owned(), record.encode());
        self.config_map = Some(self.api.replace(&self.name, &PostParams::default(), &cm).await?);
        Ok(())
    }
}
