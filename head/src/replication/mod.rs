//! Raft replication of the head's state machine (DESIGN §7): the durable raft log the
//! replication layer persists to.

pub mod log;
