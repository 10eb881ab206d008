//! Hand-made histories for the checker's tests: [`clean`], one task submitted, sent once, run
//! once to its end and read as that attempt, which every rule passes; and builders of the parts
//! each test changes to break one rule.

use super::{Anomaly, Rule};
use crate::nemesis::history::{
    CapacitySample, Exec, ExecKind, FinalTask, HeadAttempt, History, Outcome, Process, ResultRead,
    Submit,
};

/// A submit of `key` requiring one cpu.
pub fn submit(key: &str, outcome: Outcome<u64>) -> Submit {
    Submit {
        client: 1,
        key: key.into(),
        invoke: 10,
        complete: 20,
        outcome,
        requires: [("cpu".to_string(), 1)].into(),
    }
}

/// Task `id` as the head reports it: its first attempt sent to node 1 at 50 and, once in an
/// end state, that state recorded at 550.
pub fn task(id: u64, key: &str, state: &str) -> FinalTask {
    let ended = matches!(state, "Succeeded" | "Failed" | "Cancelled");
    FinalTask {
        id,
        key: key.into(),
        state: state.into(),
        reason: None,
        attempt: 1,
        finished_at: ended.then_some(550),
        attempts: Some(vec![sent(1, 1, 50, None)]),
    }
}

/// An attempt the head sent.
pub fn sent(attempt: u32, node: u64, at: u64, ended: Option<&str>) -> HeadAttempt {
    HeadAttempt {
        attempt,
        node,
        sent_at: at,
        ended: ended.map(str::to_string),
    }
}

/// The process that runs `attempt` of `task` on `node` unless a test says otherwise: one per
/// (task, attempt, node), so that records built with [`exec`] form one execution each.
pub fn process_of(task: u64, attempt: u32, node: u64) -> Process {
    let pid = (task * 100 + u64::from(attempt) * 10 + node) as u32;
    Process {
        pid,
        run: (u128::from(pid) << 96) | 0xabc,
    }
}

/// A record of `attempt` of `task` on `node` by its usual process ([`process_of`]).
pub fn exec(kind: ExecKind, task: u64, attempt: u32, node: u64, at: u64) -> Exec {
    exec_by(
        process_of(task, attempt, node),
        kind,
        task,
        attempt,
        node,
        at,
    )
}

/// A record written by `process`.
pub fn exec_by(
    process: Process,
    kind: ExecKind,
    task: u64,
    attempt: u32,
    node: u64,
    at: u64,
) -> Exec {
    Exec {
        kind,
        task,
        attempt,
        node,
        process,
        at,
    }
}

/// A status read, called at `invoke` and returned at `complete`, that saw `node` with `cpu`
/// cpus.
pub fn sample(node: u64, invoke: u64, complete: u64, cpu: u64) -> CapacitySample {
    CapacitySample {
        node,
        invoke,
        complete,
        totals: [("cpu".to_string(), cpu)].into(),
    }
}

/// The rules of what was found, in order.
pub fn rules(found: &[Anomaly]) -> Vec<Rule> {
    found.iter().map(|a| a.rule).collect()
}

/// One task submitted, sent to node 1 at 50, run once there (100..500) to its end, recorded
/// as succeeded at 550 and read so at 600; node 1 has one cpu throughout.
pub fn clean() -> History {
    let mut h = History::default();
    h.submits.push(submit("nem-1-1", Outcome::Ok(1)));
    h.tasks.insert(1, task(1, "nem-1-1", "Succeeded"));
    h.execs = vec![
        exec(ExecKind::Start, 1, 1, 1, 100),
        exec(ExecKind::Beat, 1, 1, 1, 300),
        exec(ExecKind::End, 1, 1, 1, 500),
    ];
    h.reads.push(ResultRead {
        task: 1,
        at: 600,
        state: "Succeeded".into(),
        attempt: 1,
        node: Some(1),
        result: Some("Exited { code: 0 }".into()),
    });
    h.capacity = vec![sample(1, 0, 10, 1), sample(1, 700, 710, 1)];
    h
}
