//! `escher autoscaler status`: what an autoscaler decided and why, from the status file its
//! `run` writes (`escher-autoscaler status` prints the same). The autoscaler is a client of
//! the head, not part of it, so its state is its file; its decisions also reach the head's
//! watch API when it can report them (see `run`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::Report;
use crate::ctx::Ctx;

/// `escher autoscaler ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum AutoscalerCommand {
    /// Print what an autoscaler (`escher-autoscaler run`) last decided and why: whether its
    /// provider can start workers, its workers, the budget spent and its latest decisions
    Status {
        /// The status file `escher-autoscaler run --status-file` writes
        #[arg(long, default_value = "autoscaler-status.json")]
        status_file: PathBuf,
    },
}

impl AutoscalerCommand {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let AutoscalerCommand::Status { status_file } = self;
        let report = Report::read(&status_file)?;
        if ctx.json {
            ctx.emit_json(&report)?;
        } else {
            ctx.emit(&report.render())?;
        }
        Ok(ExitCode::SUCCESS)
    }
}
