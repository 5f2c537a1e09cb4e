//! Every input of every fuzz target's corpus (`fuzz/corpus/<target>`) and every crash the fuzzers
//! found (`fuzz/regressions/<target>`), replayed through the target: the regression tests of
//! fuzzing, on the stable toolchain. A panic aborts the test process, after the input's path is
//! printed.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn replay(target: &str) {
    let (_, run) = fuzzing::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no target {target}"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let corpus = inputs(&root.join("corpus").join(target));
    assert!(
        corpus.len() >= 2,
        "fuzz/corpus/{target} has {} inputs: the seeds at least must be there (cargo run -p fuzzing --bin fuzz-seeds)",
        corpus.len()
    );
    let regressions = inputs(&root.join("regressions").join(target));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("{target}: {}", path.display());
        run(&data);
    }
    eprintln!(
        "{target}: {} corpus inputs and {} regressions replayed",
        corpus.len(),
        regressions.len()
    );
}

#[test]
fn config_corpus() {
    replay("config");
}

#[test]
fn xds_request_corpus() {
    replay("xds_request");
}

#[test]
fn agent_xds_proxy_corpus() {
    replay("agent_xds_proxy");
}

#[test]
fn admission_review_corpus() {
    replay("admission_review");
}

#[test]
fn inject_review_corpus() {
    replay("inject_review");
}

#[test]
fn dns_message_corpus() {
    replay("dns_message");
}

#[test]
fn sds_request_corpus() {
    replay("sds_request");
}

#[test]
fn kube_object_corpus() {
    replay("kube_object");
}
