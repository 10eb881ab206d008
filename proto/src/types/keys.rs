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

impl KeyIssuer {
    /// Keys that continue from the write `text` names (`CLIENT-SEQ`, as [`key_text`] writes
    /// it): the next write is sent under that very key, so that a write whose outcome was
    /// unknown can be retried by another process and applied at most once.
    pub fn resuming(text: &str) -> Result<KeyIssuer, String> {
        let bad = || {
            format!(
                "{text:?} is not an idempotency key: expected CLIENT-SEQ, a hexadecimal client \
                 id and a decimal sequence number, as an \"unknown outcome\" error prints it"
            )
        };
        let (client, seq) = text.trim().split_once('-').ok_or_else(bad)?;
        let client = u64::from_str_radix(client, 16).map_err(|_| bad())?;
        let seq: u64 = seq.parse().map_err(|_| bad())?;
        if client == 0 || seq == 0 {
            return Err(bad());
        }
        Ok(KeyIssuer {
            client,
            issued: Arc::new(Mutex::new(Issued {
                next: seq,
                open: BTreeSet::new(),
            })),
        })
    }
}

/// A write's key as a person passes it on: `CLIENT-SEQ` (the client id in hexadecimal).
pub fn key_text(key: RequestKey) -> String {
    format!("{:x}-{}", key.client, key.seq)
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
    fn a_printed_key_resumes_as_the_same_key() {
        let keys = KeyIssuer::new(0xabc);
        let _first = keys.issue();
        let second = keys.issue();
        let text = key_text(second.key());
        assert_eq!(text, "abc-2");
        let again = KeyIssuer::resuming(&text).unwrap().issue();
        assert_eq!(again.key().client, second.key().client);
        assert_eq!(again.key().seq, second.key().seq);
        for bad in ["", "abc", "0-1", "abc-0", "xyz-1", "abc-1-2", "-1"] {
            let err = KeyIssuer::resuming(bad).unwrap_err();
            assert!(err.contains("CLIENT-SEQ"), "{bad}: {err}");
        }
    }

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
