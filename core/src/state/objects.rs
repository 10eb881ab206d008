//! The object table (docs/ARCHITECTURE.md "Objects"): every object's id, size, checksum,
//! owner, namespace and the nodes that hold a copy, changed only by `ObjectsSealed` (new
//! copies), `ObjectsReleased` (the owner let go), `CloseObjectSession` (a session ended: its
//! client closed, or the leader saw it lapse; its `put`s go, and so do the result objects of
//! the tasks its client submitted under it, the label `escher.object-session`; what a pending
//! or running task takes as an argument stays until that task ends) and a node's loss.
//!
//! The location of a copy is published the escher way: the node that holds a copy of object
//! `O` of namespace `NS` carries the ephemeral resource `NS/object.O` (the admin's objects:
//! `object.O`), capacity unbounded, created when the copy is sealed and deleted when the copy
//! goes, through the resource path every change takes (`resources.rs`). A task or an ESL that
//! requests it is placed where the bytes are.
//!
//! Bounds: the table holds live and lost objects until their owner releases them; released ids
//! are remembered (so that a reader is told "freed", not "unknown") up to [`MAX_FREED_KEPT`],
//! the oldest forgotten first. Location resources are made by the head, not by the
//! application, so they are not counted against a namespace's resource-name quota when made.
//!
//! Another namespace's object is unknown, as its task would be.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use escher_proto::types::{
    Capacity, CapacityOp, DATA_ADDRESS_LABEL, Namespace, NodeId, NodeSpec, ObjectAccess,
    ObjectHolder, ObjectId, ObjectLoss, ObjectOwner, ObjectTicket, ObjectView, ResourceName,
    ResourceUpdate, SealedCopy, TaskId, TaskState, ticket_key,
};
use serde::{Deserialize, Serialize};

use super::apply::ClusterState;
use super::command::Effect;
use super::error::ApplyError;
use crate::scheduler::Millis;

/// How many released object ids the table remembers, so that a late reader is told the object
/// was freed rather than that it never existed.
pub const MAX_FREED_KEPT: usize = 100_000;

/// The first object session number. Sessions are counted from here, apart from task ids
/// (which count from 1 and never come near 2^63), so that a `put`'s ids `(session, sequence)`
/// and a task's result ids `(task, index)` never meet.
pub const FIRST_SESSION: u64 = 1 << 63;

/// What the head knows of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// Its namespace (`None`: the admin's).
    pub namespace: Option<Namespace>,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32C of its bytes.
    pub checksum: u32,
    /// Who owns it.
    pub owner: ObjectOwner,
    /// When its first copy was sealed.
    pub sealed_at: Millis,
    /// The nodes that hold a copy.
    pub holders: BTreeSet<NodeId>,
    /// Why no copy is left, once the last holder was lost.
    pub lost: Option<ObjectLoss>,
}

/// The table. See the module documentation (`state/objects.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectTable {
    /// The last object session number given out (0: none yet).
    last_session: u64,
    /// Live and lost objects.
    objects: BTreeMap<ObjectId, ObjectRecord>,
    /// Released ids, oldest first, with when they were released.
    freed: VecDeque<(ObjectId, Millis)>,
    /// The ids in `freed`, for lookup; derived (rebuilt by [`ObjectTable::rebuilt`]).
    #[serde(skip)]
    freed_ids: BTreeSet<ObjectId>,
    /// The objects each node holds a copy of; derived like `freed_ids`.
    #[serde(skip)]
    by_node: BTreeMap<NodeId, BTreeSet<ObjectId>>,
    /// The bytes of each application namespace's objects (live and lost), for its quota;
    /// derived like `freed_ids`.
    #[serde(skip)]
    by_namespace: BTreeMap<Namespace, u64>,
    /// The result objects of each object session's tasks (a task's `escher.object-session`
    /// label); derived from the table and the task records
    /// ([`ClusterState::set_objects`]), kept only while the task has its record.
    #[serde(skip)]
    by_session: BTreeMap<u64, BTreeSet<ObjectId>>,
}

impl ObjectTable {
    /// The table with its derived indexes rebuilt (after it was deserialized).
    pub fn rebuilt(mut self) -> ObjectTable {
        self.freed_ids = self.freed.iter().map(|(id, _)| *id).collect();
        self.by_node.clear();
        self.by_namespace.clear();
        for (id, rec) in &self.objects {
            if let Some(ns) = &rec.namespace {
                *self.by_namespace.entry(ns.clone()).or_default() += rec.size;
            }
            for node in &rec.holders {
                self.by_node.entry(*node).or_default().insert(*id);
            }
        }
        self
    }

    /// Whether the table holds nothing: no object, no released id, no session given out.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.freed.is_empty() && self.last_session == 0
    }

    /// The live and lost objects, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectId, &ObjectRecord)> + '_ {
        self.objects.iter()
    }

    /// One object's record.
    pub fn get(&self, id: ObjectId) -> Option<&ObjectRecord> {
        self.objects.get(&id)
    }

    /// Whether `id` was released (and is still remembered as such).
    pub fn was_freed(&self, id: ObjectId) -> bool {
        self.freed_ids.contains(&id)
    }

    /// The objects node `node` holds a copy of.
    pub fn held_by(&self, node: NodeId) -> impl Iterator<Item = ObjectId> + '_ {
        self.by_node.get(&node).into_iter().flatten().copied()
    }

    /// The bytes of namespace `ns`'s objects (live and lost), each counted once.
    pub fn namespace_bytes(&self, ns: &Namespace) -> u64 {
        self.by_namespace.get(ns).copied().unwrap_or(0)
    }

    /// The bytes of the copies node `node` holds.
    pub fn bytes_on(&self, node: NodeId) -> u64 {
        self.held_by(node)
            .filter_map(|id| self.objects.get(&id))
            .map(|r| r.size)
            .sum()
    }

    /// Whether object session `session` was given out (`OpenObjectSession`).
    pub fn session_given(&self, session: u64) -> bool {
        (FIRST_SESSION..=self.last_session).contains(&session)
    }

    /// Everything session `session` owns (live and lost), in id order: the result objects of
    /// the tasks its client submitted while it was open, then its `put`s, the ids
    /// `(session, _)`.
    pub fn session_owned(&self, session: u64) -> Vec<ObjectId> {
        // Task ids stay below FIRST_SESSION: results come before the session's own ids.
        self.by_session
            .get(&session)
            .into_iter()
            .flatten()
            .copied()
            .chain(self.session_objects(session).map(|(id, _)| id))
            .collect()
    }

    /// The objects session `session` put (live and lost), by id: the ids `(session, _)`.
    pub fn session_objects(
        &self,
        session: u64,
    ) -> impl Iterator<Item = (ObjectId, &ObjectRecord)> + '_ {
        self.objects
            .range(ObjectId(session, 0)..=ObjectId(session, u64::MAX))
            .map(|(id, rec)| (*id, rec))
    }

    /// The object sessions that own at least one object in the table, in order. (A session's
    /// objects are the ids `(session, _)`, from [`FIRST_SESSION`] up: a walk by range that
    /// skips from one session to the next, not over every object.)
    pub fn sessions_with_objects(&self) -> Vec<u64> {
        let mut sessions: BTreeSet<u64> = self.by_session.keys().copied().collect();
        let mut from = ObjectId(FIRST_SESSION, 0);
        while let Some((id, _)) = self.objects.range(from..).next() {
            sessions.insert(id.0);
            let Some(next) = id.0.checked_add(1) else {
                break;
            };
            from = ObjectId(next, 0);
        }
        sessions.into_iter().collect()
    }

    /// Result object `id` belongs to session `session` (its task's label).
    fn add_session_result(&mut self, session: u64, id: ObjectId) {
        self.by_session.entry(session).or_default().insert(id);
    }

    /// Result object `id` no longer belongs to session `session`: released, or its task's
    /// record evicted.
    fn remove_session_result(&mut self, session: u64, id: ObjectId) {
        if let Some(ids) = self.by_session.get_mut(&session) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    fn remember_freed(&mut self, id: ObjectId, now: Millis) {
        if self.freed_ids.insert(id) {
            self.freed.push_back((id, now));
        }
        while self.freed.len() > MAX_FREED_KEPT {
            if let Some((old, _)) = self.freed.pop_front() {
                self.freed_ids.remove(&old);
            }
        }
    }
}

/// The location resource of object `id` of namespace `ns`: `NS/object.O`, or `object.O`.
pub fn location_resource(id: ObjectId, ns: Option<&Namespace>) -> ResourceName {
    // Always valid: `object.` and two u64s are at most 48 bytes, a namespace segment 63.
    let local = ResourceName::new(&id.location_name()).expect("an object id makes a valid name");
    match ns {
        Some(ns) => local.in_namespace(ns),
        None => local,
    }
}

/// Whether a caller of namespace `ns` (`None`: the admin, who sees every namespace's objects
/// when `sees_everything`) may see an object of namespace `of`.
fn visible(of: Option<&Namespace>, ns: Option<&Namespace>, sees_everything: bool) -> bool {
    sees_everything || of == ns
}

impl ClusterState {
    /// The object table.
    pub fn objects(&self) -> &ObjectTable {
        &self.objects
    }

    /// Puts back a table read from a snapshot (the head's codec writes it after the image).
    pub fn set_objects(&mut self, table: ObjectTable) {
        self.objects = table.rebuilt();
        self.rebuild_session_results();
    }

    /// Rebuilds which session each result object belongs to, from the task records' labels:
    /// a result whose task has no record (evicted by retention) belongs to none, as it did
    /// since that eviction ([`ClusterState::forget_session_result`]).
    fn rebuild_session_results(&mut self) {
        let pairs: Vec<(u64, ObjectId)> = self
            .objects
            .objects
            .iter()
            .filter_map(|(id, rec)| match rec.owner {
                ObjectOwner::Task(task) => Some((self.tasks.get(&task)?.object_session()?, *id)),
                ObjectOwner::Session(_) => None,
            })
            .collect();
        self.objects.by_session.clear();
        for (session, id) in pairs {
            self.objects.add_session_result(session, id);
        }
    }

    /// Task `task`'s record is going (retention): its result object, if it is still in the
    /// table, belongs to no session from now on, as a replica restored from a snapshot would
    /// find it (the session is known only from the task's label). Its reference's owner
    /// still releases it.
    pub(crate) fn forget_session_result(&mut self, task: TaskId) {
        if let Some(session) = self.tasks.get(&task).and_then(|r| r.object_session()) {
            self.objects
                .remove_session_result(session, ObjectId::task_result(task));
        }
    }

    /// `ObjectsSealed`: records new copies, all or none. A copy that contradicts what the table
    /// knows of its object (another size, checksum, owner or namespace) refuses the batch,
    /// naming the object. Copies that cannot count any more (their node is gone or was never
    /// admitted, their object was released) are left out and returned with why, so that the
    /// reporter deletes them; the others are recorded.
    pub(crate) fn objects_sealed(
        &mut self,
        copies: Vec<SealedCopy>,
        now: Millis,
    ) -> Result<Vec<(ObjectId, String)>, ApplyError> {
        self.seal_copies(copies, None, now)
    }

    /// A copy of a task's result counts only once that task has produced it: its id is the
    /// task's result id, and the task succeeded (or is gone with its record kept). `completing`
    /// is the task whose completion is being recorded, whose result may be new.
    fn task_copy_refusal(&self, c: &SealedCopy, completing: Option<TaskId>) -> Option<String> {
        let ObjectOwner::Task(task) = c.owner else {
            return None;
        };
        if c.id != ObjectId::task_result(task) {
            return Some(format!("it is not the result of its owner, task {task}"));
        }
        if completing == Some(task) || self.objects.was_freed(c.id) {
            return None;
        }
        match self.tasks.get(&task) {
            Some(t) if t.state != TaskState::Succeeded => Some(format!(
                "task {task} is {} and has not produced it",
                t.state
            )),
            None if self.objects.get(c.id).is_none() => {
                Some(format!("task {task} has not produced it"))
            }
            _ => None,
        }
    }

    fn seal_copies(
        &mut self,
        copies: Vec<SealedCopy>,
        completing: Option<TaskId>,
        now: Millis,
    ) -> Result<Vec<(ObjectId, String)>, ApplyError> {
        for c in &copies {
            if let Some(why) = self.task_copy_refusal(c, completing) {
                return Err(ApplyError::ObjectMismatch { id: c.id, why });
            }
            let known = self
                .objects
                .get(c.id)
                .map(|r| (r.size, r.checksum, r.owner, r.namespace.clone()));
            let same_batch = copies
                .iter()
                .find(|o| o.id == c.id)
                .map(|o| (o.size, o.checksum, o.owner, o.namespace.clone()));
            for (size, checksum, owner, namespace) in known.into_iter().chain(same_batch) {
                let why = if size != c.size {
                    Some(format!(
                        "its size is {size} bytes, this copy has {}",
                        c.size
                    ))
                } else if checksum != c.checksum {
                    Some(format!(
                        "its CRC-32C is {checksum:08x}, this copy's is {:08x}",
                        c.checksum
                    ))
                } else if owner != c.owner {
                    Some(format!(
                        "it is owned by {owner}, this copy says {}",
                        c.owner
                    ))
                } else if namespace != c.namespace {
                    Some("this copy names another namespace".to_string())
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(ApplyError::ObjectMismatch { id: c.id, why });
                }
            }
        }
        // The quota, before anything changes: each new object once, all or none.
        let mut adding: BTreeMap<&Namespace, (u64, BTreeSet<ObjectId>)> = BTreeMap::new();
        for c in &copies {
            if let Some(ns) = &c.namespace
                && self.objects.get(c.id).is_none()
                && !self.objects.was_freed(c.id)
            {
                let (bytes, ids) = adding.entry(ns).or_default();
                if ids.insert(c.id) {
                    *bytes = bytes.saturating_add(c.size);
                }
            }
        }
        for (ns, (bytes, _)) in adding {
            self.check_object_bytes(Some(ns), bytes)?;
        }
        let mut dropped = Vec::new();
        for c in copies {
            if self.objects.was_freed(c.id) {
                dropped.push((c.id, format!("object {} was freed", c.id)));
                continue;
            }
            let live = self.nodes.get(&c.node).is_some_and(|n| n.alive);
            if !live || !self.core.has_node(c.node) {
                dropped.push((c.id, format!("node {} is not live", c.node)));
                continue;
            }
            if !self.objects.objects.contains_key(&c.id)
                && let Some(ns) = &c.namespace
            {
                *self.objects.by_namespace.entry(ns.clone()).or_default() += c.size;
            }
            let rec = self
                .objects
                .objects
                .entry(c.id)
                .or_insert_with(|| ObjectRecord {
                    namespace: c.namespace.clone(),
                    size: c.size,
                    checksum: c.checksum,
                    owner: c.owner,
                    sealed_at: now,
                    holders: BTreeSet::new(),
                    lost: None,
                });
            if !rec.holders.insert(c.node) {
                continue; // reported again: nothing changes
            }
            rec.lost = None;
            self.objects.by_node.entry(c.node).or_default().insert(c.id);
            let update = ResourceUpdate {
                name: location_resource(c.id, c.namespace.as_ref()),
                op: CapacityOp::Set(Capacity::Unbounded),
                target: NodeSpec::Node(c.node),
            };
            // Cannot fail: the node is in the core (checked above) and the name is not
            // physical; were it to, the copy still counts and only its locality is missing.
            if let Err(err) = self.set_resources(std::slice::from_ref(&update), now) {
                tracing::warn!(object = %c.id, node = %c.node, %err, "no location resource");
            }
        }
        Ok(dropped)
    }

    /// `ObjectsReleased`: the owner (of namespace `ns`) let go of these objects. Each goes from
    /// the table with its location resources, and its holders are told to delete their copies.
    /// Ids the caller cannot see, and ids released already, change nothing; the ids that were
    /// never known (or are forgotten) are returned.
    pub(crate) fn objects_released(
        &mut self,
        ids: &[ObjectId],
        ns: Option<&Namespace>,
        sees_everything: bool,
        now: Millis,
    ) -> Vec<ObjectId> {
        let mut unknown = Vec::new();
        let mut deletes: BTreeMap<NodeId, Vec<ObjectId>> = BTreeMap::new();
        for &id in ids {
            let Some(rec) = self.objects.objects.get(&id) else {
                if !self.objects.was_freed(id) {
                    unknown.push(id);
                }
                continue;
            };
            if !visible(rec.namespace.as_ref(), ns, sees_everything) {
                unknown.push(id);
                continue;
            }
            let Some(rec) = self.objects.objects.remove(&id) else {
                continue;
            };
            if let ObjectOwner::Task(task) = rec.owner
                && let Some(session) = self.tasks.get(&task).and_then(|r| r.object_session())
            {
                self.objects.remove_session_result(session, id);
            }
            if let Some(ns) = &rec.namespace
                && let Some(bytes) = self.objects.by_namespace.get_mut(ns)
            {
                *bytes = bytes.saturating_sub(rec.size);
                if *bytes == 0 {
                    self.objects.by_namespace.remove(ns);
                }
            }
            let name = location_resource(id, rec.namespace.as_ref());
            for node in rec.holders {
                if let Some(held) = self.objects.by_node.get_mut(&node) {
                    held.remove(&id);
                    if held.is_empty() {
                        self.objects.by_node.remove(&node);
                    }
                }
                self.delete_location(node, &name, now);
                deletes.entry(node).or_default().push(id);
            }
            self.objects.remember_freed(id, now);
        }
        for (node, ids) in deletes {
            self.effects.push(Effect::DeleteObjects { node, ids });
        }
        unknown
    }

    fn delete_location(&mut self, node: NodeId, name: &ResourceName, now: Millis) {
        if !self.core.has_node(node) {
            return;
        }
        let update = ResourceUpdate {
            name: name.clone(),
            op: CapacityOp::Delete,
            target: NodeSpec::Node(node),
        };
        if let Err(err) = self.set_resources(std::slice::from_ref(&update), now) {
            tracing::warn!(%node, %name, %err, "could not delete an object's location");
        }
    }

    /// Node `node` was lost (`reason`): its copies go; an object with no copy left is marked
    /// lost with the node and why. (The node's resources, locations included, leave the
    /// scheduler with it.) Returns the task-made objects left with no copy, for lineage
    /// ([`ClusterState::rebuild_results`]), which clears or words their loss.
    pub(crate) fn objects_node_lost(&mut self, node: NodeId, reason: &str) -> Vec<ObjectId> {
        let Some(held) = self.objects.by_node.remove(&node) else {
            return Vec::new();
        };
        let mut task_made = Vec::new();
        for id in held {
            let Some(rec) = self.objects.objects.get_mut(&id) else {
                continue;
            };
            rec.holders.remove(&node);
            if rec.holders.is_empty() {
                rec.lost = Some(ObjectLoss {
                    node,
                    reason: reason.to_string(),
                });
                if matches!(rec.owner, ObjectOwner::Task(_)) {
                    task_made.push(id);
                }
            }
        }
        task_made
    }

    /// Lineage: each of `lost` (task-made objects whose last copy was on node `node`, lost
    /// because `reason`) is made again by running its task again under its id, when that task
    /// succeeded and has a retry left (an attempt counts, as a failed one does); the object
    /// then waits, with no copy and not lost, until the new attempt's completion records its
    /// copy. Otherwise the object stays lost, its reason saying why it cannot be rebuilt.
    pub(crate) fn rebuild_results(
        &mut self,
        lost: &[ObjectId],
        node: NodeId,
        reason: &str,
        now: Millis,
    ) {
        for &id in lost {
            let Some(ObjectOwner::Task(task)) = self.objects.get(id).map(|r| r.owner) else {
                continue;
            };
            let refusal = match self.tasks.get(&task) {
                None => Some(format!(
                    "its task {task} cannot run again: retention kept only its tombstone"
                )),
                Some(t) if t.state != TaskState::Succeeded => Some(format!(
                    "its task {task} is {} and did not rebuild it",
                    t.state
                )),
                Some(t) if t.attempt > t.spec.max_retries => Some(format!(
                    "its task {task} may not run again (attempt {} of {}: no retry left)",
                    t.attempt,
                    u64::from(t.spec.max_retries) + 1
                )),
                Some(_) => None,
            };
            if let Some(why) = refusal {
                if let Some(rec) = self.objects.objects.get_mut(&id) {
                    rec.lost = Some(ObjectLoss {
                        node,
                        reason: format!("{reason}; {why}"),
                    });
                }
                continue;
            }
            if let Some(rec) = self.objects.objects.get_mut(&id) {
                rec.lost = None;
            }
            let why = format!("rebuilding its result object {id}: node {node} was lost ({reason})");
            self.reopen_succeeded(task, why, now);
        }
    }

    /// Task `task`'s attempt returned its result as object `(task, 0)` of `size` bytes and
    /// CRC-32C `checksum`, sealed on node `node`: the copy is recorded with the completion, so
    /// that "succeeded" is never told before the reference is. A rebuild may give other bytes
    /// (a task that is not deterministic): with no copy left, the record takes the new ones.
    /// Refused (the attempt fails, saying why) when the copy cannot count.
    pub(crate) fn result_sealed(
        &mut self,
        task: TaskId,
        node: NodeId,
        (size, checksum): (u64, u32),
        now: Millis,
    ) -> Result<ObjectId, String> {
        let id = ObjectId::task_result(task);
        let namespace = self.tasks.get(&task).and_then(|r| r.namespace());
        if let Some(rec) = self.objects.objects.get_mut(&id)
            && rec.holders.is_empty()
        {
            rec.size = size;
            rec.checksum = checksum;
        }
        let copy = SealedCopy {
            id,
            size,
            checksum,
            owner: ObjectOwner::Task(task),
            namespace,
            node,
        };
        match self.seal_copies(vec![copy], Some(task), now) {
            Ok(dropped) => match dropped.into_iter().next() {
                Some((_, why)) => Err(format!("its result object {id} was not recorded: {why}")),
                None => {
                    if let Some(session) = self.tasks.get(&task).and_then(|r| r.object_session()) {
                        self.objects.add_session_result(session, id);
                    }
                    Ok(id)
                }
            },
            Err(err) => Err(format!("its result object {id} was not recorded: {err}")),
        }
    }

    /// What a caller of namespace `ns` may know of object `id`: its size, owner and copies
    /// with each holder's data address and, with `expiry_ms`, a read ticket valid until then
    /// for each live holder. Unknown, freed and lost objects are refused, each with an error
    /// that names the object.
    pub fn locate_object(
        &self,
        id: ObjectId,
        ns: Option<&Namespace>,
        sees_everything: bool,
        expiry_ms: Option<u64>,
    ) -> Result<ObjectView, ApplyError> {
        let mut view = self.object_view(id, ns, sees_everything)?;
        if let Some(expiry_ms) = expiry_ms {
            for h in &mut view.holders {
                h.ticket =
                    self.object_ticket(h.node, ObjectAccess::Read, id, &view.namespace, expiry_ms);
            }
        }
        if let Some(loss) = &view.lost {
            return Err(ApplyError::ObjectLost {
                id,
                node: loss.node,
                reason: loss.reason.clone(),
            });
        }
        Ok(view)
    }

    /// Object `id` as a caller of namespace `ns` sees it, lost or not (for listings).
    pub fn object_view(
        &self,
        id: ObjectId,
        ns: Option<&Namespace>,
        sees_everything: bool,
    ) -> Result<ObjectView, ApplyError> {
        let rec = match self.objects.objects.get(&id) {
            Some(rec) if visible(rec.namespace.as_ref(), ns, sees_everything) => rec,
            // Another namespace's object is unknown, freed or not.
            Some(_) => return Err(ApplyError::UnknownObject(id)),
            None if self.objects.was_freed(id) => return Err(ApplyError::ObjectFreed(id)),
            None => return Err(ApplyError::UnknownObject(id)),
        };
        Ok(self.view_of(id, rec))
    }

    /// Every object a caller of namespace `ns` may see, by id.
    pub fn list_objects(&self, ns: Option<&Namespace>, sees_everything: bool) -> Vec<ObjectView> {
        self.objects
            .objects
            .iter()
            .filter(|(_, r)| visible(r.namespace.as_ref(), ns, sees_everything))
            .map(|(id, r)| self.view_of(*id, r))
            .collect()
    }

    fn view_of(&self, id: ObjectId, rec: &ObjectRecord) -> ObjectView {
        let holders = rec
            .holders
            .iter()
            .map(|n| ObjectHolder {
                node: *n,
                address: self
                    .nodes
                    .get(n)
                    .and_then(|r| r.labels.get(DATA_ADDRESS_LABEL))
                    .map(str::to_owned),
                ticket: None,
            })
            .collect();
        ObjectView {
            id,
            namespace: rec.namespace.clone(),
            size: rec.size,
            checksum: rec.checksum,
            owner: rec.owner,
            sealed_at_ms: rec.sealed_at,
            holders,
            lost: rec.lost.clone(),
        }
    }

    /// An object ticket for `id` (of namespace `ns`) on node `node`, signed with that node's
    /// ticket key, valid until `expiry_ms`; `None` when the node is not live.
    pub fn object_ticket(
        &self,
        node: NodeId,
        access: ObjectAccess,
        id: ObjectId,
        ns: &Option<Namespace>,
        expiry_ms: u64,
    ) -> Option<String> {
        let rec = self.nodes.get(&node).filter(|r| r.alive)?;
        let ticket = ObjectTicket {
            node,
            access,
            objects: vec![id],
            expiry_ms,
            namespace: ns.as_ref().map(|ns| ns.as_str().to_owned()),
        };
        Some(ticket.sign(&ticket_key(&rec.secret.0)))
    }

    /// Where a `put` of object `id` (of namespace `ns`) should go: the live, admitted,
    /// non-draining node with a data address that holds the fewest bytes of objects (the
    /// lowest id among equals), its address and a write ticket for `id` there valid until
    /// `expiry_ms`; `None` when no node qualifies. (The head does not know how full each
    /// store is; a store without room refuses the push, naming the object.)
    pub fn place_object(
        &self,
        id: ObjectId,
        ns: &Option<Namespace>,
        expiry_ms: u64,
    ) -> Option<(NodeId, String, String)> {
        let (node, address) = self
            .nodes
            .iter()
            .filter(|(id, r)| r.alive && !r.draining && self.core.has_node(**id))
            .filter_map(|(id, r)| Some((*id, r.labels.get(DATA_ADDRESS_LABEL)?.to_owned())))
            .min_by_key(|(id, _)| (self.objects.bytes_on(*id), *id))?;
        let ticket = self.object_ticket(node, ObjectAccess::Write, id, ns, expiry_ms)?;
        Some((node, address, ticket))
    }

    /// Refuses `asked` more bytes of objects in namespace `ns` past its quota
    /// ([`StateConfig::namespace_object_bytes`](super::StateConfig)); the admin's objects are
    /// not counted.
    pub fn check_object_bytes(&self, ns: Option<&Namespace>, asked: u64) -> Result<(), ApplyError> {
        let Some(ns) = ns else {
            return Ok(());
        };
        let stored = self.objects.namespace_bytes(ns);
        let limit = self.config.namespace_object_bytes;
        if stored.saturating_add(asked) > limit {
            return Err(ApplyError::ObjectBytesExceeded {
                namespace: ns.clone(),
                stored,
                asked,
                limit,
            });
        }
        Ok(())
    }

    /// A new object session: a number never given out before (from [`FIRST_SESSION`] up).
    pub(crate) fn open_object_session(&mut self) -> u64 {
        let t = &mut self.objects;
        t.last_session = t.last_session.max(FIRST_SESSION - 1) + 1;
        t.last_session
    }

    /// `CloseObjectSession`: session `session` ended (its client closed, or the leader saw it
    /// lapse). Every object it owns ([`ObjectTable::session_owned`]: its `put`s and the result
    /// objects of the tasks submitted under it) that a caller of namespace `ns` may see is
    /// released as
    /// [`objects_released`](Self::objects_released) releases it, except the objects a pending
    /// or running task takes as an argument ([`object_pins`](Self::object_pins)), which stay
    /// until that task ends (a later close, or the leader's next lapse check, releases them).
    /// Returns the ids released and the ids kept, each in id order. Closing a session that owns
    /// nothing (closed before, or that never put) changes nothing; a number never given out
    /// that owns nothing is refused, changing nothing.
    pub(crate) fn close_object_session(
        &mut self,
        session: u64,
        ns: Option<&Namespace>,
        sees_everything: bool,
        now: Millis,
    ) -> Result<(Vec<ObjectId>, Vec<ObjectId>), ApplyError> {
        // (A session that owns objects is known, given out or not: copies are reported with
        // the ids their client chose.)
        let owned = self.objects.session_owned(session);
        if !self.objects.session_given(session) && owned.is_empty() {
            return Err(ApplyError::UnknownObjectSession(session));
        }
        let pins = self.object_pins();
        let (pinned, released): (Vec<ObjectId>, Vec<ObjectId>) = owned
            .into_iter()
            .filter(|id| {
                self.objects
                    .get(*id)
                    .is_some_and(|rec| visible(rec.namespace.as_ref(), ns, sees_everything))
            })
            .partition(|id| pins.contains(id));
        // Every id is in the table and visible: none comes back unknown.
        self.objects_released(&released, ns, sees_everything, now);
        Ok((released, pinned))
    }

    /// Whether a caller of namespace `ns` may renew object session `session`: it was given
    /// out, and it owns nothing yet or an object the caller may see (a caller cannot keep
    /// another namespace's session from lapsing). Its `put`s decide while it has any, its
    /// tasks' results only then: a caller that named the session for its own tasks does not
    /// keep the session's `put`s from lapsing.
    pub fn may_renew_session(
        &self,
        session: u64,
        ns: Option<&Namespace>,
        sees_everything: bool,
    ) -> bool {
        if !self.objects.session_given(session) {
            return false;
        }
        let sees = |rec: &ObjectRecord| visible(rec.namespace.as_ref(), ns, sees_everything);
        let mut puts = self.objects.session_objects(session).peekable();
        if puts.peek().is_some() {
            return puts.any(|(_, rec)| sees(rec));
        }
        match self.objects.by_session.get(&session) {
            None => true,
            Some(ids) => ids.iter().any(|id| self.objects.get(*id).is_some_and(sees)),
        }
    }

    /// Whether a task of namespace `ns` may name object session `session` as its own
    /// (`escher.object-session`): the session's first `put`, or else its first task result,
    /// is of that namespace, or it owns nothing yet. (A session's objects are its client's,
    /// all of one namespace: the first stands for them.)
    pub(crate) fn may_name_session(&self, session: u64, ns: Option<&Namespace>) -> bool {
        let first = self
            .objects
            .session_objects(session)
            .next()
            .map(|(_, rec)| rec)
            .or_else(|| {
                let id = self.objects.by_session.get(&session)?.first()?;
                self.objects.get(*id)
            });
        first.is_none_or(|rec| visible(rec.namespace.as_ref(), ns, false))
    }

    /// The objects that a pending or running task takes as an argument: a session that ends
    /// keeps them until the task does.
    pub fn object_pins(&self) -> BTreeSet<ObjectId> {
        self.tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .flat_map(|t| t.object_args())
            .collect()
    }
}
