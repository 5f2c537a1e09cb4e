//! A stored Pod run as the kubelet runs it (`pkg/kubelet/kuberuntime`
//! `SyncPod`): its sandbox (a network namespace on a test [`Network`], bound to the node and its
//! status written), its volumes (waiting, as the kubelet does, for a ConfigMap or Secret that is
//! not there yet), its init containers in order to completion, a native sidecar (an init
//! container with `restartPolicy: Always`) left running once its startup probe passes, then its
//! containers; ready once every readiness probe passes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::Value;

use super::Kubelet;
use crate::netns::{Image, Network, Pod, tail};

/// How a container of the Pod runs here.
pub enum Run<'i> {
    /// From this image, as written.
    Image(&'i Image),
    /// An image the test does not have: a small HTTP backend on this port in its place
    /// ([`Pod::start_named_app`], answering as the Pod's name).
    Backend(u16),
    /// Nothing (e.g. a client that only sleeps; the test runs its commands in the Pod).
    Nothing,
}

/// A Pod running in its sandbox.
pub struct RunningPod {
    pub pod: Pod,
    /// The Pod as stored, bound, with its status.
    pub stored: Value,
    /// Each init container's output that ran to completion.
    pub init_output: BTreeMap<String, String>,
    /// Each native sidecar's time from its start to its startup probe's first pass.
    pub startup: BTreeMap<String, Duration>,
    /// The environment each container started from an image had.
    pub env: BTreeMap<String, Vec<(String, String)>>,
}

impl Kubelet<'_> {
    /// The Pod's sandbox on `net` (`hosts`: its extra `/etc/hosts` lines), bound to this node
    /// with its IP in its status.
    pub fn sandbox(&self, net: &Network, stored: &Value, hosts: &[&str]) -> anyhow::Result<(Pod, Value)> {
        let name = stored["metadata"]["name"].as_str().context("a named Pod")?;
        let pod = net.pod(name, hosts)?;
        let stored = self.bind(stored, pod.ip)?;
        Ok((pod, stored))
    }

    /// Runs the containers of `stored` (bound, see [`sandbox`](Self::sandbox)) in `pod`, each
    /// as `run` says, and writes the Pod ready; fails with the container's log when one fails.
    pub async fn run_pod<'i>(
        &self,
        mut pod: Pod,
        stored: Value,
        run: impl Fn(&Value) -> anyhow::Result<Run<'i>>,
    ) -> anyhow::Result<RunningPod> {
        let name = stored["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let dir = pod.dir.path().join("volumes");
        let deadline = Instant::now() + Duration::from_secs(30);
        let volumes = loop {
            match self.volumes(&stored, &dir) {
                Ok(v) => break v,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("kubelet: Pod {name}: {e:#} (waiting)");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let (mut init_output, mut startup, mut env) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let spec = &stored["spec"];
        let list = |field: &str| spec[field].as_array().cloned().unwrap_or_default();
        let (inits, containers) = (list("initContainers"), list("containers"));
        for c in &inits {
            let cname = c["name"].as_str().unwrap_or_default();
            let Run::Image(image) = run(c)? else {
                anyhow::bail!("init container {cname} of {name}: runs from an image only");
            };
            let container = self.container(&stored, cname, image, &volumes)?;
            env.insert(cname.to_owned(), container.env.clone());
            if c["restartPolicy"] == "Always" {
                pod.start_container(&container)?;
                let log = format!("{cname}.log");
                let took = self
                    .wait_probe(&stored, cname, "startupProbe", Duration::from_secs(60), || {
                        tail(&pod.log(&log)).to_owned()
                    })
                    .await?;
                startup.insert(cname.to_owned(), took);
            } else {
                let run = pod.run_container(&container)?;
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&run.stdout),
                    String::from_utf8_lossy(&run.stderr)
                );
                ensure!(
                    run.status.success(),
                    "init container {cname} of {name}: {}\n{text}",
                    run.status
                );
                init_output.insert(cname.to_owned(), text);
            }
        }
        for c in &containers {
            let cname = c["name"].as_str().unwrap_or_default();
            match run(c)? {
                Run::Image(image) => {
                    let container = self.container(&stored, cname, image, &volumes)?;
                    env.insert(cname.to_owned(), container.env.clone());
                    pod.start_container(&container)?;
                }
                Run::Backend(port) => pod.start_named_app(&name, port)?,
                Run::Nothing => {}
            }
        }
        let sidecars = inits.iter().filter(|c| c["restartPolicy"] == "Always");
        for c in containers.iter().chain(sidecars) {
            let cname = c["name"].as_str().unwrap_or_default();
            let log = format!("{cname}.log");
            self.wait_probe(&stored, cname, "readinessProbe", Duration::from_secs(30), || {
                tail(&pod.log(&log)).to_owned()
            })
            .await?;
        }
        Ok(RunningPod {
            stored: self.set_ready(&stored)?,
            pod,
            init_output,
            startup,
            env,
        })
    }
}
