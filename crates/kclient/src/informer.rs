//! The list + watch every kind read from the API server goes through, as client-go's reflector
//! (`tools/cache/reflector.go`: `ListAndWatch`, which Istio's informers run): a paged list, then a
//! watch from its resourceVersion (bookmarks, re-watch when the server ends it, re-list on 410
//! Gone), with kube-rs's `DefaultBackoff` between failures (exponential from 800 ms to 30 s with
//! jitter, as client-go's; reset after a healthy watch).
//!
//! Unlike kube-rs's `watcher` (whose list decodes as a whole, so that one undecodable object
//! stops the kind from ever syncing), each object is decoded on its own: a list with one bad
//! item serves the others, and the bad one is handed on as [`Undecodable`], named with its
//! defect (the decoding itself is [`crate::decode`]'s). A watch line is bounded ([`MAX_LINE`]),
//! and so is a list page ([`MAX_PAGE`]; a page over it is refused and the list retried with
//! backoff); a line that is not JSON, an event of a type Kubernetes does not send, an ERROR event
//! and a failed list are each reported with a bounded excerpt of what the server sent (never a
//! whole body) and counted in `pilot_k8s_watch_errors`; the warnings are rate limited
//! (`monitoring::throttle`), the counts are not.

use std::fmt::Debug;
use std::time::Duration;

use futures::{AsyncBufRead, AsyncBufReadExt};
use http_body_util::BodyExt;
use kube::core::Request;
use kube::core::params::{ListParams, WatchParams};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::Change;
use crate::WatchMetrics;
pub use crate::decode::{EXCERPT, Undecodable, excerpt};
use crate::decode::{Event, decode_event, decode_page};

/// The longest watch line read: Kubernetes objects are at most ~1.5 MB in etcd, so 16 MiB is
/// generous; a longer line is refused (and the watch restarted) rather than buffered.
pub(crate) const MAX_LINE: usize = 16 << 20;
/// The largest list page read: [`PAGE`] objects of 256 KiB each (Pods with their managedFields
/// are tens of KiB); a larger page is refused (and the list retried with backoff) rather than
/// buffered without limit.
pub const MAX_PAGE: usize = 128 << 20;
/// The most of an error answer read (its Status message is what is reported).
const MAX_ERROR_BODY: usize = 64 << 10;
/// Objects per list page (kube-rs's and client-go's default).
const PAGE: u32 = 500;
/// The server ends each watch after this long (kube-rs's 290 s), and it is started again.
const WATCH_TIMEOUT: u32 = 290;

/// What a watched kind reports: changes, and objects that do not decode.
#[derive(Debug)]
pub enum Watched<K> {
    Change(Change<K>),
    /// An object of the kind that does not decode as one. In a (re-)list, these come before its
    /// `Replace`; in a watch, the object's last good version (if any) stays in effect.
    Undecodable(Undecodable),
}

/// The list + watch of `api`'s kind, as a stream (see the module doc). It runs until the stream
/// is dropped.
pub fn watched<K>(
    api: Api<K>,
    kind: &'static str,
    metrics: WatchMetrics,
) -> impl futures::Stream<Item = Watched<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watched_bounded(api, kind, metrics, MAX_PAGE)
}

/// [`watched`], with list pages bounded at `max_page` bytes.
fn watched_bounded<K>(
    api: Api<K>,
    kind: &'static str,
    metrics: WatchMetrics,
    max_page: usize,
) -> impl futures::Stream<Item = Watched<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    let url = api.resource_url().to_owned();
    // The list + watch ends as soon as the stream is dropped, not at the end of the watch in
    // flight (up to WATCH_TIMEOUT): a cluster that leaves takes its tasks and connections along.
    let dropped = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = run(api.into_client(), url, kind, metrics, max_page, tx) => {}
            () = dropped.closed() => {}
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|w| (w, rx)) })
}

/// How a watch ended.
struct Ended {
    /// Where to watch from next; `None`: re-list first.
    from: Option<String>,
    /// Why it failed (a metric reason and the message), if it did.
    failed: Option<(&'static str, String)>,
    /// Whether it delivered anything before it ended.
    healthy: bool,
}

async fn run<K>(
    client: Client,
    url: String,
    kind: &'static str,
    metrics: WatchMetrics,
    max_page: usize,
    tx: mpsc::Sender<Watched<K>>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut backoff = DefaultBackoff::default();
    let mut from: Option<String> = None;
    loop {
        let version = match from.take() {
            Some(v) => v,
            None => match list::<K>(&client, &url, max_page).await {
                Ok((objects, undecodable, version)) => {
                    for u in undecodable {
                        if tx.send(Watched::Undecodable(u)).await.is_err() {
                            return;
                        }
                    }
                    if tx.send(Watched::Change(Change::Replace(objects))).await.is_err() {
                        return;
                    }
                    version
                }
                Err((reason, e)) => {
                    let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                    metrics.watch_error(kind, reason);
                    if let Some(suppressed) = monitoring::throttle::allow("kube_list_failed") {
                        tracing::warn!(kind, suppressed, retry_in = ?delay, "Kubernetes: listing {kind} failed: {e}");
                    }
                    if wait(&tx, delay).await {
                        return;
                    }
                    continue;
                }
            },
        };
        let ended = watch(&client, &url, kind, &metrics, version, &tx).await;
        if tx.is_closed() {
            return;
        }
        from = ended.from;
        if ended.healthy {
            backoff.reset();
        }
        if let Some((reason, message)) = ended.failed {
            let delay = backoff.next().unwrap_or(Duration::from_secs(30));
            metrics.watch_error(kind, reason);
            if let Some(suppressed) = monitoring::throttle::allow("kube_watch_error") {
                tracing::warn!(kind, suppressed, retry_in = ?delay, "Kubernetes: watch of {kind}: {message}");
            }
            if wait(&tx, delay).await {
                return;
            }
        }
    }
}

/// Sleeps `delay`; whether the stream was dropped meanwhile.
async fn wait<T>(tx: &mpsc::Sender<T>, delay: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => false,
        () = tx.closed() => true,
    }
}

/// Why a list request failed.
#[derive(Debug, PartialEq, Eq)]
pub enum FetchError {
    /// The answer was longer than the bound (what was read of it is dropped).
    TooLarge { max: usize },
    /// The API server answered with an error: the HTTP code and its Status message (an excerpt).
    Status { code: u16, message: String },
    /// The request failed, or the answer is not text.
    Failed(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::TooLarge { max } => {
                let bound = if *max >= 1 << 20 {
                    format!("{} MiB", max >> 20)
                } else {
                    format!("{max} bytes")
                };
                write!(
                    f,
                    "refused a list page larger than {bound} (the API server sent more; at most {PAGE} \
                     objects were asked for): the list is retried"
                )
            }
            FetchError::Status { code, message } => write!(f, "the API server answered {code}: {message}"),
            FetchError::Failed(e) => f.write_str(e),
        }
    }
}

/// One page of a list of `url` (a GET with `lp`), read up to `max` bytes.
pub async fn get_list(client: &Client, url: &str, lp: &ListParams, max: usize) -> Result<String, FetchError> {
    let req = Request::new(url)
        .list(lp)
        .map_err(|e| FetchError::Failed(e.to_string()))?;
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| FetchError::Failed(excerpt(&e.to_string())))?;
    let status = res.status();
    if status.is_success() {
        return read_bounded(res.into_body(), max).await;
    }
    // An error answer: its Status's message, else its text (both bounded).
    let text = match read_bounded(res.into_body(), MAX_ERROR_BODY).await {
        Ok(text) => text,
        Err(e) => format!("(unreadable: {e})"),
    };
    let message = serde_json::from_str::<kube::core::Status>(&text)
        .ok()
        .map(|s| s.message)
        .filter(|m| !m.is_empty())
        .unwrap_or(text);
    Err(FetchError::Status {
        code: status.as_u16(),
        message: excerpt(message.trim()),
    })
}

/// The body as text, refused past `max` bytes.
async fn read_bounded(mut body: kube::client::Body, max: usize) -> Result<String, FetchError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| FetchError::Failed(excerpt(&e.to_string())))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(FetchError::TooLarge { max });
            }
            buf.extend_from_slice(&data);
        }
    }
    String::from_utf8(buf).map_err(|e| FetchError::Failed(format!("the answer is not UTF-8: {e}")))
}

/// Every object of the kind (paged), each decoded on its own, and the list's resourceVersion; or
/// why not (a metric reason and the message).
async fn list<K: DeserializeOwned>(
    client: &Client,
    url: &str,
    max_page: usize,
) -> Result<(Vec<K>, Vec<Undecodable>, String), (&'static str, String)> {
    let (mut objects, mut undecodable) = (Vec::new(), Vec::new());
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let text = get_list(client, url, &lp, max_page).await.map_err(|e| match e {
            FetchError::TooLarge { .. } => ("page_too_large", e.to_string()),
            _ => ("list_failed", e.to_string()),
        })?;
        let page = decode_page::<K>(&text).map_err(|e| ("list_failed", e))?;
        drop(text);
        objects.extend(page.objects);
        undecodable.extend(page.undecodable);
        match page.next {
            Some(t) => token = Some(t),
            None => return Ok((objects, undecodable, page.version)),
        }
    }
}

/// Watches from `version` until the server ends the watch or it fails; each event sent on.
async fn watch<K>(
    client: &Client,
    url: &str,
    kind: &'static str,
    metrics: &WatchMetrics,
    version: String,
    tx: &mpsc::Sender<Watched<K>>,
) -> Ended
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut ended = Ended {
        from: Some(version),
        failed: None,
        healthy: false,
    };
    let wp = WatchParams::default().timeout(WATCH_TIMEOUT);
    let req = match Request::new(url).watch(&wp, ended.from.as_deref().unwrap_or_default()) {
        Ok(r) => r,
        Err(e) => {
            ended.failed = Some(("watch_failed", e.to_string()));
            return ended;
        }
    };
    let body = match client.request_stream(req).await {
        Ok(b) => b,
        Err(e) => {
            ended.failed = Some(("watch_failed", excerpt(&e.to_string())));
            return ended;
        }
    };
    let mut lines = Lines::new(Box::pin(body), MAX_LINE);
    loop {
        let line = match lines.next().await {
            Ok(Line::Full(l)) => l,
            // The server ended the watch (or the connection was cut mid-line): watch again from
            // the last version seen, which a cut event is not part of.
            Ok(Line::End | Line::Unfinished) => return ended,
            Err(LineError::TooLong) => {
                ended.failed = Some((
                    "line_too_long",
                    format!(
                        "refused a watch line longer than {} MiB (the API server sent more without a newline; \
                         Kubernetes objects are at most ~1.5 MB): the watch is restarted",
                        MAX_LINE >> 20
                    ),
                ));
                return ended;
            }
            Err(LineError::Io(e)) => {
                ended.failed = Some(("watch_failed", excerpt(&e.to_string())));
                return ended;
            }
        };
        let (change, version) = match decode_event::<K>(&line) {
            Event::NotJson(message) => {
                // An event was lost: re-list to get back in step.
                ended.from = None;
                ended.failed = Some(("not_json", format!("{message}; re-listing")));
                return ended;
            }
            Event::Bookmark { version } => {
                ended.from = version.or(ended.from.take());
                ended.healthy = true;
                continue;
            }
            Event::Error { code: 410, .. } => {
                // Expired: re-list, as every client does.
                ended.from = None;
                return ended;
            }
            Event::Error { code, reason, message } => {
                ended.failed = Some((
                    "error_event",
                    format!("the API server sent an ERROR event (code {code}, {reason}): {message}"),
                ));
                return ended;
            }
            Event::Undecodable {
                undecodable,
                deleted,
                version,
            } => {
                if tx.send(Watched::Undecodable(undecodable)).await.is_err() {
                    return ended;
                }
                if deleted {
                    // Which object went is not known for sure: re-list.
                    ended.from = None;
                    return ended;
                }
                ended.from = version.or(ended.from.take());
                continue;
            }
            Event::Unknown { type_, line } => {
                // An event of a type Kubernetes does not define carries nothing to act on: dropped
                // and counted, the watch goes on.
                metrics.watch_error(kind, "unknown_event");
                if let Some(suppressed) = monitoring::throttle::allow("kube_unknown_event") {
                    tracing::warn!(
                        kind,
                        suppressed,
                        "Kubernetes: watch of {kind}: dropped an event of unknown type {type_:?}: {line}"
                    );
                }
                continue;
            }
            Event::Change { change, version } => (Watched::Change(change), version),
        };
        ended.from = version.or(ended.from.take());
        ended.healthy = true;
        if tx.send(change).await.is_err() {
            return ended;
        }
    }
}

/// A line of a watch.
pub(crate) enum Line {
    /// A whole line, without its newline.
    Full(Vec<u8>),
    /// The stream ended after a line.
    End,
    /// The stream ended in the middle of a line (dropped).
    Unfinished,
}

#[derive(Debug)]
pub(crate) enum LineError {
    /// More than the limit without a newline; what was read of it is dropped.
    TooLong,
    Io(std::io::Error),
}

/// Newline-delimited lines of at most `max` bytes (empty lines skipped).
pub(crate) struct Lines<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    pub(crate) fn new(inner: R, max: usize) -> Lines<R> {
        Lines {
            inner,
            max,
            buf: Vec::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> Result<Line, LineError> {
        loop {
            let chunk = self.inner.fill_buf().await.map_err(LineError::Io)?;
            if chunk.is_empty() {
                let unfinished = !self.buf.is_empty();
                self.buf = Vec::new();
                return Ok(if unfinished { Line::Unfinished } else { Line::End });
            }
            let (take, newline) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if self.buf.len() + take > self.max {
                self.buf = Vec::new();
                return Err(LineError::TooLong);
            }
            self.buf.extend_from_slice(&chunk[..take]);
            self.inner.consume_unpin(take + usize::from(newline));
            if newline {
                let line = std::mem::take(&mut self.buf);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Line::Full(line));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], max: usize) -> Vec<Result<String, String>> {
        let mut lines = Lines::new(futures::io::Cursor::new(input.to_vec()), max);
        let mut out = Vec::new();
        loop {
            match lines.next().await {
                Ok(Line::Full(l)) => out.push(Ok(String::from_utf8_lossy(&l).into_owned())),
                Ok(Line::End) => return out,
                Ok(Line::Unfinished) => {
                    out.push(Err("unfinished".into()));
                    return out;
                }
                Err(e) => {
                    out.push(Err(format!("{e:?}")));
                    return out;
                }
            }
        }
    }

    #[tokio::test]
    async fn lines_are_bounded_and_a_cut_line_is_not_a_line() {
        assert_eq!(
            read_all(b"a\n\nbc\n", 4).await,
            [Ok("a".to_owned()), Ok("bc".to_owned())]
        );
        assert_eq!(read_all(b"abcd\n", 4).await, [Ok("abcd".to_owned())]);
        assert_eq!(
            read_all(b"a\nabcde\nz\n", 4).await,
            [Ok("a".to_owned()), Err("TooLong".to_owned())]
        );
        assert_eq!(
            read_all(b"a\n{\"type\":", 64).await,
            [Ok("a".to_owned()), Err("unfinished".to_owned())]
        );
    }

    /// A list page over the bound is refused, counted as `page_too_large` and retried with
    /// backoff; nothing is served from it.
    #[tokio::test]
    async fn a_list_page_over_the_bound_is_refused_and_retried() {
        use k8s_openapi::api::core::v1::Service;
        let api = test_support::kube_api::FakeApiServer::start()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..20 {
            api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
                "spec": {"ports": [{"name": "http", "port": 80}]}}))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap_or_else(|e| panic!("{e}"));
        let cfg = crate::client::client_config(kubeconfig.to_str().unwrap_or_default(), |_| None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no client config"));
        let client = crate::client::connect(cfg, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = WatchMetrics::default();
        let refused = || {
            metrics
                .watch_errors
                .get_or_create(&crate::metrics::WatchErrorLabels {
                    r#type: "Service".into(),
                    reason: "page_too_large".into(),
                })
                .get()
        };
        let lists = || {
            api.requests()
                .iter()
                .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch="))
                .count()
        };
        let stream = watched_bounded(Api::<Service>::all(client.clone()), "Service", metrics.clone(), 2048);
        futures::pin_mut!(stream);
        // The first try and at least one more after the backoff (800 ms..): nothing served.
        let got = tokio::time::timeout(Duration::from_secs(3), futures::StreamExt::next(&mut stream)).await;
        assert!(got.is_err(), "a page over 2048 bytes was served: {got:?}");
        assert!(refused() >= 2, "refused {} times in 3 s", refused());
        assert_eq!(lists() as u64, refused(), "each list was refused once");
        assert_eq!(
            FetchError::TooLarge { max: 2048 }.to_string(),
            "refused a list page larger than 2048 bytes (the API server sent more; at most 500 objects \
             were asked for): the list is retried"
        );
        // The same list within the bound is served.
        let stream = watched_bounded(Api::<Service>::all(client), "Service", metrics.clone(), MAX_PAGE);
        futures::pin_mut!(stream);
        let first = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut stream)).await;
        assert!(
            matches!(&first, Ok(Some(Watched::Change(Change::Replace(all)))) if all.len() == 20),
            "{first:?}"
        );
    }

    #[tokio::test]
    async fn an_error_answer_is_read_bounded_and_named_by_its_status() {
        let status = r#"{"kind":"Status","code":403,"message":"services is forbidden"}"#;
        assert_eq!(
            read_bounded(kube::client::Body::from(status.as_bytes().to_vec()), 1024).await,
            Ok(status.to_owned())
        );
        assert_eq!(
            read_bounded(kube::client::Body::from(vec![b'x'; 1025]), 1024).await,
            Err(FetchError::TooLarge { max: 1024 })
        );
    }
}
