//! The response side of an ADS stream: a small bounded channel to the response body (`framing`)
//! whose receiving end tells a push when the body has come back for the message after each of
//! its messages, that is when the message's bytes have been handed to HTTP/2 and the connection
//! had room for more. A push holds its throttle [`Slot`] while its messages are taken, so the
//! bytes in flight are bounded by the throttle, not by the number of proxies (Istio's push
//! semaphore covers `Send`, which blocks on flow control the same way); a stream that stops
//! reading (no message taken within the stall time, `PILOT_DEBOUNCE_AFTER`) gives the slot up, so
//! a stalled proxy costs a healthy one no more than the push debounce.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tonic::Status;

/// Responses queued per stream: one full push (CDS, EDS, LDS, RDS).
pub(crate) const STREAM_BUFFER: usize = 4;

/// One message for the response body, with the signal to give once the body is past it. The
/// message is boxed: Tokio's channel allocates its slots 32 at a time whatever its capacity, and
/// a response or a status inline made that 6 kB per stream (12 MB at 2,000 sidecars).
pub(crate) struct Outbound<T> {
    pub item: Box<Result<T, Status>>,
    pub taken: Option<oneshot::Sender<()>>,
}

impl<T> Outbound<T> {
    pub(crate) fn message(item: Result<T, Status>) -> Outbound<T> {
        Outbound {
            item: Box::new(item),
            taken: None,
        }
    }
}

pub(crate) type OutSender<T> = mpsc::Sender<Outbound<T>>;

/// A channel pair: the sender for the stream's task, the stream for tonic.
pub(crate) fn channel<T>() -> (OutSender<T>, ResponseStream<T>) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    (tx, ResponseStream { rx, passed: None })
}

/// What the response body (`framing::Frames`) reads. Polled again after yielding a message, it signals that message's sender.
pub(crate) struct ResponseStream<T> {
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
                Poll::Ready(Some(*out.item))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Whether `taken` fired (or the stream is gone) within `stall`.
async fn taken_within(taken: oneshot::Receiver<()>, stall: Duration) -> bool {
    tokio::time::timeout(stall, taken).await.is_ok()
}

/// A push's (or an answer's) throttle slot, and the signals of the responses sent under it.
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    sent: Vec<oneshot::Receiver<()>>,
    /// How long a message may wait to be taken before the stream counts as stalled.
    stall: Duration,
}

impl Slot {
    pub(crate) fn new(permit: Option<OwnedSemaphorePermit>, stall: Duration) -> Slot {
        Slot {
            permit,
            sent: Vec::new(),
            stall,
        }
    }

    /// Queues `item`. When the queue is full the proxy is not reading: the permit is given up
    /// before waiting, so that proxy holds up no other push. `Err` when the stream is gone.
    pub(crate) async fn send<T>(&mut self, tx: &OutSender<T>, item: T) -> Result<(), ()> {
        let taken = self.permit.is_some().then(|| {
            let (taken, signal) = oneshot::channel();
            self.sent.push(signal);
            taken
        });
        let out = Outbound {
            item: Box::new(Ok(item)),
            taken,
        };
        match tx.try_send(out) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
            Err(mpsc::error::TrySendError::Full(out)) => {
                self.permit = None;
                self.sent.clear();
                tx.send(out).await.map_err(|_| ())
            }
        }
    }

    /// Gives the permit back once the body is past every response sent under it, or as soon as
    /// one of them is not taken within the stall time (the proxy stopped reading).
    pub(crate) async fn release(mut self) {
        if self.permit.is_none() {
            return;
        }
        for signal in std::mem::take(&mut self.sent) {
            if !taken_within(signal, self.stall).await {
                return;
            }
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
            item: Box::new(Ok(2)),
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
    async fn a_reader_that_stops_gives_the_slot_up_after_the_stall_time() {
        let stall = Duration::from_millis(100);
        let (tx, mut stream) = channel::<u32>();
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
        let mut slot = Slot::new(permits.clone().try_acquire_owned().ok(), stall);
        for i in 0..3 {
            slot.send(&tx, i).await.unwrap();
        }
        // The reader takes the first message, then stops.
        assert_eq!(stream.next().await.unwrap().unwrap(), 0);
        let t0 = tokio::time::Instant::now();
        slot.release().await;
        assert_eq!(t0.elapsed(), stall, "one stall time, not one per message");
        assert_eq!(permits.available_permits(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_keeps_the_slot_while_it_reads() {
        let stall = Duration::from_millis(100);
        let (tx, mut stream) = channel::<u32>();
        let mut slot = Slot::new(
            std::sync::Arc::new(tokio::sync::Semaphore::new(1))
                .try_acquire_owned()
                .ok(),
            stall,
        );
        for i in 0..3 {
            slot.send(&tx, i).await.unwrap();
        }
        let reader = tokio::spawn(async move {
            // A poll every 40 ms: each message is taken (the poll after it) within the stall
            // time, the last at 160 ms.
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                if stream.next().await.is_none() {
                    break;
                }
            }
            stream
        });
        let t0 = tokio::time::Instant::now();
        slot.release().await;
        assert!(
            t0.elapsed() > stall,
            "released at {:?}, before the reader was done",
            t0.elapsed()
        );
        drop(tx);
        drop(reader.await.unwrap());
    }
}
