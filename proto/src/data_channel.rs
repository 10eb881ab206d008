//! The channel an object transfer is fetched or pushed on: one HTTP/2 connection to a
//! worker's data plane, made with hyper's client directly rather than tonic's `Endpoint`, so
//! that it can advertise large frames (docs/ARCHITECTURE.md "Objects", "Fetch").
//!
//! A tonic `Endpoint` leaves hyper's `SETTINGS_MAX_FRAME_SIZE` at HTTP/2's 16 KiB, which makes
//! the holder cut a 1 MiB chunk into 64 DATA frames, each its own write and read on the
//! socket. [`connect`] builds the same HTTP/2 client with [`MAX_FRAME_BYTES`] frames and the
//! transfer windows of [`crate::transfer`]; [`DataChannel`] is a `tower::Service` that tonic's
//! generated clients take in place of a `Channel` (with the origin set by `with_origin`).
//! Everything gRPC guarantees (status codes, message limits, a stream broken off) is tonic's
//! as before: only the connection underneath is built here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tonic::body::Body;

use crate::transfer::{CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};

/// The largest HTTP/2 frame a data-plane peer is asked to send (`SETTINGS_MAX_FRAME_SIZE`):
/// HTTP/2's largest, 16 MiB - 1, so that a chunk crosses in one or two frames.
pub const MAX_FRAME_BYTES: u32 = (1 << 24) - 1;

/// How much of a stream's body hyper buffers ahead of the socket on the sending side.
pub const MAX_SEND_BUFFER_BYTES: usize = 8 << 20;

/// Why a data-plane connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No TCP connection within the time given.
    #[error("no connection to {address} within {timeout:?}")]
    Timeout {
        /// The address.
        address: String,
        /// The time given.
        timeout: Duration,
    },
    /// The TCP connection was refused or failed.
    #[error("cannot connect to {address}: {source}")]
    Tcp {
        /// The address.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP/2 handshake failed.
    #[error("the HTTP/2 handshake with {address} failed: {why}")]
    Handshake {
        /// The address.
        address: String,
        /// Why (hyper's error and its causes).
        why: String,
    },
    /// The address is not `HOST:PORT`.
    #[error("bad data-plane address {address:?}: {why}")]
    Address {
        /// The address.
        address: String,
        /// Why.
        why: String,
    },
}

/// One HTTP/2 connection to a data plane, as a service for tonic's generated clients; see
/// the module doc. Clones share the connection, which closes when the last is dropped.
#[derive(Debug, Clone)]
pub struct DataChannel {
    send: SendRequest<Body>,
    origin: http::Uri,
}

impl DataChannel {
    /// The `http://HOST:PORT` origin to give the generated client's `with_origin`.
    pub fn origin(&self) -> http::Uri {
        self.origin.clone()
    }
}

/// Connects to the data plane at `address` (`HOST:PORT`) within `timeout`, with no delay on
/// the socket, large frames and the transfer windows.
pub async fn connect(address: &str, timeout: Duration) -> Result<DataChannel, ConnectError> {
    let origin: http::Uri =
        format!("http://{address}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| ConnectError::Address {
                address: address.to_string(),
                why: e.to_string(),
            })?;
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(source)) => {
            return Err(ConnectError::Tcp {
                address: address.to_string(),
                source,
            });
        }
        Err(_) => {
            return Err(ConnectError::Timeout {
                address: address.to_string(),
                timeout,
            });
        }
    };
    tcp.set_nodelay(true).map_err(|source| ConnectError::Tcp {
        address: address.to_string(),
        source,
    })?;
    let handshake = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .max_send_buf_size(MAX_SEND_BUFFER_BYTES)
        .handshake(TokioIo::new(tcp));
    let (send, connection) = match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(made)) => made,
        Ok(Err(e)) => {
            return Err(ConnectError::Handshake {
                address: address.to_string(),
                why: chain(&e),
            });
        }
        Err(_) => {
            return Err(ConnectError::Timeout {
                address: address.to_string(),
                timeout,
            });
        }
    };
    let peer = address.to_string();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(address = %peer, error = %e, "a data-plane connection ended");
        }
    });
    Ok(DataChannel { send, origin })
}

/// `e` and its causes, one after another.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl tower::Service<http::Request<Body>> for DataChannel {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(self.send.send_request(request))
    }
}
