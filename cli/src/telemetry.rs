//! `escher report KEY=VALUE...` (inside a running task: samples of its progress) and
//! `escher telemetry TASK...` (what tasks reported).

use std::process::ExitCode;

use clap::Args;
use escher_proto::TaskId;
use escher_proto::types::TaskTelemetry;

use super::ctx::Ctx;
use super::render;

/// Options of `escher report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Samples as KEY=NUMBER (`mem_used_gb=3.2 iteration=40`); keys are letters, digits, '.',
    /// '_' and '-'
    #[arg(value_name = "KEY=NUMBER", required = true, value_parser = parse_sample)]
    pub samples: Vec<(String, f64)>,
}

fn parse_sample(text: &str) -> Result<(String, f64), String> {
    let (key, value) = super::parse_key_value(text)?;
    let value: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: the value {value:?} is not a number"))?;
    Ok((key, value))
}

impl ReportArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        if std::env::var_os("ESCHER_TASK_TOKEN").is_none() && ctx.token.is_none() {
            anyhow::bail!(
                "escher report is for running tasks: it reports as the task whose credential it \
                 carries (ESCHER_TASK_TOKEN, which the worker sets for every command task)"
            );
        }
        let client = ctx.client().await?;
        let samples: Vec<(&str, f64)> =
            self.samples.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let kept = client.report(&samples).await?;
        if ctx.json {
            ctx.emit_json(&serde_json::json!({ "kept": kept }))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Options of `escher telemetry`.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// The tasks
    #[arg(value_name = "TASK", required = true)]
    pub tasks: Vec<TaskId>,

    /// Only samples the head received after this time (milliseconds since the Unix epoch)
    #[arg(long, value_name = "MS")]
    pub after: Option<u64>,
}

impl TelemetryArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let reported = client
            .telemetry(self.tasks.iter().copied(), self.after)
            .await?;
        if ctx.json {
            ctx.emit_json(&reported)?;
        } else {
            ctx.emit(&render_telemetry(&self.tasks, &reported))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// One line per sample, `TASK ATTEMPT TIME KEY VALUE`; a line for a task that reported none.
pub fn render_telemetry(asked: &[TaskId], reported: &[TaskTelemetry]) -> String {
    let mut out = String::new();
    for task in asked {
        match reported.iter().find(|t| t.task == *task) {
            None => out.push_str(&format!("task {task}: no telemetry\n")),
            Some(t) => {
                for s in &t.samples {
                    out.push_str(&format!(
                        "task {task}  attempt {}  {}  {} = {}\n",
                        t.attempt,
                        render::time(s.at_ms),
                        s.key,
                        s.value
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_as_key_and_number() {
        assert_eq!(parse_sample("mem=3.5"), Ok(("mem".to_string(), 3.5)));
        assert!(
            parse_sample("mem=lots")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_sample("mem").is_err());
    }
}
