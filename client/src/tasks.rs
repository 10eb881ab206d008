//! The task methods of [`Client`]: submit, get, wait, cancel, describe, list, logs.
//!
//! `get` and `wait` follow Ray: `get` blocks until one task is finished and returns its
//! status (or its decoded result with `get_result` / `get_typed`); `wait` returns once
//! `num_returns` of several tasks are finished, or the timeout passes, with the finished
//! ones and the ids of the rest. The head's `Wait` call long-polls; the client splits long
//! waits into calls of at most [`Client::with_wait_slice`] (30 s) so that no single call
//! hangs forever, and a wait without a timeout simply asks again.

use std::collections::HashSet;
use std::time::Duration;

use escher_proto::convert::Problem;
use escher_proto::types::{
    CancelReply, CancelRequest, ListTasksReply, ListTasksRequest, SubmitRequest, WaitReply,
    WaitRequest,
};
use escher_proto::{
    ConvertError, LogStream, ResourceSet, TaskId, TaskInfo, TaskResult, TaskState, TaskStatus,
    TaskSummary, codec, wire,
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::builder::IntoTaskSpec;
use crate::submissions::{Job, submit_unary};
use crate::{Client, ClientError, LogReader, TaskRef, TypedTaskRef};

/// How many tasks `list_tasks` asks for per page.
const LIST_PAGE: usize = 1000;

/// How [`Client::cancel_with`] cancels. The default (what [`Client::cancel`] does): only the
/// tasks given, a running command stopped with SIGTERM and its worker's grace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CancelOptions {
    /// Also cancel every task they submitted from inside themselves, and theirs, that has
    /// not ended (Ray's `recursive`), in the same committed change.
    pub recursive: bool,
    /// Kill a running command task at once: SIGKILL, no SIGTERM grace (Ray's `force`).
    pub force: bool,
}

impl CancelOptions {
    /// The tasks and their descendants.
    pub fn recursive() -> CancelOptions {
        CancelOptions {
            recursive: true,
            force: false,
        }
    }

    /// With `force` set as given.
    pub fn force(mut self, force: bool) -> CancelOptions {
        self.force = force;
        self
    }
}

impl Client {
    /// Submits one task (a [`crate::Task`] builder or a finished spec) and returns its handle.
    ///
    /// Concurrent `submit` calls on one client are coalesced into shared requests on the
    /// client's submission stream (see the `submissions` module), so submitting from many
    /// futures at once costs about as much as [`submit_batch`](Self::submit_batch); each call
    /// still succeeds or fails on its own.
    pub async fn submit(&self, task: impl IntoTaskSpec) -> Result<TaskRef, ClientError> {
        let mut spec = task.into_task_spec_with(self.default_resources())?;
        self.label_object_session(&mut spec)?;
        let handle = TaskRef::new(TaskId(0), &spec);
        let (reply, answer) = tokio::sync::oneshot::channel();
        let id = match self.submitter().send(Job::Task { spec, reply }) {
            Ok(()) => answer.await.map_err(|_| submitter_gone())??,
            // The submitter is gone (its runtime stopped): send directly.
            Err(tokio::sync::mpsc::error::SendError(job)) => {
                let Job::Task { spec, .. } = job else {
                    unreachable!("a task was sent")
                };
                let mut refs = self.submit_batch([spec]).await?;
                refs.pop().map(|r| r.id()).ok_or_else(submitter_gone)?
            }
        };
        Ok(handle.with_id(id))
    }

    /// Submits a function task whose handler returns an `R`; the handle's `get` decodes it.
    pub async fn submit_typed<R: DeserializeOwned>(
        &self,
        task: impl IntoTaskSpec,
    ) -> Result<TypedTaskRef<R>, ClientError> {
        Ok(self.submit(task).await?.typed())
    }

    /// Submits tasks in one call; returns their handles in the same order. Every builder is
    /// built first, so a mistake in any of them submits none.
    pub async fn submit_batch<I>(&self, tasks: I) -> Result<Vec<TaskRef>, ClientError>
    where
        I: IntoIterator,
        I::Item: IntoTaskSpec,
    {
        let default = self.default_resources();
        let specs = tasks
            .into_iter()
            .map(|t| {
                let mut spec = t.into_task_spec_with(default)?;
                self.label_object_session(&mut spec)?;
                Ok(spec)
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<TaskRef> = specs.iter().map(|s| TaskRef::new(TaskId(0), s)).collect();
        let request = SubmitRequest {
            tasks: specs,
            namespace: self.namespace().cloned(),
        };
        let mut request = wire::SubmitRequest::from(request);
        let ticket = self.ticket();
        request.key = Some(ticket.key().into());
        self.check_size("submit", &request)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Batch {
            request,
            ticket,
            reply,
        };
        let ids = match self.submitter().send(job) {
            Ok(()) => answer.await.map_err(|_| submitter_gone())??,
            Err(tokio::sync::mpsc::error::SendError(job)) => {
                let Job::Batch { request, .. } = job else {
                    unreachable!("a batch was sent")
                };
                submit_unary(self, &request, false).await?
            }
        };
        Ok(refs
            .into_iter()
            .zip(ids)
            .map(|(r, id)| r.with_id(id))
            .collect())
    }

    /// Submits `task` and waits until it is finished (at most `timeout`; `None` waits without
    /// limit): the synchronous call. Returns its final status, whatever the outcome (see
    /// [`Client::get`] for the errors); a call retried after a lost reply submits nothing
    /// twice (it carries its idempotency key).
    ///
    /// A client's first `run` (when it has neither submitted nor waited before, as in a
    /// one-shot `escher submit --wait`) is one `Run` call, answered when the task finishes
    /// within the head's wait slice. Later ones travel as a message on the client's
    /// submission stream and one on its result stream, which costs less than a call (W2,
    /// BENCHMARKS.md).
    pub async fn run(
        &self,
        task: impl IntoTaskSpec,
        timeout: Option<Duration>,
    ) -> Result<TaskStatus, ClientError> {
        let mut spec = task.into_task_spec_with(self.default_resources())?;
        self.label_object_session(&mut spec)?;
        if self.streams_started() {
            let id = self.submit(spec).await?.id();
            return self.get(id, timeout).await;
        }
        self.start_streams();
        let deadline = timeout.map(|t| Instant::now() + t);
        let slice = timeout.map_or(self.wait_slice(), |t| t.min(self.wait_slice()));
        let submit = SubmitRequest {
            tasks: vec![spec],
            namespace: self.namespace().cloned(),
        };
        let mut submit = wire::SubmitRequest::from(submit);
        // Held until the call is answered, so that the head keeps its reply for a retry.
        let ticket = self.ticket();
        submit.key = Some(ticket.key().into());
        let request = wire::RunRequest {
            submit: Some(submit),
            timeout_ms: Some(u64::try_from(slice.as_millis()).unwrap_or(u64::MAX)),
        };
        self.check_size("run", &request)?;
        let reply = self
            .call_write("submit", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.run(request).await }
            })
            .await?;
        let id = TaskId(reply.task_id);
        let status = match reply.status {
            Some(status) => TaskStatus::try_from(status)?,
            // Still running at the end of the slice: wait for the rest of the timeout.
            None => {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                return self.get(id, left).await;
            }
        };
        match status.eviction() {
            Some(evicted) => Err(ClientError::Evicted(evicted)),
            None => Ok(status),
        }
    }

    /// Waits until the task is finished (at most `timeout`; `None` waits without limit) and
    /// returns its final status, whatever the outcome. Fails with [`ClientError::Timeout`] if
    /// it is still pending or running when the timeout passes, and with
    /// [`ClientError::Evicted`] if it finished so long ago that the head's retention dropped
    /// its record.
    pub async fn get(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<TaskStatus, ClientError> {
        let id = task.into();
        let deadline = timeout.map(|t| Instant::now() + t);
        let status = match self.pushed_end(id, deadline).await? {
            Some(status) => status,
            // Not pushed on the result stream (see the `results` module): `Wait` calls, or
            // one last to tell a task that finished as the timeout passed.
            None => {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                let (mut ready, _) = self.wait([id], 1, left).await?;
                ready.pop().ok_or(ClientError::Timeout {
                    id,
                    after: timeout.unwrap_or_default(),
                })?
            }
        };
        match status.eviction() {
            Some(evicted) => Err(ClientError::Evicted(evicted)),
            None => Ok(status),
        }
    }

    /// Waits for the task like [`Client::get`] and returns its result if it succeeded, or
    /// [`ClientError::TaskFailed`] if it failed or was cancelled.
    pub async fn get_result(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<TaskResult, ClientError> {
        succeeded(self.get(task, timeout).await?)
    }

    /// Waits for a function task like [`Client::get`] and returns the bytes it returned.
    pub async fn get_bytes(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, ClientError> {
        let id = task.into();
        match self.get_result(id, timeout).await? {
            // Above 100 KiB: read from the worker that holds it (`objects/results.rs`).
            TaskResult::Object { .. } => Ok(self.result_object_bytes(id, timeout).await?.into()),
            result => returned_bytes(id, result),
        }
    }

    /// Waits for a function task like [`Client::get`] and decodes what it returned (bincode,
    /// [`escher_proto::codec`]) as an `R`.
    pub async fn get_typed<R: DeserializeOwned>(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<R, ClientError> {
        let id = task.into();
        let bytes = self.get_bytes(id, timeout).await?;
        codec::decode(&bytes).map_err(|source| ClientError::Decode { id, source })
    }

    /// Ray's `wait`: returns once `num_returns` of `tasks` are finished, or when `timeout`
    /// passes (`None`: no limit), with the finished tasks' statuses (`ready`) and the ids of
    /// the others (`not_ready`, in the order given). A task the head's retention evicted counts
    /// as ready in its final state, with `evicted` set and no result; one whose tombstone is
    /// gone too fails the call with [`ClientError::Evicted`].
    ///
    /// `num_returns` must be between 1 and the number of tasks, and no task may be listed
    /// twice; an empty list returns at once.
    pub async fn wait<I>(
        &self,
        tasks: I,
        num_returns: usize,
        timeout: Option<Duration>,
    ) -> Result<(Vec<TaskStatus>, Vec<TaskId>), ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        let ids: Vec<TaskId> = tasks.into_iter().map(Into::into).collect();
        let num = check_wait(&ids, num_returns)?;
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let slice = match deadline {
                None => self.wait_slice(),
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(self.wait_slice()),
            };
            let reply = self.wait_once(&ids, num, slice).await?;
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if reply.ready.len() >= num_returns || expired {
                return Ok((reply.ready, reply.not_ready));
            }
        }
    }

    async fn wait_once(
        &self,
        ids: &[TaskId],
        num_returns: u32,
        slice: Duration,
    ) -> Result<WaitReply, ClientError> {
        let request = WaitRequest {
            task_ids: ids.to_vec(),
            num_returns,
            timeout: Some(slice),
        };
        let request = wire::WaitRequest::from(request);
        let reply = self
            .call(|mut rpc| {
                let request = self.read(request.clone());
                async move { rpc.wait(request).await }
            })
            .await?;
        Ok(WaitReply::try_from(reply)?)
    }

    /// Cancels tasks; returns each one's status afterwards, in the order given. A pending task
    /// is cancelled at once, a running one is stopped (a command gets SIGTERM, then SIGKILL
    /// after its worker's grace), a finished one is left as it is. Only these tasks: the
    /// tasks they submitted from inside themselves run on ([`Client::cancel_with`] with
    /// [`CancelOptions::recursive`] cancels those too).
    pub async fn cancel<I>(&self, tasks: I) -> Result<Vec<TaskStatus>, ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        self.cancel_with(tasks, CancelOptions::default()).await
    }

    /// [`Client::cancel`] with options: `recursive` also cancels, in the same committed
    /// change, every task the given ones submitted from inside themselves (with their task
    /// credential, as a Python task's `f.remote()` or a command task's `escher submit` do),
    /// and the tasks those submitted, that has not ended; `force` kills a running command task
    /// at once (SIGKILL to its process group, no SIGTERM grace). Both need every head replica
    /// to run a release that reads data format 11; a forced cancel is refused before that.
    pub async fn cancel_with<I>(
        &self,
        tasks: I,
        options: CancelOptions,
    ) -> Result<Vec<TaskStatus>, ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        let request = CancelRequest {
            task_ids: tasks.into_iter().map(Into::into).collect(),
            recursive: options.recursive,
            force: options.force,
        };
        if request.task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ticket = self.ticket();
        let mut request = wire::CancelRequest::from(request);
        request.key = Some(ticket.key().into());
        let reply = self
            .call_write("cancel", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.cancel(request).await }
            })
            .await?;
        Ok(CancelReply::try_from(reply)?.tasks)
    }

    /// Runs a task again under its id with `resources` in place of the ones it asked for: a
    /// pending task takes them at once; a running one is stopped (as a cancel stops it) and,
    /// once its worker confirms, waits again as its next attempt (an attempt that succeeded
    /// before the stop landed stays the task's result); a failed one is reopened as
    /// its next attempt (those who waited for it were told it failed). This is how a GPU policy
    /// restarts a job on a larger MIG slice after [`TaskResult::OutOfMemory`], or before it,
    /// keeping the task's identity: one id, one result, its attempts in
    /// [`Client::task_info`]. A task that succeeded or was cancelled is refused (submit a new
    /// one), as is a reservation's bundle holder. Names are qualified with the task's
    /// namespace, as a submission's are.
    pub async fn requeue(
        &self,
        task: impl Into<TaskId>,
        resources: ResourceSet,
    ) -> Result<TaskStatus, ClientError> {
        let task = task.into();
        let ticket = self.ticket();
        let request = wire::RequeueRequest {
            task_id: task.0,
            resources: resources.into(),
            key: Some(ticket.key().into()),
        };
        let reply = self
            .call_write("requeue", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.requeue(request).await }
            })
            .await?;
        let status = reply
            .task
            .ok_or_else(|| ConvertError::new("task", Problem::Missing))?;
        Ok(TaskStatus::try_from(status)?)
    }

    /// Everything the head knows about one task: its spec, status, pending reason and times.
    pub async fn task_info(&self, task: impl Into<TaskId>) -> Result<TaskInfo, ClientError> {
        let request = wire::DescribeTaskRequest::from(task.into());
        let reply = self
            .call(|mut rpc| {
                let request = self.read(request);
                async move { rpc.describe_task(request).await }
            })
            .await?;
        Ok(TaskInfo::try_from(reply)?)
    }

    /// Tasks in ascending id order, only those in `state` if given, at most `limit` of them
    /// (`None`: all), fetched a page at a time.
    pub async fn list_tasks(
        &self,
        state: Option<TaskState>,
        limit: Option<usize>,
    ) -> Result<Vec<TaskSummary>, ClientError> {
        let query = ListTasksRequest {
            state,
            ..ListTasksRequest::default()
        };
        self.find_tasks(query, limit).await
    }

    /// The tasks `query` matches (by state, name, labels, node, namespace; oldest or newest
    /// first, from `query.after`), at most `limit` of them (`None`: all), fetched a page at a
    /// time.
    pub async fn find_tasks(
        &self,
        mut query: ListTasksRequest,
        limit: Option<usize>,
    ) -> Result<Vec<TaskSummary>, ClientError> {
        let mut tasks: Vec<TaskSummary> = Vec::new();
        loop {
            let want = limit.map_or(LIST_PAGE, |l| l.saturating_sub(tasks.len()).min(LIST_PAGE));
            if want == 0 {
                break;
            }
            query.limit = want as u32;
            let page = self.list_tasks_page(query.clone()).await?.tasks;
            let Some(last) = page.last().map(|t| t.id) else {
                break;
            };
            let moved = query.after.is_none_or(|a| {
                if query.newest_first {
                    last < a
                } else {
                    last > a
                }
            });
            if !moved {
                break; // the head did not move on; stop rather than loop
            }
            tasks.extend(page);
            query.after = Some(last);
        }
        if let Some(limit) = limit {
            tasks.truncate(limit);
        }
        Ok(tasks)
    }

    /// One page of the tasks `query` matches: at most `query.limit` (0: the head's default),
    /// after `query.after`, and how many more match. One page is one consistent snapshot.
    pub async fn list_tasks_page(
        &self,
        query: ListTasksRequest,
    ) -> Result<ListTasksReply, ClientError> {
        let request = wire::ListTasksRequest::from(query);
        let reply = self
            .call(|mut rpc| {
                let request = self.read(request.clone());
                async move { rpc.list_tasks(request).await }
            })
            .await?;
        Ok(ListTasksReply::try_from(reply)?)
    }

    /// Everything a command task has written to `stream` so far (all of it, once the task has
    /// finished).
    pub async fn logs(
        &self,
        task: impl Into<TaskId>,
        stream: LogStream,
    ) -> Result<Vec<u8>, ClientError> {
        self.log_reader(task, stream).read_available().await
    }

    /// A reader that fetches a command task's output piece by piece, and can follow it while
    /// the task runs: the latest attempt's ([`LogReader::attempt`] picks another).
    pub fn log_reader(&self, task: impl Into<TaskId>, stream: LogStream) -> LogReader {
        LogReader::new(self.clone(), task.into(), stream)
    }
}

/// Checks the arguments of `wait`; returns `num_returns` as sent on the wire.
fn check_wait(ids: &[TaskId], num_returns: usize) -> Result<u32, ClientError> {
    let mut seen = HashSet::with_capacity(ids.len());
    if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
        return Err(ClientError::Usage(format!(
            "task {twice} is listed twice in one wait"
        )));
    }
    if ids.is_empty() {
        return Ok(0);
    }
    if num_returns == 0 || num_returns > ids.len() {
        return Err(ClientError::Usage(format!(
            "num_returns must be between 1 and the number of tasks ({}), not {num_returns}",
            ids.len()
        )));
    }
    u32::try_from(num_returns)
        .map_err(|_| ClientError::Usage(format!("cannot wait for {num_returns} tasks at once")))
}

/// The result of a finished task, or why it has none.
pub(crate) fn succeeded(status: TaskStatus) -> Result<TaskResult, ClientError> {
    match status.state {
        TaskState::Succeeded => status
            .result
            .ok_or_else(|| ConvertError::missing("result").into()),
        state @ (TaskState::Failed | TaskState::Cancelled) => Err(ClientError::TaskFailed {
            id: status.id,
            state,
            reason: failure_reason(&status),
        }),
        TaskState::Pending | TaskState::Running => {
            let why = Problem::Rule("a waited-for task is reported as not finished");
            Err(ConvertError::new("state", why).into())
        }
    }
}

/// Why a task failed, in words: the head's reason, else what its result says.
pub fn failure_reason(status: &TaskStatus) -> String {
    if let Some(reason) = &status.reason {
        return reason.clone();
    }
    match &status.result {
        Some(TaskResult::Exited { code }) => format!("exit code {code}"),
        Some(TaskResult::Returned(_)) => "the function returned, yet was marked failed".into(),
        Some(TaskResult::Released) => "the ghost was released".into(),
        Some(oom @ TaskResult::OutOfMemory { .. }) => oom.to_string(),
        Some(TaskResult::Object { .. }) => "the function returned, yet was marked failed".into(),
        None => "no reason given".into(),
    }
}

/// The bytes a function task returned, or what it ended with instead.
fn returned_bytes(id: TaskId, result: TaskResult) -> Result<Vec<u8>, ClientError> {
    match result {
        TaskResult::Returned(bytes) => Ok(bytes.into()),
        TaskResult::Exited { code } => Err(ClientError::WrongResultKind {
            id,
            found: format!("exit code {code}"),
        }),
        TaskResult::Released => Err(ClientError::WrongResultKind {
            id,
            found: "a released ghost".into(),
        }),
        oom @ TaskResult::OutOfMemory { .. } => Err(ClientError::WrongResultKind {
            id,
            found: oom.to_string(),
        }),
        obj @ TaskResult::Object { .. } => Err(ClientError::WrongResultKind {
            id,
            found: format!("{obj}; read it with Client::result_object_bytes"),
        }),
    }
}

/// The error of a submit whose answer never came (the submitter stopped with its runtime).
fn submitter_gone() -> ClientError {
    ClientError::Protocol(ConvertError::new("task_ids", Problem::Empty))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: TaskState, result: Option<TaskResult>, reason: Option<&str>) -> TaskStatus {
        TaskStatus {
            id: TaskId(3),
            state,
            node: None,
            attempt: 1,
            reason: reason.map(str::to_string),
            result,
            evicted: false,
            finished_at_ms: None,
            hook_errors: Vec::new(),
        }
    }

    #[test]
    fn wait_arguments_are_checked_before_sending() {
        assert_eq!(check_wait(&[], 0).unwrap(), 0);
        assert_eq!(check_wait(&[TaskId(1), TaskId(2)], 2).unwrap(), 2);
        let err = check_wait(&[TaskId(1), TaskId(1)], 1).unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
        let err = check_wait(&[TaskId(1)], 2).unwrap_err();
        assert!(err.to_string().contains("between 1 and"), "{err}");
        assert!(check_wait(&[TaskId(1)], 0).is_err());
    }

    #[test]
    fn outcomes_become_results_or_typed_errors() {
        let ok = status(
            TaskState::Succeeded,
            Some(TaskResult::Returned(vec![1].into())),
            None,
        );
        assert_eq!(succeeded(ok).unwrap(), TaskResult::Returned(vec![1].into()));

        let failed = status(
            TaskState::Failed,
            Some(TaskResult::Exited { code: 2 }),
            None,
        );
        match succeeded(failed) {
            Err(ClientError::TaskFailed { id, state, reason }) => {
                assert_eq!((id, state), (TaskId(3), TaskState::Failed));
                assert_eq!(reason, "exit code 2");
            }
            other => panic!("{other:?}"),
        }
        let cancelled = status(TaskState::Cancelled, None, Some("pending deadline passed"));
        let err = succeeded(cancelled).unwrap_err();
        assert_eq!(err.to_string(), "task 3 cancelled: pending deadline passed");

        let err = returned_bytes(TaskId(3), TaskResult::Exited { code: 0 }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task 3 ended with exit code 0, not a function's return value"
        );
        assert!(succeeded(status(TaskState::Succeeded, None, None)).is_err());
        assert!(succeeded(status(TaskState::Running, None, None)).is_err());
    }
}
