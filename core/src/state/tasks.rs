//! The task life cycle: accepted, dispatched, started, finished, retried, cancelled.

use std::collections::BTreeMap;

use escher_proto::types::{
    ActorChange, Assignment, ClusterEvent, Labels, NAMESPACE_LABEL, OBJECT_SESSION_LABEL,
    OBJECTS_LABEL, RESERVATION_LABEL, RESULT_ARGS_LABEL, STRATEGY_LABEL, TaskFinished,
    format_object_args, parse_object_args, parse_object_session, parse_result_args,
};
use escher_proto::types::{
    Capacity, GangStrategy, Namespace, NodeId, NodeSpec, ObjectId, ResourceName, ResourceSet,
    TaskId, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus,
};

use super::apply::ClusterState;
use super::command::Effect;
use super::error::ApplyError;
use super::record::{TaskRecord, actor_name_of, namespace_of};
use crate::scheduler::{Event, Millis};

impl ClusterState {
    /// Accepts a batch of tasks, all or none; submitted from inside running task `parent`,
    /// they are recorded as its children (`lineage.rs`) when it still has a record.
    pub(crate) fn submit(
        &mut self,
        specs: Vec<TaskSpec>,
        namespace: Option<&Namespace>,
        parent: Option<TaskId>,
        now: Millis,
    ) -> Result<Vec<TaskId>, ApplyError> {
        let parent = parent.filter(|p| self.tasks.contains_key(p));
        let mut accepted = Vec::with_capacity(specs.len());
        let mut bytes = 0u64;
        let mut names = Vec::new();
        for (index, spec) in specs.into_iter().enumerate() {
            let spec = self.qualify_spec(spec, namespace, index)?;
            let spec = self.check_object_args(spec, namespace, index)?;
            self.check_object_session(&spec, namespace, index)?;
            if let Some(key) = actor_name_of(&spec) {
                self.check_actor_name(&key, &names)?;
                // Ids are given in the order of the batch, so this actor's will be this one.
                names.push((key, TaskId(self.next_task + accepted.len() as u64)));
            }
            let size = spec.stored_bytes();
            let limit = self.config.max_task_bytes;
            if size > limit {
                return Err(ApplyError::TaskTooLarge {
                    index,
                    bytes: size,
                    limit,
                });
            }
            bytes = bytes.saturating_add(size);
            accepted.push(spec);
        }
        self.check_quota(namespace, accepted.len())?;
        self.check_spec_bytes(namespace, bytes)?;
        let mut ids = Vec::with_capacity(accepted.len());
        for spec in accepted {
            count_unfinished(&mut self.unfinished, namespace_of(&spec), true);
            self.count_spec_bytes(&spec, true);
            let id = TaskId(self.next_task);
            self.next_task += 1;
            let resources = spec.resources.clone();
            let deadline = spec.pending_deadline.map(|d| now.saturating_add(millis(d)));
            let time_limit = spec.timeout.map(millis);
            let rec = TaskRecord::new(spec, now);
            for name in rec.created_names() {
                self.creators.entry(name).or_default().insert(id);
            }
            if let Some(key) = rec.actor_name() {
                self.actor_names.insert(key, id);
            }
            let prefer = rec.preferred_locations();
            self.tasks.insert(id, Box::new(rec));
            if let Some(parent) = parent {
                self.lineage.link(id, parent);
            }
            self.record_submitted(id, now);
            self.core.prefer(id, prefer);
            self.core_event(
                Event::TaskSubmitted {
                    task: id,
                    resources,
                    deadline,
                    time_limit,
                },
                now,
            );
            ids.push(id);
        }
        Ok(ids)
    }

    /// Refuses an actor name that a live actor of its namespace has, or that an earlier actor
    /// of the same batch (`batch`) asks for.
    fn check_actor_name(
        &self,
        key: &(Option<Namespace>, String),
        batch: &[((Option<Namespace>, String), TaskId)],
    ) -> Result<(), ApplyError> {
        let earlier = batch.iter().find(|(k, _)| k == key).map(|(_, id)| id);
        match self.actor_names.get(key).or(earlier) {
            Some(holder) => Err(ApplyError::ActorNameTaken {
                name: key.1.clone(),
                holder: *holder,
            }),
            None => Ok(()),
        }
    }

    /// The live actor named `name` in `namespace`, if any.
    pub fn actor_named(&self, namespace: Option<&Namespace>, name: &str) -> Option<TaskId> {
        self.actor_names
            .get(&(namespace.cloned(), name.to_string()))
            .copied()
    }

    /// The core placed a task: record it, create what it declares, and send it to the worker.
    ///
    /// Decisions are acted on after the whole command, so one may be stale: a later step of
    /// the same command ended the task (a cancel of several gang members), and the core no
    /// longer runs it. It is ignored.
    pub(crate) fn dispatched(&mut self, id: TaskId, node: NodeId, now: Millis) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        if rec.state != TaskState::Pending || self.core.running_on(id) != Some(node) {
            return;
        }
        rec.state = TaskState::Running;
        rec.node = Some(node);
        rec.attempt += 1;
        rec.started_at = Some(now);
        rec.pending_reason = None;
        rec.devices = None;
        rec.begin_attempt(node, now);
        let assignment = Assignment {
            task_id: id,
            attempt: rec.attempt,
            spec: rec.spec.clone(),
            allocation: rec.spec.resources.clone(),
            task_token: String::new(),
            objects: Vec::new(),
        };
        let hooks = rec.spec.on_start.clone();
        let native = rec.native;
        let reservation = rec.reservation();
        self.record_task(id, now, |rec| ClusterEvent::Started {
            task: id,
            node,
            attempt: rec.attempt,
            namespace: rec.namespace(),
        });
        if let Some(name) = reservation {
            let placed = Some((id, node));
            self.record(
                ClusterEvent::Reservation { name, placed },
                Labels::new(),
                now,
            );
        }
        self.ghost_resources(id, node, true, now);
        self.run_hooks(id, node, &hooks, now);
        if !native {
            let assignment = Box::new(assignment);
            self.effects.push(Effect::Assign { node, assignment });
        }
    }

    /// Accepts a reservation: one native ghost per bundle, submitted as a gang.
    pub(crate) fn reserve(
        &mut self,
        name: ResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<std::time::Duration>,
        ns: Option<&Namespace>,
        now: Millis,
    ) -> Result<Vec<TaskId>, ApplyError> {
        let name = self.qualify_writable(&name, ns)?;
        if self.reservations.contains_key(&name) {
            return Err(ApplyError::ReservationExists(name));
        }
        if bundles.is_empty() {
            let why = "a reservation needs at least one bundle".to_string();
            return Err(ApplyError::InvalidTask { index: 0, why });
        }
        let mut specs = Vec::with_capacity(bundles.len());
        for (index, bundle) in bundles.into_iter().enumerate() {
            let mut resources = ResourceSet::new();
            for (r, a) in bundle.iter() {
                resources.insert(self.qualify(r, ns)?, a);
            }
            let mut creates = Vec::new();
            for (r, a) in resources.iter() {
                let local = r.local_part();
                for prefix in [name.to_string(), format!("{name}-{index}")] {
                    let created = ResourceName::new(&format!("{prefix}.{local}")).map_err(|e| {
                        let why = format!("reservation resource name: {e}");
                        ApplyError::InvalidTask { index, why }
                    })?;
                    // Checked whole: `mig` over `1g.5gb` would name a physical MIG slice.
                    super::resources::check_not_physical(&created)?;
                    creates.push((created, Capacity::Finite(a)));
                }
            }
            // Holders carry their namespace like every task (an app sees, and releases, its
            // own) and their reservation's name.
            let mut labels = escher_proto::types::Labels::new();
            let label = |e: escher_proto::types::TypeError| ApplyError::InvalidTask {
                index,
                why: e.to_string(),
            };
            if let Some(ns) = ns {
                labels.insert(NAMESPACE_LABEL, ns.as_str()).map_err(label)?;
            }
            labels
                .insert(RESERVATION_LABEL, name.as_str())
                .map_err(label)?;
            labels
                .insert(STRATEGY_LABEL, strategy.as_str())
                .map_err(label)?;
            specs.push(TaskSpec {
                name: format!("{name} bundle {index}"),
                kind: TaskKind::Ghost { creates, ttl: None },
                resources,
                labels,
                max_retries: u32::MAX,
                timeout: None,
                pending_deadline: timeout,
                on_start: Vec::new(),
                on_success: Vec::new(),
            });
        }
        let deadline = timeout.map(|d| now.saturating_add(millis(d)));
        self.check_quota(ns, specs.len())?;
        let bytes = specs.iter().map(TaskSpec::stored_bytes).sum();
        self.check_spec_bytes(ns, bytes)?;
        let mut members = Vec::with_capacity(specs.len());
        for spec in specs {
            count_unfinished(&mut self.unfinished, namespace_of(&spec), true);
            self.count_spec_bytes(&spec, true);
            let id = TaskId(self.next_task);
            self.next_task += 1;
            members.push((id, spec.resources.clone()));
            let mut rec = TaskRecord::new(spec, now);
            rec.native = true;
            for name in rec.created_names() {
                self.creators.entry(name).or_default().insert(id);
            }
            self.tasks.insert(id, Box::new(rec));
            self.record_submitted(id, now);
        }
        let ids = members.iter().map(|(t, _)| *t).collect();
        self.reservations.insert(name, members.len());
        self.core_event(
            Event::GangSubmitted {
                tasks: members,
                strategy,
                deadline,
            },
            now,
        );
        Ok(ids)
    }

    /// A worker reported that an attempt started. An actor's worker reports it once the
    /// incarnation's constructor returned, so for an actor this is "incarnation ready".
    pub(crate) fn started(&mut self, id: TaskId, attempt: u32, now: Millis) {
        if let Some(rec) = self.tasks.get_mut(&id)
            && rec.state == TaskState::Running
            && rec.attempt == attempt
        {
            rec.started_at = Some(now);
            self.record_actor(id, ActorChange::Ready, None, now);
        }
    }

    /// Node `node` holds a copy of task `task`'s result object that the table does not count
    /// (its completion was refused, or came from an attempt given up): the node is told to
    /// delete it, since no release will ever name it. Not while the table counts the node as
    /// a holder, nor while another attempt of the task runs there (its copy, under the same
    /// id, may be the one that will be recorded); `ending` says the running attempt is the one
    /// whose completion was refused.
    fn unrecorded_result(&mut self, task: TaskId, node: NodeId, ending: bool) {
        let object = ObjectId::task_result(task);
        let counted = self
            .objects
            .get(object)
            .is_some_and(|rec| rec.holders.contains(&node));
        let running_there = !ending
            && self
                .tasks
                .get(&task)
                .is_some_and(|rec| rec.state == TaskState::Running && rec.node == Some(node));
        if !counted && !running_there {
            self.effects.push(Effect::DeleteObjects {
                node,
                ids: vec![object],
            });
        }
    }

    /// A worker reported the end of an attempt. Reports for other attempts are stale and
    /// ignored (the task was retried or cancelled meanwhile), but for the copy of a result
    /// object such a report says its node made: that node is told to delete it.
    pub(crate) fn finished(&mut self, report: TaskFinished, now: Millis) {
        let id = report.task_id;
        let Some(rec) = self.tasks.get(&id) else {
            return;
        };
        if rec.state != TaskState::Running || rec.attempt != report.attempt {
            if matches!(report.outcome, Ok(TaskResult::Object { .. }))
                && let Some(made) = rec.attempts.iter().find(|a| a.attempt == report.attempt)
            {
                let node = made.node;
                self.unrecorded_result(id, node, false);
            }
            return;
        }
        let node = rec.node.unwrap_or(NodeId(0));
        let cancel_requested = rec.cancel_requested;
        let timeout = rec.spec.timeout;
        if let Some(rec) = self.tasks.get_mut(&id)
            && let Some(last) = rec.attempts.last_mut()
            && last.attempt == report.attempt
        {
            last.output = report.output.map(Box::new);
        }
        // A ghost's resources go before its allocation is released: otherwise the round that
        // the release starts could admit a waiting task to the bundle of a ghost that ended.
        self.ghost_resources(id, node, false, now);
        self.core_event(Event::TaskFinished { task: id }, now);
        let mut outcome = report.outcome;
        if let Ok(TaskResult::Object { size, checksum }) = outcome {
            // Its copy is recorded with its completion, in this same entry (`objects.rs`).
            if let Err(why) = self.result_sealed(id, node, (size, checksum), now) {
                self.unrecorded_result(id, node, true);
                outcome = Err(why);
            }
        }
        let report = TaskFinished {
            outcome,
            output: None,
            ..report
        };
        let succeeded = report.outcome.as_ref().is_ok_and(TaskResult::is_success);
        if let Some(rec) = self.tasks.get_mut(&id)
            && rec.requeue.is_some()
        {
            if !succeeded {
                // Stopped for a requeue (or it failed first): it runs again with its new
                // resources.
                self.requeued_attempt_ended(id, now);
                return;
            }
            // It succeeded before the stop landed: that is its result; nothing runs again.
            rec.requeue = None;
        }
        if cancel_requested {
            // Kept if it fits: the limit bounds what the replicated state stores either way.
            let limit = self.config.max_result_bytes;
            let result = report
                .outcome
                .ok()
                .filter(|r| !matches!(r, TaskResult::Returned(bytes) if bytes.len() > limit));
            let why = Some("cancelled by request".to_string());
            self.terminate(id, TaskState::Cancelled, why, result, now);
            return;
        }
        let failure = match report.outcome {
            Ok(TaskResult::Returned(bytes)) if bytes.len() > self.config.max_result_bytes => {
                let why = format!(
                    "result of {} bytes exceeds the head's limit of {} bytes (--max-result-bytes)",
                    bytes.len(),
                    self.config.max_result_bytes
                );
                // Running it again would give the same result: no retry.
                self.terminate(id, TaskState::Failed, Some(why), None, now);
                return;
            }
            Ok(oom @ TaskResult::OutOfMemory { .. }) => {
                let why = if report.timed_out {
                    format!("timed out, then {oom}")
                } else {
                    oom.to_string()
                };
                (why, Some(oom))
            }
            Ok(TaskResult::Exited { code }) if code != 0 => {
                let why = match (report.timed_out, timeout) {
                    (true, Some(t)) => format!("timed out after {t:?} (exit code {code})"),
                    (true, None) => format!("timed out (exit code {code})"),
                    (false, _) => format!("exited with code {code}"),
                };
                (why, Some(TaskResult::Exited { code }))
            }
            Ok(result) => {
                let hooks = self
                    .tasks
                    .get(&id)
                    .map(|r| r.spec.on_success.clone())
                    .unwrap_or_default();
                self.run_hooks(id, node, &hooks, now);
                self.terminate(id, TaskState::Succeeded, None, Some(result), now);
                return;
            }
            Err(why) if report.timed_out => (format!("timed out: {why}"), None),
            Err(why) => (why, None),
        };
        self.failed_attempt(id, failure.0, failure.1, now);
    }

    /// An attempt failed: run it again while retries remain, else fail the task, keeping the
    /// A reservation holder's node was lost: the whole reservation is placed again under its
    /// strategy (its other holders give their bundles back first), so that a strict-spread or
    /// strict-pack reservation keeps its constraint. Tasks running inside its bundles keep
    /// what they hold until they end.
    pub(crate) fn replace_reservation(&mut self, lost: TaskId, why: &str, now: Millis) {
        let Some(rec) = self.tasks.get(&lost) else {
            return;
        };
        let (Some(name), Some(strategy)) = (
            rec.reservation(),
            rec.spec
                .labels
                .get(STRATEGY_LABEL)
                .and_then(|s| s.parse::<GangStrategy>().ok()),
        ) else {
            return;
        };
        let members: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, r)| !r.state.is_terminal() && r.reservation().as_ref() == Some(&name))
            .map(|(id, _)| *id)
            .collect();
        for id in &members {
            let Some(rec) = self.tasks.get(id) else {
                continue;
            };
            // Holders on the lost node are forgotten by the core already.
            if *id != lost
                && rec.state == TaskState::Running
                && self.core.running_on(*id).is_some()
                && let Some(node) = rec.node
            {
                // Its bundle goes back: its resources first, then its allocation.
                self.ghost_resources(*id, node, false, now);
                self.core_event(Event::TaskFinished { task: *id }, now);
            }
            if let Some(rec) = self.tasks.get_mut(id) {
                rec.state = TaskState::Pending;
                rec.node = None;
                let reason =
                    format!("reservation {name} is placed again: a holder's node was lost ({why})");
                rec.reason = Some(reason.clone());
                self.record_pending(*id, Some(reason), now);
            }
        }
        let bundles = members
            .iter()
            .filter_map(|id| Some((*id, self.tasks.get(id)?.spec.resources.clone())))
            .collect();
        self.core_event(
            Event::GangSubmitted {
                tasks: bundles,
                strategy,
                deadline: None,
            },
            now,
        );
    }

    /// last attempt's result (a command's exit code) when it had one.
    pub(crate) fn failed_attempt(
        &mut self,
        id: TaskId,
        why: String,
        result: Option<TaskResult>,
        now: Millis,
    ) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        rec.end_attempt(|| why.clone());
        if rec.requeue.is_some() {
            // It was being stopped for a requeue anyway: it runs again with the new resources.
            self.requeued_attempt_ended(id, now);
            return;
        }
        if rec.cancel_requested {
            let why = Some(format!("cancelled by request ({why})"));
            self.terminate(id, TaskState::Cancelled, why, None, now);
            return;
        }
        if rec.attempt > rec.spec.max_retries {
            self.terminate(id, TaskState::Failed, Some(why), result, now);
            return;
        }
        let reason = format!("attempt {} failed ({why}); retrying", rec.attempt);
        self.record_actor(id, ActorChange::Restarting, Some(why), now);
        self.resubmit(id, reason, now);
    }

    /// Moves a task to a terminal state and tells the runtime.
    pub(crate) fn terminate(
        &mut self,
        id: TaskId,
        state: TaskState,
        reason: Option<String>,
        result: Option<TaskResult>,
        now: Millis,
    ) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        // A successful attempt's end is the task's result (`TaskRecord::ended`).
        if rec.state == TaskState::Running
            && let Some(why) = &reason
        {
            rec.end_attempt(|| why.clone());
        }
        let ns = rec.namespace();
        let was_terminal = rec.state.is_terminal();
        let mut released = None;
        if !was_terminal {
            self.retention.task_finished(id);
            count_unfinished(&mut self.unfinished, ns.clone(), false);
            for name in rec.created_names() {
                if let std::collections::btree_map::Entry::Occupied(mut e) =
                    self.creators.entry(name)
                {
                    e.get_mut().remove(&id);
                    if e.get().is_empty() {
                        e.remove();
                    }
                }
            }
            if let Some(name) = rec.reservation() {
                release_holder(&mut self.reservations, name.clone());
                released = Some(name).filter(|n| !self.reservations.contains_key(n));
            }
            if let Some(key) = rec.actor_name()
                && self.actor_names.get(&key) == Some(&id)
            {
                self.actor_names.remove(&key);
            }
        }
        let (mut state, mut reason, mut result) = (state, reason, result);
        if let (Some(ns), Some(TaskResult::Returned(bytes))) = (&ns, &result) {
            let stored = self.result_bytes.get(ns).copied().unwrap_or(0);
            let limit = self.config.namespace_result_bytes;
            let len = bytes.len() as u64;
            if stored.saturating_add(len) > limit {
                // Kept, the result would pass the namespace's quota: the task fails instead
                // (running it again would give the same result), and says why.
                if state == TaskState::Succeeded {
                    state = TaskState::Failed;
                    reason = Some(format!(
                        "its result of {len} bytes would take namespace {ns} past its quota of \
                         {limit} stored result bytes (it stores {stored}); results are released \
                         as retention evicts finished tasks (escher-head --retain-finished, \
                         --retain-for), or the operator can raise \
                         --namespace-result-bytes"
                    ));
                }
                result = None;
            } else {
                *self.result_bytes.entry(ns.clone()).or_default() += len;
            }
        }
        rec.state = state;
        rec.reason = reason;
        rec.result = result.map(Box::new);
        rec.pending_reason = None;
        rec.finished_at = Some(now);
        self.effects.push(Effect::Terminal { task: id });
        if !was_terminal {
            self.record_task(id, now, |rec| ClusterEvent::Finished {
                task: id,
                state: rec.state,
                reason: rec.reason.clone(),
                attempt: rec.attempt,
                namespace: rec.namespace(),
            });
            let why = self.tasks.get(&id).and_then(|rec| rec.reason.clone());
            self.record_actor(id, ActorChange::Died, why, now);
        }
        if let Some(name) = released {
            let event = ClusterEvent::Reservation { name, placed: None };
            self.record(event, Labels::new(), now);
        }
    }

    /// Records that task `id` was accepted.
    fn record_submitted(&mut self, id: TaskId, now: Millis) {
        self.record_task(id, now, |rec| ClusterEvent::Submitted {
            task: id,
            name: rec.spec.name.clone(),
            namespace: rec.namespace(),
        });
    }

    /// Cancels tasks, all known or none. Pending tasks end at once; running ones when their
    /// worker confirms the process is gone (with `force`, killed at once: no grace).
    pub(crate) fn cancel(
        &mut self,
        ids: &[TaskId],
        force: bool,
        now: Millis,
    ) -> Result<Vec<TaskStatus>, ApplyError> {
        self.check_cancel(ids)?;
        self.cancel_each(ids, force, now);
        self.cancelled_statuses(ids)
    }

    /// `CancelTasks`: [`cancel`](Self::cancel), and with `recursive` every recorded
    /// descendant of `ids` that has not ended as well (`lineage.rs`), in this one entry. The
    /// reply holds the statuses of `ids` only, in their order.
    pub(crate) fn cancel_tasks(
        &mut self,
        ids: &[TaskId],
        recursive: bool,
        force: bool,
        now: Millis,
    ) -> Result<Vec<TaskStatus>, ApplyError> {
        if !recursive {
            return self.cancel(ids, force, now);
        }
        self.check_cancel(ids)?;
        let all = self.with_descendants(ids);
        self.cancel_each(&all, force, now);
        self.cancelled_statuses(ids)
    }

    /// Refuses a cancel of an unknown task, or one that names a task twice.
    fn check_cancel(&self, ids: &[TaskId]) -> Result<(), ApplyError> {
        let mut seen = std::collections::BTreeSet::new();
        for id in ids {
            // An evicted task with a tombstone is finished: cancelling it changes nothing.
            self.check_known(*id)?;
            if !seen.insert(*id) {
                return Err(ApplyError::DuplicateTask(*id));
            }
        }
        Ok(())
    }

    /// The statuses of cancelled tasks, in order.
    fn cancelled_statuses(&self, ids: &[TaskId]) -> Result<Vec<TaskStatus>, ApplyError> {
        // Every id was checked known, and nothing in a command drops a record or a tombstone
        // (retention runs after it): a status is always found.
        ids.iter()
            .map(|id| self.status(*id).ok_or_else(|| self.missing_task(*id)))
            .collect()
    }

    /// Cancels each of `ids` (checked) that has a record and has not ended.
    fn cancel_each(&mut self, ids: &[TaskId], force: bool, now: Millis) {
        for id in ids {
            let Some(rec) = self.tasks.get(id) else {
                continue;
            };
            match rec.state {
                TaskState::Pending => {
                    self.core_event(Event::TaskCancelled { task: *id }, now);
                    let why = Some("cancelled by request while pending".to_string());
                    self.terminate(*id, TaskState::Cancelled, why, None, now);
                }
                TaskState::Running if rec.native => {
                    // No worker holds it: release it now.
                    let node = rec.node.unwrap_or(NodeId(0));
                    self.core_event(Event::TaskFinished { task: *id }, now);
                    self.ghost_resources(*id, node, false, now);
                    let why = Some("reservation released".to_string());
                    self.terminate(
                        *id,
                        TaskState::Cancelled,
                        why,
                        Some(TaskResult::Released),
                        now,
                    );
                }
                // Sent again on a second cancel too: the worker may not have received the first
                // (its registration after a broken stream re-derives it as well).
                TaskState::Running => {
                    let (node, attempt) = (rec.node.unwrap_or(NodeId(0)), rec.attempt);
                    if let Some(rec) = self.tasks.get_mut(id) {
                        rec.cancel_requested = true;
                    }
                    let reason = "cancelled by request".to_string();
                    self.effects.push(Effect::Cancel {
                        node,
                        task: *id,
                        attempt,
                        reason,
                        force,
                    });
                }
                _ => {}
            }
        }
    }

    /// Qualifies a spec's names with the namespace and checks what applications may not do.
    /// Checks the objects a task takes as arguments ([`OBJECTS_LABEL`]): each must be live in
    /// the task's namespace, so an unknown (or another namespace's), freed or lost object
    /// refuses the batch with an error naming it. Writes them back without repeats, largest
    /// first (equal sizes in the caller's order): the order soft locality tries their holders.
    /// The results it reads ([`RESULT_ARGS_LABEL`]) must parse; their objects may not exist yet.
    fn check_object_args(
        &self,
        mut spec: TaskSpec,
        ns: Option<&Namespace>,
        index: usize,
    ) -> Result<TaskSpec, ApplyError> {
        let invalid = |why: String| ApplyError::InvalidTask { index, why };
        if let Some(value) = spec.labels.get(RESULT_ARGS_LABEL)
            && let Err(e) = parse_result_args(value)
        {
            return Err(invalid(format!(
                "label {RESULT_ARGS_LABEL}: {value:?} is not task ids joined by '+': {e}"
            )));
        }
        let Some(value) = spec.labels.get(OBJECTS_LABEL) else {
            return Ok(spec);
        };
        let ids =
            parse_object_args(value).map_err(|e| invalid(format!("label {OBJECTS_LABEL}: {e}")))?;
        let mut sized: Vec<(u64, ObjectId)> = Vec::with_capacity(ids.len());
        for id in ids {
            if sized.iter().any(|(_, seen)| *seen == id) {
                continue;
            }
            let view = self.locate_object(id, ns, false, None)?;
            sized.push((view.size, id));
        }
        sized.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
        let ids: Vec<ObjectId> = sized.into_iter().map(|(_, id)| id).collect();
        spec.labels
            .insert(OBJECTS_LABEL, &format_object_args(&ids))
            .map_err(|e| invalid(format!("label {OBJECTS_LABEL}: {e}")))?;
        Ok(spec)
    }

    /// Checks the object session a task names ([`OBJECT_SESSION_LABEL`]), which its result
    /// object will belong to: a number the head gave out, whose objects are of the task's
    /// namespace (or that owns nothing yet). Naming another client's session of the same
    /// namespace only shortens the life of this task's own result (it goes when that session
    /// ends); it neither keeps nor ends anything of the other's (renewals are decided by the
    /// session's `put`s).
    fn check_object_session(
        &self,
        spec: &TaskSpec,
        ns: Option<&Namespace>,
        index: usize,
    ) -> Result<(), ApplyError> {
        let Some(value) = spec.labels.get(OBJECT_SESSION_LABEL) else {
            return Ok(());
        };
        let why = match parse_object_session(value) {
            None => format!("label {OBJECT_SESSION_LABEL}: {value:?} is not a session number"),
            Some(session) if !self.objects.session_given(session) => format!(
                "label {OBJECT_SESSION_LABEL}: object session {session} was never given out \
                 (a client names the session its first put opened)"
            ),
            Some(session) if !self.may_name_session(session, ns) => format!(
                "label {OBJECT_SESSION_LABEL}: object session {session} is another \
                 namespace's (a client names the session its first put opened)"
            ),
            Some(_) => return Ok(()),
        };
        Err(ApplyError::InvalidTask { index, why })
    }

    fn qualify_spec(
        &self,
        mut spec: TaskSpec,
        ns: Option<&Namespace>,
        index: usize,
    ) -> Result<TaskSpec, ApplyError> {
        let invalid = |why: String| ApplyError::InvalidTask { index, why };
        if let TaskKind::Actor(actor) = &spec.kind {
            // Tells `escher actors` (and a label selector) which tasks are actors, and of what.
            let class = actor.class.clone();
            spec.labels
                .insert(escher_proto::types::ACTOR_LABEL, &class)
                .map_err(|e| invalid(format!("the actor's class as a label: {e}")))?;
        }
        if let Some(ns) = ns {
            // Tells the worker which namespace the task's own resource calls are made in.
            let max = escher_proto::types::MAX_LABELS;
            if spec.labels.get(NAMESPACE_LABEL).is_none() && spec.labels.len() >= max {
                let why = format!(
                    "a task in a namespace has at most {} labels of its own",
                    max - 1
                );
                return Err(invalid(why));
            }
            spec.labels
                .insert(NAMESPACE_LABEL, ns.as_str())
                .map_err(|e| invalid(e.to_string()))?;
        }
        let mut resources = escher_proto::types::ResourceSet::new();
        for (name, amount) in spec.resources.iter() {
            resources.insert(self.qualify(name, ns)?, amount);
        }
        spec.resources = resources;
        for hook in spec.on_start.iter_mut().chain(spec.on_success.iter_mut()) {
            hook.name = self.qualify_writable(&hook.name, ns)?;
            hook.target = self.qualify_target(hook.target.clone(), ns)?;
            if let NodeSpec::Match {
                num_nodes: Some(0), ..
            } = hook.target
            {
                return Err(invalid("a hook's num_nodes must be at least 1".into()));
            }
        }
        if let TaskKind::Ghost { creates, .. } = &mut spec.kind {
            for (name, _) in creates.iter_mut() {
                *name = self.qualify_writable(name, ns)?;
            }
        }
        Ok(spec)
    }
}

/// Whole milliseconds in a duration, saturating.
pub(crate) fn millis(d: std::time::Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ClusterState {
    /// Refuses a batch of `n` tasks that would take `namespace` past its unfinished-task quota.
    pub(crate) fn check_quota(
        &self,
        namespace: Option<&Namespace>,
        n: usize,
    ) -> Result<(), ApplyError> {
        let Some(ns) = namespace else {
            return Ok(());
        };
        let limit = self.config.namespace_unfinished;
        let unfinished = self.unfinished.get(ns).copied().unwrap_or(0);
        if unfinished.saturating_add(n as u64) > limit {
            return Err(ApplyError::QuotaExceeded {
                namespace: ns.clone(),
                unfinished,
                asked: n,
                limit,
            });
        }
        Ok(())
    }
}

impl ClusterState {
    /// Refuses a batch of specs of `bytes` that would take `namespace` past its quota of spec
    /// bytes.
    fn check_spec_bytes(
        &self,
        namespace: Option<&Namespace>,
        bytes: u64,
    ) -> Result<(), ApplyError> {
        let Some(ns) = namespace else {
            return Ok(());
        };
        let limit = self.config.namespace_spec_bytes;
        let stored = self.spec_bytes.get(ns).copied().unwrap_or(0);
        if stored.saturating_add(bytes) > limit {
            return Err(ApplyError::SpecBytesExceeded {
                namespace: ns.clone(),
                stored,
                asked: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Adds a kept spec to its namespace's bytes, or takes an evicted one out.
    pub(crate) fn count_spec_bytes(&mut self, spec: &TaskSpec, add: bool) {
        let Some(ns) = namespace_of(spec) else {
            return;
        };
        let size = spec.stored_bytes();
        if add {
            *self.spec_bytes.entry(ns).or_default() += size;
        } else if let Some(stored) = self.spec_bytes.get_mut(&ns) {
            *stored = stored.saturating_sub(size);
            if *stored == 0 {
                self.spec_bytes.remove(&ns);
            }
        }
    }

    /// Takes an evicted task's result out of its namespace's stored bytes.
    pub(crate) fn release_result_bytes(&mut self, rec: &TaskRecord) {
        let (Some(ns), Some(len)) = (rec.namespace(), rec.result_bytes()) else {
            return;
        };
        if let Some(stored) = self.result_bytes.get_mut(&ns) {
            *stored = stored.saturating_sub(len);
            if *stored == 0 {
                self.result_bytes.remove(&ns);
            }
        }
    }
}

/// One holder of reservation `name` ended; the name is free once all have.
fn release_holder(reservations: &mut BTreeMap<ResourceName, usize>, name: ResourceName) {
    if let Some(left) = reservations.get_mut(&name) {
        *left = left.saturating_sub(1);
        if *left == 0 {
            reservations.remove(&name);
        }
    }
}

/// Counts a task of `namespace` in (`started`) or out of the unfinished totals.
pub(super) fn count_unfinished(
    unfinished: &mut BTreeMap<Namespace, u64>,
    namespace: Option<Namespace>,
    started: bool,
) {
    let Some(ns) = namespace else {
        return;
    };
    if started {
        *unfinished.entry(ns).or_default() += 1;
    } else if let Some(n) = unfinished.get_mut(&ns) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            unfinished.remove(&ns);
        }
    }
}
