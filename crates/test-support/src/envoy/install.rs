//! Finding the Envoy binary for tests: `$ENVOY_BIN`, the workspace's `.venv`, or an install by
//! `scripts/install-envoy.sh`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use anyhow::{Context as _, bail};

/// The root of this Cargo workspace (the nearest ancestor whose Cargo.toml has `[workspace]`).
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in manifest_dir.ancestors() {
        let manifest = dir.join("Cargo.toml");
        if std::fs::read_to_string(&manifest).is_ok_and(|text| text.lines().any(|line| line.trim() == "[workspace]")) {
            return Ok(dir.to_path_buf());
        }
    }
    bail!("no Cargo.toml with [workspace] above {}", manifest_dir.display())
}

/// What a test that needs Envoy says when there is none.
const NO_ENVOY: &str = "this test needs an Envoy binary: run scripts/install-envoy.sh \
     (it installs one into <workspace>/.venv) or set ENVOY_BIN to an envoy binary";

/// The Envoy binary as [`envoy_bin`] finds it; panics, failing the test, when there is none, with
/// a message that says so and how to get one. For tests that need Envoy and return no `Result`.
#[track_caller]
pub fn require_envoy_bin() -> PathBuf {
    match envoy_bin() {
        Ok(bin) => bin,
        Err(err) => panic!("{NO_ENVOY}: {err:#}"),
    }
}

/// The Envoy binary: `$ENVOY_BIN`, else the one `scripts/install-envoy.sh` put in `<workspace>/.venv`,
/// else whatever that script installs now (run at most once per process; the script itself
/// serializes concurrent test binaries on a lock file).
pub fn envoy_bin() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ENVOY_BIN").filter(|bin| !bin.is_empty()) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!(
                "ENVOY_BIN={} is not a file (point it at an envoy binary, or unset it and run \
                 scripts/install-envoy.sh)",
                bin.display()
            );
        }
        return Ok(bin);
    }
    let root = workspace_root()?;
    if let Some(bin) = venv_envoy(&root) {
        return Ok(bin);
    }
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| install_envoy(&root).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn venv_envoy(root: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(root.join(".venv").join("lib")).ok()?;
    lib.flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
        .map(|entry| entry.path().join("site-packages/envoy/_bin/envoy"))
        .find(|bin| bin.is_file())
}

fn install_envoy(root: &Path) -> anyhow::Result<PathBuf> {
    let script = root.join("scripts/install-envoy.sh");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .env_remove("ENVOY_BIN")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "no Envoy: ENVOY_BIN is unset, there is none in .venv, and {} failed ({}); see its messages \
             above (or set ENVOY_BIN to an envoy binary)",
            script.display(),
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let bin = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .map(|line| PathBuf::from(line.trim()));
    match bin {
        Some(bin) if bin.is_file() => Ok(bin),
        _ => bail!("{} printed no envoy path: {stdout:?}", script.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_bin_is_found() -> anyhow::Result<()> {
        let bin = envoy_bin()?;
        let version = std::process::Command::new(&bin).arg("--version").output()?;
        assert!(
            String::from_utf8_lossy(&version.stdout).contains("/1.40."),
            "{version:?}"
        );
        assert!(workspace_root()?.join("scripts/install-envoy.sh").is_file());
        Ok(())
    }

    #[test]
    fn install_script_reports_the_venv_envoy() -> anyhow::Result<()> {
        let root = workspace_root()?;
        // Only where the venv exists already (as after scripts/test.sh): this must not install.
        let Some(venv_bin) = venv_envoy(&root) else {
            bail!(
                "no Envoy in {}/.venv: this test checks the one scripts/install-envoy.sh installed there \
                 (run that script first)",
                root.display()
            );
        };
        let reported = install_envoy(&root)?;
        assert_eq!(reported.canonicalize()?, venv_bin.canonicalize()?);
        Ok(())
    }
}
