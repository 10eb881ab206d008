//! The machine's load while a workload ran: the 1-minute load average from `/proc/loadavg`,
//! read when the workload starts and when it ends, printed beside its figures, and a warning
//! when it is above the machine's core count.
//!
//! Wall-clock figures measure the machine as much as escher once other processes want more
//! CPUs than there are: on a shared 2-core machine at load 22–56, ratios and savings timed on
//! the wall clock moved far from what an idle machine gives (a static baseline slowed more
//! than the policy it was compared with). The load is recorded so that a reader can tell
//! such a figure from a measurement.

use serde::Serialize;

/// The 1-minute load average at a workload's start and end, and the cores it is read against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Load {
    /// The 1-minute load average when the workload started.
    pub start: f64,
    /// The 1-minute load average when it ended.
    pub end: f64,
    /// The machine's logical CPUs.
    pub cpus: usize,
}

impl Load {
    /// The higher of the two readings.
    pub fn peak(&self) -> f64 {
        self.start.max(self.end)
    }

    /// Whether the load was above the core count at either reading: more runnable processes
    /// than CPUs, so wall-clock figures include waiting for a CPU.
    pub fn overloaded(&self) -> bool {
        self.cpus > 0 && self.peak() > self.cpus as f64
    }

    /// The load as the figures table prints it: `0.42–1.10 / 2 cores`.
    pub fn cell(&self) -> String {
        format!("{:.2}–{:.2} / {} cores", self.start, self.end, self.cpus)
    }

    /// The warning printed and noted when [`overloaded`](Load::overloaded), else `None`.
    pub fn warning(&self) -> Option<String> {
        self.overloaded().then(|| {
            format!(
                "WARNING: load average {:.2} above the machine's {} cores while this workload ran \
                 (start {:.2}, end {:.2}): its wall-clock figures include waiting for a CPU and \
                 are not comparable with a run on an idle machine",
                self.peak(),
                self.cpus,
                self.start,
                self.end
            )
        })
    }
}

/// The 1-minute load average in the text of `/proc/loadavg` (`0.42 0.35 0.30 1/123 4567`).
pub fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x >= 0.0)
}

/// The 1-minute load average now; `None` where `/proc/loadavg` cannot be read (not Linux).
pub fn one_minute() -> Option<f64> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_field_of_proc_loadavg_is_the_one_minute_average() {
        assert_eq!(parse_loadavg("0.42 0.35 0.30 1/123 4567\n"), Some(0.42));
        assert_eq!(parse_loadavg("22.75 18.01 9.50 30/900 1"), Some(22.75));
        assert_eq!(parse_loadavg(""), None);
        assert_eq!(parse_loadavg("busy 1 2"), None);
        assert_eq!(parse_loadavg("-1 0 0"), None);
    }

    #[test]
    fn this_machine_reports_a_load() {
        // CI and the benchmark machines run Linux, where /proc/loadavg always exists.
        let load = one_minute().expect("/proc/loadavg is readable on Linux");
        assert!(load >= 0.0);
    }

    #[test]
    fn a_load_above_the_core_count_warns_and_one_at_or_below_does_not() {
        let calm = Load {
            start: 1.5,
            end: 2.0,
            cpus: 2,
        };
        assert!(!calm.overloaded());
        assert_eq!(calm.warning(), None);
        assert_eq!(calm.cell(), "1.50–2.00 / 2 cores");
        let loaded = Load {
            start: 1.0,
            end: 22.4,
            cpus: 2,
        };
        assert!(loaded.overloaded());
        let warning = loaded.warning().expect("a warning");
        assert!(
            warning.contains("22.40") && warning.contains("2 cores"),
            "{warning}"
        );
    }
}
