//! `pilot-discovery validate -f FILE|DIR...`: checks Istio YAML/JSON offline with the same decoding
//! and validation as the config directory source. One line per invalid resource (file, kind,
//! namespace/name, reason); exit code 1 if any resource or file is invalid.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use config_sources::{Level, SourceError, is_config_file, parse_documents};

/// Files named directly, and config files found recursively under directories, sorted.
fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(format!("{}: no such file or directory", p.display()));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if is_config_file(&p) {
            out.push(p);
        }
    }
    Ok(())
}

/// Validates `paths`, writing findings to stdout; returns (valid, invalid) counts.
pub fn check(paths: &[PathBuf], out: &mut impl std::io::Write) -> Result<(usize, usize), String> {
    let files = collect(paths)?;
    let (mut valid, mut invalid) = (0, 0);
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                invalid += 1;
                let _ = writeln!(out, "{}: cannot read: {e}", file.display());
                continue;
            }
        };
        for result in parse_documents(&text, &file) {
            match result {
                Ok(_) => valid += 1,
                Err(e @ SourceError::Unsupported { .. }) => {
                    valid += 1;
                    let _ = writeln!(out, "warning: {e}");
                }
                Err(e) if e.level() == Level::Warning => {
                    let _ = writeln!(out, "warning: {e}");
                }
                Err(e) => {
                    invalid += 1;
                    let _ = writeln!(out, "{e}");
                }
            }
        }
    }
    Ok((valid, invalid))
}

pub fn run(paths: &[PathBuf]) -> ExitCode {
    let mut stdout = std::io::stdout();
    match check(paths, &mut stdout) {
        Ok((valid, 0)) => {
            println!("{valid} resources valid");
            ExitCode::SUCCESS
        }
        Ok((valid, invalid)) => {
            println!("{invalid} invalid, {valid} valid");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_each_invalid_resource_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: good, namespace: default}
spec:
  hosts: [a.example.com]
  http:
  - route:
    - destination: {host: a.example.com}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: bad-dr, namespace: prod}
spec:
  host: ratings
  subsets:
  - name: v1
    labels: {version: v1}
    bogusField: 1
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "kind: [unclosed\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not config").unwrap();
        let mut out = Vec::new();
        let (valid, invalid) = check(&[dir.path().to_path_buf()], &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(valid, 1, "{out}");
        assert_eq!(invalid, 2, "{out}");
        assert!(out.contains("DestinationRule prod/bad-dr"), "{out}");
        assert!(out.contains("bogusField"), "{out}");
        assert!(out.contains("broken.yaml"), "{out}");
        assert!(out.contains("warning:") && out.contains("Widget"), "{out}");
        assert!(!out.contains("notes.txt"), "{out}");
    }

    #[test]
    fn missing_path_is_an_error() {
        let mut out = Vec::new();
        assert!(check(&[PathBuf::from("/nonexistent/istio")], &mut out).is_err());
    }
}
