//! Streams end when their credential does: a token revoked while a Watch, a SubmitStream, a
//! WaitStream, a worker's link or the dashboard's live feed is open, or a task credential whose
//! attempt ended, stops admitting within [`RECHECK`] of it.
//!
//! The auth layer checks a call once, when it starts; a stream lives on. [`Revalidation`]
//! checks the credential again every [`RECHECK`] for as long as the stream is read, and says
//! when it no longer admits; [`GuardedBody`] (a gRPC response) and [`GuardedStream`] (the
//! dashboard's events) end the stream then, with UNAUTHENTICATED and the reason.
//! [`RecheckedRequest`] checks the token again for every message a client streams in, so that a
//! message sent after the revoke is refused, not acted on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tonic::Status;
use tonic::body::Body;

use super::{Keys, RunningAttempts, check_attempt};

/// How often an open stream's credential is checked again.
pub const RECHECK: Duration = Duration::from_millis(500);

type Check = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

/// A credential checked again every [`RECHECK`].
pub struct Revalidation {
    keys: Arc<Keys>,
    token: Arc<str>,
    attempts: Option<Arc<dyn RunningAttempts>>,
    every: tokio::time::Interval,
    pending: Option<Check>,
}

impl std::fmt::Debug for Revalidation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revalidation").finish_non_exhaustive()
    }
}

impl Revalidation {
    /// Checks `token` (and, for a task credential, its attempt, through `attempts`) every
    /// [`RECHECK`] from now.
    pub fn new(
        keys: Arc<Keys>,
        token: &str,
        attempts: Option<Arc<dyn RunningAttempts>>,
    ) -> Revalidation {
        let start = tokio::time::Instant::now() + RECHECK;
        let mut every = tokio::time::interval_at(start, RECHECK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Revalidation {
            keys,
            token: Arc::from(token),
            attempts,
            every,
            pending: None,
        }
    }

    /// Ready with the reason once the credential no longer admits; pending while it does (and
    /// wakes the task at the next check).
    pub fn poll_revoked(&mut self, cx: &mut Context<'_>) -> Poll<Status> {
        loop {
            if let Some(check) = self.pending.as_mut() {
                match check.as_mut().poll(cx) {
                    Poll::Ready(Ok(())) => self.pending = None,
                    Poll::Ready(Err(status)) => return Poll::Ready(status),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.every.poll_tick(cx).is_pending() {
                return Poll::Pending;
            }
            let (keys, token, attempts) = (
                Arc::clone(&self.keys),
                Arc::clone(&self.token),
                self.attempts.clone(),
            );
            self.pending = Some(Box::pin(async move {
                let caller = keys.authenticate(&token)?;
                match attempts {
                    Some(attempts) => check_attempt(attempts.as_ref(), &caller).await,
                    None => Ok(()),
                }
            }));
        }
    }
}

impl std::fmt::Debug for GuardedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedBody").finish_non_exhaustive()
    }
}

/// A gRPC response body that ends, with the reason in its trailers, once its caller's
/// credential no longer admits.
pub struct GuardedBody {
    inner: Body,
    guard: Revalidation,
    done: bool,
}

impl GuardedBody {
    /// Guards `inner` with `guard`.
    pub fn new(inner: Body, guard: Revalidation) -> GuardedBody {
        GuardedBody {
            inner,
            guard,
            done: false,
        }
    }
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(status) = self.guard.poll_revoked(cx) {
            self.done = true;
            tracing::debug!(code = ?status.code(), "a stream's credential no longer admits: ended");
            let mut trailers = http::HeaderMap::new();
            let _ = status.add_header(&mut trailers);
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
        }
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.done = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<S, F> std::fmt::Debug for GuardedStream<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream").finish_non_exhaustive()
    }
}

/// A stream that yields `last(reason)` and ends once its caller's credential no longer admits.
pub struct GuardedStream<S, F> {
    inner: S,
    guard: Revalidation,
    last: Option<F>,
}

impl<S, F> GuardedStream<S, F> {
    /// Guards `inner` with `guard`; `last` makes the item that says why it ended.
    pub fn new(inner: S, guard: Revalidation, last: F) -> GuardedStream<S, F> {
        GuardedStream {
            inner,
            guard,
            last: Some(last),
        }
    }
}

impl<S, F> Stream for GuardedStream<S, F>
where
    S: Stream + Unpin,
    F: FnOnce(Status) -> S::Item + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if self.last.is_none() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(status) = self.guard.poll_revoked(cx) {
            let last = self.last.take().expect("checked above");
            return Poll::Ready(Some(last(status)));
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl std::fmt::Debug for RecheckedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecheckedRequest").finish_non_exhaustive()
    }
}

/// A request body streamed by a client whose token is checked again for every frame: once it
/// no longer admits, the stream fails with the reason and nothing more of it is read.
pub struct RecheckedRequest {
    inner: Body,
    keys: Arc<Keys>,
    token: Arc<str>,
    /// The tokens' version the token was last found good at: it is checked again only when
    /// a token has been created or revoked since (a frame costs a read of the version).
    checked_at: Option<u64>,
}

impl RecheckedRequest {
    /// Checks `token` against `keys` for every frame of `inner`.
    pub fn new(inner: Body, keys: Arc<Keys>, token: &str) -> RecheckedRequest {
        let checked_at = keys.tokens_version();
        RecheckedRequest {
            inner,
            keys,
            token: Arc::from(token),
            checked_at,
        }
    }
}

impl http_body::Body for RecheckedRequest {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &frame {
            let version = self.keys.tokens_version();
            if version != self.checked_at {
                if let Err(status) = self.keys.authenticate(&self.token) {
                    return Poll::Ready(Some(Err(status)));
                }
                self.checked_at = version;
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether the method at `path` streams its replies (and so lives past its first check).
pub fn streams(path: &str) -> bool {
    matches!(
        path.rsplit('/').next(),
        Some("Watch" | "SubmitStream" | "WaitStream" | "Attach")
    )
}

/// Whether the client streams its requests to the method at `path`.
pub fn streams_requests(path: &str) -> bool {
    matches!(
        path.rsplit('/').next(),
        Some("SubmitStream" | "WaitStream" | "Attach")
    )
}
