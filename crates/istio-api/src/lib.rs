//! Istio's own gRPC APIs, beside Envoy's (`xds-api`): the CA's `IstioCertificateService`
//! (`istio.v1.auth`), which pilot-discovery serves and pilot-agent calls, and the DNS name table
//! (`istio.networking.nds.v1`) pilot-discovery sends the agent over NDS. The CA's gRPC client and
//! server come with the `grpc` feature; the messages are always here.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

/// `istio.v1.auth`: `IstioCertificateService/CreateCertificate`.
pub mod ca {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.rs"));
}

/// `istio.networking.nds.v1`: the NDS `NameTable`.
pub mod nds {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/istio.networking.nds.v1.rs"));

    impl prost::Name for NameTable {
        const NAME: &'static str = "NameTable";
        const PACKAGE: &'static str = "istio.networking.nds.v1";

        fn full_name() -> String {
            "istio.networking.nds.v1.NameTable".into()
        }

        fn type_url() -> String {
            "type.googleapis.com/istio.networking.nds.v1.NameTable".into()
        }
    }
}
