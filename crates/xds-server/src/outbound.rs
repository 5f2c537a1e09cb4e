//! The response side of an ADS stream: a small bounded channel to the response body (`grpc`)
//! whose receiving end tells a push when the body has come back for the message after its last
//! one, that is when the push's bytes have been handed to HTTP/2 and the connection had room for
//! more. A push holds its throttle [`Slot`] until then, so the bytes in flight are bounded by the
//! throttle, not by the number of proxies (Istio's push semaphore covers `Send`, which blocks on
//! flow control the same way).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tonic::Status;

/// Responses queued per stream: one full push (CDS, EDS, LDS, RDS).
pub(crate) const STREAM_BUFFER: usize = 4;

/// The longest a push keeps its throttle slot waiting for a proxy to read. A proxy that stops
/// reading keeps its connection (its data stays queued) but no longer holds up other pushes; a
/// push that finds the stream's queue full gives its slot up at once (`Slot::send`).
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// One message for the response body, with the signal to give once the body is past it.
pub(crate) struct Outbound<T> {
    pub item: Result<T, Status>,
    pub taken: Option<oneshot::Sender<()>>,
}

impl<T> Outbound<T> {
    pub fn message(item: Result<T, Status>) -> Outbound<T> {
        Outbound { item, taken: None }
    }
}

pub(crate) type OutSender<T> = mpsc::Sender<Outbound<T>>;

/// A channel pair: the sender for the stream's task, the stream for tonic.
pub(crate) fn channel<T>() -> (OutSender<T>, ResponseStream<T>) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    (tx, ResponseStream { rx, passed: None })
}

/// What the response body (`grpc::Frames`) reads. Polled again after yielding a message, it signals that message's sender.
pub struct ResponseStream<T> {
    rx: mpsc::Receiver<Outbound<T>>,
    passed: Option<oneshot::Sender<()>>,
}

impl<T> futures::Stream for ResponseStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(tx) = self.passed.take() {
            let _ = tx.send(());
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(out)) => {
                self.passed = out.taken;
                Poll::Ready(Some(out.item))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Waits until `taken` fires (or the stream is gone), at most [`DRAIN_WAIT`].
async fn drained(taken: oneshot::Receiver<()>) {
    let _ = tokio::time::timeout(DRAIN_WAIT, taken).await;
}

/// A push's (or an answer's) throttle slot, and the signal of the last response sent under it.
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    last: Option<oneshot::Receiver<()>>,
}

impl Slot {
    pub(crate) fn new(permit: Option<OwnedSemaphorePermit>) -> Slot {
        Slot { permit, last: None }
    }

    /// Queues `item`. When the queue is full the proxy is not reading: the permit is given up
    /// before waiting, so that proxy holds up no other push. `Err` when the stream is gone.
    pub(crate) async fn send<T>(&mut self, tx: &OutSender<T>, item: T) -> Result<(), ()> {
        let taken = self.permit.is_some().then(|| {
            let (taken, last) = oneshot::channel();
            self.last = Some(last);
            taken
        });
        let out = Outbound { item: Ok(item), taken };
        match tx.try_send(out) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
            Err(mpsc::error::TrySendError::Full(out)) => {
                self.permit = None;
                tx.send(out).await.map_err(|_| ())
            }
        }
    }

    /// Gives the permit back once the body is past the last response sent under it (at most
    /// [`DRAIN_WAIT`]).
    pub(crate) async fn release(mut self) {
        if self.permit.is_some()
            && let Some(last) = self.last.take()
        {
            drained(last).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn the_sender_hears_once_the_reader_comes_back_after_its_message() {
        let (tx, mut stream) = channel::<u32>();
        let (taken, mut heard) = oneshot::channel();
        tx.send(Outbound::message(Ok(1))).await.unwrap();
        tx.send(Outbound {
            item: Ok(2),
            taken: Some(taken),
        })
        .await
        .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        // Yielded, but not yet known to be consumed.
        assert!(heard.try_recv().is_err());
        drop(tx);
        assert!(stream.next().await.is_none());
        assert!(heard.try_recv().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_comes_back_holds_the_push_for_a_bounded_time() {
        let (tx, _stream) = channel::<u32>();
        let (taken, heard) = oneshot::channel();
        tx.send(Outbound {
            item: Ok(1),
            taken: Some(taken),
        })
        .await
        .unwrap();
        let t0 = tokio::time::Instant::now();
        drained(heard).await;
        assert_eq!(t0.elapsed(), DRAIN_WAIT);
    }
}
