//! The injected proxy is our `pilot-agent`: Pods injected by pilot-discovery's webhook, run as
//! written. Istio's rendered default install is applied with `kubectl` to the fake API server
//! and istiod's Pod runs from its Deployment (tests/common/istiod.rs); `kubectl create` of two
//! ordinary Pods (a `web` backend behind a Service and a `sleep` client) in a namespace labelled
//! `istio-injection=enabled` stores them injected; the test kubelet
//! ([`test_support::kubelet`]) then runs each stored Pod in its own network namespace: the
//! `istio-init` init container's args through the proxyv2 image's entrypoint (`pilot-agent
//! istio-iptables`) as root with NET_ADMIN and NET_RAW, the `istio-proxy` native sidecar with its
//! args, its env (`valueFrom` and `$(VAR)` resolved as the kubelet does) and its volumes (token,
//! root certificate, downward API, emptyDirs) as uid 1337 on a read-only root, waiting for its
//! startup probe before the app container starts, and the app container as a small backend on
//! its port. What this proves is listed on [`netns::an_injected_pod_runs_as_written`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

/// Needs root and network namespaces: see [`an_injected_pod_runs_as_written`].
mod netns {
    use std::time::{Duration, Instant};

    use anyhow::bail;
    use serde_json::{Value, json};
    use test_support::kubelet::{Kubelet, Run, RunningPod, container_spec};
    use test_support::netns::{Image, Network, Pod, tail};

    use crate::common::istiod::{Cluster, Istiod};

    const WEB_VIP: &str = "240.240.0.20";
    const WEB_HOST: &str = "web.apps.svc.cluster.local";
    const OUTBOUND: &str = "outbound|8080||web.apps.svc.cluster.local";
    const PROXY_LOG: &str = "istio-proxy.log";

    /// The `apps` namespace (injection on), the Pods' service accounts and the `web` Service.
    fn apps() -> Vec<Value> {
        vec![
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "apps", "labels": {"istio-injection": "enabled"}}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", "namespace": "apps"}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sleep", "namespace": "apps"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "apps"},
                "spec": {"clusterIP": WEB_VIP, "clusterIPs": [WEB_VIP], "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}}),
        ]
    }

    /// What Istio's docs tell users to add to see a Pod's cluster stats (Istio's bootstrap keeps
    /// only a few): `proxyStatsMatcher` in the `proxy.istio.io/config` annotation.
    const STATS_MATCHER: &str = "proxyStatsMatcher:\n  inclusionPrefixes: [cluster.outbound, cluster.inbound]\n";

    /// `web`: one container on 8080 with a readiness probe (which the injector rewrites to the
    /// agent's 15020). `sleep`: one container that only sleeps. Both ask for cluster stats.
    fn app_pods() -> [Value; 2] {
        let pod = |name: &str, app: &str, container: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "apps", "labels": {"app": app, "version": "v1"},
                    "annotations": {"proxy.istio.io/config": STATS_MATCHER}},
                "spec": {"serviceAccountName": app, "containers": [container]}})
        };
        [
            pod(
                "web-7d4b9c6f5-k2m4x",
                "web",
                json!({"name": "web", "image": "nginx:1.27", "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 2}}),
            ),
            pod(
                "sleep-6c8d5f7b9-q8w2e",
                "sleep",
                json!({"name": "sleep", "image": "curlimages/curl:8.8.0", "command": ["sleep", "infinity"]}),
            ),
        ]
    }

    /// A stored Pod running in its network namespace.
    struct Running {
        // Field order is drop order: the Pod's processes before the image's files.
        run: RunningPod,
        _image: Image,
    }

    impl Running {
        fn pod(&self) -> &Pod {
            &self.run.pod
        }

        fn stored(&self) -> &Value {
            &self.run.stored
        }

        fn name(&self) -> &str {
            self.run.stored["metadata"]["name"].as_str().unwrap_or_default()
        }

        /// The tail of istio-proxy's log.
        fn log(&self) -> String {
            tail(&self.run.pod.log(PROXY_LOG)).to_owned()
        }

        fn init(&self) -> &str {
            self.run.init_output.get("istio-init").map_or("", String::as_str)
        }
    }

    /// Runs the stored, injected Pod with the test kubelet: Istio's containers from the proxyv2
    /// image, the app's as a backend on its first port (or nothing); the EndpointSlice
    /// controller lists it in `service`'s slice once it has an IP, ready once it is.
    async fn run(
        net: &Network,
        kubelet: &Kubelet<'_>,
        stored: &Value,
        hosts: &[&str],
        service: Option<&str>,
    ) -> anyhow::Result<Running> {
        let image = Image::proxyv2()?;
        let (pod, stored) = kubelet.sandbox(net, stored, hosts)?;
        if let Some(service) = service {
            kubelet.api.apply(endpoint_slice(service, &stored, false))?;
        }
        let run = kubelet
            .run_pod(pod, stored, |c| {
                if c["image"].as_str().is_some_and(|i| i.contains("/proxyv2:")) {
                    return Ok(Run::Image(&image));
                }
                Ok(match c.pointer("/ports/0/containerPort").and_then(Value::as_u64) {
                    Some(port) => Run::Backend(u16::try_from(port)?),
                    None => Run::Nothing,
                })
            })
            .await?;
        if let Some(service) = service {
            kubelet.api.apply(endpoint_slice(service, &run.stored, true))?;
        }
        Ok(Running { run, _image: image })
    }

    /// The EndpointSlice controller's slice of `service` with the Pod: its address once it has
    /// one, ready once the Pod is.
    fn endpoint_slice(service: &str, pod: &Value, ready: bool) -> Value {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-x7k2p"), "namespace": pod["metadata"]["namespace"],
                "labels": {"kubernetes.io/service-name": service,
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "nodeName": pod["spec"]["nodeName"],
                "targetRef": {"kind": "Pod", "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"]}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
    }

    /// `kubectl create` of `pod` until the webhook answers (its failurePolicy is Fail, and the
    /// API server cannot call it until istiod has patched the caBundle); the stored Pod.
    async fn create_injected(cluster: &Cluster, pod: &Value, istiod: &Istiod) -> anyhow::Result<(Value, Duration)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let start = Instant::now();
            match cluster.create_pod(pod).await {
                Ok(stored) => return Ok((stored, start.elapsed())),
                Err(e) if Instant::now() < deadline && format!("{e:#}").contains("failed calling webhook") => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => bail!(
                    "creating {}: {e:#}\nistiod:\n{}",
                    pod["metadata"]["name"],
                    tail(&istiod.log())
                ),
            }
        }
    }

    fn container_names(list: &Value) -> Vec<&str> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect()
    }

    fn strings(v: &Value) -> Vec<&str> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
    }

    /// The stored Pod is Istio's injection: istio-init's args for `pilot-agent istio-iptables`,
    /// istio-proxy a native sidecar running `proxy sidecar` with `$(POD_NAMESPACE)` in its domain
    /// and Istio's probes on 15021, the app's readiness probe rewritten to the agent's 15020.
    fn check_injected(web: &Value) {
        let spec = &web["spec"];
        assert_eq!(
            container_names(&spec["initContainers"]),
            ["istio-init", "istio-proxy"],
            "{web}"
        );
        assert_eq!(container_names(&spec["containers"]), ["web"]);
        let init = container_spec(web, "istio-init").unwrap();
        assert_eq!(strings(&init["args"]).first(), Some(&"istio-iptables"), "{init}");
        let proxy = container_spec(web, "istio-proxy").unwrap();
        assert_eq!(
            strings(&proxy["args"])[..4],
            ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
            "{proxy}"
        );
        assert_eq!(proxy["restartPolicy"], "Always");
        assert_eq!(proxy["securityContext"]["runAsUser"], 1337);
        for probe in ["startupProbe", "readinessProbe"] {
            assert_eq!(
                proxy[probe]["httpGet"],
                json!({"path": "/healthz/ready", "port": 15021}),
                "{probe}"
            );
        }
        let app = container_spec(web, "web").unwrap();
        assert_eq!(
            app["readinessProbe"]["httpGet"],
            json!({"path": "/app-health/web/readyz", "port": 15020}),
            "the app's probe goes through the agent"
        );
    }

    /// istio-init logged its settings at `--log_output_level=default:info` and left Istio's
    /// chains in the Pod's namespace.
    fn check_capture(pod: &Running) {
        assert!(
            pod.init().contains("Istio config:") && pod.init().contains("PROXY_PORT=15001"),
            "{}: istio-init logs at info:\n{}",
            pod.name(),
            pod.init()
        );
        let out = pod.pod().exec(&["iptables-save", "-t", "nat"]).unwrap();
        let rules = String::from_utf8_lossy(&out.stdout);
        for rule in [
            "-A PREROUTING -p tcp -j ISTIO_INBOUND",
            "-A OUTPUT -j ISTIO_OUTPUT",
            "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
            "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
            "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN",
        ] {
            assert!(
                rules.contains(rule),
                "{}: {rule} in\n{rules}\nistio-init said:\n{}",
                pod.name(),
                pod.init()
            );
        }
    }

    /// The real uid of the Pod's process named `comm`.
    fn uid_of(pod: &Pod, comm: &str) -> Option<u32> {
        let pids = std::process::Command::new("ip")
            .args(["netns", "pids", &pod.ns])
            .output()
            .ok()?;
        String::from_utf8_lossy(&pids.stdout)
            .split_whitespace()
            .find_map(|pid| {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                if name.trim() != comm {
                    return None;
                }
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|l| l.split_whitespace().next())
                    .and_then(|u| u.parse().ok())
            })
    }

    /// Envoy admin's JSON at `path` in the Pod.
    fn admin_json(pod: &Running, path: &str) -> Value {
        let (code, body) = pod.pod().curl_root(&format!("http://127.0.0.1:15000{path}")).unwrap();
        assert_eq!(code, 200, "{}: {path}", pod.name());
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// What the injected args and env say reached Envoy: the node ID (the `--domain` after the
    /// kubelet's `$(POD_NAMESPACE)`), every `ISTIO_META_*` env in the node metadata, the labels
    /// of the downward API file, the log levels of `--proxyLogLevel` and
    /// `--proxyComponentLogLevel`, the concurrency of `ISTIO_CPU_LIMIT`, the user 1337.
    fn check_honoured(pod: &Running) {
        let name = pod.name();
        let info = admin_json(pod, "/server_info");
        let node = &info["node"];
        assert_eq!(
            node["id"],
            format!("sidecar~{}~{name}.apps~apps.svc.cluster.local", pod.pod().ip)
        );
        let opts = &info["command_line_options"];
        assert_eq!(opts["log_level"], "warning", "--proxyLogLevel=warning: {opts}");
        assert_eq!(opts["component_log_level"], "misc:error", "{opts}");
        assert_eq!(opts["concurrency"], 2, "ISTIO_CPU_LIMIT (limits.cpu 2): {opts}");
        let md = &node["metadata"];
        for (k, v) in pod.run.env.get("istio-proxy").into_iter().flatten() {
            let Some(key) = k.strip_prefix("ISTIO_META_") else {
                continue;
            };
            assert_eq!(
                md[key].as_str(),
                Some(v.as_str()),
                "{name}: env {k} in the node metadata {md}"
            );
        }
        assert_eq!(md["NAMESPACE"], "apps");
        assert_eq!(md["SERVICE_ACCOUNT"], pod.stored()["spec"]["serviceAccountName"]);
        assert_eq!(md["INSTANCE_IPS"], pod.pod().ip.to_string());
        assert_eq!(md["LABELS"]["security.istio.io/tlsMode"], "istio", "{md}");
        assert_eq!(
            md["LABELS"]["service.istio.io/canonical-name"],
            pod.stored()["metadata"]["labels"]["app"]
        );
        assert_eq!(uid_of(pod.pod(), "envoy"), Some(1337), "{name}: Envoy's uid");
        assert_eq!(
            uid_of(pod.pod(), "pilot-agent"),
            Some(1337),
            "{name}: pilot-agent's uid"
        );
    }

    /// The workload certificate Envoy holds (from the agent's SDS) names the Pod's service
    /// account.
    fn check_identity(pod: &Running) -> String {
        let account = pod.stored()["spec"]["serviceAccountName"].as_str().unwrap();
        let spiffe = format!("spiffe://cluster.local/ns/apps/sa/{account}");
        let certs = admin_json(pod, "/certs");
        let uris: Vec<&str> = certs["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["cert_chain"].as_array().into_iter().flatten())
            .flat_map(|c| c["subject_alt_names"].as_array().into_iter().flatten())
            .filter_map(|s| s["uri"].as_str())
            .collect();
        assert!(uris.contains(&spiffe.as_str()), "{}: {spiffe} in {certs}", pod.name());
        spiffe
    }

    fn check_no_rejects(pod: &Running) {
        let stats = pod.pod().envoy_stats().unwrap();
        let rejected: u64 = stats
            .iter()
            .filter(|(k, _)| k.ends_with(".update_rejected"))
            .map(|(_, v)| v)
            .sum();
        assert_eq!(rejected, 0, "{}: Envoy rejected config:\n{}", pod.name(), pod.log());
        // (Istio's bootstrap keeps only some stats: CDS and LDS here, RDS in istiod's NACK count)
        for accepted in [
            "cluster_manager.cds.update_success",
            "listener_manager.lds.update_success",
        ] {
            let n = stats.get(accepted).copied().unwrap_or_default();
            assert!(n >= 1, "{}: {accepted} {n}", pod.name());
        }
        let ads = pod.pod().cluster_stat("xds-grpc", "upstream_cx_active").unwrap();
        assert_eq!(ads, 1, "{}: Envoy's ADS stream to the agent", pod.name());
    }

    /// Nothing but the volumes took a write: the root is read-only, and no container hit that;
    /// the agent's files are in the volumes.
    fn check_writes(pod: &Running) {
        let log = pod.pod().log(PROXY_LOG);
        assert!(
            !log.contains("Read-only file system") && !log.contains("os error 30"),
            "{}: a write outside the volumes:\n{}",
            pod.name(),
            tail(&log)
        );
        let volumes = pod.pod().dir.path().join("volumes");
        assert!(
            volumes.join("istio-envoy/envoy-rev.json").exists(),
            "the bootstrap is in istio-envoy"
        );
    }

    /// Proves, with pilot-discovery as istiod (its Deployment as written) and upstream Envoy:
    /// - `kubectl create` stores the Pods injected by pilot-discovery's webhook, as Istio's
    ///   template for this install says ([`check_injected`]);
    /// - istio-init (`pilot-agent istio-iptables` with the injected args, as root with only
    ///   NET_ADMIN and NET_RAW) exits 0 and leaves Istio's chains ([`check_capture`]);
    /// - istio-proxy runs as written: the injected flags and env reach Envoy (node ID and
    ///   metadata, log levels, concurrency), as uid 1337 ([`check_honoured`]); its startup and
    ///   readiness probes on 15021 and the app's rewritten probe on 15020 pass;
    /// - the agent gets a workload certificate from istiod's CA on 15012 with the projected
    ///   `istio-ca` token (a TokenReview), for the Pod's service account ([`check_identity`]),
    ///   and Envoy its config over the agent's xDS proxy, rejecting none ([`check_no_rejects`]);
    /// - a request of the sleep Pod's app to the Service's name is captured, routed by its
    ///   Envoy's outbound cluster, and reaches web's app through web's inbound cluster over
    ///   mTLS: web's app sees the client's SPIFFE identity in `x-forwarded-client-cert` (the
    ///   cluster stats counted are there because the Pods' `proxy.istio.io/config` annotation
    ///   asks for them);
    /// - nothing is written outside the volumes ([`check_writes`]).
    #[tokio::test(flavor = "multi_thread")]
    async fn an_injected_pod_runs_as_written() {
        if let Err(why) = test_support::netns::supported() {
            panic!("this test runs Pods in network namespaces (root, `ip netns`, iptables, setpriv, curl): {why}");
        }
        if let Err(e) = test_support::envoy::envoy_bin() {
            panic!("this test runs Envoy: {e:#}");
        }
        let start = Instant::now();
        let net = Network::create().unwrap();
        let cluster = Cluster::install(&net).await.unwrap();
        let kubelet = cluster.kubelet(&net, 4).unwrap();
        let istiod = Istiod::start(&cluster, &net, &kubelet).await.unwrap();
        cluster.apply("apps.yaml", &apps()).await.unwrap();
        let [web_pod, sleep_pod] = app_pods();
        let (web, inject_time) = create_injected(&cluster, &web_pod, &istiod).await.unwrap();
        check_injected(&web);
        let (sleep, _) = create_injected(&cluster, &sleep_pod, &istiod).await.unwrap();

        let hosts = [istiod.hosts_line(), format!("{WEB_VIP} {WEB_HOST}")];
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let failed = |e: anyhow::Error| -> ! { panic!("{e:#}\nistiod's log:\n{}", tail(&istiod.log())) };
        let web = run(&net, &kubelet, &web, &hosts, Some("web"))
            .await
            .unwrap_or_else(|e| failed(e));
        let sleep = run(&net, &kubelet, &sleep, &hosts, None)
            .await
            .unwrap_or_else(|e| failed(e));
        let running = start.elapsed();

        for pod in [&web, &sleep] {
            check_capture(pod);
            check_honoured(pod);
            check_no_rejects(pod);
        }
        let web_id = check_identity(&web);
        let sleep_id = check_identity(&sleep);
        let reviews = cluster
            .api
            .requests()
            .iter()
            .filter(|r| r.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"))
            .count();
        assert!(
            reviews >= 2,
            "the CA reviewed the Pods' tokens ({reviews} TokenReviews)"
        );
        let issued = istiod
            .metric("citadel_server_success_cert_issuance_count")
            .await
            .unwrap();
        assert!(issued >= 2.0, "istiod's CA signed both workloads ({issued})");

        // sleep's app → its Envoy (outbound) → mTLS → web's Envoy (inbound) → web's app
        let url = format!("http://{WEB_HOST}:8080/hello");
        let inbound = "inbound|8080||";
        let (out_before, in_before) = (
            sleep.pod().cluster_stat(OUTBOUND, "upstream_rq_total").unwrap(),
            web.pod().cluster_stat(inbound, "upstream_rq_total").unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            let (code, body) = sleep.pod().curl_app(&url, &[]).unwrap();
            if code == 200 {
                break (Instant::now(), body);
            }
            assert!(
                Instant::now() < deadline,
                "sleep → {url} within 30 s: last {code} {body}\nsleep's proxy:\n{}\nweb's proxy:\n{}",
                sleep.log(),
                web.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let echo: Value = serde_json::from_str(&first.1).unwrap();
        assert_eq!(echo["backend"], web.name(), "{echo}");
        let xfcc = echo["headers"]["x-forwarded-client-cert"].as_str().unwrap_or_default();
        assert!(
            xfcc.contains(&format!("By={web_id}")) && xfcc.contains(&format!("URI={sleep_id}")),
            "mTLS between the two identities: {echo}\nweb's inbound listener:\n{}",
            web.pod()
                .curl_root("http://127.0.0.1:15000/config_dump?resource=dynamic_listeners&name_regex=virtualInbound")
                .map(|(_, body)| body)
                .unwrap_or_default(),
        );
        for _ in 0..9 {
            assert_eq!(sleep.pod().curl_app(&url, &[]).unwrap().0, 200);
        }
        let sent = sleep.pod().cluster_stat(OUTBOUND, "upstream_rq_total").unwrap() - out_before;
        let received = web.pod().cluster_stat(inbound, "upstream_rq_total").unwrap() - in_before;
        assert!(sent >= 10, "sleep's outbound cluster counted {sent}");
        assert!(received >= 10, "web's inbound cluster counted {received}");
        let handshakes = sleep.pod().cluster_stat(OUTBOUND, "ssl.handshake").unwrap();
        assert!(
            handshakes >= 1,
            "sleep's outbound cluster speaks TLS ({handshakes} handshakes)"
        );

        for pod in [&web, &sleep] {
            check_no_rejects(pod);
            check_writes(pod);
        }
        let rejects = istiod.metric("pilot_total_xds_rejects").await.unwrap();
        assert_eq!(rejects, 0.0, "istiod counted NACKs:\n{}", tail(&istiod.log()));
        eprintln!(
            "figures: istiod ready {:?} after start; injection (kubectl create) {inject_time:?}; \
             istio-proxy startup probe {:?} (web), {:?} (sleep); both Pods running {running:?} after the test's start; \
             first request {:?} after; requests: sleep outbound {sent}, web inbound {received}, TLS handshakes {handshakes}; \
             TokenReviews {reviews}, certificates issued {issued}",
            istiod.ready_after,
            web.run.startup.get("istio-proxy").copied().unwrap_or_default(),
            sleep.run.startup.get("istio-proxy").copied().unwrap_or_default(),
            first.0.duration_since(start) - running,
        );
    }
}
