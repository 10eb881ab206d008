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

    /// Open this view first: overview, tasks, tasks/ID, reservations, gpus, heads, logs or
    /// logs/NODE
    #[arg(long, value_name = "VIEW")]
    pub view: Option<String>,
}

/// Asks the dashboard at `address` to prove that its head knows `token` (HMAC over a fresh
/// nonce, keyed with the token's hash: see `escher_proto::access::dashboard_proof`) before
/// an address carrying the token is printed: a page served there by someone else (another
/// cluster's dashboard, any program on that port) would receive the token.
async fn proves_it_knows(address: std::net::SocketAddr, token: &str) -> anyhow::Result<()> {
    let hash = escher_proto::access::token_hash(token);
    let id = hash[..12].to_string();
    let nonce: String = (0..32)
        .map(|_| char::from_digit(fastrand::u32(..16), 16).expect("a hex digit"))
        .collect();
    let expected = escher_proto::access::dashboard_proof(&hash, &nonce);
    let url = format!("http://{address}/api/prove?token={id}&nonce={nonce}");
    let answer = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent.get(&url).call().map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_string()
            .map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("it answered {status}: {}", body.trim()));
        }
        let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(json["proof"].as_str().unwrap_or_default().to_string())
    })
    .await?;
    match answer {
        Ok(proof) if proof == expected => Ok(()),
        other => {
            let why = match other {
                Err(why) => why,
                Ok(_) => "its proof does not match".to_string(),
            };
            anyhow::bail!(
                "the dashboard at {address} could not prove that it belongs to the cluster this \
                 token is for ({why}): it may be another cluster's, or another program on that \
                 port; no address with your token is printed. Give --address the address your \
                 head serves its dashboard on (its --dashboard)"
            )
        }
    }
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
}

impl DashboardArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        if let Some(view) = &self.view {
            check_view(view.trim_start_matches('#'))?;
        }
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
        .await
        .map(|connected| connected.map(drop));
        // Only whether something answers: the connection itself is not used.
        if !matches!(reachable, Ok(Ok(_))) {
            anyhow::bail!(
                "the head serves no dashboard at {addr} (nothing answers there): a head serves \
                 one only when started with `escher-head --dashboard {addr}` (or another \
                 HOST:PORT); if yours serves it elsewhere, give this command that address \
                 with --address or ESCHER_DASHBOARD",
                addr = self.address,
            );
        }
        proves_it_knows(self.address, &token).await?;
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
