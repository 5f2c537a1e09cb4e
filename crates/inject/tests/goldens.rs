//! Istio's sidecar injection goldens (`pkg/kube/inject/testdata/inject`, settings per case from
//! `inject_test.go`'s `TestInjection` and `TestInjectionOlderVersion`), run as Istio's webhook
//! test (`runWebhook`) runs them: each workload's pod template becomes the Pod of an admission
//! request (with the owner reference its controller would set), the patch is applied to it, and
//! the result is compared with the golden's pod template as objects.
//!
//! The base config is the `istio-sidecar-injector` and `istio` ConfigMaps of Istio's rendered
//! default install (`pilot_default.golden.yaml`), with the hub and tag of the chart that Istio's
//! test renders (`registry.istio.io/testing`, `latest`). A case's `setFlags` and `.iop.yaml`
//! are applied to `values` (as the operator would), its mesh changes as mesh YAML.

mod golden_support;

use golden_support::{Case, Corpus, Verdict, run_case};

/// Cases that differ from Istio's golden, each with why. A case that starts passing fails the
/// test until it is taken off this list, so the count only goes up.
const KNOWN_DIFFERENT: &[(&str, &str)] = &[];

const CRONJOB: &str = "kube-inject's golden: injects the CronJob's jobTemplate metadata, not the pod template's";

fn cases() -> Vec<Case> {
    let c = Case::new;
    let cni = ["components.cni.enabled=true"];
    let status = [
        "values.global.proxy.statusPort=123",
        "values.global.proxy.readinessInitialDelaySeconds=100",
        "values.global.proxy.readinessPeriodSeconds=200",
        "values.global.proxy.readinessFailureThreshold=300",
    ];
    let hold = ["values.global.proxy.holdApplicationUntilProxyStarts=true"];
    let multus = ["components.cni.enabled=true", "values.cni.provider=multus"];
    let mut v = vec![
        c("hello.yaml", "hello.yaml.cni.injected").flags(&["components.cni.enabled=true", "values.cni.provider=default", "values.global.network=network1"]),
        c("hello.yaml", "hello.yaml.proxyImageName.injected").flags(&["values.global.proxy.image=proxyTest"]),
        c("hello.yaml", "hello.yaml.proxyInitImageName.injected").flags(&["values.global.proxy_init.image=proxyInitTest"]),
        c("hello.yaml", "hello-tproxy.yaml.injected").mesh("defaultConfig:\n  interceptionMode: TPROXY\n"),
        c("hello.yaml", "hello-always.yaml.injected").flags(&["values.global.imagePullPolicy=Always"]),
        c("hello.yaml", "hello-never.yaml.injected").flags(&["values.global.imagePullPolicy=Never"]),
        c("hello.yaml", "hello-old-version.yaml.injected").not_native(),
        c("format-duration.yaml", "format-duration.yaml.injected").mesh("defaultConfig:\n  drainDuration: 23s\n"),
        c("traffic-params.yaml", "traffic-params.yaml.injected").flags(&[
            "values.global.proxy.includeIPRanges=127.0.0.1/24,10.96.0.1/24",
            "values.global.proxy.excludeIPRanges=10.96.0.2/24,10.96.0.3/24",
            "values.global.proxy.excludeInboundPorts=4,5,6",
            "values.global.proxy.statusPort=0",
        ]),
        c("status_params.yaml", "status_params.yaml.injected").flags(&status),
        c("kubevirtInterfaces.yaml", "kubevirtInterfaces.yaml.injected").flags(&status),
        c("reroute-virtual-interfaces.yaml", "reroute-virtual-interfaces.yaml.injected").flags(&status),
        c("hello.yaml", "hello-image-secrets-in-values.yaml.injected").iop("hello-image-secrets-in-values.iop.yaml"),
        c("hello-image-pull-secret.yaml", "hello-multiple-image-secrets.yaml.injected").iop("hello-image-secrets-in-values.iop.yaml"),
        c("hello.yaml", "hello-template-in-values.yaml.injected").iop("hello-template-in-values.iop.yaml"),
        c("hello.yaml", "hello-mount-mtls-certs.yaml.injected").flags(&["values.global.mountMtlsCerts=true"]),
        c("hello.yaml", "hello-cncf-networks.yaml.injected").flags(&multus),
        c("hello-existing-cncf-networks.yaml", "hello-existing-cncf-networks.yaml.injected").flags(&multus),
        c("hello-existing-cncf-networks-json.yaml", "hello-existing-cncf-networks-json.yaml.injected").flags(&multus),
        c("hello.yaml", "hello.proxyHoldsApplication.yaml.injected").flags(&hold),
        c("hello-probes.yaml", "hello-probes.proxyHoldsApplication.yaml.injected").flags(&hold),
        c("hello-probes-proxyHoldApplication-ProxyConfig.yaml", "hello-probes-proxyHoldApplication-ProxyConfig.yaml.injected"),
        c("hello-probes-noProxyHoldApplication-ProxyConfig.yaml", "hello-probes-noProxyHoldApplication-ProxyConfig.yaml.injected").flags(&hold),
        c("hello-service.yaml", "hello-service.yaml.injected").skip_webhook("a Service only: no pod for the webhook"),
        c("cronjob.yaml", "cronjob.yaml.injected").skip_webhook(CRONJOB),
        c("cronjob.yaml", "cronjob-old-version.yaml.injected").not_native().skip_webhook(CRONJOB),
        c("daemonset.yaml", "daemonset-old-version.yaml.injected").not_native(),
        c("job.yaml", "job-old-version.yaml.injected").not_native(),
        c("pod.yaml", "pod-old-version.yaml.injected").not_native(),
        c("replicaset.yaml", "replicaset-old-version.yaml.injected").not_native(),
        c("statefulset.yaml", "statefulset-old-version.yaml.injected").not_native(),
        c("traffic-annotations-bad-includeipranges.yaml", "").error("includeipranges"),
        c("traffic-annotations-bad-excludeipranges.yaml", "").error("excludeipranges"),
        c("traffic-annotations-bad-includeinboundports.yaml", "").error("includeinboundports"),
        c("traffic-annotations-bad-excludeinboundports.yaml", "").error("excludeinboundports"),
        c("traffic-annotations-bad-excludeoutboundports.yaml", "").error("excludeoutboundports"),
        c("traffic-annotations.yaml", "traffic-annotations.yaml.injected")
            .mesh("defaultConfig:\n  proxyMetadata:\n    ISTIO_META_TLS_CLIENT_KEY: /etc/identity/client/keys/client-key.pem\n"),
        c("proxy-override.yaml", "proxy-override.yaml.injected"),
        c("explicit-security-context.yaml", "explicit-security-context.yaml.injected"),
        c("only-proxy-container.yaml", "only-proxy-container.yaml.injected"),
        c("proxy-override-args.yaml", "proxy-override-args.yaml.injected"),
        c("proxy-override-runas.yaml", "proxy-override-runas.yaml.injected"),
        c("proxy-override-runas.yaml", "proxy-override-runas.yaml.cni.injected").flags(&cni),
        c("proxy-override-runas.yaml", "proxy-override-runas.yaml.tproxy.injected").mesh("defaultConfig:\n  interceptionMode: TPROXY\n"),
        c("proxy-override-args.yaml", "proxy-override-args-native.yaml.injected"),
        c("gateway.yaml", "gateway.yaml.injected"),
        c("native-sidecar.yaml", "native-sidecar.yaml.injected"),
        c("native-sidecar.yaml", "native-sidecar-old-version.yaml.injected").not_native(),
        c("native-sidecar-opt-in.yaml", "native-sidecar-opt-in.yaml.injected"),
        c("native-sidecar-opt-in.yaml", "native-sidecar-opt-in.yaml.injected").not_native(),
        c("native-sidecar-opt-out.yaml", "native-sidecar-opt-out.yaml.injected"),
        c("native-sidecar-opt-out.yaml", "native-sidecar-opt-out.yaml.injected").not_native(),
        c("custom-template.yaml", "custom-template.yaml.injected").iop("custom-template.iop.yaml"),
        c("tcp-probes.yaml", "tcp-probes.yaml.injected"),
        c("hello-host-network-with-ns.yaml", "hello-host-network-with-ns.yaml.injected"),
        c("merge-probers.yaml", "merge-probers.yaml.injected").flags(&hold),
        c("hello-tracing-disabled.yaml", "hello-tracing-disabled.yaml.injected").mesh("defaultConfig:\n  tracing: {}\n"),
        c("truncate-canonical-name-pod.yaml", "truncate-canonical-name-pod.yaml.injected"),
        c("truncate-canonical-name-custom-controller-pod.yaml", "truncate-canonical-name-custom-controller-pod.yaml.injected"),
        c("hello-openshift.yaml", "hello-openshift.yaml.injected").flags(&cni).openshift(),
        c("hello-openshift-custom-injection.yaml", "hello-openshift-custom-injection.yaml.injected").flags(&cni).openshift(),
        c("hello-openshift-tproxy.yaml", "hello-openshift-tproxy.yaml.injected").flags(&cni).openshift(),
        c("hello-probes-localhost.yaml", "hello-probes-localhost.yaml.injected").mesh("inboundTrafficPolicy:\n  mode: LOCALHOST\n"),
        c("proxy-resources-null.yaml", "proxy-resources-null.yaml.injected").iop("proxy-resources-null.iop.yaml"),
        c("proxy-resources-null-no-init.yaml", "proxy-resources-null-no-init.yaml.injected").iop("proxy-resources-null.iop.yaml"),
        c("proxy-resources-zero.yaml", "proxy-resources-zero.yaml.injected").iop("proxy-resources-zero.iop.yaml"),
        c("proxy-resources-memory-null.yaml", "proxy-resources-memory-null.yaml.injected").iop("proxy-resources-memory-null.iop.yaml"),
        c("proxy-resources-mixed-null.yaml", "proxy-resources-mixed-null.yaml.injected").iop("proxy-resources-mixed-null.iop.yaml"),
        c("sidecar-spire.yaml", "sidecar-spire.yaml.injected").iop("spire-template.iop.yaml"),
        c("gateway-spire.yaml", "gateway-spire.yaml.injected").iop("spire-template.iop.yaml"),
        c("hello-otel-semconv.yaml", "hello-otel-semconv.yaml.injected").mesh(
            "extensionProviders:\n- name: otel\n  opentelemetry:\n    service: otel-collector.observability.svc.cluster.local\n    port: 4317\n    serviceAttributeEnrichment: OTEL_SEMANTIC_CONVENTIONS\n",
        ),
        c("hello.yaml", "hello-fips-140-3.yaml.injected").compliance("fips-140-3"),
        // TestInjectionOlderVersion: a node older than 1.33 keeps the proxy a container.
        c("native-sidecar.yaml", "native-sidecar-old-version.yaml.injected").not_native(),
        c("hello.yaml", "hello-old-version.yaml.injected").not_native(),
    ];
    // As Istio's test: every other input with a golden beside it runs with the defaults.
    let listed: Vec<String> = v.iter().map(|c| c.want_or_input()).collect();
    for input in Corpus::inputs() {
        let want = format!("{input}.injected");
        if !listed.contains(&want) && Corpus::exists(&want) {
            v.push(c(&input, &want));
        }
    }
    v
}

/// The default install's `istio-sidecar-injector` ConfigMap loads as it is, all its templates.
#[test]
fn the_default_install_config_loads() {
    let corpus = Corpus::load();
    let cfg =
        inject::InjectorConfig::parse(&corpus.install_config, &corpus.install_values).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = cfg.template_names().collect();
    assert_eq!(
        names,
        [
            "agentgateway",
            "gateway",
            "grpc-agent",
            "grpc-simple",
            "kube-gateway",
            "sidecar",
            "waypoint"
        ]
    );
}

/// The comparison can fail: a golden made with other settings differs, and says where.
#[test]
fn a_golden_of_other_settings_differs() {
    let corpus = Corpus::load();
    let tproxy_golden_without_tproxy = Case::new("hello.yaml", "hello-tproxy.yaml.injected");
    let diff = match run_case(&corpus, &tproxy_golden_without_tproxy) {
        Err(d) => d,
        Ok(_) => panic!("hello.yaml injected with REDIRECT matched the TPROXY golden"),
    };
    assert!(
        diff.contains("TPROXY") || diff.contains("REDIRECT") || diff.contains("NET_ADMIN"),
        "{diff}"
    );
    let old = Case::new("hello.yaml", "hello-old-version.yaml.injected");
    assert!(
        run_case(&corpus, &old).is_err(),
        "native sidecar matched the golden without"
    );
}

#[test]
fn istio_injection_goldens() {
    let corpus = Corpus::load();
    let cases = cases();
    let mut passed = Vec::new();
    let mut skipped = Vec::new();
    let mut different = Vec::new();
    for case in &cases {
        let name = case.label();
        match run_case(&corpus, case) {
            Ok(Verdict::Pass) => passed.push(name),
            Ok(Verdict::Skipped(why)) => skipped.push((name, why)),
            Err(diff) => different.push((name, diff)),
        }
    }
    let run = cases.len() - skipped.len();
    println!(
        "injection goldens: {}/{run} pass, {} differ, {} not run",
        passed.len(),
        different.len(),
        skipped.len()
    );
    for p in &passed {
        println!("  pass    {p}");
    }
    for (name, why) in &skipped {
        println!("  not run {name}: {why}");
    }
    for (name, diff) in &different {
        let why = KNOWN_DIFFERENT
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, w)| *w)
            .unwrap_or("NOT EXPECTED");
        println!("  differ  {name}: {diff}\n          known: {why}");
    }
    let regressions: Vec<&String> = different
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !KNOWN_DIFFERENT.iter().any(|(k, _)| k == n))
        .collect();
    let now_passing: Vec<&&str> = KNOWN_DIFFERENT
        .iter()
        .map(|(k, _)| k)
        .filter(|k| passed.iter().any(|p| p == *k))
        .collect();
    assert!(regressions.is_empty(), "cases expected to pass differ: {regressions:?}");
    assert!(
        passed.len() + skipped.len() + different.len() == cases.len() && passed.len() > 100,
        "too few cases ran"
    );
    assert!(
        now_passing.is_empty(),
        "known-different cases now pass; take them off KNOWN_DIFFERENT: {now_passing:?}"
    );
}
