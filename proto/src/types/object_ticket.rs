//! [`ObjectTicket`]: the head's signed permission to read or write named objects on one node's
//! data plane (docs/ARCHITECTURE.md "Objects").
//!
//! A ticket names the serving node, whether it reads (`Objects.Fetch`) or writes
//! (`Objects.Push`), the objects, their namespace and an expiry. It is an HMAC-SHA256 under
//! the node's ticket key ([`ticket_key`](super::ticket_key), the key of actor data tickets),
//! so the serving worker checks it with no round trip, and only the head (which keeps each
//! node's secret hash) and that node can make one. The text starts `o1.`, which no data ticket
//! does, so one kind of ticket is never taken for the other.

use std::fmt;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::{NodeId, ObjectId};

/// The most objects one ticket names (a task's arguments, a batch of puts).
pub const MAX_TICKET_OBJECTS: usize = 4096;

/// What a ticket lets its bearer do to its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectAccess {
    /// Fetch their bytes.
    Read,
    /// Push their bytes into the node's store (each object once).
    Write,
}

impl ObjectAccess {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectAccess::Read => "read",
            ObjectAccess::Write => "write",
        }
    }

    fn letter(self) -> &'static str {
        match self {
            ObjectAccess::Read => "r",
            ObjectAccess::Write => "w",
        }
    }
}

impl fmt::Display for ObjectAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object ticket's contents. Written
/// `o1.<node>.<r|w>.<expiry_ms>.<owner>:<index>,...<mac>[.<namespace>]`, the mac an
/// HMAC-SHA256 over the rest under the serving node's ticket key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectTicket {
    /// The node whose data plane serves the objects.
    pub node: NodeId,
    /// Read or write.
    pub access: ObjectAccess,
    /// The objects (at least one, at most [`MAX_TICKET_OBJECTS`]).
    pub objects: Vec<ObjectId>,
    /// Valid until (milliseconds since the Unix epoch, the head's clock).
    pub expiry_ms: u64,
    /// The objects' namespace (`None`: an admin's objects).
    pub namespace: Option<String>,
}

/// Why a verified ticket does not allow what a request asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketRefusal {
    /// The ticket is not signed with this node's key, or was changed.
    #[error(
        "the object ticket is not valid on this node (signed for another node, or changed); \
         ask the head for a fresh one"
    )]
    Invalid,
    /// Signed for another node (a key shared by mistake would let it verify).
    #[error("the object ticket is for node {ticket}, not this node {this}")]
    OtherNode {
        /// The node the ticket names.
        ticket: NodeId,
        /// This node.
        this: NodeId,
    },
    /// The object is not among those the ticket names.
    #[error("the object ticket does not name object {0}")]
    OtherObject(ObjectId),
    /// The ticket reads and the request writes, or the other way round.
    #[error("the object ticket grants {granted} access, and this asks to {wanted} object {id}")]
    Access {
        /// The object.
        id: ObjectId,
        /// What the ticket grants.
        granted: ObjectAccess,
        /// What the request does.
        wanted: ObjectAccess,
    },
    /// Past its expiry.
    #[error(
        "the object ticket for object {id} expired at {expiry_ms} ms (now {now_ms}); ask the \
         head for a fresh one"
    )]
    Expired {
        /// The object.
        id: ObjectId,
        /// The ticket's expiry.
        expiry_ms: u64,
        /// The serving node's clock.
        now_ms: u64,
    },
    /// The object belongs to another namespace than the ticket's.
    #[error("object {id} is not in the object ticket's namespace {ticket}")]
    OtherNamespace {
        /// The object.
        id: ObjectId,
        /// The ticket's namespace (`-` for none).
        ticket: String,
    },
}

impl ObjectTicket {
    fn body(&self) -> String {
        let ids: Vec<String> = self
            .objects
            .iter()
            .map(|id| format!("{}:{}", id.owner(), id.index()))
            .collect();
        format!(
            "o1.{}.{}.{}.{}",
            self.node.0,
            self.access.letter(),
            self.expiry_ms,
            ids.join(",")
        )
    }

    fn mac(&self, key: &[u8; 32]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as hmac::Mac>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(self.body().as_bytes());
        mac.update(b".");
        mac.update(self.namespace.as_deref().unwrap_or("").as_bytes());
        mac
    }

    /// The ticket as text, signed with `key` (the serving node's
    /// [`ticket_key`](super::ticket_key)).
    pub fn sign(&self, key: &[u8; 32]) -> String {
        let code = hex::encode(self.mac(key).finalize().into_bytes());
        let mut text = format!("{}.{code}", self.body());
        if let Some(ns) = &self.namespace {
            text.push('.');
            text.push_str(ns);
        }
        text
    }

    /// Reads `text` and checks its signature under `key`; `None` when it is not an object
    /// ticket this key signed. What it allows is [`ObjectTicket::allows`]'s to check.
    pub fn verify(text: &str, key: &[u8; 32]) -> Option<ObjectTicket> {
        let mut parts = text.splitn(7, '.');
        if parts.next()? != "o1" {
            return None;
        }
        let node = NodeId(parts.next()?.parse().ok()?);
        let access = match parts.next()? {
            "r" => ObjectAccess::Read,
            "w" => ObjectAccess::Write,
            _ => return None,
        };
        let expiry_ms = parts.next()?.parse().ok()?;
        let objects = parts
            .next()?
            .split(',')
            .map(|id| {
                let (owner, index) = id.split_once(':')?;
                Some(ObjectId(owner.parse().ok()?, index.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        if objects.is_empty() || objects.len() > MAX_TICKET_OBJECTS {
            return None;
        }
        let code = hex::decode(parts.next()?).ok()?;
        let namespace = parts.next().map(str::to_owned);
        let ticket = ObjectTicket {
            node,
            access,
            objects,
            expiry_ms,
            namespace,
        };
        ticket.mac(key).verify_slice(&code).ok()?;
        Some(ticket)
    }

    /// Whether this ticket lets its bearer do `access` to object `id` on node `this` at
    /// `now_ms`, or why not.
    pub fn allows(
        &self,
        this: NodeId,
        id: ObjectId,
        access: ObjectAccess,
        now_ms: u64,
    ) -> Result<(), TicketRefusal> {
        if self.node != this {
            return Err(TicketRefusal::OtherNode {
                ticket: self.node,
                this,
            });
        }
        if !self.objects.contains(&id) {
            return Err(TicketRefusal::OtherObject(id));
        }
        if self.access != access {
            return Err(TicketRefusal::Access {
                id,
                granted: self.access,
                wanted: access,
            });
        }
        if self.expiry_ms < now_ms {
            return Err(TicketRefusal::Expired {
                id,
                expiry_ms: self.expiry_ms,
                now_ms,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ticket_key;
    use super::*;

    fn ticket() -> ObjectTicket {
        ObjectTicket {
            node: NodeId(3),
            access: ObjectAccess::Read,
            objects: vec![ObjectId(41, 0), ObjectId(41, 1)],
            expiry_ms: 1_800_000_000_000,
            namespace: Some("team.a".into()),
        }
    }

    #[test]
    fn a_ticket_verifies_under_its_key_only() {
        let key = ticket_key(&[7; 32]);
        let text = ticket().sign(&key);
        assert!(
            text.starts_with("o1.3.r.1800000000000.41:0,41:1."),
            "{text}"
        );
        assert_eq!(ObjectTicket::verify(&text, &key), Some(ticket()));
        assert_eq!(ObjectTicket::verify(&text, &ticket_key(&[8; 32])), None);
        let admin = ObjectTicket {
            namespace: None,
            ..ticket()
        };
        assert_eq!(
            ObjectTicket::verify(&admin.sign(&key), &key),
            Some(admin.clone())
        );
    }

    #[test]
    fn a_changed_ticket_does_not_verify() {
        let key = ticket_key(&[7; 32]);
        let text = ticket().sign(&key);
        for forged in [
            text.replacen("41:1", "41:2", 1),
            text.replacen(".r.", ".w.", 1),
            text.replacen("o1.3.", "o1.4.", 1),
            text.replacen("1800000000000", "1900000000000", 1),
            text.replace("team.a", "team.b"),
            text.trim_end_matches(".team.a").to_string(),
            text.replacen("o1.", "v1.", 1),
            format!("{text}x"),
            String::new(),
        ] {
            assert_eq!(ObjectTicket::verify(&forged, &key), None, "{forged}");
        }
    }

    #[test]
    fn allows_says_what_is_wrong() {
        let t = ticket();
        let now = 1_700_000_000_000;
        let read = ObjectAccess::Read;
        assert_eq!(t.allows(NodeId(3), ObjectId(41, 1), read, now), Ok(()));
        let refusals = [
            t.allows(NodeId(4), ObjectId(41, 1), read, now),
            t.allows(NodeId(3), ObjectId(42, 0), read, now),
            t.allows(NodeId(3), ObjectId(41, 0), ObjectAccess::Write, now),
            t.allows(NodeId(3), ObjectId(41, 0), read, 1_900_000_000_000),
        ];
        let words = [
            "node 3, not this node 4",
            "object 42.0",
            "grants read",
            "expired",
        ];
        for (refusal, word) in refusals.iter().zip(words) {
            let e = refusal.clone().unwrap_err().to_string();
            assert!(e.contains(word), "{e} lacks {word}");
        }
    }
}
