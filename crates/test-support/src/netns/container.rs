//! Containers in a test pod, as a container runtime (runc) starts them: the image's files over
//! the host's root file system, read-only, the Pod's `/etc/hosts` and `/etc/resolv.conf`, the
//! volumes bind-mounted at their paths (read-only where the kubelet says so), then the command as
//! the container's user and groups with its capabilities, from the image's working directory.
//! Everything happens in a private mount namespace of the process, so nothing is mounted on the
//! host, and a write outside the volumes fails with EROFS (`Read-only file system`).
//!
//! An [`Image`] is a directory of the image's own files (symbolic links to the binaries the test
//! runs, the directories its Dockerfile makes) laid over the host's `/usr`, `/etc`, `/var` with
//! read-only overlay mounts; `/run` is an empty tmpfs, made read-only once the volumes under
//! `/var/run` are mounted.

use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{Context, bail};

use super::Pod;
use crate::kubelet::Mount;

/// An image: its files, entrypoint, environment, user and working directory.
#[derive(Debug)]
pub struct Image {
    layer: tempfile::TempDir,
    pub entrypoint: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `USER uid:gid` (root when the Dockerfile sets none).
    pub user: (u32, u32),
    pub workdir: String,
}

/// Debian's `PATH`, which an image's environment has.
pub const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Image {
    /// An empty image with `entrypoint`, running as `user` in `/`.
    pub fn new(entrypoint: &[&str], user: (u32, u32)) -> anyhow::Result<Image> {
        Ok(Image {
            layer: tempfile::tempdir()?,
            entrypoint: entrypoint.iter().map(|s| (*s).to_owned()).collect(),
            env: vec![("PATH".into(), IMAGE_PATH.into())],
            user,
            workdir: "/".into(),
        })
    }

    /// The image's file `path` is the host's file `host` (a symbolic link to it).
    pub fn file(&self, path: &str, host: &Path) -> anyhow::Result<()> {
        let at = self.at(path)?;
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let host = std::fs::canonicalize(host).with_context(|| format!("image file {path}: {}", host.display()))?;
        std::os::unix::fs::symlink(host, &at).with_context(|| format!("image file {path}"))?;
        Ok(())
    }

    /// A directory of the image (`mkdir -p` in its Dockerfile).
    pub fn dir(&self, path: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(self.at(path)?)?;
        Ok(())
    }

    fn at(&self, path: &str) -> anyhow::Result<PathBuf> {
        let rel = path.trim_start_matches('/');
        let top = rel.split('/').next().unwrap_or_default();
        if !matches!(top, "usr" | "etc" | "var") || rel.split('/').any(|c| c == "..") {
            bail!("image path {path}: only files under /usr, /etc and /var are laid over the host");
        }
        Ok(self.layer.path().join(rel))
    }

    /// The directory of the image's files.
    pub fn layer(&self) -> &Path {
        self.layer.path()
    }

    /// Istio's proxyv2 image as `deploy/Dockerfile.proxyv2` builds it: `pilot-agent` (the
    /// entrypoint) and Envoy in /usr/local/bin, /etc/istio/proxy and /var/lib/istio/data.
    pub fn proxyv2() -> anyhow::Result<Image> {
        let image = Image::new(&["/usr/local/bin/pilot-agent"], (0, 0))?;
        image.file(
            "/usr/local/bin/pilot-agent",
            &crate::bin::cargo_bin("agent", "pilot-agent")?,
        )?;
        image.file("/usr/local/bin/envoy", &crate::envoy::envoy_bin()?)?;
        image.dir("/etc/istio/proxy")?;
        image.dir("/var/lib/istio/data")?;
        Ok(image)
    }

    /// Istio's pilot image as `deploy/Dockerfile` builds it: `pilot-discovery` (the entrypoint)
    /// in /usr/local/bin, user 1337:1337.
    pub fn pilot() -> anyhow::Result<Image> {
        let image = Image::new(&["/usr/local/bin/pilot-discovery"], (1337, 1337))?;
        image.file(
            "/usr/local/bin/pilot-discovery",
            &crate::bin::cargo_bin("pilot-discovery", "pilot-discovery")?,
        )?;
        Ok(image)
    }
}

/// What a container runtime runs: see [`crate::kubelet::Kubelet::container`].
#[derive(Debug, Clone)]
pub struct Container {
    pub name: String,
    pub argv: Vec<String>,
    /// The whole environment of the process (the image's, then the container's).
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    /// The image's files ([`Image::layer`]).
    pub layer: PathBuf,
    pub workdir: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the Pod's `fsGroup`).
    pub groups: Vec<u32>,
    /// The capabilities kept (lower case, without `cap_`); the others are dropped.
    pub caps: Vec<String>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
}

/// The runtime's work in the container's mount namespace (`sh -c`, as root, before the command):
/// `$1` the image layer, `$2` the pod's network namespace name, then `host path ro|rw` triples
/// up to `--`, then the working directory and the `setpriv` command line.
const RUNTIME: &str = r#"set -eu
layer=$1; ns=$2; shift 2
for top in "$layer"/*; do
  [ -d "$top" ] || continue
  dir=/${top##*/}
  mount -t overlay overlay -o "lowerdir=$top:$dir" "$dir"
done
for f in hosts resolv.conf; do
  if [ -e "/etc/netns/$ns/$f" ]; then mount --bind "/etc/netns/$ns/$f" "/etc/$f"; fi
done
mount -t tmpfs -o mode=755 tmpfs /run
ro=""
while [ "$1" != "--" ]; do
  mkdir -p "$2"
  mount --bind "$1" "$2"
  if [ "$3" = ro ]; then ro="$ro $2"; fi
  shift 3
done
shift
for dir in $ro; do mount -o remount,bind,ro "$dir"; done
mount -o remount,ro /run
mount -o remount,bind,ro /
cd "$1"; shift
exec "$@"
"#;

impl Pod {
    /// The command that runs `c` in this pod (through `ip netns exec`), with its environment.
    fn container_command(&self, c: &Container) -> anyhow::Result<std::process::Command> {
        for m in &c.mounts {
            let path = m.path.trim_start_matches('/');
            if m.path.contains(' ') || m.host.to_string_lossy().contains(' ') {
                bail!("container {}: mount {} has a space in its path", c.name, m.path);
            }
            // Mount points under /run are made in the tmpfs; others must be in the image's files
            // (the runtime makes them there, as runc does in a container's root).
            if !(path.starts_with("run/") || path.starts_with("var/run/")) {
                std::fs::create_dir_all(c.layer.join(path))
                    .with_context(|| format!("container {}: mount point {}", c.name, m.path))?;
            }
        }
        let mut args: Vec<String> = [
            "ip",
            "netns",
            "exec",
            &self.ns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(["sh".into(), "-c".into(), RUNTIME.into(), "runtime".into()]);
        args.push(c.layer.display().to_string());
        args.push(self.ns.clone());
        for m in &c.mounts {
            args.push(m.host.display().to_string());
            args.push(m.path.clone());
            args.push(if m.read_only { "ro" } else { "rw" }.into());
        }
        args.push("--".into());
        args.push(c.workdir.clone());
        args.push("setpriv".into());
        args.push(format!("--reuid={}", c.uid));
        args.push(format!("--regid={}", c.gid));
        if c.groups.is_empty() {
            args.push("--clear-groups".into());
        } else {
            let groups: Vec<String> = c.groups.iter().map(u32::to_string).collect();
            args.push(format!("--groups={}", groups.join(",")));
        }
        let caps: String = c.caps.iter().map(|cap| format!(",+{cap}")).collect();
        args.push(format!("--bounding-set=-all{caps}"));
        args.push(format!("--inh-caps=-all{caps}"));
        if c.no_new_privs {
            args.push("--no-new-privs".into());
        }
        args.extend(c.argv.iter().cloned());
        let mut cmd = std::process::Command::new(&args[0]);
        cmd.args(&args[1..])
            .current_dir(self.dir.path())
            .env_clear()
            .envs(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null());
        Ok(cmd)
    }

    /// Starts the container `c` in this pod, its output in `<dir>/<name>.log`; killed on drop.
    pub fn start_container(&mut self, c: &Container) -> anyhow::Result<u32> {
        let mut cmd = self.container_command(c)?;
        let file = std::fs::File::create(self.dir.path().join(format!("{}.log", c.name)))?;
        let child = cmd.stdout(file.try_clone()?).stderr(file).spawn()?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Runs the container `c` (an init container) in this pod to its end.
    pub fn run_container(&self, c: &Container) -> anyhow::Result<Output> {
        Ok(self.container_command(c)?.output()?)
    }
}
