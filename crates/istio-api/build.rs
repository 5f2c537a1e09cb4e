//! Compiles Istio's own gRPC APIs (`proto/`) with protox (no system protoc) and tonic-prost-build,
//! reusing envoy-types' well-known types.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let files = ["istio/ca/ca.proto", "istio/nds/nds.proto"];
    let fds = match protox::compile(files, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("istio-api build: compiling {files:?}: {e}"),
    };
    if let Err(e) = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_well_known_types(true)
        // the name table's map in a stable order, so equal tables encode to equal bytes
        .btree_map(".")
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_fds(fds)
    {
        panic!("istio-api build: generating Rust: {e}");
    }
}
