//! A Pod's service targets, as Istio's Kubernetes controller finds them for the Pod's proxy
//! (`pilot/pkg/serviceregistry/kube/controller`: `GetProxyServiceTargets`, `getPodServices`,
//! `GetProxyServiceTargetsByPod`, `FindPort`): the ports of the Services of the Pod's namespace
//! whose selector matches its labels, whether or not the Pod is ready and has endpoints yet. A
//! sidecar builds its inbound listeners from them from its first push, before its Pod is ready.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Service as KubeService, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use model::{Service, ServiceKey, WorkloadTarget};

/// Istio's `labels.Instance.Match`: a non-empty selector whose every label the Pod has.
pub(crate) fn selects(svc: &KubeService, labels: Option<&BTreeMap<String, String>>) -> bool {
    let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    !selector.is_empty() && labels.is_some_and(|labels| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The targets of `pod` in `services` (the Services of its namespace with what each converts
/// to), in Service then port order; one per (target port, protocol) of a Service, as Istio
/// dedupes them. `None` when no Service selects the Pod (Istio then reads the endpoints at the
/// proxy's IP: a headless Service without selector).
pub(crate) fn service_targets<'a>(
    pod: &Pod,
    services: impl Iterator<Item = (&'a KubeService, &'a Service)>,
) -> Option<Vec<WorkloadTarget>> {
    let labels = pod.metadata.labels.as_ref();
    let mut out = Vec::new();
    let mut selected = false;
    for (svc, converted) in services.filter(|(svc, _)| selects(svc, labels)) {
        selected = true;
        let mut seen = Vec::new();
        for port in svc.spec.as_ref().and_then(|s| s.ports.as_ref()).into_iter().flatten() {
            let name = port.name.clone().unwrap_or_default();
            let Some(service_port) = converted.ports.iter().find(|p| p.name == name) else {
                continue;
            };
            let Some(target_port) = find_port(pod, port) else {
                continue;
            };
            if seen.contains(&(target_port, service_port.protocol)) {
                continue;
            }
            seen.push((target_port, service_port.protocol));
            out.push(WorkloadTarget {
                service: ServiceKey::of(converted),
                port_name: name,
                target_port,
            });
        }
    }
    selected.then_some(out)
}

/// Istio's `FindPort`: a numeric `targetPort` as is (unset: the port itself, as the API server
/// defaults it), a named one looked up in the Pod's containers' ports of the same protocol, then
/// in its native sidecars' (init containers with `restartPolicy: Always`).
fn find_port(pod: &Pod, port: &ServicePort) -> Option<u16> {
    match &port.target_port {
        None => u16::try_from(port.port).ok().filter(|p| *p != 0),
        Some(IntOrString::Int(n)) => u16::try_from(*n).ok().filter(|p| *p != 0),
        Some(IntOrString::String(name)) => {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c: &Container| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
                .and_then(|p| u16::try_from(p.container_port).ok())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::conversion::convert_service;
    use serde_json::json;

    fn service(name: &str, selector: serde_json::Value, ports: serde_json::Value) -> (KubeService, Service) {
        let svc: KubeService = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "apps"},
            "spec": {"selector": selector, "ports": ports}}))
        .unwrap();
        let converted = convert_service(&svc, &crate::tests::ctx()).unwrap();
        (svc, converted)
    }

    fn pod(labels: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "web-1", "namespace": "apps", "labels": labels},
            "spec": {"containers": [{"name": "web", "ports": [{"name": "http", "containerPort": 8080}]}],
                "initContainers": [{"name": "istio-proxy", "restartPolicy": "Always",
                    "ports": [{"name": "http-envoy-prom", "containerPort": 15090}]}]}}),
        )
        .unwrap()
    }

    #[test]
    fn the_services_selecting_the_pod_give_its_targets() {
        let web = service(
            "web",
            json!({"app": "web"}),
            json!([{"name": "http", "port": 80, "targetPort": "http"}, {"name": "http-alt", "port": 81, "targetPort": 8080},
                   {"name": "grpc", "port": 9000}, {"name": "prom", "port": 15090, "targetPort": "http-envoy-prom"},
                   {"name": "gone", "port": 82, "targetPort": "missing"}]),
        );
        let other = service("db", json!({"app": "db"}), json!([{"name": "tcp", "port": 5432}]));
        let targets = service_targets(
            &pod(json!({"app": "web", "version": "v1"})),
            [(&web.0, &web.1), (&other.0, &other.1)].into_iter(),
        )
        .unwrap();
        let got: Vec<(&str, &str, u16)> = targets
            .iter()
            .map(|t| (t.service.hostname.as_str(), t.port_name.as_str(), t.target_port))
            .collect();
        assert_eq!(
            got,
            [
                ("web.apps.svc.cluster.local", "http", 8080),
                ("web.apps.svc.cluster.local", "grpc", 9000),
                ("web.apps.svc.cluster.local", "prom", 15090),
            ],
            "8080 once (the first port naming it), a named port of a native sidecar, no unknown name"
        );
    }

    #[test]
    fn no_selecting_service_is_none_and_an_empty_selector_selects_nothing() {
        let empty = service("headless", json!({}), json!([{"name": "tcp", "port": 1}]));
        let other = service("db", json!({"app": "db"}), json!([{"name": "tcp", "port": 5432}]));
        let p = pod(json!({"app": "web"}));
        assert_eq!(
            service_targets(&p, [(&empty.0, &empty.1), (&other.0, &other.1)].into_iter()),
            None
        );
    }
}
