//! E2, hierarchical fair sharing at 100 nodes, composed with data locality (thesis §4.6.1,
//! Fig. 4.5c).
//!
//! **Setup.** `nodes` one-slot workers; node `k` holds chunk `k` of the input
//! (`data-c<k>`, registered with the locality ESL). The fair-share ESL ([`Hfs`]) shares the
//! nodes: at the top Sub-Org1 and Sub-Org2 with equal weights; under Sub-Org1 users A and B
//! with weights 2:3; under Sub-Org2 user C. A, B and C start at simulated t = 0, 60 and 120 s.
//! Each runs a WordCount larger than the cluster: it declares a demand of every node, and keeps
//! two map tasks outstanding on each node of its current share (one running, one queued), for
//! the chunk that node holds.
//! A task's requirements are the user's fair-share spec *and* the chunk's locality spec,
//! concatenated (the thesis' composition). When a node leaves a user's share, the user
//! withdraws the task it still had waiting there; running tasks are never preempted, so a
//! share is reclaimed as the borrower's tasks end. It finds what waits there with one read of
//! its pending tasks, whatever their number, and does not ask again about a task it saw
//! running: at 100 nodes a user that loses 60 nodes has 120 tasks on them, and asking about
//! each in turn (1.1 ms a call on 2 shared cores: 132 ms, 6.6 simulated s, for the 120) kept
//! its driver from topping up the nodes it kept, long enough for them to run dry.
//!
//! **Measured.** Every 2 simulated seconds, each user's running tasks (one page of the running
//! tasks, by name): the timeline of Fig. 4.5c. For each phase, the
//! time until the running shares come within a tolerance of the weights' shares and stay
//! there until the phase ends (stability, not one matching sample).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use escher::esl::{DataLocality, Domain, Hfs, ResourceSpec};
use escher::types::{ListTasksRequest, NodeId, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};
use serde::Serialize;

use super::common::{AnyResult, Clock, cluster};

/// This module's source, for counting its policy lines.
pub const SOURCE: &str = include_str!("hfs.rs");

/// The users: name, start (simulated s), and the shares of the nodes each should hold in the
/// three phases (A alone; A and B; A, B and C).
pub const USERS: [(&str, f64, [f64; 3]); 3] = [
    ("A", 0.0, [1.0, 0.4, 0.2]),
    ("B", 60.0, [0.0, 0.6, 0.3]),
    ("C", 120.0, [0.0, 0.0, 0.5]),
];

/// Tasks a user keeps outstanding per node of its share: one running, one queued behind it
/// (so a node never idles between two of them).
const DEPTH: usize = 2;

/// The scenario's length, simulated seconds.
pub const END_S: f64 = 180.0;

/// The scenario's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Config {
    /// Workers (one slot each).
    pub nodes: usize,
    /// One map task, simulated seconds.
    pub task_s: f64,
    /// How often the ESL rebalances, simulated seconds.
    pub rebalance_s: f64,
    /// How far a share may be from its target and count as converged, in nodes.
    pub tolerance: usize,
    /// Compressed time.
    pub clock: Clock,
}

/// One sample of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Simulated seconds since A started.
    pub t_s: f64,
    /// Running tasks of A, B and C.
    pub running: [usize; 3],
}

/// What one phase showed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// When it began, simulated seconds.
    pub start_s: f64,
    /// Target running tasks of A, B and C.
    pub target: [usize; 3],
    /// Simulated seconds from its start until the shares stayed within the tolerance for the
    /// rest of the phase; `None` if they never did.
    pub converged_after_s: Option<f64>,
    /// Mean running tasks of each user once converged.
    pub mean: [f64; 3],
}

/// The run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The timeline.
    pub samples: Vec<Sample>,
    /// Its three phases.
    pub phases: Vec<Phase>,
    /// Map tasks that ran, and those that ran on their chunk's node.
    pub tasks: usize,
    /// Of them, on their chunk's node (all, when the composition holds).
    pub local: usize,
    /// Queued tasks the users withdrew from nodes that left their shares.
    pub withdrawn: usize,
    /// Reads of a user's pending tasks made to find them (one per step that had tasks on
    /// such nodes it had not yet seen running, however many).
    pub lookups: usize,
}

fn functions() -> Functions {
    Functions::new().typed_function("hfs.map", |_ctx, (secs, clock): (f64, Clock)| async move {
        clock.sleep(secs).await;
        Ok::<_, String>(())
    })
}

/// One user's WordCount: one outstanding map per node of its share.
struct Driver {
    user: &'static str,
    leaf: Hfs<Client>,
    spec: ResourceSpec,
    client: Client,
    /// node → its outstanding tasks (one running, one queued behind it).
    out: BTreeMap<NodeId, Vec<TaskId>>,
    /// Outstanding tasks on nodes outside the share that were running when last looked at:
    /// they are left to end, and not looked at again.
    draining: BTreeSet<TaskId>,
    config: Config,
    tasks: usize,
    local: usize,
    withdrawn: usize,
    lookups: usize,
}

impl Driver {
    /// Keeps one task outstanding on each node of the user's share until `until`.
    async fn drive(mut self, until: Instant) -> AnyResult<Driver> {
        while Instant::now() < until {
            self.step().await?;
            tokio::time::sleep(self.config.clock.wall(0.25)).await;
        }
        self.client
            .cancel(self.out.values().flatten().copied().collect::<Vec<_>>())
            .await?;
        Ok(self)
    }

    async fn step(&mut self) -> AnyResult<()> {
        let ids: Vec<TaskId> = self.out.values().flatten().copied().collect();
        if !ids.is_empty() {
            // Every task that has ended (`wait` returns at its timeout with the ready ones).
            let n = ids.len();
            let (ended, _) = self.client.wait(ids, n, Some(Duration::ZERO)).await?;
            for s in ended {
                self.draining.remove(&s.id);
                for (node, tasks) in self.out.iter_mut() {
                    if tasks.contains(&s.id) {
                        tasks.retain(|t| *t != s.id);
                        if s.state == TaskState::Succeeded {
                            self.tasks += 1;
                            self.local += usize::from(s.node == Some(*node));
                        }
                    }
                }
            }
        }
        let share: Vec<NodeId> = self
            .leaf
            .assignment()
            .into_iter()
            .filter(|(_, u)| u == self.user)
            .map(|(n, _)| n)
            .collect();
        // Withdraw what waits on a node that left the share: one read of the user's pending
        // tasks from the oldest one in question on, not a call per task (see the module doc).
        let unsure: BTreeSet<TaskId> = self
            .out
            .iter()
            .filter(|(n, _)| !share.contains(n))
            .flat_map(|(_, tasks)| tasks.iter().copied())
            .filter(|t| !self.draining.contains(t))
            .collect();
        if let Some(oldest) = unsure.first() {
            self.lookups += 1;
            let query = ListTasksRequest {
                state: Some(TaskState::Pending),
                name: Some(self.user.to_string()),
                after: oldest.0.checked_sub(1).map(TaskId),
                ..ListTasksRequest::default()
            };
            let waiting: BTreeSet<TaskId> = self
                .client
                .find_tasks(query, None)
                .await?
                .into_iter()
                .map(|t| t.id)
                .filter(|t| unsure.contains(t))
                .collect();
            // The rest run (or have just ended, which the next `wait` tells).
            self.draining.extend(unsure.difference(&waiting));
            if !waiting.is_empty() {
                for tasks in self.out.values_mut() {
                    tasks.retain(|t| !waiting.contains(t));
                }
                self.withdrawn += waiting.len();
                self.client.cancel(waiting).await?;
            }
        }
        self.out.retain(|_, tasks| !tasks.is_empty());
        let mut tasks = Vec::new();
        let mut nodes = Vec::new();
        for node in share {
            let have = self.out.get(&node).map_or(0, Vec::len);
            for _ in have..DEPTH {
                let args = (self.config.task_s, self.config.clock);
                let locality = DataLocality::<Client>::consumer(&format!("c{}", node.0))?; // policy
                let spec = self.spec.clone().and(&locality)?; // policy
                tasks.push(
                    spec.apply(
                        Task::function_typed("hfs.map", &args)
                            .name(self.user)
                            .resources_str("cpu=1"),
                    ),
                );
                nodes.push(node);
            }
        }
        if !tasks.is_empty() {
            let refs = self.client.submit_batch(tasks).await?;
            for (node, r) in nodes.into_iter().zip(refs) {
                self.out.entry(node).or_default().push(r.id());
            }
        }
        Ok(())
    }
}

/// Runs the scenario on a fresh cluster.
pub async fn run(config: Config) -> AnyResult<Outcome> {
    let cluster: LocalCluster = cluster(config.nodes, "cpu=1", functions()).await?;
    let client = cluster.client().await?;
    let data = DataLocality::new(client.clone());
    for node in cluster.nodes() {
        data.register(&format!("c{}", node.0), node).await?; // policy
    }
    let top = Hfs::new(client.clone(), "top", Domain::All)?; // policy
    top.create_user("org1", 1).await?; // policy
    top.create_user("org2", 1).await?; // policy
    let (org1, org2) = (top.child_for("org1")?, top.child_for("org2")?); // policy
    let mut users = Vec::new();
    for ((user, _, _), (leaf, weight)) in USERS.iter().zip([(&org1, 2), (&org1, 3), (&org2, 1)]) {
        users.push((leaf.create_user(user, weight).await?, leaf.clone())); // policy
    }
    let rebalancer = top.spawn_rebalancer(config.clock.wall(config.rebalance_s)); // policy
    let start = Instant::now();
    let now = || config.clock.simulated(start.elapsed());
    let end = start + config.clock.wall(END_S);
    let mut drivers = Vec::new();
    let mut samples = Vec::new();
    let mut next_sample = 0.0;
    let mut next_user = 0;
    while now() < END_S {
        while let Some((user, at, _)) = USERS.get(next_user).filter(|u| now() >= u.1) {
            let _ = at;
            let (u, leaf) = &users[next_user];
            leaf.set_demand(user, config.nodes as u64)?; // policy
            let driver = Driver {
                user,
                leaf: leaf.clone(),
                spec: u.spec(), // policy
                client: client.clone(),
                out: BTreeMap::new(),
                draining: BTreeSet::new(),
                config,
                tasks: 0,
                local: 0,
                withdrawn: 0,
                lookups: 0,
            };
            drivers.push(tokio::spawn(driver.drive(end)));
            next_user += 1;
        }
        if now() >= next_sample {
            // One page is one consistent snapshot of what runs.
            let page = client
                .list_tasks_page(ListTasksRequest {
                    state: Some(TaskState::Running),
                    limit: 1000,
                    ..ListTasksRequest::default()
                })
                .await?;
            let running =
                [0, 1, 2].map(|i| page.tasks.iter().filter(|t| t.name == USERS[i].0).count());
            samples.push(Sample {
                t_s: now(),
                running,
            });
            next_sample += 2.0;
        }
        tokio::time::sleep(config.clock.wall(0.5)).await;
    }
    let (mut tasks, mut local, mut withdrawn, mut lookups) = (0, 0, 0, 0);
    for d in drivers {
        let d = d.await??;
        tasks += d.tasks;
        local += d.local;
        withdrawn += d.withdrawn;
        lookups += d.lookups;
    }
    rebalancer.stop().await;
    cluster.shutdown().await;
    Ok(Outcome {
        phases: phases(&samples, config),
        samples,
        tasks,
        local,
        withdrawn,
        lookups,
    })
}

/// Splits the timeline at the users' starts and finds where each phase settled.
pub fn phases(samples: &[Sample], config: Config) -> Vec<Phase> {
    let starts: Vec<f64> = USERS.iter().map(|u| u.1).collect();
    (0..3)
        .map(|p| {
            let (from, to) = (starts[p], starts.get(p + 1).copied().unwrap_or(END_S));
            let target = [0, 1, 2].map(|u| (USERS[u].2[p] * config.nodes as f64).round() as usize);
            let within: Vec<(f64, [usize; 3], bool)> = samples
                .iter()
                .filter(|s| s.t_s >= from && s.t_s < to)
                .map(|s| {
                    let ok = (0..3).all(|u| s.running[u].abs_diff(target[u]) <= config.tolerance);
                    (s.t_s, s.running, ok)
                })
                .collect();
            // The first sample from which every later one of the phase is within tolerance.
            let settled = (0..within.len()).find(|i| within[*i..].iter().all(|w| w.2));
            let converged_after_s = settled.map(|i| within[i].0 - from);
            let stable = settled.map(|i| &within[i..]).unwrap_or(&[]);
            let mean = [0, 1, 2].map(|u| {
                if stable.is_empty() {
                    0.0
                } else {
                    stable.iter().map(|w| w.1[u] as f64).sum::<f64>() / stable.len() as f64
                }
            });
            Phase {
                start_s: from,
                target,
                converged_after_s,
                mean,
            }
        })
        .collect()
}
