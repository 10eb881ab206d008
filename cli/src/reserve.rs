//! `escher reserve`: reserves bundles of resources all or nothing (head-native gang
//! scheduling) and prints the holder tasks and the resources the gang's tasks request.
//!
//! Releasing is cancelling the holders: `escher cancel ID...` (the ids `reserve` prints).
//! With `--wait` it returns once every bundle is held, and exits non-zero if `--timeout`
//! passed first (the head then cancels the reservation itself).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use escher_proto::types::GangStrategy;
use escher_proto::{ResourceName, ResourceSet, TaskId};
use serde::Serialize;

use super::ctx::Ctx;
use super::render::{ids, key_values};
use super::values::parse_duration;
use escher_client::Reservation;

/// Options of `escher reserve`.
#[derive(Debug, Clone, Args)]
pub struct ReserveArgs {
    /// The reservation's name; its tasks request NAME.RES (any bundle) or NAME-I.RES (bundle I)
    #[arg(value_name = "NAME")]
    pub name: ResourceName,

    /// What one bundle holds, e.g. cpu=2 (repeat the flag once per bundle)
    #[arg(
        long = "bundle",
        short = 'b',
        value_name = "RESOURCES",
        required = true
    )]
    pub bundles: Vec<ResourceSet>,

    /// How bundles may share nodes: pack, spread, strict-pack or strict-spread
    #[arg(long, value_name = "STRATEGY", default_value = "pack")]
    pub strategy: GangStrategy,

    /// Cancel the whole reservation if it is not placed within this long (seconds, or
    /// 500ms / 5m); default: wait until it is
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Return only once every bundle is held
    #[arg(long)]
    pub wait: bool,
}

/// What `escher reserve --json` prints.
#[derive(Debug, Serialize)]
struct ReserveJson {
    name: ResourceName,
    task_ids: Vec<TaskId>,
    placed: bool,
    resources: Vec<ResourceName>,
}

impl ReserveArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let reservation = client
            .reserve(
                self.name.clone(),
                self.bundles.clone(),
                self.strategy,
                self.timeout,
            )
            .await?;
        let mut placed = reservation.placed();
        if self.wait && !placed {
            let label = format!("reservation {}:", reservation.name());
            let ready = reservation.ready(&client, self.timeout);
            super::wait::holding_with_progress(&client, &label, reservation.tasks(), ready).await?;
            placed = true;
        }
        if ctx.json {
            ctx.emit_json(&ReserveJson {
                name: reservation.name().clone(),
                task_ids: reservation.tasks().to_vec(),
                placed,
                resources: reservation.resources(),
            })?;
        } else {
            ctx.emit(&render_reservation(&reservation, placed))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of `escher reserve`.
pub fn render_reservation(r: &Reservation, placed: bool) -> String {
    let names: Vec<String> = r.resources().iter().map(ToString::to_string).collect();
    let rows = [
        ("reservation", r.name().to_string()),
        (
            "placed",
            if placed { "yes" } else { "not yet (pending)" }.to_string(),
        ),
        ("holders", ids(r.tasks())),
        ("resources", names.join(" ")),
        ("release", format!("escher cancel {}", ids(r.tasks()))),
    ];
    key_values(&rows)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(args: &[&str]) -> Result<ReserveArgs, clap::Error> {
        let cli = Cli::try_parse_from(["escher", "reserve"].iter().chain(args))?;
        match cli.command {
            Command::Reserve(a) => Ok(a),
            other => panic!("not reserve: {other:?}"),
        }
    }

    #[test]
    fn options_are_parsed_into_domain_values() {
        let a = parse(&[
            "train",
            "--bundle",
            "cpu=2",
            "-b",
            "cpu=2,gpu=1",
            "--strategy",
            "strict-spread",
            "--timeout",
            "1.5",
            "--wait",
        ])
        .unwrap();
        assert_eq!(a.name.as_str(), "train");
        assert_eq!(a.bundles.len(), 2);
        assert_eq!(a.bundles[1].to_string(), "cpu=2,gpu=1");
        assert_eq!(a.strategy, GangStrategy::StrictSpread);
        assert_eq!(a.timeout, Some(Duration::from_millis(1500)));
        assert!(a.wait);
        let a = parse(&["g", "-b", "cpu=1"]).unwrap();
        assert_eq!(
            (a.strategy, a.timeout, a.wait),
            (GangStrategy::Pack, None, false)
        );
        assert!(parse(&["g"]).is_err(), "a bundle is required");
        let e = parse(&["g", "-b", "cpu=1", "--strategy", "diagonal"]).unwrap_err();
        assert!(e.to_string().contains("strict-spread"), "{e}");
        assert!(parse(&["b@d", "-b", "cpu=1"]).is_err());
    }
}
