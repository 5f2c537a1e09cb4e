//! Which types a full push sends, by the kinds of config that changed, as Istio's per-generator
//! `cdsNeedsPush`, `edsNeedsPush`, `ldsNeedsPush` and `rdsNeedsPush` (`skipped*Configs`): a type
//! is pushed unless every changed config is of a kind that cannot affect it (a changed service
//! counts as a ServiceEntry). `ConfigsUpdated::All` means "everything". Kinds Istio skips that
//! this project does not model (Secret, DNSName) have no counterpart here.
//!
//! Istio's xDS debug types (`istio.io/debug/...`, `pilot/pkg/xds/v3`) are never pushed: they are
//! answered on request only (`debug.rs`).

use model::{ConfigKind, NodeType};
use xds_api::type_url;

use crate::PushRequest;

use ConfigKind::*;

/// Istio's `v3.DebugType` prefix.
pub(crate) const DEBUG_PREFIX: &str = "istio.io/debug/";
/// Istio's `TypeDebugSyncronization`.
pub(crate) const SYNCZ: &str = "istio.io/debug/syncz";
/// Istio's `TypeDebugConfigDump`.
pub(crate) const CONFIG_DUMP: &str = "istio.io/debug/config_dump";

pub(crate) fn is_debug_type(t: &str) -> bool {
    t.starts_with(DEBUG_PREFIX)
}

/// Istio's `skippedCdsConfigs`.
const SKIPPED_CDS: &[ConfigKind] = &[
    Secret,
    Gateway,
    WorkloadEntry,
    WorkloadGroup,
    AuthorizationPolicy,
    RequestAuthentication,
    Telemetry,
    WasmPlugin,
    ProxyConfig,
];

/// Istio's `skippedEdsConfigs`: routes never change endpoints.
const SKIPPED_EDS: &[ConfigKind] = &[
    Secret,
    Gateway,
    VirtualService,
    WorkloadGroup,
    AuthorizationPolicy,
    RequestAuthentication,
    Telemetry,
    WasmPlugin,
    ProxyConfig,
];

/// Istio's `skippedLdsConfigs[Router]`.
const SKIPPED_LDS_ROUTER: &[ConfigKind] = &[Secret, WorkloadGroup, WorkloadEntry, ProxyConfig];

/// Istio's `skippedLdsConfigs[SidecarProxy]` (and `Waypoint`): Gateways shape gateways only.
const SKIPPED_LDS_SIDECAR: &[ConfigKind] = &[Secret, Gateway, WorkloadGroup, WorkloadEntry, ProxyConfig];

/// Istio's `skippedRdsConfigs`.
const SKIPPED_RDS: &[ConfigKind] = &[
    Secret,
    WorkloadEntry,
    WorkloadGroup,
    AuthorizationPolicy,
    RequestAuthentication,
    PeerAuthentication,
    WasmPlugin,
    Telemetry,
    ProxyConfig,
];

/// Istio's `skippedNdsConfigs`: only services (ServiceEntries, Kubernetes Services) and Sidecars
/// change a name table.
const SKIPPED_NDS: &[ConfigKind] = &[
    Gateway,
    VirtualService,
    DestinationRule,
    Secret,
    Telemetry,
    EnvoyFilter,
    WorkloadEntry,
    WorkloadGroup,
    AuthorizationPolicy,
    RequestAuthentication,
    PeerAuthentication,
    WasmPlugin,
    ProxyConfig,
    Endpoints,
];

/// Whether a full push `req` sends `type_url` to a proxy of type `node`.
pub fn type_needs_push(type_url: &str, node: NodeType, req: &PushRequest) -> bool {
    if req.configs_updated.is_all() {
        return true;
    }
    let skipped: &[ConfigKind] = match type_url {
        // for routers a Gateway can change clusters: an AUTO_PASSTHROUGH server adds the SNI-DNAT
        // ones (Istio's `cdsNeedsPush` checks whether the proxy's auto-passthrough gateways changed)
        type_url::CLUSTER if node == NodeType::Router && req.configs_updated.changes().any(|k| k.kind() == Gateway) => {
            return true;
        }
        type_url::CLUSTER => SKIPPED_CDS,
        type_url::ENDPOINT => SKIPPED_EDS,
        type_url::LISTENER if node == NodeType::Router => SKIPPED_LDS_ROUTER,
        type_url::LISTENER => SKIPPED_LDS_SIDECAR,
        type_url::ROUTE | type_url::VIRTUAL_HOST => SKIPPED_RDS,
        type_url::NAME_TABLE => SKIPPED_NDS,
        // Istio's SDS pushes on credential changes only
        type_url::SECRET => return req.configs_updated.changes().any(|k| k.kind() == Secret),
        _ => &[],
    };
    req.configs_updated.changes().any(|k| !skipped.contains(&k.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::ConfigKey;

    fn change(kinds: &[ConfigKind]) -> PushRequest {
        PushRequest::configs(kinds.iter().map(|k| ConfigKey {
            kind: *k,
            namespace: "ns".into(),
            name: "n".into(),
        }))
    }

    fn pushed(node: NodeType, req: &PushRequest) -> Vec<&'static str> {
        [
            type_url::CLUSTER,
            type_url::ENDPOINT,
            type_url::LISTENER,
            type_url::ROUTE,
        ]
        .into_iter()
        .filter(|t| type_needs_push(t, node, req))
        .map(type_url::short)
        .collect()
    }

    #[test]
    fn a_virtual_service_change_skips_endpoints() {
        let req = change(&[VirtualService]);
        assert_eq!(pushed(NodeType::SidecarProxy, &req), ["cds", "lds", "rds"]);
        assert_eq!(pushed(NodeType::Router, &req), ["cds", "lds", "rds"]);
    }

    #[test]
    fn virtual_hosts_over_vhds_are_pushed_when_routes_are() {
        for kinds in [
            &[VirtualService][..],
            &[Gateway],
            &[WorkloadEntry],
            &[AuthorizationPolicy],
        ] {
            for node in [NodeType::SidecarProxy, NodeType::Router] {
                let req = change(kinds);
                assert_eq!(
                    type_needs_push(type_url::VIRTUAL_HOST, node, &req),
                    type_needs_push(type_url::ROUTE, node, &req),
                    "{kinds:?} {node:?}"
                );
            }
        }
    }

    #[test]
    fn a_gateway_change_reaches_gateways_clusters_listeners_and_routes_only() {
        let req = change(&[Gateway]);
        // clusters: an AUTO_PASSTHROUGH server adds the SNI-DNAT clusters
        assert_eq!(pushed(NodeType::Router, &req), ["cds", "lds", "rds"]);
        assert_eq!(pushed(NodeType::SidecarProxy, &req), ["rds"]);
    }

    #[test]
    fn services_destination_rules_and_sidecars_reach_every_type() {
        for kind in [ServiceEntry, DestinationRule, Sidecar] {
            assert_eq!(
                pushed(NodeType::SidecarProxy, &change(&[kind])),
                ["cds", "eds", "lds", "rds"]
            );
        }
        let service = PushRequest::changed(
            model::TriggerReason::ServiceUpdate,
            [model::Changed::Service(model::ServiceKey::new(
                "a.ns.svc.cluster.local",
                "ns",
            ))],
        );
        assert_eq!(pushed(NodeType::SidecarProxy, &service), ["cds", "eds", "lds", "rds"]);
    }

    #[test]
    fn one_relevant_kind_among_skipped_ones_is_enough_and_empty_means_everything() {
        assert_eq!(
            pushed(NodeType::SidecarProxy, &change(&[VirtualService, Gateway])),
            ["cds", "lds", "rds"]
        );
        assert_eq!(
            pushed(
                NodeType::SidecarProxy,
                &PushRequest::full(model::TriggerReason::GlobalUpdate)
            ),
            ["cds", "eds", "lds", "rds"]
        );
        assert_eq!(pushed(NodeType::Router, &change(&[WorkloadEntry])), ["eds"]);
        assert_eq!(pushed(NodeType::Router, &change(&[ProxyConfig])), Vec::<&str>::new());
    }
}
