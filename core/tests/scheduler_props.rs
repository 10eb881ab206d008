//! Property tests of the scheduler core over random sequences of every event.
//!
//! After every step: the full invariant check (which includes liveness: no pending task fits a
//! live node), refused events leave the core unchanged, and decisions are consistent with what
//! the harness knows (only pending tasks are dispatched, only running tasks are lost). Running
//! the same sequence twice gives the same decisions.

use std::collections::{BTreeMap, BTreeSet};

use escher_core::scheduler::{Decision, Event, GANG_PATIENCE, Scheduler};
use escher_proto::types::{
    Amount, Capacity, CapacityOp, Delta, Labels, NodeId, NodeSpec, ResourceName, ResourceSet,
    TaskId,
};
use proptest::prelude::*;

const NAMES: [&str; 5] = ["cpu", "gpu", "a", "b", "q"];

/// One step, in terms the harness turns into an event against its current state.
#[derive(Debug, Clone)]
enum Step {
    AddNode {
        node: u8,
        caps: Vec<(u8, u8)>,
    },
    RemoveNode {
        node: u8,
    },
    Set {
        node: u8,
        res: u8,
        cap: Option<u8>,
    },
    Adjust {
        node: u8,
        res: u8,
        delta: i8,
    },
    Delete {
        node: u8,
        res: u8,
    },
    SetMatch {
        res: u8,
        cap: u8,
        want: Vec<(u8, u8)>,
        num: Option<u8>,
    },
    Gang {
        bundles: Vec<Vec<(u8, u8)>>,
        strategy: u8,
        deadline: Option<u8>,
    },
    Submit {
        req: Vec<(u8, u8)>,
        deadline: Option<u8>,
    },
    Finish {
        pick: u8,
    },
    Cancel {
        pick: u8,
    },
    Tick {
        advance: u8,
    },
    Patience,
}

fn amount(halves: u8) -> Amount {
    Amount::from_raw(u64::from(halves) * 5_000).unwrap()
}

fn name(i: u8) -> ResourceName {
    ResourceName::new(NAMES[i as usize % NAMES.len()]).unwrap()
}

fn set_of(pairs: &[(u8, u8)]) -> ResourceSet {
    let mut set = ResourceSet::new();
    for (r, halves) in pairs {
        set.insert(name(*r), amount(*halves));
    }
    set
}

fn step() -> impl Strategy<Value = Step> {
    let pairs = |max| prop::collection::vec((0u8..5, 0u8..max), 0..3);
    prop_oneof![
        3 => (0u8..5, pairs(9)).prop_map(|(node, caps)| Step::AddNode { node, caps }),
        1 => (0u8..5).prop_map(|node| Step::RemoveNode { node }),
        2 => (0u8..5, 0u8..5, prop::option::weighted(0.8, 0u8..6))
            .prop_map(|(node, res, cap)| Step::Set { node, res, cap }),
        2 => (0u8..5, 0u8..5, -4i8..5).prop_map(|(node, res, delta)| Step::Adjust { node, res, delta }),
        1 => (0u8..5, 0u8..5).prop_map(|(node, res)| Step::Delete { node, res }),
        1 => (0u8..5, 0u8..4, pairs(3), prop::option::of(0u8..3))
            .prop_map(|(res, cap, want, num)| Step::SetMatch { res, cap, want, num }),
        6 => (pairs(5), prop::option::weighted(0.2, 0u8..50))
            .prop_map(|(req, deadline)| Step::Submit { req, deadline }),
        2 => (prop::collection::vec(pairs(5), 1..4), 0u8..4, prop::option::weighted(0.2, 0u8..50))
            .prop_map(|(bundles, strategy, deadline)| Step::Gang { bundles, strategy, deadline }),
        4 => any::<u8>().prop_map(|pick| Step::Finish { pick }),
        1 => any::<u8>().prop_map(|pick| Step::Cancel { pick }),
        1 => (0u8..30).prop_map(|advance| Step::Tick { advance }),
        // Now and then a jump past a gang's patience, so that holds are taken and released.
        1 => Just(Step::Patience),
    ]
}

/// Drives a core through steps, checking everything after each, and returns all decisions.
fn run(steps: &[Step]) -> Result<Vec<Decision>, TestCaseError> {
    let mut core = Scheduler::new();
    let mut now = 0u64;
    let mut next_task = 0u64;
    let mut pending = BTreeSet::new();
    let mut running: BTreeMap<TaskId, NodeId> = BTreeMap::new();
    // Pending gang members by gang (first member's id).
    let mut gangs: BTreeMap<TaskId, BTreeSet<TaskId>> = BTreeMap::new();
    let mut all = Vec::new();
    for step in steps {
        let pick = |set: Vec<TaskId>, p: u8| (!set.is_empty()).then(|| set[p as usize % set.len()]);
        let event = match step.clone() {
            Step::AddNode { node, caps } => Event::NodeAdded {
                node: NodeId(node.into()),
                resources: caps
                    .iter()
                    .map(|(r, h)| (name(*r), Capacity::Finite(amount(*h))))
                    .collect(),
                labels: Labels::new(),
            },
            Step::RemoveNode { node } => Event::NodeRemoved {
                node: NodeId(node.into()),
            },
            Step::Set { node, res, cap } => Event::ResourceChanged {
                target: NodeSpec::Node(NodeId(node.into())),
                name: name(res),
                op: CapacityOp::Set(
                    cap.map_or(Capacity::Unbounded, |h| Capacity::Finite(amount(h))),
                ),
            },
            Step::Adjust { node, res, delta } => Event::ResourceChanged {
                target: NodeSpec::Node(NodeId(node.into())),
                name: name(res),
                op: CapacityOp::Adjust(Delta::try_from(i64::from(delta) * 5_000).unwrap()),
            },
            Step::Delete { node, res } => Event::ResourceChanged {
                target: NodeSpec::Node(NodeId(node.into())),
                name: name(res),
                op: CapacityOp::Delete,
            },
            Step::SetMatch {
                res,
                cap,
                want,
                num,
            } => Event::ResourceChanged {
                target: NodeSpec::Match {
                    resources: set_of(&want),
                    num_nodes: num.map(u32::from),
                },
                name: name(res),
                op: CapacityOp::Set(Capacity::Finite(amount(cap))),
            },
            Step::Submit { req, deadline } => {
                next_task += 1;
                Event::TaskSubmitted {
                    task: TaskId(next_task),
                    resources: set_of(&req),
                    deadline: deadline.map(|d| now + u64::from(d)),
                    time_limit: None,
                }
            }
            Step::Gang {
                bundles,
                strategy,
                deadline,
            } => {
                let strategy =
                    ["pack", "spread", "strict-pack", "strict-spread"][strategy as usize % 4];
                let tasks = bundles
                    .iter()
                    .map(|b| {
                        next_task += 1;
                        (TaskId(next_task), set_of(b))
                    })
                    .collect();
                Event::GangSubmitted {
                    tasks,
                    strategy: strategy.parse().unwrap(),
                    deadline: deadline.map(|d| now + u64::from(d)),
                }
            }
            Step::Finish { pick: p } => match pick(running.keys().copied().collect(), p) {
                Some(task) => Event::TaskFinished { task },
                None => Event::TaskFinished {
                    task: TaskId(10_000),
                },
            },
            Step::Cancel { pick: p } => {
                let known: Vec<TaskId> = pending.iter().chain(running.keys()).copied().collect();
                Event::TaskCancelled {
                    task: pick(known, p).unwrap_or(TaskId(10_000)),
                }
            }
            Step::Tick { advance } => {
                now += u64::from(advance);
                Event::Tick
            }
            Step::Patience => {
                now += GANG_PATIENCE;
                Event::Tick
            }
        };
        let before = format!("{core:?}");
        let mut out = Vec::new();
        let result = core.handle(event.clone(), now, &mut out);
        match &result {
            Err(_) => {
                prop_assert_eq!(
                    &before,
                    &format!("{core:?}"),
                    "refused {:?} changed the core",
                    event
                );
                prop_assert!(out.is_empty());
            }
            Ok(_) => match event {
                Event::TaskSubmitted { task, .. } => {
                    pending.insert(task);
                }
                Event::GangSubmitted { ref tasks, .. } => {
                    let members: BTreeSet<TaskId> = tasks.iter().map(|(t, _)| *t).collect();
                    pending.extend(members.iter().copied());
                    gangs.insert(tasks[0].0, members);
                }
                Event::TaskFinished { task } => {
                    running.remove(&task);
                }
                Event::TaskCancelled { task } => {
                    pending.remove(&task);
                    running.remove(&task);
                    for members in gangs.values_mut() {
                        members.remove(&task);
                    }
                }
                _ => {}
            },
        }
        // Atomicity: a gang member is dispatched only together with all its pending members.
        let dispatched: BTreeSet<TaskId> = out
            .iter()
            .filter_map(|d| match d {
                Decision::Dispatch { task, .. } => Some(*task),
                _ => None,
            })
            .collect();
        for (gang, members) in &gangs {
            let moved = members.iter().filter(|m| dispatched.contains(m)).count();
            prop_assert!(
                moved == 0 || moved == members.len(),
                "gang {:?}: {} of {} members dispatched",
                gang,
                moved,
                members.len()
            );
        }
        for d in &out {
            if let Decision::Dispatch { task, .. } | Decision::DeadlinePassed { task } = d {
                for members in gangs.values_mut() {
                    members.remove(task);
                }
            }
        }
        gangs.retain(|_, m| !m.is_empty());
        for d in &out {
            match d {
                Decision::Dispatch { task, node, .. } => {
                    prop_assert!(
                        pending.remove(task),
                        "dispatched {:?} which was not pending",
                        task
                    );
                    running.insert(*task, *node);
                }
                Decision::Lost { task, node } => {
                    prop_assert_eq!(running.remove(task), Some(*node));
                }
                Decision::DeadlinePassed { task } => {
                    prop_assert!(
                        pending.remove(task),
                        "expired {:?} which was not pending",
                        task
                    );
                }
                Decision::Infeasible { task, .. } | Decision::Feasible { task } => {
                    prop_assert!(pending.contains(task));
                }
            }
        }
        if let Err(why) = core.sanity_check() {
            return Err(TestCaseError::fail(format!("after {event:?}: {why}")));
        }
        prop_assert_eq!(core.pending_count(), pending.len());
        prop_assert_eq!(core.running_count(), running.len());
        for (task, node) in &running {
            prop_assert_eq!(core.running_on(*task), Some(*node));
        }
        all.extend(out);
    }
    Ok(all)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(steps in prop::collection::vec(step(), 1..120)) {
        run(&steps)?;
    }

    #[test]
    fn same_events_give_same_decisions(steps in prop::collection::vec(step(), 1..80)) {
        let first = run(&steps)?;
        let second = run(&steps)?;
        prop_assert_eq!(first, second);
    }
}
