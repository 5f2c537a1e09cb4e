//! End-to-end: the README's pilot-discovery and pilot-agent example, as written. The commands are
//! the first `sh` blocks under README.md's "Running pilot-discovery" and "Running pilot-agent"
//! (so this test breaks when the README drifts), run with bash in a network namespace, where
//! every default port the README relies on (15010, 15000, 15020, 18080, ...) is free, with the
//! config dir `examples/bookinfo` that the README names and its loopback backends started beside
//! them. What is substituted, and nothing else: `cargo build` lines are not run (the test's
//! binaries are already built; `target/release` in the working directory points at them), and
//! `ENVOY_BIN` makes `scripts/install-envoy.sh` print the tests' Envoy instead of installing one.
//!
//! Checked: the gateway becomes ready, its certificate is the token's SPIFFE identity (Envoy's
//! `/certs`), a request through it reaches a bookinfo backend over the auto-mTLS cluster's
//! plaintext match (backends without sidecars), Envoy rejected nothing; and without the token
//! the agent says in one error line, within seconds, what to set, and `/healthz/ready` says why.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use test_support::bin::cargo_bin;
use test_support::envoy::{envoy_bin, workspace_root};
use test_support::netns::{Network, Pod, tail};

const IDENTITY: &str = "spiffe://cluster.local/ns/istio-system/sa/default";
const TOKEN_STEP: &str = "scripts/dev-token.py token";

/// Fails the test, saying what is missing, when this machine cannot run network namespaces.
fn require_netns() {
    if let Err(why) = test_support::netns::supported() {
        panic!(
            "the README example runs in a network namespace (its default ports, free of other tests): {why} \
             (scripts/test.sh skips it on such machines)"
        );
    }
}

/// The first ```sh block after the heading `## {heading}` of README.md.
fn readme_block(heading: &str) -> anyhow::Result<String> {
    let readme = std::fs::read_to_string(workspace_root()?.join("README.md"))?;
    let section = readme
        .split_once(&format!("\n## {heading}\n"))
        .with_context(|| format!("README.md has no section {heading:?}"))?
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .with_context(|| format!("README.md {heading:?} has no sh block"))?
        .0;
    Ok(block.to_owned())
}

/// The block without its `cargo build` lines (the binaries are built).
fn without_cargo_build(block: &str) -> String {
    block
        .lines()
        .filter(|l| !l.trim_start().starts_with("cargo build"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The README's example in a pod: its backends, and a working directory like a checkout's, with
/// `scripts`, `examples` and `target/release` (the test binaries) linked in.
struct Example {
    pod: Pod,
    _net: Network,
}

impl Example {
    async fn start() -> anyhow::Result<Example> {
        let net = Network::create()?;
        let mut pod = net.pod("readme", &[])?;
        // The loopback workloads examples/bookinfo names (WorkloadEntries and endpoints).
        for (name, port) in [("reviews-v1", 19081), ("reviews-v2", 19082), ("ratings", 19083)] {
            pod.start_named_app(name, port)?;
        }
        let root = workspace_root()?;
        let dir = pod.dir.path().to_path_buf();
        for link in ["scripts", "examples"] {
            std::os::unix::fs::symlink(root.join(link), dir.join(link))?;
        }
        let discovery = cargo_bin("pilot-discovery", "pilot-discovery")?;
        cargo_bin("agent", "pilot-agent")?;
        std::fs::create_dir_all(dir.join("target"))?;
        let bins = discovery.parent().context("the binaries' directory")?;
        std::os::unix::fs::symlink(bins, dir.join("target/release"))?;
        Ok(Example { pod, _net: net })
    }

    fn env() -> anyhow::Result<Vec<(String, String)>> {
        Ok(vec![(
            "ENVOY_BIN".to_owned(),
            envoy_bin()?.to_string_lossy().into_owned(),
        )])
    }

    /// Runs the README's pilot-discovery block and waits for its `/ready` (debug port 8080).
    fn run_discovery(&mut self) -> anyhow::Result<()> {
        let block = without_cargo_build(&readme_block("Running pilot-discovery")?);
        assert!(block.contains("--secureGrpcAddr \"\""), "{block}");
        self.pod
            .spawn("pilot-discovery.log", &["bash", "-c", &block], &Self::env()?)?;
        self.wait_http(
            "http://127.0.0.1:8080/ready",
            Duration::from_secs(30),
            "pilot-discovery.log",
        )
    }

    /// Runs the README's pilot-agent block, without its token step when `token` is false.
    fn run_agent(&mut self, token: bool) -> anyhow::Result<()> {
        let block = readme_block("Running pilot-agent")?;
        assert!(block.contains(TOKEN_STEP), "{block}");
        let block: String = block
            .lines()
            .filter(|l| token || !l.starts_with(TOKEN_STEP))
            .collect::<Vec<_>>()
            .join("\n");
        self.pod
            .spawn("pilot-agent.log", &["bash", "-c", &block], &Self::env()?)?;
        Ok(())
    }

    fn curl(&self, url: &str, headers: &[&str]) -> anyhow::Result<(u16, String)> {
        let mut args = vec!["curl", "-s", "-m", "5", "-w", "\n%{http_code}"];
        for h in headers {
            args.extend(["-H", h]);
        }
        args.push(url);
        let out = self.pod.exec(&args)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }

    fn wait_http(&self, url: &str, timeout: Duration, log: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, body) = self.curl(url, &[])?;
            if code == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{url} answered {code} {body:?} after {timeout:?}\n--- {log} ---\n{}\n--- pilot-discovery ---\n{}",
                    tail(&self.pod.log(log)),
                    tail(&self.pod.log("pilot-discovery.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        format!(
            "--- pilot-agent ---\n{}\n--- pilot-discovery ---\n{}",
            tail(&self.pod.log("pilot-agent.log")),
            tail(&self.pod.log("pilot-discovery.log"))
        )
    }
}

/// The names of the `transport_socket_matches` of `cluster` in Envoy's config dump.
fn socket_matches(config_dump: &str, cluster: &str) -> anyhow::Result<Vec<String>> {
    let dump: serde_json::Value = serde_json::from_str(config_dump)?;
    let clusters = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["dynamic_active_clusters"].as_array().into_iter().flatten());
    for c in clusters {
        if c["cluster"]["name"] == cluster {
            return Ok(c["cluster"]["transport_socket_matches"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect());
        }
    }
    bail!("no cluster {cluster} in Envoy's config dump")
}

fn backend(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["backend"].as_str().map(str::to_owned)
}

/// The tests, named `netns::*` so that `scripts/test.sh` can skip them where namespaces cannot be
/// made.
mod netns {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn the_readme_gateway_becomes_ready_with_its_identity_and_routes() {
        require_netns();
        let mut ex = Example::start().await.unwrap();
        ex.run_discovery().unwrap();
        ex.run_agent(true).unwrap();
        ex.wait_http(
            "http://127.0.0.1:15020/healthz/ready",
            Duration::from_secs(60),
            "pilot-agent.log",
        )
        .unwrap();

        // The workload certificate is the token's identity, from pilot-discovery's CA.
        let (code, certs) = ex.curl("http://127.0.0.1:15000/certs", &[]).unwrap();
        assert_eq!(code, 200, "{certs}");
        assert!(certs.contains(IDENTITY), "{certs}\n{}", ex.logs());
        assert!(
            Path::new(&ex.pod.dir.path().join("etc/cacerts/root-cert.pem")).is_file(),
            "the CA root in ROOT_CA_DIR's default"
        );

        // Through the gateway to the loopback backends, over the auto-mTLS clusters.
        let host = "host: bookinfo.example.com";
        let deadline = Instant::now() + Duration::from_secs(20);
        let got = loop {
            let (code, body) = ex.curl("http://127.0.0.1:18080/reviews", &[host]).unwrap();
            if code == 200 {
                break backend(&body);
            }
            assert!(Instant::now() < deadline, "/reviews: {code} {body}\n{}", ex.logs());
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(matches!(got.as_deref(), Some("reviews-v1" | "reviews-v2")), "{got:?}");
        let (code, body) = ex
            .curl("http://127.0.0.1:18080/reviews", &[host, "end-user: jason"])
            .unwrap();
        assert_eq!((code, backend(&body).as_deref()), (200, Some("reviews-v2")), "{body}");
        let (code, body) = ex.curl("http://127.0.0.1:18080/ratings/1", &[host]).unwrap();
        assert_eq!((code, backend(&body).as_deref()), (200, Some("ratings")), "{body}");
        let (_, dump) = ex.curl("http://127.0.0.1:15000/config_dump", &[]).unwrap();
        for cluster in [
            "outbound|9080|v2|reviews.default.svc.cluster.local",
            "outbound|9080||ratings.default.svc.cluster.local",
        ] {
            let matches = socket_matches(&dump, cluster).unwrap();
            assert_eq!(matches, ["tlsMode-istio", "tlsMode-disabled"], "{cluster}");
        }
        ex.pod.assert_no_rejects().unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn without_the_token_the_agent_says_what_to_set_once() {
        require_netns();
        let mut ex = Example::start().await.unwrap();
        ex.run_discovery().unwrap();
        ex.run_agent(false).unwrap();
        let wanted = format!("no workload certificate for {IDENTITY}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ex.pod.log("pilot-agent.log").contains(&wanted) {
            assert!(
                Instant::now() < deadline,
                "no error naming the certificate within 10 s\n{}",
                ex.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Envoy keeps asking meanwhile; the error is said once per 30 s, not per retry.
        std::thread::sleep(Duration::from_secs(5));
        let log = ex.pod.log("pilot-agent.log");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&wanted)).collect();
        assert_eq!(lines.len(), 1, "{lines:#?}");
        for what in [
            "ERROR",
            "no service account token at ./var/run/secrets/tokens/istio-token",
            "JWT_RULE",
            "./etc/certs",
        ] {
            assert!(lines[0].contains(what), "{what:?} in {}", lines[0]);
        }
        assert!(
            !log.lines().any(|l| l.contains("WARN") && l.contains("retrying")),
            "no stream of retry warnings:\n{}",
            tail(&log)
        );
        let (code, body) = ex.curl("http://127.0.0.1:15020/healthz/ready", &[]).unwrap();
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains(&wanted) && body.contains("./var/run/secrets/tokens/istio-token"),
            "{body}"
        );
    }
}
