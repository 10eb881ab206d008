//! [`KeyIssuer`]: the idempotency keys of one client (docs/DESIGN.md §7): its id, a sequence number
//! per write, and the lowest sequence number whose write is still unanswered.
//!
//! A write holds its [`Ticket`] for as long as it may be retried (every retry sends the same
//! key) and drops it once answered or abandoned; the head may then forget that write's reply.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::RequestKey;

#[derive(Debug)]
struct Issued {
    next: u64,
    open: BTreeSet<u64>,
}

/// Issues one client's keys. Cheap to clone; clones share the sequence.
#[derive(Debug, Clone)]
pub struct KeyIssuer {
    client: u64,
    issued: Arc<Mutex<Issued>>,
}

/// The key of one write, held while the write may be retried.
#[derive(Debug)]
pub struct Ticket {
    key: RequestKey,
    issued: Arc<Mutex<Issued>>,
}

impl KeyIssuer {
    /// Keys for client `client` (a random, non-zero number: zero is replaced by one).
    pub fn new(client: u64) -> KeyIssuer {
        KeyIssuer {
            client: client.max(1),
            issued: Arc::new(Mutex::new(Issued {
                next: 1,
                open: BTreeSet::new(),
            })),
        }
    }

    /// The client id.
    pub fn client(&self) -> u64 {
        self.client
    }

    /// The key of a new write.
    pub fn issue(&self) -> Ticket {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        let seq = issued.next;
        issued.next += 1;
        issued.open.insert(seq);
        let first_incomplete = issued.open.first().copied().unwrap_or(seq);
        Ticket {
            key: RequestKey {
                client: self.client,
                seq,
                first_incomplete,
            },
            issued: Arc::clone(&self.issued),
        }
    }
}

impl Ticket {
    /// The key to send, the same on every retry.
    pub fn key(&self) -> RequestKey {
        self.key
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        issued.open.remove(&self.key.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_incomplete_follows_the_oldest_open_write() {
        let keys = KeyIssuer::new(9);
        let a = keys.issue();
        let b = keys.issue();
        assert_eq!((a.key().seq, b.key().seq), (1, 2));
        assert_eq!(b.key().first_incomplete, 1);
        drop(a);
        let c = keys.issue();
        assert_eq!(c.key().first_incomplete, 2);
        drop(b);
        drop(c);
        let d = keys.issue();
        assert_eq!((d.key().seq, d.key().first_incomplete), (4, 4));
        assert_eq!(d.key().client, 9);
        assert_eq!(KeyIssuer::new(0).client(), 1);
    }
}
