//! gRPC's framing over the HTTP/2 bodies of an ADS stream, written against the bodies rather than
//! tonic's codec, for memory: the request body read as length-prefixed messages ([`Requests`]),
//! and the response body made of the frames of each message ([`Frames`], through
//! [`grpc_response`]), then the trailers that carry the stream's status (grpc-go's `transport`
//! and `encoding` parts that istiod's streams run on).
//!
//! tonic's `Streaming` keeps the capacity of the largest request it saw; here no buffer outlives the
//! message it held. tonic's generated service encodes every response into a per-stream buffer
//! that keeps the allocation of the last message alive while the stream is idle (about one full
//! push per connected proxy: 1 MB at 1,000 services; 2.2 GB for 2,000 proxies); here each
//! response is framed into chunks of its own as HTTP/2 asks for them (`response.rs`), freed once
//! HTTP/2 has written them, its large resources the push's shared bytes.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use http_body::Frame;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;

use crate::outbound::ResponseStream;
use crate::request::SotwRequest;
use crate::response::{Cursor, Framed, HEADER_SIZE};

/// The request side of a stream: length-prefixed messages decoded from the body's data frames.
/// Unlike tonic's `Streaming`, whose buffer keeps the capacity of the largest request it saw (an
/// EDS request naming 1,200 clusters is 60 KB, kept per proxy), the buffer is let go whenever it
/// has been read to the end. Memory grows only as bytes arrive, whatever length a header
/// declares, and a request over `max` bytes (`ISTIO_GPRC_MAXRECVMSGSIZE`) ends the stream.
pub(crate) struct Requests<T> {
    body: Body,
    buf: bytes::BytesMut,
    ended: bool,
    max: usize,
    _message: std::marker::PhantomData<fn() -> T>,
}

/// Why the request side of a stream ended with an error.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The client sent something that cannot be read: the stream ends with this status.
    Invalid { status: Status, reason: &'static str },
    /// The transport failed (reset, connection closed): nobody to tell.
    Transport(Status),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Invalid { status, .. } | RequestError::Transport(status) => f.write_str(status.message()),
        }
    }
}

impl<T> Requests<T> {
    pub(crate) fn new(body: Body, max: usize) -> Requests<T> {
        Requests {
            body,
            buf: bytes::BytesMut::new(),
            ended: false,
            max,
            _message: std::marker::PhantomData,
        }
    }
}

fn invalid(status: Status, reason: &'static str) -> RequestError {
    RequestError::Invalid { status, reason }
}

/// A request message read from its bytes: prost's messages as prost decodes them, and the state
/// of the world's [`SotwRequest`], which keeps its names in them.
pub(crate) trait Decode: Sized {
    fn decode_request(buf: Bytes) -> Result<Self, String>;
}

impl<T: Message + Default> Decode for T {
    fn decode_request(buf: Bytes) -> Result<T, String> {
        T::decode(buf).map_err(|e| e.to_string())
    }
}

impl Decode for SotwRequest {
    fn decode_request(buf: Bytes) -> Result<Self, String> {
        SotwRequest::decode(buf)
    }
}

impl<T: Decode> Requests<T> {
    /// The next whole message in the buffer, if there is one.
    fn next_message(&mut self) -> Result<Option<T>, RequestError> {
        if self.buf.len() < HEADER_SIZE {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(invalid(
                Status::unimplemented("compressed requests are not supported"),
                "compressed",
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max {
            let max = self.max;
            return Err(invalid(
                Status::resource_exhausted(format!(
                    "request of {len} bytes is over the limit of {max} bytes (ISTIO_GPRC_MAXRECVMSGSIZE)"
                )),
                "too_large",
            ));
        }
        if self.buf.len() < HEADER_SIZE + len {
            return Ok(None);
        }
        let mut message = self.buf.split_to(HEADER_SIZE + len);
        if self.buf.is_empty() {
            self.buf = bytes::BytesMut::new();
        }
        message.advance(HEADER_SIZE);
        T::decode_request(message.freeze())
            .map(Some)
            .map_err(|e| invalid(Status::invalid_argument(format!("malformed request: {e}")), "malformed"))
    }
}

impl<T: Decode> Stream for Requests<T> {
    type Item = Result<T, RequestError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use http_body::Body as _;
        loop {
            match self.next_message() {
                Ok(Some(m)) => return Poll::Ready(Some(Ok(m))),
                Ok(None) => {}
                Err(status) => {
                    self.ended = true;
                    self.buf = bytes::BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.ended = true,
                Poll::Ready(Some(Err(status))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(RequestError::Transport(status))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// A streaming gRPC response whose messages come from `rx`.
pub(crate) fn grpc_response<R: Framed>(rx: ResponseStream<R>) -> http::Response<Body> {
    let body = http_body_util::StreamBody::new(Frames {
        rx,
        framing: None,
        done: false,
    });
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The response body: the data frames of each message (`Framed::next_chunk`: copied pieces and
/// the push's large resource values, made as they are asked for), then the trailers
/// (`grpc-status`).
struct Frames<R> {
    rx: ResponseStream<R>,
    /// The message being sent and how far it is framed (boxed: an idle stream holds `None`).
    framing: Option<Box<(R, Cursor)>>,
    done: bool,
}

impl<R: Framed> Stream for Frames<R> {
    type Item = Result<Frame<Bytes>, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(framing) = self.framing.as_mut() {
                let (message, cursor) = &mut **framing;
                if let Some(chunk) = message.next_chunk(cursor) {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                self.framing = None;
            }
            if self.done {
                return Poll::Ready(None);
            }
            match ready!(self.rx.poll_next_unpin(cx)) {
                Some(Ok(message)) => self.framing = Some(Box::new((message, Cursor::default()))),
                Some(Err(status)) => {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
                }
                None => {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&Status::ok(""))))));
                }
            }
        }
    }
}

/// One length-prefixed message in an allocation of exactly its size.
#[cfg(test)]
fn frame<T: Message>(message: &T) -> Bytes {
    use bytes::BufMut;
    let len = message.encoded_len();
    let mut buf = Vec::with_capacity(HEADER_SIZE + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // A Vec grows as needed, so encoding cannot fail for lack of room.
    let _ = message.encode(&mut buf);
    Bytes::from(buf)
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use xds_api::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

    #[test]
    fn frames_are_length_prefixed_messages_of_exact_size() {
        let m = DiscoveryResponse {
            version_info: "v1".into(),
            nonce: "n".into(),
            ..Default::default()
        };
        let f = frame(&m);
        assert_eq!(f.len(), HEADER_SIZE + m.encoded_len());
        assert_eq!(f[0], 0);
        assert_eq!(u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize, m.encoded_len());
        assert_eq!(DiscoveryResponse::decode(&f[HEADER_SIZE..]).unwrap(), m);
    }

    fn body_of(chunks: Vec<Vec<u8>>) -> Body {
        let frames = futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c)))));
        Body::new(http_body_util::StreamBody::new(frames))
    }

    #[tokio::test]
    async fn requests_split_across_frames_are_decoded_and_the_buffer_let_go() {
        let a = DiscoveryRequest {
            type_url: "a".into(),
            resource_names: (0..100).map(|i| format!("outbound|8080||svc-{i}")).collect(),
            ..Default::default()
        };
        let b = DiscoveryRequest {
            type_url: "b".into(),
            ..Default::default()
        };
        let mut wire = frame(&a).to_vec();
        wire.extend_from_slice(&frame(&b));
        // Cut in awkward places: inside the first header, the first body, and the second header.
        let chunks = vec![wire[..3].to_vec(), wire[3..500].to_vec(), wire[500..].to_vec()];
        let mut requests = Requests::<DiscoveryRequest>::new(body_of(chunks.clone()), 1 << 20);
        assert_eq!(requests.next().await.unwrap().unwrap(), a);
        assert_eq!(requests.next().await.unwrap().unwrap(), b);
        assert_eq!(requests.buf.capacity(), 0);
        assert!(requests.next().await.is_none());
        // The state of the world's own reading: the same names, kept in the received bytes.
        let mut requests = Requests::<SotwRequest>::new(body_of(chunks), 1 << 20);
        let first = requests.next().await.unwrap().unwrap();
        assert_eq!(first.type_url, "a");
        assert!(
            first
                .resource_names_str()
                .eq(a.resource_names.iter().map(String::as_str))
        );
        assert_eq!(requests.next().await.unwrap().unwrap().type_url, "b");
        assert_eq!(requests.buf.capacity(), 0);
    }

    #[tokio::test]
    async fn malformed_and_compressed_requests_end_the_stream_with_a_status() {
        let code = |e: RequestError| match e {
            RequestError::Invalid { status, .. } => status.code(),
            RequestError::Transport(status) => panic!("not the client's fault: {status}"),
        };
        let mut garbage = Requests::<DiscoveryRequest>::new(body_of(vec![vec![0, 0, 0, 0, 2, 0xff, 0xff]]), 1 << 20);
        let e = garbage.next().await.unwrap().unwrap_err();
        assert_eq!(code(e), tonic::Code::InvalidArgument);
        assert!(garbage.next().await.is_none());
        let mut garbage = Requests::<SotwRequest>::new(body_of(vec![vec![0, 0, 0, 0, 2, 0xff, 0xff]]), 1 << 20);
        let e = garbage.next().await.unwrap().unwrap_err();
        assert_eq!(code(e), tonic::Code::InvalidArgument);
        let mut compressed = Requests::<DiscoveryRequest>::new(body_of(vec![vec![1, 0, 0, 0, 0]]), 1 << 20);
        assert_eq!(
            code(compressed.next().await.unwrap().unwrap_err()),
            tonic::Code::Unimplemented
        );
        let mut huge = Requests::<DiscoveryRequest>::new(body_of(vec![vec![0, 0xff, 0xff, 0xff, 0xff]]), 1 << 20);
        let e = huge.next().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("ISTIO_GPRC_MAXRECVMSGSIZE"), "{e}");
        assert_eq!(code(e), tonic::Code::ResourceExhausted);
    }

    /// A header declaring a large message reserves nothing: the buffer holds what arrived.
    #[tokio::test]
    async fn a_declared_length_reserves_no_memory_before_the_bytes_arrive() {
        let mut wire = vec![0, 0, 0x40, 0, 0]; // 4 MiB declared
        wire.extend_from_slice(&[0; 100]);
        let frames =
            futures::stream::iter([Ok::<_, Status>(Frame::data(Bytes::from(wire)))]).chain(futures::stream::pending());
        let mut requests =
            Requests::<DiscoveryRequest>::new(Body::new(http_body_util::StreamBody::new(frames)), 8 << 20);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), requests.next()).await;
        assert!(waited.is_err(), "still waiting for the rest of the message");
        assert!(requests.buf.capacity() < 64 * 1024, "{}", requests.buf.capacity());
    }

    #[test]
    fn errors_end_the_stream_with_their_status_in_the_trailers() {
        let t = trailers(&Status::invalid_argument("bad node"));
        assert_eq!(t.get("grpc-status").unwrap(), "3");
        assert_eq!(t.get("grpc-message").unwrap(), "bad%20node");
        assert_eq!(trailers(&Status::ok("")).get("grpc-status").unwrap(), "0");
    }
}
