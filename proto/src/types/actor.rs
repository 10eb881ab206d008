//! Actors (docs/DESIGN.md §17, docs/ARCHITECTURE.md "Actors and objects"): a task of a fourth
//! kind that holds its resources from start to exit and answers method calls.
//!
//! An actor *is* its task: the actor's id is the task's id, each incarnation is an attempt,
//! and a restart is a retry (`max_restarts` is the task's `max_retries`), so the leases and the
//! fencing that keep a task run-once keep an actor single. What is an actor's own:
//! - [`ActorSpec`]: the class a worker registered, the constructor's argument bytes, how many
//!   calls may run at once, an optional name, its lifetime and how often a call is tried again;
//! - [`ActorView`]: what `ResolveActor` answers, the incarnation that serves now and a data
//!   ticket for calling it;
//! - [`DataTicket`]: the head's signed permission to call one incarnation of one actor, checked
//!   by the hosting worker with no round trip.
//!
//! Method calls themselves are not durable (as in Ray): they go from the caller to the hosting
//! worker's listener and are answered by the actor.

use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{NodeId, TaskId, TaskState};

/// The label a worker publishes with its data-plane address (`HOST:PORT` of its listener for
/// actor calls), read by the head when it resolves an actor.
pub const DATA_ADDRESS_LABEL: &str = "escher.data-address";

/// The built-in actor class every worker hosts for an inference service's replica on a GPU
/// slice (the worker's `actors/serving.rs` says what it answers).
pub const SERVING_REPLICA_CLASS: &str = "escher.serving-replica";

/// What a replica of the built-in class [`SERVING_REPLICA_CLASS`] says of itself (its `info`
/// method).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// The id of the service's task it serves (for OLTunes' servers, the OLTunes task's
    /// number).
    pub service: u64,
    /// The GPU devices (`MIG-…` or `GPU-…` UUIDs) it was given.
    pub devices: Vec<String>,
    /// Requests it served.
    pub served: f64,
}

/// The built-in actor class every worker hosts for a retraining job on a GPU slice (the
/// worker's `actors/trainer.rs` says what it answers; its argument and answer are
/// `mig::TrainerArgs` and `mig::TrainerProgress`).
pub const TRAINER_CLASS: &str = "escher.trainer";

/// The built-in actor class every worker hosts for micro-profiling retraining configurations
/// on a GPU slice (the worker's `actors/profiler.rs` says what it answers; its method's
/// argument and answer are `mig::ProfileRun` and `mig::ProfileMeasured`).
pub const PROFILER_CLASS: &str = "escher.profiler";

/// The most calls one actor may run at once.
pub const MAX_CONCURRENCY: u32 = 1024;

/// The task label the head gives every actor: its class (`escher tasks --label escher.actor`
/// and `escher actors` list actors by it).
pub const ACTOR_LABEL: &str = "escher.actor";

/// The longest actor name, in bytes.
pub const MAX_ACTOR_NAME_BYTES: usize = 256;

/// How long a data ticket is valid, in milliseconds.
pub const TICKET_MILLIS: u64 = 10 * 60 * 1000;

/// How long an actor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Lifetime {
    /// Until the last handle of its creator is dropped, or it is killed.
    #[default]
    Owned,
    /// Until it is killed (`kill`), whatever happens to its creator.
    Detached,
}

impl Lifetime {
    /// `owned` or `detached`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifetime::Owned => "owned",
            Lifetime::Detached => "detached",
        }
    }
}

/// What an actor is, beside what every task has (resources, labels, hooks, retries).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorSpec {
    /// The class, as a worker registered it (a Rust type's name, or the built-in Python class
    /// host).
    pub class: String,
    /// The constructor's argument bytes (bincode for Rust types).
    pub args: Bytes,
    /// How many calls may run at once (1: one after another, in the order sent).
    pub max_concurrency: u32,
    /// How many times a call in flight when its incarnation died is sent to the next one.
    pub max_task_retries: u32,
    /// A name, unique among the live actors of its namespace.
    pub name: Option<String>,
    /// How long it lives.
    pub lifetime: Lifetime,
}

impl ActorSpec {
    /// What is wrong with this spec, if anything, in words a caller can act on.
    pub fn problem(&self) -> Option<String> {
        if self.max_concurrency == 0 || self.max_concurrency > MAX_CONCURRENCY {
            return Some(format!(
                "max_concurrency must be 1 to {MAX_CONCURRENCY}, not {}",
                self.max_concurrency
            ));
        }
        if let Some(name) = &self.name
            && (name.is_empty()
                || name.len() > MAX_ACTOR_NAME_BYTES
                || name.chars().any(char::is_control))
        {
            return Some(format!(
                "an actor name is 1 to {MAX_ACTOR_NAME_BYTES} bytes with no control characters, \
                 not {name:?}"
            ));
        }
        if self.class.is_empty() {
            return Some("an actor needs a class".to_string());
        }
        None
    }
}

/// Where an actor is, as `ResolveActor` answers.
#[derive(Debug, Clone, PartialEq)]
pub struct ActorView {
    /// The actor's id (its task's id).
    pub id: TaskId,
    /// Its task's state: pending (placing or restarting), running (alive), or ended.
    pub state: TaskState,
    /// The incarnation (its task's attempt, from 1; 0 before the first is placed).
    pub incarnation: u32,
    /// The node that hosts the incarnation.
    pub node: Option<NodeId>,
    /// That node's data-plane address, `HOST:PORT`.
    pub address: Option<String>,
    /// Permission to call this incarnation, while it runs.
    pub ticket: Option<String>,
    /// Why it is pending, or why it ended.
    pub reason: Option<String>,
    /// How many calls in flight may be sent again to a later incarnation.
    pub max_task_retries: u32,
    /// The largest number of calls it runs at once.
    pub max_concurrency: u32,
    /// How many calls wait at the serving incarnation (queued or running), as its worker's last
    /// heartbeat to the leader said; `None` when the replica that answered has not heard it
    /// (a follower, a leader in its first heartbeat after a failover, an actor not running).
    /// Calls go from callers to the actor's worker, never through the head, so this is a
    /// figure a heartbeat old, not a count the head keeps.
    pub pending_calls: Option<u64>,
}

/// How many calls wait at one actor incarnation a worker hosts, as its heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorLoad {
    /// The actor (its task's id).
    pub actor: TaskId,
    /// The incarnation.
    pub incarnation: u32,
    /// Calls received and not answered yet (queued or running).
    pub pending: u64,
}

/// A data ticket's contents: which incarnation of which actor, for which namespace, until
/// when. Written `v1.<node>.<actor>.<incarnation>.<expiry_ms>.<mac>[.<namespace>]`, the mac an
/// HMAC-SHA256 over the rest under the hosting node's ticket key ([`ticket_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataTicket {
    /// The hosting node.
    pub node: NodeId,
    /// The actor.
    pub actor: TaskId,
    /// Its incarnation.
    pub incarnation: u32,
    /// Valid until (milliseconds since the Unix epoch, the head's clock).
    pub expiry_ms: u64,
    /// The namespace of the actor (`None`: an admin's actor).
    pub namespace: Option<String>,
}

/// The key that signs one node's data tickets: derived from the SHA-256 of the node's secret,
/// which every replica of the head keeps (the state holds only that hash) and the worker can
/// compute from the secret it was given. Nobody else has either.
pub fn ticket_key(secret_sha256: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"escher data tickets v1\0");
    h.update(secret_sha256);
    h.finalize().into()
}

impl DataTicket {
    fn mac(&self, key: &[u8; 32]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as hmac::Mac>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        let text = format!(
            "v1.{}.{}.{}.{}.{}",
            self.node.0,
            self.actor.0,
            self.incarnation,
            self.expiry_ms,
            self.namespace.as_deref().unwrap_or("")
        );
        mac.update(text.as_bytes());
        mac
    }

    /// The ticket as text, signed with `key`.
    pub fn sign(&self, key: &[u8; 32]) -> String {
        let code = hex::encode(self.mac(key).finalize().into_bytes());
        let mut text = format!(
            "v1.{}.{}.{}.{}.{code}",
            self.node.0, self.actor.0, self.incarnation, self.expiry_ms
        );
        if let Some(ns) = &self.namespace {
            text.push('.');
            text.push_str(ns);
        }
        text
    }

    /// Reads `text` and checks its signature under `key`; `None` when it is not a ticket this
    /// key signed. Expiry and which incarnation it names are the caller's to check.
    pub fn verify(text: &str, key: &[u8; 32]) -> Option<DataTicket> {
        let mut parts = text.splitn(7, '.');
        if parts.next()? != "v1" {
            return None;
        }
        let node = NodeId(parts.next()?.parse().ok()?);
        let actor = TaskId(parts.next()?.parse().ok()?);
        let incarnation = parts.next()?.parse().ok()?;
        let expiry_ms = parts.next()?.parse().ok()?;
        let code = hex::decode(parts.next()?).ok()?;
        let namespace = parts.next().map(str::to_owned);
        let ticket = DataTicket {
            node,
            actor,
            incarnation,
            expiry_ms,
            namespace,
        };
        ticket.mac(key).verify_slice(&code).ok()?;
        Some(ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket() -> DataTicket {
        DataTicket {
            node: NodeId(3),
            actor: TaskId(41),
            incarnation: 2,
            expiry_ms: 1_800_000_000_000,
            namespace: Some("team-a".into()),
        }
    }

    #[test]
    fn a_ticket_verifies_under_its_key_only() {
        let key = ticket_key(&[7; 32]);
        let text = ticket().sign(&key);
        assert_eq!(DataTicket::verify(&text, &key), Some(ticket()));
        assert_eq!(DataTicket::verify(&text, &ticket_key(&[8; 32])), None);
    }

    #[test]
    fn a_changed_ticket_does_not_verify() {
        let key = ticket_key(&[7; 32]);
        let text = ticket().sign(&key);
        for forged in [
            text.replacen(".41.", ".42.", 1),
            text.replacen(".2.", ".3.", 1),
            text.replace("team-a", "team-b"),
            text.trim_end_matches(".team-a").to_string(),
            format!("{text}x"),
        ] {
            assert_eq!(DataTicket::verify(&forged, &key), None, "{forged}");
        }
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let mut spec = ActorSpec {
            class: "Counter".into(),
            args: Bytes::new(),
            max_concurrency: 1,
            max_task_retries: 0,
            name: None,
            lifetime: Lifetime::Owned,
        };
        assert_eq!(spec.problem(), None);
        spec.max_concurrency = 0;
        assert!(
            spec.problem()
                .unwrap()
                .contains("max_concurrency must be 1")
        );
        spec.max_concurrency = 1;
        spec.name = Some(String::new());
        assert!(spec.problem().unwrap().contains("actor name"));
    }
}
