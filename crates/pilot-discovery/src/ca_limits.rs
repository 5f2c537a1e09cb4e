//! The CA's request size limit as istiod's: grpc-go refuses a message over the server's
//! `MaxRecvMsgSize` (`ISTIO_GPRC_MAXRECVMSGSIZE`, 4 MiB) with `RESOURCE_EXHAUSTED` ("grpc: received
//! message larger than max (N vs. M)"); tonic's decoder says `OUT_OF_RANGE` for the same. Clients
//! and dashboards that look for istiod's code see it here too.
//!
//! The refusal is made by tonic before the CA's handler runs; it is counted in
//! `citadel_server_csr_too_large_count` (the CA's other `citadel_server_*` counters see none of it,
//! as istiod's).

use std::convert::Infallible;
use std::task::{Context, Poll};

use istio_api::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use security::CaService;
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderValue};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

/// What tonic's decoder says of a request over the limit.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// The limit, `ISTIO_GPRC_MAXRECVMSGSIZE`, and the count of requests over it.
#[derive(Clone, Debug)]
pub struct RequestLimit {
    pub max_recv_msg_size: usize,
    too_large: Counter,
}

impl RequestLimit {
    pub fn register(max_recv_msg_size: usize, registry: &mut Registry) -> RequestLimit {
        let too_large = Counter::default();
        registry.register(
            "citadel_server_csr_too_large_count",
            "The number of CSR requests refused for being over ISTIO_GPRC_MAXRECVMSGSIZE.",
            too_large.clone(),
        );
        RequestLimit {
            max_recv_msg_size,
            too_large,
        }
    }
}

/// The CA's gRPC service with istiod's request size limit and status code.
#[derive(Clone)]
pub struct LimitedCa {
    inner: IstioCertificateServiceServer<CaService>,
    too_large: Counter,
}

impl LimitedCa {
    pub fn new(service: CaService, limit: RequestLimit) -> LimitedCa {
        LimitedCa {
            inner: service.into_server().max_decoding_message_size(limit.max_recv_msg_size),
            too_large: limit.too_large,
        }
    }
}

impl Service<http::Request<Body>> for LimitedCa {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answered = self.inner.call(request);
        let too_large = self.too_large.clone();
        Box::pin(async move {
            use http_body_util::BodyExt;
            let mut response = answered.await?;
            // Trailers-only (the status in the headers), or in the trailers after the headers.
            if as_istiod(response.headers_mut()) {
                too_large.inc();
            }
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        if as_istiod(&mut trailers) {
                            too_large.inc();
                        }
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                }))
            }))
        })
    }
}

impl NamedService for LimitedCa {
    const NAME: &'static str = <IstioCertificateServiceServer<CaService> as NamedService>::NAME;
}

/// Rewrites tonic's "too large" status (in the headers or trailers) as grpc-go's; true if it was one.
fn as_istiod(headers: &mut http::HeaderMap) -> bool {
    let out_of_range = headers.get("grpc-status").is_some_and(|s| s == "11");
    let Some(message) = headers.get("grpc-message").map(|m| percent_decode(m.as_bytes())) else {
        return false;
    };
    let Some(sizes) = message.strip_prefix(TONIC_TOO_LARGE).filter(|_| out_of_range) else {
        return false;
    };
    // "<len> bytes, the limit is: <limit> bytes", percent-encoded as grpc-message is.
    let numbers: Vec<&str> = sizes
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let grpc_go = match numbers.as_slice() {
        [len, limit] => format!("grpc: received message larger than max ({len} vs. {limit})"),
        _ => "grpc: received message larger than max".to_owned(),
    };
    headers.insert("grpc-status", HeaderValue::from_static("8"));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(&grpc_go)) {
        headers.insert("grpc-message", v);
    }
    true
}

/// grpc-message as sent (tonic encodes spaces too).
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// gRPC's grpc-message encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_out_of_range_becomes_grpc_gos_resource_exhausted() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("11"));
        headers.insert(
            "grpc-message",
            // As tonic sends it.
            HeaderValue::from_static(
                "Error,%20decoded%20message%20length%20too%20large:%20found%205242893%20bytes,%20the%20limit%20is:%204194304%20bytes",
            ),
        );
        assert!(as_istiod(&mut headers));
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "grpc: received message larger than max (5242893 vs. 4194304)"
        );
    }

    #[test]
    fn other_answers_are_left_alone() {
        for (status, message) in [
            ("11", "some other range"),
            (
                "16",
                "Error, decoded message length too large: found 1 bytes, the limit is: 0 bytes",
            ),
            ("0", ""),
        ] {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-status", HeaderValue::from_static(status));
            headers.insert("grpc-message", HeaderValue::from_static(message));
            assert!(!as_istiod(&mut headers), "{status} {message}");
            assert_eq!(headers["grpc-status"], status);
        }
    }
}
