//! What a workload reports: figures (one table row each, with the peer's figure and the ratio
//! escher/peer when a peer ran), plots, notes; and the Markdown and JSON they are written as.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::load::Load;
use crate::stats::Summary;

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// More is better (throughput).
    Higher,
    /// Less is better (latency, cost, memory).
    Lower,
}

/// The same figure measured on a peer in the same run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerFigure {
    /// `ray` or `hyperqueue`.
    pub peer: String,
    /// The peer's value, in the figure's unit.
    pub value: f64,
    /// escher / peer.
    pub ratio: f64,
}

/// One measured figure: one row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    /// A stable key (`w1.throughput.100000`), used by the targets and by peers.
    pub id: String,
    /// What was measured, for people.
    pub metric: String,
    /// The unit of `escher`, `peer.value` and `thesis`.
    pub unit: String,
    /// escher's value.
    pub escher: f64,
    /// Which way is better.
    pub better: Better,
    /// The key of the same measurement in a peer's results (`ray:w1.10000`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_key: Option<String>,
    /// The peer's figure, when the peer ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerFigure>,
    /// The thesis' figure for the same measurement, in the same unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thesis: Option<f64>,
}

impl Figure {
    /// A figure with no peer and no reference.
    pub fn new(id: impl Into<String>, metric: impl Into<String>, unit: &str, escher: f64) -> Self {
        let unit = unit.to_string();
        let better = match unit.as_str() {
            "tasks/s" | "gangs/s" | "resources/s" | "decisions/s" | "MiB/s" | "× in-memory" => {
                Better::Higher
            }
            _ => Better::Lower,
        };
        Figure {
            id: id.into(),
            metric: metric.into(),
            unit,
            escher,
            better,
            peer_key: None,
            peer: None,
            thesis: None,
        }
    }

    /// Compares with `peer`'s result under `key` when peers run.
    pub fn vs(mut self, peer: &str, key: &str) -> Self {
        self.peer_key = Some(format!("{peer}:{key}"));
        self
    }

    /// The thesis' figure for the same measurement.
    pub fn thesis(mut self, value: f64) -> Self {
        self.thesis = Some(value);
        self
    }
}

/// A line of a plot: (x, y) points.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    /// The legend entry.
    pub name: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// What a plot shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlotData {
    /// Lines over a numeric x axis.
    Lines {
        /// The lines.
        lines: Vec<Line>,
        /// Whether the x axis is logarithmic.
        x_log: bool,
    },
    /// A latency distribution per category (Fig. 4.8): min, p50, p95, max.
    Distributions {
        /// Category name and its distribution, in milliseconds.
        categories: Vec<(String, Summary)>,
    },
}

/// A PNG the run draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plot {
    /// The file name under the output folder.
    pub file: String,
    /// The title (names the thesis figure it mirrors).
    pub title: String,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// What to draw.
    pub data: PlotData,
}

/// Everything one workload measured.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    /// `w1` ... `w8`, or `cmd`.
    pub id: String,
    /// What it measures.
    pub title: String,
    /// The size it ran at.
    pub size: String,
    /// Its parameters and how nodes were emulated.
    pub setup: serde_json::Value,
    /// The table rows.
    pub figures: Vec<Figure>,
    /// The plots it contributes.
    pub plots: Vec<Plot>,
    /// Anything a reader must know (what was skipped and why).
    pub notes: Vec<String>,
    /// Raw measurements (distributions), for whoever wants more than the table.
    pub detail: serde_json::Value,
    /// Wall-clock seconds the workload took.
    pub elapsed_s: f64,
    /// The machine's load average while it ran (none where it cannot be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<Load>,
}

impl WorkloadReport {
    /// An empty report for workload `id`.
    pub fn new(id: &str, title: &str, size: &str) -> Self {
        WorkloadReport {
            id: id.to_string(),
            title: title.to_string(),
            size: size.to_string(),
            setup: serde_json::Value::Null,
            figures: Vec::new(),
            plots: Vec::new(),
            notes: Vec::new(),
            detail: serde_json::Value::Null,
            elapsed_s: 0.0,
            load: None,
        }
    }

    /// Writes `<out>/<id>.json`.
    pub fn write_json(&self, out: &Path) -> anyhow::Result<()> {
        let path = out.join(format!("{}.json", self.id));
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// One target of docs/DESIGN.md §8, checked against a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetCheck {
    /// The target, as docs/DESIGN.md §8 states it.
    pub target: String,
    /// What was measured, in words and numbers.
    pub measured: String,
    /// Met, missed, or not measured in this run (`None`).
    pub met: Option<bool>,
}

/// A number for a table: 3 significant digits, thousands separated.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if a >= 1000.0 {
        let mut digits = format!("{:.0}", a);
        let mut out = String::new();
        while digits.len() > 3 {
            let tail = digits.split_off(digits.len() - 3);
            out = format!(",{tail}{out}");
        }
        format!("{}{digits}{out}", if x < 0.0 { "-" } else { "" })
    } else if a >= 100.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else if a == 0.0 {
        "0".to_string()
    } else {
        format!("{x:.3}")
    }
}

/// A ratio for a table: `57.3×`, `0.0412×`.
pub fn ratio(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}×")
    } else if x >= 0.1 {
        format!("{x:.2}×")
    } else {
        format!("{x:.4}×")
    }
}

/// The figures of every workload as one Markdown table, each beside the machine's 1-minute
/// load average at its workload's start and end (flagged `(!)` above the core count).
pub fn figures_table(reports: &[WorkloadReport]) -> String {
    let mut s = String::new();
    s.push_str(
        "| workload | metric | escher | unit | peer | peer value | escher/peer | thesis | load (1 min) |\n",
    );
    s.push_str("|---|---|---:|---|---|---:|---:|---:|---|\n");
    for r in reports {
        for f in &r.figures {
            let (peer, value, ratio_text) = match &f.peer {
                Some(p) => (p.peer.clone(), num(p.value), ratio(p.ratio)),
                None => match &f.peer_key {
                    Some(key) => (
                        key.split(':').next().unwrap_or("").to_string(),
                        "—".into(),
                        "—".into(),
                    ),
                    None => (String::new(), String::new(), String::new()),
                },
            };
            let thesis = f.thesis.map(num).unwrap_or_default();
            let load = r.load.map_or_else(String::new, |l| {
                if l.overloaded() {
                    format!("{} (!)", l.cell())
                } else {
                    l.cell()
                }
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.id.to_uppercase(),
                f.metric,
                num(f.escher),
                f.unit,
                peer,
                value,
                ratio_text,
                thesis,
                load
            );
        }
    }
    s
}

/// The targets as a Markdown table.
pub fn targets_table(targets: &[TargetCheck]) -> String {
    let mut s = String::new();
    s.push_str("| docs/DESIGN.md §8 target | measured | result |\n|---|---|---|\n");
    for t in targets {
        let result = match t.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "not measured",
        };
        let _ = writeln!(s, "| {} | {} | {} |", t.target, t.measured, result);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(1_234_567.8), "1,234,568");
        assert_eq!(num(-4_000.0), "-4,000");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(10.0), "10");
        assert_eq!(ratio(57.31), "57.3×");
        assert_eq!(ratio(0.5), "0.50×");
        assert_eq!(ratio(0.0412), "0.0412×");
    }

    #[test]
    fn figures_know_which_way_is_better() {
        assert_eq!(Figure::new("a", "a", "tasks/s", 1.0).better, Better::Higher);
        assert_eq!(Figure::new("a", "a", "ms", 1.0).better, Better::Lower);
        let f = Figure::new("a", "a", "ms", 1.0)
            .vs("ray", "w2.p50")
            .thesis(1.1);
        assert_eq!(f.peer_key.as_deref(), Some("ray:w2.p50"));
        assert_eq!(f.thesis, Some(1.1));
    }
}
