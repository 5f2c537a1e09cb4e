//! `ServiceEntry` and `WorkloadEntry`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::WorkloadSelector;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceEntry {
    pub hosts: Vec<String>,
    pub addresses: Vec<String>,
    pub ports: Vec<ServicePort>,
    /// MESH_EXTERNAL (default) or MESH_INTERNAL.
    pub location: Option<String>,
    /// NONE (default), STATIC, DNS, DNS_ROUND_ROBIN.
    pub resolution: Option<String>,
    pub endpoints: Vec<WorkloadEntry>,
    pub workload_selector: Option<WorkloadSelector>,
    pub export_to: Vec<String>,
    pub subject_alt_names: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServicePort {
    pub number: u32,
    pub protocol: String,
    pub name: String,
    pub target_port: u32,
}

/// `WorkloadEntry`: both the kind and a ServiceEntry's inline endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkloadEntry {
    pub address: String,
    /// Port name -> workload port.
    pub ports: BTreeMap<String, u32>,
    pub labels: BTreeMap<String, String>,
    pub network: String,
    pub locality: String,
    pub weight: u32,
    pub service_account: String,
}
