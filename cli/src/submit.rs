//! `escher submit`: submits a command task, or `--count N` copies of it in one batch, and
//! prints the ids; with `--wait`, waits (with a progress bar for several) and prints how each
//! ended.
//!
//! Exit status with `--wait`: 0 if every task succeeded; for one failed command task, its own
//! exit code (1 to 255); otherwise 1.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use escher_proto::{ResourceSet, TaskId, TaskStatus};
use serde::Serialize;

use super::ctx::Ctx;
use super::render::{exit_status, statuses, unsuccessful};
use super::values::{parse_duration, parse_key_value};
use super::wait::wait_with_progress;
use escher_client::Task;

/// Options of `escher submit`.
#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    /// Resources the task holds while it runs, e.g. cpu=1,x=2 [default: cpu=1; cpu=0 for
    /// none]
    #[arg(long, short = 'r', value_name = "RESOURCES")]
    pub resources: Option<ResourceSet>,

    /// A name for the task (default: the program's file name)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Run it again up to N times after a failure or a lost node
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retries: u32,

    /// Stop the task when it has run this long (seconds, or 500ms / 5m / 2h)
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Fail the task if it is still pending after this long
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub pending_deadline: Option<Duration>,

    /// Set an environment variable of the task (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,

    /// Add a label to the task (repeatable)
    #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,

    /// Run the task in this working directory (on the worker)
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,

    /// Submit N copies of the task in one batch (at most 100,000 per call: a batch is one
    /// message to the head)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub count: u32,

    /// Wait for the task(s) to finish and print how they ended
    #[arg(long)]
    pub wait: bool,

    /// Submit under this idempotency key (CLIENT-SEQ), the one an "may or may not have been
    /// applied" error printed: the head applies a submit at most once per key (for ten minutes
    /// after the client's last write), so retrying with it never runs the tasks twice
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,

    /// The command and its arguments: everything after the first word that is not an option
    /// of `submit` (or after `--`) is the command's; an unknown option before it is refused
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<String>,
}

/// What `escher submit --json` prints.
#[derive(Debug, Serialize)]
struct SubmitJson {
    task_ids: Vec<TaskId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    statuses: Option<Vec<TaskStatus>>,
}

impl SubmitArgs {
    /// The task these options describe.
    pub fn task(&self) -> Task {
        let mut task = Task::command(self.argv.iter().cloned()).max_retries(self.retries);
        if let Some(name) = &self.name {
            task = task.name(name.clone());
        }
        if let Some(set) = &self.resources {
            task = task.resources(set.clone());
        }
        if let Some(limit) = self.timeout {
            task = task.timeout(limit);
        }
        if let Some(limit) = self.pending_deadline {
            task = task.pending_deadline(limit);
        }
        for (k, v) in &self.env {
            task = task.env(k.clone(), v.clone());
        }
        for (k, v) in &self.labels {
            task = task.label(k, v);
        }
        if let Some(dir) = &self.cwd {
            task = task.cwd(dir.clone());
        }
        task
    }

    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let spec = self.task().build()?;
        let client = ctx.client().await?;
        let client = match &self.key {
            Some(key) => client.with_idempotency_key(key)?,
            None => client,
        };
        let shows_progress = !ctx.json && std::io::stderr().is_terminal();
        if self.wait && self.count == 1 && !shows_progress {
            // Nothing to show while it runs: submit and wait in one round trip.
            let status = client.run(spec, None).await?;
            if !ctx.json {
                ctx.emit(&format!("{}\n", status.id))?;
            }
            return self.report(ctx, vec![status.id], vec![status]);
        }
        let batch = vec![spec; self.count as usize];
        let refs = client.submit_batch(batch).await?;
        let ids: Vec<TaskId> = refs.iter().map(|r| r.id()).collect();
        if !ctx.json {
            let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
            ctx.emit(&text)?;
        }
        if !self.wait {
            if ctx.json {
                ctx.emit_json(&SubmitJson {
                    task_ids: ids,
                    statuses: None,
                })?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        let (done, _) = wait_with_progress(&client, &ids, ids.len(), None, !ctx.json).await?;
        self.report(ctx, ids, done)
    }

    /// Prints how the tasks ended; the exit status says whether they all succeeded.
    fn report(
        &self,
        ctx: &mut Ctx<'_>,
        ids: Vec<TaskId>,
        mut done: Vec<TaskStatus>,
    ) -> anyhow::Result<ExitCode> {
        done.sort_by_key(|s| s.id);
        let code = exit_status(&done);
        eprint!("{}", unsuccessful(&done));
        if ctx.json {
            ctx.emit_json(&SubmitJson {
                task_ids: ids,
                statuses: Some(done),
            })?;
        } else {
            ctx.emit(&statuses(&done))?;
        }
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use escher_proto::TaskKind;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn options_become_the_task_spec() {
        let cli = Cli::try_parse_from([
            "escher",
            "submit",
            "-r",
            "cpu=1",
            "--name",
            "n",
            "--retries",
            "1",
            "--timeout",
            "2",
            "-e",
            "A=1",
            "-l",
            "team=a",
            "--cwd",
            "/srv",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Command::Submit(args) = cli.command else {
            panic!("not submit");
        };
        let spec = args.task().build().unwrap();
        assert_eq!(spec.name, "n");
        assert_eq!(spec.resources.to_string(), "cpu=1");
        assert_eq!(spec.max_retries, 1);
        assert_eq!(spec.timeout, Some(Duration::from_secs(2)));
        assert_eq!(spec.labels.get("team"), Some("a"));
        let TaskKind::Command { argv, env, cwd } = spec.kind else {
            panic!("not a command");
        };
        assert_eq!(argv, ["sh", "-c", "exit 3"]);
        assert_eq!(env, [("A".to_string(), "1".to_string())]);
        assert_eq!(cwd.as_deref(), Some("/srv"));
    }

    #[test]
    fn bad_labels_are_reported_before_connecting() {
        let cli = Cli::try_parse_from(["escher", "submit", "-l", "k=a b", "--", "true"]).unwrap();
        let Command::Submit(args) = cli.command else {
            panic!("not submit");
        };
        let err = args.task().build().unwrap_err().to_string();
        assert!(err.contains("invalid label"), "{err}");
    }

    #[test]
    fn json_shape() {
        let v = serde_json::to_value(SubmitJson {
            task_ids: vec![TaskId(1), TaskId(2)],
            statuses: None,
        })
        .unwrap();
        assert_eq!(v, serde_json::json!({"task_ids": [1, 2]}));
    }
}
