//! `escher dashboard`: the address of the head's web dashboard with a login ticket, ready to
//! open. The CLI asks the head for the ticket over its own authenticated connection
//! (`DashboardTicket`); the head answers with the address it serves its dashboard on, which
//! is the address printed, and a random ticket that the page trades once, within a minute and
//! only at that address, for a session acting as this CLI's token. The token itself never
//! leaves the CLI and the head: not in the address, not to whatever listens on a port.

use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use super::ctx::Ctx;

/// Options of `escher dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// The address you expect the head to serve its dashboard on (its --dashboard); the
    /// address printed is always the one the head reports, and a different one is refused
    #[arg(long, env = "ESCHER_DASHBOARD", value_name = "HOST:PORT")]
    pub address: Option<std::net::SocketAddr>,

    /// Open this view first: overview, tasks, tasks/ID, reservations, gpus, heads, logs or
    /// logs/NODE
    #[arg(long, value_name = "VIEW")]
    pub view: Option<String>,
}

/// Refuses a view the page does not have.
fn check_view(view: &str) -> anyhow::Result<()> {
    let known = ["overview", "tasks", "reservations", "gpus", "heads", "logs"];
    let task = view
        .strip_prefix("tasks/")
        .is_some_and(|id| id.trim_start_matches("task-").parse::<u64>().is_ok());
    let node = view
        .strip_prefix("logs/")
        .is_some_and(|id| id.trim_start_matches("node-").parse::<u64>().is_ok());
    if known.contains(&view) || task || node {
        return Ok(());
    }
    anyhow::bail!(
        "--view {view:?}: the dashboard has overview, tasks, tasks/ID, reservations, gpus, \
         heads, logs and logs/NODE"
    )
}

/// What `escher dashboard --json` prints.
#[derive(Debug, Serialize)]
struct DashboardJson {
    url: String,
    token_from: String,
    expires_in_ms: u64,
}

impl DashboardArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        if let Some(view) = &self.view {
            check_view(view.trim_start_matches('#'))?;
        }
        let credentials = ctx.credentials()?;
        if credentials.secret().is_none() {
            anyhow::bail!(
                "no token to sign in with ({}); pass --token, or create one with `escher token \
                 create --role reader` as an admin",
                credentials.source()
            );
        }
        let client = ctx.client().await?;
        let ticket = client.dashboard_ticket().await.map_err(|e| {
            anyhow::anyhow!("cannot get a dashboard login ticket from the head: {e}")
        })?;
        if let Some(expected) = self.address
            && expected.to_string() != ticket.address
        {
            anyhow::bail!(
                "the head serves its dashboard at {}, not at {expected} (--address or \
                 ESCHER_DASHBOARD): no address is printed for {expected}; leave --address out \
                 to open the head's own",
                ticket.address
            );
        }
        let url = ticket.url(self.view.as_deref().map(|v| v.trim_start_matches('#')));
        if ctx.json {
            ctx.emit_json(&DashboardJson {
                url,
                token_from: credentials.source().to_string(),
                expires_in_ms: ticket.expires_in.as_millis() as u64,
            })?;
        } else {
            ctx.emit(&format!("{url}\n"))?;
            eprintln!(
                "open this address in a browser on this machine within {} s; it signs in once, \
                 as the token from {} (which is not in the address)",
                ticket.expires_in.as_secs(),
                credentials.source()
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
