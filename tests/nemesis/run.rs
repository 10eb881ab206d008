//! A run: start a [`NetCluster`], put it under load from several clients that record their
//! history, inject the schedule's nemeses one after the other (each healed before the next),
//! let everything settle, collect what the head says, check the history, and measure.
//!
//! The load: three clients submit command tasks (most 0.3–1.2 s of work, one in five 5–10 s;
//! `cpu=1`, up to 20 retries) under keys of their own (the task's name), two add small deltas to a counter (a
//! resource on the anchor worker's node, a worker no nemesis touches) while a third reads
//! it, and one reads the results of finished tasks. Every call is bounded by [`OP_TIMEOUT`];
//! a call that hits that bound has an unknown outcome. Each status read (the counter's reader
//! reads it every 250 ms) also records every node's capacity, so that the checker knows what
//! each node had over time; once the run healed, the head is asked for every task's attempts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use escher::types::{Capacity, ClusterStatus, NodeId, NodeSpec, TaskId, TaskStatus};
use escher::{Client, ClientError, Task};
use tokio_util::sync::CancellationToken;

use super::checker::reruns::runs_after_an_end;
use super::checker::{self, Anomaly, spans};
use super::cluster::{NetCluster, Settings};
use super::history::{
    CapacitySample, CounterAction, CounterOp, FinalTask, HeadAttempt, History, Micros, Outcome,
    ResultRead, Submit, TASK_SCRIPT, now_us, parse_exec_log,
};
use super::nemeses::{self, Nemesis};

/// The bound on one client call.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The counter the clients write.
const COUNTER: &str = "nemesis-counter";

/// What to inject, and for how long.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// `short` or `long`.
    pub name: String,
    /// The nemeses, in order.
    pub steps: Vec<Nemesis>,
    /// How long each fault is held.
    pub hold: Duration,
    /// How long the cluster runs healed between faults.
    pub rest: Duration,
    /// How long, after the last fault, tasks may take to end before the check.
    pub quiesce: Duration,
}

impl Schedule {
    /// The schedule `ESCHER_NEMESIS_SCHEDULE` names (`short`, the default, or `long`):
    /// `short` injects each of `short_list` once, for 6 s; `long` injects every nemesis, in
    /// a shuffled order, `ESCHER_NEMESIS_ROUNDS` times (3), for 15 s each. `ESCHER_NEMESES`
    /// (names, comma-separated) replaces the list of either.
    pub fn from_env(short_list: &[Nemesis]) -> anyhow::Result<Schedule> {
        let name = std::env::var("ESCHER_NEMESIS_SCHEDULE").unwrap_or_else(|_| "short".into());
        let list: Option<Vec<Nemesis>> = match std::env::var("ESCHER_NEMESES") {
            Ok(names) if !names.trim().is_empty() => Some(
                names
                    .split(',')
                    .map(|n| Nemesis::parse(n.trim()))
                    .collect::<anyhow::Result<_>>()?,
            ),
            _ => None,
        };
        match name.as_str() {
            "short" => Ok(Schedule {
                name,
                steps: list.unwrap_or_else(|| short_list.to_vec()),
                hold: Duration::from_secs(6),
                rest: Duration::from_secs(4),
                quiesce: Duration::from_secs(45),
            }),
            "long" => {
                let rounds: usize = std::env::var("ESCHER_NEMESIS_ROUNDS")
                    .ok()
                    .map(|r| r.parse().context("ESCHER_NEMESIS_ROUNDS: a number"))
                    .transpose()?
                    .unwrap_or(3);
                let base = list.unwrap_or_else(|| Nemesis::ALL.to_vec());
                let mut rng = fastrand::Rng::with_seed(seed());
                let mut steps = Vec::new();
                for _ in 0..rounds {
                    let mut round = base.clone();
                    rng.shuffle(&mut round);
                    steps.extend(round);
                }
                Ok(Schedule {
                    name,
                    steps,
                    hold: Duration::from_secs(15),
                    rest: Duration::from_secs(8),
                    quiesce: Duration::from_secs(90),
                })
            }
            other => anyhow::bail!("ESCHER_NEMESIS_SCHEDULE={other}: say short or long"),
        }
    }
}

/// The seed of the run's randomness: `ESCHER_NEMESIS_SEED`, else the pid.
pub fn seed() -> u64 {
    std::env::var("ESCHER_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::from(std::process::id()))
}

/// One fault as it was injected.
#[derive(Debug, Clone)]
pub struct Window {
    /// Which nemesis.
    pub nemesis: Nemesis,
    /// What it did.
    pub what: String,
    /// The worker's node, for a worker nemesis.
    pub node: Option<u64>,
    /// When it was injected.
    pub inject: Micros,
    /// When it was healed.
    pub heal: Micros,
    /// What healing found.
    pub healed: String,
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    /// The history.
    pub history: History,
    /// The faults.
    pub windows: Vec<Window>,
    /// What the checker found.
    pub anomalies: Vec<Anomaly>,
    /// Replicas that did not come back after a fault healed.
    pub findings: Vec<String>,
    /// The table of operations, faults, anomalies and timings.
    pub table: String,
}

#[derive(Debug, Default)]
struct Recorder {
    submits: Vec<Submit>,
    counters: Vec<CounterOp>,
    reads: Vec<ResultRead>,
    capacity: Vec<CapacitySample>,
}

type Rec = Arc<Mutex<Recorder>>;

/// What the client was told, as an outcome: [`ClientError::UnknownOutcome`] (the client says
/// the write may or may not have been applied) is `Unknown`; every other error is taken at its
/// word as a failure, so that a write reported failed that happened anyway is an anomaly
/// (a client that cannot learn whether a write committed must say so, never report a failure).
fn classify<T>(error: &ClientError) -> Outcome<T> {
    match error {
        ClientError::UnknownOutcome { .. } => Outcome::Unknown(error.to_string()),
        _ => Outcome::Fail(error.to_string()),
    }
}

async fn bounded<T>(call: impl std::future::Future<Output = Result<T, ClientError>>) -> Outcome<T> {
    match tokio::time::timeout(OP_TIMEOUT, call).await {
        Ok(Ok(v)) => Outcome::Ok(v),
        Ok(Err(e)) => classify(&e),
        Err(_) => Outcome::Unknown(format!("no answer within {OP_TIMEOUT:?}")),
    }
}

/// Sleeps `ms` milliseconds unless cancelled first; whether it was cancelled.
async fn pause(cancel: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => true,
        _ = tokio::time::sleep(Duration::from_millis(ms)) => false,
    }
}

async fn submitter(k: u32, client: Client, rec: Rec, cancel: CancellationToken, log: String) {
    let mut rng = fastrand::Rng::with_seed(seed() ^ u64::from(k));
    let mut seq = 0u64;
    while !cancel.is_cancelled() {
        seq += 1;
        let key = format!("nem-{k}-{seq}");
        // Most tasks are short; one in five outlasts a fault, so that a fault finds tasks
        // running on its worker and their retries could overlap them.
        let work = if rng.u8(0..5) == 0 {
            5_000 + rng.u64(0..5_000)
        } else {
            300 + rng.u64(0..900)
        };
        let task = Task::command(["bash", "-c", TASK_SCRIPT])
            .name(key.clone())
            .env("NEMLOG", log.clone())
            .env("WORK_MS", work.to_string())
            .resources_str("cpu=1")
            .max_retries(20);
        let invoke = now_us();
        let outcome = bounded(client.submit(task)).await;
        let outcome = match outcome {
            Outcome::Ok(r) => Outcome::Ok(r.id().0),
            Outcome::Fail(e) => Outcome::Fail(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        };
        rec.lock().unwrap().submits.push(Submit {
            client: k,
            key,
            invoke,
            complete: now_us(),
            outcome,
            requires: [("cpu".to_string(), 1)].into(),
        });
        if pause(&cancel, 600 + rng.u64(0..600)).await {
            break;
        }
    }
}

async fn counter_writer(k: u32, client: Client, node: NodeId, rec: Rec, cancel: CancellationToken) {
    let mut rng = fastrand::Rng::with_seed(seed() ^ u64::from(k) << 8);
    while !cancel.is_cancelled() {
        let delta = rng.i64(1..=3);
        let invoke = now_us();
        let outcome = bounded(client.adjust_resource(COUNTER, delta, NodeSpec::Node(node))).await;
        let outcome = match outcome {
            Outcome::Ok(_) => Outcome::Ok(0),
            Outcome::Fail(e) => Outcome::Fail(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        };
        rec.lock().unwrap().counters.push(CounterOp {
            client: k,
            counter: COUNTER.into(),
            action: CounterAction::Add(delta),
            invoke,
            complete: now_us(),
            outcome,
        });
        if pause(&cancel, 100 + rng.u64(0..200)).await {
            break;
        }
    }
}

/// The counter's value in a status: its capacity in whole units, 0 when absent.
fn counter_value(status: &escher::types::ClusterStatus, node: NodeId) -> Outcome<i64> {
    let Some(n) = status.node(node) else {
        return Outcome::Fail(format!("node {node} is not in the status"));
    };
    match n.resource(COUNTER).map(|r| r.total) {
        None => Outcome::Ok(0),
        Some(Capacity::Finite(a)) => Outcome::Ok((a.raw() / 10_000) as i64),
        Some(other) => Outcome::Fail(format!("the counter is {other:?}")),
    }
}

/// Every node's capacity in a status read called at `invoke` that returned at `complete`, in
/// whole units (rounded down: the tasks require whole units).
fn capacity_samples(
    status: &ClusterStatus,
    invoke: Micros,
    complete: Micros,
) -> Vec<CapacitySample> {
    status
        .nodes
        .iter()
        .map(|n| CapacitySample {
            node: n.id.0,
            invoke,
            complete,
            totals: n
                .resources
                .iter()
                .map(|r| {
                    let total = match r.total {
                        Capacity::Finite(a) => a.raw() / 10_000,
                        Capacity::Unbounded => u64::MAX,
                    };
                    (r.name.as_str().to_string(), total)
                })
                .collect(),
        })
        .collect()
}

/// A read of the counter, and every node's capacity in the status it read.
async fn read_counter(k: u32, client: &Client, node: NodeId) -> (CounterOp, Vec<CapacitySample>) {
    let invoke = now_us();
    let status = bounded(client.cluster_status()).await;
    let complete = now_us();
    let (outcome, capacity) = match status {
        Outcome::Ok(status) => (
            counter_value(&status, node),
            capacity_samples(&status, invoke, complete),
        ),
        Outcome::Fail(e) => (Outcome::Fail(e), Vec::new()),
        Outcome::Unknown(e) => (Outcome::Unknown(e), Vec::new()),
    };
    let op = CounterOp {
        client: k,
        counter: COUNTER.into(),
        action: CounterAction::Read,
        invoke,
        complete,
        outcome,
    };
    (op, capacity)
}

async fn counter_reader(k: u32, client: Client, node: NodeId, rec: Rec, cancel: CancellationToken) {
    while !cancel.is_cancelled() {
        let (op, capacity) = read_counter(k, &client, node).await;
        {
            let mut r = rec.lock().unwrap();
            r.counters.push(op);
            r.capacity.extend(capacity);
        }
        if pause(&cancel, 250).await {
            break;
        }
    }
}

fn result_read(status: &TaskStatus, at: Micros) -> ResultRead {
    ResultRead {
        task: status.id.0,
        at,
        state: format!("{:?}", status.state),
        attempt: status.attempt,
        node: status.node.map(|n| n.0),
        result: status.result.as_ref().map(|r| format!("{r:?}")),
    }
}

async fn result_reader(client: Client, rec: Rec, cancel: CancellationToken) {
    while !cancel.is_cancelled() {
        let ids: Vec<TaskId> = {
            let r = rec.lock().unwrap();
            r.submits
                .iter()
                .rev()
                .filter_map(|s| match s.outcome {
                    Outcome::Ok(id) => Some(TaskId(id)),
                    _ => None,
                })
                .take(30)
                .collect()
        };
        if !ids.is_empty() {
            let n = ids.len();
            let call = client.wait(ids, n, Some(Duration::from_millis(1)));
            if let Outcome::Ok((ready, _)) = bounded(call).await {
                let at = now_us();
                let mut r = rec.lock().unwrap();
                for s in ready.iter().filter(|s| s.state.is_terminal()) {
                    r.reads.push(result_read(s, at));
                }
            }
        }
        if pause(&cancel, 1000).await {
            break;
        }
    }
}

/// Runs `schedule` on a fresh cluster and checks the history.
pub async fn run(schedule: &Schedule) -> anyhow::Result<Report> {
    let settings = Settings {
        heads: 3,
        workers: 4,
        resources: "cpu=2,memory=512".into(),
        heartbeat_interval_ms: 250,
        heartbeat_timeout_ms: 3000,
        small_disk: Some(2),
    };
    let mut cluster = NetCluster::start(&settings).await?;
    let shared = cluster.dir().join("shared");
    std::fs::create_dir_all(&shared)?;
    let log = shared.join("exec.log");
    std::fs::write(&log, "")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777))?;
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666))?;
    }
    let log_s = log.display().to_string();
    let anchor_name = cluster.worker_name(settings.workers - 1).to_string();
    let anchor = cluster.node_of(&anchor_name).await?;
    let rec: Rec = Arc::default();

    // What every node has before any task runs.
    let setup = cluster.client()?;
    let invoke = now_us();
    let status = match bounded(setup.cluster_status()).await {
        Outcome::Ok(status) => status,
        Outcome::Fail(e) | Outcome::Unknown(e) => anyhow::bail!("the first status read: {e}"),
    };
    rec.lock().unwrap().capacity = capacity_samples(&status, invoke, now_us());

    // The counter starts at 1 (a capacity of 0 would delete the resource).
    let invoke = now_us();
    let outcome = match bounded(setup.set_resource(COUNTER, 1u64, NodeSpec::Node(anchor))).await {
        Outcome::Ok(_) => Outcome::Ok(0),
        Outcome::Fail(e) => anyhow::bail!("setting the counter up failed: {e}"),
        Outcome::Unknown(e) => anyhow::bail!("setting the counter up: {e}"),
    };
    rec.lock().unwrap().counters.push(CounterOp {
        client: 0,
        counter: COUNTER.into(),
        action: CounterAction::Set(1),
        invoke,
        complete: now_us(),
        outcome,
    });

    let cancel = CancellationToken::new();
    let mut load = Vec::new();
    for k in 1..=3 {
        let c = cluster.client()?;
        load.push(tokio::spawn(submitter(
            k,
            c,
            Arc::clone(&rec),
            cancel.clone(),
            log_s.clone(),
        )));
    }
    for k in 11..=12 {
        let c = cluster.client()?;
        load.push(tokio::spawn(counter_writer(
            k,
            c,
            anchor,
            Arc::clone(&rec),
            cancel.clone(),
        )));
    }
    let c = cluster.client()?;
    load.push(tokio::spawn(counter_reader(
        21,
        c,
        anchor,
        Arc::clone(&rec),
        cancel.clone(),
    )));
    let c = cluster.client()?;
    load.push(tokio::spawn(result_reader(
        c,
        Arc::clone(&rec),
        cancel.clone(),
    )));

    tokio::time::sleep(schedule.rest).await;
    let mut windows = Vec::new();
    let mut findings = Vec::new();
    for (turn, nemesis) in schedule.steps.iter().enumerate() {
        let mut worker = turn % (settings.workers - 1);
        if nemesis.targets_worker()
            && let Some(busy) = busy_worker(&cluster, &log, settings.workers - 1).await
        {
            worker = busy;
        }
        let injected = nemeses::inject(&mut cluster, *nemesis, worker).await;
        let injected = match injected {
            Ok(i) => i,
            Err(e) => {
                cancel.cancel();
                return Err(e.context(format!("injecting {}", nemesis.name())));
            }
        };
        let inject = now_us();
        eprintln!("[nemesis] {}: {}", nemesis.name(), injected.what);
        tokio::time::sleep(schedule.hold).await;
        let healed = nemeses::heal(&mut cluster, &injected)
            .await
            .with_context(|| format!("healing {}", nemesis.name()))?;
        eprintln!(
            "[nemesis] {} healed. {} {:?}",
            nemesis.name(),
            healed.note,
            healed.findings
        );
        findings.extend(healed.findings.iter().cloned());
        windows.push(Window {
            nemesis: *nemesis,
            what: injected.what.clone(),
            node: injected.node,
            inject,
            heal: now_us(),
            healed: healed.note,
        });
        tokio::time::sleep(schedule.rest).await;
    }
    cancel.cancel();
    let load_end = now_us();
    for task in load {
        let _ = task.await;
    }

    // Everything healed: every worker back, a leader; then the tasks get time to end.
    cluster.net.heal_all()?;
    cluster.wait_leader().await?;
    for i in 0..settings.workers {
        let name = cluster.worker_name(i).to_string();
        cluster.wait_worker_alive(&name).await?;
    }
    let client = cluster.client()?;
    let deadline = tokio::time::Instant::now() + schedule.quiesce;
    let mut tasks = BTreeMap::new();
    loop {
        if let Outcome::Ok(list) = bounded(client.list_tasks(None, None)).await {
            tasks = list
                .into_iter()
                .map(|t| {
                    let f = FinalTask {
                        id: t.id.0,
                        key: t.name,
                        state: format!("{:?}", t.state),
                        reason: t.reason,
                        attempt: t.attempt,
                        finished_at: t.finished_at_ms.map(|ms| ms * 1_000),
                        attempts: None,
                    };
                    (f.id, f)
                })
                .collect::<BTreeMap<u64, FinalTask>>();
            let settled = tasks
                .values()
                .all(|t| t.ended() || (t.state == "Pending" && t.reason.is_some()));
            if settled {
                break;
            }
        }
        if tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The final reads: every finished task's status, and the counter.
    let finished: Vec<TaskId> = tasks
        .values()
        .filter(|t| t.ended())
        .map(|t| TaskId(t.id))
        .collect();
    for chunk in finished.chunks(500) {
        let n = chunk.len();
        let call = client.wait(chunk.iter().copied(), n, Some(Duration::from_secs(2)));
        if let Outcome::Ok((ready, _)) = bounded(call).await {
            let at = now_us();
            let mut r = rec.lock().unwrap();
            for s in ready.iter().filter(|s| s.state.is_terminal()) {
                r.reads.push(result_read(s, at));
            }
        }
    }
    let (final_read, capacity) = read_counter(0, &client, anchor).await;
    {
        let mut r = rec.lock().unwrap();
        r.counters.push(final_read);
        r.capacity.extend(capacity);
    }
    for t in tasks.values_mut() {
        head_record(&client, t).await?;
    }

    let status = cluster.status().await?;
    let anchor_left = status
        .node(anchor)
        .and_then(|n| n.left_because.clone())
        .map(|why| format!("the anchor node {anchor} left once: {why}"));
    let execs = parse_exec_log(&std::fs::read_to_string(&log)?)?;
    let recorded = std::mem::take(&mut *rec.lock().unwrap());
    let history = History {
        submits: recorded.submits,
        counters: recorded.counters,
        reads: recorded.reads,
        execs,
        tasks,
        capacity: recorded.capacity,
    };
    let anomalies = checker::check(&history);
    let mut table = table(schedule, &history, &windows, &anomalies, load_end);
    if let Some(note) = anchor_left {
        let _ = writeln!(table, "note: {note}");
    }
    if !findings.is_empty() {
        let _ = writeln!(table, "\nrecovery findings (outside the history's rules):");
        for f in &findings {
            let _ = writeln!(table, "  {f}");
        }
    }
    if !anomalies.is_empty() {
        let _ = writeln!(table, "\nanomalies:");
        for a in &anomalies {
            let _ = writeln!(table, "  [{}] {a}", attribute(&windows, a.at));
        }
    }
    Ok(Report {
        history,
        windows,
        anomalies,
        findings,
        table,
    })
}

/// Task `t` as the head records it now, with every attempt it sent: one status, so that its
/// state, attempts and times agree. A few tries (the cluster healed, but a leader may still
/// move); then the run fails, naming the task.
async fn head_record(client: &Client, t: &mut FinalTask) -> anyhow::Result<()> {
    let mut tries = 0;
    let info = loop {
        match bounded(client.task_info(TaskId(t.id))).await {
            Outcome::Ok(info) => break info,
            Outcome::Fail(e) | Outcome::Unknown(e) => {
                tries += 1;
                if tries == 5 {
                    anyhow::bail!("asking the head for task {}'s attempts: {e}", t.id);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let status = &info.status;
    t.state = format!("{:?}", status.state);
    t.reason = status.reason.clone().or(t.reason.take());
    t.attempt = status.attempt;
    t.finished_at = status.finished_at_ms.map(|ms| ms * 1_000);
    t.attempts = (!status.evicted).then(|| {
        info.attempts
            .iter()
            .map(|a| HeadAttempt {
                attempt: a.attempt,
                node: a.node.0,
                sent_at: a.started_at_ms * 1_000,
                ended: a.ended.clone(),
            })
            .collect()
    });
    Ok(())
}

/// The worker (index, among the first `candidates`) running the most long attempts now (in
/// their second second or later, still beating), so that a worker fault finds tasks to fence;
/// waits a few seconds for one, else `None`.
async fn busy_worker(
    cluster: &NetCluster,
    log: &std::path::Path,
    candidates: usize,
) -> Option<usize> {
    let mut nodes = Vec::new();
    for i in 0..candidates {
        nodes.push(
            cluster
                .node_named(cluster.worker_name(i))
                .await
                .ok()
                .map(|n| n.0),
        );
    }
    for _ in 0..24 {
        let execs = parse_exec_log(&std::fs::read_to_string(log).ok()?).ok()?;
        let history = History {
            execs,
            ..History::default()
        };
        let all = spans(&history);
        let now = now_us();
        let mut busiest = (0, None);
        for (i, node) in nodes.iter().enumerate() {
            let long = all
                .iter()
                .filter(|s| Some(s.node) == *node && !s.ended)
                .filter(|s| {
                    now.saturating_sub(s.last) < 600_000 && now.saturating_sub(s.start) > 1_500_000
                })
                .count();
            if long > busiest.0 {
                busiest = (long, Some(i));
            }
        }
        if busiest.1.is_some() {
            return busiest.1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// The nemesis in force (or last injected) when `at` happened.
fn attribute(windows: &[Window], at: Micros) -> String {
    if at == 0 {
        return "unattributed".into();
    }
    windows
        .iter()
        .rev()
        .find(|w| w.inject <= at)
        .map_or("before any fault".into(), |w| {
            format!(
                "{} injected {:.1} s before",
                w.nemesis.name(),
                (at - w.inject) as f64 / 1e6
            )
        })
}

/// The longest time in `[from, to)` without an acknowledged write, in seconds.
fn longest_gap(acks: &[Micros], from: Micros, to: Micros) -> f64 {
    let mut last = from;
    let mut gap = 0;
    for &a in acks.iter().filter(|a| **a >= from && **a < to) {
        gap = gap.max(a - last);
        last = a;
    }
    gap = gap.max(to.saturating_sub(last));
    gap as f64 / 1e6
}

/// For a worker nemesis, per task that was running on the worker's node when it was
/// injected and ran again elsewhere: the seconds from the injection to the next attempt's
/// start, and from the fenced attempt's last record to that start (negative: they overlapped).
fn retry_delays(h: &History, w: &Window) -> Vec<(f64, f64)> {
    let Some(node) = w.node else {
        return Vec::new();
    };
    let all = spans(h);
    let mut out = Vec::new();
    let running = |s: &&super::checker::Span| {
        s.node == node && s.start <= w.inject && s.last + 400_000 >= w.inject
    };
    for s in all.iter().filter(running) {
        let next = all
            .iter()
            .filter(|o| o.task == s.task && o.attempt > s.attempt)
            .map(|o| o.start)
            .min();
        if let Some(next) = next {
            out.push((
                (next as f64 - w.inject as f64) / 1e6,
                (next as f64 - s.last as f64) / 1e6,
            ));
        }
    }
    out
}

/// The run's table: operations, faults, anomalies, and per nemesis the longest window
/// without an acknowledged write and the time from the fault to the fenced tasks' retries.
fn table(
    schedule: &Schedule,
    h: &History,
    windows: &[Window],
    anomalies: &[Anomaly],
    load_end: Micros,
) -> String {
    let tally = |outcomes: Vec<&Outcome<u64>>| {
        let mut c = (0, 0, 0);
        for o in outcomes {
            match o {
                Outcome::Ok(_) => c.0 += 1,
                Outcome::Fail(_) => c.1 += 1,
                Outcome::Unknown(_) => c.2 += 1,
            }
        }
        c
    };
    let tally_i = |outcomes: Vec<&Outcome<i64>>| {
        let mut c = (0, 0, 0);
        for o in outcomes {
            match o {
                Outcome::Ok(_) => c.0 += 1,
                Outcome::Fail(_) => c.1 += 1,
                Outcome::Unknown(_) => c.2 += 1,
            }
        }
        c
    };
    let submits = tally(h.submits.iter().map(|s| &s.outcome).collect());
    let writes = tally_i(
        h.counters
            .iter()
            .filter(|o| o.action != CounterAction::Read)
            .map(|o| &o.outcome)
            .collect(),
    );
    let reads = tally_i(
        h.counters
            .iter()
            .filter(|o| o.action == CounterAction::Read)
            .map(|o| &o.outcome)
            .collect(),
    );
    let mut acks: Vec<Micros> = h
        .submits
        .iter()
        .filter(|s| s.outcome.is_ok())
        .map(|s| s.complete)
        .chain(
            h.counters
                .iter()
                .filter(|o| o.action != CounterAction::Read && o.outcome.is_ok())
                .map(|o| o.complete),
        )
        .collect();
    acks.sort_unstable();
    let attempts = spans(h).len();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "schedule {} (seed {}): {} faults, each held {:?}, {:?} apart",
        schedule.name,
        seed(),
        windows.len(),
        schedule.hold,
        schedule.rest
    );
    let _ = writeln!(
        t,
        "operations: submits {} ok / {} failed / {} unknown; counter writes {} / {} / {}; \
         counter reads {} / {} / {}; results read {}; task attempts executed {attempts}",
        submits.0,
        submits.1,
        submits.2,
        writes.0,
        writes.1,
        writes.2,
        reads.0,
        reads.1,
        reads.2,
        h.reads.len()
    );
    let mut by_rule: BTreeMap<String, usize> = BTreeMap::new();
    for a in anomalies {
        *by_rule.entry(format!("{:?}", a.rule)).or_default() += 1;
    }
    let _ = writeln!(t, "anomalies: {} {by_rule:?}", anomalies.len());
    let lost: Vec<String> = runs_after_an_end(h)
        .into_iter()
        .filter_map(|r| {
            let how = r.lost_as?;
            Some(format!(
                "task {} attempt {} ended at {} on node {}, recorded as {how:?}; attempt {} on \
                 node {} from {}",
                r.ended.task,
                r.ended.attempt,
                r.ended.last,
                r.ended.node,
                r.again.attempt,
                r.again.node,
                r.again.start
            ))
        })
        .collect();
    let _ = writeln!(
        t,
        "runs again after an end whose report the head never had (at-least-once, allowed): {}",
        lost.len()
    );
    for l in &lost {
        let _ = writeln!(t, "  {l}");
    }
    let _ = writeln!(
        t,
        "| nemesis | faults | anomalies | longest window without an acknowledged write (s) | fault to fenced tasks' retry (s) |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|");
    let mut names: Vec<Nemesis> = windows.iter().map(|w| w.nemesis).collect();
    names.sort();
    names.dedup();
    for n in names {
        let mine: Vec<(usize, &Window)> = windows
            .iter()
            .enumerate()
            .filter(|(_, w)| w.nemesis == n)
            .collect();
        let mut gap: f64 = 0.0;
        let mut delays = Vec::new();
        let mut found = 0;
        for (i, w) in &mine {
            let end = windows.get(i + 1).map_or(load_end, |next| next.inject);
            gap = gap.max(longest_gap(&acks, w.inject, end));
            delays.extend(retry_delays(h, w));
            found += anomalies
                .iter()
                .filter(|a| a.at >= w.inject && a.at < end)
                .count();
        }
        let retry = if !n.targets_worker() {
            "-".to_string()
        } else if delays.is_empty() {
            "no retry".to_string()
        } else {
            let min = delays.iter().map(|d| d.0).fold(f64::MAX, f64::min);
            let max = delays.iter().map(|d| d.0).fold(f64::MIN, f64::max);
            let margin = delays.iter().map(|d| d.1).fold(f64::MAX, f64::min);
            format!(
                "{min:.1}–{max:.1} ({} tasks; the fenced attempt's last record ≥ {margin:.1} s before)",
                delays.len()
            )
        };
        let _ = writeln!(
            t,
            "| {} | {} | {found} | {gap:.1} | {retry} |",
            n.name(),
            mine.len()
        );
    }
    let _ = writeln!(t, "faults:");
    for w in windows {
        let _ = writeln!(
            t,
            "  {} at {}: {} (held {:.1} s) {}",
            w.nemesis.name(),
            w.inject,
            w.what,
            (w.heal - w.inject) as f64 / 1e6,
            w.healed
        );
    }
    t
}
