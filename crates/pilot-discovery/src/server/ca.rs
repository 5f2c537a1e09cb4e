//! Where the mesh CA is served (istiod's `startCA`).

use std::net::SocketAddr;

use model::MeshConfig;
use prometheus_client::registry::Registry;

use crate::ca_server::{CaTransport, MeshCaServer};
use crate::settings::Settings;

/// The mesh CA, where istiod's `startCA` puts it: on the secure gRPC server when there is one
/// (with istiod's serving certificate), else on the plaintext one (the second value), where only
/// bearer tokens authenticate callers. Neither when no gRPC port is served.
pub(super) async fn init_ca(
    (grpc_addr, secure_grpc_addr): (Option<SocketAddr>, Option<SocketAddr>),
    mesh: &MeshConfig,
    settings: &Settings,
    registry: &mut Registry,
    client: &Option<kube::Client>,
    tls_source: crate::serving_cert::Source,
) -> anyhow::Result<(Option<crate::secure::SecureGrpc>, Option<MeshCaServer>)> {
    let env = |k: &str| std::env::var(k).ok();
    match (secure_grpc_addr, grpc_addr) {
        (Some(addr), _) => Ok((
            Some(
                crate::secure::SecureGrpc::init(
                    addr,
                    mesh,
                    &settings.pod_namespace,
                    env,
                    registry,
                    client.clone(),
                    tls_source,
                )
                .await?,
            ),
            None,
        )),
        (None, Some(addr)) => {
            let served_on = format!("--grpcAddr {addr} (plaintext: --secureGrpcAddr is empty)");
            let ca = MeshCaServer::init(
                CaTransport::Plaintext,
                &served_on,
                mesh,
                &settings.pod_namespace,
                env,
                registry,
                client.clone(),
            )
            .await?;
            Ok((None, Some(ca)))
        }
        (None, None) => Ok((None, None)),
    }
}
