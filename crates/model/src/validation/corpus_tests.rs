//! Conformance tests against Istio's own inputs in `../shared/corpus/istio`: the validation test data
//! (`*-valid.yaml` accepted, `*-invalid.yaml` rejected) and `tests/testdata/config` (all accepted).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::{ConfigError, ConfigSpec, parse_config};

/// `<workspace>/../shared/corpus/istio`; panics (failing the test) when the corpus is not there.
pub(super) fn corpus_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../../../shared/corpus/istio");
    assert!(
        root.is_dir(),
        "the Istio corpus is missing: {} is not a directory (these tests need the steering repo's \
         shared/ directory checked out beside the project, as ../shared)",
        root.display()
    );
    root
}

/// Plain scalars that Go's YAML parser reads differently from YAML 1.2 parsers, quoted so both agree:
/// in `[1.2.3.4, 001:db8::]` Go reads the IPv6 address, a YAML 1.2 parser (serde-saphyr, PyYAML) reads
/// the last `:` before `]` as a mapping indicator and yields `{"001:db8:": null}`.
const GO_YAML_QUIRKS: [(&str, &str); 1] = [("[1.2.3.4, 001:db8::]", r#"[1.2.3.4, "001:db8::"]"#)];

/// Every non-empty YAML document of a multi-document file.
fn documents(path: &Path) -> Vec<Value> {
    let mut text = std::fs::read_to_string(path).unwrap();
    for (go, quoted) in GO_YAML_QUIRKS {
        text = text.replace(go, quoted);
    }
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn files_in(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    files.sort();
    files
}

fn name_of(doc: &Value) -> String {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?");
    format!("{kind} {name}")
}

#[test]
fn istio_validation_testdata() {
    let root = corpus_root();
    let dir = root.join("pkg/config/validation/testdata/crds");
    let kinds = [
        "destinationrule-",
        "serviceentry-",
        "workloadentry-",
        "peerauth-",
        "authz-",
        "reqauth-",
    ];
    let files = files_in(&dir, |n| kinds.iter().any(|k| n.starts_with(k)) && n.ends_with(".yaml"));
    assert_eq!(
        files.len(),
        12,
        "expected a valid and an invalid file per kind in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for file in &files {
        let expect_valid = file.to_string_lossy().ends_with("-valid.yaml");
        for mut doc in documents(file) {
            let istio_err = doc.as_object_mut().and_then(|o| o.remove("_err"));
            let shown = serde_json::to_string(&doc).unwrap();
            match (expect_valid, parse_config(doc, "default")) {
                (true, Ok(_)) => accepted += 1,
                (false, Err(e)) => {
                    rejected += 1;
                    println!("rejected as expected (istio: {istio_err:?}): {e}");
                }
                (true, Err(e)) => failures.push(format!("{}: valid document rejected: {e}\n  {shown}", file.display())),
                (false, Ok(_)) => failures.push(format!(
                    "{}: invalid document accepted (istio says {istio_err:?})\n  {shown}",
                    file.display()
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        accepted >= 10 && rejected >= 15,
        "too few documents checked: {accepted} valid, {rejected} invalid"
    );
}

#[test]
fn istio_testdata_config_all_accepted() {
    let root = corpus_root();
    let dir = root.join("tests/testdata/config");
    let mut failures = Vec::new();
    let mut accepted = 0;
    for file in files_in(&dir, |n| n.ends_with(".yaml")) {
        for doc in documents(&file) {
            let what = name_of(&doc);
            let shown = serde_json::to_string(&doc).unwrap();
            match parse_config(doc, "default") {
                Ok(c) if matches!(c.spec, ConfigSpec::Unsupported(_)) => {
                    println!("{}: {what}: kind not yet supported, skipped", file.display());
                }
                Ok(_) => accepted += 1,
                Err(ConfigError::UnknownKind { .. }) => {
                    println!("{}: {what}: not an Istio kind, skipped", file.display())
                }
                Err(e) => failures.push(format!("{}: {what} rejected: {e}\n  {shown}", file.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(accepted >= 70, "only {accepted} documents accepted");
}
