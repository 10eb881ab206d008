//! `escher get`, `escher wait`, `escher cancel` and `escher requeue`, and the progress bar for
//! long waits.
//!
//! `get` waits for one task and shows its outcome (exit code, returned bytes as length and
//! hex, or a released ghost); it exits 0 only if the task succeeded (a failed command task
//! passes on its exit code), and says on stderr which task failed and why. `wait` is Ray's
//! `wait`: it returns once `--num` tasks are done, lists every task that has finished by then
//! (with `--num 1`, a second task that also finished is not "not finished"), and exits
//! non-zero if the timeout passed first or a finished task failed or was cancelled, saying
//! which. On a terminal, `get`, `wait` and `submit --wait` show how the wait goes: a bar of
//! the tasks done with how many run, wait and failed (one task: its state, and why it waits),
//! kept current from the head's events (the watch API), while short `Wait` calls collect the
//! results.
//!
//! A task the head's retention has evicted: `get` fails with `task N was evicted by retention
//! (succeeded at ...)`; `wait` and `cancel` list it in its final state, with `evicted by
//! retention (finished ...)` as its reason.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use escher_proto::types::{ClusterEvent, MAX_WATCH_TASKS, WatchKind, WatchRequest};
use escher_proto::{ResourceSet, TaskId, TaskState, TaskStatus};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::time::Instant;

use super::ctx::Ctx;
use super::render::{exit_status, ids, key_values, node, result, statuses, unsuccessful};
use super::values::parse_duration;
use escher_client::{Client, ClientError};

/// How long each `Wait` call lasts while a progress bar is shown.
const PROGRESS_POLL: Duration = Duration::from_millis(500);

/// Options of `escher get`.
#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    /// The task
    #[arg(value_name = "ID")]
    pub id: TaskId,

    /// Give up after this long (seconds, or 500ms / 5m); default: wait until it finishes
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// Options of `escher wait`.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// The tasks
    #[arg(value_name = "ID", required = true, num_args = 1..)]
    pub ids: Vec<TaskId>,

    /// Return once N of them have finished (default: all)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub num: Option<u32>,

    /// Give up after this long (seconds, or 500ms / 5m); default: no limit
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// Options of `escher cancel`.
#[derive(Debug, Clone, Args)]
pub struct CancelArgs {
    /// The tasks
    #[arg(value_name = "ID", required = true, num_args = 1..)]
    pub ids: Vec<TaskId>,

    /// Also cancel every task they submitted from inside themselves (with their task
    /// credential), and the tasks those submitted, that has not ended; default: only the tasks
    /// named
    #[arg(long, short = 'r')]
    pub recursive: bool,

    /// Kill a running command task at once (SIGKILL, no SIGTERM grace); default: SIGTERM, then
    /// SIGKILL after the worker's --grace
    #[arg(long)]
    pub force: bool,
}

/// Options of `escher requeue`.
#[derive(Debug, Clone, Args)]
pub struct RequeueArgs {
    /// The task
    #[arg(value_name = "ID")]
    pub id: TaskId,

    /// Its resources from now on, replacing all it asked for, e.g. mig.2g.10gb=1,cpu=1
    #[arg(long, short = 'r', value_name = "RESOURCES", required = true)]
    pub resources: ResourceSet,
}

/// What `escher wait --json` prints.
#[derive(Debug, Serialize)]
struct WaitJson {
    ready: Vec<TaskStatus>,
    not_ready: Vec<TaskId>,
}

impl GetArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        // `Client::get`, with the progress display.
        let (mut ready, _) =
            wait_with_progress(&client, &[self.id], 1, self.timeout, !ctx.json).await?;
        let status = ready.pop().ok_or(ClientError::Timeout {
            id: self.id,
            after: self.timeout.unwrap_or_default(),
        })?;
        if let Some(evicted) = status.eviction() {
            return Err(ClientError::Evicted(evicted).into());
        }
        if ctx.json {
            ctx.emit_json(&status)?;
        } else {
            ctx.emit(&render_get(&status))?;
        }
        let list = std::slice::from_ref(&status);
        eprint!("{}", unsuccessful(list));
        Ok(exit_status(list))
    }
}

/// The text of `escher get`.
pub fn render_get(s: &TaskStatus) -> String {
    let mut rows = vec![
        ("task", s.id.to_string()),
        ("state", s.state.to_string()),
        ("node", node(s.node)),
        ("attempt", s.attempt.to_string()),
        ("result", result(s.result.as_ref())),
    ];
    if let Some(reason) = &s.reason {
        rows.push(("reason", reason.clone()));
    }
    for error in &s.hook_errors {
        rows.push(("hook not applied", error.clone()));
    }
    key_values(&rows)
}

impl WaitArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let num = self.num.map_or(self.ids.len(), |n| n as usize);
        if num > self.ids.len() {
            anyhow::bail!(
                "--num {num} is more than the {} tasks given",
                self.ids.len()
            );
        }
        let client = ctx.client().await?;
        let (mut ready, mut not_ready) =
            wait_with_progress(&client, &self.ids, num, self.timeout, !ctx.json).await?;
        let got = ready.len();
        // The head returns `--num` tasks; others may have finished meanwhile. Those are
        // reported as what they are, not as "not finished".
        if !not_ready.is_empty() {
            let rest = not_ready.len();
            let (more, still) = client.wait(not_ready, rest, Some(Duration::ZERO)).await?;
            ready.extend(more);
            not_ready = still;
        }
        ready.sort_by_key(|s| s.id);
        let failures = unsuccessful(&ready);
        let code = if got < num || !failures.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
        if ctx.json {
            ctx.emit_json(&WaitJson { ready, not_ready })?;
        } else {
            let mut text = statuses(&ready);
            if !not_ready.is_empty() {
                text.push_str(&format!("not finished: {}\n", ids(&not_ready)));
            }
            ctx.emit(&text)?;
        }
        eprint!("{failures}");
        if got < num {
            eprintln!("error: only {got} of the {num} tasks waited for finished in time");
        }
        Ok(code)
    }
}

impl CancelArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let options = escher_client::CancelOptions {
            recursive: self.recursive,
            force: self.force,
        };
        let after = client.cancel_with(self.ids, options).await?;
        if ctx.json {
            ctx.emit_json(&after)?;
        } else {
            ctx.emit(&statuses(&after))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

impl RequeueArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let after = client.requeue(self.id, self.resources).await?;
        if ctx.json {
            ctx.emit_json(&after)?;
        } else {
            ctx.emit(&statuses(std::slice::from_ref(&after)))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The most tasks whose states the progress display reads one by one before it starts; past
/// that, it counts only what the events tell from then on.
const PROGRESS_LOOKUPS: usize = 256;

/// What the progress display knows of the tasks waited for.
#[derive(Debug, Default)]
struct Tally {
    states: std::collections::HashMap<TaskId, TaskState>,
    /// The one task's pending reason or node, when a single task is waited for.
    detail: Option<String>,
}

impl Tally {
    fn apply(&mut self, event: &ClusterEvent) {
        match event {
            ClusterEvent::Submitted { task, .. } => {
                self.states.insert(*task, TaskState::Pending);
            }
            ClusterEvent::Started {
                task,
                node,
                attempt,
                ..
            } => {
                self.states.insert(*task, TaskState::Running);
                self.detail = Some(format!("on node {node}, attempt {attempt}"));
            }
            ClusterEvent::Pending { task, reason, .. } => {
                self.states.insert(*task, TaskState::Pending);
                self.detail = reason.clone();
            }
            ClusterEvent::Finished { task, state, .. } => {
                self.states.insert(*task, *state);
            }
            _ => {}
        }
    }

    /// How many of the tasks are in `state`.
    fn count(&self, state: TaskState) -> usize {
        self.states.values().filter(|v| **v == state).count()
    }

    /// What follows a reservation's count: ` · 1 waiting: why` while some wait.
    fn holding(&self) -> String {
        let waiting = self.count(TaskState::Pending);
        match (&self.detail, waiting) {
            (_, 0) => String::new(),
            (Some(why), n) if !why.starts_with("on node") => format!(" · {n} waiting: {why}"),
            (_, n) => format!(" · {n} waiting"),
        }
    }

    /// What follows the bar: ` · 3 running · 5 pending · 1 failed` (what is known), or for
    /// one task its state and detail.
    fn message(&self, total: usize) -> String {
        if total == 1 {
            let Some(state) = self.states.values().next() else {
                return String::new();
            };
            return match &self.detail {
                Some(detail) if !state.is_terminal() => format!("{state}: {detail}"),
                _ => state.to_string(),
            };
        }
        let count = |s: TaskState| self.count(s);
        let mut parts = Vec::new();
        for (state, word) in [
            (TaskState::Running, "running"),
            (TaskState::Pending, "pending"),
            (TaskState::Failed, "failed"),
            (TaskState::Cancelled, "cancelled"),
        ] {
            let n = count(state);
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        parts.iter().map(|p| format!(" · {p}")).collect()
    }
}

/// Keeps `bar`'s message current from the tasks' events until aborted; with `held`, its
/// position too: how many of the tasks run (a reservation's bundles held).
async fn follow_tally(client: Client, ids: Vec<TaskId>, bar: ProgressBar, held: bool) {
    let kinds = [WatchKind::Started, WatchKind::Finished, WatchKind::Pending];
    let Ok(mut watch) = client
        .watch(WatchRequest::tasks(ids.clone()).kinds(kinds))
        .await
    else {
        return;
    };
    let mut tally = Tally::default();
    // Subscribed first, then read: nothing is missed in between.
    for id in ids.iter().take(PROGRESS_LOOKUPS) {
        if let Ok(info) = client.task_info(*id).await {
            tally.states.insert(*id, info.status.state);
            if held && let Some(reason) = &info.pending_reason {
                tally.detail = Some(reason.to_string());
            } else if ids.len() == 1 {
                tally.detail = match (info.status.node, &info.pending_reason) {
                    (_, Some(reason)) => Some(reason.to_string()),
                    (Some(node), None) if info.status.state == TaskState::Running => {
                        Some(format!("on node {node}, attempt {}", info.status.attempt))
                    }
                    _ => info.status.reason.clone(),
                };
            }
        }
    }
    let show = |tally: &Tally| {
        if held {
            bar.set_position(tally.count(TaskState::Running) as u64);
            bar.set_message(tally.holding());
        } else {
            bar.set_message(tally.message(ids.len()));
        }
    };
    show(&tally);
    while let Some(Ok(event)) = watch.next().await {
        tally.apply(&event.event);
        show(&tally);
    }
}

/// A progress display on stderr while `wait` runs (a terminal only): a spinner with `label`
/// and how many of `ids` run, with the last pending reason (`reserve --wait`).
pub(crate) async fn holding_with_progress<T>(
    client: &Client,
    label: &str,
    ids: &[TaskId],
    wait: impl std::future::Future<Output = T>,
) -> T {
    if !std::io::stderr().is_terminal() || ids.len() > MAX_WATCH_TASKS {
        return wait.await;
    }
    let bar = ProgressBar::new(ids.len() as u64);
    let style =
        ProgressStyle::with_template("{spinner} {prefix} {pos}/{len} held{msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(Duration::from_millis(120));
    let tally = tokio::spawn(follow_tally(
        client.clone(),
        ids.to_vec(),
        bar.clone(),
        true,
    ));
    let out = wait.await;
    tally.abort();
    bar.finish_and_clear();
    out
}

/// Waits like [`Client::wait`]; with `show` set and a terminal on stderr, shows how the wait
/// goes (see the module documentation).
pub(crate) async fn wait_with_progress(
    client: &Client,
    ids: &[TaskId],
    num: usize,
    timeout: Option<Duration>,
    show: bool,
) -> Result<(Vec<TaskStatus>, Vec<TaskId>), ClientError> {
    if !show || !std::io::stderr().is_terminal() || ids.len() > MAX_WATCH_TASKS {
        return client.wait(ids.iter().copied(), num, timeout).await;
    }
    let bar = ProgressBar::new(num as u64);
    let template = if ids.len() == 1 {
        "{spinner} task {prefix} {msg} ({elapsed})"
    } else {
        "{spinner} [{bar:40}] {pos}/{len} done{msg} ({elapsed})"
    };
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(ids[0].to_string());
    bar.enable_steady_tick(Duration::from_millis(120));
    let tally = tokio::spawn(follow_tally(
        client.clone(),
        ids.to_vec(),
        bar.clone(),
        false,
    ));
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut ready: Vec<TaskStatus> = Vec::new();
    let mut remaining = ids.to_vec();
    let outcome = loop {
        let need = num.saturating_sub(ready.len());
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if need == 0 || left == Some(Duration::ZERO) {
            break Ok(());
        }
        let slice = left.map_or(PROGRESS_POLL, |l| l.min(PROGRESS_POLL));
        match client
            .wait(remaining.iter().copied(), need, Some(slice))
            .await
        {
            Ok((done, rest)) => {
                bar.inc(done.len() as u64);
                ready.extend(done);
                remaining = rest;
            }
            Err(e) => break Err(e),
        }
    };
    tally.abort();
    bar.finish_and_clear();
    outcome.map(|()| (ready, remaining))
}

#[cfg(test)]
mod tests {
    use escher_proto::{NodeId, TaskResult, TaskState};

    #[test]
    fn the_progress_line_counts_what_the_events_tell() {
        let mut tally = Tally::default();
        for id in 1..=4 {
            tally.states.insert(TaskId(id), TaskState::Pending);
        }
        assert_eq!(tally.message(4), " · 4 pending");
        let started = |task, node| ClusterEvent::Started {
            task: TaskId(task),
            node: NodeId(node),
            attempt: 1,
            namespace: None,
        };
        tally.apply(&started(1, 2));
        tally.apply(&started(2, 2));
        tally.apply(&ClusterEvent::Finished {
            task: TaskId(2),
            state: TaskState::Failed,
            reason: Some("exited with code 1".into()),
            attempt: 1,
            namespace: None,
        });
        assert_eq!(tally.message(4), " · 1 running · 2 pending · 1 failed");

        let mut one = Tally::default();
        one.states.insert(TaskId(9), TaskState::Pending);
        one.apply(&ClusterEvent::Pending {
            task: TaskId(9),
            reason: Some("waiting for resource data".into()),
            namespace: None,
        });
        assert_eq!(one.message(1), "pending: waiting for resource data");

        // A reservation's holders: how many wait, and the last reason given.
        let mut holders = Tally::default();
        for id in [5, 6] {
            holders.states.insert(TaskId(id), TaskState::Pending);
        }
        holders.apply(&ClusterEvent::Pending {
            task: TaskId(6),
            reason: Some("no node has cpu=2 free".into()),
            namespace: None,
        });
        assert_eq!(holders.holding(), " · 2 waiting: no node has cpu=2 free");
        holders.apply(&started(5, 1));
        holders.apply(&started(6, 2));
        assert_eq!(holders.count(TaskState::Running), 2);
        assert_eq!(holders.holding(), "");
        one.apply(&started(9, 3));
        assert_eq!(one.message(1), "running: on node 3, attempt 1");
    }

    use super::*;

    #[test]
    fn get_shows_outcome_and_result() {
        let s = TaskStatus {
            id: TaskId(7),
            state: TaskState::Succeeded,
            node: Some(NodeId(2)),
            attempt: 1,
            reason: None,
            result: Some(TaskResult::Returned(vec![1, 2, 3].into())),
            evicted: false,
            finished_at_ms: Some(1_700_000_000_000),
            hook_errors: Vec::new(),
        };
        let text = render_get(&s);
        assert!(text.contains("succeeded"), "{text}");
        assert!(text.contains("returned 3 bytes: 010203"), "{text}");
        assert!(!text.contains("reason"), "{text}");
        let failed = TaskStatus {
            state: TaskState::Failed,
            reason: Some("exit code 1".into()),
            result: Some(TaskResult::Exited { code: 1 }),
            ..s
        };
        let text = render_get(&failed);
        assert!(
            text.contains("exit code 1") && text.contains("reason:"),
            "{text}"
        );
    }
}
