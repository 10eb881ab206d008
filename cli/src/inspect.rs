//! `escher tasks`, `escher info` and `escher logs`: looking at tasks.
//!
//! `tasks` lists summaries, newest first, filtered by state, name, label, node and namespace
//! (paged through the head's `ListTasks`, with a line saying how many more match), and with
//! `--watch` goes on printing the tasks' events as they happen (the watch API), `info`
//! describes one task completely (spec, status, pending reason, times, attempts), and `logs`
//! copies a command task's stdout or stderr to stdout byte for byte (the latest attempt's, or
//! the one `--attempt` names), optionally following it while the task runs. When the worker
//! that ran an attempt is gone, the head answers from the tail it kept, and `logs` says so on
//! stderr.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use escher_proto::types::{
    Capacity, ClusterEvent, LIMITS_LABEL, LIMITS_MISSING_LABEL, LIMITS_PIDS_LABEL, Labels,
    ListTasksRequest, MORE_COUNTED, Namespace, ResourceSet, WatchKind, WatchRequest,
};
use escher_proto::{LogStream, NodeId, TaskId, TaskInfo, TaskKind, TaskState, TaskSummary};

use super::ctx::Ctx;
use super::render::{
    self, duration, key_values, lines, maybe_time, node, shell_word, short_time, table, time,
};
use escher_client::LogReader;

/// How long `logs --follow` sleeps when there is nothing new.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// A task state, as the CLI spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Waiting for a node with its resources
    Pending,
    /// Dispatched to a node
    Running,
    /// Finished successfully
    Succeeded,
    /// Finished unsuccessfully
    Failed,
    /// Cancelled, or its pending deadline passed
    Cancelled,
}

impl From<StateArg> for TaskState {
    fn from(s: StateArg) -> TaskState {
        match s {
            StateArg::Pending => TaskState::Pending,
            StateArg::Running => TaskState::Running,
            StateArg::Succeeded => TaskState::Succeeded,
            StateArg::Failed => TaskState::Failed,
            StateArg::Cancelled => TaskState::Cancelled,
        }
    }
}

/// Options of `escher tasks`.
#[derive(Debug, Clone, Args)]
pub struct TasksArgs {
    /// Only tasks in this state
    #[arg(long, value_enum, value_name = "STATE")]
    pub state: Option<StateArg>,

    /// Only tasks whose name contains TEXT
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,

    /// Only tasks with this label (repeatable): KEY=VALUE, or KEY for any value
    #[arg(long = "label", value_name = "KEY[=VALUE]")]
    pub labels: Vec<String>,

    /// Only tasks whose latest attempt went to this node
    #[arg(long, value_name = "NODE")]
    pub node: Option<u64>,

    /// Oldest first (default: newest first)
    #[arg(long)]
    pub oldest_first: bool,

    /// List at most N tasks (0: all)
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,

    /// Start after task ID (the last id of the previous page: older ones, or newer ones with
    /// --oldest-first)
    #[arg(long, value_name = "ID")]
    pub after: Option<TaskId>,

    /// After the list, print each task event as it happens (submitted, started, finished,
    /// pending reason changed), one line each, until interrupted. With --json every line is
    /// one JSON object: first each listed task, then each event
    #[arg(long, short = 'w')]
    pub watch: bool,

    /// Watch for this long, then stop (`30s`, `5m`); implies --watch
    #[arg(long, value_name = "DURATION", value_parser = super::values::parse_duration)]
    pub watch_for: Option<Duration>,
}

impl TasksArgs {
    /// The query, for tasks of `namespace` only if given (the global `--namespace`).
    fn query(&self, namespace: Option<Namespace>) -> anyhow::Result<ListTasksRequest> {
        let mut labels = Vec::with_capacity(self.labels.len());
        for selector in &self.labels {
            let (key, value) = match selector.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (selector.as_str(), None),
            };
            if key.is_empty() {
                anyhow::bail!("--label {selector:?}: give KEY=VALUE, or KEY for any value");
            }
            labels.push((key.to_string(), value));
        }
        Ok(ListTasksRequest {
            state: self.state.map(TaskState::from),
            limit: 0,
            after: self.after,
            name: self.name.clone().filter(|n| !n.is_empty()),
            labels,
            node: self.node.map(NodeId),
            namespace,
            newest_first: !self.oldest_first,
        })
    }
}

/// Options of `escher info`./// Options of `escher info`.
#[derive(Debug, Clone, Args)]
pub struct InfoArgs {
    /// The task
    #[arg(value_name = "ID")]
    pub id: TaskId,
}

/// Options of `escher logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The task (of an actor: each incarnation's output in turn, each named on stderr)
    #[arg(value_name = "ID")]
    pub id: TaskId,

    /// Print stderr instead of stdout
    #[arg(long)]
    pub stderr: bool,

    /// Print this attempt's output (from 1; `escher info ID` lists them) instead of the
    /// latest attempt's
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub attempt: Option<u32>,

    /// Keep printing output as the task writes it, until the task has ended (waiting for a
    /// pending task to start, and going on to the next attempt when one starts)
    #[arg(long, short = 'f')]
    pub follow: bool,
}

impl TasksArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let query = self.query(ctx.namespace.clone())?;
        let client = ctx.client().await?;
        let watching = self.watch || self.watch_for.is_some();
        // Subscribed before listing, so that nothing between the list and the first event is
        // missed (an event may repeat what the list shows).
        let watch = match watching {
            true => Some(client.watch(self.watch_request(&query)?).await?),
            false => None,
        };
        let (tasks, more) = if self.limit == 0 {
            (client.find_tasks(query, None).await?, 0)
        } else {
            let page = client
                .list_tasks_page(ListTasksRequest {
                    limit: u32::try_from(self.limit).unwrap_or(u32::MAX),
                    ..query
                })
                .await?;
            (page.tasks, page.more)
        };
        if ctx.json && watch.is_some() {
            // One object per line throughout, the listed tasks and then the events: a reader of
            // the stream never meets an array in the middle of it.
            for task in &tasks {
                let mut line = serde_json::to_string(task)?;
                line.push('\n');
                ctx.emit(&line)?;
            }
        } else if ctx.json {
            ctx.emit_json(&tasks)?;
        } else {
            let mut text = render_tasks(&tasks);
            if let (Some(last), true) = (tasks.last(), more > 0) {
                let more = if more >= MORE_COUNTED {
                    format!("{more} or more")
                } else {
                    more.to_string()
                };
                text.push_str(&format!(
                    "{} shown, {more} more: --after {} shows the next {}, --limit 0 shows all\n",
                    tasks.len(),
                    last.id,
                    self.limit
                ));
            }
            ctx.emit(&text)?;
        }
        if let Some(watch) = watch {
            follow_events(ctx, watch, self.state.map(TaskState::from), self.watch_for).await?;
        }
        Ok(ExitCode::SUCCESS)
    }

    /// What `--watch` subscribes to: the task events the list's filters can select on the
    /// head (labels, namespace; a state picks the kinds of event that lead to it).
    fn watch_request(&self, query: &ListTasksRequest) -> anyhow::Result<WatchRequest> {
        if self.name.is_some() || self.node.is_some() {
            anyhow::bail!(
                "--watch follows tasks by --label, --state and --namespace; --name and --node \
                 select on what a task's events do not carry (list without --watch, or label \
                 the tasks)"
            );
        }
        let kinds = match self.state.map(TaskState::from) {
            // An actor's task events come with its actor events (ready, restarting, died).
            None => vec![
                WatchKind::Submitted,
                WatchKind::Started,
                WatchKind::Finished,
                WatchKind::Pending,
                WatchKind::Actor,
            ],
            Some(TaskState::Pending) => vec![WatchKind::Submitted, WatchKind::Pending],
            Some(TaskState::Running) => vec![WatchKind::Started],
            Some(_) => vec![WatchKind::Finished],
        };
        Ok(WatchRequest {
            after: None,
            namespace: query.namespace.clone(),
            tasks: Vec::new(),
            labels: query.labels.clone(),
            kinds,
        })
    }
}

/// Prints events from `watch` as they come, until it ends, `limit` passes, or the output is
/// closed. With `state`, only the finishes that reach it are printed.
async fn follow_events(
    ctx: &mut Ctx<'_>,
    mut watch: escher_client::Watch,
    state: Option<TaskState>,
    limit: Option<Duration>,
) -> anyhow::Result<()> {
    let deadline = limit.map(|l| tokio::time::Instant::now() + l);
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, watch.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(()),
            },
            None => watch.next().await,
        };
        let Some(event) = next else {
            return Ok(());
        };
        let event = event?;
        if let (Some(want), ClusterEvent::Finished { state, .. }) = (state, &event.event)
            && want.is_terminal()
            && *state != want
        {
            continue;
        }
        if ctx.json {
            let mut line = serde_json::to_string(&event)?;
            line.push('\n');
            ctx.emit(&line)?;
        } else {
            ctx.emit(&format!("{}  {}\n", time(event.at_ms), event.event))?;
        }
    }
}

/// The text of `escher tasks`.
pub fn render_tasks(tasks: &[TaskSummary]) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_string();
    }
    let namespaces = tasks.iter().any(|t| t.namespace.is_some());
    let mut header = vec!["ID", "NAME"];
    if namespaces {
        header.push("NAMESPACE");
    }
    header.extend([
        "STATE",
        "NODE",
        "ATTEMPT",
        "RESOURCES",
        "STARTED",
        "ENDED",
        "REASON",
    ]);
    let mut t = table(&header);
    for task in tasks {
        let mut row = vec![task.id.to_string(), task.name.clone()];
        if namespaces {
            row.push(
                task.namespace
                    .as_ref()
                    .map_or("-".into(), ToString::to_string),
            );
        }
        row.extend([
            task.state.to_string(),
            node(task.node),
            task.attempt.to_string(),
            task.resources.to_string(),
            short_time(task.started_at_ms),
            short_time(task.finished_at_ms),
            task.reason.clone().unwrap_or_default(),
        ]);
        t.add_row(row);
    }
    lines(&t)
}

impl InfoArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let info = client.task_info(self.id).await?;
        if ctx.json {
            ctx.emit_json(&info)?;
        } else {
            // What its node holds the task to, from the node's labels (a reader of the task
            // may read the cluster status too; a failure only leaves the line out): a command,
            // a Python function or a Python actor runs in a cgroup of its own held to its
            // request; a Rust function or actor runs inside the worker's process.
            let held_alone = match &info.spec.kind {
                TaskKind::Command { .. } => true,
                TaskKind::Function { name, .. } => name == PYTHON,
                TaskKind::Actor(actor) => actor.class == PYTHON,
                TaskKind::Ghost { .. } => false,
            };
            let limits = match (held_alone, &info.spec.kind, info.status.node) {
                (true, _, Some(id)) => client
                    .cluster_status()
                    .await
                    .ok()
                    .and_then(|c| c.nodes.into_iter().find(|n| n.id == id))
                    .map(|n| {
                        let memory = n.resource("memory").map(|r| r.total);
                        let held = limits_held(&n.name, &n.labels);
                        match limit_values(&n.labels, &info.spec.resources, memory) {
                            Some(values) => format!("{held} ({values})"),
                            None => held,
                        }
                    }),
                (false, TaskKind::Function { .. } | TaskKind::Actor(_), _) => Some(
                    "none of its own: a Rust function or actor runs inside its worker's process, \
                     held only to what the worker is"
                        .to_string(),
                ),
                _ => None,
            };
            ctx.emit(&render_info_with(&info, limits))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The built-in function and actor class that run Python (`worker/src/python`): their tasks
/// run in interpreters held to each task's request, as commands are.
const PYTHON: &str = "escher.python";

/// What node `name` holds its command tasks to, from its [`LIMITS_LABEL`] and
/// [`LIMITS_MISSING_LABEL`]: what is held and, where some are not, what is not.
pub fn limits_held(name: &str, labels: &Labels) -> String {
    let held = labels.get(LIMITS_LABEL);
    let missing = labels.get(LIMITS_MISSING_LABEL);
    match (held, missing) {
        (None, _) => {
            format!("unknown: node {name} does not say (its worker sets no {LIMITS_LABEL} label)")
        }
        (Some("none"), missing) => format!(
            "none held on node {name}: its task can use more than it asked for{}",
            missing.map(|m| format!(" of {m}")).unwrap_or_default()
        ),
        (Some(held), None) => format!("held on node {name}: {held}"),
        (Some(held), Some(missing)) => format!(
            "held on node {name}: {held}; NOT held: {missing} (its task can use more than it \
             asked for of those)"
        ),
    }
}

/// What each limit the node holds (its [`LIMITS_LABEL`]) is for a task that asked for
/// `request`, as the worker sets them (`worker/src/exec/limits.rs`): `cpu` as a quota of CPU
/// time per 100 ms, `memory` as a limit (what no running task asked for of the node's memory
/// `node_memory` when it started, at least 64 MiB, for a task that asked for none), the
/// process limit from the node's [`LIMITS_PIDS_LABEL`]. `None` when the node holds none.
pub fn limit_values(
    labels: &Labels,
    request: &ResourceSet,
    node_memory: Option<Capacity>,
) -> Option<String> {
    let held: Vec<&str> = labels.get(LIMITS_LABEL)?.split('+').collect();
    let mut values = Vec::new();
    if held.contains(&"cpu") {
        let cpu = request.get("cpu");
        values.push(if cpu.is_zero() {
            "cpu: no quota (it asked for none)".to_string()
        } else {
            let ms = cpu.raw() as f64 / escher_proto::Amount::ONE.raw() as f64 * 100.0;
            format!("cpu: {cpu} CPU, a quota of {ms:.1} ms per 100 ms")
        });
    }
    if held.contains(&"memory") {
        let memory = request.get("memory");
        values.push(if memory.is_zero() {
            let of = match node_memory {
                Some(Capacity::Finite(total)) => format!(" {total} MiB"),
                _ => String::new(),
            };
            format!(
                "memory: it asked for none, so what no running task asked for of the node's{of} \
                 when it started, at least 64 MiB"
            )
        } else {
            format!("memory: {memory} MiB")
        });
    }
    if held.contains(&"pids")
        && let Some(pids) = labels.get(LIMITS_PIDS_LABEL)
    {
        values.push(format!("processes: {pids} at once"));
    }
    (!values.is_empty()).then(|| values.join("; "))
}

/// The text of `escher info`.
pub fn render_info(info: &TaskInfo) -> String {
    render_info_with(info, None)
}

/// The text of `escher info`, with the line saying what the task's node holds it to.
pub fn render_info_with(info: &TaskInfo, limits: Option<String>) -> String {
    let spec = &info.spec;
    let status = &info.status;
    let mut rows = vec![("task", status.id.to_string()), ("name", spec.name.clone())];
    if let Some(parent) = info.parent {
        rows.push(("parent", format!("task {parent}")));
    }
    match &spec.kind {
        TaskKind::Command { argv, env, cwd } => {
            let words: Vec<String> = argv.iter().map(|a| shell_word(a)).collect();
            rows.push(("command", words.join(" ")));
            if !env.is_empty() {
                let vars: Vec<String> = env
                    .iter()
                    .map(|(k, v)| shell_word(&format!("{k}={v}")))
                    .collect();
                rows.push(("env", vars.join(" ")));
            }
            if let Some(dir) = cwd {
                rows.push(("cwd", dir.clone()));
            }
        }
        TaskKind::Function { name, args } => {
            rows.push(("function", name.clone()));
            rows.push(("arguments", render::hex_preview(args)));
        }
        TaskKind::Ghost { creates, ttl } => {
            let list: Vec<String> = creates.iter().map(|(n, c)| format!("{n}={c}")).collect();
            let creates = if list.is_empty() {
                "nothing".to_string()
            } else {
                list.join(",")
            };
            rows.push(("ghost", format!("creates {creates}")));
            rows.push(("ttl", duration(*ttl)));
        }
        TaskKind::Actor(actor) => {
            rows.push(("actor", actor.class.clone()));
            if let Some(name) = &actor.name {
                rows.push(("actor name", name.clone()));
            }
            rows.push(("lifetime", actor.lifetime.as_str().to_string()));
            rows.push(("max concurrency", actor.max_concurrency.to_string()));
            rows.push(("max task retries", actor.max_task_retries.to_string()));
            rows.push(("arguments", render::hex_preview(&actor.args)));
        }
    }
    rows.push(("resources", none_if_empty(spec.resources.to_string())));
    if !spec.labels.is_empty() {
        rows.push(("labels", spec.labels.to_string()));
    }
    let retries = match spec.max_retries {
        u32::MAX => "unlimited".to_string(),
        n => n.to_string(),
    };
    rows.push(("max retries", retries));
    rows.push(("timeout", duration(spec.timeout)));
    rows.push(("pending deadline", duration(spec.pending_deadline)));
    for u in &spec.on_start {
        rows.push(("on start", render::update(u)));
    }
    for u in &spec.on_success {
        rows.push(("on success", render::update(u)));
    }
    rows.push(("state", status.state.to_string()));
    rows.push(("node", node(status.node)));
    if let Some(limits) = limits {
        rows.push(("limits", limits));
    }
    rows.push(("attempt", status.attempt.to_string()));
    rows.push(("result", render::result(status.result.as_ref())));
    // An infeasible task's reason is the pending reason below, with the closest nodes.
    if let Some(reason) = status
        .reason
        .as_ref()
        .filter(|_| info.pending_reason.is_none())
    {
        rows.push(("reason", reason.clone()));
    }
    for error in &status.hook_errors {
        rows.push(("hook not applied", error.clone()));
    }
    if let Some(p) = &info.pending_reason {
        rows.push(("pending because", p.message.clone()));
        if !p.closest_nodes.is_empty() {
            let near: Vec<String> = p.closest_nodes.iter().map(ToString::to_string).collect();
            rows.push(("closest nodes", near.join(", ")));
        }
    }
    rows.push(("submitted", time(info.submitted_at_ms)));
    rows.push(("started", maybe_time(info.started_at_ms)));
    rows.push(("finished", maybe_time(info.finished_at_ms)));
    let attempts: Vec<(u32, String)> = info
        .attempts
        .iter()
        .map(|a| {
            let ended = a.ended.as_deref().unwrap_or("running");
            let kept = if a.output_kept {
                "; the head keeps its output's tail"
            } else {
                ""
            };
            let line = format!(
                "node {}, from {}: {ended}{kept}",
                a.node,
                time(a.started_at_ms)
            );
            (a.attempt, line)
        })
        .collect();
    let labels: Vec<String> = attempts
        .iter()
        .map(|(n, _)| format!("attempt {n}"))
        .collect();
    for ((_, line), label) in attempts.into_iter().zip(&labels) {
        rows.push((label.as_str(), line));
    }
    key_values(&rows)
}

fn none_if_empty(text: String) -> String {
    if text.is_empty() {
        "none".to_string()
    } else {
        text
    }
}

impl LogsArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let stream = if self.stderr {
            LogStream::Stderr
        } else {
            LogStream::Stdout
        };
        let reader = |attempt: Option<u32>| {
            let reader = client.log_reader(self.id, stream);
            match attempt {
                Some(n) => reader.attempt(n),
                None => reader,
            }
        };
        let mut notices = Notices::default();
        if self.attempt.is_none() {
            let info = client.task_info(self.id).await?;
            if matches!(info.spec.kind, TaskKind::Actor(_)) {
                return self.actor_logs(ctx, &client, stream, info).await;
            }
        }
        if !self.follow {
            let mut reader = reader(self.attempt);
            let bytes = reader.read_available().await?;
            notices.show(&reader);
            ctx.emit_bytes(&bytes)?;
            return Ok(ExitCode::SUCCESS);
        }
        // Following a task that has not started yet waits for it to start.
        while client.task_info(self.id).await?.status.state == TaskState::Pending {
            tokio::time::sleep(FOLLOW_POLL).await;
        }
        let mut reader = reader(self.attempt);
        loop {
            while let Some(chunk) = reader.next_chunk().await? {
                notices.show(&reader);
                if chunk.is_empty() {
                    if !reader.is_eof() {
                        tokio::time::sleep(FOLLOW_POLL).await;
                    }
                    continue;
                }
                ctx.emit_bytes(&chunk)?;
            }
            // That attempt ended. Without --attempt, follow the task to its end: a retry
            // goes on in a new attempt, once it starts.
            let read = reader.current_attempt().unwrap_or(0);
            if self.attempt.is_some() {
                break;
            }
            let next = loop {
                let status = client.task_info(self.id).await?.status;
                if status.state.is_terminal() && status.attempt <= read {
                    break None;
                }
                if status.state == TaskState::Running && status.attempt > read {
                    break Some(status);
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            };
            let Some(status) = next else {
                break;
            };
            eprintln!(
                "escher: attempt {} of task {} started on {}",
                status.attempt,
                self.id,
                node(status.node)
            );
            reader = client.log_reader(self.id, stream).attempt(status.attempt);
        }
        Ok(ExitCode::SUCCESS)
    }
}

impl LogsArgs {
    /// An actor's output: every incarnation's in turn (an incarnation is an attempt of the
    /// actor's task), each after a line on stderr naming it and its node; with `--follow`, on
    /// through each restart until the actor has ended.
    async fn actor_logs(
        &self,
        ctx: &mut Ctx<'_>,
        client: &escher_client::Client,
        stream: LogStream,
        mut info: TaskInfo,
    ) -> anyhow::Result<ExitCode> {
        let mut notices = Notices::default();
        // The head keeps the last attempts' records only: older incarnations are skipped.
        let mut next = info.attempts.first().map_or(1, |a| a.attempt);
        loop {
            while next <= info.status.attempt {
                let on = info
                    .attempts
                    .iter()
                    .find(|a| a.attempt == next)
                    .map(|a| format!("node {}", a.node))
                    .unwrap_or_else(|| "an unknown node".to_string());
                eprintln!("escher: incarnation {next} of actor {} on {on}", self.id);
                let mut reader = client.log_reader(self.id, stream).attempt(next);
                // One incarnation that left no output (an actor that runs inside its worker
                // writes none of its own) says so, and the next is read.
                loop {
                    let chunk = match reader.next_chunk().await {
                        Ok(Some(chunk)) => chunk,
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("escher: incarnation {next}: {e}");
                            break;
                        }
                    };
                    notices.show(&reader);
                    if chunk.is_empty() {
                        if reader.is_eof() {
                            continue;
                        }
                        if !self.follow {
                            break;
                        }
                        tokio::time::sleep(FOLLOW_POLL).await;
                        continue;
                    }
                    ctx.emit_bytes(&chunk)?;
                }
                next += 1;
            }
            if !self.follow || info.status.state.is_terminal() {
                return Ok(ExitCode::SUCCESS);
            }
            // Between incarnations (restarting), or waiting for the first to be placed.
            tokio::time::sleep(FOLLOW_POLL).await;
            info = client.task_info(self.id).await?;
        }
    }
}

/// The head's notices about where output came from, each printed once to stderr.
#[derive(Default)]
struct Notices(Option<String>);

impl Notices {
    fn show(&mut self, reader: &LogReader) {
        if let Some(notice) = reader.notice()
            && self.0.as_deref() != Some(notice)
        {
            eprintln!("escher: {notice}");
            self.0 = Some(notice.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::AttemptInfo;
    use escher_proto::{NodeSpec, PendingReason, ResourceName, ResourceUpdate, TaskStatus};

    use super::*;
    use escher_client::{ResourceUpdateExt, Task};

    #[test]
    fn limits_say_what_is_held_and_what_is_not() {
        let mut labels = Labels::default();
        assert!(limits_held("w1", &labels).starts_with("unknown"));
        labels.insert(LIMITS_LABEL, "cpu+memory+pids").unwrap();
        assert_eq!(
            limits_held("w1", &labels),
            "held on node w1: cpu+memory+pids"
        );
        labels.insert(LIMITS_LABEL, "cpu+pids").unwrap();
        labels.insert(LIMITS_MISSING_LABEL, "memory").unwrap();
        assert_eq!(
            limits_held("w1", &labels),
            "held on node w1: cpu+pids; NOT held: memory (its task can use more than it asked \
             for of those)"
        );
        labels.insert(LIMITS_LABEL, "none").unwrap();
        labels
            .insert(LIMITS_MISSING_LABEL, "cpu+memory+pids")
            .unwrap();
        assert!(limits_held("w1", &labels).starts_with("none held on node w1"));
    }

    #[test]
    fn limit_values_say_what_each_held_limit_is_for_the_request() {
        let mut labels = Labels::default();
        let request: ResourceSet = "cpu=0.5,memory=512".parse().unwrap();
        let node = Some(Capacity::Finite("4096".parse().unwrap()));
        assert_eq!(
            limit_values(&labels, &request, node),
            None,
            "no label, no values"
        );
        labels.insert(LIMITS_LABEL, "cpu+memory+pids").unwrap();
        labels.insert(LIMITS_PIDS_LABEL, "4096").unwrap();
        assert_eq!(
            limit_values(&labels, &request, node).unwrap(),
            "cpu: 0.5 CPU, a quota of 50.0 ms per 100 ms; memory: 512 MiB; processes: 4096 at \
             once"
        );
        let none: ResourceSet = "gpu=1".parse().unwrap();
        assert_eq!(
            limit_values(&labels, &none, node).unwrap(),
            "cpu: no quota (it asked for none); memory: it asked for none, so what no running \
             task asked for of the node's 4096 MiB when it started, at least 64 MiB; processes: \
             4096 at once"
        );
        // Only what is held.
        labels.insert(LIMITS_LABEL, "pids").unwrap();
        assert_eq!(
            limit_values(&labels, &request, node).unwrap(),
            "processes: 4096 at once"
        );
        labels.insert(LIMITS_LABEL, "none").unwrap();
        assert_eq!(limit_values(&labels, &request, node), None);
    }

    #[test]
    fn info_describes_everything() {
        let spec = Task::command(["sh", "-c", "echo hi"])
            .resources_str("cpu=1")
            .env("A", "x y")
            .timeout(Duration::from_secs(5))
            .on_success(ResourceUpdate::set("done", 1, NodeSpec::Local).unwrap())
            .build()
            .unwrap();
        let info = TaskInfo {
            spec,
            status: TaskStatus {
                id: TaskId(4),
                state: TaskState::Pending,
                node: None,
                attempt: 0,
                reason: None,
                result: None,
                evicted: false,
                finished_at_ms: None,
                hook_errors: Vec::new(),
            },
            pending_reason: Some(PendingReason {
                resource: ResourceName::gpu(),
                requested: "8".parse().unwrap(),
                best_total: None,
                closest_nodes: vec![NodeId(1), NodeId(3)],
                message: "no live node has gpu".into(),
            }),
            submitted_at_ms: 0,
            started_at_ms: None,
            finished_at_ms: None,
            attempts: vec![AttemptInfo {
                attempt: 1,
                node: NodeId(2),
                started_at_ms: 1_700_000_000_123,
                ended: Some("exited with code 1".into()),
                output_kept: true,
            }],
            parent: Some(TaskId(3)),
        };
        let text = render_info(&info);
        for want in [
            "command:",
            "task 3",
            "sh -c 'echo hi'",
            "'A=x y'",
            "cpu=1",
            "5s",
            "set done=1 on the task's node",
            "pending",
            "no live node has gpu",
            "1, 3",
            "1970-01-01T00:00:00.000Z",
            "attempt 1:",
            "node 2, from 2023-11-14T22:13:20.123Z: exited with code 1; the head keeps",
        ] {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
    }

    #[test]
    fn task_list() {
        let t = TaskSummary {
            id: TaskId(2),
            name: "echo".into(),
            state: TaskState::Failed,
            node: Some(NodeId(1)),
            attempt: 2,
            reason: Some("exit code 1".into()),
            resources: "cpu=1".parse().unwrap(),
            submitted_at_ms: 1_700_000_000_000,
            started_at_ms: Some(1_700_000_000_123),
            finished_at_ms: None,
            namespace: None,
        };
        let text = render_tasks(std::slice::from_ref(&t));
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "2", "echo", "failed", "1", "2", "cpu=1", "11-14", "22:13:20", "-", "exit", "code",
                "1"
            ]
        );
        // A namespace column only when some task has one.
        assert!(!text.contains("NAMESPACE"));
        let team = TaskSummary {
            namespace: Some(Namespace::new("team-a").unwrap()),
            ..t
        };
        let text = render_tasks(&[team]);
        assert!(text.lines().next().unwrap().contains("NAMESPACE"));
        assert!(text.lines().nth(1).unwrap().contains("team-a"));
        assert_eq!(render_tasks(&[]), "no tasks\n");
    }
}
