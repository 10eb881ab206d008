//! Replication: the head's state as a raft group (docs/DESIGN.md §7).
//!
//! The layering (docs/STYLE.md §20) is runtime → replication → state → scheduler. The runtime's
//! owner task holds one `Replica` (`replica.rs`); the replica holds the raft node (TiKV's raft-rs)
//! and the [`ClusterState`](crate::state::ClusterState), and is the only code that knows raft
//! exists. The state machine stays what it was: a deterministic `apply(Entry)`.
//!
//! # One path for every deployment
//!
//! A head is always one replica of a raft group. Without `--peers` it is a group of one,
//! which elects itself at once; with `--data-dir` its log is a [`DiskLog`], without it the
//! log lives in memory ([`MemLog`]) and the head says so at start. `LocalCluster`, the tests and the quickstart go through exactly the
//! code a three-replica durable group runs.
//!
//! # The ready loop (`Replica::cycle`)
//!
//! The owner drains its whole inbox per wake-up (client writes become proposals, peers'
//! messages are stepped, reads are batched under one ReadIndex), then runs one cycle:
//!
//! 1. the leader's `messages` (appends, heartbeats) are sent at once, in parallel with its own
//!    write, as raft allows;
//! 2. a received snapshot, the new entries and the hard state are written and synced together:
//!    one fsync for everything proposed since the last cycle (group commit);
//! 3. only then are the `persisted_messages` (votes, append responses) sent;
//! 4. the snapshot, if any, replaces the state; committed entries are applied in order; each
//!    applied entry's reply and effects go back to the runtime, which answers the proposal
//!    waiting at that (index, term), and, on the leader only, performs the effects;
//! 5. the commit index learned by `advance` is written with the next sync, and snapshots are
//!    taken only at an applied index no higher than the durable commit index, so a restarted
//!    replica never finds its applied index above its commit index.
//!
//! The cycle's writes run on the owner task for the in-memory log, and on tokio's blocking
//! pool (awaited) for a disk log: fsync never stalls a runtime thread and no multi-thread
//! runtime is needed. While a cycle awaits its fsync the owner takes no new messages; they
//! queue in its inbox and become the next cycle's batch, which is what makes group commit
//! work. (raft-rs's asynchronous ready, which lets the leader go on proposing during the
//! fsync, would overlap the next batch's proposals with this one's write; the measurement in
//! BENCHMARKS.md (W9) shows where the synchronous cycle stands.)
//!
//! # Proposals and replies
//!
//! A write becomes `Entry { now, command, key }`; every write the owner takes in one turn goes
//! into one raft entry (a batch, bincode, `codec.rs`), applied in order. Each caller's reply
//! waits under the (index, term) raft gives the batch and its position in it, and is answered
//! when that entry is applied. One raft entry per command, the obvious design, was measured
//! first: with it a durable head ran W9 (the W1 shape) at 2,383 tasks/s; with one entry per
//! turn, 10,109 (`escher-bench w9 --size small`, the same machine, the same hour), because the
//! log writes one record per turn instead of one per task start and end. The leader also
//! applies its own batches from what it proposed instead of decoding them; followers decode. If the entry at that index turns out to have another term (a new leader
//! overwrote it), or this replica stops leading first, the caller gets a retryable "not
//! leader": with the idempotency key, its retry is answered with the recorded reply if the
//! write did commit after all (`state/sessions.rs`).
//!
//! # Membership and snapshots
//!
//! A new group's replicas all write the same snapshot at index 1 (the empty state, the
//! replicas' addresses, the voters). A replica started with `--join` starts empty; once
//! `escher heads add` commits a raft membership change, the leader finds it has nothing and
//! sends a snapshot (raft's own mechanism), so it always catches up from one. Snapshots hold
//! the whole `ClusterState` (bincode) and the addresses; one is taken, and the log compacted,
//! once the log written since the last is larger than both that snapshot and
//! `--snapshot-log-bytes` ([`DEFAULT_SNAPSHOT_BYTES`], 4 MiB): the log stays within about the
//! size of the state (memory matters: the in-memory log holds every entry it keeps), and
//! snapshotting costs at most about what writing the log did. (64 MiB, the first threshold,
//! let an in-memory head grow by 64 MiB of applied entries: the retention test caught it.)
//!
//! # Transport and its parser
//!
//! Peers' messages travel over the `Raft` gRPC service of the same port (`service.rs`,
//! `transport.rs`), tagged with the group id and both replica ids, so that a replica of
//! another group, or one at an address another replica owns, is refused. raft's messages are
//! rust-protobuf 2 values (raft-rs's default `protobuf-codec`: its `prost-codec` needs a
//! system `protoc` at build time). The `protobuf` 2.28 crate carries RUSTSEC-2024-0437
//! (unbounded recursion while parsing a crafted message can overflow the stack). It is
//! acceptable here because the only bytes this head parses with it are `RaftBatch` messages
//! from its peers: the auth layer in front of the head's port admits a `Raft` call only with
//! the group's peer token (the access file's `peer_token`; no client's or worker's token, not
//! even an admin's: `head/src/auth/layer.rs`, docs/DESIGN.md §10), so nothing a client or
//! worker sends reaches that parser.
//!
//! # Layout
//!
//! - `replica.rs`: `Replica`, the ready loop, proposals, reads, membership, snapshots;
//! - `config.rs`: [`ReplicaConfig`] (`--id`, `--peers`, `--group`, `--join`, raft timing);
//! - `transport.rs`: outbound raft messages, per-peer bounded queues, back-off;
//! - `peers.rs`: the other replicas' statuses, asked for `escher heads`;
//! - `service.rs`: the `Raft` gRPC service (inbound messages, a replica's status);
//! - [`sim`]: one replica driven by hand, with no socket and no runtime: the seam of the
//!   deterministic simulation (`escher-sim`, docs/RELIABILITY.md);
//! - `codec.rs`: entries and snapshots as bytes;
//! - `log_bridge.rs`: raft-rs's `slog` records into `tracing`;
//! - [`log`]: the raft log itself: the [`LogStore`] contract, [`MemLog`] (no `--data-dir`) and
//!   [`DiskLog`] (a directory of checksummed segments and snapshot files).

mod codec;
mod config;
mod formats;
pub mod log;
mod log_bridge;
mod peers;
mod replica;
mod service;
pub mod sim;
mod transport;

pub use codec::{
    ACTORS_FORMAT, ATTACH_FORMAT, CodecError, DATA_FORMAT, DECISIONS_FORMAT, DISK_RESERVE_FORMAT,
    ENV_NEXT_FORMAT, JUDGED_REMOVAL_FORMAT, LABELS_FORMAT, OBJECTS_FORMAT, PARENT_TASK_FORMAT,
    RESULT_OBJECTS_FORMAT, SESSIONS_FORMAT, decode_backup, encode_backup, image_format,
    newest_readable,
};
pub use config::{
    DEFAULT_ELECTION_TICKS, DEFAULT_HEARTBEAT_TICKS, DEFAULT_SNAPSHOT_BYTES, DEFAULT_TICK,
    ReplicaConfig, ReplicaConfigError, SINGLE_GROUP, derived_group,
};
pub use log::{
    CUT_TAIL_IDS, DiskLog, DiskLogOptions, LogError, LogIdentity, LogStore, LostTail, MemLog,
    SimDisk,
};
pub(crate) use peers::group_status;
pub(crate) use replica::{Applied, Output, Replica};
pub use replica::{NotAccepted, Persistence, ReplicationError};
pub(crate) use service::{Inbound, RaftService};
pub(crate) use transport::{MAX_RAFT_MESSAGE, PeerAccess, Transport, TransportEvent};
