//! E4, EscherTune: a distributed training job that migrates when it can consolidate (thesis
//! §4.6.1 "Distributed Training", Fig. 4.6b).
//!
//! **Setup.** 3 workers with 4 accelerator slots each (`accel`, 12 in all). Five short
//! one-slot jobs run first, two on the first node, two on the second, one on the third (the
//! scenario's starting point, pinned by the nodes' labels). Then the long job arrives: 4
//! workers of one slot each. No node has 4 free slots, so [`Migrator::launch`] spreads it
//! (3 + 1). Rank 0 trains: one step takes [`Costs::step_s`] when the 4 workers share a node
//! and [`Costs::spread`] times that when they do not (the all-reduce crosses the network);
//! the other ranks hold their slots. Progress lives in the application's checkpoint store.
//!
//! **Policies.** `static`: the job keeps its first placement (stock Tune). `escher-tune`:
//! whenever a short job ends, the application asks the migration ESL to consolidate
//! ([`Migrator::maybe_migrate`]): when one node has room for the whole job, the checkpoint
//! hook saves the progress, the job's resource `job-<id>` moves to that node, the workers are
//! cancelled and relaunched with unchanged requests; rank 0 restores the checkpoint (it costs
//! [`Costs::restore_s`]) and goes on.
//!
//! **Measured.** The long job's throughput (steps per simulated second, from its launch to its
//! last step), its migrations, and whether the relaunched tasks' requests are the first
//! launch's. The costs are assumptions: [`Costs::default`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use escher::esl::Migrator;
use escher::types::{NodeId, TaskId, TaskSpec};
use escher::{Client, Functions, LocalCluster, Task};
use serde::{Deserialize, Serialize};

use super::common::{AnyResult, Clock, cluster, host, submit_all};

/// This module's source, for counting its policy lines.
pub const SOURCE: &str = include_str!("tune.rs");

const LIMIT: Duration = Duration::from_secs(120);

/// The workers of the long job.
pub const WORKERS: usize = 4;

/// The injected costs, in simulated seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// One training step with every worker on one node.
    pub step_s: f64,
    /// How much longer a step takes with the workers spread over nodes.
    pub spread: f64,
    /// Restoring the checkpoint after a relaunch.
    pub restore_s: f64,
    /// The short jobs' durations (one slot each; two on node 0, two on node 1, one on 2).
    pub short_s: [f64; 5],
    /// Steps the long job trains.
    pub steps: u32,
    /// Compressed time.
    pub clock: Clock,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            step_s: 1.0,
            spread: 1.5,
            restore_s: 5.0,
            short_s: [60.0, 70.0, 50.0, 80.0, 20.0],
            steps: 100,
            clock: Clock { ms_per_s: 10.0 },
        }
    }
}

/// Whether the long job may move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Policy {
    /// It keeps its first placement.
    Static,
    /// It consolidates on one node as soon as one has room.
    EscherTune,
}

impl Policy {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::EscherTune => "escher-tune",
        }
    }
}

/// One run's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The policy.
    pub policy: Policy,
    /// Steps per simulated second, launch to last step.
    pub throughput: f64,
    /// Simulated seconds from launch to the last step.
    pub duration_s: f64,
    /// Times the job moved.
    pub migrations: u32,
    /// The nodes the job's workers ran on at the end.
    pub final_nodes: usize,
    /// Whether every launch submitted the same requests.
    pub requests_unchanged: bool,
}

/// The job's checkpoint store and where its workers run now.
#[derive(Debug, Default)]
struct Store {
    /// job → steps done at its last checkpoint.
    checkpoint: Mutex<HashMap<String, u32>>,
    /// job → steps done by its running rank 0.
    live: Mutex<HashMap<String, u32>>,
    /// job → (task → node) of its running workers.
    running: Mutex<HashMap<String, BTreeMap<TaskId, NodeId>>>,
}

/// Removes a worker from the running set when its task ends or is cancelled.
struct Running<'a> {
    store: &'a Store,
    job: &'a str,
    task: TaskId,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.store.running.lock().unwrap().get_mut(self.job) {
            m.remove(&self.task);
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Worker {
    job: String,
    rank: u32,
    costs: Costs,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hold {
    secs: f64,
    clock: Clock,
}

fn functions(store: Arc<Store>) -> Functions {
    Functions::new()
        .typed_function("tune.short", |_ctx, h: Hold| async move {
            h.clock.sleep(h.secs).await;
            Ok::<_, String>(())
        })
        .typed_function("tune.worker", move |ctx, w: Worker| {
            let store = store.clone();
            async move {
                let clock = w.costs.clock;
                store
                    .running
                    .lock()
                    .unwrap()
                    .entry(w.job.clone())
                    .or_default()
                    .insert(ctx.task_id(), ctx.node_id());
                let _running = Running {
                    store: &store,
                    job: &w.job,
                    task: ctx.task_id(),
                };
                if w.rank != 0 {
                    // Holds its slot until rank 0 is done (the job then cancels it).
                    std::future::pending::<()>().await;
                }
                let mut done = store.checkpoint.lock().unwrap().get(&w.job).copied();
                if done.is_some() {
                    clock.sleep(w.costs.restore_s).await;
                }
                let mut done = done.take().unwrap_or(0);
                while done < w.costs.steps {
                    let (workers, nodes) = {
                        let running = store.running.lock().unwrap();
                        let m = running.get(&w.job).cloned().unwrap_or_default();
                        let nodes: std::collections::BTreeSet<NodeId> =
                            m.values().copied().collect();
                        (m.len(), nodes.len())
                    };
                    if workers < WORKERS {
                        // A gang: the step needs every worker up.
                        clock.sleep(0.1).await;
                        continue;
                    }
                    let factor = if nodes == 1 { 1.0 } else { w.costs.spread };
                    clock.sleep(w.costs.step_s * factor).await;
                    done += 1;
                    store.live.lock().unwrap().insert(w.job.clone(), done);
                }
                Ok::<_, String>(())
            }
        })
}

/// A 3-node, 12-slot cluster for the scenario.
#[derive(Debug)]
pub struct Tune {
    cluster: LocalCluster,
    client: Client,
    store: Arc<Store>,
    costs: Costs,
    runs: u32,
}

impl Tune {
    /// Starts the three workers.
    pub async fn start(costs: Costs) -> AnyResult<Tune> {
        let store = Arc::new(Store::default());
        let cluster = cluster(3, "cpu=8,accel=4", functions(store.clone())).await?;
        let client = cluster.client().await?;
        Ok(Tune {
            cluster,
            client,
            store,
            costs,
            runs: 0,
        })
    }

    /// Runs the scenario once under `policy`.
    pub async fn run(&mut self, policy: Policy) -> AnyResult<Outcome> {
        self.runs += 1;
        let job = format!("long{}", self.runs);
        let shorts: Vec<Task> = self
            .costs
            .short_s
            .iter()
            .zip([0, 0, 1, 1, 2])
            .map(|(secs, k)| {
                let h = Hold {
                    secs: *secs,
                    clock: self.costs.clock,
                };
                Task::function_typed("tune.short", &h)
                    .resources_str(&format!("cpu=1,accel=1,{}=1", host(k)))
            })
            .collect();
        let mut shorts = submit_all(&self.client, shorts).await?;
        // The long job arrives once the short ones hold their slots.
        for id in &shorts {
            wait_running(&self.client, *id).await?;
        }
        let specs = (0..WORKERS as u32)
            .map(|rank| {
                let w = Worker {
                    job: job.clone(),
                    rank,
                    costs: self.costs,
                };
                Ok(Task::function_typed("tune.worker", &w)
                    .resources_str("cpu=1,accel=1")
                    .build()?)
            })
            .collect::<AnyResult<Vec<TaskSpec>>>()?;
        let store = self.store.clone();
        let mut tuner = Migrator::new(self.client.clone()).on_checkpoint(move |j| {
            // policy
            let live = store.live.lock().unwrap().get(&j.id).copied(); // policy
            store
                .checkpoint
                .lock()
                .unwrap()
                .insert(j.id.clone(), live.unwrap_or(0)); // policy
        }); // policy
        let start = Instant::now();
        let first = tuner.launch(&job, specs).await?.clone(); // policy
        let mut launches = vec![first.specs.clone()];
        while !shorts.is_empty() {
            let (_, left) = self.client.wait(shorts.clone(), 1, Some(LIMIT)).await?;
            shorts = left;
            if policy == Policy::EscherTune && tuner.maybe_migrate(&job).await?.is_some() {
                // policy
                launches.push(tuner.job(&job).expect("launched").specs.clone());
            }
        }
        let current = tuner.job(&job).expect("launched").clone();
        let chief = current.tasks[0];
        self.client.get_typed::<()>(chief, Some(LIMIT)).await?;
        let duration = start.elapsed();
        let final_nodes = {
            let running = self.store.running.lock().unwrap();
            let m = running.get(&job).cloned().unwrap_or_default();
            m.values().collect::<std::collections::BTreeSet<_>>().len()
        };
        self.client.cancel(current.tasks[1..].to_vec()).await?;
        let steps = f64::from(self.costs.steps);
        let duration_s = self.costs.clock.simulated(duration);
        Ok(Outcome {
            policy,
            throughput: steps / duration_s,
            duration_s,
            migrations: current.migrations,
            final_nodes,
            requests_unchanged: launches.iter().all(|s| *s == launches[0]),
        })
    }

    /// Stops the cluster.
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

async fn wait_running(client: &Client, id: TaskId) -> AnyResult<()> {
    let deadline = Instant::now() + LIMIT;
    while client.task_info(id).await?.status.state != escher::types::TaskState::Running {
        if Instant::now() > deadline {
            return Err(format!("task {id:?} did not start").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
