//! What the injector derives from the request besides the Pod: the owning workload (Istio's
//! `kube.GetDeployMetaFromPod`), proxy env vars from the webhook path (`parseInjectEnvs`), the
//! proxy images (`ProxyImage`, `ProxyInitImage`), the cluster and network
//! (`extractClusterAndNetwork`) and OpenShift's proxy UID/GID (`GetProxyIDs`, `openshift.go`).

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::config::InjectorConfig;

/// The workload that owns the Pod: `(namespace, name)` and `(apiVersion, kind)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct DeployMeta {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) api_version: String,
    pub(crate) kind: String,
}

fn s<'a>(v: &'a Json, p: &str) -> &'a str {
    v.pointer(p).and_then(Json::as_str).unwrap_or_default()
}

/// Istio's `GetDeployMetaFromPod`: the controller reference of a Pod with a generated name,
/// with the Deployment, Argo Rollout, DeploymentConfig and CronJob heuristics.
pub(crate) fn deploy_meta(pod: &Json) -> DeployMeta {
    let mut m = DeployMeta {
        name: s(pod, "/metadata/name").to_string(),
        namespace: s(pod, "/metadata/namespace").to_string(),
        api_version: "v1".into(),
        kind: "Pod".into(),
    };
    let label = |k: &str| {
        pod.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Json::as_str)
            .unwrap_or_default()
    };
    if !s(pod, "/metadata/generateName").is_empty() {
        let owners = pod.pointer("/metadata/ownerReferences").and_then(Json::as_array);
        let controller = owners.and_then(|o| {
            o.iter()
                .find(|r| r.get("controller").and_then(Json::as_bool) == Some(true))
        });
        if let Some(r) = controller {
            m.api_version = s(r, "/apiVersion").to_string();
            m.kind = s(r, "/kind").to_string();
            let owner = s(r, "/name");
            m.name = owner.to_string();
            let hash = label("pod-template-hash");
            let rollout_hash = label("rollouts-pod-template-hash");
            if m.kind == "ReplicaSet" && !hash.is_empty() && owner.ends_with(hash) {
                m.name = owner.strip_suffix(&format!("-{hash}")).unwrap_or(owner).to_string();
                m.kind = "Deployment".into();
            } else if m.kind == "ReplicaSet" && !rollout_hash.is_empty() && owner.ends_with(rollout_hash) {
                m.name = owner
                    .strip_suffix(&format!("-{rollout_hash}"))
                    .unwrap_or(owner)
                    .to_string();
                m.kind = "Rollout".into();
                m.api_version = "v1alpha1".into();
            } else if m.kind == "ReplicationController" && !label("deploymentconfig").is_empty() {
                m.name = label("deploymentconfig").to_string();
                m.kind = "DeploymentConfig".into();
                m.api_version = "v1".into();
            } else if m.kind == "Job"
                && let Some((base, ts)) = owner.rsplit_once('-')
                && !base.is_empty()
                && (8..=10).contains(&ts.len())
                && ts.bytes().all(|b| b.is_ascii_digit())
            {
                m.name = base.to_string();
                m.kind = "CronJob".into();
                m.api_version = "batch/v1".into();
            }
        }
    }
    if m.name.is_empty() {
        m.name = s(pod, "/metadata/name").to_string();
    }
    m
}

/// Istio's `parseInjectEnvs`: `/inject/k1/v1/k2/v2` (or the deprecated `:ENV:k=v`) as proxy env
/// vars; `cluster` and `net` are `ISTIO_META_CLUSTER_ID` and `ISTIO_META_NETWORK`, other keys
/// upper-cased; `--slash--` in a value is `/`.
pub fn parse_inject_envs(path: &str) -> BTreeMap<String, String> {
    let path = path.strip_suffix('/').unwrap_or(path);
    let parts: Vec<&str> = path.splitn(3, '/').collect();
    let mut kv: Vec<String> = Vec::new();
    if let [_, _, rest] = parts.as_slice() {
        if rest.starts_with(":ENV:") {
            for pair in rest.split(":ENV:").skip(1) {
                if let Some((k, v)) = pair.split_once('=')
                    && !k.is_empty()
                {
                    kv.push(k.to_string());
                    kv.push(v.to_string());
                }
            }
        } else {
            for (i, p) in rest.split('/').enumerate() {
                kv.push(if i % 2 == 1 {
                    p.replace("--slash--", "/")
                } else {
                    p.to_string()
                });
            }
        }
    }
    let mut envs = BTreeMap::new();
    for pair in kv.chunks(2) {
        let [k, v] = pair else { break };
        let env = match k.as_str() {
            "cluster" => "ISTIO_META_CLUSTER_ID".to_string(),
            "net" => "ISTIO_META_NETWORK".to_string(),
            other => other.to_uppercase(),
        };
        if !env.is_empty() {
            envs.insert(env, v.clone());
        }
    }
    envs
}

/// Istio's `extractClusterAndNetwork`: values, then the webhook path, then the Pod's
/// `topology.istio.io/network` label.
pub(crate) fn cluster_and_network(
    cfg: &InjectorConfig,
    envs: &BTreeMap<String, String>,
    pod: &Json,
) -> (String, String) {
    let mut cluster = cfg.value_str("/global/multiCluster/clusterName");
    let mut network = cfg.value_str("/global/network");
    if let Some(c) = envs.get("ISTIO_META_CLUSTER_ID").filter(|c| !c.is_empty()) {
        cluster = c.clone();
    }
    if let Some(n) = envs.get("ISTIO_META_NETWORK").filter(|n| !n.is_empty()) {
        network = n.clone();
    }
    if let Some(n) = pod
        .pointer("/metadata/labels/topology.istio.io~1network")
        .and_then(Json::as_str)
    {
        network = n.to_string();
    }
    (cluster, network)
}

/// Istio's `ProxyImage` (`image_name` `proxyv2` unless values say) and `ProxyInitImage`.
pub(crate) fn proxy_image(cfg: &InjectorConfig, name_pointer: &str, image_type: &str, annotations: &Json) -> String {
    let name = Some(cfg.value_str(name_pointer))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "proxyv2".into());
    let mut image_type = if image_type.is_empty() {
        cfg.value_str("/global/variant")
    } else {
        image_type.to_string()
    };
    if let Some(t) = annotations
        .get("sidecar.istio.io/proxyImageType")
        .and_then(Json::as_str)
    {
        image_type = t.to_string();
    }
    let tag = cfg.value_str("/global/tag");
    format!(
        "{}/{name}:{}",
        cfg.value_str("/global/hub"),
        image_tag(&tag, &image_type)
    )
}

/// Istio's `updateImageTypeIfPresent`: the tag with its known type suffix replaced.
fn image_tag(tag: &str, image_type: &str) -> String {
    if image_type.is_empty() {
        return tag.to_string();
    }
    let mut tag = tag;
    for known in ["distroless", "debug"] {
        if let Some(t) = tag.strip_suffix(&format!("-{known}")) {
            tag = t;
            break;
        }
    }
    if image_type == "default" {
        tag.to_string()
    } else {
        format!("{tag}-{image_type}")
    }
}

/// Istio's `GetProxyIDs`: 1337, or on OpenShift the top of the namespace's UID range
/// (`openshift.io/sa.scc.uid-range`) and supplemental groups (`openshift.io/sa.scc.supplemental-groups`).
pub(crate) fn proxy_ids(namespace_annotations: Option<&BTreeMap<String, String>>) -> (i64, i64) {
    let Some(anns) = namespace_annotations else {
        return (1337, 1337);
    };
    let uid = anns
        .get("openshift.io/sa.scc.uid-range")
        .and_then(|r| range_max(r))
        .unwrap_or(1337);
    let gid = anns
        .get("openshift.io/sa.scc.supplemental-groups")
        .and_then(|g| g.split(',').next().and_then(range_max))
        .unwrap_or(1337);
    (uid, gid)
}

/// The largest ID of an OpenShift range, `start/size` or `start-end`.
fn range_max(r: &str) -> Option<i64> {
    let r = r.trim();
    if let Some((start, size)) = r.split_once('/') {
        let (start, size) = (start.trim().parse::<i64>().ok()?, size.trim().parse::<i64>().ok()?);
        return (size > 0).then_some(start + size - 1);
    }
    let (_, end) = r.split_once('-')?;
    end.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deploy_meta_from_owner_references() {
        let pod = json!({"metadata": {"generateName": "hello-fake-", "labels": {"pod-template-hash": "fake"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "hello-fake", "controller": true}]}});
        let m = deploy_meta(&pod);
        assert_eq!(
            (m.name.as_str(), m.kind.as_str(), m.api_version.as_str()),
            ("hello", "Deployment", "apps/v1")
        );
        let job = json!({"metadata": {"generateName": "x", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "cron-12345678", "controller": true}]}});
        assert_eq!(deploy_meta(&job).kind, "CronJob");
        let plain = json!({"metadata": {"name": "p", "namespace": "ns"}});
        assert_eq!(
            deploy_meta(&plain),
            DeployMeta {
                name: "p".into(),
                namespace: "ns".into(),
                api_version: "v1".into(),
                kind: "Pod".into()
            }
        );
    }

    #[test]
    fn inject_envs_from_the_path() {
        let e = parse_inject_envs("/inject/cluster/c1/net/n--slash--1/extra");
        assert_eq!(e.get("ISTIO_META_CLUSTER_ID").map(String::as_str), Some("c1"));
        assert_eq!(e.get("ISTIO_META_NETWORK").map(String::as_str), Some("n/1"));
        assert_eq!(e.len(), 2);
        let e = parse_inject_envs("/inject/:ENV:cluster=c2:ENV:foo=bar:ENV:=x");
        assert_eq!(e.get("ISTIO_META_CLUSTER_ID").map(String::as_str), Some("c2"));
        assert_eq!(e.get("FOO").map(String::as_str), Some("bar"));
        assert!(parse_inject_envs("/inject").is_empty());
    }

    /// Istio's `TestParseInjectEnvs`.
    #[test]
    fn parse_inject_envs_as_istio() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("/", &[]),
            ("/inject", &[]),
            ("/inject/", &[]),
            ("/inject/cluster/cluster1", &[("ISTIO_META_CLUSTER_ID", "cluster1")]),
            (
                "/inject/cluster/cluster1/net/network1/",
                &[
                    ("ISTIO_META_CLUSTER_ID", "cluster1"),
                    ("ISTIO_META_NETWORK", "network1"),
                ],
            ),
            (
                "/inject/cluster/cluster--slash--1/net/network--slash--1",
                &[
                    ("ISTIO_META_CLUSTER_ID", "cluster/1"),
                    ("ISTIO_META_NETWORK", "network/1"),
                ],
            ),
            (
                "/inject/cluster/cluster1/custom_env/foo",
                &[("ISTIO_META_CLUSTER_ID", "cluster1"), ("CUSTOM_ENV", "foo")],
            ),
            ("/inject/cluster", &[]),
            (
                "/inject/cluster/cluster1/network",
                &[("ISTIO_META_CLUSTER_ID", "cluster1")],
            ),
            (
                "/inject/:ENV:cluster=cluster2:ENV:rootpage=/foo/bar",
                &[("ISTIO_META_CLUSTER_ID", "cluster2"), ("ROOTPAGE", "/foo/bar")],
            ),
            (
                "/inject/rootpage1/value1/rootpage2/:ENV:abcd=efgh",
                &[("ROOTPAGE1", "value1"), ("ROOTPAGE2", ":ENV:abcd=efgh")],
            ),
            ("/inject/:ENV:rootpage1=efgh:ENV:=abb:ENV:=", &[("ROOTPAGE1", "efgh")]),
        ];
        for (path, want) in cases {
            let want: BTreeMap<String, String> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(parse_inject_envs(path), want, "{path}");
        }
    }

    /// Istio's `TestProxyImage`.
    #[test]
    fn proxy_image_as_istio() {
        let cases: &[(&str, Json, &str, &str, &str)] = &[
            (
                "registry.istio.io/release",
                json!(11),
                "",
                "",
                "registry.istio.io/release/proxyv2:11",
            ),
            (
                "registry.istio.io/release",
                json!(1.12),
                "distroless",
                "",
                "registry.istio.io/release/proxyv2:1.12-distroless",
            ),
            (
                "gcr.io/gke-release/asm",
                json!("1.11.2-asm.17"),
                "",
                "distroless",
                "gcr.io/gke-release/asm/proxyv2:1.11.2-asm.17-distroless",
            ),
            (
                "gcr.io/gke-release/asm",
                json!("1.11.2-asm.17"),
                "distroless",
                "debug",
                "gcr.io/gke-release/asm/proxyv2:1.11.2-asm.17-debug",
            ),
            (
                "gcr.io/gke-release/asm",
                json!("1.11.2-asm.17"),
                "debug",
                "default",
                "gcr.io/gke-release/asm/proxyv2:1.11.2-asm.17",
            ),
            (
                "gcr.io/gke-release/asm",
                json!("1.11.2-asm.17-distroless"),
                "default",
                "",
                "gcr.io/gke-release/asm/proxyv2:1.11.2-asm.17",
            ),
            (
                "gcr.io/gke-release/asm",
                json!("1.11.2-asm.17-distroless"),
                "",
                "default",
                "gcr.io/gke-release/asm/proxyv2:1.11.2-asm.17",
            ),
            (
                "registry.istio.io/release",
                json!("1.12-debug"),
                "distroless",
                "",
                "registry.istio.io/release/proxyv2:1.12-distroless",
            ),
            (
                "registry.istio.io/release",
                json!("1.12-distroless"),
                "",
                "distroless",
                "registry.istio.io/release/proxyv2:1.12-distroless",
            ),
            (
                "private-repo/istio",
                json!("1.12-this-is-unusual-tag"),
                "",
                "",
                "private-repo/istio/proxyv2:1.12-this-is-unusual-tag",
            ),
            (
                "private-repo/istio",
                json!("1.12-this-is-unusual-tag-distroless"),
                "default",
                "",
                "private-repo/istio/proxyv2:1.12-this-is-unusual-tag",
            ),
            (
                "private-repo/istio",
                json!("1.12-this-is-unusual-tag"),
                "",
                "distroless",
                "private-repo/istio/proxyv2:1.12-this-is-unusual-tag-distroless",
            ),
        ];
        for (hub, tag, pc_type, ann_type, want) in cases {
            let values = json!({"global": {"hub": hub, "tag": tag}}).to_string();
            let cfg = InjectorConfig::parse("policy: enabled", &values).unwrap_or_else(|e| panic!("{e}"));
            let anns = if ann_type.is_empty() {
                json!({})
            } else {
                json!({"sidecar.istio.io/proxyImageType": ann_type})
            };
            assert_eq!(
                proxy_image(&cfg, "/global/proxy/image", pc_type, &anns),
                *want,
                "{hub} {tag} {pc_type} {ann_type}"
            );
        }
    }

    #[test]
    fn image_types_and_openshift_ids() {
        assert_eq!(image_tag("1.2-distroless", "debug"), "1.2-debug");
        assert_eq!(image_tag("1.2-distroless", "default"), "1.2");
        assert_eq!(image_tag("1.2", ""), "1.2");
        let anns: BTreeMap<String, String> = [
            (
                "openshift.io/sa.scc.uid-range".to_string(),
                "1000620000/10000".to_string(),
            ),
            (
                "openshift.io/sa.scc.supplemental-groups".to_string(),
                "1000620000/10000".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(proxy_ids(Some(&anns)), (1000629999, 1000629999));
        assert_eq!(proxy_ids(None), (1337, 1337));
    }
}
