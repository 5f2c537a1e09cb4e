//! The status port's listener: every connection's writes are bounded in time. A caller that stops
//! reading (its receive window full) stalls the server's writes; once a write has made no progress
//! for the write timeout the connection fails and is closed, and everything its response held (a
//! scrape slot, Envoy's stream) is released. Istio's status server streams the scrape through Go's
//! `io.Copy` (pilot/cmd/pilot-agent/status/server.go `handleStats`), holding 32 KiB per stalled
//! caller; this server also gives the connection up.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// A TCP listener whose connections time out stalled writes.
pub(crate) struct StallGuardListener {
    pub(crate) inner: TcpListener,
    pub(crate) write_timeout: Duration,
}

impl Listener for StallGuardListener {
    type Io = StallGuard<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = Listener::accept(&mut self.inner).await;
        (StallGuard::new(stream, self.write_timeout), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The caller's address, as `ConnectInfo` on the status port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer(pub(crate) SocketAddr);

impl Connected<IncomingStream<'_, StallGuardListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, StallGuardListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// An IO whose writes (and flushes, shutdowns) fail with `TimedOut` after `timeout` without progress.
pub(crate) struct StallGuard<T> {
    inner: T,
    timeout: Duration,
    /// Armed while a write is pending; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> StallGuard<T> {
    pub(crate) fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// `Pending` from the inner IO: arm the timer (once) and fail if it has fired.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.stalled = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer read nothing for {timeout:?}"),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<R>(&mut self, result: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match result {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.pending(cx),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        ready!(self.progress(result, cx))?;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_times_out() {
        let (ours, _theirs) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(ours, Duration::from_secs(5));
        guarded.write_all(b"0123456789abcdef").await.unwrap();
        let err = guarded.write_all(b"more").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_keeps_the_connection() {
        let (ours, mut theirs) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(ours, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let mut total = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                match tokio::io::AsyncReadExt::read(&mut theirs, &mut buf).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
            }
        });
        guarded.write_all(&[7u8; 256]).await.unwrap();
        drop(guarded);
        assert_eq!(reader.await.unwrap(), 256);
    }
}
