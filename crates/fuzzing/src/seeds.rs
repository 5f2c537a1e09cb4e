//! Seed inputs for each target: well-formed exchanges the fuzzer mutates from (`fuzz-seeds`
//! writes them to `fuzz/corpus/<target>/seed-*`).

use prost::Message;
use serde_json::json;
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use xds_api::envoy_types::pb::google::rpc::Status as RpcStatus;
use xds_api::{json_to_struct, pack, type_url};

use crate::input::join;

fn node(node_type: &str, ns: &str) -> Node {
    Node {
        id: format!("{node_type}~10.0.0.1~productpage-v1-1.{ns}~{ns}.svc.cluster.local"),
        cluster: "productpage.default".into(),
        metadata: Some(json_to_struct(&json!({
            "NAMESPACE": ns, "LABELS": {"app": "productpage", "version": "v1"},
            "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "1.26.0",
        }))),
        ..Default::default()
    }
}

fn sotw(t: &str, names: &[&str], version: &str, nonce: &str, nack: Option<&str>, node: Option<Node>) -> Vec<u8> {
    DiscoveryRequest {
        node,
        type_url: t.into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        error_detail: nack.map(|m| RpcStatus {
            code: 3,
            message: m.into(),
            details: vec![],
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn delta(t: &str, sub: &[&str], unsub: &[&str], nonce: &str, node: Option<Node>) -> Vec<u8> {
    DeltaDiscoveryRequest {
        node,
        type_url: t.into(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
    .encode_to_vec()
}

const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";

/// `(target, seeds)` for every target.
pub fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("config", config()),
        ("xds_request", xds_request()),
        ("agent_xds_proxy", agent_xds_proxy()),
        ("admission_review", crate::admission::seeds()),
        ("inject_review", crate::inject::seeds()),
        ("dns_message", crate::dns::seeds()),
        ("sds_request", crate::sds::seeds()),
        ("kube_object", crate::kube_object::seeds()),
    ]
}

fn config() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = crate::mesh::BOOKINFO.iter().map(|t| t.as_bytes().to_vec()).collect();
    seeds.push(
        br#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: regex, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {regex: "/api/v[0-9]+/.*"}, headers: {x-user: {regex: "(?i)jason"}}}]
    rewrite: {uriRegexRewrite: {match: "^/api/(.*)", rewrite: "/\\1"}}
    route: [{destination: {host: reviews, subset: v2}, weight: 100}]
    retries: {attempts: 3, perTryTimeout: 2s}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: default}
spec:
  egress: [{hosts: ["./*", "istio-system/*"]}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm, namespace: default}
spec: {address: 10.1.1.1, labels: {app: reviews, version: v3}}
"#
        .to_vec(),
    );
    seeds
}

fn xds_request() -> Vec<Vec<u8>> {
    let n = || Some(node("sidecar", "default"));
    let g = || Some(node("router", "istio-system"));
    let sotw_stream = join(&[
        (0, sotw(type_url::CLUSTER, &[], "", "", None, n())),
        (0, sotw(type_url::CLUSTER, &[], "v1", "n1", None, None)),
        (0, sotw(type_url::ENDPOINT, &[REVIEWS], "", "", None, None)),
        (0, sotw(type_url::LISTENER, &[], "", "", None, None)),
        (0, sotw(type_url::ROUTE, &["9080", "80"], "", "", None, None)),
        (
            0,
            sotw(
                type_url::ROUTE,
                &["9080"],
                "v1",
                "n2",
                Some("rejected: bad regex"),
                None,
            ),
        ),
    ]);
    let gateway = join(&[
        (0, sotw(type_url::CLUSTER, &[], "", "", None, g())),
        (0, sotw(type_url::LISTENER, &[], "", "", None, None)),
        (0, sotw(type_url::ROUTE, &["http.8080", "http.80"], "", "", None, None)),
    ]);
    let delta_stream = join(&[
        (0, delta(type_url::CLUSTER, &["*"], &[], "", n())),
        (0, delta(type_url::ENDPOINT, &[REVIEWS], &[], "", None)),
        (0, delta(type_url::ENDPOINT, &[], &[REVIEWS], "n1", None)),
        (0, delta(type_url::LISTENER, &["*"], &[], "", None)),
    ]);
    let mut seeds = Vec::new();
    seeds.push([vec![0], sotw_stream.clone()].concat());
    seeds.push([vec![0], gateway].concat());
    seeds.push([vec![1], delta_stream].concat());
    // Raw body mode: the same messages framed by hand, split at odd places.
    let framed = crate::xds::grpc_frame(&sotw(type_url::CLUSTER, &[], "", "", None, n()));
    let (a, b) = framed.split_at(3);
    seeds.push([vec![2], join(&[(0, a.to_vec()), (0, b.to_vec())])].concat());
    seeds
}

fn agent_xds_proxy() -> Vec<Vec<u8>> {
    let cluster = pack(&Cluster {
        name: REVIEWS.into(),
        ..Default::default()
    });
    let cds = DiscoveryResponse {
        version_info: "v1".into(),
        type_url: type_url::CLUSTER.into(),
        nonce: "n1".into(),
        resources: vec![cluster.clone()],
        ..Default::default()
    };
    let nds = DiscoveryResponse {
        version_info: "v1".into(),
        type_url: super::agent_proxy::NDS.into(),
        nonce: "n2".into(),
        resources: vec![xds_api::pbwkt::Any {
            type_url: super::agent_proxy::NDS.into(),
            value: vec![0x0a, 0x00],
        }],
        ..Default::default()
    };
    let delta_cds = DeltaDiscoveryResponse {
        system_version_info: "v1".into(),
        type_url: type_url::CLUSTER.into(),
        nonce: "d1".into(),
        resources: vec![Resource {
            name: REVIEWS.into(),
            version: "1".into(),
            resource: Some(cluster),
            ..Default::default()
        }],
        removed_resources: vec!["gone".into()],
        ..Default::default()
    };
    let n = || Some(node("sidecar", "default"));
    vec![
        [
            vec![0],
            join(&[
                (0, sotw(type_url::CLUSTER, &[], "", "", None, n())),
                (1, cds.encode_to_vec()),
                (1, nds.encode_to_vec()),
                (0, sotw(type_url::CLUSTER, &[], "v1", "n1", None, None)),
                (
                    0,
                    sotw(type_url::CLUSTER, &[], "v1", "n1", Some("NACK: cluster rejected"), None),
                ),
            ]),
        ]
        .concat(),
        [
            vec![1],
            join(&[
                (0, delta(type_url::CLUSTER, &["*"], &[], "", n())),
                (1, delta_cds.encode_to_vec()),
                (0, delta(type_url::CLUSTER, &[], &[], "d1", None)),
            ]),
        ]
        .concat(),
    ]
}

#[cfg(test)]
mod tests {
    /// The seeds are real exchanges: each gets answers (else the fuzzers start from nothing).
    #[test]
    fn seeds_are_answered() {
        for seed in super::xds_request() {
            let bytes = crate::xds::exchange(&seed);
            assert!(bytes > 100, "xds_request seed answered with {bytes} bytes");
        }
        for seed in super::agent_xds_proxy() {
            let n = crate::agent_proxy::exchange(&seed);
            // CDS reaches Envoy; NDS stays in the agent.
            assert_eq!(n, 1, "agent_xds_proxy seed: {n} responses reached Envoy");
        }
        // every query that parses is answered (from the table, or by the stub resolver)
        let answered: Vec<usize> = crate::dns::seeds().iter().map(|s| crate::dns::exchange(s)).collect();
        assert_eq!(answered, [1, 3, 2, 1, 3, 1], "dns_message seeds answered");
        // an ACK, a NACK, a missing file and DeltaSecrets get nothing; the rest a response each
        let responses: Vec<usize> = crate::sds::seeds().iter().map(|s| crate::sds::exchange(s)).collect();
        assert_eq!(responses, [1, 2, 2, 1, 0, 0], "sds_request seeds' responses");
    }
}
