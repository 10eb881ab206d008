//! `escher-bench compare OLD NEW`: two runs' figures side by side, as ratios, each marked
//! better or worse by the figure's own direction. A regression guard that is not a timed
//! test: run `escher-bench all --size tiny --out before/` before a change and `--out after/`
//! after it, then `escher-bench compare before after`.
//!
//! Figures are matched by their stable id (`w1.throughput.100000`); a figure in only one run
//! is listed apart. A ratio within the threshold (10% by default) is "same": one run on a
//! 2-core machine moves that much by itself (docs/benchmarks-history.md, "Run to run").

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// The arguments of `escher-bench compare`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "escher-bench compare",
    about = "Compares two runs' figures: each as new/old, marked better or worse"
)]
pub struct CompareArgs {
    /// The earlier run: its `summary.json`, or the folder holding it.
    pub old: PathBuf,
    /// The later run.
    pub new: PathBuf,
    /// How far a ratio may move from 1 and still count as the same (0.1 = 10%).
    #[arg(long, default_value_t = 0.1)]
    pub threshold: f64,
    /// Exit with status 1 when a figure got worse by more than the threshold.
    #[arg(long)]
    pub fail_on_worse: bool,
}

/// How a figure moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the threshold.
    Same,
    /// Moved the way the figure calls better.
    Better,
    /// Moved the other way.
    Worse,
    /// No direction can be told (a zero, or a figure without one).
    Unknown,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Better => "better",
            Verdict::Worse => "WORSE",
            Verdict::Unknown => "?",
        }
    }
}

/// One figure in both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its id.
    pub id: String,
    /// What it measures.
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// The old value.
    pub old: f64,
    /// The new value.
    pub new: f64,
    /// new / old.
    pub ratio: f64,
    /// Which way it moved.
    pub verdict: Verdict,
}

/// Two runs compared.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Comparison {
    /// Figures in both, in the new run's order.
    pub rows: Vec<Row>,
    /// Ids only in the old run.
    pub only_old: Vec<String>,
    /// Ids only in the new run.
    pub only_new: Vec<String>,
}

impl Comparison {
    /// The rows that got worse.
    pub fn worse(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.verdict == Verdict::Worse)
    }
}

/// Reads a run: a `summary.json`, or a folder with one.
pub fn read_run(path: &Path) -> anyhow::Result<Value> {
    let file = if path.is_dir() {
        path.join("summary.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "cannot read {} (give a run's summary.json or the folder escher-bench wrote it to)",
            file.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))
}

/// One figure of a run.
struct Fig {
    id: String,
    metric: String,
    unit: String,
    value: f64,
    /// Whether higher is better; `None` when the figure does not say.
    higher: Option<bool>,
}

/// Every figure of a run.
fn figures(run: &Value) -> anyhow::Result<Vec<Fig>> {
    let workloads = run["workloads"]
        .as_array()
        .context("not an escher-bench summary: it has no `workloads` list")?;
    let mut out = Vec::new();
    for w in workloads {
        for f in w["figures"].as_array().into_iter().flatten() {
            let (Some(id), Some(value)) = (f["id"].as_str(), f["escher"].as_f64()) else {
                continue;
            };
            let better = match f["better"].as_str() {
                Some("higher") => Some(true),
                Some("lower") => Some(false),
                _ => None,
            };
            out.push(Fig {
                id: id.to_string(),
                metric: f["metric"].as_str().unwrap_or_default().to_string(),
                unit: f["unit"].as_str().unwrap_or_default().to_string(),
                value,
                higher: better,
            });
        }
    }
    Ok(out)
}

/// Compares two runs' figures.
pub fn compare(old: &Value, new: &Value, threshold: f64) -> anyhow::Result<Comparison> {
    let old = figures(old)?;
    let new = figures(new)?;
    let mut c = Comparison::default();
    for Fig {
        id,
        metric,
        unit,
        value,
        higher,
    } in &new
    {
        let Some(before) = old.iter().find(|o| o.id == *id).map(|o| &o.value) else {
            c.only_new.push(id.clone());
            continue;
        };
        let ratio = if *before == 0.0 && *value == 0.0 {
            1.0
        } else {
            value / before
        };
        let verdict = if !ratio.is_finite() {
            Verdict::Unknown
        } else if (ratio - 1.0).abs() <= threshold {
            Verdict::Same
        } else {
            match higher {
                Some(true) if ratio > 1.0 => Verdict::Better,
                Some(false) if ratio < 1.0 => Verdict::Better,
                Some(_) => Verdict::Worse,
                None => Verdict::Unknown,
            }
        };
        c.rows.push(Row {
            id: id.clone(),
            metric: metric.clone(),
            unit: unit.clone(),
            old: *before,
            new: *value,
            ratio,
            verdict,
        });
    }
    c.only_old = old
        .iter()
        .filter(|o| !new.iter().any(|n| n.id == o.id))
        .map(|o| o.id.clone())
        .collect();
    Ok(c)
}

/// The comparison as a Markdown table, worst first, then a line per unmatched figure.
pub fn markdown(c: &Comparison, threshold: f64) -> String {
    use crate::report::{num, ratio};
    let mut rows: Vec<&Row> = c.rows.iter().collect();
    let rank = |r: &Row| match r.verdict {
        Verdict::Worse => 0,
        Verdict::Better => 1,
        Verdict::Unknown => 2,
        Verdict::Same => 3,
    };
    rows.sort_by_key(|r| rank(r));
    let mut out = format!(
        "| figure | metric | old | new | unit | new/old | (±{:.0}% is the same) |\n|---|---|---|---|---|---|---|\n",
        threshold * 100.0
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.metric,
            num(r.old),
            num(r.new),
            r.unit,
            if r.ratio.is_finite() {
                ratio(r.ratio)
            } else {
                "-".to_string()
            },
            r.verdict.as_str()
        ));
    }
    let worse = c.worse().count();
    let better = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Better)
        .count();
    out.push_str(&format!(
        "\n{} figures compared: {worse} worse, {better} better, the rest within ±{:.0}%.\n",
        c.rows.len(),
        threshold * 100.0
    ));
    if !c.only_old.is_empty() {
        out.push_str(&format!("Only in the old run: {}\n", c.only_old.join(", ")));
    }
    if !c.only_new.is_empty() {
        out.push_str(&format!("Only in the new run: {}\n", c.only_new.join(", ")));
    }
    out
}

/// Runs `escher-bench compare`; whether a figure got worse past the threshold.
pub fn run(args: &CompareArgs) -> anyhow::Result<bool> {
    let old = read_run(&args.old)?;
    let new = read_run(&args.new)?;
    let c = compare(&old, &new, args.threshold)?;
    print!("{}", markdown(&c, args.threshold));
    Ok(c.worse().next().is_some())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(figures: Value) -> Value {
        json!({ "workloads": [ { "id": "w1", "figures": figures } ] })
    }

    fn fig(id: &str, value: f64, better: &str) -> Value {
        json!({ "id": id, "metric": id, "unit": "x", "escher": value, "better": better })
    }

    #[test]
    fn marks_each_figure_by_its_direction() {
        let old = run(json!([
            fig("tput", 100.0, "higher"),
            fig("lat", 10.0, "lower"),
            fig("flat", 10.0, "lower"),
            fig("gone", 1.0, "lower"),
        ]));
        let new = run(json!([
            fig("tput", 80.0, "higher"),
            fig("lat", 5.0, "lower"),
            fig("flat", 10.5, "lower"),
            fig("fresh", 1.0, "lower"),
        ]));
        let c = compare(&old, &new, 0.1).unwrap();
        let verdict = |id: &str| c.rows.iter().find(|r| r.id == id).unwrap().verdict;
        assert_eq!(verdict("tput"), Verdict::Worse);
        assert_eq!(verdict("lat"), Verdict::Better);
        assert_eq!(verdict("flat"), Verdict::Same);
        assert_eq!(c.only_old, ["gone"]);
        assert_eq!(c.only_new, ["fresh"]);
        let text = markdown(&c, 0.1);
        assert!(text.starts_with("| figure"), "{text}");
        // Worst first.
        assert!(
            text.find("| tput").unwrap() < text.find("| lat").unwrap(),
            "{text}"
        );
        assert!(
            text.contains("3 figures compared: 1 worse, 1 better"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_summary_is_refused_with_a_reason() {
        let err = compare(&json!({"x": 1}), &run(json!([])), 0.1).unwrap_err();
        assert!(
            err.to_string().contains("not an escher-bench summary"),
            "{err}"
        );
    }
}
