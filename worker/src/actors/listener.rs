//! [`DataPlane`]: the worker's own listener, where callers reach the actors it hosts and the
//! objects it holds (`Objects`, `objects/service.rs`) with no head on the way (docs/ARCHITECTURE.md "The path of a
//! call").
//!
//! Where it listens: `--data-listen HOST:PORT` when given; otherwise on loopback when every
//! head replica is on loopback (one machine: the quickstart, `LocalCluster`, the tests), and
//! else on every interface, advertised at the address this machine reaches its first head
//! replica from (found by a UDP `connect`, which sends nothing). The advertised `HOST:PORT`
//! is published as the node label [`DATA_ADDRESS_LABEL`](escher_proto::types::DATA_ADDRESS_LABEL),
//! where the head reads it when it resolves an actor.
//!
//! Every call is authenticated by a data ticket (`service.rs`). The data plane speaks plain
//! HTTP/2: off loopback the tickets keep strangers out, but the bytes of calls are not
//! encrypted; the worker says so at start and in the label `escher.data-plane`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;

use escher_proto::data_channel::MAX_FRAME_BYTES;
use escher_proto::transfer::{CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};
use escher_proto::wire::actors_server::ActorsServer;
use tokio_util::sync::CancellationToken;

use super::{ActorHost, ActorService};
use crate::head_conn::split_heads;
use crate::objects::ObjectService;

/// The label that says how the data plane carries bytes (`loopback` or `plaintext`).
pub const DATA_PLANE_LABEL: &str = "escher.data-plane";

/// The largest message on the data plane (a call's arguments or result), above gRPC's 4 MiB.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// A bound data-plane listener and the address callers reach it at.
#[derive(Debug)]
pub(crate) struct DataPlane {
    listener: tokio::net::TcpListener,
    advertised: String,
    loopback: bool,
}

impl DataPlane {
    /// Binds `listen`, or the default for a worker of the head replicas `heads`.
    pub(crate) async fn bind(
        listen: Option<SocketAddr>,
        heads: &str,
    ) -> std::io::Result<DataPlane> {
        let local = heads_on_loopback(heads);
        let bind = listen.unwrap_or(if local {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
        });
        let listener = tokio::net::TcpListener::bind(bind).await?;
        let port = listener.local_addr()?.port();
        let host = if bind.ip().is_unspecified() {
            route_to(heads).unwrap_or(bind.ip())
        } else {
            bind.ip()
        };
        let advertised = SocketAddr::new(host, port).to_string();
        Ok(DataPlane {
            listener,
            advertised,
            loopback: host.is_loopback(),
        })
    }

    /// `HOST:PORT`, as callers reach it.
    pub(crate) fn advertised(&self) -> &str {
        &self.advertised
    }

    /// What [`DATA_PLANE_LABEL`] says.
    pub(crate) fn transport(&self) -> &'static str {
        if self.loopback {
            "loopback"
        } else {
            "plaintext"
        }
    }

    /// Serves the actors of `host` and the objects of `objects` until `stop` is cancelled.
    pub(crate) fn serve(
        self,
        host: Arc<ActorHost>,
        objects: crate::objects::NodeObjects,
        stop: CancellationToken,
    ) {
        if !self.loopback {
            tracing::warn!(
                address = %self.advertised,
                "the data plane (actor calls) listens off loopback without TLS: calls are \
                 authenticated by the head's tickets but their bytes are not encrypted"
            );
        }
        let service = ActorService::new(Arc::clone(&host)).with_objects(objects.clone());
        let objects = ObjectService::new(objects, Arc::clone(&host))
            .with_stop(stop.clone())
            .into_server();
        let service = ActorsServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(self.listener);
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                // Object chunks: a window of 64 KiB (HTTP/2's default) would stall each
                // stream every 64 KiB for a round trip.
                .initial_stream_window_size(STREAM_WINDOW_BYTES)
                .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                // A push's chunks in large frames, as a fetch's (escher_proto::data_channel).
                .max_frame_size(MAX_FRAME_BYTES)
                .add_service(service)
                .add_service(objects)
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the data plane stopped");
            }
        });
    }
}

/// Whether every replica in `heads` is on loopback.
fn heads_on_loopback(heads: &str) -> bool {
    split_heads(heads).all(|url| {
        let host = host_of(url);
        host == "localhost"
            || host
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// The host part of `scheme://host:port/...`.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// The local address this machine reaches the first head replica from.
fn route_to(heads: &str) -> Option<IpAddr> {
    let url = split_heads(heads).next()?;
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let target = authority.to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_heads_are_told_apart() {
        assert!(heads_on_loopback("http://127.0.0.1:7600"));
        assert!(heads_on_loopback(
            "http://localhost:7600,https://127.0.0.2:7601"
        ));
        assert!(heads_on_loopback("http://[::1]:7600"));
        assert!(!heads_on_loopback(
            "http://127.0.0.1:7600,https://10.0.0.3:7600"
        ));
        assert!(!heads_on_loopback("https://head.example:7600"));
    }

    #[tokio::test]
    async fn a_loopback_cluster_gets_a_loopback_data_plane() {
        let plane = DataPlane::bind(None, "http://127.0.0.1:7600")
            .await
            .unwrap();
        assert!(plane.advertised().starts_with("127.0.0.1:"));
        assert_eq!(plane.transport(), "loopback");
    }
}
