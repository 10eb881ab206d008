//! [`Dag`]: a DAG of tasks ordered by P2 signals (thesis §4.4.1 P2, §4.7: "DAG-based
//! scheduling can be implemented by leveraging the task signalling primitive").
//!
//! Each task `t` with dependents raises `done-<dag>-<t>` when it succeeds; each task requests
//! one unit of the signal of every predecessor. All tasks may be submitted at once, in any
//! order: the scheduler holds each one until its last predecessor has succeeded.

use std::collections::{BTreeMap, BTreeSet};

use super::{Signal, withdraw_all};
use crate::policy::{Policy, er_name};
use crate::{ClusterApi, EslError, ResourceSpec};

#[derive(Debug, Clone)]
struct Node {
    name: String,
    deps: Vec<String>,
}

/// A DAG being described: tasks and their predecessors.
#[derive(Debug, Clone)]
pub struct Dag<C> {
    cluster: C,
    name: String,
    tasks: Vec<Node>,
    index: BTreeMap<String, usize>,
}

/// A validated DAG: every task's spec, in a valid (topological) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DagPlan {
    order: Vec<(String, ResourceSpec)>,
    preds: BTreeMap<String, Vec<String>>,
}

impl DagPlan {
    /// Every task with its spec; each task comes after all its predecessors.
    pub fn order(&self) -> &[(String, ResourceSpec)] {
        &self.order
    }

    /// The spec of one task.
    pub fn spec(&self, task: &str) -> Option<&ResourceSpec> {
        self.order.iter().find(|(n, _)| n == task).map(|(_, s)| s)
    }

    /// The predecessors of one task.
    pub fn predecessors(&self, task: &str) -> &[String] {
        self.preds.get(task).map_or(&[], Vec::as_slice)
    }

    /// How many tasks.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl<C: ClusterApi> Dag<C> {
    /// An empty DAG whose signals are named `done-<name>-<task>`.
    pub fn new(cluster: C, name: &str) -> Result<Dag<C>, EslError> {
        er_name(&["done", name, "x"])?;
        Ok(Dag {
            cluster,
            name: name.to_string(),
            tasks: Vec::new(),
            index: BTreeMap::new(),
        })
    }

    /// Adds a task that runs after every task of `deps` has succeeded. Predecessors may be
    /// added later; [`plan`](Self::plan) checks that they exist.
    pub fn task(&mut self, name: &str, deps: &[&str]) -> Result<&mut Dag<C>, EslError> {
        self.signal(name)?;
        if self.index.contains_key(name) {
            return Err(EslError::Unsatisfiable(format!(
                "DAG {}: task {name:?} is added twice",
                self.name
            )));
        }
        let mut unique = BTreeSet::new();
        let deps = deps
            .iter()
            .filter(|d| unique.insert(**d))
            .map(|d| d.to_string())
            .collect();
        self.index.insert(name.to_string(), self.tasks.len());
        self.tasks.push(Node {
            name: name.to_string(),
            deps,
        });
        Ok(self)
    }

    /// The signal task `task` raises when it succeeds.
    pub fn signal(&self, task: &str) -> Result<Signal, EslError> {
        Ok(Signal::new(er_name(&["done", &self.name, task])?))
    }

    /// Validates the DAG (every predecessor exists, no cycle) and gives each task its spec, in
    /// a valid order (among tasks that are ready together, the one added first comes first).
    pub fn plan(&self) -> Result<DagPlan, EslError> {
        let n = self.tasks.len();
        let mut indegree = vec![0usize; n];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, task) in self.tasks.iter().enumerate() {
            for dep in &task.deps {
                let Some(&d) = self.index.get(dep) else {
                    return Err(EslError::Unsatisfiable(format!(
                        "DAG {}: task {:?} depends on {dep:?}, which is not in the DAG",
                        self.name, task.name
                    )));
                };
                indegree[i] += 1;
                dependents[d].push(i);
            }
        }
        let mut ready: BTreeSet<usize> = (0..n).filter(|i| indegree[*i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &j in &dependents[i] {
                indegree[j] -= 1;
                if indegree[j] == 0 {
                    ready.insert(j);
                }
            }
        }
        if order.len() < n {
            return Err(EslError::Unsatisfiable(format!(
                "DAG {} has a cycle: {}",
                self.name,
                self.cycle(&indegree)
            )));
        }
        let mut planned = Vec::with_capacity(n);
        for i in order {
            let task = &self.tasks[i];
            let mut spec = ResourceSpec::new();
            for dep in &task.deps {
                spec = spec.and(&self.signal(dep)?.waiter())?;
            }
            if !dependents[i].is_empty() {
                spec = spec.and(&self.signal(&task.name)?.raiser())?;
            }
            planned.push((task.name.clone(), spec));
        }
        let preds = self
            .tasks
            .iter()
            .map(|t| (t.name.clone(), t.deps.clone()))
            .collect();
        Ok(DagPlan {
            order: planned,
            preds,
        })
    }

    /// A cycle among the tasks Kahn's algorithm could not order, as `a -> b -> a`
    /// (`a -> b` meaning a waits for b).
    fn cycle(&self, indegree: &[usize]) -> String {
        let stuck = |i: usize| indegree[i] > 0;
        let Some(start) = (0..self.tasks.len()).find(|i| stuck(*i)) else {
            return String::new();
        };
        let mut path = vec![start];
        let mut at = start;
        loop {
            // A stuck task always has a stuck predecessor.
            let next = self.tasks[at]
                .deps
                .iter()
                .filter_map(|d| self.index.get(d).copied())
                .find(|d| stuck(*d))
                .unwrap_or(start);
            if let Some(pos) = path.iter().position(|p| *p == next) {
                let mut names: Vec<&str> = path[pos..]
                    .iter()
                    .map(|i| self.tasks[*i].name.as_str())
                    .collect();
                names.push(self.tasks[next].name.as_str());
                return names.join(" -> ");
            }
            path.push(next);
            at = next;
        }
    }

    /// Withdraws every signal of the DAG (run it when the DAG is done, before reusing its
    /// name).
    pub async fn cleanup(&self) -> Result<(), EslError> {
        let signals = self
            .tasks
            .iter()
            .map(|t| self.signal(&t.name))
            .collect::<Result<Vec<_>, _>>()?;
        withdraw_all(&self.cluster, &signals).await
    }
}

impl<C: ClusterApi> Policy for Dag<C> {
    type Key = str;

    async fn spec_for(&mut self, task: &str) -> Result<ResourceSpec, EslError> {
        self.plan()?.spec(task).cloned().ok_or_else(|| {
            EslError::Unsatisfiable(format!("DAG {} has no task {task:?}", self.name))
        })
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{TaskId, TaskState};

    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    fn diamond(cluster: InMemoryCluster) -> Dag<InMemoryCluster> {
        let mut dag = Dag::new(cluster, "d").unwrap();
        dag.task("join", &["left", "right"])
            .unwrap()
            .task("left", &["src"])
            .unwrap()
            .task("right", &["src"])
            .unwrap()
            .task("src", &[])
            .unwrap();
        dag
    }

    #[test]
    fn plans_come_in_a_valid_order_with_one_signal_per_edge() {
        let dag = diamond(InMemoryCluster::new(Mode::Instant));
        let plan = dag.plan().unwrap();
        let names: Vec<&str> = plan.order().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["src", "left", "right", "join"]);
        let join = plan.spec("join").unwrap();
        assert_eq!(join.resources.to_string(), "done-d-left=1,done-d-right=1");
        assert!(join.on_success.is_empty(), "nobody waits for join");
        let src = plan.spec("src").unwrap();
        assert!(src.resources.is_empty());
        assert_eq!(src.on_success.len(), 1);
        assert_eq!(src.on_success[0].name.as_str(), "done-d-src");
        assert_eq!(plan.predecessors("join"), ["left", "right"]);
    }

    #[test]
    fn cycles_unknown_tasks_and_duplicates_are_refused() {
        let cluster = InMemoryCluster::new(Mode::Instant);
        let mut dag = Dag::new(cluster.clone(), "c").unwrap();
        dag.task("a", &["c"]).unwrap();
        dag.task("b", &["a"]).unwrap();
        dag.task("c", &["b"]).unwrap();
        dag.task("d", &[]).unwrap();
        let err = dag.plan().unwrap_err().to_string();
        assert!(err.contains("cycle: a -> c -> b -> a"), "{err}");
        let mut selfish = Dag::new(cluster.clone(), "s").unwrap();
        selfish.task("a", &["a"]).unwrap();
        assert!(selfish.plan().unwrap_err().to_string().contains("a -> a"));
        let mut dangling = Dag::new(cluster.clone(), "u").unwrap();
        dangling.task("a", &["ghost"]).unwrap();
        assert!(
            dangling
                .plan()
                .unwrap_err()
                .to_string()
                .contains("not in the DAG")
        );
        assert!(dangling.task("a", &[]).is_err(), "twice");
        assert!(dangling.task("bad name", &[]).is_err());
        assert!(Dag::new(cluster, "bad/name/x").is_err());
    }

    /// All tasks are submitted at once in a random order; whatever order tasks finish in, no
    /// task starts before every predecessor has succeeded, and every task runs.
    #[tokio::test]
    async fn no_task_starts_before_its_predecessors_succeeded() {
        let mut rng = Rng::new(99);
        for round in 0..60 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            for _ in 0..rng.range(1, 4) {
                cluster.add_node("cpu=64");
            }
            let n = rng.range(2, 14) as usize;
            let mut dag = Dag::new(cluster.clone(), &format!("r{round}")).unwrap();
            let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            let mut add: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut add);
            for &j in &add {
                // Edges only from lower to higher index: acyclic by construction.
                let deps: Vec<&str> = (0..j)
                    .filter(|_| rng.chance(30))
                    .map(|i| names[i].as_str())
                    .collect();
                dag.task(&names[j], &deps).unwrap();
            }
            let plan = dag.plan().unwrap();
            let mut submit: Vec<&(String, ResourceSpec)> = plan.order().iter().collect();
            rng.shuffle(&mut submit);
            let specs = submit.iter().map(|(_, s)| task("cpu=1", s)).collect();
            let ids = cluster.submit(specs).await.unwrap();
            let name_of: BTreeMap<TaskId, &str> = ids
                .iter()
                .zip(&submit)
                .map(|(id, (name, _))| (*id, name.as_str()))
                .collect();
            let mut succeeded: BTreeSet<&str> = BTreeSet::new();
            let mut checked = 0;
            loop {
                let dispatches = cluster.dispatches();
                for (t, _) in &dispatches[checked..] {
                    let name = name_of[t];
                    for p in plan.predecessors(name) {
                        assert!(
                            succeeded.contains(p.as_str()),
                            "round {round}: {name} before {p}"
                        );
                    }
                }
                checked = dispatches.len();
                let running = cluster.running();
                if running.is_empty() {
                    break;
                }
                let (t, _) = running[rng.below(running.len())];
                succeeded.insert(name_of[&t]);
                cluster.finish(t, true);
            }
            assert_eq!(succeeded.len(), n, "round {round}: every task ran");
            dag.cleanup().await.unwrap();
            let status = cluster.cluster_status().await.unwrap();
            assert!(status.nodes.iter().all(|node| {
                node.resources
                    .iter()
                    .all(|r| !r.name.as_str().starts_with("done-"))
            }));
        }
    }

    #[tokio::test]
    async fn a_failed_predecessor_holds_its_successors_back_with_a_reason() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        cluster.add_node("cpu=4");
        let mut dag = diamond(cluster.clone());
        let specs = ["src", "left", "right", "join"];
        let mut ids = BTreeMap::new();
        for name in specs {
            let spec = dag.spec_for(name).await.unwrap();
            ids.insert(
                name,
                cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap()[0],
            );
        }
        cluster.finish(ids["src"], true);
        cluster.finish(ids["left"], true);
        cluster.finish(ids["right"], false);
        let join = cluster.status(ids["join"]).await.unwrap();
        assert_eq!(join.state, TaskState::Pending);
        assert!(join.reason.unwrap().contains("done-d-right"));
        assert!(dag.spec_for("nope").await.is_err());
    }
}
