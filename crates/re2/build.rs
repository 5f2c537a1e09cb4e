//! Compiles the C++ shim against the system's RE2 (Debian's `libre2-dev`) and links it.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.cc");
    let header = ["/usr/include/re2/re2.h", "/usr/local/include/re2/re2.h"];
    if !header.iter().any(|h| Path::new(h).exists()) {
        println!(
            "cargo:warning=RE2's headers are missing (re2/re2.h): install Debian's libre2-dev, e.g. \
             with scripts/install-build-deps.sh"
        );
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .file("src/shim.cc")
        .compile("pilot_re2_shim");
    println!("cargo:rustc-link-lib=dylib=re2");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
