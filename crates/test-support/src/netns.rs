//! Network namespaces as Kubernetes pods for sidecar end-to-end tests: a host-side bridge on a
//! private 10.244.<n>.0/24 subnet ([`Network`]), pods joined to it by veth pairs ([`Pod`]), with
//! their own `/etc/netns/<ns>/{resolv.conf,hosts}`, an HTTP app, Istio's iptables capture and a
//! `pilot-agent proxy sidecar`, or a stored Pod's containers as a container runtime runs them
//! (`container.rs`, with [`crate::kubelet`]). Everything (processes, namespaces, links, files) is
//! removed on drop.
//!
//! As in an injected pod, pilot-agent and Envoy run as istio-proxy (uid and gid 1337), which the
//! capture excludes (`istio-iptables -u 1337`); apps run as root and test clients as `nobody`
//! (`setpriv`), and their connections are redirected to Envoy. Requests to 127.0.0.1 (Envoy's
//! admin API, an app's own port) are never captured.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

mod container;
mod sidecar;

pub use container::{Container, IMAGE_PATH, Image};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Envoy's admin port inside a pod.
pub const ADMIN_PORT: u16 = 15000;
/// pilot-agent's status port inside a pod.
pub(crate) const STATUS_PORT: u16 = 15020;
/// Istio's proxy uid and gid (`istio-proxy`), excluded from capture.
pub const PROXY_UID: &str = "1337";

/// Ok when this machine can run pod tests: root, `ip netns add` works, iptables is installed.
pub fn supported() -> Result<(), String> {
    let uid = run_out(&["id", "-u"]).map_err(|e| format!("id -u: {e}"))?;
    if uid.trim() != "0" {
        return Err(format!("not root (uid {})", uid.trim()));
    }
    for tool in ["iptables-restore", "iptables-save", "setpriv", "curl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Err(format!("{tool} is not installed"));
        }
    }
    let probe = format!(
        "pilot-e2e-probe-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    run(&["ip", "netns", "add", &probe]).map_err(|e| format!("ip netns add: {e}"))?;
    let _ = run(&["ip", "netns", "del", &probe]);
    Ok(())
}

fn run_out(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(args: &[&str]) -> anyhow::Result<()> {
    run_out(args).map(|_| ())
}

/// A host-side bridge `pe2e<pid>b<n>` with address 10.244.<subnet>.1/24; pods attach to it.
pub struct Network {
    bridge: String,
    subnet: u8,
    next_host: AtomicU32,
}

impl Network {
    /// Creates the bridge on the first 10.244.x.0/24 (x in 100..=250) no host interface uses.
    pub fn create() -> anyhow::Result<Network> {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let bridge = format!("pe{}b{n}", std::process::id());
        let used = run_out(&["ip", "-o", "-4", "addr", "show"])?;
        let subnet = (100..=250u8)
            .find(|x| !used.contains(&format!("10.244.{x}.")) && claim_subnet(*x))
            .context("no free 10.244.x.0/24 subnet")?;
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        let net = Network {
            bridge,
            subnet,
            next_host: AtomicU32::new(2),
        };
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", net.host_ip()),
            "dev",
            &net.bridge,
        ])?;
        run(&["ip", "link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// The host's address on the bridge (pods reach host services, e.g. pilot-discovery, here).
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.subnet, 1)
    }

    /// A new pod on this network; `hosts` are extra `/etc/hosts` lines (`"240.240.0.10 reviews"`).
    pub fn pod(&self, name: &str, hosts: &[&str]) -> anyhow::Result<Pod> {
        let host = self.next_host.fetch_add(1, Ordering::SeqCst);
        let ip = Ipv4Addr::new(10, 244, self.subnet, u8::try_from(host).context("too many pods")?);
        Pod::create(self, name, ip, hosts)
    }
}

/// Claims subnet `x` across test processes (nextest runs each test in its own) with an
/// exclusively created `/run/pilot-e2e-subnet-<x>` holding our pid; a dead owner's claim is taken.
fn claim_subnet(x: u8) -> bool {
    let path = subnet_claim(x);
    for _ in 0..2 {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                use std::io::Write as _;
                return write!(f, "{}", std::process::id()).is_ok();
            }
            Err(_) => {
                let owner = std::fs::read_to_string(&path).unwrap_or_default();
                if owner.is_empty() || std::path::Path::new(&format!("/proc/{}", owner.trim())).exists() {
                    return false;
                }
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    false
}

fn subnet_claim(x: u8) -> PathBuf {
    PathBuf::from(format!("/run/pilot-e2e-subnet-{x}"))
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run(&["ip", "link", "del", &self.bridge]);
        let _ = std::fs::remove_file(subnet_claim(self.subnet));
    }
}

/// A network namespace with one interface (eth0) on a [`Network`], and the processes started in it.
/// What a pod's agent needs to get a workload certificate from pilot-discovery's CA.
#[derive(Debug, Clone)]
pub struct WorkloadIdentity {
    /// The CA (pilot-discovery's secure port).
    pub ca: std::net::SocketAddr,
    /// The mesh root (`$ROOT_CA_DIR/root-cert.pem`).
    pub root_pem: String,
    /// A service account token the CA accepts (`JWT_RULE`).
    pub token: String,
}

pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    children: Vec<Child>,
    etc: PathBuf,
    host_if: String,
    pub dir: tempfile::TempDir,
}

impl Pod {
    fn create(net: &Network, name: &str, ip: Ipv4Addr, hosts: &[&str]) -> anyhow::Result<Pod> {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let ns = format!("pilot-e2e-{}-{n}", std::process::id());
        let etc = PathBuf::from("/etc/netns").join(&ns);
        std::fs::create_dir_all(&etc)?;
        run(&["ip", "netns", "add", &ns])?;
        let pod = Pod {
            name: name.to_owned(),
            ns,
            ip,
            children: Vec::new(),
            etc,
            host_if: format!("pe{}h{n}", std::process::id()),
            dir: tempfile::tempdir()?,
        };
        // No DNS server: lookups of unknown names fail at once instead of hanging.
        std::fs::write(
            pod.etc.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )?;
        let mut hosts_file = format!("127.0.0.1 localhost\n{ip} {name}\n");
        for line in hosts {
            hosts_file.push_str(line);
            hosts_file.push('\n');
        }
        std::fs::write(pod.etc.join("hosts"), hosts_file)?;
        let host_if = pod.host_if.clone();
        let pod_if = format!("pe{}p{n}", std::process::id());
        run(&["ip", "link", "add", &host_if, "type", "veth", "peer", "name", &pod_if])?;
        let setup = || -> anyhow::Result<()> {
            run(&["ip", "link", "set", &pod_if, "netns", &pod.ns])?;
            run(&["ip", "link", "set", &host_if, "master", &net.bridge])?;
            run(&["ip", "link", "set", &host_if, "up"])?;
            let ns = pod.ns.as_str();
            run(&["ip", "-n", ns, "link", "set", &pod_if, "name", "eth0"])?;
            run(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            // Service VIPs (240.240.0.0/16) need a route for connect() to reach the nat OUTPUT
            // chain; on-link so that nothing uncaptured ever leaves the test bridge.
            run(&["ip", "-n", ns, "route", "add", "240.240.0.0/16", "dev", "eth0"])
        };
        setup()?;
        Ok(pod)
    }

    /// Replaces the pod's resolv.conf (seen as /etc/resolv.conf inside it).
    pub fn set_resolv_conf(&self, text: &str) -> anyhow::Result<()> {
        Ok(std::fs::write(self.etc.join("resolv.conf"), text)?)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).args(args).stdin(Stdio::null());
        cmd
    }

    /// Runs a command in the pod to completion.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(self.command(args).output()?)
    }

    /// Starts a long-running process in the pod, logging to `<dir>/<log>`; killed on drop.
    pub fn spawn(&mut self, log: &str, args: &[&str], env: &[(String, String)]) -> anyhow::Result<u32> {
        let file = std::fs::File::create(self.dir.path().join(log))?;
        let child = self
            .command(args)
            .current_dir(self.dir.path())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// [`spawn`](Self::spawn) with only `env` in the process's environment (as a container's
    /// process has only its image's and its Pod's variables).
    pub fn spawn_clean(&mut self, log: &str, args: &[&str], env: &[(String, String)]) -> anyhow::Result<u32> {
        let file = std::fs::File::create(self.dir.path().join(log))?;
        let child = self
            .command(args)
            .current_dir(self.dir.path())
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    pub fn log(&self, log: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default()
    }
}

/// The last 6,000 bytes of a log, for failure messages.
pub fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(6000);
    let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
    &s[start..]
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Anything the children started (Envoy under pilot-agent).
        if let Ok(pids) = run_out(&["ip", "netns", "pids", &self.ns]) {
            for pid in pids.split_whitespace() {
                let _ = run(&["kill", "-KILL", pid]);
            }
        }
        let _ = run(&["ip", "netns", "del", &self.ns]);
        // The namespace may outlive its name for a while (the kernel frees it lazily): delete
        // the veth pair now so that nothing is left attached on the host.
        let _ = run(&["ip", "link", "del", &self.host_if]);
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn pod_has_its_address_hosts_and_is_removed_on_drop() {
        if let Err(why) = supported() {
            panic!(
                "netns tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why} \
                 (scripts/test.sh skips them on such machines)"
            );
        }
        let net = Network::create().unwrap();
        let pod = net.pod("app", &["240.240.0.10 reviews"]).unwrap();
        let hosts = String::from_utf8(pod.exec(&["cat", "/etc/hosts"]).unwrap().stdout).unwrap();
        assert!(hosts.contains("240.240.0.10 reviews"), "{hosts}");
        let addrs = String::from_utf8(pod.exec(&["ip", "-4", "-o", "addr"]).unwrap().stdout).unwrap();
        assert!(addrs.contains(&format!("{}/24", pod.ip)), "{addrs}");
        // The pod reaches the host over the bridge.
        let listener = std::net::TcpListener::bind((net.host_ip(), 0)).unwrap();
        let target = format!(
            "exec 3<>/dev/tcp/{}/{}",
            net.host_ip(),
            listener.local_addr().unwrap().port()
        );
        let connect = pod.exec(&["timeout", "5", "bash", "-c", &target]).unwrap();
        assert!(connect.status.success(), "{}", String::from_utf8_lossy(&connect.stderr));
        let (ns, host_if) = (pod.ns.clone(), pod.host_if.clone());
        drop(pod);
        assert!(!run_out(&["ip", "netns", "list"]).unwrap().contains(&ns));
        assert!(run(&["ip", "link", "show", &host_if]).is_err());
        assert!(!PathBuf::from("/etc/netns").join(&ns).exists());
    }

    /// A container sees its image's files over the host's, the Pod's /etc/hosts, its volumes
    /// (read-only where asked) and nothing else writable; it runs as its user with only the
    /// capabilities it keeps; and nothing of it shows on the host.
    #[test]
    fn a_container_runs_in_its_image_with_its_volumes_user_and_a_read_only_root() {
        if let Err(why) = supported() {
            panic!("netns tests need network namespaces (root, `ip netns`, iptables, setpriv, curl): {why}");
        }
        let net = Network::create().unwrap();
        let pod = net.pod("box", &["10.9.9.9 istiod.istio-system.svc"]).unwrap();
        let image = Image::new(&["/bin/sh", "-c"], (0, 0)).unwrap();
        image.dir("/etc/istio-e2e-image/proxy").unwrap();
        image.file("/usr/local/bin/e2e-image-sh", Path::new("/bin/sh")).unwrap();
        let volumes = tempfile::tempdir().unwrap();
        let (rw, ro) = (volumes.path().join("rw"), volumes.path().join("ro"));
        std::fs::create_dir(&rw).unwrap();
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&rw, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        std::fs::write(ro.join("token"), "t0k3n").unwrap();
        let script = "id -u; id -G; cat /var/run/secrets/tokens/token; echo; grep istiod /etc/hosts; \
            /usr/local/bin/e2e-image-sh -c 'echo from-image'; \
            touch /etc/istio-e2e-image/proxy/ok && echo wrote-volume; \
            touch /etc/e2e-root 2>/dev/null || echo root-ro; \
            touch /run/e2e-run 2>/dev/null || echo run-ro; \
            touch /var/run/secrets/tokens/x 2>/dev/null || echo volume-ro; \
            grep CapEff /proc/self/status";
        let container = Container {
            name: "box".into(),
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: vec![("PATH".into(), IMAGE_PATH.into())],
            mounts: vec![
                crate::kubelet::Mount {
                    host: rw.clone(),
                    path: "/etc/istio-e2e-image/proxy".into(),
                    read_only: false,
                },
                crate::kubelet::Mount {
                    host: ro,
                    path: "/var/run/secrets/tokens".into(),
                    read_only: true,
                },
            ],
            layer: image.layer().to_path_buf(),
            workdir: "/".into(),
            uid: 1337,
            gid: 1337,
            groups: vec![1338],
            caps: Vec::new(),
            no_new_privs: true,
        };
        let out = pod.run_container(&container).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines,
            [
                "1337",
                "1337 1338",
                "t0k3n",
                "10.9.9.9 istiod.istio-system.svc",
                "from-image",
                "wrote-volume",
                "root-ro",
                "run-ro",
                "volume-ro",
                "CapEff:\t0000000000000000",
            ]
        );
        assert!(rw.join("ok").exists(), "the write went to the volume");
        assert!(
            !Path::new("/etc/istio-e2e-image").exists(),
            "nothing is mounted or made on the host"
        );
        assert!(!Path::new("/usr/local/bin/e2e-image-sh").exists());

        // root keeps only the capabilities it adds (istio-init's NET_ADMIN and NET_RAW)
        let root = Container {
            argv: vec!["/bin/sh".into(), "-c".into(), "grep CapEff /proc/self/status".into()],
            mounts: Vec::new(),
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            caps: vec!["net_admin".into(), "net_raw".into()],
            ..container
        };
        let out = pod.run_container(&root).unwrap();
        // CAP_NET_ADMIN is bit 12, CAP_NET_RAW bit 13
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "CapEff:\t0000000000003000");
    }
}
