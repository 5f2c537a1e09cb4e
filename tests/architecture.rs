//! The dependency rules of `../shared/ARCHITECTURE.md` and `docs/architecture.md`, checked
//! against the workspace as Cargo sees it (`cargo metadata`) rather than only written down:
//!
//! - `model` depends on leaf crates only (`re2`);
//! - a registry crate depends on `model` and `registry` (and the leaves `monitoring`,
//!   `kclient`), never on the config sources, `environment`, the generators, the push index or
//!   the server;
//! - the pure crates (model, registry, generators, push index, Ingress conversion, injection
//!   engine, webhooks) do no I/O: none depends, directly or through one of ours, on an I/O crate;
//! - `xds-server` knows nothing of the generators, the push index, the registries or the config
//!   sources (it is generic over the environment's snapshot);
//! - `environment` is the only library that knows both the generators and the server;
//! - only binaries and wiring read the process environment (`std::env::var`).
//!
//! An arrow the rules forbid but the code still has is listed in [`KNOWN`] with the issue that
//! removes it; the test fails when such an arrow is gone (so the list only shrinks) as well as
//! when a new one appears.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Forbidden arrows the code has today, each with the issue that removes it.
const KNOWN: &[(&str, &str, &str)] = &[];

/// The workspace's crates that do I/O (network, files, processes, the clock as a driver).
const IO_CRATES_OURS: &[&str] = &[
    "config-sources",
    "kclient",
    "kube-registry",
    "consul-registry",
    "xds-server",
    "environment",
    "security",
    "agent",
    "pilot-discovery",
    "test-support",
    "loadgen",
    "fuzzing",
    "e2e",
];

/// Third-party crates whose use means I/O.
const IO_CRATES_THEIRS: &[&str] = &[
    "tokio",
    "tokio-rustls",
    "tokio-stream",
    "hyper",
    "hyper-util",
    "reqwest",
    "axum",
    "tonic",
    "kube",
    "notify",
    "nix",
    "tempfile",
];

const PURE: &[&str] = &[
    "model",
    "registry",
    "generators",
    "push-index",
    "ingress",
    "inject",
    "webhooks",
];
const REGISTRIES: &[&str] = &["registry", "kube-registry", "consul-registry"];
/// What a registry crate may depend on, of ours.
const REGISTRY_DEPENDENCIES: &[&str] = &["model", "registry", "monitoring", "kclient"];

struct Workspace {
    root: PathBuf,
    /// crate name -> (its workspace dependencies, its third-party dependencies); normal ones only
    /// (dev-dependencies are the tests'). An optional third-party dependency is listed apart: it
    /// is there only when a feature that names it is on.
    deps: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>,
    /// crate name -> its optional third-party dependencies
    optional: BTreeMap<String, BTreeSet<String>>,
    /// crate name -> feature -> what the feature turns on (`dep:x`, `x`, `x/f`)
    features: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// (from, to) -> the features `from` turns on in `to`
    edge_features: BTreeMap<(String, String), Vec<String>>,
    /// crate name -> its source directory.
    src: BTreeMap<String, PathBuf>,
    /// crates with a binary target
    binaries: BTreeSet<String>,
}

fn workspace() -> Workspace {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| panic!("tests/ has a parent"))
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("running cargo metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("cargo metadata's JSON: {e}"));
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    let ours: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut deps = BTreeMap::new();
    let mut optional: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut features = BTreeMap::new();
    let mut edge_features = BTreeMap::new();
    let mut src = BTreeMap::new();
    let mut binaries = BTreeSet::new();
    for p in &packages {
        let name = p["name"].as_str().unwrap_or_default().to_owned();
        let (mut mine, mut theirs) = (BTreeSet::new(), BTreeSet::new());
        for d in p["dependencies"].as_array().into_iter().flatten() {
            if !d["kind"].is_null() {
                continue; // dev and build dependencies
            }
            let dep = d["name"].as_str().unwrap_or_default().to_owned();
            let requested: Vec<String> = d["features"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect();
            edge_features.insert((name.clone(), dep.clone()), requested);
            if ours.contains(&dep) {
                mine.insert(dep);
            } else if d["optional"].as_bool() == Some(true) {
                optional.entry(name.clone()).or_default().insert(dep);
            } else {
                theirs.insert(dep);
            }
        }
        let declared: BTreeMap<String, Vec<String>> = serde_json::from_value(p["features"].clone()).unwrap_or_default();
        features.insert(name.clone(), declared);
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        src.insert(
            name.clone(),
            manifest.parent().map(|d| d.join("src")).unwrap_or_default(),
        );
        let has_bin = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")));
        if has_bin {
            binaries.insert(name.clone());
        }
        deps.insert(name, (mine, theirs));
    }
    Workspace {
        root,
        deps,
        optional,
        features,
        edge_features,
        src,
        binaries,
    }
}

impl Workspace {
    /// `name` and every workspace crate it depends on, transitively.
    fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![name.to_owned()];
        while let Some(c) = todo.pop() {
            if seen.insert(c.clone())
                && let Some((mine, _)) = self.deps.get(&c)
            {
                todo.extend(mine.iter().cloned());
            }
        }
        seen
    }

    fn ours(&self, name: &str) -> &BTreeSet<String> {
        &self
            .deps
            .get(name)
            .unwrap_or_else(|| panic!("no crate {name} in the workspace"))
            .0
    }
}

/// Every forbidden arrow `(from, to, why)`: `to` is a workspace crate `from` depends on, or
/// a third-party I/O crate.
fn violations(ws: &Workspace) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut forbid = |from: &str, to: &str, why: &str| out.push((from.to_owned(), to.to_owned(), why.to_owned()));

    for dep in ws.ours("model") {
        if dep != "re2" {
            forbid("model", dep, "model depends on leaf crates only (re2)");
        }
    }
    for registry in REGISTRIES {
        for dep in ws.ours(registry) {
            if !REGISTRY_DEPENDENCIES.contains(&dep.as_str()) {
                forbid(
                    registry,
                    dep,
                    "a registry depends on model and registry (and monitoring, kclient), never on the config sources or the pipeline above it",
                );
            }
        }
    }
    for pure in PURE {
        let closure = ws.closure(pure);
        // an optional dependency of a crate in the closure, turned on by a feature one of them asks for
        for ((from, to), requested) in &ws.edge_features {
            if !closure.contains(from) || !closure.contains(to) {
                continue;
            }
            for f in requested {
                let turned_on = ws.features.get(to).and_then(|m| m.get(f)).cloned().unwrap_or_default();
                for on in turned_on {
                    let dep = on
                        .trim_start_matches("dep:")
                        .split('/')
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    if IO_CRATES_THEIRS.contains(&dep.as_str()) || IO_CRATES_OURS.contains(&dep.as_str()) {
                        forbid(
                            pure,
                            &dep,
                            &format!("a pure crate does no I/O ({from} turns on {to}'s {f})"),
                        );
                    }
                }
            }
        }
        if let Some(own) = ws.optional.get(*pure) {
            for io in own.iter().filter(|d| IO_CRATES_THEIRS.contains(&d.as_str())) {
                forbid(pure, io, "a pure crate does no I/O (an optional dependency)");
            }
        }
        for c in closure {
            if c != *pure && IO_CRATES_OURS.contains(&c.as_str()) {
                forbid(pure, &c, "a pure crate does no I/O");
            }
            let theirs = &ws.deps[&c].1;
            for io in IO_CRATES_THEIRS.iter().filter(|io| theirs.contains(**io)) {
                let via = if c == *pure {
                    String::new()
                } else {
                    format!(" (through {c})")
                };
                forbid(pure, io, &format!("a pure crate does no I/O{via}"));
            }
        }
    }
    for dep in ws.closure("xds-server") {
        if [
            "generators",
            "push-index",
            "registry",
            "kube-registry",
            "config-sources",
            "environment",
        ]
        .contains(&dep.as_str())
        {
            forbid(
                "xds-server",
                &dep,
                "xds-server is generic over the snapshot: it knows no generator",
            );
        }
    }
    for (name, (mine, _)) in &ws.deps {
        let both = mine.contains("xds-server") && mine.contains("generators");
        let library = !ws.binaries.contains(name) && !["fuzzing", "e2e", "test-support"].contains(&name.as_str());
        if both && library && name != "environment" {
            forbid(
                name,
                "xds-server",
                "only environment knows both the generators and the server",
            );
        }
    }
    out
}

#[test]
fn the_crate_graph_keeps_the_architectures_rules() {
    let ws = workspace();
    let found = violations(&ws);
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(a, b, _)| (*a, *b)).collect();
    let new: Vec<String> = found
        .iter()
        .filter(|(a, b, _)| !known.contains(&(a.as_str(), b.as_str())))
        .map(|(a, b, why)| format!("{a} -> {b}: {why}"))
        .collect();
    assert!(
        new.is_empty(),
        "arrows the architecture forbids (docs/architecture.md, \"Crates\"):\n{}",
        new.join("\n")
    );
    let gone: Vec<String> = KNOWN
        .iter()
        .filter(|(a, b, _)| !found.iter().any(|(x, y, _)| x == a && y == b))
        .map(|(a, b, issue)| format!("{a} -> {b} ({issue})"))
        .collect();
    assert!(
        gone.is_empty(),
        "these known arrows are gone: take them out of KNOWN in tests/architecture.rs:\n{}",
        gone.join("\n")
    );
}

/// The rules see the crates they speak of: a renamed crate must not make a rule check nothing.
#[test]
fn every_crate_the_rules_name_exists() {
    let ws = workspace();
    let named = PURE
        .iter()
        .chain(REGISTRIES)
        .chain(IO_CRATES_OURS)
        .chain(&["re2", "xds-server", "environment"]);
    for name in named {
        assert!(
            ws.deps.contains_key(*name),
            "the rules name {name}, which is not a crate of the workspace"
        );
    }
    assert!(ws.deps.len() >= 20, "only {} crates seen", ws.deps.len());
}

/// The part of a source file before its unit tests (`#[cfg(test)]`, then attributes or comments,
/// then `mod ...`).
fn before_tests(text: &str) -> &str {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut at = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]" {
            let next = lines[i + 1..]
                .iter()
                .map(|l| l.trim_start())
                .find(|l| !l.starts_with("#[") && !l.starts_with("//"));
            if next.is_some_and(|l| l.starts_with("mod ") || l.starts_with("pub mod ")) {
                return &text[..at];
            }
        }
        at += line.len();
    }
    text
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Only binaries and wiring read the process environment: a library gets its settings as
/// arguments. Test code and the `testing` helpers are exempt; `monitoring::logging` reads
/// `RUST_LOG` for the binaries that call it.
#[test]
fn only_binaries_read_the_process_environment() {
    let ws = workspace();
    let exempt_files = ["tests.rs", "testing.rs"];
    let allowed = [("monitoring", "logging.rs")];
    let mut readers = Vec::new();
    let mut scanned = 0;
    for (name, src) in &ws.src {
        if ws.binaries.contains(name) || ["test-support", "fuzzing", "e2e", "loadgen"].contains(&name.as_str()) {
            continue;
        }
        let mut files = Vec::new();
        rust_files(src, &mut files);
        for file in files {
            let base = file.file_name().and_then(|f| f.to_str()).unwrap_or_default();
            if exempt_files.contains(&base)
                || base.ends_with("_tests.rs")
                || file.components().any(|c| c.as_os_str() == "tests")
            {
                continue;
            }
            if allowed.contains(&(name.as_str(), base)) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            scanned += 1;
            if ["env::var(", "env::var_os(", "env::vars("]
                .iter()
                .any(|call| before_tests(&text).contains(call))
            {
                readers.push(file.strip_prefix(&ws.root).unwrap_or(&file).display().to_string());
            }
        }
    }
    assert!(scanned > 100, "only {scanned} library files scanned");
    assert!(
        readers.is_empty(),
        "library code reads the process environment (pass the setting in from the binary):\n{}",
        readers.join("\n")
    );
}
