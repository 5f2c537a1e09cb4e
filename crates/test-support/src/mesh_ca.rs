//! A mesh with workload identities for tests: pilot-discovery's CA on a secure port (or, without
//! one, on the plaintext port 15010) with a root kept in a directory, tokens checked by
//! `JWT_RULE` from a test issuer, and what an agent needs to get its certificate (the CA address,
//! the mesh root, a service account token).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use security::testing::TestIssuer;
use serde_json::json;

use crate::agent::AgentOptions;
use crate::discovery::DiscoveryOptions;
use crate::netns::WorkloadIdentity;

pub struct MeshCa {
    pub issuer: TestIssuer,
    /// `ROOT_CA_DIR`.
    pub dir: tempfile::TempDir,
    /// pilot-discovery's secure port (CA and xDS), or its plaintext port 15010 without one.
    pub addr: SocketAddr,
    /// The CA is on the plaintext port (`--secureGrpcAddr ""`), as istiod without a secure port.
    pub plaintext: bool,
}

impl MeshCa {
    /// A CA to be served on a free port of `ip` (127.0.0.1 for loopback tests).
    pub fn new(ip: impl Into<IpAddr>) -> anyhow::Result<MeshCa> {
        Ok(MeshCa {
            issuer: TestIssuer::new("https://kubernetes.default.svc", "k1"),
            dir: tempfile::tempdir()?,
            addr: SocketAddr::new(ip.into(), crate::ports::free_port()),
            plaintext: false,
        })
    }

    /// A CA served, without a secure port, on the plaintext port 15010 of `ip` (where agents
    /// reach a CA without TLS, as Istio's): what a user runs without TLS.
    pub fn plaintext(ip: impl Into<IpAddr>) -> anyhow::Result<MeshCa> {
        Ok(MeshCa {
            addr: SocketAddr::new(ip.into(), 15010),
            plaintext: true,
            ..Self::new(Ipv4Addr::LOCALHOST)?
        })
    }

    pub fn loopback() -> anyhow::Result<MeshCa> {
        Self::new(Ipv4Addr::LOCALHOST)
    }

    /// `opts` with the secure port (or the plaintext port 15010), `ROOT_CA_DIR` and `JWT_RULE`
    /// added.
    pub fn serve(&self, mut opts: DiscoveryOptions) -> DiscoveryOptions {
        if self.plaintext {
            opts.grpc_ip = Some(self.addr.ip());
            opts.grpc_port = Some(self.addr.port());
        } else {
            opts.args.extend(["--secureGrpcAddr".into(), self.addr.to_string()]);
        }
        opts.env
            .push(("ROOT_CA_DIR".into(), self.dir.path().display().to_string()));
        opts.env.push((
            "JWT_RULE".into(),
            json!({"issuer": self.issuer.issuer, "jwks": self.issuer.jwks()}).to_string(),
        ));
        opts
    }

    /// The mesh root (once pilot-discovery has started).
    pub fn root_cert(&self) -> PathBuf {
        self.dir.path().join("root-cert.pem")
    }

    /// A token of `ns/sa` for the CA.
    pub fn token(&self, ns: &str, sa: &str) -> String {
        self.issuer.token(ns, sa, &["istio-ca"], 3600)
    }

    /// What a pod's agent needs (service account `default` of `ns`).
    pub fn workload_identity(&self, ns: &str) -> anyhow::Result<WorkloadIdentity> {
        Ok(WorkloadIdentity {
            ca: self.addr,
            root_pem: std::fs::read_to_string(self.root_cert())?,
            token: self.token(ns, "default"),
        })
    }

    /// `opts` for an agent that gets its certificate from this CA: `CA_ADDR`, the root as
    /// `XDS_ROOT_CA`, and its namespace's `default` token where Istio mounts it.
    pub fn agent(&self, mut opts: AgentOptions) -> AgentOptions {
        opts.env.push(("CA_ADDR".into(), self.addr.to_string()));
        opts.env
            .push(("XDS_ROOT_CA".into(), self.root_cert().display().to_string()));
        opts.files.push((
            "var/run/secrets/tokens/istio-token".into(),
            self.token(&opts.namespace, "default"),
        ));
        opts
    }
}
