//! raft-rs logs through `slog`; this drain hands its records to `tracing`, so that raft's
//! elections and warnings appear in the head's log with everything else (target
//! `escher_head::raft`, with the replica id as a field).

use slog::{Drain, Level, OwnedKVList, Record};

/// A `slog` drain that forwards to `tracing`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TracingDrain {
    replica: u64,
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut pairs = Pairs(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut pairs);
        let _ = slog::KV::serialize(values, record, &mut pairs);
        let message = format!("{}{}", record.msg(), pairs.0);
        let replica = self.replica;
        match record.level() {
            Level::Critical | Level::Error => {
                tracing::error!(target: "escher_head::raft", replica, "{message}")
            }
            Level::Warning => tracing::warn!(target: "escher_head::raft", replica, "{message}"),
            Level::Info => tracing::info!(target: "escher_head::raft", replica, "{message}"),
            Level::Debug => tracing::debug!(target: "escher_head::raft", replica, "{message}"),
            Level::Trace => tracing::trace!(target: "escher_head::raft", replica, "{message}"),
        }
        Ok(())
    }
}

/// The logger raft-rs gets for replica `replica`.
pub(crate) fn logger(replica: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain { replica }, slog::o!())
}

/// Collects a record's key-value pairs as ` key=value` text.
struct Pairs(String);

impl slog::Serializer for Pairs {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        use std::fmt::Write as _;
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}
