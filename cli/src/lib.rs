//! escher-cli: the `escher` command-line tool: submit and watch tasks, and set ephemeral resources, from a
//! shell or from inside a command task.
//!
//! ```text
//! escher [--head URL[,URL...]] [--namespace NS] [--json] <command>
//!   status [--node N]               nodes, resources (total / used / available), pending
//!                                   tasks, head replicas
//!   nodes [--all]                   one row per node: use of cpu, memory, GPUs; running tasks
//!   actors [--all]                  one row per actor: class, state, node, restarts, resources
//!   submit [options] -- CMD ARGS... submit a command task (--count N copies, --wait)
//!   get ID [--timeout SECS]         wait for a task; show its outcome and result
//!   wait ID... [--num N] [--timeout SECS]
//!   cancel ID...
//!   requeue ID --resources RESOURCES
//!                                   run a pending, running or failed task again under its
//!                                   id with other resources (a running one is stopped first)
//!   reserve NAME --bundle RESOURCES... [--strategy S] [--timeout SECS] [--wait]
//!                                   reserve bundles all or nothing; release: cancel ID...
//!   gpus                            every node's GPUs, MIG slices, and which task holds each
//!   mig apply NODE GPU LAYOUT [--drain] [--wait [--timeout SECS]]
//!                                   change one GPU's MIG layout
//!   logs ID [--stderr] [--attempt N] [--follow]
//!                                   a command task's output, raw (the latest attempt's)
//!   tasks [--state S] [--name TEXT] [--label K[=V]]... [--node N] [--oldest-first]
//!         [--limit N] [--after ID]  tasks, newest first (of --namespace NS only, if given),
//!                                   with how many more match
//!   info ID                         everything about one task, its attempts included
//!   resource set NAME CAPACITY  (--local | --node ID | --match RESOURCES [--num-nodes N])
//!   resource adjust NAME DELTA  (same targets)
//!   resource delete NAME        (same targets)
//!   sim-work --work SECONDS [--gpcs N] [--mem-gb GB [--mem-growth-gb GB]] [--scale F]
//!                                   inside a task on a simulated GPU: run a GPU job's model
//!                                   (time, memory, out-of-memory, energy) on its device
//!   heads                           the head group's replicas: role, term, commit, applied
//!   heads add ID=HOST:PORT          add a replica (started with --join); heads remove ID
//!   completion bash|zsh|fish|elvish|powershell
//!                                   a shell completion script
//!   new esl NAME [--dir D] [--escher-path P | --escher-version V]
//!                                   write a scheduling library crate of your own from the
//!                                   template (docs/writing-an-esl.md); needs no head
//! ```
//!
//! The head is found from `--head`, else `ESCHER_HEAD`, else the defaults file
//! (`$ESCHER_HOME/config.toml`, see `config.rs`: head, namespace, output), else the access file,
//! else `http://127.0.0.1:7600`; for a replicated head, give every replica's URL,
//! comma-separated (the client follows the leader). Tables are for people; `--json` (or
//! `output = "json"` in the defaults file) prints the domain types for scripts. The exit status is 0 only on
//! success; errors are printed as `error: <message>` with their causes.
//!
//! # Layout
//!
//! - `args`: the [`Cli`] struct, the [`Command`] tree, resource targets, value parsers;
//! - `status`, `submit`, `wait` (get / wait / cancel and the progress bar), `inspect`
//!   (tasks / info / logs), `resource`, `reserve`, `gpus` (gpus / mig apply), `actors`: one module per
//!   group of commands, each
//!   with its option structs, its `run`, and a pure `render_*` function that tests check;
//! - `render`: tables and shared formatting; `ctx`: the options and output every command
//!   gets.
//!
//! The struct that clap fills is not the runtime configuration: [`run_with`] turns the global
//! options into a small context that connects a [`escher_client::Client`] on demand and writes to the
//! output it is given ([`run`]: stdout), so tests can read exactly what a command printed.
#![warn(missing_docs)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use escher_proto::Namespace;

mod actors;
mod admin;
mod args;
pub mod autoscaler;
mod config;
mod ctx;
mod dashboard;
mod gpus;
mod heads;
mod inspect;
mod new;
mod nodes;
mod objects;
mod render;
mod reserve;
mod resource;
mod simwork;
mod status;
mod submit;
mod telemetry;
mod top;
mod values;
mod wait;

pub use args::{Cli, Command};
pub use gpus::{
    GpusArgs, MigApplyArgs, MigCommand, MigCreateArgs, MigDestroyArgs, MigPrepareArgs, MigTarget,
    MigWait, render_gpus, render_phases, render_plan,
};
pub use heads::{HeadsArgs, HeadsChange, render_heads};
pub use inspect::{InfoArgs, LogsArgs, StateArg, TasksArgs, render_info, render_tasks};
pub use new::{NewCommand, NewEslArgs};
pub use reserve::{ReserveArgs, render_reservation};
pub use resource::{ResourceCommand, render_nodes_changed};
pub use resource::{TargetArgs, Which};
pub use simwork::{SIM_SCALE_ENV, SimWorkArgs};
pub use status::{StatusArgs, StatusJson, render_status};
pub use submit::SubmitArgs;
pub use telemetry::{ReportArgs, TelemetryArgs, render_telemetry};
pub use values::{parse_duration, parse_key_value};
pub use wait::{CancelArgs, GetArgs, RequeueArgs, WaitArgs, render_get};

use ctx::Ctx;

/// The `escher` binary: parses the command line, runs the command, prints any error as
/// `error: <message>: <cause>...` on stderr, and returns the exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        // The reader of stdout went away (`escher tasks | head -1`): it has what it wanted, so
        // stop quietly, as `cat` and `grep` do, instead of printing an error about a pipe.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `err` is (or was caused by) writing to a pipe whose reader has closed it.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Runs one parsed command line, writing results to stdout; the exit status on success, or
/// the error to print.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    run_with(cli, &mut std::io::stdout()).await
}

/// Runs one parsed command line, writing results (tables, JSON, log bytes) to `out`.
/// Progress bars and warnings still go to stderr.
pub async fn run_with(cli: Cli, out: &mut (dyn Write + Send)) -> anyhow::Result<ExitCode> {
    let mut cli = cli;
    // Flags and environment first, then the defaults file.
    let defaults = config::CliConfig::load()?;
    if cli.head.as_deref().is_none_or(|h| h.trim().is_empty()) {
        cli.head = defaults.head;
    }
    if cli.namespace.is_none()
        && let Some(ns) = defaults.namespace
    {
        Namespace::new(&ns)
            .map_err(|e| anyhow::anyhow!("namespace {ns:?} of the defaults file: {e}"))?;
        cli.namespace = Some(ns);
    }
    let json = cli.json || defaults.output == Some(config::Output::Json);
    let mut ctx = Ctx {
        namespace: cli.namespace(),
        head: cli.head_url(),
        ca: cli.ca,
        json,
        token: cli.token,
        access_file: cli.access_file,
        out,
    };
    let ctx = &mut ctx;
    match cli.command {
        Command::Status(a) => a.run(ctx).await,
        Command::Nodes(a) => a.run(ctx).await,
        Command::Actors(a) => a.run(ctx).await,
        Command::Objects(a) => a.run(ctx).await,
        Command::Top(a) => a.run(ctx).await,
        Command::Dashboard(a) => a.run(ctx).await,
        Command::Report(a) => a.run(ctx).await,
        Command::Telemetry(a) => a.run(ctx).await,
        Command::Submit(a) => a.run(ctx).await,
        Command::Get(a) => a.run(ctx).await,
        Command::Wait(a) => a.run(ctx).await,
        Command::Cancel(a) => a.run(ctx).await,
        Command::Requeue(a) => a.run(ctx).await,
        Command::SimWork(a) => a.run(ctx).await,
        Command::Logs(a) => a.run(ctx).await,
        Command::Tasks(a) => a.run(ctx).await,
        Command::Info(a) => a.run(ctx).await,
        Command::Resource(a) => a.run(ctx).await,
        Command::Reserve(a) => a.run(ctx).await,
        Command::Gpus(a) => a.run(ctx).await,
        Command::Mig(a) => a.run(ctx).await,
        Command::Heads(a) => a.run(ctx).await,
        Command::Token(a) => a.run(ctx).await,
        Command::Drain(a) => a.run(ctx).await,
        Command::Node(a) => a.run(ctx).await,
        Command::Admin(a) => a.run(ctx).await,
        Command::Autoscaler(a) => a.run(ctx).await,
        Command::Completion(a) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            // Written whole from memory: clap_complete panics on a write error, and a reader
            // that stops early (`| head -1`) is not one worth a panic.
            let mut script = Vec::new();
            clap_complete::generate(a.shell, &mut command, "escher", &mut script);
            ctx.out.write_all(&script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::New(a) => {
            a.run(ctx)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Logs to stderr, filtered by `ESCHER_LOG` (default `warn`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ESCHER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second subscriber (in tests) is not an error worth reporting.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
