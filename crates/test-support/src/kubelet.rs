//! A kubelet for end-to-end tests, against the fake API server ([`crate::kube_api`]): it takes a
//! Pod as the API server stored it (after mutating admission, e.g. Istio's injection) and turns
//! each container into what a container runtime runs ([`Container`], started in a network
//! namespace by [`crate::netns::Pod::start_container`]): the command line and environment
//! (`env.rs`: `$(VAR)`, `fieldRef`, `resourceFieldRef`, the `kubernetes` service's variables),
//! the volumes as files (`volumes.rs`), the user, group and capabilities of the
//! `securityContext`, and the HTTP probes; `pod.rs` runs a whole Pod in the kubelet's order. It
//! also plays the scheduler's binding and writes the Pod's status (node, IPs, phase, readiness)
//! back, as the kubelet does.
//!
//! Mirrors Kubernetes' `pkg/kubelet` (`kubelet_pods.go`, `prober`, `volumemanager`) and
//! `pkg/securitycontext`, for what Istio's Pods use; what it cannot do is an error that says so.

mod env;
mod pod;
mod volumes;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

pub use env::{command_line, container_env, expand, field_ref, format_map, quantity};
pub use pod::{Run, RunningPod};
pub use volumes::{Mount, SERVICE_ACCOUNT_PATH, Volumes};

use crate::kube_api::FakeApiServer;
use crate::netns::{Container, Image};

/// The node a kubelet runs on.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    /// Its InternalIP (a Pod's `status.hostIP`).
    pub ip: IpAddr,
    /// Allocatable CPUs (a `limits.cpu` that a container does not set).
    pub cpus: u32,
    /// Allocatable memory in bytes.
    pub memory: u64,
}

/// The kubelet of one [`Node`], reading and writing the Pods of `api`.
pub struct Kubelet<'a> {
    pub api: &'a FakeApiServer,
    pub node: Node,
}

/// The Linux capabilities a container runtime (containerd, CRI-O) gives a container by default.
const DEFAULT_CAPS: [&str; 14] = [
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

impl<'a> Kubelet<'a> {
    pub fn new(api: &'a FakeApiServer, node: Node) -> Kubelet<'a> {
        Kubelet { api, node }
    }

    /// Registers the Node (kubelet 1.33, so that Istio injects native sidecars) with its address
    /// and allocatable resources.
    pub fn register(&self) -> anyhow::Result<()> {
        self.api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": self.node.name, "labels": {"kubernetes.io/hostname": self.node.name}},
        "status": {
            "nodeInfo": {"kubeletVersion": "v1.33.2"},
            "addresses": [{"type": "InternalIP", "address": self.node.ip.to_string()}],
            "allocatable": {"cpu": self.node.cpus.to_string(), "memory": self.node.memory.to_string()},
        }}))?;
        Ok(())
    }

    /// The scheduler's binding of `pod` (as stored) to this node and the kubelet's first status
    /// with the Pod's sandbox address `ip`; returns the Pod as stored.
    pub fn bind(&self, pod: &Value, ip: Ipv4Addr) -> anyhow::Result<Value> {
        let mut pod = pod.clone();
        pod["spec"]["nodeName"] = json!(self.node.name);
        pod["status"] = json!({
            "phase": "Running",
            "hostIP": self.node.ip.to_string(), "hostIPs": [{"ip": self.node.ip.to_string()}],
            "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        });
        self.api.apply(pod)
    }

    /// Writes the Pod's Ready condition (what the EndpointSlice controller follows).
    pub fn set_ready(&self, pod: &Value) -> anyhow::Result<Value> {
        let namespace = field_ref(pod, "metadata.namespace")?;
        let name = field_ref(pod, "metadata.name")?;
        let mut pod = self
            .api
            .get("v1", "Pod", &namespace, &name)
            .ok_or_else(|| anyhow!("Pod {namespace}/{name} is gone"))?;
        pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"},
            {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]);
        self.api.apply(pod)
    }

    /// The `kubernetes` Service's variables that the kubelet gives every container (service links
    /// of the Pod's own namespace are not given).
    pub fn service_env(&self) -> Vec<(String, String)> {
        let addr = self.api.addr();
        let (host, port) = (addr.ip().to_string(), addr.port().to_string());
        let url = format!("tcp://{host}:{port}");
        let pre = format!("KUBERNETES_PORT_{port}_TCP");
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
            ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
            ("KUBERNETES_PORT".into(), url.clone()),
            (pre.clone(), url),
            (format!("{pre}_PROTO"), "tcp".into()),
            (format!("{pre}_PORT"), port),
            (format!("{pre}_ADDR"), host),
        ]
    }

    /// The container `name` of the stored `pod` (an init container or not) as `image` runs it:
    /// the command line, the image's env then the container's, the volume mounts, and the user,
    /// group and capabilities of its `securityContext` over the Pod's.
    pub fn container(&self, pod: &Value, name: &str, image: &Image, volumes: &Volumes) -> anyhow::Result<Container> {
        let spec = container_spec(pod, name)?;
        let mut env = image.env.clone();
        for (k, v) in container_env(pod, spec, &self.node, &self.service_env())? {
            env.retain(|(n, _)| *n != k);
            env.push((k, v));
        }
        let argv = command_line(spec, &image.entrypoint, &env);
        if argv.is_empty() {
            bail!("container {name}: no command and the image has no entrypoint");
        }
        let sc = |field: &str| {
            spec.pointer(&format!("/securityContext/{field}"))
                .or_else(|| pod.pointer(&format!("/spec/securityContext/{field}")))
        };
        let id = |field: &str, image_id: u32| -> anyhow::Result<u32> {
            match sc(field) {
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| anyhow!("container {name}: securityContext.{field} {v} is not an id")),
                None => Ok(image_id),
            }
        };
        let uid = id("runAsUser", image.user.0)?;
        let gid = id("runAsGroup", image.user.1)?;
        if uid == 0 && sc("runAsNonRoot").and_then(Value::as_bool) == Some(true) {
            bail!("container {name} has runAsNonRoot and would run as root (the kubelet refuses to start it)");
        }
        let caps_of = |list: &str| -> Vec<String> {
            spec.pointer(&format!("/securityContext/capabilities/{list}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_ascii_lowercase)
                .collect()
        };
        let drop = caps_of("drop");
        let mut caps: Vec<String> = if drop.iter().any(|c| c == "all") {
            Vec::new()
        } else {
            DEFAULT_CAPS
                .iter()
                .map(|c| (*c).to_owned())
                .filter(|c| !drop.contains(c))
                .collect()
        };
        caps.extend(caps_of("add"));
        let fs_group = pod
            .pointer("/spec/securityContext/fsGroup")
            .and_then(Value::as_u64)
            .and_then(|g| u32::try_from(g).ok());
        Ok(Container {
            name: name.to_owned(),
            argv,
            env,
            mounts: volumes.mounts(spec)?,
            layer: image.layer().to_path_buf(),
            workdir: image.workdir.clone(),
            uid,
            gid,
            groups: fs_group.into_iter().collect(),
            caps,
            no_new_privs: sc("allowPrivilegeEscalation").and_then(Value::as_bool) == Some(false),
        })
    }

    /// Runs the container's `probe` (`startupProbe`, `readinessProbe`, `livenessProbe`) once as
    /// the kubelet's prober does, from the node to the Pod's IP: `Ok(true)` for a 2xx or 3xx
    /// answer, `Ok(false)` for another answer or none; `Ok(true)` when the container has no
    /// such probe.
    pub async fn probe(&self, pod: &Value, name: &str, probe: &str) -> anyhow::Result<bool> {
        let spec = container_spec(pod, name)?;
        let Some(p) = spec.get(probe) else {
            return Ok(true);
        };
        let get = p
            .get("httpGet")
            .ok_or_else(|| anyhow!("container {name} {probe}: the test's kubelet runs httpGet probes only: {p}"))?;
        let port = match &get["port"] {
            Value::Number(n) => n.to_string(),
            Value::String(named) => spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|cp| cp["name"] == named.as_str())
                .map(|cp| cp["containerPort"].to_string())
                .ok_or_else(|| anyhow!("container {name} {probe}: no port named {named}"))?,
            other => bail!("container {name} {probe}: port {other}"),
        };
        let host = match get["host"].as_str() {
            Some(h) if !h.is_empty() => h.to_owned(),
            _ => field_ref(pod, "status.podIP")?,
        };
        let scheme = get["scheme"].as_str().unwrap_or("HTTP").to_ascii_lowercase();
        let url = format!("{scheme}://{host}:{port}{}", get["path"].as_str().unwrap_or("/"));
        let mut headers: Vec<(String, String)> = vec![("user-agent".into(), "kube-probe/1.33".into())];
        for h in get["httpHeaders"].as_array().into_iter().flatten() {
            headers.push((
                h["name"].as_str().unwrap_or_default().to_owned(),
                h["value"].as_str().unwrap_or_default().to_owned(),
            ));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let timeout = Duration::from_secs(p["timeoutSeconds"].as_u64().unwrap_or(1));
        let answer = crate::backend::http_request("GET", &url, &headers, Vec::new(), timeout).await;
        Ok(answer.is_ok_and(|r| (200..400).contains(&r.status)))
    }

    /// Probes until the probe passes, failing after `timeout` with `why()` (a log, say).
    pub async fn wait_probe(
        &self,
        pod: &Value,
        name: &str,
        probe: &str,
        timeout: Duration,
        why: impl Fn() -> String,
    ) -> anyhow::Result<Duration> {
        let start = std::time::Instant::now();
        loop {
            if self.probe(pod, name, probe).await? {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!("container {name}: {probe} did not pass within {timeout:?}:\n{}", why());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The container `name` of the Pod (init containers included).
pub fn container_spec<'p>(pod: &'p Value, name: &str) -> anyhow::Result<&'p Value> {
    let spec = &pod["spec"];
    spec["initContainers"]
        .as_array()
        .into_iter()
        .chain(spec["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .with_context(|| format!("the Pod has no container {name}"))
}
