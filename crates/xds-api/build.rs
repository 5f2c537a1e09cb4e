//! Compiles the Envoy protos that pilot emits into a `FileDescriptorSet` (`envoy_descriptor.bin` in
//! `OUT_DIR`), so `xds_api::json` can render them as proto3 JSON at run time. The `.proto` sources
//! come from the `envoy-types` crate that the prost structs were generated from; `protox` compiles
//! them, so no system `protoc` is needed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Files whose messages (and everything they import) go into the pool. A type that pilot packs into
/// an `Any` must be reachable from here, or `any_to_json` reports it as unknown.
///
/// Order matters: protox resolves a relative type name against every file compiled so far, not
/// only the file's imports as protoc does, so `local_rate_limit.proto`'s `common.ratelimit.v3.X`
/// must be compiled before any file declares the package `envoy.extensions.filters.common`.
const ROOTS: &[&str] = &[
    "envoy/extensions/filters/http/local_ratelimit/v3/local_rate_limit.proto",
    // xDS resources and discovery.
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/extensions/network/dns_resolver/cares/v3/cares_dns_resolver.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
    "envoy/extensions/transport_sockets/tls/v3/secret.proto",
    "envoy/service/discovery/v3/discovery.proto",
    "envoy/config/bootstrap/v3/bootstrap.proto",
    "envoy/admin/v3/config_dump.proto",
    // Network filters.
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
    "envoy/extensions/filters/network/rbac/v3/rbac.proto",
    "envoy/extensions/filters/network/connection_limit/v3/connection_limit.proto",
    "envoy/extensions/filters/network/ext_authz/v3/ext_authz.proto",
    // HTTP filters.
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/http/fault/v3/fault.proto",
    "envoy/extensions/filters/http/cors/v3/cors.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/filters/http/grpc_web/v3/grpc_web.proto",
    "envoy/extensions/filters/http/grpc_stats/v3/config.proto",
    "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
    "envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto",
    "envoy/extensions/filters/http/compressor/v3/compressor.proto",
    "envoy/extensions/filters/http/header_to_metadata/v3/header_to_metadata.proto",
    "envoy/extensions/filters/http/stateful_session/v3/stateful_session.proto",
    // RBAC path templates (AuthorizationPolicy `{*}` / `{**}`).
    "envoy/extensions/path/match/uri_template/v3/uri_template_match.proto",
    // Listener filters.
    "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
    "envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
    "envoy/extensions/filters/listener/http_inspector/v3/http_inspector.proto",
    "envoy/extensions/filters/listener/proxy_protocol/v3/proxy_protocol.proto",
    // Upstreams, transport sockets, load balancing, retries.
    "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
    "envoy/extensions/upstreams/tcp/v3/tcp_protocol_options.proto",
    "envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto",
    "envoy/extensions/transport_sockets/internal_upstream/v3/internal_upstream.proto",
    "envoy/extensions/load_balancing_policies/round_robin/v3/round_robin.proto",
    "envoy/extensions/load_balancing_policies/least_request/v3/least_request.proto",
    "envoy/extensions/load_balancing_policies/ring_hash/v3/ring_hash.proto",
    "envoy/extensions/load_balancing_policies/maglev/v3/maglev.proto",
    "envoy/extensions/retry/host/previous_hosts/v3/previous_hosts.proto",
    "envoy/extensions/http/header_formatters/preserve_case/v3/preserve_case.proto",
    // Access logs.
    "envoy/extensions/access_loggers/file/v3/file.proto",
    "envoy/extensions/access_loggers/stream/v3/stream.proto",
    "envoy/extensions/access_loggers/grpc/v3/als.proto",
];

/// Include directories under envoy-types' `proto/`, as its own build uses them.
const INCLUDES: &[&str] = &[
    "data-plane-api",
    "xds",
    "googleapis",
    "protoc-gen-validate",
    "cel-spec/proto",
    "opentelemetry-proto",
    "client_model",
    "ratelimit",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ENVOY_TYPES_PROTO_DIR");
    let proto_dir = match env::var_os("ENVOY_TYPES_PROTO_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => registry_envoy_types_dir()
            .or_else(|| envoy_types_dir().ok())
            .unwrap_or_else(|| fail("envoy-types not found in the cargo registry nor through cargo metadata"))
            .join("proto"),
    };
    let includes: Vec<PathBuf> = INCLUDES
        .iter()
        .map(|i| proto_dir.join(i))
        .filter(|p| p.is_dir())
        .collect();
    if includes.is_empty() {
        fail(&format!("no proto include directories under {}", proto_dir.display()));
    }
    let mut compiler = protox::Compiler::new(&includes).unwrap_or_else(|e| fail(&e.to_string()));
    compiler.include_imports(true).include_source_info(false);
    for root in ROOTS {
        if let Err(e) = compiler.open_file(root) {
            fail(&format!("compiling {root} from {}: {e}", proto_dir.display()));
        }
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_else(|| fail("OUT_DIR is not set")));
    let path = out.join("envoy_descriptor.bin");
    if let Err(e) = std::fs::write(&path, compiler.encode_file_descriptor_set()) {
        fail(&format!("writing {}: {e}", path.display()));
    }
}

/// envoy-types' sources in the cargo registry (`$CARGO_HOME/registry/src/*/envoy-types-<v>`), at
/// the version the workspace's Cargo.lock pins. Cargo has unpacked them before running this script.
fn registry_envoy_types_dir() -> Option<PathBuf> {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?);
    let lock = manifest_dir
        .ancestors()
        .map(|d| d.join("Cargo.lock"))
        .find(|p| p.is_file())?;
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    let version = loop {
        if lines.next()? == "name = \"envoy-types\"" {
            let v = lines.next()?.strip_prefix("version = \"")?.strip_suffix('"')?;
            break v.to_owned();
        }
    };
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let src = cargo_home.join("registry").join("src");
    std::fs::read_dir(src)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(format!("envoy-types-{version}")))
        .find(|d| d.join("proto").is_dir())
}

fn fail(msg: &str) -> ! {
    panic!("xds-api build: {msg} (hint: set ENVOY_TYPES_PROTO_DIR to envoy-types' proto/ directory)");
}

/// Finds the envoy-types package that this crate depends on, through `cargo metadata --offline`,
/// and returns its directory.
fn envoy_types_dir() -> Result<PathBuf, String> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?);
    // Only this platform's packages: on a fresh machine cargo has downloaded just those.
    let target = env::var("TARGET").map_err(|_| "TARGET is not set")?;
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &target,
            "--manifest-path",
        ])
        .arg(manifest_dir.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("parsing cargo metadata: {e}"))?;
    let packages = meta["packages"].as_array().ok_or("cargo metadata has no packages")?;
    let manifest_path = |id: &str| {
        packages
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["manifest_path"].as_str())
            .map(PathBuf::from)
    };
    // This crate's own id, then its resolved dependency named envoy_types.
    let own_manifest = manifest_dir.join("Cargo.toml");
    let own_id = packages
        .iter()
        .find(|p| p["manifest_path"].as_str().map(Path::new) == Some(own_manifest.as_path()))
        .and_then(|p| p["id"].as_str())
        .ok_or("this crate is not in cargo metadata")?;
    let nodes = meta["resolve"]["nodes"]
        .as_array()
        .ok_or("cargo metadata has no resolve graph")?;
    let envoy_types_id = nodes
        .iter()
        .find(|n| n["id"] == own_id)
        .and_then(|n| n["deps"].as_array())
        .and_then(|deps| deps.iter().find(|d| d["name"] == "envoy_types"))
        .and_then(|d| d["pkg"].as_str())
        .ok_or("envoy-types is not a resolved dependency of xds-api")?;
    let manifest = manifest_path(envoy_types_id).ok_or("envoy-types has no manifest path")?;
    manifest
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "envoy-types manifest has no parent".to_string())
}
