//! Compiles Istio's own gRPC APIs (`proto/`) with protox (no system protoc) and tonic-prost-build,
//! reusing envoy-types' well-known types; the gRPC client and server only with the `grpc` feature.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let files = ["istio/ca/ca.proto", "istio/nds/nds.proto"];
    let fds = match protox::compile(files, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("istio-api build: compiling {files:?}: {e}"),
    };
    // the `grpc` feature: the services too (cargo sets CARGO_FEATURE_GRPC for build scripts)
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    if let Err(e) = tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_well_known_types(true)
        // the name table's map in a stable order, so equal tables encode to equal bytes
        .btree_map(".")
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_fds(fds)
    {
        panic!("istio-api build: generating Rust: {e}");
    }
}
