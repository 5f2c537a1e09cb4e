//! Test helpers shared by this crate's unit tests.

use std::path::Path;

/// A valid ServiceEntry document named `name` in `default`, for host `<name>.example.com`.
pub(crate) fn service_entry(name: &str) -> String {
    service_entry_with_host(name, &format!("{name}.example.com"))
}

pub(crate) fn service_entry_with_host(name: &str, host: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: default}}
spec:
  hosts: [{host}]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1}}]
"
    )
}

/// Writes `text` to `dir/rel`, creating parent directories.
pub(crate) fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}
