//! Locates the workspace's own binaries (`pilot-discovery`, later `pilot-agent`) for tests that
//! run them as real processes. `scripts/test.sh` builds them before the tests; when one is
//! missing (a plain `cargo test`), it is built once here.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, bail};

use crate::envoy::workspace_root;

fn target_dir() -> anyhow::Result<PathBuf> {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(workspace_root()?.join("target")),
    }
}

static BUILD: Mutex<()> = Mutex::new(());

/// Path of a workspace binary in the debug profile, built on first use if missing.
pub fn cargo_bin(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let path = target_dir()?.join("debug").join(bin);
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if path.exists() {
        return Ok(path);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", package, "--bin", bin])
        .current_dir(workspace_root()?)
        .status()
        .with_context(|| format!("running cargo build for {bin}"))?;
    if !status.success() || !path.exists() {
        bail!("could not build {bin} (cargo build -p {package} --bin {bin})");
    }
    Ok(path)
}
