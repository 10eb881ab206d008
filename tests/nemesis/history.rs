//! The recorded history of a run: what the clients asked and were told, what the tasks did,
//! and what the head said about each task once everything healed.
//!
//! Times are microseconds since the Unix epoch on the one clock every namespace shares (they
//! are namespaces of one kernel), so the clients' invocation and completion times and the
//! tasks' own records compare directly.
//!
//! An operation's [`Outcome`] follows Jepsen's: `Ok` (the write happened, with its reply),
//! `Fail` (the client was told it did not happen) and `Unknown` (the client cannot tell: a
//! timeout of ours, or an error that says the outcome is unknown). A failed write that
//! happened anyway is an anomaly; an unknown one may or may not have happened.
//!
//! Executions come from the tasks: each process that runs an attempt of a command task appends
//! `start`, then a `beat` every 200 ms, then `end` lines
//! (`KIND TASK ATTEMPT NODE PID RUN EPOCH-SECONDS.MICROS`) to one log shared by every host,
//! each line one `O_APPEND` write. `PID` and `RUN` are the process's identity, written by the
//! process itself: its pid (`$$`) and a random id it draws from the kernel when it starts
//! (`/proc/sys/kernel/random/uuid`), so two runs of one attempt stay apart even on one node
//! with a reused pid. An attempt killed outright writes no `end`; its last `beat` bounds from
//! below how long it ran, so the intervals the checker compares are never longer than what
//! really ran.
//!
//! What the head believed comes from it: every task it has once the run healed, with each
//! attempt it sent (node, when, how it ended), and each node's capacity as the status reads
//! of the run saw it, over time.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Micros = u64;

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as Micros
}

/// What a client was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// It happened; the reply.
    Ok(T),
    /// The client was told it did not happen.
    Fail(String),
    /// The client cannot tell whether it happened.
    Unknown(String),
}

impl<T> Outcome<T> {
    /// Whether the operation was acknowledged.
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }
}

/// A submit of one task, under the client's key: the task's name, unique in the run, which
/// is how the checker finds a task whose submit was not acknowledged.
#[derive(Debug, Clone)]
pub struct Submit {
    /// The client that made it.
    pub client: u32,
    /// The key (task name) it carried.
    pub key: String,
    /// When it was called.
    pub invoke: Micros,
    /// When it returned.
    pub complete: Micros,
    /// The id the head gave, or the error.
    pub outcome: Outcome<u64>,
    /// What the task requires, per resource, in whole units.
    pub requires: BTreeMap<String, u64>,
}

/// What an operation on a counter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterAction {
    /// Set it to this value.
    Set(i64),
    /// Add this (an `adjust_resource` delta).
    Add(i64),
    /// Read it; the value is the outcome's.
    Read,
}

/// One operation on a counter (a resource's capacity on one node).
#[derive(Debug, Clone)]
pub struct CounterOp {
    /// The client that made it.
    pub client: u32,
    /// The counter (the resource's name).
    pub counter: String,
    /// What it did.
    pub action: CounterAction,
    /// When it was called.
    pub invoke: Micros,
    /// When it returned.
    pub complete: Micros,
    /// For a read, the value read (`0` when the resource was absent); nothing for a write.
    pub outcome: Outcome<i64>,
}

/// A finished task's status as a client read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRead {
    /// The task.
    pub task: u64,
    /// When it was read.
    pub at: Micros,
    /// Its state, as the head names it (`Succeeded`, `Failed`, ...).
    pub state: String,
    /// The attempt the status is of.
    pub attempt: u32,
    /// That attempt's node.
    pub node: Option<u64>,
    /// Its result (`Exited { code: 0 }`), as text.
    pub result: Option<String>,
}

/// What an execution line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExecKind {
    /// The attempt's process started.
    Start,
    /// It is still running.
    Beat,
    /// It finished its work and is about to exit 0.
    End,
}

/// Which process ran an attempt, as the process itself wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Process {
    /// Its pid, as it saw it (in its worker's PID namespace).
    pub pid: u32,
    /// The random id it drew when it started.
    pub run: u128,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first 8 hex digits tell the runs of one history apart.
        write!(f, "process {} (run {:08x})", self.pid, self.run >> 96)
    }
}

/// One line of the execution log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exec {
    /// What happened.
    pub kind: ExecKind,
    /// The task.
    pub task: u64,
    /// Its attempt.
    pub attempt: u32,
    /// The node the attempt ran on.
    pub node: u64,
    /// The process that wrote the line.
    pub process: Process,
    /// When.
    pub at: Micros,
}

/// Parses the execution log; a torn or foreign line is an error naming it.
pub fn parse_exec_log(text: &str) -> anyhow::Result<Vec<Exec>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || anyhow::anyhow!("execution log line {}: {line:?} is malformed", n + 1);
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [kind, task, attempt, node, pid, run, at] = parts[..] else {
            return Err(bad());
        };
        let kind = match kind {
            "start" => ExecKind::Start,
            "beat" => ExecKind::Beat,
            "end" => ExecKind::End,
            _ => return Err(bad()),
        };
        let (secs, micros) = at.split_once(['.', ',']).ok_or_else(bad)?;
        let secs: u64 = secs.parse().map_err(|_| bad())?;
        let micros: u64 = format!("{micros:0<6}")[..6].parse().map_err(|_| bad())?;
        out.push(Exec {
            kind,
            task: task.parse().map_err(|_| bad())?,
            attempt: attempt.parse().map_err(|_| bad())?,
            node: node.parse().map_err(|_| bad())?,
            process: Process {
                pid: pid.parse().map_err(|_| bad())?,
                run: u128::from_str_radix(&run.replace('-', ""), 16).map_err(|_| bad())?,
            },
            at: secs * 1_000_000 + micros,
        });
    }
    Ok(out)
}

/// The shell script of the command tasks: records its attempt as described in the module
/// documentation, works for `$WORK_MS` milliseconds, and exits 0.
pub const TASK_SCRIPT: &str = r#"
read -r run < /proc/sys/kernel/random/uuid
rec() { echo "$1 $ESCHER_TASK_ID $ESCHER_ATTEMPT $ESCHER_NODE_ID $$ $run $EPOCHREALTIME" >> "$NEMLOG"; }
rec start
left=$WORK_MS
while [ "$left" -gt 0 ]; do
  step=200; [ "$left" -lt 200 ] && step=$left
  sleep "$(printf '%d.%03d' $((step / 1000)) $((step % 1000)))"
  left=$((left - step))
  if [ "$left" -gt 0 ]; then rec beat; fi
done
rec end
"#;

/// A task as the head reports it once the nemeses healed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalTask {
    /// Its id.
    pub id: u64,
    /// Its name: the key of the submit that created it.
    pub key: String,
    /// Its state (`Succeeded`, `Failed`, `Pending`, `Running`, ...).
    pub state: String,
    /// Why it is pending, failed or was cancelled.
    pub reason: Option<String>,
    /// Its latest attempt, from 1 (0: it never started).
    pub attempt: u32,
    /// When the head recorded its final state, once it had.
    pub finished_at: Option<Micros>,
    /// The attempts the head sent, oldest first (the last 16 it keeps); `None` when retention
    /// dropped the task's record and only its final state is known.
    pub attempts: Option<Vec<HeadAttempt>>,
}

/// One attempt of a task as the head recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadAttempt {
    /// Its number, from 1.
    pub attempt: u32,
    /// The node the head sent it to.
    pub node: u64,
    /// When the head sent it (millisecond precision: the head's record is in milliseconds).
    pub sent_at: Micros,
    /// How it ended, in the head's words; `None` while it runs.
    pub ended: Option<String>,
}

impl FinalTask {
    /// The attempt the head recorded as its success, if it succeeded.
    pub fn winner(&self) -> Option<u32> {
        (self.state == "Succeeded").then_some(self.attempt)
    }

    /// The head's record of attempt `a`, if it keeps one.
    pub fn head_attempt(&self, a: u32) -> Option<&HeadAttempt> {
        self.attempts.as_ref()?.iter().find(|h| h.attempt == a)
    }

    /// Whether it reached an end (succeeded, failed, cancelled).
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "Succeeded" | "Failed" | "Cancelled")
    }
}

/// Everything the checker looks at.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every submit.
    pub submits: Vec<Submit>,
    /// Every operation on a counter.
    pub counters: Vec<CounterOp>,
    /// Every finished status a client read.
    pub reads: Vec<ResultRead>,
    /// The execution log.
    pub execs: Vec<Exec>,
    /// Every task the head knows once healed (read after the run), by id.
    pub tasks: BTreeMap<u64, FinalTask>,
    /// Every node's capacity as each status read of the run saw it.
    pub capacity: Vec<CapacitySample>,
}

/// One node's capacity as one status read saw it: in force at some instant between the read's
/// call and its return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacitySample {
    /// The node.
    pub node: u64,
    /// When the read was called.
    pub invoke: Micros,
    /// When it returned.
    pub complete: Micros,
    /// Its capacity per resource, in whole units (`u64::MAX`: unbounded).
    pub totals: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_execution_log_parses_and_refuses_a_torn_line() {
        let run = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let log = format!(
            "start 7 1 2 41 {run} 1700000000.123456\nbeat 7 1 2 41 {run} 1700000000.5\n\
             end 7 1 2 41 {run} 1700000001,000001\n"
        );
        let execs = parse_exec_log(&log).unwrap();
        assert_eq!(execs.len(), 3);
        assert_eq!(execs[0].process.pid, 41);
        assert_eq!(execs[0].process.run, 0x0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0);
        assert_eq!(execs[0].process.to_string(), "process 41 (run 0f1e2d3c)");
        assert_eq!(execs[0].at, 1_700_000_000_123_456);
        assert_eq!(execs[1].at, 1_700_000_000_500_000);
        assert_eq!(execs[2].kind, ExecKind::End);
        assert_eq!(execs[2].at, 1_700_000_001_000_001);
        let err = parse_exec_log(&format!("start 7 1 2 41 {run} 17000")).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(parse_exec_log(&format!("stop 7 1 2 41 {run} 1.0")).is_err());
        // A line without the process's identity (the log's old form) is refused.
        assert!(parse_exec_log("start 7 1 2 1700000000.123456").is_err());
        assert!(parse_exec_log("start 7 1 2 41 not-hex 1700000000.123456").is_err());
    }

    #[test]
    fn the_task_script_records_the_identity_of_its_own_process() {
        use ExecKind::{Beat, End, Start};
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("exec.log");
        let mut pids = Vec::new();
        for _ in 0..2 {
            let child = std::process::Command::new("bash")
                .args(["-c", TASK_SCRIPT])
                .env("NEMLOG", &log)
                .env("WORK_MS", "250")
                .env("ESCHER_TASK_ID", "7")
                .env("ESCHER_ATTEMPT", "1")
                .env("ESCHER_NODE_ID", "2")
                .spawn()
                .unwrap();
            pids.push(child.id());
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
        }
        let execs = parse_exec_log(&std::fs::read_to_string(&log).unwrap()).unwrap();
        let kinds: Vec<ExecKind> = execs.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [Start, Beat, End, Start, Beat, End]);
        // Each run's records carry its own pid and one run id, and the two runs' ids differ.
        for (run, pid) in execs.chunks(3).zip(&pids) {
            assert!(run.iter().all(|e| e.process == run[0].process), "{run:?}");
            assert_eq!(run[0].process.pid, *pid);
            assert_eq!((run[0].task, run[0].attempt, run[0].node), (7, 1, 2));
        }
        assert_ne!(execs[0].process.run, execs[3].process.run);
    }
}
