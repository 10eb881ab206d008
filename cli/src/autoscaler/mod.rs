//! The autoscaler (`escher-autoscaler`): a client of the head, like an ESL, that starts
//! workers through a [`Provider`] while tasks wait for a node and gives back workers that idle.
//!
//! Every tick it reads the cluster status and the pending tasks, and [`plan`] turns them into
//! [`Decision`]s, each with the sentence that explains it; the loop ([`run`]) carries them out
//! and writes what it did to a status file (`escher-autoscaler status` prints it). The plan is
//! a pure function of what the head said and what the autoscaler launched, so the tests check
//! it without a cluster, and the end-to-end tests check the loop against real providers.
//!
//! Its workers carry the labels `autoscaler-group=GROUP` and `autoscaler-worker=NAME`, which
//! is how it finds them among the nodes: it only ever drains or stops workers it started.

mod command;
pub mod providers;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use escher_proto::{Amount, ClusterStatus, NodeId, ResourceSet, TaskState, TaskSummary};
use serde::{Deserialize, Serialize};

pub use command::AutoscalerCommand;
pub use providers::{DockerProvider, Provider, ProviderError, SlurmProvider, WorkerLaunch};

/// The label every worker of an autoscaler carries: its group.
pub const GROUP_LABEL: &str = "autoscaler-group";
/// The label every worker of an autoscaler carries: the name it was launched under.
pub const WORKER_LABEL: &str = "autoscaler-worker";

/// How the autoscaler sizes its group.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The fewest workers the group keeps, idle or not.
    pub min_workers: usize,
    /// The most workers the group has at once (running and starting).
    pub max_workers: usize,
    /// What one worker offers (its `--resources`, `--cpus`, `--memory`): a pending task that
    /// does not fit in it is not demand this group can meet.
    pub worker_shape: ResourceSet,
    /// How long a task must have been pending before it counts as demand.
    pub pending_for: Duration,
    /// How long a worker must have run nothing before it is drained and stopped.
    pub idle_for: Duration,
    /// How long a launched worker may take to join the head before it is given up.
    pub start_timeout: Duration,
    /// The most worker-seconds the group may spend in all (`None`: no limit).
    pub budget_worker_seconds: Option<f64>,
}

/// A worker the autoscaler launched, as it remembers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launched {
    /// The name it was launched under (its `autoscaler-worker` label).
    pub name: String,
    /// The provider's handle (a container name, a Slurm job id).
    pub handle: String,
    /// When it was launched, in milliseconds since the Unix epoch.
    pub launched_at_ms: u64,
    /// The node it joined as, once it has.
    pub node: Option<u64>,
    /// When it joined, once it has.
    pub joined_at_ms: Option<u64>,
    /// Since when it has been seen holding nothing, while it is.
    pub idle_since_ms: Option<u64>,
    /// Whether it has been drained (it is on its way out).
    pub draining: bool,
}

/// One thing the autoscaler decided, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Start this many workers.
    Launch(usize),
    /// Drain the node of this worker (it idled long enough).
    Drain(String),
    /// Stop this worker (drained and still idle, or never joined).
    Stop(String),
    /// Nothing to do, or nothing that can be done (the reason says which).
    Hold,
}

impl Action {
    /// Its name in a watch event's `action`.
    pub fn word(&self) -> &'static str {
        match self {
            Action::Launch(_) => "launch",
            Action::Drain(_) => "drain",
            Action::Stop(_) => "stop",
            Action::Hold => "hold",
        }
    }
}

/// An action and the sentence that explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// Why, for people.
    pub reason: String,
}

/// What the head said this tick, reduced to what [`plan`] needs.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Now, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The pending tasks: their id, what they request and when they were submitted.
    pub pending: Vec<TaskSummary>,
    /// The live nodes of this group: worker name → (node, whether it holds anything).
    pub nodes: BTreeMap<String, (NodeId, bool)>,
}

/// Whether `shape` fits in one worker of `worker`.
fn fits(shape: &ResourceSet, worker: &ResourceSet) -> bool {
    shape
        .iter()
        .all(|(name, amount)| amount <= worker.get(name.as_str()))
}

/// How many workers of `worker` the shapes fill, packed first-fit decreasing (by their largest
/// share of a worker).
fn workers_needed(shapes: &[&ResourceSet], worker: &ResourceSet) -> usize {
    let share = |s: &ResourceSet| {
        s.iter()
            .map(|(n, a)| {
                let total = worker.get(n.as_str()).as_f64();
                if total > 0.0 { a.as_f64() / total } else { 0.0 }
            })
            .fold(0.0_f64, f64::max)
    };
    let mut sorted: Vec<&ResourceSet> = shapes.to_vec();
    sorted.sort_by(|a, b| share(b).total_cmp(&share(a)));
    let mut bins: Vec<BTreeMap<String, Amount>> = Vec::new();
    for shape in sorted {
        let slot = bins.iter_mut().find(|bin| {
            shape.iter().all(|(n, a)| {
                let used = bin.get(n.as_str()).copied().unwrap_or(Amount::ZERO);
                used.checked_add(a)
                    .is_ok_and(|sum| sum <= worker.get(n.as_str()))
            })
        });
        let bin = match slot {
            Some(bin) => bin,
            None => {
                bins.push(BTreeMap::new());
                bins.last_mut().expect("just pushed")
            }
        };
        for (n, a) in shape.iter() {
            let used = bin.entry(n.as_str().to_string()).or_insert(Amount::ZERO);
            *used = used.checked_add(a).unwrap_or(Amount::MAX);
        }
    }
    bins.len()
}

/// The worker-seconds `launched` have spent by `now_ms`, with `spent_before` of workers gone.
pub fn spent(launched: &[Launched], spent_before: f64, now_ms: u64) -> f64 {
    spent_before
        + launched
            .iter()
            .map(|l| now_ms.saturating_sub(l.launched_at_ms) as f64 / 1000.0)
            .sum::<f64>()
}

/// Decides this tick's actions from the policy, what the head said and the workers launched
/// (updated in place: joins and idle times). `spent_before` is the worker-seconds of workers
/// already stopped.
pub fn plan(
    policy: &Policy,
    view: &View,
    launched: &mut [Launched],
    spent_before: f64,
) -> Vec<Decision> {
    let now = view.now_ms;
    let mut decisions = Vec::new();
    // Joins and idleness.
    for l in launched.iter_mut() {
        match view.nodes.get(&l.name) {
            Some(&(node, busy)) => {
                if l.node.is_none() {
                    l.joined_at_ms = Some(now);
                }
                l.node = Some(node.0);
                l.idle_since_ms = if busy {
                    None
                } else {
                    l.idle_since_ms.or(Some(now))
                };
            }
            None if l.node.is_some() => l.idle_since_ms = None, // gone from the head
            None => {}
        }
    }
    // Workers that never joined.
    for l in launched.iter() {
        if l.node.is_none()
            && now.saturating_sub(l.launched_at_ms) > policy.start_timeout.as_millis() as u64
        {
            decisions.push(Decision {
                action: Action::Stop(l.name.clone()),
                reason: format!(
                    "worker {} did not join the head within {}: stopping it (see the provider's logs)",
                    l.name,
                    humantime::format_duration(policy.start_timeout)
                ),
            });
        }
    }
    // Drained workers that hold nothing: stop them.
    for l in launched.iter().filter(|l| l.draining) {
        if l.idle_since_ms.is_some() || !view.nodes.contains_key(&l.name) {
            decisions.push(Decision {
                action: Action::Stop(l.name.clone()),
                reason: format!(
                    "worker {} is drained and holds nothing: stopping it",
                    l.name
                ),
            });
        }
    }
    let stopping = decisions.len();
    let active = launched.len() - stopping;

    // Demand: pending long enough, and of a shape a worker can hold.
    let old_enough = |t: &&TaskSummary| {
        t.state == TaskState::Pending
            && now.saturating_sub(t.submitted_at_ms) >= policy.pending_for.as_millis() as u64
    };
    let waiting: Vec<&TaskSummary> = view.pending.iter().filter(old_enough).collect();
    let (fitting, too_big): (Vec<&TaskSummary>, Vec<&TaskSummary>) = waiting
        .iter()
        .partition(|t| fits(&t.resources, &policy.worker_shape));
    if let Some(t) = too_big.first() {
        decisions.push(Decision {
            action: Action::Hold,
            reason: format!(
                "{} pending task(s) cannot fit in one worker of this group ({}): task {} asks {}",
                too_big.len(),
                policy.worker_shape,
                t.id,
                t.resources
            ),
        });
    }
    let shapes: Vec<&ResourceSet> = fitting.iter().map(|t| &t.resources).collect();
    let needed = if shapes.is_empty() {
        0
    } else {
        workers_needed(&shapes, &policy.worker_shape)
    };
    // Workers launched but not joined yet are demand already met.
    // Workers launched but not joined yet, and joined ones that hold nothing (the task waits
    // for something else: a label, a quota), are demand already met.
    let starting = launched.iter().filter(|l| l.node.is_none()).count();
    let idle = launched
        .iter()
        .filter(|l| l.node.is_some() && !l.draining && l.idle_since_ms.is_some())
        .count();
    let mut want = needed.saturating_sub(starting + idle);
    let to_min = policy.min_workers.saturating_sub(active);
    want = want.max(to_min);
    let room = policy.max_workers.saturating_sub(active);
    let spent_now = spent(launched, spent_before, now);
    if want > 0 {
        if room == 0 {
            decisions.push(Decision {
                action: Action::Hold,
                reason: format!(
                    "{} pending task(s) need {want} more worker(s), but the group is at its maximum of {}",
                    fitting.len(),
                    policy.max_workers
                ),
            });
        } else if let Some(budget) = policy.budget_worker_seconds.filter(|b| spent_now >= *b) {
            decisions.push(Decision {
                action: Action::Hold,
                reason: format!(
                    "{} pending task(s) need {want} more worker(s), but the budget of {budget:.0} worker-seconds is spent ({spent_now:.0})",
                    fitting.len()
                ),
            });
        } else {
            let n = want.min(room);
            let why = if needed > starting + idle {
                format!(
                    "{} task(s) pending for {} or more fit in {needed} worker(s) of {}; {starting} starting, {idle} idle",
                    fitting.len(),
                    humantime::format_duration(policy.pending_for),
                    policy.worker_shape
                )
            } else {
                format!(
                    "the group has {active} worker(s), below its minimum of {}",
                    policy.min_workers
                )
            };
            let capped = if n < want {
                format!(" (capped at the maximum of {})", policy.max_workers)
            } else {
                String::new()
            };
            decisions.push(Decision {
                action: Action::Launch(n),
                reason: format!("launching {n} worker(s): {why}{capped}"),
            });
        }
        return decisions;
    }
    // Scale down: joined workers idle for long enough, above the minimum, one decision each.
    let mut keep = active;
    for l in launched.iter().filter(|l| !l.draining && l.node.is_some()) {
        let Some(since) = l.idle_since_ms else {
            continue;
        };
        let idle = now.saturating_sub(since);
        if idle < policy.idle_for.as_millis() as u64 || !fitting.is_empty() {
            continue;
        }
        if keep <= policy.min_workers {
            break;
        }
        keep -= 1;
        decisions.push(Decision {
            action: Action::Drain(l.name.clone()),
            reason: format!(
                "worker {} (node {}) has held no task or reservation for {}: draining it, then stopping it",
                l.name,
                l.node.unwrap_or_default(),
                humantime::format_duration(Duration::from_millis(idle / 1000 * 1000))
            ),
        });
    }
    decisions
}

/// Whether a node holds anything: a running task, an actor, a reservation (each holds some of
/// a resource). A drained or idle node with every resource at zero use holds nothing.
pub fn busy(status: &ClusterStatus, node: NodeId) -> bool {
    status
        .node(node)
        .is_none_or(|n| n.resources.iter().any(|r| !r.used.is_zero()))
}

/// What `escher-autoscaler status` prints: written by the loop after every tick.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// The group.
    pub group: String,
    /// The provider's name.
    pub provider: String,
    /// When this was written, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Whether the provider can start workers now, and if not why.
    pub provider_problem: Option<String>,
    /// The head's last error, if the last tick could not read it.
    pub head_problem: Option<String>,
    /// The workers launched and not stopped.
    pub workers: Vec<Launched>,
    /// Pending tasks seen at the last tick.
    pub pending: usize,
    /// Worker-seconds spent in all.
    pub spent_worker_seconds: f64,
    /// The budget, if any.
    pub budget_worker_seconds: Option<f64>,
    /// The latest decisions, oldest first, with their times.
    pub decisions: VecDeque<(u64, Decision)>,
    /// Decisions, with when they were made, not yet taken by the head for its watch API
    /// (made while it was unreachable, or this tick): sent oldest first at the next tick the
    /// head answers, kept in the status file across a restart, at most [`DECISIONS_KEPT`].
    #[serde(default)]
    pub unsent: VecDeque<(u64, Decision)>,
}

/// How many decisions the report keeps.
pub const DECISIONS_KEPT: usize = 100;

impl Report {
    /// The report as people read it.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "group {} (provider {})", self.group, self.provider);
        match &self.provider_problem {
            Some(p) => {
                let _ = writeln!(s, "provider: CANNOT START WORKERS: {p}");
            }
            None => {
                let _ = writeln!(s, "provider: ok");
            }
        }
        if let Some(p) = &self.head_problem {
            let _ = writeln!(s, "head: unreachable: {p}");
        }
        let budget = self
            .budget_worker_seconds
            .map_or("no budget".to_string(), |b| format!("budget {b:.0}"));
        let _ = writeln!(
            s,
            "workers: {}   pending tasks: {}   spent: {:.0} worker-seconds ({budget})",
            self.workers.len(),
            self.pending,
            self.spent_worker_seconds
        );
        for w in &self.workers {
            let state = match (w.node, w.draining, w.idle_since_ms) {
                (None, _, _) => "starting".to_string(),
                (Some(_), true, _) => "draining".to_string(),
                (Some(_), false, Some(since)) => {
                    format!("idle {}s", self.at_ms.saturating_sub(since) / 1000)
                }
                (Some(_), false, None) => "busy".to_string(),
            };
            let node = w.node.map_or("-".to_string(), |n| n.to_string());
            let _ = writeln!(
                s,
                "  {:<28} node {:<5} {:<12} {}",
                w.name, node, state, w.handle
            );
        }
        if !self.unsent.is_empty() {
            let _ = writeln!(
                s,
                "decisions not yet recorded in the head (sent when it answers): {}",
                self.unsent.len()
            );
        }
        let _ = writeln!(s, "decisions (latest last):");
        for (at, d) in &self.decisions {
            let when = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_millis(*at),
            );
            let _ = writeln!(s, "  {when}  {}", d.reason);
        }
        s
    }
}

#[cfg(test)]
mod tests;

/// What the loop needs besides the policy.
#[derive(Debug, Clone)]
pub struct Config {
    /// The sizing policy.
    pub policy: Policy,
    /// The group: its workers' `autoscaler-group` label and their names' prefix.
    pub group: String,
    /// The head's URL(s) as the workers reach them.
    pub worker_head: String,
    /// The workers' resources beyond CPU and memory, `K=V,...`.
    pub worker_resources: String,
    /// The workers' CPUs.
    pub worker_cpus: Option<u32>,
    /// The workers' memory in MiB.
    pub worker_memory_mib: Option<u64>,
    /// More labels for the workers, `K=V,...`.
    pub worker_labels: String,
    /// Where the report goes after every tick (and is read back at a restart).
    pub status_file: std::path::PathBuf,
    /// The pause between ticks.
    pub interval: Duration,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Report {
    /// Adds a decision, unless it repeats the latest one's sentence (a hold that lasts).
    fn record(&mut self, at: u64, decision: Decision) {
        if self
            .decisions
            .back()
            .is_some_and(|(_, d)| d.reason == decision.reason)
        {
            return;
        }
        println!(
            "{} {}",
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(at)),
            decision.reason
        );
        self.unsent.push_back((at, decision.clone()));
        while self.unsent.len() > DECISIONS_KEPT {
            self.unsent.pop_front();
        }
        self.decisions.push_back((at, decision));
        while self.decisions.len() > DECISIONS_KEPT {
            self.decisions.pop_front();
        }
    }

    /// Reads a report written before (the workers a previous run launched are adopted).
    pub fn read(path: &std::path::Path) -> anyhow::Result<Report> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not an autoscaler status: {e}", path.display()))
    }

    fn write(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}

/// Runs the autoscaler until `stop` resolves: a tick every `config.interval`. The workers it
/// launched keep running after it stops (a restart adopts them from the status file).
pub async fn run(
    client: escher_client::Client,
    provider: std::sync::Arc<dyn Provider>,
    config: Config,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut report = match Report::read(&config.status_file) {
        Ok(r) if r.group == config.group => r,
        _ => Report::default(),
    };
    report.group = config.group.clone();
    report.provider = provider.name().to_string();
    report.budget_worker_seconds = config.policy.budget_worker_seconds;
    let mut launched: Vec<Launched> = std::mem::take(&mut report.workers);
    let mut spent_before = report.spent_worker_seconds - spent(&launched, 0.0, report.at_ms);
    if !spent_before.is_finite() || spent_before < 0.0 {
        spent_before = 0.0;
    }
    let mut seq: u64 = 0;
    tokio::pin!(stop);
    loop {
        let now = now_ms();
        let checked = {
            let p = provider.clone();
            tokio::task::spawn_blocking(move || p.check()).await?
        };
        let problem = checked.err().map(|e| e.0);
        if let Some(p) = &problem
            && report.provider_problem.as_ref() != Some(p)
        {
            // Said once when it starts (and again if it changes), for the status and watchers.
            let reason = format!("the {} provider cannot start workers: {p}", provider.name());
            report.record(
                now,
                Decision {
                    action: Action::Hold,
                    reason,
                },
            );
        }
        report.provider_problem = problem;
        let observed = async {
            let status = client.cluster_status().await?;
            let pending = client
                .list_tasks(Some(TaskState::Pending), Some(10_000))
                .await?;
            Ok::<_, escher_client::ClientError>((status, pending))
        }
        .await;
        match observed {
            Err(e) => {
                if report.head_problem.is_none() {
                    // A decision of its own: nothing is launched, drained or stopped while the
                    // head cannot say what it needs. Sent to the head once it answers.
                    let reason = format!(
                        "the head is unreachable ({e}): launching, draining and stopping nothing \
                         until it answers"
                    );
                    report.record(
                        now,
                        Decision {
                            action: Action::Hold,
                            reason,
                        },
                    );
                }
                report.head_problem = Some(e.to_string());
            }
            Ok((status, pending)) => {
                report.head_problem = None;
                let mut view = View {
                    now_ms: now,
                    pending,
                    nodes: BTreeMap::new(),
                };
                for n in status.nodes.iter().filter(|n| n.alive) {
                    if n.labels.get(GROUP_LABEL) != Some(config.group.as_str()) {
                        continue;
                    }
                    if let Some(name) = n.labels.get(WORKER_LABEL) {
                        view.nodes
                            .insert(name.to_string(), (n.id, busy(&status, n.id)));
                    }
                }
                report.pending = view.pending.len();
                for decision in plan(&config.policy, &view, &mut launched, spent_before) {
                    apply(
                        &client,
                        &provider,
                        &config,
                        &mut launched,
                        &mut spent_before,
                        &mut seq,
                        &mut report,
                        now,
                        decision,
                    )
                    .await;
                }
            }
        }
        let source = format!("autoscaler/{}", config.group);
        announce(&mut report.unsent, now, |action, reason| {
            let client = client.clone();
            let source = source.clone();
            async move { client.record_decision(&source, action, &reason).await }
        })
        .await;
        report.at_ms = now;
        report.spent_worker_seconds = spent(&launched, spent_before, now);
        report.workers = launched.clone();
        if let Err(e) = report.write(&config.status_file) {
            tracing::warn!("cannot write {}: {e}", config.status_file.display());
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(config.interval) => {}
        }
    }
    Ok(())
}

/// Sends the decisions not yet recorded (`queue`, oldest first) to the head, which streams
/// each to watchers as a `decision` event from `autoscaler/GROUP`, through `send(action,
/// reason)`. A decision made before this tick's time `now` (while the head was unreachable)
/// says when it was made. It stops at the first that the head could not be reached for,
/// keeping it and the rest for the next tick; one the head refuses (a group on a data format
/// before 6) is dropped with a warning, as retrying cannot help (the status file keeps it).
pub async fn announce<F, Fut>(queue: &mut VecDeque<(u64, Decision)>, now: u64, mut send: F)
where
    F: FnMut(&'static str, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), escher_client::ClientError>>,
{
    while let Some((at, decision)) = queue.front() {
        let mut reason = decision.reason.clone();
        if *at < now {
            let when = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_millis(*at),
            );
            reason = format!("(decided at {when}, while the head was unreachable) {reason}");
        }
        if reason.len() > escher_proto::types::MAX_DECISION_REASON {
            let mut end = escher_proto::types::MAX_DECISION_REASON - 3;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
            reason.push_str("...");
        }
        match send(decision.action.word(), reason.clone()).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => {
                tracing::warn!("the head did not take the decision ({reason}) yet: {e}");
                return;
            }
            Err(e) => {
                tracing::warn!("the head refused the decision ({reason}) for watchers: {e}");
            }
        }
        queue.pop_front();
    }
}

#[allow(clippy::too_many_arguments)]
async fn apply(
    client: &escher_client::Client,
    provider: &std::sync::Arc<dyn Provider>,
    config: &Config,
    launched: &mut Vec<Launched>,
    spent_before: &mut f64,
    seq: &mut u64,
    report: &mut Report,
    now: u64,
    decision: Decision,
) {
    match &decision.action {
        Action::Hold => report.record(now, decision),
        Action::Launch(n) => {
            if let Some(problem) = &report.provider_problem {
                let reason = format!(
                    "{} — but the {} provider cannot start workers: {problem}",
                    decision.reason,
                    provider.name()
                );
                report.record(
                    now,
                    Decision {
                        action: Action::Hold,
                        reason,
                    },
                );
                return;
            }
            report.record(now, decision.clone());
            for _ in 0..*n {
                *seq += 1;
                let name = format!("{}-{}-{}", config.group, now / 1000, seq);
                let mut labels = format!("{GROUP_LABEL}={},{WORKER_LABEL}={name}", config.group);
                if !config.worker_labels.is_empty() {
                    labels = format!("{labels},{}", config.worker_labels);
                }
                let launch = WorkerLaunch {
                    name: name.clone(),
                    head: config.worker_head.clone(),
                    labels,
                    resources: config.worker_resources.clone(),
                    cpus: config.worker_cpus,
                    memory_mib: config.worker_memory_mib,
                };
                let p = provider.clone();
                let started = tokio::task::spawn_blocking(move || p.start(&launch))
                    .await
                    .unwrap_or_else(|e| Err(ProviderError(e.to_string())));
                match started {
                    Ok(handle) => launched.push(Launched {
                        name,
                        handle,
                        launched_at_ms: now,
                        node: None,
                        joined_at_ms: None,
                        idle_since_ms: None,
                        draining: false,
                    }),
                    Err(e) => {
                        report.provider_problem = Some(e.0.clone());
                        let reason = format!("could not start worker {name}: {e}");
                        report.record(
                            now,
                            Decision {
                                action: Action::Hold,
                                reason,
                            },
                        );
                        break;
                    }
                }
            }
        }
        Action::Drain(name) => {
            let Some(l) = launched.iter_mut().find(|l| &l.name == name) else {
                return;
            };
            let Some(node) = l.node else { return };
            match client.drain(NodeId(node)).await {
                Ok(()) => {
                    l.draining = true;
                    // Idle is measured again after the drain: a task placed between the
                    // status read and the drain runs to its end before the worker stops.
                    l.idle_since_ms = None;
                    report.record(now, decision);
                }
                Err(e) => {
                    let reason = format!("could not drain worker {name} (node {node}): {e}");
                    report.record(
                        now,
                        Decision {
                            action: Action::Hold,
                            reason,
                        },
                    );
                }
            }
        }
        Action::Stop(name) => {
            let Some(i) = launched.iter().position(|l| &l.name == name) else {
                return;
            };
            let handle = launched[i].handle.clone();
            let p = provider.clone();
            let stopped = tokio::task::spawn_blocking(move || p.stop(&handle))
                .await
                .unwrap_or_else(|e| Err(ProviderError(e.to_string())));
            match stopped {
                Ok(()) => {
                    let l = launched.remove(i);
                    *spent_before += now.saturating_sub(l.launched_at_ms) as f64 / 1000.0;
                    report.record(now, decision);
                }
                Err(e) => {
                    let reason = format!("could not stop worker {name}: {e}");
                    report.record(
                        now,
                        Decision {
                            action: Action::Hold,
                            reason,
                        },
                    );
                }
            }
        }
    }
}
