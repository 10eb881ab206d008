//! `escher actors`: one row per actor (docs/DESIGN.md §17): its id, name, class, state, the
//! node that hosts it, how many times it restarted, and the resources it holds.
//!
//! Actors are the tasks that carry the label `escher.actor` (the head gives every actor its
//! class as that label): one `ListTasks` page of them, then, for each live one, `ResolveActor`
//! for its incarnation and the calls waiting at it. Method calls do not pass through the head:
//! the count of waiting calls (queued or running) is what the hosting worker's last heartbeat
//! to the leader said, and `-` when the replica that answered has not heard one.

use std::process::ExitCode;

use clap::Args;
use escher_proto::TaskState;
use escher_proto::types::{ACTOR_LABEL, ListTasksRequest, TaskSummary};
use serde::Serialize;

use super::ctx::Ctx;
use super::render::table;

/// How many actors one `actors` call lists.
const PAGE: u32 = 10_000;

/// Options of `escher actors`.
#[derive(Debug, Clone, Args)]
pub struct ActorsArgs {
    /// Show actors that have ended too
    #[arg(long)]
    pub all: bool,
}

/// One row of `escher actors --json`.
#[derive(Debug, Serialize)]
pub struct ActorRow {
    /// The actor's id (its task's id).
    pub id: u64,
    /// Its task's name (the actor's name, or its class).
    pub name: String,
    /// Its class.
    pub class: String,
    /// Its task's state: pending (being placed or restarted), running, or how it ended.
    pub state: String,
    /// The node hosting it, if placed.
    pub node: Option<u64>,
    /// How many times it restarted (its incarnation less one).
    pub restarts: u32,
    /// How many calls wait at its running incarnation (queued or running), as its worker's
    /// last heartbeat said; `None` when not known (not running, or not heard yet).
    pub pending_calls: Option<u64>,
    /// The resources it holds while it runs.
    pub resources: String,
    /// Its namespace, if any.
    pub namespace: Option<String>,
}

impl ActorRow {
    fn of(task: &TaskSummary) -> ActorRow {
        ActorRow {
            id: task.id.0,
            name: task.name.clone(),
            class: String::new(),
            state: task.state.as_str().to_string(),
            node: task.node.map(|n| n.0),
            restarts: task.attempt.saturating_sub(1),
            pending_calls: None,
            resources: task.resources.to_string(),
            namespace: task.namespace.as_ref().map(|n| n.as_str().to_string()),
        }
    }
}

impl ActorsArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let page = client
            .list_tasks_page(ListTasksRequest {
                labels: vec![(ACTOR_LABEL.to_string(), None)],
                limit: PAGE,
                ..ListTasksRequest::default()
            })
            .await?;
        let mut rows = Vec::new();
        for task in page
            .tasks
            .iter()
            .filter(|t| self.all || !t.state.is_terminal())
        {
            let mut row = ActorRow::of(task);
            if let Ok(info) = client.task_info(task.id).await {
                row.class = info.spec.labels.get(ACTOR_LABEL).unwrap_or("").to_string();
            }
            if task.state == TaskState::Running
                && let Ok(view) = client.describe_actor(task.id).await
            {
                row.restarts = view.incarnation.saturating_sub(1);
                row.pending_calls = view.pending_calls;
            }
            rows.push(row);
        }
        if ctx.json {
            ctx.emit_json(&rows)?;
        } else {
            let mut text = render_actors(&rows);
            if page.more > 0 {
                text.push_str(&format!(
                    "(the first {PAGE} actors; {} more not shown)\n",
                    page.more
                ));
            }
            ctx.emit(&text)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of `escher actors`.
pub fn render_actors(rows: &[ActorRow]) -> String {
    if rows.is_empty() {
        return "no actors\n".to_string();
    }
    let mut t = table(&[
        "ACTOR",
        "NAME",
        "CLASS",
        "STATE",
        "NODE",
        "RESTARTS",
        "PENDING CALLS",
        "RESOURCES",
    ]);
    for row in rows {
        t.add_row(vec![
            row.id.to_string(),
            row.name.clone(),
            row.class.clone(),
            row.state.clone(),
            row.node.map_or_else(|| "-".to_string(), |n| n.to_string()),
            row.restarts.to_string(),
            row.pending_calls
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            row.resources.clone(),
        ]);
    }
    format!("{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_are_rendered_one_row_each_and_none_says_so() {
        assert_eq!(render_actors(&[]), "no actors\n");
        let row = ActorRow {
            id: 7,
            name: "ps".into(),
            class: "Counter".into(),
            state: "running".into(),
            node: Some(2),
            restarts: 1,
            pending_calls: Some(3),
            resources: "cpu=1".into(),
            namespace: None,
        };
        let text = render_actors(&[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("ACTOR") && lines[0].contains("RESTARTS"),
            "{text}"
        );
        assert!(
            lines[1].contains("ps") && lines[1].contains("Counter"),
            "{text}"
        );
        assert!(lines[0].contains("PENDING CALLS"), "{text}");
    }
}
