//! What runs in a test pod: an HTTP app, Istio's iptables capture, `pilot-agent proxy sidecar`,
//! and requests and Envoy stats read from inside the pod.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::{ADMIN_PORT, PROXY_UID, Pod, STATUS_PORT, WorkloadIdentity};
use crate::bin::cargo_bin;
use crate::envoy::envoy_bin;

/// Runs what follows as `nobody`, whose connections the capture redirects, as an app's would be.
const AS_APP: [&str; 4] = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];

impl Pod {
    /// An HTTP app on 0.0.0.0:`port` answering GET with `{"backend": <name>, "host": ..., "headers":
    /// {<lowercase name>: value}}`;
    /// `/status/<code>` answers with that status, `/delay/<ms>` answers after that long, and
    /// `/requests` tells how many requests each path got (to see retries at the backend).
    pub fn start_app(&mut self, port: u16) -> anyhow::Result<()> {
        let name = self.name.clone();
        self.start_named_app(&name, port)
    }

    /// [`start_app`](Self::start_app) answering as `name` (several backends in one pod, e.g. the
    /// loopback workloads of `examples/bookinfo`).
    pub fn start_named_app(&mut self, name: &str, port: u16) -> anyhow::Result<()> {
        let script = format!(
            r#"import json, socketserver, http.server, threading, time
seen = {{}}
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status = 200
        if self.path == "/requests":
            with lock: body = json.dumps(seen).encode()
        else:
            with lock: seen[self.path] = seen.get(self.path, 0) + 1
            parts = self.path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "status" and parts[1].isdigit(): status = int(parts[1])
            if len(parts) == 2 and parts[0] == "delay" and parts[1].isdigit(): time.sleep(int(parts[1]) / 1000)
            headers = {{k.lower(): v for k, v in self.headers.items()}}
            body = json.dumps({{"backend": "{name}", "host": self.headers.get("host", ""), "headers": headers}}).encode()
        self.send_response(status); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", {port}), H).serve_forever()
"#
        );
        self.spawn(&format!("app-{port}.log"), &["python3", "-c", &script], &[])?;
        Ok(())
    }

    /// Resolves `name` as the app does (uid `nobody`, the pod's resolv.conf, captured): its IPv4
    /// addresses, empty when it does not resolve.
    pub fn resolve(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let script = format!(
            "import socket\ntry:\n  print(' '.join(sorted({{a[4][0] for a in socket.getaddrinfo({name:?}, 80, socket.AF_INET)}})))\n\
             except socket.gaierror:\n  print('')\n"
        );
        let out = self.run_python_as_app(&script, name, 53)?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }

    /// Sends one raw DNS query (`qtype`: 1 A, 28 AAAA) to the pod's resolver as the app does:
    /// (response code, answer count).
    pub fn dns_query(&self, name: &str, qtype: u16) -> anyhow::Result<(u8, u16)> {
        let script = format!(
            "import socket, struct\nq = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)\n\
             q += b''.join(bytes([len(l)]) + l.encode() for l in {name:?}.strip('.').split('.')) + b'\\x00'\n\
             q += struct.pack('>HH', {qtype}, 1)\n\
             ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q, (ns, 53))\n\
             r = s.recv(4096)\nprint(r[3] & 0x0f, struct.unpack('>H', r[6:8])[0])\n"
        );
        let out = self.run_python_as_app(&script, name, 53)?;
        let mut it = out.split_whitespace().map(str::parse::<u16>);
        match (it.next(), it.next()) {
            (Some(Ok(rcode)), Some(Ok(answers))) => Ok((u8::try_from(rcode)?, answers)),
            _ => bail!("unexpected DNS probe output {out:?}"),
        }
    }

    /// A TCP app on 0.0.0.0:`port` that answers each line with `<name> <line>`.
    pub fn start_tcp_app(&mut self, port: u16) -> anyhow::Result<()> {
        let script = format!(
            r#"import socketserver
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(b"{name} " + line); self.wfile.flush()
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", {port}), H).serve_forever()
"#,
            name = self.name
        );
        self.spawn(&format!("tcp-app-{port}.log"), &["python3", "-c", &script], &[])?;
        Ok(())
    }

    /// Starts a server-first TCP app on `port` (as MySQL or SMTP): on connect it sends
    /// `<pod> ready` and waits, without reading.
    pub fn start_greeter_app(&mut self, port: u16) -> anyhow::Result<()> {
        let script = format!(
            r#"import socketserver, time
class H(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(b"{name} ready\n"); time.sleep(10)
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", {port}), H).serve_forever()
"#,
            name = self.name
        );
        self.spawn(&format!("greeter-app-{port}.log"), &["python3", "-c", &script], &[])?;
        Ok(())
    }

    /// As an app (captured): connects to `host:port` over TCP and returns the first line the
    /// server sends, sending nothing (fails after 5 s without one).
    pub fn tcp_app_greeting(&self, host: &str, port: u16) -> anyhow::Result<String> {
        let script = format!(
            "import socket\ns = socket.create_connection(({host:?}, {port}), timeout=5)\n\
             print(s.makefile().readline(), end='')\n"
        );
        self.run_python_as_app(&script, host, port)
    }

    /// As an app (captured): connects to `host:port` over TCP, sends one line, returns the answer.
    pub fn tcp_app(&self, host: &str, port: u16, line: &str) -> anyhow::Result<String> {
        let script = format!(
            "import socket\ns = socket.create_connection(({host:?}, {port}), timeout=5)\n\
             s.sendall({line:?}.encode() + b'\\n')\nprint(s.makefile().readline(), end='')\n"
        );
        self.run_python_as_app(&script, host, port)
    }

    /// Runs a python script as the app (uid `nobody`, captured); its standard output, trimmed.
    fn run_python_as_app(&self, script: &str, host: &str, port: u16) -> anyhow::Result<String> {
        // `nobody` may not reach a python3 shim under /root (pyenv): take the system one.
        let python = if std::path::Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        let mut args = AS_APP.to_vec();
        args.extend([python, "-c", script]);
        let out = self.exec(&args)?;
        if !out.status.success() {
            bail!("TCP to {host}:{port} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    }

    /// Applies Istio's capture in the pod with the injector's flags (`-u 1337 -i '*' -b '*' -d
    /// 15090,15021,15020`): everything but the proxy's own uid is captured.
    pub fn capture(&self) -> anyhow::Result<()> {
        self.capture_with(&[])
    }

    /// [`capture`](Self::capture) with more `istio-iptables` flags (e.g. `--redirect-dns`).
    pub fn capture_with(&self, extra: &[&str]) -> anyhow::Result<()> {
        let bin = cargo_bin("agent", "pilot-agent")?;
        let bin = bin.to_string_lossy();
        let mut args = vec![
            bin.as_ref(),
            "istio-iptables",
            "-u",
            PROXY_UID,
            "-i",
            "*",
            "-b",
            "*",
            "-d",
            "15090,15021,15020",
            "--dry-run=false",
        ];
        args.extend_from_slice(extra);
        let out = self.exec(&args)?;
        if !out.status.success() {
            bail!("istio-iptables failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Starts `pilot-agent proxy sidecar` in the pod for `namespace` with `labels`, talking to
    /// pilot-discovery at `discovery`, and waits for `/healthz/ready`.
    pub fn start_sidecar(
        &mut self,
        discovery: SocketAddr,
        namespace: &str,
        labels: &serde_json::Value,
    ) -> anyhow::Result<()> {
        self.start_sidecar_with(discovery, namespace, labels, None)
    }

    /// [`start_sidecar`](Self::start_sidecar) with a workload identity: the agent asks the CA at
    /// `identity.ca` for its certificate with `identity.token`, trusting `identity.root_pem`
    /// (written where Istio mounts them: `var/run/secrets/tokens/istio-token` and
    /// `var/run/secrets/istio/root-cert.pem`).
    pub fn start_sidecar_with(
        &mut self,
        discovery: SocketAddr,
        namespace: &str,
        labels: &serde_json::Value,
        identity: Option<&WorkloadIdentity>,
    ) -> anyhow::Result<()> {
        self.start_sidecar_env(discovery, namespace, labels, identity, &[])
    }

    /// [`start_sidecar_with`](Self::start_sidecar_with) with more agent environment (e.g.
    /// `ISTIO_META_DNS_CAPTURE=true`).
    pub fn start_sidecar_env(
        &mut self,
        discovery: SocketAddr,
        namespace: &str,
        labels: &serde_json::Value,
        identity: Option<&WorkloadIdentity>,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        self.start_proxy("sidecar", discovery, namespace, labels, identity, extra_env)
    }

    /// `pilot-agent proxy <kind>` (`sidecar` or `router`, a gateway) in the pod, as
    /// [`start_sidecar_env`](Self::start_sidecar_env).
    pub fn start_proxy(
        &mut self,
        kind: &str,
        discovery: SocketAddr,
        namespace: &str,
        labels: &serde_json::Value,
        identity: Option<&WorkloadIdentity>,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let bin = cargo_bin("agent", "pilot-agent")?;
        let dir = self.dir.path().to_path_buf();
        if let Some(id) = identity {
            for (rel, contents) in [
                ("var/run/secrets/tokens/istio-token", &id.token),
                ("var/run/secrets/istio/root-cert.pem", &id.root_pem),
            ] {
                let path = dir.join(rel);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&path, contents)?;
            }
        }
        let proxy_config = json!({
            "discoveryAddress": discovery.to_string(),
            "proxyAdminPort": ADMIN_PORT,
            "statusPort": STATUS_PORT,
            "binaryPath": envoy_bin()?,
            "configPath": dir.join("etc/istio/proxy"),
            "drainDuration": "1s",
            "terminationDrainDuration": "1s",
            "controlPlaneAuthPolicy": "NONE",
            "concurrency": 1,
            // Istio's bootstrap keeps only the stats it needs; tests read these too.
            "proxyStatsMatcher": {"inclusionPrefixes": [
                "cluster.inbound", "cluster.outbound", "cluster.BlackHoleCluster", "cluster.PassthroughCluster",
                "listener.",
            ]},
        });
        let env: Vec<(String, String)> = [
            ("POD_NAME", self.name.clone()),
            ("POD_NAMESPACE", namespace.to_owned()),
            ("INSTANCE_IP", self.ip.to_string()),
            ("SERVICE_ACCOUNT", "default".to_owned()),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes".to_owned()),
            ("ISTIO_METAJSON_LABELS", labels.to_string()),
            ("PROXY_CONFIG", proxy_config.to_string()),
            ("XDS_UDS_PATH", dir.join("XDS").to_string_lossy().into_owned()),
            ("SDS_UDS_PATH", dir.join("SDS").to_string_lossy().into_owned()),
            ("ENVOY_STATUS_PORT", "15021".to_owned()),
            ("ENVOY_PROMETHEUS_PORT", "15090".to_owned()),
            ("ISTIO_DELTA_XDS", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(identity.map(|id| ("CA_ADDR".to_owned(), id.ca.to_string())))
        .chain(extra_env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .collect();
        // As in an injected pod, pilot-agent and Envoy run as istio-proxy (1337), which the
        // capture excludes; they own their working directory.
        let chown = std::process::Command::new("chown")
            .args(["-R", &format!("{PROXY_UID}:{PROXY_UID}")])
            .arg(&dir)
            .status()?;
        if !chown.success() {
            bail!("chown {} failed", dir.display());
        }
        let agent = bin.to_string_lossy();
        let user = [
            "setpriv",
            &format!("--reuid={PROXY_UID}"),
            &format!("--regid={PROXY_UID}"),
            "--clear-groups",
        ]
        .map(|s| s.to_owned());
        let mut args: Vec<&str> = user.iter().map(String::as_str).collect();
        args.extend([agent.as_ref(), "proxy", kind]);
        self.spawn("pilot-agent.log", &args, &env)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{STATUS_PORT}/healthz/ready");
        loop {
            if self.curl_root(&url).is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("sidecar in {} not ready:\n{}", self.name, self.log("pilot-agent.log"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The real uid of the pod's Envoy process.
    pub fn envoy_uid(&self) -> anyhow::Result<u32> {
        let out = std::process::Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()?;
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() != "envoy" {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|u| u.parse().ok());
            if let Some(uid) = uid {
                return Ok(uid);
            }
        }
        bail!("no Envoy process in pod {}", self.name)
    }

    /// `curl` in the pod as root (not captured): (status, body).
    pub fn curl_root(&self, url: &str) -> anyhow::Result<(u16, String)> {
        self.curl(&[], url)
    }

    /// `curl` in the pod as `nobody` (captured by the sidecar, as an app's request): (status, body).
    pub fn curl_app(&self, url: &str, headers: &[&str]) -> anyhow::Result<(u16, String)> {
        self.curl_with(&AS_APP, headers, url)
    }

    /// `curl` in the pod as the app (captured) with more arguments (`--resolve`, `--cacert`, ...)
    /// before `url`: (status, body).
    pub fn curl_app_with(&self, args: &[&str], url: &str) -> anyhow::Result<(u16, String)> {
        let mut pre = AS_APP.to_vec();
        pre.extend(["curl", "-sS"]);
        pre.extend(args);
        pre.extend(["-m", "5", "-w", "\n%{http_code}", url]);
        let out = self.exec(&pre)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((
            code.trim().parse().unwrap_or(0),
            format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
        ))
    }

    fn curl(&self, pre: &[&str], url: &str) -> anyhow::Result<(u16, String)> {
        self.curl_with(pre, &[], url)
    }

    fn curl_with(&self, pre: &[&str], headers: &[&str], url: &str) -> anyhow::Result<(u16, String)> {
        let mut args: Vec<&str> = pre.to_vec();
        args.extend(["curl", "-s", "-m", "5", "-w", "\n%{http_code}"]);
        for h in headers {
            args.extend(["-H", h]);
        }
        args.push(url);
        let out = self.exec(&args)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }

    /// The sum of Envoy's `cluster.<cluster>.<stat>` in the pod, whether or not the cluster's stat
    /// name carries Istio's `;` suffix (`alt_stat_name`).
    pub fn cluster_stat(&self, cluster: &str, stat: &str) -> anyhow::Result<u64> {
        let names = [
            format!("cluster.{cluster}.{stat}"),
            format!("cluster.{cluster};.{stat}"),
        ];
        Ok(self
            .envoy_stats()?
            .iter()
            .filter(|(k, _)| names.contains(k))
            .map(|(_, v)| v)
            .sum())
    }

    /// The sum of Envoy's stats in the pod whose names end with `suffix`.
    pub fn stat_sum(&self, suffix: &str) -> anyhow::Result<u64> {
        Ok(self
            .envoy_stats()?
            .iter()
            .filter(|(k, _)| k.ends_with(suffix))
            .map(|(_, v)| v)
            .sum())
    }

    /// Fails, with the tail of the agent's log, if the pod's Envoy rejected any update.
    pub fn assert_no_rejects(&self) -> anyhow::Result<()> {
        let rejected = self.stat_sum(".update_rejected")?;
        if rejected != 0 {
            bail!(
                "Envoy in {} rejected {rejected} updates:\n{}",
                self.name,
                super::tail(&self.log("pilot-agent.log"))
            );
        }
        Ok(())
    }

    /// Envoy's `/stats` in the pod as `name -> value` (counters and gauges).
    pub fn envoy_stats(&self) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
        let (code, body) = self.curl_root(&format!("http://127.0.0.1:{ADMIN_PORT}/stats"))?;
        if code != 200 {
            bail!("envoy /stats in {}: {code}", self.name);
        }
        Ok(body
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(": ")?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect())
    }
}
