//! Envoy's ACKs and NACKs as the xDS proxy sees them, published as [`XdsStatus`]: a request whose
//! `response_nonce` is that of the last response of its type forwarded to Envoy is an ACK without
//! `error_detail` and a NACK with one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;
use xds_api::type_url;

use crate::readiness::XdsStatus;

/// The last nonce forwarded to Envoy per type URL, on one stream.
#[derive(Debug, Default)]
pub(crate) struct SentNonces(Mutex<HashMap<String, String>>);

impl SentNonces {
    /// Records a response about to go to Envoy (before it is sent, so its ACK cannot be missed).
    pub(crate) fn sent(&self, type_url: &str, nonce: &str) {
        let mut sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sent.insert(type_url.to_owned(), nonce.to_owned());
    }

    fn is_current(&self, type_url: &str, nonce: &str) -> bool {
        let sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        !nonce.is_empty() && sent.get(type_url).is_some_and(|n| n == nonce)
    }
}

/// Publishes the proxy's [`XdsStatus`]; shared by all streams.
#[derive(Debug)]
pub(crate) struct StatusPublisher {
    tx: watch::Sender<XdsStatus>,
    /// Type URL of `last_nack`, so an ACK of that type clears it.
    nack_type: Mutex<Option<String>>,
    connected_streams: AtomicUsize,
}

impl StatusPublisher {
    pub(crate) fn new() -> StatusPublisher {
        StatusPublisher {
            tx: watch::Sender::new(XdsStatus::default()),
            nack_type: Mutex::new(None),
            connected_streams: AtomicUsize::new(0),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<XdsStatus> {
        self.tx.subscribe()
    }

    /// Looks at a request from Envoy: an ACK or NACK of the response last sent on its stream.
    pub(crate) fn observe_request(&self, sent: &SentNonces, type_url: &str, nonce: &str, error: Option<&str>) {
        if !sent.is_current(type_url, nonce) {
            return;
        }
        let mut nack_type = self.nack_type.lock().unwrap_or_else(|e| e.into_inner());
        match error {
            Some(message) => {
                if let Some(suppressed) = monitoring::throttle::allow("envoy_nack") {
                    let shown: String = message.chars().take(4096).collect();
                    tracing::warn!(
                        type_url,
                        message = shown,
                        suppressed,
                        "Envoy rejected (NACK) the xDS response"
                    );
                }
                *nack_type = Some(type_url.to_owned());
                let nack = format!("{}: {message}", short(type_url));
                self.tx.send_modify(|s| s.last_nack = Some(nack));
            }
            None => {
                let clears_nack = nack_type.as_deref() == Some(type_url);
                if clears_nack {
                    *nack_type = None;
                }
                self.tx.send_if_modified(|s| {
                    let before = s.clone();
                    match type_url {
                        type_url::CLUSTER => s.cds_acked = true,
                        type_url::LISTENER => s.lds_acked = true,
                        _ => {}
                    }
                    if clears_nack {
                        s.last_nack = None;
                    }
                    *s != before
                });
            }
        }
    }

    /// An upstream stream opened (`true`) or ended (`false`).
    pub(crate) fn upstream_connected(&self, connected: bool) {
        let now = if connected {
            self.connected_streams.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.connected_streams.fetch_sub(1, Ordering::SeqCst).saturating_sub(1)
        };
        self.tx.send_if_modified(|s| {
            let was = s.upstream_connected;
            s.upstream_connected = now > 0;
            was != s.upstream_connected
        });
    }
}

/// `cds`, `lds`, ... as Istio logs types; the type URL itself for types without a short name.
fn short(url: &str) -> &str {
    match type_url::short(url) {
        "unknown" => url,
        s => s,
    }
}

/// Marks the upstream connected for as long as it lives.
pub(crate) struct ConnectedGuard<'a>(&'a StatusPublisher);

impl<'a> ConnectedGuard<'a> {
    pub(crate) fn new(status: &'a StatusPublisher) -> Self {
        status.upstream_connected(true);
        ConnectedGuard(status)
    }
}

impl Drop for ConnectedGuard<'_> {
    fn drop(&mut self) {
        self.0.upstream_connected(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_of_the_current_nonce_counts_stale_does_not() {
        let status = StatusPublisher::new();
        let rx = status.subscribe();
        let sent = SentNonces::default();
        sent.sent(type_url::CLUSTER, "1");
        sent.sent(type_url::CLUSTER, "2");
        status.observe_request(&sent, type_url::CLUSTER, "1", None);
        status.observe_request(&sent, type_url::CLUSTER, "", None);
        assert!(!rx.borrow().cds_acked, "a stale or empty nonce is no ACK");
        status.observe_request(&sent, type_url::CLUSTER, "2", None);
        assert!(rx.borrow().cds_acked);
        assert!(!rx.borrow().config_received());
        sent.sent(type_url::LISTENER, "3");
        status.observe_request(&sent, type_url::LISTENER, "3", None);
        assert!(rx.borrow().config_received());
    }

    #[test]
    fn nack_is_recorded_and_cleared_by_an_ack_of_its_type() {
        let status = StatusPublisher::new();
        let rx = status.subscribe();
        let sent = SentNonces::default();
        sent.sent(type_url::LISTENER, "a");
        status.observe_request(&sent, type_url::LISTENER, "a", Some("bad filter"));
        assert_eq!(rx.borrow().last_nack.as_deref(), Some("lds: bad filter"));
        assert!(!rx.borrow().lds_acked);
        sent.sent(type_url::CLUSTER, "b");
        status.observe_request(&sent, type_url::CLUSTER, "b", None);
        assert!(rx.borrow().last_nack.is_some(), "an ACK of another type keeps the NACK");
        sent.sent(type_url::LISTENER, "c");
        status.observe_request(&sent, type_url::LISTENER, "c", None);
        assert_eq!(rx.borrow().last_nack, None);
        assert!(rx.borrow().lds_acked);
    }

    #[test]
    fn connected_while_any_upstream_stream_is() {
        let status = StatusPublisher::new();
        let rx = status.subscribe();
        let first = ConnectedGuard::new(&status);
        let second = ConnectedGuard::new(&status);
        drop(first);
        assert!(rx.borrow().upstream_connected);
        drop(second);
        assert!(!rx.borrow().upstream_connected);
    }
}
