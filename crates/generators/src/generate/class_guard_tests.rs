//! A tripwire for the class keys: the generators of each type read a proxy only through the
//! fields listed here (found in their sources as `proxy.<field>`, whatever the binding's owner:
//! `self.proxy`, `ctx.proxy`). A new read fails this test until the key of that type covers it
//! (`class.rs`) and the field is added here. Node metadata may be read only as
//! `proxy.metadata.raw.get("<KEY>")` with a key of `LDS_METADATA_KEYS`, by listeners.

use std::path::{Path, PathBuf};

use regex::Regex;

use super::LDS_METADATA_KEYS;

/// Fields every key covers: the node type (`is_router`, `is_sidecar`), the namespace, the
/// cluster, the labels (restricted, plus the Sidecar in effect); `id` is only logged.
const COMMON: &[&str] = &[
    "id",
    "cluster_id",
    "node_type",
    "is_router",
    "is_sidecar",
    "config_namespace",
    "labels",
];

/// Source directories (or files) under `src/` of each type, and what else its key covers.
const READS: &[(&str, &[&str])] = &[
    // `proxy_headers_config`: `preserveHttp1HeaderCase` (`preserve_header_case`)
    // `has_workload_identity`: auto mTLS (keyed as `workload_identity`)
    (
        "cds",
        &[
            "locality",
            "ip_addresses",
            "proxy_headers_config",
            "has_workload_identity",
        ],
    ),
    ("traffic_policy.rs", &["locality", "ip_addresses"]),
    // `eds::locality` names the proxy's `Locality` `proxy` too; `EdsKey` keys the network and
    // the requested network view (split-horizon EDS)
    (
        "eds",
        &[
            "locality",
            "region",
            "network",
            "in_network",
            "sees_network",
            "requested_network_view",
        ],
    ),
    // `proxyHeaders` are read through `ProxyHeaders::of` (keyed as `proxy_headers`)
    ("rds", &["dns_domain"]),
    ("route", &["dns_domain"]),
    // `ip_addresses`: the bind of Sidecar ingress listeners with capture mode NONE (`ingress_bind`)
    // `has_workload_identity` reads `WORKLOAD_IDENTITY_SOCKET_FILE`, an LDS metadata key
    ("lds", &["metadata", "ip_addresses", "has_workload_identity"]),
];

fn sources(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    for entry in std::fs::read_dir(path).unwrap() {
        sources(&entry.unwrap().path(), out);
    }
}

/// The non-test code of a source file, without line comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn generators_read_only_the_proxy_fields_their_keys_cover() {
    let field = Regex::new(r"\bproxy\s*\.\s*([A-Za-z_]\w*)").unwrap();
    let metadata = Regex::new(r"\bproxy\s*\.\s*metadata\b").unwrap();
    let metadata_key = Regex::new(r#"\bproxy\s*\.\s*metadata\s*\.\s*raw\s*\.\s*get\(\s*"(\w+)"\s*\)"#).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for (dir, extra) in READS {
        let mut files = Vec::new();
        sources(&src.join(dir), &mut files);
        for file in files.iter().filter(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".rs") && !name.ends_with("tests.rs") && !name.ends_with("testing.rs")
        }) {
            let code = code(file);
            for c in field.captures_iter(&code) {
                let f = &c[1];
                assert!(
                    COMMON.contains(&f) || extra.contains(&f),
                    "{} reads proxy.{f}: add it to the cache key of its type in generate/class.rs, then here",
                    file.display()
                );
                checked += 1;
            }
            let keys: Vec<String> = metadata_key.captures_iter(&code).map(|c| c[1].to_owned()).collect();
            assert_eq!(
                metadata.find_iter(&code).count(),
                keys.len(),
                "{} reads node metadata other than metadata.raw.get(\"KEY\"): key it in generate/class.rs",
                file.display()
            );
            for k in keys {
                assert!(
                    LDS_METADATA_KEYS.contains(&k.as_str()),
                    "{} reads node metadata {k}: add it to LDS_METADATA_KEYS",
                    file.display()
                );
            }
        }
    }
    // the scan sees the generators' reads (labels, namespace, locality, metadata, ...)
    assert!(checked > 20, "only {checked} proxy reads found: is the scan broken?");
}

#[test]
fn the_tripwire_catches_a_read_of_an_unkeyed_field() {
    let field = Regex::new(r"\bproxy\s*\.\s*([A-Za-z_]\w*)").unwrap();
    let snippet = "let c = self.proxy\n        .verified_identity();";
    let found: Vec<&str> = field
        .captures_iter(snippet)
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert_eq!(found, ["verified_identity"]);
    assert!(
        !COMMON.contains(&"verified_identity") && READS.iter().all(|(_, extra)| !extra.contains(&"verified_identity"))
    );
}
