//! [`Table`]: the object store's bookkeeping, with no I/O: which objects exist, where each
//! lies (memory or spill disk), who pins it, how recently it was used, and the byte counts.
//!
//! The store ([`super::ObjectStore`]) holds it behind one mutex and does the file operations
//! it decides; [`Table::sanity_check`] states its invariants, which the store's tests check
//! against the directories after every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{ObjectError, ObjectId};

/// The store's own number for one stored copy: an object deleted while pinned and stored again
/// under the same id is two copies, in two files, until the first one's readers are gone.
pub(super) type Key = u64;

/// Where a sealed object's file lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In the memory directory (tmpfs).
    Memory,
    /// In the spill directory (disk).
    Spilled,
}

/// One sealed object.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub id: ObjectId,
    pub size: u64,
    pub crc32c: u32,
    /// The CRC-32C of each [`CHUNK_BYTES`](escher_proto::transfer::CHUNK_BYTES) block, when
    /// its writer summed them (a holder sends them with its chunks rather than summing again).
    pub sums: Option<Arc<[u32]>>,
    pub place: Place,
    /// Live views of it (and in-flight restores or maps): while above zero it is neither
    /// spilled nor unlinked.
    pub pins: u32,
    /// The table's clock when it was last sealed or read: the least recent spill first.
    pub last_used: u64,
    /// Deleted while pinned: invisible, unlinked when the last pin goes.
    pub released: bool,
}

/// What the table knows.
#[derive(Debug, Default)]
pub(super) struct Table {
    /// The visible (sealed, not released) objects.
    ids: BTreeMap<ObjectId, Key>,
    /// The objects being written, and the bytes each reserves in memory.
    writing: BTreeMap<ObjectId, u64>,
    /// Every stored copy, visible or released-but-pinned.
    entries: BTreeMap<Key, Entry>,
    next_key: Key,
    clock: u64,
    /// Bytes of sealed copies in memory (released-but-pinned ones included).
    memory: u64,
    /// Bytes of sealed copies on the spill disk.
    spilled: u64,
    /// Bytes reserved in memory by writers.
    reserved: u64,
}

impl Table {
    /// The copies to spill, least recently used first, so that `size` more bytes fit in
    /// `capacity`; empty when they fit already. Refuses an id in use, and a size that spilling
    /// every unpinned copy would not make room for.
    pub fn plan_room(
        &self,
        id: ObjectId,
        size: u64,
        capacity: u64,
    ) -> Result<Vec<Key>, ObjectError> {
        if self.ids.contains_key(&id) || self.writing.contains_key(&id) {
            return Err(ObjectError::Exists { id });
        }
        self.victims(id, size, capacity)
    }

    /// The copies to spill so that `size` more bytes fit (for a new object or a restore).
    pub fn victims(&self, id: ObjectId, size: u64, capacity: u64) -> Result<Vec<Key>, ObjectError> {
        let used = self.memory + self.reserved;
        let Some(excess) = used
            .saturating_add(size)
            .checked_sub(capacity)
            .filter(|&e| e > 0)
        else {
            return Ok(Vec::new());
        };
        let mut cold: Vec<(u64, Key, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.place == Place::Memory && e.pins == 0 && !e.released && e.size > 0)
            .map(|(&key, e)| (e.last_used, key, e.size))
            .collect();
        cold.sort_unstable();
        let spillable: u64 = cold.iter().map(|&(_, _, bytes)| bytes).sum();
        if spillable < excess {
            return Err(ObjectError::TooLarge {
                id,
                size,
                capacity,
                pinned: used - spillable,
                spillable,
            });
        }
        let mut freed = 0;
        let mut chosen = Vec::new();
        for (_, key, bytes) in cold {
            if freed >= excess {
                break;
            }
            freed += bytes;
            chosen.push(key);
        }
        Ok(chosen)
    }

    /// Reserves `size` bytes in memory for a writer of `id`, and the key its copy will have.
    pub fn reserve(&mut self, id: ObjectId, size: u64) -> Key {
        self.writing.insert(id, size);
        self.reserved += size;
        self.next_key += 1;
        self.next_key
    }

    /// Gives back a writer's reservation (its copy was sealed, or dropped).
    pub fn unreserve(&mut self, id: ObjectId) {
        if let Some(size) = self.writing.remove(&id) {
            self.reserved -= size;
        }
    }

    /// Makes a writer's copy visible, in memory.
    pub fn seal(
        &mut self,
        key: Key,
        id: ObjectId,
        size: u64,
        crc32c: u32,
        sums: Option<Arc<[u32]>>,
    ) {
        self.unreserve(id);
        self.clock += 1;
        self.entries.insert(
            key,
            Entry {
                id,
                size,
                crc32c,
                sums,
                place: Place::Memory,
                pins: 0,
                last_used: self.clock,
                released: false,
            },
        );
        self.ids.insert(id, key);
        self.memory += size;
    }

    /// The visible copy of `id`.
    pub fn lookup(&self, id: ObjectId) -> Option<(Key, &Entry)> {
        let key = *self.ids.get(&id)?;
        Some((key, self.entries.get(&key)?))
    }

    /// A copy by key.
    pub fn entry(&self, key: Key) -> Option<&Entry> {
        self.entries.get(&key)
    }

    /// Pins the visible copy of `id` and marks it used; its key and entry.
    pub fn pin(&mut self, id: ObjectId) -> Option<(Key, &Entry)> {
        let key = *self.ids.get(&id)?;
        self.clock += 1;
        let entry = self.entries.get_mut(&key)?;
        entry.pins += 1;
        entry.last_used = self.clock;
        Some((key, entry))
    }

    /// Drops one pin of copy `key`; the copy, when it was released and this was its last pin
    /// (the caller unlinks its file).
    pub fn unpin(&mut self, key: Key) -> Option<Entry> {
        let entry = self.entries.get_mut(&key)?;
        entry.pins = entry.pins.saturating_sub(1);
        if entry.pins == 0 && entry.released {
            return self.remove(key);
        }
        None
    }

    /// Deletes `id`: it is invisible from now on; its copy, when no one pins it (the caller
    /// unlinks its file), else it goes with its last pin.
    pub fn release(&mut self, id: ObjectId) -> Result<Option<(Key, Entry)>, ObjectError> {
        let key = self.ids.remove(&id).ok_or(ObjectError::NotFound { id })?;
        let Some(entry) = self.entries.get_mut(&key) else {
            return Ok(None);
        };
        if entry.pins > 0 {
            entry.released = true;
            return Ok(None);
        }
        Ok(self.remove(key).map(|entry| (key, entry)))
    }

    /// Moves copy `key` between memory and disk.
    pub fn set_place(&mut self, key: Key, place: Place) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        match (entry.place, place) {
            (Place::Memory, Place::Spilled) => {
                self.memory -= entry.size;
                self.spilled += entry.size;
            }
            (Place::Spilled, Place::Memory) => {
                self.spilled -= entry.size;
                self.memory += entry.size;
            }
            _ => {}
        }
        entry.place = place;
    }

    /// Every copy, for the store's close.
    pub fn drain(&mut self) -> Vec<(Key, Entry)> {
        self.ids.clear();
        self.memory = 0;
        self.spilled = 0;
        std::mem::take(&mut self.entries).into_iter().collect()
    }

    fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.entries.remove(&key)?;
        match entry.place {
            Place::Memory => self.memory -= entry.size,
            Place::Spilled => self.spilled -= entry.size,
        }
        Some(entry)
    }

    /// The visible objects, in id order.
    pub fn visible(&self) -> impl Iterator<Item = (Key, &Entry)> {
        self.ids
            .values()
            .filter_map(|key| Some((*key, self.entries.get(key)?)))
    }

    /// Every stored copy, released-but-pinned ones included.
    pub fn copies(&self) -> impl Iterator<Item = (Key, &Entry)> {
        self.entries.iter().map(|(key, entry)| (*key, entry))
    }

    /// Bytes of sealed copies in memory, on disk, and reserved by writers.
    pub fn bytes(&self) -> (u64, u64, u64) {
        (self.memory, self.spilled, self.reserved)
    }

    /// The objects being written and their sizes.
    pub fn writing(&self) -> &BTreeMap<ObjectId, u64> {
        &self.writing
    }

    /// Checks the table's invariants: the byte counts are the sums of the copies, every
    /// visible id names a copy of that id that is not released, every released copy is
    /// pinned, no id is both written and visible, and no key is ahead of the counter.
    #[cfg(test)]
    pub fn sanity_check(&self) -> Result<(), String> {
        let mut memory = 0;
        let mut spilled = 0;
        for (key, entry) in &self.entries {
            if *key > self.next_key {
                return Err(format!("copy {key} is ahead of the key counter"));
            }
            match entry.place {
                Place::Memory => memory += entry.size,
                Place::Spilled => spilled += entry.size,
            }
            if entry.released && entry.pins == 0 {
                return Err(format!("released copy {key} of {} has no pin", entry.id));
            }
            if !entry.released && self.ids.get(&entry.id) != Some(key) {
                return Err(format!(
                    "copy {key} of {} is neither visible nor released",
                    entry.id
                ));
            }
        }
        for (id, key) in &self.ids {
            match self.entries.get(key) {
                Some(e) if e.id == *id && !e.released => {}
                _ => return Err(format!("{id} names copy {key}, which is not its live copy")),
            }
        }
        let reserved: u64 = self.writing.values().sum();
        let both: std::collections::BTreeSet<_> = self
            .writing
            .keys()
            .filter(|id| self.ids.contains_key(id))
            .collect();
        if !both.is_empty() {
            return Err(format!("{both:?} are both visible and being written"));
        }
        if (memory, spilled, reserved) != (self.memory, self.spilled, self.reserved) {
            return Err(format!(
                "counted memory {} spilled {} reserved {}, summed {memory} {spilled} {reserved}",
                self.memory, self.spilled, self.reserved
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(table: &mut Table, id: ObjectId, size: u64) -> Key {
        let key = table.reserve(id, size);
        table.seal(key, id, size, 0, None);
        key
    }

    #[test]
    fn spills_least_recently_used_unpinned_first() {
        let mut t = Table::default();
        let a = sealed(&mut t, ObjectId(1, 0), 40);
        let b = sealed(&mut t, ObjectId(1, 1), 40);
        let c = sealed(&mut t, ObjectId(1, 2), 40);
        t.pin(ObjectId(1, 0)); // a is now the most recent, and pinned
        assert_eq!(t.victims(ObjectId(2, 0), 10, 120).unwrap(), vec![b]);
        assert_eq!(t.victims(ObjectId(2, 0), 50, 120).unwrap(), vec![b, c]);
        assert!(t.victims(ObjectId(2, 0), 0, 120).unwrap().is_empty());
        let e = t.victims(ObjectId(2, 0), 90, 120).unwrap_err();
        assert!(matches!(e, ObjectError::TooLarge { pinned: 40, .. }), "{e}");
        t.unpin(a);
        assert_eq!(t.victims(ObjectId(2, 0), 90, 120).unwrap(), vec![b, c, a]);
        t.sanity_check().unwrap();
    }

    #[test]
    fn release_of_a_pinned_copy_waits_for_its_last_pin() {
        let mut t = Table::default();
        let id = ObjectId(3, 0);
        let key = sealed(&mut t, id, 10);
        t.pin(id);
        t.pin(id);
        assert!(t.release(id).unwrap().is_none());
        assert!(t.lookup(id).is_none());
        assert!(matches!(t.release(id), Err(ObjectError::NotFound { .. })));
        t.sanity_check().unwrap();
        // The same id stored again while the old copy is read: two copies.
        let again = sealed(&mut t, id, 5);
        assert_ne!(again, key);
        assert_eq!(t.bytes(), (15, 0, 0));
        assert!(t.unpin(key).is_none());
        assert_eq!(t.unpin(key).map(|e| e.size), Some(10));
        assert_eq!(t.bytes(), (5, 0, 0));
        t.sanity_check().unwrap();
    }

    #[test]
    fn ids_in_use_are_refused() {
        let mut t = Table::default();
        let id = ObjectId(4, 0);
        t.reserve(id, 1);
        assert!(matches!(
            t.plan_room(id, 1, 10),
            Err(ObjectError::Exists { .. })
        ));
        t.unreserve(id);
        sealed(&mut t, id, 1);
        assert!(matches!(
            t.plan_room(id, 1, 10),
            Err(ObjectError::Exists { .. })
        ));
        t.sanity_check().unwrap();
    }
}
