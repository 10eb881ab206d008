//! Resource names interned to dense integer ids, so the core compares and hashes integers, and
//! reclaimed once nothing refers to them.
//!
//! Every id carries a **reference count**: one per node slot of that resource and one per task
//! the core knows (pending, in a gang, or running) that requests it. Those are the only places
//! an id lives beyond one event: the indexes (resource to nodes, to shapes, to gangs, and the
//! round-robin cursors) are derived from them. When a count falls to zero the id becomes a
//! candidate; at the end of each event the core [`sweep`](Interner::sweep)s the candidates and
//! frees those still at zero, so a name that only lived within one event (a `set_resource` of a
//! name no node ends up holding) never stays. A freed id goes on a free list and is handed out
//! again, last freed first, so the table is as large as the most names ever in use at once,
//! not the number ever seen, and ids stay dense (they are `u32`).
//!
//! Nothing can confuse a live name with a dead one: an id is reused only when no slot and no
//! task holds it and the core dropped it from every index, which `sanity_check` verifies by
//! recounting every reference from scratch. Everything here is a plain function of the events,
//! so the same events give the same ids on every replica. Cost: one counter update per slot
//! or requested resource as tasks come and go, and one per freed name; nothing is ever
//! scanned, so it does not grow with unrelated resources (docs/DESIGN.md §5).

use escher_proto::types::ResourceName;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// A resource name's id inside one [`Scheduler`](super::Scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct ResourceId(pub(crate) u32);

/// A live id: its name and how many slots and tasks refer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    name: ResourceName,
    refs: u32,
}

/// Two-way map between names and ids, with reference counts and a free list.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct Interner {
    #[serde(serialize_with = "super::sorted::sorted")]
    ids: FxHashMap<ResourceName, ResourceId>,
    /// By id: the live entry, or `None` for a free id.
    entries: Vec<Option<Entry>>,
    /// Free ids; the last one pushed is reused first.
    free: Vec<ResourceId>,
    /// Ids that were interned, or whose count reached zero, since the last sweep.
    candidates: Vec<ResourceId>,
}

impl Interner {
    /// The id of `name`, creating one (with no references yet) if it is new.
    pub(crate) fn intern(&mut self, name: &ResourceName) -> ResourceId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let entry = Some(Entry {
            name: name.clone(),
            refs: 0,
        });
        let reused = self
            .free
            .pop()
            .and_then(|id| Some((id, self.entries.get_mut(id.0 as usize)?)));
        let id = match reused {
            Some((id, slot)) => {
                *slot = entry;
                id
            }
            None => {
                let id = ResourceId(self.entries.len() as u32);
                self.entries.push(entry);
                id
            }
        };
        self.ids.insert(name.clone(), id);
        self.candidates.push(id);
        id
    }

    /// The id of `name` if it has one.
    pub(crate) fn get(&self, name: &str) -> Option<ResourceId> {
        self.ids.get(name).copied()
    }

    /// The name behind a live `id`; `None` for a freed one, which no caller holds (the
    /// reference counts guarantee it, `sanity_check` recounts them).
    pub(crate) fn name(&self, id: ResourceId) -> Option<&ResourceName> {
        Some(&self.live(id)?.name)
    }

    /// One more slot or task refers to `id`.
    ///
    /// A count at `u32::MAX` (four billion slots and tasks on one name: more than any head
    /// holds in memory) stays there: the name is then never freed, which wastes one entry but
    /// can never free a name in use, and no replica panics.
    pub(crate) fn hold(&mut self, id: ResourceId) {
        if let Some(entry) = self.live_mut(id) {
            entry.refs = entry.refs.saturating_add(1);
        }
    }

    /// One slot or task fewer refers to `id`. Releasing a freed id, or one whose count is
    /// zero, or one pinned at `u32::MAX` (see [`hold`](Self::hold)), changes nothing.
    pub(crate) fn release(&mut self, id: ResourceId) {
        let Some(entry) = self.live_mut(id) else {
            return;
        };
        if entry.refs == 0 || entry.refs == u32::MAX {
            return;
        }
        entry.refs -= 1;
        if entry.refs == 0 {
            self.candidates.push(id);
        }
    }

    /// Frees every candidate that nothing refers to any more, in id order, and returns them so
    /// the caller can drop them from its indexes.
    ///
    /// Id order, not the order they became candidates: callers release names while iterating
    /// hash maps whose order depends on their insertion history, which a state restored from a
    /// snapshot does not share; the free list, and so every id handed out later, must not
    /// depend on it (a restored replica hands out exactly the ids the others do).
    pub(crate) fn sweep(&mut self) -> Vec<ResourceId> {
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.sort_unstable();
        candidates.dedup();
        let mut freed = Vec::new();
        for id in candidates {
            let Some(slot) = self.entries.get_mut(id.0 as usize) else {
                continue;
            };
            let Some(entry) = slot.take_if(|e| e.refs == 0) else {
                continue;
            };
            self.ids.remove(&entry.name);
            self.free.push(id);
            freed.push(id);
        }
        freed
    }

    /// Whether `id` names a live resource.
    pub(crate) fn is_live(&self, id: ResourceId) -> bool {
        self.entries.get(id.0 as usize).is_some_and(Option::is_some)
    }

    /// How many names are live.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Every live id with its name and count, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ResourceId, &ResourceName, u32)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (ResourceId(i as u32), &e.name, e.refs)))
    }

    /// Checks the table against itself: names and ids agree both ways, free ids are exactly
    /// the empty entries, and nothing is left unswept.
    pub(crate) fn check(&self) -> Result<(), String> {
        if !self.candidates.is_empty() {
            return Err("interned names left unswept after an event".into());
        }
        let mut live = 0;
        for (id, name, refs) in self.iter() {
            live += 1;
            if self.ids.get(name) != Some(&id) {
                return Err(format!("name {name} does not map back to its id {}", id.0));
            }
            if refs == 0 {
                return Err(format!("name {name} is kept with no reference"));
            }
        }
        if live != self.ids.len() {
            return Err(format!(
                "{} names map to ids but {live} ids are live",
                self.ids.len()
            ));
        }
        let empty = self.entries.iter().filter(|e| e.is_none()).count();
        let mut free: Vec<u32> = self.free.iter().map(|id| id.0).collect();
        free.sort_unstable();
        free.dedup();
        if free.len() != self.free.len() || free.len() != empty {
            return Err(format!(
                "{} free ids listed for {empty} empty entries",
                self.free.len()
            ));
        }
        if let Some(id) = free.iter().find(|id| self.is_live(ResourceId(**id))) {
            return Err(format!("id {id} is both free and live"));
        }
        Ok(())
    }

    fn live(&self, id: ResourceId) -> Option<&Entry> {
        self.entries.get(id.0 as usize)?.as_ref()
    }

    fn live_mut(&mut self, id: ResourceId) -> Option<&mut Entry> {
        self.entries.get_mut(id.0 as usize)?.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> ResourceName {
        ResourceName::new(text).unwrap()
    }

    #[test]
    fn unreferenced_names_are_freed_and_their_ids_reused() {
        let mut names = Interner::default();
        let a = names.intern(&name("a"));
        let b = names.intern(&name("b"));
        names.hold(a);
        assert_eq!(names.sweep(), [b], "b was interned but never held");
        assert!(names.is_live(a) && !names.is_live(b));
        assert_eq!(names.get("b"), None);
        let c = names.intern(&name("c"));
        assert_eq!(c, b, "a freed id is reused");
        names.hold(c);
        names.hold(c);
        names.release(c);
        assert!(names.sweep().is_empty(), "c is still held once");
        names.release(c);
        names.release(a);
        assert_eq!(
            names.sweep(),
            [a, c],
            "in id order, not the order of release"
        );
        assert_eq!(names.len(), 0);
        names.check().unwrap();
        // Freed last (the highest id of its sweep), reused first.
        assert_eq!(names.intern(&name("d")), c);
    }

    #[test]
    fn a_name_released_and_held_again_within_one_event_stays() {
        let mut names = Interner::default();
        let a = names.intern(&name("a"));
        names.hold(a);
        names.sweep();
        names.release(a);
        names.hold(a);
        assert!(names.sweep().is_empty());
        assert_eq!(names.name(a).unwrap().as_str(), "a");
        names.check().unwrap();
    }

    /// Counts that a bug elsewhere would break (a release too many, a freed id used) change
    /// nothing instead of panicking: the core runs on every replica of the head.
    #[test]
    fn a_broken_count_or_a_freed_id_changes_nothing_and_does_not_panic() {
        let mut names = Interner::default();
        let a = names.intern(&name("a"));
        names.hold(a);
        names.release(a);
        names.release(a); // one too many: used to panic ("released more than held")
        assert_eq!(names.sweep(), [a]);
        assert_eq!(names.name(a), None); // used to panic ("a freed resource id ...")
        names.hold(a);
        names.release(a);
        names.hold(ResourceId(7)); // never handed out
        names.release(ResourceId(7));
        assert!(names.sweep().is_empty());
        names.check().unwrap();
        assert_eq!(
            names.intern(&name("b")),
            a,
            "the freed id is reused as before"
        );
    }
}
