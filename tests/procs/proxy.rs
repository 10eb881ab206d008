//! [`Proxy`]: a fault-injecting TCP proxy on loopback, owned by a test: it forwards every
//! connection to one target, and on command refuses and cuts connections (a network
//! partition) or drops the next bytes the target sends back and cuts that connection (a reply
//! lost on the way).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct Control {
    blocked: AtomicBool,
    /// How many of the next replies to drop.
    drop_replies: AtomicU64,
    dropped_replies: AtomicU64,
    /// Cancelled to cut every live connection.
    epoch: Mutex<CancellationToken>,
}

/// A TCP proxy to one target. Stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.control.epoch.lock().unwrap().cancel();
    }
}

impl Proxy {
    /// A proxy on a fresh loopback port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let addr = listener.local_addr().expect("the proxy's address");
        let control = Arc::new(Control::default());
        let accepting = Arc::clone(&control);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accepting.blocked.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let cut = accepting.epoch.lock().unwrap().clone();
                tokio::spawn(relay(client, target, cut, Arc::clone(&accepting)));
            }
        });
        Proxy {
            addr,
            control,
            task,
        }
    }

    /// The address clients connect to (`HOST:PORT`).
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Cuts every connection and refuses new ones (`true`), or lets them through again.
    pub fn block(&self, blocked: bool) {
        self.control.blocked.store(blocked, Ordering::SeqCst);
        if blocked {
            let mut epoch = self.control.epoch.lock().unwrap();
            epoch.cancel();
            *epoch = CancellationToken::new();
        }
    }

    /// Drops the next bytes the target sends back (a reply) and cuts that connection.
    pub fn drop_next_reply(&self) {
        self.drop_replies(1);
    }

    /// Drops the next `n` replies, each on its connection, and cuts each of those connections.
    pub fn drop_replies(&self, n: u64) {
        self.control.drop_replies.store(n, Ordering::SeqCst);
    }

    /// How many replies were dropped so far.
    pub fn dropped_replies(&self) -> u64 {
        self.control.dropped_replies.load(Ordering::SeqCst)
    }
}

async fn relay(
    client: TcpStream,
    target: SocketAddr,
    cut: CancellationToken,
    control: Arc<Control>,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client_rd.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    if server_wr.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match server_rd.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    let dropping = control
                        .drop_replies
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if dropping {
                        control.dropped_replies.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    if client_wr.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    };
    tokio::select! {
        () = cut.cancelled() => {}
        () = up => {}
        () = down => {}
    }
}
