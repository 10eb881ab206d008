//! `escher dashboard`: the address of the head's web dashboard with this CLI's token, ready to
//! open. The token travels in the URL's fragment, which a browser never sends to a server:
//! the page moves it into the tab's storage and sends it in a header.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::ctx::Ctx;

/// Where a head started with `--dashboard` serves it, unless told otherwise.
pub const DEFAULT_DASHBOARD: &str = "127.0.0.1:8265";

/// Options of `escher dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// The address the head serves its dashboard on (its --dashboard)
    #[arg(long, env = "ESCHER_DASHBOARD", value_name = "HOST:PORT", default_value = DEFAULT_DASHBOARD)]
    pub address: std::net::SocketAddr,

    /// Open this view first: overview, tasks, tasks/ID, reservations, gpus or heads
    #[arg(long, value_name = "VIEW")]
    pub view: Option<String>,
}

/// What `escher dashboard --json` prints.
#[derive(Debug, Serialize)]
struct DashboardJson {
    url: String,
    token_from: String,
}

impl DashboardArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let credentials = ctx.credentials()?;
        let Some(token) = credentials.secret() else {
            anyhow::bail!(
                "no token to sign in with ({}); pass --token, or create one with `escher token \
                 create --role reader` as an admin",
                credentials.source()
            );
        };
        let reachable = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(self.address),
        )
        .await;
        if !matches!(reachable, Ok(Ok(_))) {
            anyhow::bail!(
                "nothing answers at {}: start the head with --dashboard {} (or give this \
                 command the --address the head serves its dashboard on)",
                self.address,
                self.address
            );
        }
        let mut url = format!("http://{}/#token={token}", self.address);
        if let Some(view) = &self.view {
            url.push_str("&view=");
            url.push_str(view.trim_start_matches('#'));
        }
        if ctx.json {
            ctx.emit_json(&DashboardJson {
                url,
                token_from: credentials.source().to_string(),
            })?;
        } else {
            ctx.emit(&format!("{url}\n"))?;
            eprintln!(
                "open this address in a browser on this machine; it signs in with the token \
                 from {}",
                credentials.source()
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
