//! The list + watch every kind read from the API server goes through, as client-go's reflector
//! (`tools/cache/reflector.go`: `ListAndWatch`, which Istio's informers run): a paged list, then a
//! watch from its resourceVersion (bookmarks, re-watch when the server ends it, re-list on 410
//! Gone), with kube-rs's `DefaultBackoff` between failures (exponential from 800 ms to 30 s with
//! jitter, as client-go's; reset after a healthy watch).
//!
//! Unlike kube-rs's `watcher` (whose list decodes as a whole, so that one undecodable object
//! stops the kind from ever syncing), each object is decoded on its own: a list with one bad
//! item serves the others, and the bad one is handed on as [`Undecodable`], named with its
//! defect. A watch line is bounded ([`MAX_LINE`]); a line that is not JSON, an event of a type
//! Kubernetes does not send, an ERROR event and a failed list are each reported with a bounded
//! excerpt of what the server sent (never a whole body) and counted in
//! `pilot_k8s_watch_errors`.

use std::fmt::Debug;
use std::time::Duration;

use futures::{AsyncBufRead, AsyncBufReadExt};
use kube::core::Request;
use kube::core::params::{ListParams, WatchParams};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use kube::{Api, Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::Change;
use crate::watch::WatchMetrics;

/// The longest watch line read: Kubernetes objects are at most ~1.5 MB in etcd, so 16 MiB is
/// generous; a longer line is refused (and the watch restarted) rather than buffered.
pub const MAX_LINE: usize = 16 << 20;
/// Objects per list page (kube-rs's and client-go's default).
const PAGE: u32 = 500;
/// The server ends each watch after this long (kube-rs's 290 s), and it is started again.
const WATCH_TIMEOUT: u32 = 290;
/// The most of a text from the API server that goes to a log line or an error.
pub const EXCERPT: usize = 300;

/// What a watched kind reports: changes, and objects that do not decode.
#[derive(Debug)]
pub(crate) enum Watched<K> {
    Change(Change<K>),
    /// An object of the kind that does not decode as one. In a (re-)list, these come before its
    /// `Replace`; in a watch, the object's last good version (if any) stays in effect.
    Undecodable(Undecodable),
}

/// An object of the cluster that does not decode as its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub namespace: String,
    /// Empty when the object has no readable name.
    pub name: String,
    pub reason: String,
    /// Whether it was an item of a (re-)list (then its `Replace` follows) or a watch event.
    pub listed: bool,
}

/// At most [`EXCERPT`] characters of `text`, saying how long it was when cut.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT) {
        None => text.to_owned(),
        Some((i, _)) => format!("{}... ({} bytes in all)", &text[..i], text.len()),
    }
}

/// The list + watch of `api`'s kind, as a stream (see the module doc). It runs until the stream
/// is dropped.
pub(crate) fn watched<K>(
    api: Api<K>,
    kind: &'static str,
    metrics: WatchMetrics,
) -> impl futures::Stream<Item = Watched<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    let url = api.resource_url().to_owned();
    tokio::spawn(run(api.into_client(), url, kind, metrics, tx));
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

async fn run<K>(client: Client, url: String, kind: &'static str, metrics: WatchMetrics, tx: mpsc::Sender<Watched<K>>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut backoff = DefaultBackoff::default();
    let mut from: Option<String> = None;
    loop {
        let version = match from.take() {
            Some(v) => v,
            None => match list::<K>(&client, &url).await {
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
                Err(e) => {
                    let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                    metrics.watch_error(kind, "list_failed");
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
        let ended = watch(&client, &url, kind, version, &tx).await;
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

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct RawList<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

/// Every object of the kind (paged), each decoded on its own, and the list's resourceVersion.
async fn list<K: DeserializeOwned>(client: &Client, url: &str) -> Result<(Vec<K>, Vec<Undecodable>, String), String> {
    let (mut objects, mut undecodable) = (Vec::new(), Vec::new());
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let req = Request::new(url).list(&lp).map_err(|e| e.to_string())?;
        let text = client.request_text(req).await.map_err(|e| excerpt(&e.to_string()))?;
        let page: RawList<'_> =
            serde_json::from_str(&text).map_err(|e| format!("the list is not a list ({e}): {}", excerpt(&text)))?;
        for item in page.items.unwrap_or_default() {
            match decode::<K>(item) {
                Ok(o) => objects.push(o),
                Err(u) => undecodable.push(Undecodable { listed: true, ..u }),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok((objects, undecodable, page.metadata.resource_version.unwrap_or_default())),
        }
    }
}

/// The object, or what it is (namespace and name, when readable) and why it does not decode.
fn decode<K: DeserializeOwned>(raw: &RawValue) -> Result<K, Undecodable> {
    serde_json::from_str::<K>(raw.get()).map_err(|e| {
        let loose: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
        let field = |f: &str| {
            loose
                .pointer(&format!("/metadata/{f}"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Undecodable {
            namespace: field("namespace"),
            name: field("name"),
            reason: excerpt(&e.to_string()),
            listed: false,
        }
    })
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    type_: String,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize, Default)]
struct Versioned {
    #[serde(default)]
    metadata: Meta,
}

/// Watches from `version` until the server ends the watch or it fails; each event sent on.
async fn watch<K>(
    client: &Client,
    url: &str,
    kind: &'static str,
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
        let text = String::from_utf8_lossy(&line);
        let event: RawEvent<'_> = match serde_json::from_str(&text) {
            Ok(e) => e,
            Err(e) => {
                // An event was lost: re-list to get back in step.
                ended.from = None;
                ended.failed = Some((
                    "not_json",
                    format!("a watch line is not a JSON event ({e}): {}; re-listing", excerpt(&text)),
                ));
                return ended;
            }
        };
        let null: Box<RawValue> = RawValue::from_string("null".to_owned()).unwrap_or_default();
        let object: &RawValue = event.object.unwrap_or(&null);
        let seen = || {
            serde_json::from_str::<Versioned>(object.get())
                .unwrap_or_default()
                .metadata
                .resource_version
                .filter(|v| !v.is_empty())
        };
        let change = match event.type_.as_str() {
            "BOOKMARK" => {
                ended.from = seen().or(ended.from.take());
                ended.healthy = true;
                continue;
            }
            "ERROR" => {
                let status: kube::core::Status = serde_json::from_str(object.get()).unwrap_or_default();
                if status.code == 410 {
                    // Expired: re-list, as every client does.
                    ended.from = None;
                    return ended;
                }
                ended.failed = Some((
                    "error_event",
                    format!(
                        "the API server sent an ERROR event (code {}, {}): {}",
                        status.code,
                        status.reason,
                        excerpt(&status.message)
                    ),
                ));
                return ended;
            }
            t @ ("ADDED" | "MODIFIED" | "DELETED") => match decode::<K>(object) {
                Ok(o) if t == "DELETED" => Watched::Change(Change::Delete(o)),
                Ok(o) => Watched::Change(Change::Apply(o)),
                Err(u) => {
                    let deleted = t == "DELETED";
                    if tx.send(Watched::Undecodable(u)).await.is_err() {
                        return ended;
                    }
                    if deleted {
                        // Which object went is not known for sure: re-list.
                        ended.from = None;
                        return ended;
                    }
                    ended.from = seen().or(ended.from.take());
                    continue;
                }
            },
            other => {
                tracing::warn!(
                    kind,
                    "Kubernetes: watch of {kind}: dropped an event of unknown type {:?}: {}",
                    excerpt(other),
                    excerpt(&text)
                );
                continue;
            }
        };
        ended.from = seen().or(ended.from.take());
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
    pub fn new(inner: R, max: usize) -> Lines<R> {
        Lines {
            inner,
            max,
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> Result<Line, LineError> {
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

    #[test]
    fn excerpts_are_bounded_and_say_so() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert!(e.starts_with(&"é".repeat(EXCERPT)), "{e}");
        assert!(e.ends_with("... (2000 bytes in all)"), "{e}");
    }

    #[test]
    fn an_undecodable_item_is_named_with_its_defect() {
        #[derive(Deserialize, Debug)]
        struct Svc {
            #[allow(dead_code)]
            spec: std::collections::BTreeMap<String, u32>,
        }
        let raw: Box<RawValue> = serde_json::from_str(r#"{"metadata":{"name":"r","namespace":"ns"},"spec":[1]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let Err(u) = decode::<Svc>(&raw) else {
            panic!("a list is not a map")
        };
        assert_eq!((u.namespace.as_str(), u.name.as_str()), ("ns", "r"));
        assert!(u.reason.contains("invalid type: sequence"), "{}", u.reason);
    }
}
