//! Connections that say nothing are closed.
//!
//! The head pings every HTTP/2 connection (keepalive, a third of the idle timeout apart) and
//! hyper closes one whose pings go unanswered; but a connection that never completes the
//! HTTP/2 handshake is never pinged, and before this wrapper such connections were held
//! forever (an attacker could exhaust file descriptors by opening sockets and sending
//! nothing). [`Idle`] wraps each accepted connection: when nothing has been read from it for
//! the idle timeout, its next read fails and hyper drops it. A live client always answers the
//! keepalive pings, so only silent peers are cut.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

/// An accepted connection that fails its reads once its peer has been silent for `timeout`.
#[derive(Debug)]
pub struct Idle<IO> {
    io: IO,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> Idle<IO> {
    /// Wraps `io`; the clock starts now.
    pub fn new(io: IO, timeout: Duration) -> Idle<IO> {
        Idle {
            io,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Idle<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.timeout;
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(result)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer sent nothing for {:?}", self.timeout),
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Idle<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for Idle<IO> {
    type ConnectInfo = IO::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_cut_and_a_talking_one_is_not() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut idle = Idle::new(near, Duration::from_secs(5));
        let mut buf = [0u8; 8];
        // Talking every 4 s keeps it open.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(4)).await;
            far.write_all(b"hi").await.unwrap();
            assert_eq!(idle.read(&mut buf).await.unwrap(), 2);
        }
        // Then 5 s of silence ends it.
        let err = idle.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
