//! A linearizability check of one counter register, in the manner of Wing and Gong's search
//! with Lowe's memoization (the algorithm behind Porcupine and Knossos' `linear` checker).
//!
//! No maintained Rust crate does this for an arbitrary model (`stateright` is a model
//! checker of whole systems, not of a recorded history), and the model here is small: a
//! counter with `Set(v)`, `Add(d)` and `Read -> v`.
//!
//! The search linearizes operations one at a time: an operation may go next if no operation
//! still waiting completed before it was invoked. A state (which operations are linearized,
//! the counter's value) seen before is not searched again. Writes whose outcome is unknown
//! complete "never": they may take effect at any time after their invocation, or not at all,
//! so the history is linearizable when every operation with a known outcome is placed.
//! Failed writes did not happen and are left out; reads whose value is unknown say nothing.

use std::collections::HashSet;

use super::history::{CounterAction, CounterOp, Micros, Outcome};

/// One operation as the search sees it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    invoke: Micros,
    /// `Micros::MAX` when its outcome is unknown.
    complete: Micros,
    action: CounterAction,
    /// The value a read returned.
    read: i64,
    /// Its index in the caller's slice.
    index: usize,
}

/// Why a history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLinearizable {
    /// The most operations any order managed to place.
    pub placed: usize,
    /// Of how many that had to be.
    pub required: usize,
    /// The operations (indexes in the caller's slice) none of which could go next at the
    /// deepest point of the search, each with the value the counter had there.
    pub stuck_at: Vec<(usize, i64)>,
}

/// Checks that `ops` (all on one counter, starting at `initial`) are linearizable; on
/// failure says how far the best order got.
pub fn check_counter(ops: &[CounterOp], initial: i64) -> Result<(), NotLinearizable> {
    let mut entries: Vec<Entry> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        let (complete, read) = match (&op.outcome, op.action) {
            (Outcome::Fail(_), _) => continue,
            (Outcome::Unknown(_), CounterAction::Read) => continue,
            (Outcome::Unknown(_), _) => (Micros::MAX, 0),
            (Outcome::Ok(v), CounterAction::Read) => (op.complete, *v),
            (Outcome::Ok(_), _) => (op.complete, 0),
        };
        entries.push(Entry {
            invoke: op.invoke,
            complete,
            action: op.action,
            read,
            index,
        });
    }
    entries.sort_by_key(|e| (e.invoke, e.complete));
    let required = entries.iter().filter(|e| e.complete != Micros::MAX).count();
    search(&entries, initial, required)
}

/// One step of the search: the counter's value after `placed` known-outcome operations, how
/// far its scan of the candidates got, and the operation that led here.
#[derive(Debug)]
struct Frame {
    value: i64,
    placed: usize,
    horizon: Micros,
    scan: usize,
    via: Option<usize>,
    stuck: Vec<(usize, i64)>,
}

/// The search, with an explicit stack (a history has thousands of operations: recursion
/// would overflow the thread's stack).
fn search(entries: &[Entry], initial: i64, required: usize) -> Result<(), NotLinearizable> {
    let mut done = vec![false; entries.len()];
    let mut seen: HashSet<(Vec<u64>, i64)> = HashSet::new();
    let key = |done: &[bool]| {
        let mut words = vec![0u64; done.len().div_ceil(64)];
        for (i, d) in done.iter().enumerate() {
            if *d {
                words[i / 64] |= 1 << (i % 64);
            }
        }
        words
    };
    // The earliest completion among the operations not placed yet bounds which may go next.
    let horizon = |done: &[bool]| {
        entries
            .iter()
            .zip(done)
            .filter(|(_, d)| !**d)
            .map(|(e, _)| e.complete)
            .min()
            .unwrap_or(Micros::MAX)
    };
    let (mut best, mut best_stuck) = (0, Vec::new());
    seen.insert((key(&done), initial));
    let mut stack = vec![Frame {
        value: initial,
        placed: 0,
        horizon: horizon(&done),
        scan: 0,
        via: None,
        stuck: Vec::new(),
    }];
    while let Some(top) = stack.last_mut() {
        if top.placed == required {
            return Ok(());
        }
        let mut child = None;
        while top.scan < entries.len() {
            let i = top.scan;
            top.scan += 1;
            let e = entries[i];
            if done[i] {
                continue;
            }
            if e.invoke > top.horizon {
                top.scan = entries.len(); // sorted by invocation: no later one may go either
                break;
            }
            let next = match e.action {
                CounterAction::Set(v) => v,
                CounterAction::Add(d) => top.value + d,
                CounterAction::Read if e.read == top.value => top.value,
                CounterAction::Read => {
                    top.stuck.push((e.index, top.value));
                    continue;
                }
            };
            done[i] = true;
            if seen.insert((key(&done), next)) {
                let counted = usize::from(e.complete != Micros::MAX);
                child = Some(Frame {
                    value: next,
                    placed: top.placed + counted,
                    horizon: horizon(&done),
                    scan: 0,
                    via: Some(i),
                    stuck: Vec::new(),
                });
                break;
            }
            done[i] = false;
        }
        match child {
            Some(frame) => stack.push(frame),
            None => {
                let frame = stack.pop().expect("the top frame");
                if frame.placed >= best {
                    best = frame.placed;
                    best_stuck = frame.stuck;
                }
                if let Some(i) = frame.via {
                    done[i] = false;
                }
            }
        }
    }
    Err(NotLinearizable {
        placed: best,
        required,
        stuck_at: best_stuck,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(action: CounterAction, invoke: u64, complete: u64, outcome: Outcome<i64>) -> CounterOp {
        CounterOp {
            client: 0,
            counter: "c".into(),
            action,
            invoke,
            complete,
            outcome,
        }
    }

    use CounterAction::{Add, Read, Set};

    #[test]
    fn concurrent_adds_and_a_read_that_sees_either_order_are_linearizable() {
        let ops = [
            op(Set(1), 0, 5, Outcome::Ok(0)),
            op(Add(2), 10, 30, Outcome::Ok(0)),
            op(Add(3), 12, 28, Outcome::Ok(0)),
            op(Read, 15, 20, Outcome::Ok(4)), // after Add(3) only
            op(Read, 40, 45, Outcome::Ok(6)),
        ];
        assert_eq!(check_counter(&ops, 0), Ok(()));
    }

    #[test]
    fn a_lost_acknowledged_add_is_not_linearizable() {
        let ops = [
            op(Set(1), 0, 5, Outcome::Ok(0)),
            op(Add(2), 10, 20, Outcome::Ok(0)),
            op(Read, 30, 35, Outcome::Ok(1)),
        ];
        let err = check_counter(&ops, 0).unwrap_err();
        assert_eq!(err.required, 3);
        assert_eq!(err.placed, 2);
        assert_eq!(err.stuck_at, vec![(2, 3)]);
    }

    #[test]
    fn a_read_of_a_value_no_order_gives_is_not_linearizable() {
        // A read that sees the later write but then an earlier value (a stale read).
        let ops = [
            op(Add(1), 0, 5, Outcome::Ok(0)),
            op(Add(1), 10, 15, Outcome::Ok(0)),
            op(Read, 20, 25, Outcome::Ok(2)),
            op(Read, 30, 35, Outcome::Ok(1)),
        ];
        assert!(check_counter(&ops, 0).is_err());
    }

    #[test]
    fn an_unknown_write_may_have_happened_or_not_but_a_failed_one_did_not() {
        let unknown = |v| {
            [
                op(Add(5), 0, 5, Outcome::Unknown("timed out".into())),
                op(Read, 30, 35, Outcome::Ok(v)),
            ]
        };
        assert_eq!(check_counter(&unknown(0), 0), Ok(()));
        assert_eq!(check_counter(&unknown(5), 0), Ok(()));
        assert!(check_counter(&unknown(3), 0).is_err());
        let failed = [
            op(Add(5), 0, 5, Outcome::Fail("refused".into())),
            op(Read, 30, 35, Outcome::Ok(5)),
        ];
        assert!(check_counter(&failed, 0).is_err());
    }

    #[test]
    fn a_history_of_thousands_of_operations_does_not_overflow_the_stack() {
        // A soak run's counter sees thousands of operations; the search must not recurse.
        let mut ops = Vec::new();
        for i in 0..6000u64 {
            ops.push(op(Add(1), i * 10, i * 10 + 5, Outcome::Ok(0)));
        }
        ops.push(op(Read, 70_000, 70_005, Outcome::Ok(6000)));
        let run = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || check_counter(&ops, 0))
            .unwrap();
        assert_eq!(run.join().unwrap(), Ok(()));
    }

    #[test]
    fn many_concurrent_clients_are_searched_quickly() {
        // Four clients, 400 adds of 1 with overlapping windows, reads in between that see
        // exactly what completed before them: linearizable, and found without blowing up.
        let mut ops = Vec::new();
        let mut total = 0;
        for round in 0..100u64 {
            let base = round * 100;
            for c in 0..4u64 {
                ops.push(op(Add(1), base + c, base + 50 + c, Outcome::Ok(0)));
            }
            total += 4;
            ops.push(op(Read, base + 60, base + 70, Outcome::Ok(total)));
        }
        assert_eq!(check_counter(&ops, 0), Ok(()));
    }
}
