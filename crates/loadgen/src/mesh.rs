//! The synthetic mesh: ServiceEntries, VirtualServices and DestinationRules written as YAML into a
//! config directory for pilot-discovery's `--configDir`, and the sidecar node IDs of the proxies.
//! Spread over namespaces and scoped with a Sidecar per namespace, it is istio.io's reference
//! mesh (each sidecar sees its own namespace's services and `istio-system`'s).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Namespace of every generated resource and proxy in a one-namespace mesh; the prefix of the
/// namespaces otherwise.
pub const NAMESPACE: &str = "load";

/// Size and shape of the synthetic mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshSpec {
    pub services: usize,
    pub endpoints: usize,
    pub virtual_services: usize,
    pub destination_rules: usize,
    /// Service `i` (its VirtualService and DestinationRule) and proxy `i` are in namespace
    /// [`namespace`]`(namespaces, i)`.
    pub namespaces: usize,
    /// A Sidecar per namespace whose egress imports `./*` and `istio-system/*`.
    pub sidecar_scope: bool,
}

impl MeshSpec {
    /// Namespace of service (VirtualService, DestinationRule) `i`.
    pub fn service_namespace(&self, i: usize) -> String {
        namespace(self.namespaces, i)
    }

    /// Namespace of proxy `n`.
    pub fn proxy_namespace(&self, n: usize) -> String {
        namespace(self.namespaces, n)
    }

    /// Hostname of service `i`.
    pub fn service_host(&self, i: usize) -> String {
        format!("svc-{i}.{}.svc.cluster.local", self.service_namespace(i))
    }

    /// Whether proxy `n` sees service `i` (all do unless Sidecars scope them to their namespace).
    pub fn sees(&self, n: usize, i: usize) -> bool {
        !self.sidecar_scope || same_namespace(self.namespaces, n, i)
    }
}

/// Whether proxy or service `a` and `b` are in the same one of `namespaces` namespaces.
pub(crate) fn same_namespace(namespaces: usize, a: usize, b: usize) -> bool {
    namespaces <= 1 || a % namespaces == b % namespaces
}

/// `load` when there is one namespace, else `load-<i mod namespaces>`.
pub fn namespace(namespaces: usize, i: usize) -> String {
    if namespaces <= 1 {
        NAMESPACE.to_owned()
    } else {
        format!("{NAMESPACE}-{}", i % namespaces)
    }
}

/// Address of endpoint `k` (counted over the whole mesh), in 10.128.0.0/9: config data only.
pub fn endpoint_address(k: usize) -> String {
    format!("10.{}.{}.{}", 128 + (k >> 16) % 128, (k >> 8) & 255, k & 255)
}

/// Node ID of sidecar proxy `n` in namespace `ns`: `sidecar~10.0.<i>.<j>~pod-<n>.<ns>~<ns>.svc.cluster.local`.
pub(crate) fn sidecar_node_id(ns: &str, n: usize) -> String {
    format!(
        "sidecar~10.0.{}.{}~pod-{n}.{ns}~{ns}.svc.cluster.local",
        n / 250,
        n % 250 + 1
    )
}

/// Node metadata of sidecar proxy `n` in namespace `ns`, as Istio's injector sets it.
pub(crate) fn sidecar_metadata(ns: &str, n: usize) -> serde_json::Value {
    serde_json::json!({
        "NAMESPACE": ns,
        "ISTIO_VERSION": "1.28.0",
        "CLUSTER_ID": "Kubernetes",
        "LABELS": {"app": format!("pod-{}", n % 16)},
        "POD_NAME": format!("pod-{n}"),
    })
}

/// ServiceEntry `i`: one HTTP port 8080, STATIC, MESH_INTERNAL, `spec.endpoints` inline
/// endpoints; `shift` moves the addresses (endpoint churn).
pub fn service_entry(spec: &MeshSpec, i: usize, shift: usize) -> String {
    let endpoints = spec.endpoints;
    let mut y = format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: svc-{i}, namespace: {}}}\n\
         spec:\n  hosts: [{}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
         ports: [{{number: 8080, name: http, protocol: HTTP}}]\n  endpoints:\n",
        spec.service_namespace(i),
        spec.service_host(i)
    );
    for j in 0..endpoints {
        let version = if j % 2 == 0 { "v1" } else { "v2" };
        let _ = writeln!(
            y,
            "  - {{address: {}, labels: {{version: {version}}}}}",
            endpoint_address(i * endpoints + j + shift)
        );
    }
    y
}

/// VirtualService `i` for service `i`: a weighted split between subsets v1 and v2 with a route
/// timeout; `generation` changes the timeout, so each generation is a different route.
pub fn virtual_service(spec: &MeshSpec, i: usize, generation: u64) -> String {
    let host = spec.service_host(i);
    let ns = spec.service_namespace(i);
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: vs-{i}, namespace: {ns}}}\n\
         spec:\n  hosts: [{host}]\n  http:\n  - timeout: {}s\n    route:\n    \
         - destination: {{host: {host}, subset: v1}}\n      weight: 90\n    \
         - destination: {{host: {host}, subset: v2}}\n      weight: 10\n",
        generation + 1
    )
}

/// DestinationRule `i` for service `i` with subsets v1 and v2.
pub fn destination_rule(spec: &MeshSpec, i: usize) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: dr-{i}, namespace: {}}}\n\
         spec:\n  host: {}\n  subsets:\n  - name: v1\n    labels: {{version: v1}}\n  \
         - name: v2\n    labels: {{version: v2}}\n",
        spec.service_namespace(i),
        spec.service_host(i)
    )
}

/// Path of VirtualService `i`'s file (one file each, so a change rewrites one file).
pub(crate) fn virtual_service_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("vs-{i}.yaml"))
}

/// The Sidecar of namespace `ns` in the reference mesh: egress to its own namespace and
/// `istio-system` only.
pub(crate) fn namespace_sidecar(ns: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: {ns}}}\n\
         spec:\n  egress:\n  - hosts: [\"./*\", \"istio-system/*\"]\n"
    )
}

/// Writes the whole mesh into `dir`.
pub(crate) fn write_mesh(dir: &Path, spec: &MeshSpec) -> Result<()> {
    write_service_entries(dir, spec)?;
    let rules = (0..spec.destination_rules)
        .map(|i| destination_rule(spec, i))
        .collect::<Vec<_>>()
        .join("---\n");
    write(&dir.join("destination-rules.yaml"), &rules)?;
    for i in 0..spec.virtual_services {
        write(&virtual_service_path(dir, i), &virtual_service(spec, i, 0))?;
    }
    if spec.sidecar_scope {
        let sidecars = (0..spec.namespaces.max(1))
            .map(|k| namespace_sidecar(&namespace(spec.namespaces, k)))
            .collect::<Vec<_>>()
            .join("---\n");
        write(&dir.join("sidecars.yaml"), &sidecars)?;
    }
    Ok(())
}

/// Moves service 0's endpoints to fresh addresses at `generation` (the endpoint-churn change).
pub(crate) fn churn_endpoints(dir: &Path, spec: &MeshSpec, generation: usize) -> Result<()> {
    move_endpoints(dir, spec, 0, generation)
}

/// Rewrites service `i`'s file with its endpoints shifted by `generation` meshes, so that every
/// generation of every service has addresses of its own (one Kubernetes endpoint update).
pub(crate) fn move_endpoints(dir: &Path, spec: &MeshSpec, i: usize, generation: usize) -> Result<()> {
    let shift = generation * spec.services * spec.endpoints;
    write_atomically(&service_entry_path(dir, i), &service_entry(spec, i, shift))
}

/// The first endpoint address of service `i` at `generation` (see [`move_endpoints`]).
pub(crate) fn first_endpoint_address(spec: &MeshSpec, i: usize, generation: usize) -> String {
    endpoint_address(i * spec.endpoints + generation * spec.services * spec.endpoints)
}

/// Path of ServiceEntry `i`'s file (one file each, so a change rewrites one small file).
pub(crate) fn service_entry_path(dir: &Path, i: usize) -> PathBuf {
    dir.join("service-entries").join(format!("svc-{i}.yaml"))
}

/// Every ServiceEntry at generation 0, one file each.
fn write_service_entries(dir: &Path, spec: &MeshSpec) -> Result<()> {
    let sub = dir.join("service-entries");
    std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
    for i in 0..spec.services {
        write(&service_entry_path(dir, i), &service_entry(spec, i, 0))?;
    }
    Ok(())
}

/// Rewrites VirtualService `i` at `generation` (the config-change scenario's one change).
pub(crate) fn change_virtual_service(dir: &Path, spec: &MeshSpec, i: usize, generation: u64) -> Result<()> {
    write(&virtual_service_path(dir, i), &virtual_service(spec, i, generation))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes a hidden sibling (which the watcher skips) and renames it over `path`, so that a rescan
/// never reads half a file.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = path.with_file_name(format!(".{name}.tmp"));
    write(&temp, text)?;
    std::fs::rename(&temp, path).with_context(|| format!("renaming {} to {}", temp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::ConfigKind;

    fn parse_dir(dir: &Path) -> Vec<model::Config> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(parse_dir(&path));
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in config_sources::parse_documents(&text, &path) {
                out.push(doc.unwrap_or_else(|e| panic!("{}: {e}", path.display())));
            }
        }
        out
    }

    #[test]
    fn the_written_mesh_validates_with_the_requested_counts() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MeshSpec {
            services: 12,
            endpoints: 3,
            virtual_services: 2,
            destination_rules: 4,
            namespaces: 1,
            sidecar_scope: false,
        };
        write_mesh(dir.path(), &spec).unwrap();
        let configs = parse_dir(dir.path());
        let count = |k: ConfigKind| configs.iter().filter(|c| c.kind == k).count();
        assert_eq!(count(ConfigKind::ServiceEntry), 12);
        assert_eq!(count(ConfigKind::VirtualService), 2);
        assert_eq!(count(ConfigKind::DestinationRule), 4);
        assert!(configs.iter().all(|c| c.meta.namespace == NAMESPACE));
        let last = std::fs::read_to_string(service_entry_path(dir.path(), 11)).unwrap();
        assert!(last.contains(&endpoint_address(35)) && !last.contains(&endpoint_address(36)));
        let first = std::fs::read_to_string(service_entry_path(dir.path(), 0)).unwrap();
        assert!(first.contains(&format!("{{address: {},", endpoint_address(0))));
        assert!(!first.contains(&endpoint_address(3)));
    }

    #[test]
    fn a_change_rewrites_one_virtual_service_differently() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MeshSpec {
            services: 2,
            endpoints: 1,
            virtual_services: 1,
            destination_rules: 1,
            namespaces: 1,
            sidecar_scope: false,
        };
        write_mesh(dir.path(), &spec).unwrap();
        let before = std::fs::read_to_string(virtual_service_path(dir.path(), 0)).unwrap();
        change_virtual_service(dir.path(), &spec, 0, 1).unwrap();
        let after = std::fs::read_to_string(virtual_service_path(dir.path(), 0)).unwrap();
        assert_ne!(before, after);
        assert_eq!(parse_dir(dir.path()).len(), 4);
    }

    #[test]
    fn churn_moves_only_service_zero_to_unused_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MeshSpec {
            services: 3,
            endpoints: 2,
            virtual_services: 0,
            destination_rules: 0,
            namespaces: 1,
            sidecar_scope: false,
        };
        write_mesh(dir.path(), &spec).unwrap();
        let read = |i| std::fs::read_to_string(service_entry_path(dir.path(), i)).unwrap();
        let (before0, before1) = (read(0), read(1));
        churn_endpoints(dir.path(), &spec, 1).unwrap();
        let after = read(0);
        assert!(!after.contains(&format!("{{address: {},", endpoint_address(0))));
        assert!(after.contains(&endpoint_address(6)) && !before0.contains(&endpoint_address(6)));
        assert_eq!(read(1), before1);
        assert_eq!(parse_dir(dir.path()).len(), 3);
    }

    #[test]
    fn each_generation_of_each_service_has_addresses_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MeshSpec {
            services: 4,
            endpoints: 3,
            virtual_services: 0,
            destination_rules: 0,
            namespaces: 1,
            sidecar_scope: false,
        };
        write_mesh(dir.path(), &spec).unwrap();
        let mut firsts = std::collections::HashSet::new();
        for generation in 0..3 {
            for i in 0..spec.services {
                if generation > 0 {
                    move_endpoints(dir.path(), &spec, i, generation).unwrap();
                }
                let text = std::fs::read_to_string(service_entry_path(dir.path(), i)).unwrap();
                let first = first_endpoint_address(&spec, i, generation);
                assert!(text.contains(&format!("{{address: {first},")), "{text}");
                assert!(firsts.insert(first));
            }
        }
        // The temporary file is renamed away: only the four ServiceEntries remain.
        assert_eq!(parse_dir(dir.path()).len(), 4);
    }

    #[test]
    fn the_reference_mesh_spreads_namespaces_and_scopes_each() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MeshSpec {
            services: 6,
            endpoints: 1,
            virtual_services: 3,
            destination_rules: 3,
            namespaces: 3,
            sidecar_scope: true,
        };
        write_mesh(dir.path(), &spec).unwrap();
        let configs = parse_dir(dir.path());
        let of = |k: ConfigKind| configs.iter().filter(move |c| c.kind == k);
        let sidecars: Vec<_> = of(ConfigKind::Sidecar).map(|c| c.meta.namespace.clone()).collect();
        assert_eq!(sidecars.len(), 3);
        for ns in ["load-0", "load-1", "load-2"] {
            assert!(sidecars.iter().any(|s| s == ns), "{sidecars:?}");
        }
        let entries: Vec<_> = of(ConfigKind::ServiceEntry).collect();
        assert_eq!(entries.len(), 6);
        assert!(entries.iter().all(|c| c.meta.namespace.starts_with("load-")));
        assert_eq!(spec.service_host(4), "svc-4.load-1.svc.cluster.local");
        let vs = std::fs::read_to_string(virtual_service_path(dir.path(), 2)).unwrap();
        assert!(vs.contains("namespace: load-2") && vs.contains("svc-2.load-2.svc.cluster.local"));
        assert!(spec.sees(4, 1) && spec.sees(0, 3) && !spec.sees(0, 1));
        assert!(
            MeshSpec {
                sidecar_scope: false,
                ..spec
            }
            .sees(0, 1)
        );
        assert_eq!(spec.proxy_namespace(5), "load-2");
    }

    #[test]
    fn node_ids_are_distinct_sidecars() {
        assert_eq!(
            sidecar_node_id(NAMESPACE, 0),
            "sidecar~10.0.0.1~pod-0.load~load.svc.cluster.local"
        );
        assert_eq!(
            sidecar_node_id(NAMESPACE, 251),
            "sidecar~10.0.1.2~pod-251.load~load.svc.cluster.local"
        );
        assert_ne!(endpoint_address(0), endpoint_address(65536));
    }
}
