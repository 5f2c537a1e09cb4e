//! Target `sds_request`: pilot-agent's SDS server (`agent::sds::SdsServer`, Istio's
//! `security/pkg/nodeagent/sds`) on its real Unix socket, with certificates mounted in
//! `./etc/certs` (no CA): one `StreamSecrets`, `FetchSecrets` or `DeltaSecrets` call whose body
//! is the input's, as Envoy (or anything that reaches the socket) sends it. The call must end
//! once its client's side has ended, and every secret sent must be one that was asked for.
//!
//! Input: `[mode]` then chunks (`input::chunks`). Mode bits 0-1: 0 or 3 `StreamSecrets`, 1
//! `FetchSecrets`, 2 `DeltaSecrets`; bit 2: the chunks are the raw request body (each a data
//! frame), not `DiscoveryRequest`s to frame. In requests, `{certs}` in a resource name stands for
//! the mounted certificate directory (so `file-root:{certs}/root-cert.pem` names a real file).

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::{Channel, Endpoint};
use xds_api::envoy::extensions::transport_sockets::tls::v3::Secret;
use xds_api::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use agent::config::{SecretConfig, WorkloadKey};
use agent::sds::{SdsServer, SecretManager};

use crate::input::chunks;
use crate::xds::grpc_frame;

const STREAM: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
const FETCH: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";
const DELTA: &str = "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets";
const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const IDENTITY: &str = "spiffe://cluster.local/ns/default/sa/reviews";

/// Longest a call may take to end once its client has sent everything.
const END_WITHIN: Duration = Duration::from_secs(10);

/// Empty DATA frames h2 (0.4's `proto::MAX_RECV_EMPTY_DATA_FRAMES`) takes on one connection;
/// one more and it sends GOAWAY (`ENHANCE_YOUR_CALM`, "too_many_data_frames") and closes it. An
/// empty frame carries nothing to the SDS server, so a body of more is the library's
/// flood defence at work, not the server's doing; `h2_closes_a_connection_after_this_many_empty_frames`
/// pins the figure.
const H2_MAX_RECV_EMPTY_DATA_FRAMES: usize = 100;

struct Harness {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    socket: PathBuf,
    certs: PathBuf,
    _server: SdsServer,
    _dir: tempfile::TempDir,
    /// SIGPIPE handled (and ignored): under libFuzzer, whose `main` is not Rust's, a write to a
    /// connection the server closed would otherwise kill the process, which pilot-agent's Rust
    /// `main` never lets happen.
    _sigpipe: tokio::signal::unix::Signal,
}

/// A self-signed workload certificate for [`IDENTITY`], its key and the same as root, in Istio's
/// `./etc/certs` layout.
fn write_certs(dir: &std::path::Path) {
    let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
    let mut params = rcgen::CertificateParams::default();
    let uri = IDENTITY.to_owned().try_into().unwrap_or_else(|e| panic!("{e}"));
    params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
    let cert = params
        .self_signed(&key)
        .unwrap_or_else(|e| panic!("certificate: {e}"))
        .pem();
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    for (file, pem) in [
        ("cert-chain.pem", cert.clone()),
        ("key.pem", key.serialize_pem()),
        ("root-cert.pem", cert),
    ] {
        std::fs::write(dir.join(file), pem).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = crate::harness_runtime();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let certs = dir.path().join("etc/certs");
        write_certs(&certs);
        let (server, channel, socket, sigpipe) = rt.block_on(async {
            let sigpipe = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::pipe())
                .unwrap_or_else(|e| panic!("handling SIGPIPE: {e}"));
            let config = SecretConfig {
                ttl: Duration::from_secs(3600),
                grace_period_ratio: 0.5,
                grace_period_ratio_jitter: 0.01,
                key: WorkloadKey::EcdsaP256,
            };
            let secrets = SecretManager::new(IDENTITY.into(), None, config, certs.clone());
            let socket = dir.path().join("SDS");
            let server = SdsServer::start(&socket, secrets).unwrap_or_else(|e| panic!("SDS server: {e}"));
            let channel = connect(&socket).await;
            (server, channel, socket, sigpipe)
        });
        Harness {
            rt,
            channel,
            socket,
            certs,
            _server: server,
            _dir: dir,
            _sigpipe: sigpipe,
        }
    })
}

pub fn sds_request(data: &[u8]) {
    exchange(data);
}

/// Runs the call; returns how many responses came back.
pub(crate) fn exchange(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let h = harness();
    let raw = mode & 4 != 0;
    let certs = h.certs.display().to_string();
    // the names asked, when the body is requests (a secret sent must be one of them)
    let mut asked: Vec<String> = Vec::new();
    let frames: Vec<Bytes> = chunks(rest)
        .iter()
        .map(|c| {
            if raw {
                return Bytes::copy_from_slice(c.bytes);
            }
            match DiscoveryRequest::decode(c.bytes) {
                Ok(mut req) => {
                    for name in &mut req.resource_names {
                        *name = name.replace("{certs}", &certs);
                    }
                    asked.extend(req.resource_names.iter().cloned());
                    grpc_frame(&req.encode_to_vec())
                }
                // tonic, not the server, refuses what does not decode: sent as it is
                Err(_) => grpc_frame(c.bytes),
            }
        })
        .collect();
    let path = match mode & 3 {
        1 => FETCH,
        2 => DELTA,
        _ => STREAM,
    };
    h.rt.block_on(async {
        let body = match call(h.channel.clone(), path, frames.clone()).await {
            Ok(body) => body,
            // The server may close a connection that many earlier calls used (h2's limits on
            // streams reset by either side, as any HTTP/2 server has): one input is then
            // judged again alone, on a connection of its own. Only a failure there is a finding.
            Err(first) => {
                eprintln!("sds_request: the server closed a connection earlier calls used ({first}); this input again on a new one");
                let empty = frames.iter().filter(|f| f.is_empty()).count();
                let fresh = connect(&h.socket).await;
                match call(fresh, path, frames).await {
                    Ok(body) => body,
                    Err(again) if empty > H2_MAX_RECV_EMPTY_DATA_FRAMES => {
                        eprintln!("sds_request: {empty} empty DATA frames closed a fresh connection ({again}), as h2 does past {H2_MAX_RECV_EMPTY_DATA_FRAMES}");
                        return 0;
                    }
                    Err(again) => panic!(
                        "the SDS server dropped a fresh connection ({again}) after dropping a used one ({first})"
                    ),
                }
            }
        };
        responses(body, path, &asked, raw)
    })
}

/// One call of `path` whose request body is `frames`: the response body, or why the connection
/// failed. Panics when the call does not end within [`END_WITHIN`].
async fn call(mut channel: Channel, path: &str, frames: Vec<Bytes>) -> Result<BytesMut, String> {
    let body = Body::new(StreamBody::new(futures::stream::iter(
        frames.into_iter().map(|b| Ok::<_, Infallible>(Frame::data(b))),
    )));
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://sds{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap_or_else(|e| panic!("request: {e}"));
    tokio::time::timeout(END_WITHIN, async {
        futures::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .map_err(|e| error_chain(&e))?;
        let resp = channel.call(req).await.map_err(|e| error_chain(&e))?;
        let mut body = resp.into_body().into_data_stream();
        let mut bytes = BytesMut::new();
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => bytes.extend_from_slice(&c),
                Err(_) => break,
            }
        }
        Ok(bytes)
    })
    .await
    .unwrap_or_else(|_| panic!("the call did not end within {END_WITHIN:?} of its client's last request"))
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut chain = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    chain
}

/// A new connection to the SDS socket.
async fn connect(socket: &std::path::Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to the SDS socket: {}", error_chain(&e)))
}

/// Checks the response messages of the body; returns how many there were.
fn responses(mut body: BytesMut, path: &str, asked: &[String], raw: bool) -> usize {
    let mut n = 0;
    while body.len() >= 5 {
        let compressed = body.get_u8();
        let len = body.get_u32() as usize;
        assert_eq!(compressed, 0, "the server compresses nothing");
        assert!(body.len() >= len, "a response frame cut short");
        let message = body.split_to(len);
        if path == DELTA {
            panic!("DeltaSecrets is refused, yet sent a message");
        }
        let resp = DiscoveryResponse::decode(message.freeze())
            .unwrap_or_else(|e| panic!("a response that does not decode: {e}"));
        assert_eq!(resp.type_url, SECRET_TYPE, "{resp:?}");
        for any in &resp.resources {
            assert_eq!(any.type_url, SECRET_TYPE);
            let secret = Secret::decode(any.value.as_slice()).unwrap_or_else(|e| panic!("a Secret: {e}"));
            assert!(secret.r#type.is_some(), "{secret:?}");
            if !raw {
                assert!(asked.contains(&secret.name), "{:?} was not asked for", secret.name);
            }
        }
        n += 1;
    }
    assert!(body.is_empty(), "{} bytes after the last response frame", body.len());
    n
}

/// What Envoy asks: the workload certificate and root, ACKs and NACKs, file secrets, a name not
/// served, the unary and delta calls.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    use crate::input::join;
    use xds_api::envoy_types::pb::google::rpc::Status as RpcStatus;
    let req = |names: &[&str], version: &str, nonce: &str, nack: Option<&str>| -> Vec<u8> {
        DiscoveryRequest {
            type_url: SECRET_TYPE.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            error_detail: nack.map(|m| RpcStatus {
                code: 3,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        }
        .encode_to_vec()
    };
    vec![
        // Envoy's workload certificate, then its ACK
        [
            vec![0],
            join(&[
                (0, req(&["default"], "", "", None)),
                (0, req(&["default"], "1", "1", None)),
            ]),
        ]
        .concat(),
        // the root, a NACK, then both
        [
            vec![0],
            join(&[
                (0, req(&["ROOTCA"], "", "", None)),
                (0, req(&["ROOTCA"], "", "1", Some("bad root"))),
                (0, req(&["default", "ROOTCA"], "1", "1", None)),
            ]),
        ]
        .concat(),
        // file secrets, a missing file and a name not served
        [
            vec![0],
            join(&[
                (0, req(&["file-root:{certs}/root-cert.pem"], "", "", None)),
                (
                    0,
                    req(&["file-cert:{certs}/cert-chain.pem~{certs}/key.pem"], "", "", None),
                ),
                (0, req(&["file-root:{certs}/missing.pem", "other"], "", "", None)),
            ]),
        ]
        .concat(),
        // FetchSecrets and DeltaSecrets
        [vec![1], join(&[(0, req(&["default", "ROOTCA"], "", "", None))])].concat(),
        [vec![2], join(&[(0, req(&["default"], "", "", None))])].concat(),
        // a raw body: a frame cut short
        [vec![4], join(&[(0, vec![0, 0, 0, 0, 9, 10, 7])])].concat(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` empty DATA frames then a request for the workload certificate, on a new connection.
    fn after_empty_frames(n: usize) -> Result<usize, String> {
        let h = harness();
        let request = DiscoveryRequest {
            type_url: SECRET_TYPE.into(),
            resource_names: vec!["default".into()],
            ..Default::default()
        };
        let mut frames = vec![Bytes::new(); n];
        frames.push(grpc_frame(&request.encode_to_vec()));
        h.rt.block_on(async {
            let fresh = connect(&h.socket).await;
            let body = call(fresh, STREAM, frames).await?;
            Ok(responses(body, STREAM, &["default".to_owned()], false))
        })
    }

    /// The reading the harness relies on: h2 closes a connection past
    /// [`H2_MAX_RECV_EMPTY_DATA_FRAMES`] empty DATA frames, and only that connection: up to the
    /// limit the call is served, and the server serves the next connection.
    #[test]
    fn h2_closes_a_connection_after_this_many_empty_frames() {
        assert_eq!(after_empty_frames(H2_MAX_RECV_EMPTY_DATA_FRAMES), Ok(1));
        let flood = after_empty_frames(H2_MAX_RECV_EMPTY_DATA_FRAMES + 1);
        assert!(flood.is_err(), "{flood:?}");
        assert_eq!(after_empty_frames(0), Ok(1));
    }
}
