//! What is left of a task once the head's retention has dropped its record (docs/DESIGN.md §7).
//!
//! The head keeps finished tasks by a policy (`--retain-finished`, `--retain-for`) and then
//! reduces each to a [`Tombstone`]: its final state and when it reached it. Tombstones are
//! bounded too; once a task's tombstone is gone as well, all that is known is that the id was
//! handed out (ids are never reused), so it was evicted. Either way a call about such a task
//! fails with [`Evicted`], never with "unknown task".

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{TaskId, TaskState, TaskStatus};

/// The little the head keeps of a finished task after retention dropped its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Its final state (terminal).
    pub state: TaskState,
    /// When it reached that state, in milliseconds since the Unix epoch.
    pub finished_at_ms: u64,
}

/// A task whose record retention dropped: the answer to `get`, `wait`, `info` and `logs` about
/// it. Displays as `task 5 was evicted by retention (succeeded at 2026-11-23T10:00:00Z); ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct Evicted {
    /// The task.
    pub id: TaskId,
    /// Its tombstone, while the head keeps it.
    pub tombstone: Option<Tombstone>,
}

impl fmt::Display for Evicted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} was evicted by retention (", self.id)?;
        match self.tombstone {
            Some(t) => write!(f, "{} at {}", t.state, utc_seconds(t.finished_at_ms))?,
            None => f.write_str("its record is no longer kept")?,
        }
        f.write_str(
            "); its result and logs are gone. Fetch results sooner, or keep more with the \
             head's --retain-finished and --retain-for",
        )
    }
}

impl TaskStatus {
    /// The eviction this status stands for, if it comes from a tombstone (`evicted` set).
    pub fn eviction(&self) -> Option<Evicted> {
        if !self.evicted {
            return None;
        }
        let tombstone = self.finished_at_ms.map(|finished_at_ms| Tombstone {
            state: self.state,
            finished_at_ms,
        });
        Some(Evicted {
            id: self.id,
            tombstone,
        })
    }
}

/// A time in milliseconds since the Unix epoch as RFC 3339 UTC to the second,
/// `2026-11-23T10:00:00Z` (beyond the year 9999, as the raw number).
pub fn utc_seconds(ms: u64) -> String {
    match at(ms) {
        Some(t) => humantime::format_rfc3339_seconds(t).to_string(),
        None => format!("{ms} ms after the Unix epoch"),
    }
}

/// A time in milliseconds since the Unix epoch as RFC 3339 UTC to the millisecond,
/// `2026-11-23T10:00:00.123Z` (beyond the year 9999, as the raw number).
pub fn utc_millis(ms: u64) -> String {
    match at(ms) {
        Some(t) => humantime::format_rfc3339_millis(t).to_string(),
        None => format!("{ms} ms after the Unix epoch"),
    }
}

/// The first millisecond RFC 3339 cannot write (the year 10000).
const YEAR_10000_MS: u64 = 253_402_300_800_000;

fn at(ms: u64) -> Option<SystemTime> {
    (ms < YEAR_10000_MS).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_says_how_the_task_ended_and_what_to_do() {
        let e = Evicted {
            id: TaskId(5),
            tombstone: Some(Tombstone {
                state: TaskState::Succeeded,
                finished_at_ms: 1_795_428_000_000,
            }),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("task 5 was evicted by retention (succeeded at 2026-11-23T10:00:00Z)"),
            "{text}"
        );
        assert!(text.contains("--retain-finished"), "{text}");
        let gone = Evicted {
            id: TaskId(6),
            tombstone: None,
        };
        assert!(
            gone.to_string()
                .starts_with("task 6 was evicted by retention (its record is no longer kept)"),
            "{gone}"
        );
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(utc_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_millis(1_795_428_000_123), "2026-11-23T10:00:00.123Z");
        assert_eq!(utc_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            utc_seconds(u64::MAX),
            format!("{} ms after the Unix epoch", u64::MAX)
        );
    }
}
