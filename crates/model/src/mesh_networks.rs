//! Istio's `MeshNetworks` (mesh.istio.io/v1alpha1, `meshNetworks` of the `istio` ConfigMap or the
//! `--networksConfig` file): the networks of a multi-network mesh, which endpoints belong to each
//! (`fromCidr`, `fromRegistry`) and the gateways that reach each from the others. Parsed as
//! Istio's `ParseMeshNetworks` (pkg/config/mesh/mesh.go: strict decoding, then
//! `ValidateMeshNetworks`, pkg/config/validation/agent/validation.go).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validation::hosts::{is_dns1123_label, validate_fqdn, validate_ip, validate_ip_subnet};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshNetworks {
    #[serde(default)]
    pub networks: BTreeMap<String, Network>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub endpoints: Vec<NetworkEndpoints>,
    #[serde(default)]
    pub gateways: Vec<NetworkGatewaySpec>,
}

/// Which endpoints are in the network: those of a CIDR, or all of a registry (a cluster).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum NetworkEndpoints {
    FromCidr(String),
    FromRegistry(String),
}

/// A gateway into the network: a registry's Service (its load balancer addresses) or an address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkGatewaySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_service_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default)]
    pub port: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub locality: String,
}

/// Istio's `model.NetworkGateway` as `/debug/networkz` shows it (Go's field names).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkGateway {
    pub network: String,
    pub cluster: String,
    pub addr: String,
    pub port: u32,
    #[serde(rename = "HBONEPort")]
    pub hbone_port: u32,
    pub service_account: ServiceAccountName,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceAccountName {
    pub namespace: String,
    pub name: String,
}

/// Why a `meshNetworks` was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MeshNetworksError {
    #[error("failed to convert to proto: {0}")]
    Decode(String),
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
}

impl MeshNetworks {
    /// Istio's `ParseMeshNetworks` of the YAML as a value: null is no networks (`networks: {}`).
    /// `resolve_hostname_gateways` is `RESOLVE_HOSTNAME_GATEWAYS` (Istio's default true): a
    /// gateway address may then be a DNS name.
    pub fn from_value(
        value: serde_json::Value,
        resolve_hostname_gateways: bool,
    ) -> Result<MeshNetworks, MeshNetworksError> {
        let networks: MeshNetworks = if value.is_null() {
            MeshNetworks::default()
        } else {
            serde_json::from_value(value).map_err(|e| MeshNetworksError::Decode(e.to_string()))?
        };
        let errs = networks.errors(resolve_hostname_gateways);
        if errs.is_empty() {
            Ok(networks)
        } else {
            Err(MeshNetworksError::Invalid(errs))
        }
    }

    /// Istio's `ValidateMeshNetworks`, each error prefixed by its network.
    pub fn errors(&self, resolve_hostname_gateways: bool) -> Vec<String> {
        let mut errs = Vec::new();
        for (name, network) in &self.networks {
            for e in network_errors(network, resolve_hostname_gateways) {
                errs.push(format!("invalid network {name}: {e}"));
            }
        }
        errs
    }

    /// The gateways the config names by address (Istio's `NetworkManager.reload`: those of a
    /// `registryServiceName` come from the registry), IPs only, sorted.
    pub fn address_gateways(&self) -> Vec<NetworkGateway> {
        let mut out: Vec<NetworkGateway> = self
            .networks
            .iter()
            .flat_map(|(name, n)| {
                n.gateways.iter().filter_map(move |g| {
                    let addr = g.address.as_deref().filter(|a| validate_ip(a).is_ok())?;
                    Some(NetworkGateway {
                        network: name.clone(),
                        cluster: String::new(),
                        addr: addr.to_owned(),
                        port: g.port,
                        hbone_port: 0,
                        service_account: ServiceAccountName::default(),
                    })
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// What pushes read of meshNetworks, as Istio's `NetworkManager` and `NetworkGateways`: the
/// network of an endpoint whose registry did not say (its cluster's `fromRegistry`, else a
/// `fromCidr` holding its address), and the gateways into each network (those named by address).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkIndex {
    by_registry: BTreeMap<String, String>,
    by_cidr: Vec<(ipnet::IpNet, String)>,
    gateways: Vec<NetworkGateway>,
    scale: u32,
}

impl NetworkIndex {
    pub fn new(m: &MeshNetworks) -> NetworkIndex {
        let mut by_registry = BTreeMap::new();
        let mut by_cidr = Vec::new();
        for (name, n) in &m.networks {
            for e in &n.endpoints {
                match e {
                    NetworkEndpoints::FromRegistry(r) => {
                        by_registry.entry(r.clone()).or_insert_with(|| name.clone());
                    }
                    NetworkEndpoints::FromCidr(c) => {
                        if let Ok(net) = c.parse::<ipnet::IpNet>() {
                            by_cidr.push((net, name.clone()));
                        }
                    }
                }
            }
        }
        let gateways = m.address_gateways();
        let scale = lb_weight_scale_factor(&gateways);
        NetworkIndex {
            by_registry,
            by_cidr,
            gateways,
            scale,
        }
    }

    /// The network of an endpoint: its own (a Pod's `topology.istio.io/network` label, a
    /// WorkloadEntry's `network`), else its cluster's (`fromRegistry`), else that of a `fromCidr`
    /// holding its address; empty when none says.
    pub fn network_of<'a>(&'a self, e: &'a crate::Endpoint) -> &'a str {
        if !e.network.is_empty() {
            return &e.network;
        }
        if let Some(n) = self.by_registry.get(&e.cluster_id) {
            return n;
        }
        let Ok(ip) = e.address.parse::<std::net::IpAddr>() else {
            return "";
        };
        self.by_cidr
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map_or("", |(_, n)| n.as_str())
    }

    /// Istio's `IsMultiNetworkEnabled`: some network has a gateway.
    pub fn is_multi_network(&self) -> bool {
        !self.gateways.is_empty()
    }

    /// The gateways into `network` from `cluster` (Istio's `selectNetworkGateways`: those of the
    /// network and cluster, else those of the network), sorted.
    pub fn gateways_for(&self, network: &str, cluster: &str) -> Vec<&NetworkGateway> {
        let of_cluster: Vec<&NetworkGateway> = self
            .gateways
            .iter()
            .filter(|g| g.network == network && g.cluster == cluster)
            .collect();
        if !of_cluster.is_empty() {
            return of_cluster;
        }
        self.gateways.iter().filter(|g| g.network == network).collect()
    }

    /// Istio's `GetLBWeightScaleFactor`: the least common multiple of the number of gateways of
    /// each network and of each network's cluster, so an endpoint's weight splits evenly over
    /// them; 1 without gateways.
    pub fn scale_factor(&self) -> u32 {
        self.scale
    }
}

fn lb_weight_scale_factor(gateways: &[NetworkGateway]) -> u32 {
    let mut counts: BTreeMap<(&str, Option<&str>), u32> = BTreeMap::new();
    for g in gateways {
        *counts.entry((&g.network, None)).or_default() += 1;
        if !g.cluster.is_empty() {
            *counts.entry((&g.network, Some(&g.cluster))).or_default() += 1;
        }
    }
    let gcd = |mut a: u32, mut b: u32| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    counts
        .values()
        .fold(1u32, |acc, &n| (acc / gcd(acc, n)).saturating_mul(n))
}

fn network_errors(network: &Network, resolve_hostname_gateways: bool) -> Vec<String> {
    let mut errs = Vec::new();
    for e in &network.endpoints {
        match e {
            NetworkEndpoints::FromCidr(cidr) => errs.extend(validate_ip_subnet(cidr).err()),
            NetworkEndpoints::FromRegistry(r) if !is_dns1123_label(r) => {
                errs.push(format!("invalid registry name: {r}"));
            }
            NetworkEndpoints::FromRegistry(_) => {}
        }
    }
    for g in &network.gateways {
        match (&g.registry_service_name, &g.address) {
            (Some(_), Some(_)) => errs.push("a gateway sets both registryServiceName and address".into()),
            (Some(name), None) => errs.extend(validate_fqdn(name).err()),
            (None, Some(addr)) => {
                if let Err(ip) = validate_ip(addr) {
                    if !resolve_hostname_gateways {
                        errs.push(format!(
                            "{ip} (hostname is allowed if RESOLVE_HOSTNAME_GATEWAYS is enabled)"
                        ));
                    } else if validate_fqdn(addr).is_err() {
                        errs.push(format!("{addr} is not a valid IP address or DNS name"));
                    }
                }
            }
            (None, None) => {}
        }
        if !(1..=65535).contains(&g.port) {
            errs.push(format!("port number {} must be in the range 1..65535", g.port));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_endpoints_network_is_its_own_else_its_clusters_else_its_cidrs() {
        let m: MeshNetworks = serde_json::from_value(json!({"networks": {
            "east": {"endpoints": [{"fromRegistry": "c1"}], "gateways": [{"address": "192.0.2.1", "port": 15443}]},
            "west": {"endpoints": [{"fromCidr": "10.2.0.0/16"}],
                     "gateways": [{"address": "192.0.2.2", "port": 15443}, {"address": "192.0.2.3", "port": 15443}]},
        }}))
        .unwrap();
        let idx = NetworkIndex::new(&m);
        let e = |address: &str, cluster: &str, network: &str| crate::Endpoint {
            address: address.into(),
            cluster_id: cluster.into(),
            network: network.into(),
            ..Default::default()
        };
        assert_eq!(idx.network_of(&e("10.2.0.1", "c1", "own")), "own");
        assert_eq!(idx.network_of(&e("10.2.0.1", "c1", "")), "east");
        assert_eq!(idx.network_of(&e("10.2.0.1", "c9", "")), "west");
        assert_eq!(idx.network_of(&e("10.9.0.1", "c9", "")), "");
        assert!(idx.is_multi_network());
        assert_eq!(idx.gateways_for("west", "c9").len(), 2);
        assert_eq!(idx.gateways_for("nowhere", "c9").len(), 0);
        // 1 gateway into east, 2 into west: weights scale by 2
        assert_eq!(idx.scale_factor(), 2);
        assert_eq!(NetworkIndex::default().scale_factor(), 0);
        assert!(!NetworkIndex::new(&MeshNetworks::default()).is_multi_network());
    }

    fn parse(v: serde_json::Value, resolve: bool) -> Result<MeshNetworks, MeshNetworksError> {
        MeshNetworks::from_value(v, resolve)
    }

    #[test]
    fn istios_install_and_a_two_network_mesh_parse() {
        // The rendered default install's `meshNetworks: 'networks: {}'`, and no key at all.
        assert_eq!(parse(json!({"networks": {}}), true), Ok(MeshNetworks::default()));
        assert_eq!(parse(serde_json::Value::Null, true), Ok(MeshNetworks::default()));
        let n = parse(
            json!({"networks": {
                "network1": {
                    "endpoints": [{"fromRegistry": "Kubernetes"}],
                    "gateways": [{"address": "192.168.100.1", "port": 15443, "locality": "us-east-1"}]},
                "network2": {
                    "endpoints": [{"fromCidr": "10.20.0.0/16"}],
                    "gateways": [
                        {"registryServiceName": "istio-eastwestgateway.istio-system.svc.cluster.local", "port": 15443},
                        {"address": "gw.example.com", "port": 15443}]}}}),
            true,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            n.networks["network2"].endpoints,
            [NetworkEndpoints::FromCidr("10.20.0.0/16".into())]
        );
        let gws = n.address_gateways();
        assert_eq!(gws.len(), 1, "{gws:?}");
        assert_eq!(
            (gws[0].network.as_str(), gws[0].addr.as_str(), gws[0].port),
            ("network1", "192.168.100.1", 15443)
        );
        let json = serde_json::to_value(&gws[0]).unwrap_or_default();
        assert_eq!(json["Addr"], "192.168.100.1");
        assert_eq!(json["HBONEPort"], 0);
        assert_eq!(json["ServiceAccount"]["Namespace"], "");
    }

    #[test]
    fn invalid_networks_are_refused_with_istios_reasons() {
        let err = |v: serde_json::Value, resolve: bool| match parse(v, resolve) {
            Err(e) => e.to_string(),
            Ok(n) => panic!("accepted {n:?}"),
        };
        let network = |n: serde_json::Value| json!({"networks": {"n1": n}});
        let e = err(network(json!({"endpoints": [{"fromCidr": "10.0.0.0/33"}]})), true);
        assert!(
            e.contains("invalid network n1: 10.0.0.0/33 is not a valid CIDR block"),
            "{e}"
        );
        let e = err(network(json!({"endpoints": [{"fromRegistry": "not_a_label"}]})), true);
        assert!(e.contains("invalid registry name: not_a_label"), "{e}");
        let e = err(network(json!({"gateways": [{"address": "1.2.3.4", "port": 0}]})), true);
        assert!(e.contains("port number 0"), "{e}");
        let e = err(
            network(json!({"gateways": [{"address": "gw.example.com", "port": 443}]})),
            false,
        );
        assert!(e.contains("RESOLVE_HOSTNAME_GATEWAYS"), "{e}");
        let e = err(network(json!({"gateways": [{"address": "-bad-", "port": 443}]})), true);
        assert!(e.contains("not a valid IP address or DNS name"), "{e}");
        // Strict decoding, as protojson: an unknown field, a negative port, both of a oneof.
        for v in [
            network(json!({"gatways": []})),
            network(json!({"gateways": [{"address": "1.2.3.4", "port": -1}]})),
            network(json!({"endpoints": [{"fromCidr": "10.0.0.0/8", "fromRegistry": "k"}]})),
            json!({"networks": [1, 2]}),
            json!("networks"),
        ] {
            assert!(
                matches!(parse(v.clone(), true), Err(MeshNetworksError::Decode(_))),
                "{v}"
            );
        }
    }
}
