//! Which data format a replica writes (DESIGN §14): the newest one every replica of its group
//! reads, so that a group upgraded one replica at a time keeps replicating throughout.
//!
//! Every batch of raft messages carries the newest format its sender reads. A replica writes
//! (proposes entries and takes snapshots in) the lowest of those of every member, its own
//! included; a member it has not heard from since it started counts as format 1, which every
//! release reads. Once a format is in the group's log or snapshots it is never written below:
//! a replica that saw an entry of format 2 knows that every member read format 2 when it was
//! written, and a member started again on an older release then refuses the log, naming both
//! formats, instead of misreading it.

use std::collections::BTreeMap;

/// What one replica knows of its group's data formats.
#[derive(Debug, Clone)]
pub(crate) struct Formats {
    /// The newest format this replica reads.
    newest: u16,
    /// The newest format seen in the group's log or snapshots.
    written: u16,
    /// The newest format each peer said it reads.
    peers: BTreeMap<u64, u16>,
    /// What [`Formats::pick`] said last, to log a change once.
    last: u16,
}

impl Formats {
    /// A replica that reads formats up to `newest`.
    pub(crate) fn new(newest: u16) -> Formats {
        Formats {
            newest,
            written: 1,
            peers: BTreeMap::new(),
            last: 1,
        }
    }

    /// The newest format this replica reads.
    pub(crate) fn newest(&self) -> u16 {
        self.newest
    }

    /// Peer `id` said it reads formats up to `format` (0: a release before formats were told,
    /// which reads format 1).
    pub(crate) fn heard(&mut self, id: u64, format: u32) {
        let format = u16::try_from(format).unwrap_or(u16::MAX).max(1);
        self.peers.insert(id, format);
    }

    /// The group's log or snapshot held something written in `format`.
    pub(crate) fn saw_written(&mut self, format: u16) {
        self.written = self.written.max(format);
    }

    /// The format to write in a group of `members` (this replica, `me`, among them): the newest
    /// every member reads, never below what the group has written already.
    pub(crate) fn writable(&self, me: u64, members: impl IntoIterator<Item = u64>) -> u16 {
        let readable = members
            .into_iter()
            .filter(|id| *id != me)
            .map(|id| self.peers.get(&id).copied().unwrap_or(1))
            .fold(self.newest, u16::min);
        readable.max(self.written).min(self.newest)
    }

    /// [`Formats::writable`], logging when it changes (the format to write now).
    pub(crate) fn pick(&mut self, me: u64, members: impl IntoIterator<Item = u64>) -> u16 {
        let format = self.writable(me, members);
        if format != self.last {
            tracing::info!(
                from = self.last,
                to = format,
                "the group's data format changes: every replica reads it"
            );
            self.last = format;
        }
        format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_writes_what_its_every_member_reads_and_never_goes_back() {
        let mut f = Formats::new(2);
        // Nothing heard yet: format 1, which every release reads.
        assert_eq!(f.pick(1, [1, 2, 3]), 1);
        f.heard(2, 2);
        assert_eq!(f.pick(1, [1, 2, 3]), 1, "replica 3 is not heard from");
        f.heard(3, 0);
        assert_eq!(f.pick(1, [1, 2, 3]), 1, "replica 3 predates formats");
        f.heard(3, 2);
        assert_eq!(f.pick(1, [1, 2, 3]), 2);
        // A member reads a format newer than this replica: this replica's is the limit.
        f.heard(3, 5);
        assert_eq!(f.pick(1, [1, 2, 3]), 2);
        // Once written, a member coming back on an older release does not take the group back.
        f.saw_written(2);
        f.heard(3, 1);
        assert_eq!(f.pick(1, [1, 2, 3]), 2);
        // A lone replica writes its newest.
        assert_eq!(Formats::new(2).pick(1, [1]), 2);
        assert_eq!(Formats::new(1).pick(1, [1]), 1);
    }
}
