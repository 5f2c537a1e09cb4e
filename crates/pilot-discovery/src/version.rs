//! Build information, printed by `pilot-discovery version` and served at `/version` in Istio's
//! `version.BuildInfo` form.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct BuildInfo {
    pub version: &'static str,
    pub revision: &'static str,
    pub rust_version: &'static str,
    pub status: &'static str,
    pub tag: &'static str,
}

pub const INFO: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    revision: env!("PILOT_GIT_REVISION"),
    rust_version: "rust1.95",
    status: "Clean",
    tag: env!("CARGO_PKG_VERSION"),
};

impl BuildInfo {
    /// The one-line form istiod serves at `/version`: `version-revision-toolchain-status-tag`.
    pub fn line(&self) -> String {
        format!(
            "{}-{}-{}-{}-{}",
            self.version, self.revision, self.rust_version, self.status, self.tag
        )
    }

    /// The long form of `pilot-discovery version`.
    pub fn long(&self) -> String {
        format!(
            "version.BuildInfo{{Version:\"{}\", GitRevision:\"{}\", RustVersion:\"{}\", BuildStatus:\"{}\", GitTag:\"{}\"}}",
            self.version, self.revision, self.rust_version, self.status, self.tag
        )
    }
}
