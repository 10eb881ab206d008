//! Cilantro as an ESL: the thesis' synthetic 5-user experiment (chapter 3, §3.7.3), with the
//! allocations actuated on an embedded cluster.
//!
//! **Setup.** 10 workers of 10 CPUs (R = 100). Five jobs whose performance with `a` running
//! replicas follows a logistic curve `1 / (1 + e^{-(a - mid)/3})` with midpoints 5, 10, 20, 30
//! and 45 (demands at the SLO of 0.95: about 14, 19, 29, 39 and 54 CPUs, 154 in all, so the
//! cluster is oversubscribed), observed with Gaussian noise (σ, default 0.05). Each round:
//! the ESL decides and sets every job's `cil-...` capacities ([`Cilantro::round`]); each job
//! scales its replicas (one-CPU tasks that serve until cancelled) to its allocation; then the
//! job's monitor task measures its performance with the replicas that run and reports it as
//! task telemetry (`ctx.report`), which the application reads (`Client::telemetry`) and hands
//! to the ESL ([`Cilantro::report`]).
//!
//! **Compared.** Cilantro-NJC, Cilantro-SW, Cilantro-EW and resource-fair (R/n each), B = 10,
//! β = 3/4. Then strategy-proofness: job 3 misreports (it reports the performance of half or
//! twice its replicas, as if its demand were ×2 or ×½) and we compare its true utility.
//!
//! **Measured** over the second half of the rounds: each job's true utility (noiseless, at the
//! replicas it ran), social welfare (mean), egalitarian welfare (min) and NJC fairness
//! (`min_j u_j(a_j) / u_j(R/n)`); the jobs NJC lifts over resource-fair and by how much.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use escher::esl::Domain;
use escher::esl::cilantro::{Cilantro, Objective, utility};
use escher::types::{NodeId, ResourceSet, TaskId};
use escher::{Client, Functions, LocalCluster, Task};
use serde::{Deserialize, Serialize};

use super::common::{AnyResult, submit_all};

/// This module's source, for counting its policy lines.
pub const SOURCE: &str = include_str!("cilantro.rs");

const LIMIT: Duration = Duration::from_secs(60);

/// The jobs' logistic midpoints (CPUs); every curve has scale 3.
pub const MIDPOINTS: [f64; 5] = [5.0, 10.0, 20.0, 30.0, 45.0];

/// Every job's SLO.
pub const SLO: f64 = 0.95;

/// Workers and CPUs per worker.
pub const NODES: usize = 10;
/// CPUs per worker.
pub const CPUS: u64 = 10;

/// A job's true performance with `a` replicas.
pub fn performance(job: usize, a: f64) -> f64 {
    1.0 / (1.0 + (-(a - MIDPOINTS[job]) / 3.0).exp())
}

/// How a job reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Report {
    /// What it measured.
    Truthful,
    /// The performance of `factor` times its replicas (×0.5: it claims twice its demand).
    Scaled(f64),
}

/// One experiment's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Config {
    /// Rounds.
    pub rounds: usize,
    /// The noise on each performance sample.
    pub noise: f64,
    /// How job 3 (index 2) reports.
    pub job3: Report,
    /// The random seed of the noise.
    pub seed: u64,
}

/// What one experiment measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The objective.
    pub objective: String,
    /// Mean true utility of each job over the second half.
    pub utilities: Vec<f64>,
    /// Mean replicas of each job over the second half.
    pub replicas: Vec<f64>,
    /// Mean utility.
    pub social_welfare: f64,
    /// Least utility.
    pub egalitarian_welfare: f64,
    /// `min_j u_j / u_j(R/n)`.
    pub njc_fairness: f64,
    /// Rounds whose allocations summed to more than R or moved a job by more than B (NJC and
    /// the welfare objectives): must be 0.
    pub violations: usize,
    /// Every round's allocations.
    pub allocations: Vec<Vec<u64>>,
}

/// The replicas that serve, per job: task → node (what a job's load balancer knows).
#[derive(Debug, Default)]
struct Serving {
    running: Mutex<HashMap<String, BTreeMap<TaskId, NodeId>>>,
}

impl Serving {
    fn count(&self, job: &str) -> u64 {
        self.running
            .lock()
            .unwrap()
            .get(job)
            .map_or(0, |m| m.len() as u64)
    }
}

/// Takes a replica out of its job's set when its task ends or is cancelled.
struct Replica<'a>(&'a Serving, &'a str, TaskId);

impl Drop for Replica<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.0.running.lock().unwrap().get_mut(self.1) {
            m.remove(&self.2);
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Monitor {
    job: String,
    index: usize,
    noise: f64,
    report: Report,
    seed: u64,
}

fn functions(serving: Arc<Serving>) -> Functions {
    let (replicas, monitors) = (serving.clone(), serving);
    Functions::new()
        .typed_function("cil.replica", move |ctx, job: String| {
            let serving = replicas.clone();
            async move {
                serving
                    .running
                    .lock()
                    .unwrap()
                    .entry(job.clone())
                    .or_default()
                    .insert(ctx.task_id(), ctx.node_id());
                let _serving = Replica(&serving, &job, ctx.task_id());
                std::future::pending::<()>().await;
                Ok::<_, String>(())
            }
        })
        .typed_function("cil.monitor", move |ctx, m: Monitor| {
            let serving = monitors.clone();
            async move {
                let a = serving.count(&m.job);
                let seen = match m.report {
                    Report::Truthful => a as f64,
                    Report::Scaled(f) => a as f64 * f,
                };
                let mut rng = fastrand::Rng::with_seed(m.seed);
                // Box–Muller: one standard normal sample.
                let z = (-2.0 * (1.0 - rng.f64()).ln()).sqrt()
                    * (std::f64::consts::TAU * rng.f64()).cos();
                let perf = (performance(m.index, seen) + m.noise * z).clamp(0.0, 1.0);
                // The job's measurement goes out as task telemetry.
                ctx.report(&[("replicas", a as f64), ("performance", perf)])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            }
        })
}

/// A cluster for the experiment.
#[derive(Debug)]
pub struct Experiment {
    cluster: LocalCluster,
    client: Client,
    serving: Arc<Serving>,
    runs: usize,
}

impl Experiment {
    /// Starts 10 workers of 10 CPUs.
    pub async fn start() -> AnyResult<Experiment> {
        let serving = Arc::new(Serving::default());
        let mut builder = LocalCluster::builder()
            .no_workers()
            .functions(functions(serving.clone()));
        for _ in 0..NODES {
            builder = builder.worker(format!("cpu={CPUS}").parse()?);
        }
        let cluster = builder.start().await?;
        let client = cluster.client().await?;
        Ok(Experiment {
            cluster,
            client,
            serving,
            runs: 0,
        })
    }

    /// Runs `config.rounds` rounds under `objective`.
    pub async fn run(&mut self, objective: Objective, config: Config) -> AnyResult<Outcome> {
        self.runs += 1;
        let instance = format!("r{}", self.runs);
        let jobs: Vec<String> = (1..=MIDPOINTS.len()).map(|j| format!("job{j}")).collect();
        let mut cil = Cilantro::new(
            self.client.clone(),
            &instance,
            Domain::All,
            "cpu",
            objective,
        )?; // policy
        for job in &jobs {
            cil.add_job(job, SLO)?; // policy
        }
        let mut replicas: Vec<Vec<TaskId>> = vec![Vec::new(); jobs.len()];
        let mut history: Vec<Vec<f64>> = Vec::new();
        let mut allocations: Vec<Vec<u64>> = Vec::new();
        let mut violations = 0;
        let total = NODES as u64 * CPUS;
        for round in 0..config.rounds {
            let alloc = cil.round().await?; // policy
            let now: Vec<u64> = jobs.iter().map(|j| alloc[j]).collect();
            if let Some(before) = allocations.last() {
                let moved = now.iter().zip(before).any(|(a, b)| a.abs_diff(*b) > 10 + 1);
                if now.iter().sum::<u64>() > total
                    || (objective != Objective::ResourceFair && moved)
                {
                    violations += 1;
                }
            }
            allocations.push(now.clone());
            for (j, job) in jobs.iter().enumerate() {
                self.scale(&cil, job, now[j], &mut replicas[j]).await?;
            }
            self.settle(&jobs, &now).await;
            // Each job's monitor measures it with what runs, and the job reports to the ESL.
            let monitors: Vec<Task> = jobs
                .iter()
                .enumerate()
                .map(|(index, job)| {
                    let m = Monitor {
                        job: job.clone(),
                        index,
                        noise: config.noise,
                        report: if index == 2 {
                            config.job3
                        } else {
                            Report::Truthful
                        },
                        seed: config.seed ^ ((round as u64) << 8 | index as u64),
                    };
                    Task::function_typed("cil.monitor", &m).resources(ResourceSet::new())
                })
                .collect();
            let ids = submit_all(&self.client, monitors).await?;
            for id in &ids {
                self.client.get_typed::<()>(*id, Some(LIMIT)).await?;
            }
            let reported = self.client.telemetry(ids.iter().copied(), None).await?;
            let mut truth = Vec::new();
            for (j, id) in ids.iter().enumerate() {
                let t = reported
                    .iter()
                    .find(|t| t.task == *id)
                    .ok_or("a monitor reported nothing")?;
                let (ran, perf) = (
                    t.latest("replicas").unwrap_or(0.0),
                    t.latest("performance").unwrap_or(0.0),
                );
                cil.report(&jobs[j], ran as u64, perf)?; // policy
                truth.push(utility(performance(j, ran), SLO));
            }
            history.push(truth);
        }
        for ids in replicas {
            self.client.cancel(ids).await?;
        }
        cil.dissolve().await?;
        self.settle(&jobs, &vec![0; jobs.len()]).await;
        Ok(summarise(objective, &history, &allocations, violations))
    }

    /// Scales `job` to `want` replicas within its capacities: first the replicas on a node
    /// above the job's capacity there go (its resource moved), then the ones still waiting,
    /// then the newest; or new ones are submitted.
    async fn scale(
        &self,
        cil: &Cilantro<Client>,
        job: &str,
        want: u64,
        replicas: &mut Vec<TaskId>,
    ) -> AnyResult<()> {
        let placement = cil
            .job(job)
            .map(|j| j.placement.clone())
            .unwrap_or_default();
        let running = self
            .serving
            .running
            .lock()
            .unwrap()
            .get(job)
            .cloned()
            .unwrap_or_default();
        let mut by_node: BTreeMap<NodeId, Vec<TaskId>> = BTreeMap::new();
        for (task, node) in &running {
            by_node.entry(*node).or_default().push(*task);
        }
        let mut cancel = Vec::new();
        for (node, tasks) in by_node {
            let cap = placement.get(&node).copied().unwrap_or(0) as usize;
            cancel.extend(tasks.into_iter().skip(cap));
        }
        replicas.retain(|t| !cancel.contains(t));
        let excess = replicas.len().saturating_sub(want as usize);
        if excess > 0 {
            // Waiting replicas first, then the newest.
            let mut order: Vec<TaskId> = replicas.iter().rev().copied().collect();
            order.sort_by_key(|t| running.contains_key(t));
            let drop: Vec<TaskId> = order.into_iter().take(excess).collect();
            replicas.retain(|t| !drop.contains(t));
            cancel.extend(drop);
        }
        if !cancel.is_empty() {
            self.client.cancel(cancel).await?;
        }
        let spec = cil.spec(job)?; // policy
        let more: Vec<Task> = (replicas.len()..want as usize)
            .map(|_| {
                spec.apply(
                    Task::function_typed("cil.replica", &job)
                        .name(job)
                        .resources_str("cpu=1"),
                )
            })
            .collect();
        if !more.is_empty() {
            replicas.extend(submit_all(&self.client, more).await?);
        }
        Ok(())
    }

    /// Waits (briefly) until each job runs as many replicas as it was given.
    async fn settle(&self, jobs: &[String], want: &[u64]) {
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if jobs
                .iter()
                .zip(want)
                .all(|(j, w)| self.serving.count(j) == *w)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stops the cluster.
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

fn summarise(
    objective: Objective,
    history: &[Vec<f64>],
    allocations: &[Vec<u64>],
    violations: usize,
) -> Outcome {
    let n = MIDPOINTS.len();
    let half = &history[history.len() / 2..];
    let mean =
        |f: &dyn Fn(&Vec<f64>) -> f64| half.iter().map(f).sum::<f64>() / half.len().max(1) as f64;
    let utilities: Vec<f64> = (0..n).map(|j| mean(&|h| h[j])).collect();
    let fair = (NODES as u64 * CPUS) as f64 / n as f64;
    let njc_fairness = mean(&|h| {
        (0..n)
            .map(|j| h[j] / utility(performance(j, fair), SLO))
            .fold(f64::INFINITY, f64::min)
    });
    let recent = &allocations[allocations.len() / 2..];
    let replicas = (0..n)
        .map(|j| recent.iter().map(|a| a[j] as f64).sum::<f64>() / recent.len().max(1) as f64)
        .collect();
    Outcome {
        objective: objective.name().to_string(),
        social_welfare: mean(&|h| h.iter().sum::<f64>() / n as f64),
        egalitarian_welfare: mean(&|h| h.iter().copied().fold(f64::INFINITY, f64::min)),
        njc_fairness,
        utilities,
        replicas,
        violations,
        allocations: allocations.to_vec(),
    }
}

/// Jobs whose utility `objective` lifts over resource-fair's by at least 1.2×: (job, ratio).
pub fn lifted(objective: &Outcome, fair: &Outcome) -> Vec<(usize, f64)> {
    objective
        .utilities
        .iter()
        .zip(&fair.utilities)
        .enumerate()
        .filter(|(_, (o, f))| **f > 0.0 && **o / **f >= 1.2)
        .map(|(j, (o, f))| (j + 1, o / f))
        .collect()
}

/// Per objective: job 3's true utility when it reports truthfully, ×0.5 and ×2.
pub type Misreports = BTreeMap<String, [f64; 3]>;
