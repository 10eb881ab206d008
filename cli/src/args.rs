//! The command line: global options and the command tree. The option structs of each command
//! live in that command's module, the value parsers in `values.rs`, the resource-target flags
//! in `resource.rs`: this module imports them, and none of them imports it.
//!
//! Every value is parsed into a domain type by clap, so a bad value is reported by clap with
//! the flag it belongs to and the domain type's own reason (for resource lists, the column of
//! the bad item).

use clap::{Args, Parser, Subcommand};
use escher_proto::Namespace;

use super::actors::ActorsArgs;
use super::admin::{AdminCommand, DrainArgs, NodeCommand, TokenCommand};
use super::dashboard::DashboardArgs;
use super::gpus::{GpusArgs, MigCommand};
use super::heads::HeadsArgs;
use super::inspect::{InfoArgs, LogsArgs, TasksArgs};
use super::new::NewCommand;
use super::nodes::NodesArgs;
use super::objects::ObjectsArgs;
use super::reserve::ReserveArgs;
use super::resource::ResourceCommand;
use super::simwork::SimWorkArgs;
use super::status::StatusArgs;
use super::submit::SubmitArgs;
use super::telemetry::{ReportArgs, TelemetryArgs};
use super::top::TopArgs;
use super::wait::{CancelArgs, GetArgs, RequeueArgs, WaitArgs};
use escher_client::{DEFAULT_HEAD_URL, ENV_HEAD, ENV_NAMESPACE};

/// The version `--version` prints: the package's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ESCHER_COMMIT"),
    ")"
);

/// escher: submit tasks to an escher cluster, watch them, and shape scheduling with ephemeral
/// resources.
#[derive(Debug, Parser)]
#[command(name = "escher", version = VERSION, propagate_version = true)]
pub struct Cli {
    /// The head to talk to; for a replicated head, every replica's URL, comma-separated
    /// [default: the heads of the access file, else http://127.0.0.1:7600]
    #[arg(long, global = true, env = ENV_HEAD, value_name = "URL[,URL...]")]
    pub head: Option<String>,

    /// Qualify unqualified application resource names with this namespace
    // Text rather than `Namespace`, so that an empty ESCHER_NAMESPACE means "none".
    #[arg(long, global = true, env = ENV_NAMESPACE, value_name = "NS",
          value_parser = parse_namespace)]
    pub namespace: Option<String>,

    /// Print JSON (the domain types; amounts as decimal strings, "0.5") instead of tables
    #[arg(long, global = true)]
    pub json: bool,

    /// The token to call with [default: ESCHER_TASK_TOKEN inside a task, else ESCHER_TOKEN,
    /// else the admin token of the access file]
    #[arg(long, global = true, value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The access file the head wrote [default: ESCHER_ACCESS_FILE, else
    /// $ESCHER_HOME/access.json, ESCHER_HOME defaulting to ~/.escher]
    #[arg(long, global = true, value_name = "PATH")]
    pub access_file: Option<std::path::PathBuf>,

    /// The certificate (PEM) to trust for an https:// head [default: the access file's]
    #[arg(long, global = true, value_name = "PEM")]
    pub ca: Option<std::path::PathBuf>,

    /// What to do
    #[command(subcommand)]
    pub command: Command,
}

/// The commands of `escher`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show nodes, every resource's total / used / available, and pending tasks with reasons
    Status(StatusArgs),
    /// One row per node: liveness, CPU, memory and GPU use, other resources, running tasks
    Nodes(NodesArgs),
    /// One row per actor: name, class, state, node, restarts, resources
    Actors(ActorsArgs),
    /// One row per object: id, size, owner, the nodes that hold a copy (or where it was lost)
    Objects(ObjectsArgs),
    /// A live view: tasks by namespace and state, the queue draining, each node's use
    Top(TopArgs),
    /// Print the address of the head's web dashboard, signed in with this CLI's token
    Dashboard(DashboardArgs),
    /// Inside a running task: report samples of its progress (KEY=NUMBER ...)
    Report(ReportArgs),
    /// The samples tasks reported with `escher report` or the task API
    Telemetry(TelemetryArgs),
    /// Submit a command task (or several copies), optionally waiting for it
    Submit(SubmitArgs),
    /// Wait for a task to finish and show its outcome and result
    Get(GetArgs),
    /// Wait until some of the given tasks finish (Ray's wait)
    Wait(WaitArgs),
    /// Cancel tasks
    Cancel(CancelArgs),
    /// Run a pending, running or failed task again under its id with other resources (a
    /// larger MIG slice after running out of memory, say); a running one is stopped first
    Requeue(RequeueArgs),
    /// Inside a task on a simulated GPU (--sim-gpu): run a GPU job's model (time, memory,
    /// out-of-memory, energy) on the device the task was given
    SimWork(SimWorkArgs),
    /// Print a command task's stdout (or stderr) as raw bytes
    Logs(LogsArgs),
    /// List tasks, optionally only those in one state
    Tasks(TasksArgs),
    /// Describe one task: spec, state, node, attempt, pending reason, times
    Info(InfoArgs),
    /// Create, resize or delete ephemeral resources on nodes
    #[command(subcommand)]
    Resource(ResourceCommand),
    /// Reserve bundles of resources all or nothing (gang scheduling); release with `cancel`
    Reserve(ReserveArgs),
    /// Show every node's GPUs and MIG slices, and which task holds each device
    Gpus(GpusArgs),
    /// Change MIG layouts
    #[command(subcommand)]
    Mig(MigCommand),
    /// Show the head group's replicas (role, term, commit and applied index), or add or remove
    /// one
    Heads(HeadsArgs),
    /// Create, list and revoke tokens (admin)
    #[command(subcommand)]
    Token(TokenCommand),
    /// Stop admitting new tasks on a node; running tasks finish (admin)
    Drain(DrainArgs),
    /// Change a live node: `escher node label NODE KEY=VALUE... KEY-...` (admin)
    #[command(subcommand)]
    Node(NodeCommand),
    /// What an autoscaler decided and why: `escher autoscaler status --status-file FILE`
    #[command(subcommand)]
    Autoscaler(super::autoscaler::AutoscalerCommand),
    /// Back up the head group's state (admin): `escher admin snapshot save FILE`
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Print a shell completion script: `escher completion bash > /etc/bash_completion.d/escher`
    Completion(CompletionArgs),
    /// Write a crate of your own from a template: `escher new esl NAME` (needs no head)
    #[command(subcommand)]
    New(NewCommand),
}

/// Options of `escher completion`.
#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

impl Cli {
    /// The head URLs: `--head`/`ESCHER_HEAD`, else those the access file lists, else
    /// [`DEFAULT_HEAD_URL`].
    pub fn head_url(&self) -> String {
        if let Some(head) = self.head.as_deref().filter(|h| !h.trim().is_empty()) {
            return head.to_string();
        }
        escher_proto::access::location(self.access_file.as_deref())
            .ok()
            .and_then(|path| escher_proto::access::AccessFile::read(&path).ok())
            .filter(|file| !file.heads.is_empty())
            .map_or_else(|| DEFAULT_HEAD_URL.to_string(), |file| file.heads.join(","))
    }

    /// The namespace from `--namespace` or `ESCHER_NAMESPACE`; empty means none.
    pub fn namespace(&self) -> Option<Namespace> {
        self.namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .and_then(|ns| Namespace::new(ns).ok())
    }
}

/// Checks a namespace (empty is allowed and means none).
fn parse_namespace(text: &str) -> Result<String, escher_proto::TypeError> {
    let text = text.trim();
    if !text.is_empty() {
        Namespace::new(text)?;
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;
    use clap::error::ErrorKind;
    use escher_proto::{Capacity, NodeId, NodeSpec, TaskId, TaskState};

    use super::*;
    use crate::resource::ResourceCommand as R;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("escher").chain(args.iter().copied()))
    }

    fn ok(args: &[&str]) -> Cli {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn err(args: &[&str]) -> clap::Error {
        match parse(args) {
            Ok(cli) => panic!("{args:?} parsed: {cli:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = ok(&[
            "--head",
            "http://h:1",
            "status",
            "--json",
            "--namespace",
            "app",
        ]);
        assert_eq!(cli.head_url(), "http://h:1");
        assert!(cli.json);
        assert_eq!(cli.namespace().unwrap().as_str(), "app");
        assert_eq!(ok(&["--namespace", "", "status"]).namespace(), None);
        assert!(matches!(cli.command, Command::Status(_)));
        let e = err(&["--namespace", "a/b", "status"]);
        assert!(e.to_string().contains("invalid resource name"), "{e}");
    }

    #[test]
    fn submit_takes_options_then_the_command() {
        let cli = ok(&[
            "submit",
            "-r",
            "cpu=1,x=2",
            "--name",
            "n",
            "--retries",
            "2",
            "--timeout",
            "1.5",
            "--pending-deadline",
            "2m",
            "--env",
            "A=1",
            "-e",
            "B=x=y",
            "--cwd",
            "/tmp",
            "--count",
            "3",
            "--wait",
            "--",
            "python3",
            "-c",
            "print(1)",
        ]);
        let Command::Submit(s) = cli.command else {
            panic!("not submit");
        };
        assert_eq!(s.resources.unwrap().to_string(), "cpu=1,x=2");
        assert_eq!(s.name.as_deref(), Some("n"));
        assert_eq!(s.retries, 2);
        assert_eq!(s.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(s.pending_deadline, Some(Duration::from_secs(120)));
        assert_eq!(s.env[1], ("B".to_string(), "x=y".to_string()));
        assert_eq!(s.count, 3);
        assert!(s.wait);
        assert_eq!(s.argv, ["python3", "-c", "print(1)"]);

        // Without `--`, everything from the program on is the command.
        let Command::Submit(s) = ok(&["submit", "echo", "--name", "x"]).command else {
            panic!("not submit");
        };
        assert_eq!(s.argv, ["echo", "--name", "x"]);
        assert_eq!(err(&["submit"]).kind(), ErrorKind::MissingRequiredArgument);
        assert!(
            err(&["submit", "--count", "0", "--", "true"])
                .to_string()
                .contains("0")
        );
        assert!(
            err(&["submit", "--env", "novalue", "--", "true"])
                .to_string()
                .contains("KEY=VALUE")
        );
    }

    #[test]
    fn bad_resource_syntax_reports_the_column() {
        let e = err(&["submit", "--resources", "cpu=1,x", "--", "true"]).to_string();
        assert!(e.contains("column 7"), "{e}");
        assert!(e.contains("--resources"), "{e}");
        let e = err(&["resource", "set", "x", "1", "--match", "cpu=1,,"]).to_string();
        assert!(e.contains("column 7"), "{e}");
        let e = err(&["submit", "-r", "cpu=0.00001", "--", "true"]).to_string();
        assert!(e.contains("precision"), "{e}");
    }

    #[test]
    fn task_commands_parse_ids_and_options() {
        let Command::Get(g) = ok(&["get", "task-7", "--timeout", "500ms"]).command else {
            panic!("not get");
        };
        assert_eq!(
            (g.id, g.timeout),
            (TaskId(7), Some(Duration::from_millis(500)))
        );
        let Command::Wait(w) = ok(&["wait", "1", "2", "3", "--num", "2"]).command else {
            panic!("not wait");
        };
        assert_eq!(w.ids, [TaskId(1), TaskId(2), TaskId(3)]);
        assert_eq!(w.num, Some(2));
        assert_eq!(err(&["wait"]).kind(), ErrorKind::MissingRequiredArgument);
        let Command::Cancel(c) = ok(&["cancel", "4", "5"]).command else {
            panic!("not cancel");
        };
        assert_eq!(c.ids.len(), 2);
        assert!(!c.recursive && !c.force);
        let Command::Cancel(c) = ok(&["cancel", "4", "--recursive", "--force"]).command else {
            panic!("not cancel");
        };
        assert!(c.recursive && c.force);
        let Command::Logs(l) = ok(&["logs", "4", "--stderr"]).command else {
            panic!("not logs");
        };
        assert!(l.stderr && !l.follow);
        let Command::Tasks(t) = ok(&["tasks", "--state", "pending", "--limit", "5"]).command else {
            panic!("not tasks");
        };
        assert_eq!(t.state.map(TaskState::from), Some(TaskState::Pending));
        assert_eq!(t.limit, 5);
        assert!(
            err(&["tasks", "--state", "sleeping"])
                .to_string()
                .contains("pending")
        );
        assert!(matches!(ok(&["info", "9"]).command, Command::Info(i) if i.id == TaskId(9)));
        assert!(err(&["get", "x1"]).to_string().contains("task id"));
    }

    #[test]
    fn resource_targets_are_required_and_exclusive() {
        let Command::Resource(R::Set {
            name,
            capacity,
            target,
        }) = ok(&["resource", "set", "queue", "unbounded", "--node", "3"]).command
        else {
            panic!("not resource set");
        };
        assert_eq!(name.as_str(), "queue");
        assert_eq!(capacity, Capacity::Unbounded);
        assert_eq!(target.node_spec(), NodeSpec::Node(NodeId(3)));

        let Command::Resource(R::Set { target, .. }) = ok(&[
            "resource",
            "set",
            "q",
            "0.5",
            "--match",
            "cpu=1",
            "--num-nodes",
            "2",
        ])
        .command
        else {
            panic!("not resource set");
        };
        assert_eq!(
            target.node_spec(),
            NodeSpec::Match {
                resources: "cpu=1".parse().unwrap(),
                num_nodes: Some(2)
            }
        );

        let Command::Resource(R::Adjust { delta, target, .. }) =
            ok(&["resource", "adjust", "q", "-2", "--local"]).command
        else {
            panic!("not resource adjust");
        };
        assert_eq!(delta.to_string(), "-2");
        assert_eq!(target.node_spec(), NodeSpec::Local);
        assert!(matches!(
            ok(&["resource", "delete", "q", "--local"]).command,
            Command::Resource(R::Delete { .. })
        ));

        let e = err(&["resource", "set", "q", "1"]);
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument, "{e}");
        let e = err(&["resource", "set", "q", "1", "--local", "--node", "1"]);
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{e}");
        let e = err(&["resource", "delete", "q", "--node", "1", "--match", "cpu=1"]);
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{e}");
        let e = err(&[
            "resource",
            "set",
            "q",
            "1",
            "--node",
            "1",
            "--num-nodes",
            "2",
        ]);
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{e}");
        let e = err(&["resource", "set", "q", "1", "--num-nodes", "2"]);
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument, "{e}");
        let e = err(&[
            "resource",
            "set",
            "q",
            "1",
            "--match",
            "cpu=1",
            "--num-nodes",
            "0",
        ]);
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{e}");
        assert!(
            err(&["resource", "set", "q", "lots", "--local"])
                .to_string()
                .contains("lots")
        );
        assert!(
            err(&["resource", "set", "b@d", "1", "--local"])
                .to_string()
                .contains("b@d")
        );
    }

    #[test]
    fn every_command_has_help() {
        for path in [
            vec!["--help"],
            vec!["status", "--help"],
            vec!["submit", "--help"],
            vec!["resource", "--help"],
            vec!["resource", "adjust", "--help"],
        ] {
            assert_eq!(err(&path).kind(), ErrorKind::DisplayHelp, "{path:?}");
        }
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            assert!(
                sub.get_about().is_some(),
                "{} has no description",
                sub.get_name()
            );
        }
    }
}
