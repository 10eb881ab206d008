//! Requeue: run a task again under its own id with other resources (MIGM's restart on a
//! larger slice, after an out-of-memory failure or before one a predictor sees coming).
//!
//! - A **pending** task takes the new resources at once and keeps its attempt count: nothing
//!   ran, so nothing is lost (its pending deadline, if any, counts again from now).
//! - A **running** task's attempt is stopped like a cancel (the worker kills it and reports);
//!   when the worker confirms the process is gone, the task is pending again with the new
//!   resources, and its next placement is the next attempt. Until then the old attempt keeps
//!   what it holds, so the task never runs twice at once. An attempt that succeeded before the
//!   stop landed is the task's result: it does not run again.
//! - A **failed** task is reopened: pending again with the new resources, its next placement
//!   its next attempt (MIGM's restart after an out-of-memory failure, for a task submitted with
//!   no retries so that the policy alone decides where it runs again). Those who waited for it
//!   were told it failed; watchers see it pending again; its result and reason are cleared.
//! - A task that succeeded or was cancelled is refused (submit a new one), as is one that
//!   retention reduced to a tombstone. A reservation's bundle holder is the reservation's,
//!   not the caller's to resize.
//!
//! The resources are qualified with the task's namespace as a submission's are.

use escher_proto::types::{NodeId, ResourceSet, TaskId, TaskState, TaskStatus};

use super::apply::ClusterState;
use super::command::Effect;
use super::error::ApplyError;
use super::tasks::{count_unfinished, millis};
use crate::scheduler::{Event, Millis};

impl ClusterState {
    /// Requeues task `id` with `resources`; see the module doc.
    pub(crate) fn requeue(
        &mut self,
        id: TaskId,
        resources: ResourceSet,
        now: Millis,
    ) -> Result<TaskStatus, ApplyError> {
        self.check_known(id)?;
        let refuse = |why: String| ApplyError::CannotRequeue { task: id, why };
        let Some(rec) = self.tasks.get(&id) else {
            return Err(refuse(
                "it finished and retention kept only its tombstone".into(),
            ));
        };
        if rec.native {
            return Err(refuse(
                "it holds a reservation's bundle; resize the reservation instead".into(),
            ));
        }
        if rec.cancel_requested {
            return Err(refuse("it is being cancelled".into()));
        }
        let ns = rec.namespace();
        if rec.state == TaskState::Failed {
            // A failed task that runs again is unfinished again: the quota counts it, as it
            // counts a submit.
            self.check_quota(ns.as_ref(), 1)?;
        }
        let mut qualified = ResourceSet::new();
        for (name, amount) in resources.iter() {
            qualified.insert(self.qualify(name, ns.as_ref())?, amount);
        }
        let Some(rec) = self.tasks.get_mut(&id) else {
            return Err(self.missing_task(id));
        };
        let why = format!("requeued with {qualified}");
        match rec.state {
            TaskState::Pending => {
                rec.spec.resources = qualified;
                rec.requeue = None;
                self.core_event(Event::TaskCancelled { task: id }, now);
                self.resubmit(id, why, now);
            }
            TaskState::Running => {
                let (node, attempt) = (rec.node.unwrap_or(NodeId(0)), rec.attempt);
                // A second requeue before the worker confirmed replaces the first.
                rec.requeue = Some(qualified);
                self.effects.push(Effect::Cancel {
                    node,
                    task: id,
                    attempt,
                    reason: why,
                    force: false,
                });
            }
            TaskState::Failed => {
                rec.spec.resources = qualified;
                rec.result = None;
                rec.finished_at = None;
                let ns = rec.namespace();
                let created = rec.created_names();
                self.retention.task_reopened(id);
                count_unfinished(&mut self.unfinished, ns, true);
                for name in created {
                    self.creators.entry(name).or_default().insert(id);
                }
                self.resubmit(id, why, now);
            }
            state => {
                return Err(refuse(format!(
                    "it has ended ({state}); submit a new task (requeue runs a pending, running \
                     or failed task again under its id)"
                )));
            }
        }
        self.status(id).ok_or_else(|| self.missing_task(id))
    }

    /// Lineage (`objects.rs`, `rebuild_results`): succeeded task `id`, whose result object was
    /// lost with its last copy, runs again under its id (its next placement is its next
    /// attempt). Its result is cleared; those who wait for it wait for the new attempt.
    pub(crate) fn reopen_succeeded(&mut self, id: TaskId, why: String, now: Millis) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        if rec.state != TaskState::Succeeded {
            return;
        }
        rec.result = None;
        rec.finished_at = None;
        let ns = rec.namespace();
        let created = rec.created_names();
        self.retention.task_reopened(id);
        count_unfinished(&mut self.unfinished, ns, true);
        for name in created {
            self.creators.entry(name).or_default().insert(id);
        }
        self.resubmit(id, why, now);
    }

    /// The worker confirmed that the attempt stopped for a requeue ended: the task waits again,
    /// with its new resources.
    pub(crate) fn requeued_attempt_ended(&mut self, id: TaskId, now: Millis) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        let Some(resources) = rec.requeue.take() else {
            return;
        };
        let why = format!("requeued with {resources}");
        rec.end_attempt(|| format!("stopped: {why}"));
        rec.spec.resources = resources;
        self.resubmit(id, why, now);
    }

    /// Puts task `id` back in the queue with its spec's resources, `why` as its reason (a
    /// retry, a requeue). Its node stays that of its latest attempt.
    pub(super) fn resubmit(&mut self, id: TaskId, why: String, now: Millis) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        rec.state = TaskState::Pending;
        rec.devices = None;
        // The core judges the new request afresh (and says if nothing can run it).
        rec.pending_reason = None;
        rec.reason = Some(why.clone());
        let resources = rec.spec.resources.clone();
        let deadline = rec
            .spec
            .pending_deadline
            .map(|d| now.saturating_add(millis(d)));
        let prefer = rec.preferred_locations();
        let time_limit = rec.spec.timeout.map(millis);
        // Watchers see it pending again, the reason saying why.
        self.record_pending(id, Some(why), now);
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
    }
}
