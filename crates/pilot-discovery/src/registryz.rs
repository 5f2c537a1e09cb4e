//! istiod's registry views on the debug port, in the JSON shapes istiod serves (Kiali and
//! istioctl parse them): `/debug/registryz` (`model.Service`) and `/debug/endpointShardz`
//! (`EndpointIndex.Shardz`, also at istiod's obsolete `/debug/endpointz`).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::Json;
use model::Endpoint;
use serde_json::{Value, json};

use crate::app_state::AppState;

/// Istio's registryz: every service as istiod's `model.Service` JSON (which Kiali parses):
/// `Attributes` (Go field names), `ports`, `hostname`, `clusterVIPs`, `defaultAddress`,
/// `Resolution` (Istio's enum number), `MeshExternal`; plus `origin`, the object it came from.
pub async fn registryz(State(s): State<AppState>) -> Json<Value> {
    let registry = s.environment.registry();
    Json(Value::Array(
        registry.services.iter().map(|svc| istio_service_json(svc)).collect(),
    ))
}

fn istio_service_json(svc: &model::Service) -> Value {
    use model::service::Visibility;
    let a = &svc.attributes;
    let export_to: serde_json::Map<String, Value> = a
        .export_to
        .iter()
        .map(|v| {
            let k = match v {
                Visibility::Public => "*".to_owned(),
                Visibility::Private => ".".to_owned(),
                Visibility::None => "~".to_owned(),
                Visibility::Namespace(ns) => ns.clone(),
            };
            (k, json!({}))
        })
        .collect();
    // Istio's `Resolution` numbers: ClientSideLB 0, DNSLB 1, Passthrough 2, DNSRoundRobinLB 3.
    let resolution = match svc.resolution {
        model::Resolution::ClientSideLb => 0,
        model::Resolution::DnsLb => 1,
        model::Resolution::Passthrough => 2,
        model::Resolution::DnsRoundRobinLb => 3,
    };
    let cluster = if a.cluster_id.is_empty() {
        ""
    } else {
        a.cluster_id.as_str()
    };
    let mut out = json!({
        "Attributes": {
            "ServiceRegistry": a.service_registry,
            "Name": a.name,
            "Namespace": a.namespace,
            "Labels": a.labels,
            "ExportTo": export_to,
            "LabelSelectors": a.label_selectors,
        },
        "ports": svc.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "protocol": p.protocol.as_str()})).collect::<Vec<_>>(),
        "hostname": svc.hostname,
        "Resolution": resolution,
        "MeshExternal": svc.mesh_external,
        "origin": svc.origin,
    });
    if let Some(first) = svc.addresses.first() {
        out["defaultAddress"] = json!(first);
        out["clusterVIPs"] = if svc.cluster_vips.is_empty() {
            json!({"Addresses": {cluster: svc.addresses}})
        } else {
            json!({"Addresses": svc.cluster_vips})
        };
    }
    out
}

/// istiod's endpointShardz: hostname → namespace → `{"Shards": {"<provider>/<cluster>":
/// [IstioEndpoint]}, "ServiceAccounts": {<identity>: {}}}`, with `IstioEndpoint`'s Go field
/// names. The shard of an endpoint is its registry: `Kubernetes` for EndpointSlices, `External`
/// for ServiceEntries, WorkloadEntries and the Pods ServiceEntries select.
pub async fn endpoint_shardz(State(s): State<AppState>) -> Json<Value> {
    let registry = s.environment.registry();
    let mut out: BTreeMap<&str, BTreeMap<&str, Value>> = BTreeMap::new();
    for (key, endpoints) in registry.endpoints.iter() {
        let service_cluster = registry
            .service(&key.hostname, &key.namespace)
            .map_or("", |svc| svc.attributes.cluster_id.as_str());
        let mut shards: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut accounts = serde_json::Map::new();
        for e in endpoints.iter() {
            // Istio shards endpoints by (provider, cluster): each keeps the cluster it came from.
            let cluster = if e.cluster_id.is_empty() {
                service_cluster
            } else {
                e.cluster_id.as_str()
            };
            shards
                .entry(format!("{}/{cluster}", provider(e)))
                .or_default()
                .push(istio_endpoint_json(e, &key.hostname, cluster));
            if !e.service_account.is_empty() {
                accounts.insert(e.service_account.clone(), json!({}));
            }
        }
        out.entry(key.hostname.as_str()).or_default().insert(
            key.namespace.as_str(),
            json!({"Shards": shards, "ServiceAccounts": accounts}),
        );
    }
    Json(json!(out))
}

/// Istio's `provider.ID` of the registry an endpoint came from.
fn provider(e: &Endpoint) -> &'static str {
    if e.origin.starts_with("EndpointSlice/") || e.origin.starts_with("Service/") {
        "Kubernetes"
    } else {
        "External"
    }
}

/// An endpoint as istiod's `model.IstioEndpoint` (Go field names; `HealthStatus` 1 = Healthy:
/// the registries keep ready endpoints only).
fn istio_endpoint_json(e: &Endpoint, hostname: &str, cluster: &str) -> Value {
    let tls_mode = e
        .labels
        .get("security.istio.io/tlsMode")
        .map_or("disabled", String::as_str);
    let workload = e.origin.rsplit('/').next().unwrap_or_default();
    let l = &e.locality;
    let locality = [l.region.as_str(), l.zone.as_str(), l.subzone.as_str()].join("/");
    json!({
        "Labels": e.labels,
        "Addresses": [e.address],
        "ServicePortName": e.service_port_name,
        "LegacyClusterPortKey": 0,
        "ServiceAccount": e.service_account,
        "Network": e.network,
        "Locality": {"Label": locality.trim_end_matches('/'), "ClusterID": cluster},
        "EndpointPort": e.endpoint_port,
        "LbWeight": e.weight,
        "TLSMode": tls_mode,
        "Namespace": e.namespace,
        "WorkloadName": workload,
        "HostName": hostname,
        "SubDomain": "",
        "HealthStatus": 1,
        "SendUnhealthyEndpoints": false,
        "NodeName": "",
    })
}
