//! `escher tasks`, `escher info` and `escher logs`: looking at tasks.
//!
//! `tasks` lists summaries in id order (paged through the head's `ListTasks`), `info`
//! describes one task completely (spec, status, pending reason, times), and `logs` copies a
//! command task's stdout or stderr to stdout byte for byte, optionally following it while the
//! task runs.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use escher_proto::{LogStream, TaskId, TaskInfo, TaskKind, TaskState, TaskSummary};

use super::ctx::Ctx;
use super::render::{self, duration, key_values, lines, maybe_time, node, shell_word, table, time};

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

    /// List at most N tasks, lowest ids first (0: all)
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
}

/// Options of `escher info`.
#[derive(Debug, Clone, Args)]
pub struct InfoArgs {
    /// The task
    #[arg(value_name = "ID")]
    pub id: TaskId,
}

/// Options of `escher logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The task
    #[arg(value_name = "ID")]
    pub id: TaskId,

    /// Print stderr instead of stdout
    #[arg(long)]
    pub stderr: bool,

    /// Keep printing output as the task writes it, until the task has ended (waiting for a
    /// pending task to start)
    #[arg(long, short = 'f')]
    pub follow: bool,
}

impl TasksArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        // One more than shown, to know whether the list goes on.
        let limit = (self.limit > 0).then_some(self.limit.saturating_add(1));
        let mut tasks = client
            .list_tasks(self.state.map(TaskState::from), limit)
            .await?;
        let more = self.limit > 0 && tasks.len() > self.limit;
        tasks.truncate(if more { self.limit } else { tasks.len() });
        if ctx.json {
            ctx.emit_json(&tasks)?;
        } else {
            let mut text = render_tasks(&tasks);
            if more {
                text.push_str(&format!(
                    "the first {} shown; more exist (--limit N shows N, --limit 0 all)\n",
                    self.limit
                ));
            }
            ctx.emit(&text)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of `escher tasks`.
pub fn render_tasks(tasks: &[TaskSummary]) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_string();
    }
    let mut t = table(&[
        "ID",
        "NAME",
        "STATE",
        "NODE",
        "ATTEMPT",
        "RESOURCES",
        "REASON",
    ]);
    for task in tasks {
        t.add_row(vec![
            task.id.to_string(),
            task.name.clone(),
            task.state.to_string(),
            node(task.node),
            task.attempt.to_string(),
            task.resources.to_string(),
            task.reason.clone().unwrap_or_default(),
        ]);
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
            ctx.emit(&render_info(&info))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of `escher info`.
pub fn render_info(info: &TaskInfo) -> String {
    let spec = &info.spec;
    let status = &info.status;
    let mut rows = vec![("task", status.id.to_string()), ("name", spec.name.clone())];
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
        let mut reader = client.log_reader(self.id, stream);
        if !self.follow {
            ctx.emit_bytes(&reader.read_available().await?)?;
            return Ok(ExitCode::SUCCESS);
        }
        // Following a task that has not started yet waits for it to start.
        while client.task_info(self.id).await?.status.state == TaskState::Pending {
            tokio::time::sleep(FOLLOW_POLL).await;
        }
        while let Some(chunk) = reader.next_chunk().await? {
            if chunk.is_empty() {
                if !reader.is_eof() {
                    tokio::time::sleep(FOLLOW_POLL).await;
                }
                continue;
            }
            ctx.emit_bytes(&chunk)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::{NodeId, NodeSpec, PendingReason, ResourceName, ResourceUpdate, TaskStatus};

    use super::*;
    use crate::{ResourceUpdateExt, Task};

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
        };
        let text = render_info(&info);
        for want in [
            "command:",
            "sh -c 'echo hi'",
            "'A=x y'",
            "cpu=1",
            "5s",
            "set done=1 on the task's node",
            "pending",
            "no live node has gpu",
            "1, 3",
            "1970-01-01T00:00:00.000Z",
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
        };
        let text = render_tasks(&[t]);
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "2", "echo", "failed", "1", "2", "cpu=1", "exit", "code", "1"
            ]
        );
        assert_eq!(render_tasks(&[]), "no tasks\n");
    }
}
