//! A test environment for the scheduler core: builders for events, a compact rendering of
//! decisions for exact assertions, and a sanity check after every step.
#![allow(dead_code)]

use escher_core::scheduler::{CoreError, Decision, Event, Millis, Scheduler};
use escher_proto::types::{Capacity, CapacityOp, Labels, NodeId, NodeSpec, ResourceName, TaskId};

/// The core under test plus a clock.
#[derive(Debug, Default)]
pub struct TestEnv {
    pub core: Scheduler,
    pub now: Millis,
}

/// `"cpu=4,x=unbounded"` as capacities.
pub fn caps(text: &str) -> Vec<(ResourceName, Capacity)> {
    if text.is_empty() {
        return Vec::new();
    }
    text.split(',')
        .map(|item| {
            let (n, c) = item.split_once('=').expect("name=capacity");
            (ResourceName::new(n).unwrap(), c.parse().unwrap())
        })
        .collect()
}

/// Renders decisions compactly: `dispatch 1->2`, `infeasible 3: ...`, `feasible 3`,
/// `deadline 4`, `lost 5@2`.
pub fn render(decisions: &[Decision]) -> Vec<String> {
    decisions
        .iter()
        .map(|d| match d {
            Decision::Dispatch { task, node, .. } => format!("dispatch {task}->{node}"),
            Decision::Infeasible { task, reason } => format!("infeasible {task}: {reason}"),
            Decision::Feasible { task } => format!("feasible {task}"),
            Decision::DeadlinePassed { task } => format!("deadline {task}"),
            Decision::Lost { task, node } => format!("lost {task}@{node}"),
        })
        .collect()
}

impl TestEnv {
    pub fn new() -> TestEnv {
        TestEnv::default()
    }

    /// Applies an event, checks the invariants, and returns the rendered decisions.
    pub fn apply(&mut self, event: Event) -> Result<Vec<String>, CoreError> {
        let mut out = Vec::new();
        let before = format!("{:?}", self.core);
        let result = self.core.handle(event, self.now, &mut out);
        if result.is_err() {
            assert_eq!(
                before,
                format!("{:?}", self.core),
                "a refused event changed the core"
            );
            assert!(out.is_empty());
        }
        self.core.sanity_check().unwrap();
        result.map(|_| render(&out))
    }

    fn ok(&mut self, event: Event) -> Vec<String> {
        self.apply(event).unwrap()
    }

    pub fn node(&mut self, id: u64, resources: &str) -> Vec<String> {
        self.ok(Event::NodeAdded {
            node: NodeId(id),
            resources: caps(resources),
            labels: Labels::new(),
        })
    }

    pub fn remove_node(&mut self, id: u64) -> Vec<String> {
        self.ok(Event::NodeRemoved { node: NodeId(id) })
    }

    pub fn change(&mut self, target: NodeSpec, name: &str, op: CapacityOp) -> Vec<String> {
        self.ok(Event::ResourceChanged {
            target,
            name: ResourceName::new(name).unwrap(),
            op,
        })
    }

    pub fn set(&mut self, node: u64, name: &str, capacity: &str) -> Vec<String> {
        self.change(
            NodeSpec::Node(NodeId(node)),
            name,
            CapacityOp::Set(capacity.parse().unwrap()),
        )
    }

    pub fn adjust(&mut self, node: u64, name: &str, delta: &str) -> Vec<String> {
        self.change(
            NodeSpec::Node(NodeId(node)),
            name,
            CapacityOp::Adjust(delta.parse().unwrap()),
        )
    }

    pub fn delete(&mut self, node: u64, name: &str) -> Vec<String> {
        self.change(NodeSpec::Node(NodeId(node)), name, CapacityOp::Delete)
    }

    pub fn submit(&mut self, task: u64, resources: &str) -> Vec<String> {
        self.ok(Event::TaskSubmitted {
            task: TaskId(task),
            resources: resources.parse().unwrap(),
            deadline: None,
            time_limit: None,
        })
    }

    pub fn submit_until(&mut self, task: u64, resources: &str, deadline: Millis) -> Vec<String> {
        self.ok(Event::TaskSubmitted {
            task: TaskId(task),
            resources: resources.parse().unwrap(),
            deadline: Some(deadline),
            time_limit: None,
        })
    }

    /// Submits a task that may run for at most `limit` milliseconds.
    pub fn submit_limited(&mut self, task: u64, resources: &str, limit: Millis) -> Vec<String> {
        self.ok(Event::TaskSubmitted {
            task: TaskId(task),
            resources: resources.parse().unwrap(),
            deadline: None,
            time_limit: Some(limit),
        })
    }

    /// Adds a node whose walltime ends at `ends_at` (its `escher.ends-at` label).
    pub fn node_ending(&mut self, id: u64, resources: &str, ends_at: Millis) -> Vec<String> {
        let mut labels = Labels::new();
        labels
            .insert(escher_proto::types::ENDS_AT_LABEL, &ends_at.to_string())
            .unwrap();
        self.ok(Event::NodeAdded {
            node: NodeId(id),
            resources: caps(resources),
            labels,
        })
    }

    /// Submits a gang: members `first..`, one per requirement string.
    pub fn gang(&mut self, first: u64, bundles: &[&str], strategy: &str) -> Vec<String> {
        let tasks = bundles
            .iter()
            .enumerate()
            .map(|(i, b)| (TaskId(first + i as u64), b.parse().unwrap()))
            .collect();
        self.ok(Event::GangSubmitted {
            tasks,
            strategy: strategy.parse().unwrap(),
            deadline: None,
        })
    }

    pub fn finish(&mut self, task: u64) -> Vec<String> {
        self.ok(Event::TaskFinished { task: TaskId(task) })
    }

    pub fn cancel(&mut self, task: u64) -> Vec<String> {
        self.ok(Event::TaskCancelled { task: TaskId(task) })
    }

    pub fn tick(&mut self, now: Millis) -> Vec<String> {
        self.now = now;
        self.ok(Event::Tick)
    }

    /// `(total, used)` of a resource on a node, as text.
    pub fn slot(&self, node: u64, name: &str) -> Option<(String, String)> {
        let view = self.core.node(NodeId(node))?;
        view.resources
            .iter()
            .find(|r| r.name.as_str() == name)
            .map(|r| (r.total.to_string(), r.used.to_string()))
    }
}

/// `["dispatch 1->2", ...]` from `&[(1, 2), ...]`.
pub fn dispatches(pairs: &[(u64, u64)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(t, n)| format!("dispatch {t}->{n}"))
        .collect()
}
