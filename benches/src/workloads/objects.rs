//! Objects: escher beside Ray, each from one Python driver of its own, in the same run, and one
//! loopback TCP stream measured here in the same run (the targets: tasks given a 1 MiB
//! argument ≥ 1.5× Ray's rate; a 100 MiB object fetched by a task on another worker ≥ Ray's
//! throughput and ≥ 50% of one TCP stream's).
//!
//! The measuring is `python/bench/objects.py --one SYSTEM` (one process per system, escher's
//! first), with the harness' own virtual environment and the `escher` package of this checkout,
//! installed as the `python` workload installs them (`python.rs`). Each system runs two workers
//! (nodes) of 2 CPUs: escher `escher.init(num_workers=2)`, Ray a `ray.cluster_utils.Cluster` of
//! two raylets, each with its object store.
//!
//! - `objects.one_mib_ref_tasks_per_s`: one 1 MiB `bytes` put once, then N tasks each given the
//!   reference (Ray: `ray.put`, `f.remote(ref)`), then one get of all;
//! - `objects.fetch_100mib_mb_per_s`: a 100 MiB NumPy array put by the driver, read by a task
//!   on the worker that does not hold it, timed by the task around its own `get`;
//! - `objects.tcp_loopback_mb_per_s`: 100 MiB through one loopback TCP stream (a tokio socket
//!   pair, 1 MiB writes), the median of three, here in the harness;
//! - `objects.same_node_1gib_read_s` and `objects.same_node_1gib_task_rss_anon_mib`: a 1 GiB
//!   NumPy array put by the driver and given, as the argument itself, to a task on the worker
//!   that holds it (no copy of the buffer, shown by time and RSS): the seconds from the call
//!   to its result, the task reading one byte of every page, and the task's
//!   private resident memory at its end. escher's worker hands the interpreter the store's
//!   sealed file, which it maps; a copy of the buffer would add 1,024 MiB to the second.
//!   Beside them `objects.same_node_1gib_put_s` (the driver's put, call to reference) and
//!   `objects.same_node_1gib_put_driver_peak_rss_growth_mib` (how much the put raised the
//!   driver's peak resident memory, the array itself already counted). Writing the buffer into
//!   a shared-memory store once is the put itself, and those pages count for the driver that
//!   wrote them (Ray's too): one write adds about 1,024 MiB, a second copy of the buffer (a
//!   pickled `bytes` beside the store's pages) about 2,048 MiB.
//!
//! - `objects.wordcount_locality_makespan_s` and `objects.wordcount_unaware_makespan_s`: the
//!   thesis' E1 WordCount on real objects (4 chunks of 32 MiB of words, one per map slot, each
//!   made by a task on a given worker and left there), one map per chunk given its chunk as its argument (placed by
//!   the locality rule) or inside a list and read with `get` in the task (no locality rule);
//!   makespans, medians of three, and per system the ratio of the two
//!   (`objects.wordcount_unaware_over_locality`, Ray's beside escher's).
//!
//! Not part of `all`: it needs PyPI (Ray) and builds the wheel. Name it:
//! `escher-bench objects --size full`.

use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Ctx;
use super::python::{install_escher, one_of, pinned};
use crate::peers::venv;
use crate::report::{Better, Figure, PeerFigure, TargetCheck, WorkloadReport, num, ratio};
use crate::size::Size;

/// The bytes of the large object and of the TCP stream.
const BIG: usize = 100 << 20;

/// Runs the objects workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let tasks = match ctx.size {
        Size::Tiny => 50,
        Size::Small => 100,
        Size::Full => 200,
    };
    let mut report = WorkloadReport::new(
        "objects",
        "objects from one Python driver: a 1 MiB argument put once, a 100 MiB fetch between \
         workers, escher beside Ray and one loopback TCP stream",
        ctx.size.as_str(),
    );
    let python = tokio::task::spawn_blocking(venv::ensure)
        .await
        .context("the benchmark venv")??;
    let installed = install_escher(&python, &ctx.out).await?;
    let script = venv::workspace_root()
        .join("python")
        .join("bench")
        .join("objects.py");
    let escher = one_of("objects", &python, &script, "escher", tasks, &ctx.out).await?;
    let ray = match one_of("objects", &python, &script, "ray", tasks, &ctx.out).await {
        Ok(values) => Some(values),
        Err(e) => {
            report
                .notes
                .push(format!("Ray did not run, so no ratio: {e:#}"));
            None
        }
    };
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(tcp_loopback_mb_per_s().await?);
    }
    streams.sort_by(f64::total_cmp);
    let tcp = streams[1];
    report.setup = json!({
        "driver": "python/bench/objects.py --one SYSTEM, one process per system, escher first",
        "escher": "escher.init(num_workers=2, resources={\"cpu\": 2})",
        "ray": format!("ray.cluster_utils.Cluster of two raylets (2 CPUs, 400 MiB object store \
                        each), Ray {}", pinned("ray")),
        "tasks": tasks,
        "big_object_bytes": BIG,
        "tcp": "one loopback TCP stream, 100 MiB in 1 MiB writes, median of 3",
        "package": installed,
    });
    let figures = [
        (
            "one_mib_ref_tasks_per_s",
            format!("{tasks} tasks given one 1 MiB object put once, by reference"),
            "tasks/s",
        ),
        (
            "fetch_100mib_mb_per_s",
            "a 100 MiB NumPy array read by a task on the worker that does not hold it".into(),
            "MiB/s",
        ),
        (
            "same_node_1gib_put_s",
            "a 1 GiB NumPy array put by the driver (call to reference)".into(),
            "s",
        ),
        (
            "same_node_1gib_put_driver_peak_rss_growth_mib",
            "the driver's peak resident memory added by that put (the array already counted)"
                .into(),
            "MiB",
        ),
        (
            "same_node_1gib_read_s",
            "a 1 GiB NumPy array argument read by a task on the worker that holds it (call to \
             result)"
                .into(),
            "s",
        ),
        (
            "same_node_1gib_task_rss_anon_mib",
            "that task's private resident memory (RssAnon) at its end".into(),
            "MiB",
        ),
        (
            "wordcount_locality_makespan_s",
            "WordCount on real objects (4 chunks of 32 MiB made on the two workers), each map \
             given its chunk's task as its argument: the locality rule places it (median of 3)"
                .into(),
            "s",
        ),
        (
            "wordcount_unaware_makespan_s",
            "the same job with each map given its chunk inside a list, read by get in the \
             task: no locality rule (median of 3)"
                .into(),
            "s",
        ),
    ];
    for (key, what, unit) in figures {
        let Some(value) = escher.get(key).and_then(Value::as_f64) else {
            bail!("objects.py printed no {key} for escher: {escher}");
        };
        let mut figure = Figure::new(format!("objects.{key}"), what, unit, value);
        if let Some(peer) = ray
            .as_ref()
            .and_then(|r| r.get(key))
            .and_then(Value::as_f64)
            && peer > 0.0
        {
            figure.peer = Some(PeerFigure {
                peer: "ray".into(),
                value: peer,
                ratio: value / peer,
            });
        }
        report.figures.push(figure);
    }
    report.figures.push(Figure::new(
        "objects.tcp_loopback_mb_per_s",
        "100 MiB through one loopback TCP stream (the harness, same run)",
        "MiB/s",
        tcp,
    ));
    // The locality rule against the same job without it, each system against itself.
    let speedup = |values: &Value| {
        let makespan = |key: &str| values.get(key).and_then(Value::as_f64);
        match (
            makespan("wordcount_locality_makespan_s"),
            makespan("wordcount_unaware_makespan_s"),
        ) {
            (Some(with), Some(without)) if with > 0.0 => Some(without / with),
            _ => None,
        }
    };
    if let Some(value) = speedup(&escher) {
        let mut figure = Figure::new(
            "objects.wordcount_unaware_over_locality",
            "WordCount's makespan without the locality rule over with it (above 1: locality \
             is faster)",
            "x",
            value,
        );
        figure.better = Better::Higher;
        if let Some(peer) = ray.as_ref().and_then(speedup) {
            figure.peer = Some(PeerFigure {
                peer: "ray".into(),
                value: peer,
                ratio: value / peer,
            });
        }
        report.figures.push(figure);
    }
    for (system, values) in [("escher", Some(&escher)), ("ray", ray.as_ref())] {
        let Some(values) = values else { continue };
        let field = |key: &str| values.get(key).cloned().unwrap_or(Value::Null);
        report.notes.push(format!(
            "{system}'s WordCount maps that ran on their chunk's worker, per job: with the \
             locality rule {}, without it {} (of {})",
            field("wordcount_locality_local_maps"),
            field("wordcount_unaware_local_maps"),
            field("wordcount_maps"),
        ));
    }
    report.detail = json!({"escher": escher, "ray": ray, "tcp_mb_per_s": streams});
    report.notes.push(
        "escher's fetch: the task's interpreter asks its worker, which asks the head where the \
         copy is, streams it from the holder's data plane over gRPC (1 MiB chunks, each with a \
         CRC-32C) into its own store, reports the copy, and hands the interpreter the sealed \
         file, which it maps (no copy into Python); Ray pulls the object into the reading \
         node's shared-memory store and maps it"
            .into(),
    );
    report.notes.push(
        "the same-node read: the reference is the task's argument itself, so escher's worker \
         hands the task's interpreter a descriptor of the store's sealed file, which it maps \
         read-only (no fetch, no copy); Ray's worker maps the object from its plasma store"
            .into(),
    );
    Ok(report)
}

/// MiB/s of one loopback TCP stream moving [`BIG`] bytes in 1 MiB writes.
async fn tcp_loopback_mb_per_s() -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        loop {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            total += n;
        }
        anyhow::Ok(total)
    });
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    socket.set_nodelay(true)?;
    for _ in 0..BIG / chunk.len() {
        socket.write_all(&chunk).await?;
    }
    socket.shutdown().await?;
    let total = reader.await??;
    let took = start.elapsed().as_secs_f64();
    if total != BIG {
        bail!("the loopback stream moved {total} bytes, not {BIG}");
    }
    Ok(BIG as f64 / f64::from(1u32 << 20) / took)
}

/// The objects targets, checked where the workload ran: tasks given a 1 MiB object ≥ 1.5× Ray's
/// rate; the 100 MiB fetch ≥ Ray's throughput and ≥ 50% of one loopback TCP stream's.
pub fn targets(figs: &[&Figure]) -> Vec<TargetCheck> {
    let find = |id: &str| figs.iter().copied().find(|f| f.id == id);
    let mut checks = Vec::new();
    let against_ray = [
        (
            "objects.one_mib_ref_tasks_per_s",
            "tasks given a 1 MiB object put once, from one Python driver ≥ 1.5× Ray's rate",
            "tasks/s",
            1.5,
        ),
        (
            "objects.fetch_100mib_mb_per_s",
            "a 100 MiB object fetched by a task on another worker ≥ Ray's throughput",
            "MiB/s",
            1.0,
        ),
    ];
    for (id, target, unit, at_least) in against_ray {
        let Some(f) = find(id) else { continue };
        checks.push(match &f.peer {
            Some(p) => TargetCheck {
                target: target.into(),
                measured: format!(
                    "{} vs Ray {} {unit} = {}",
                    num(f.escher),
                    num(p.value),
                    ratio(p.ratio)
                ),
                met: Some(p.ratio >= at_least),
            },
            None => TargetCheck {
                target: target.into(),
                measured: format!("{} {unit}; Ray did not run", num(f.escher)),
                met: None,
            },
        });
    }
    if let (Some(fetch), Some(tcp)) = (
        find("objects.fetch_100mib_mb_per_s"),
        find("objects.tcp_loopback_mb_per_s"),
    ) && tcp.escher > 0.0
    {
        let share = fetch.escher / tcp.escher;
        checks.push(TargetCheck {
            target: "a 100 MiB object fetched by a task on another worker ≥ 50% of one loopback \
                     TCP stream"
                .into(),
            measured: format!(
                "{} vs {} MiB/s = {:.0}%",
                num(fetch.escher),
                num(tcp.escher),
                share * 100.0
            ),
            met: Some(share >= 0.5),
        });
    }
    if let Some(rss) = find("objects.same_node_1gib_task_rss_anon_mib") {
        // A copy of the buffer would be 1,024 MiB of the task's private memory by itself.
        checks.push(TargetCheck {
            target: "a 1 GiB NumPy array read by a task on its node with no copy of the buffer \
                     (the task's private memory under 512 MiB)"
                .into(),
            measured: format!("{} MiB of RssAnon", num(rss.escher)),
            met: Some(rss.escher < 512.0),
        });
    }
    if let Some(grown) = find("objects.same_node_1gib_put_driver_peak_rss_growth_mib") {
        // The store's pages, written once by the put, count for the driver (about 1,024 MiB);
        // a copy of the buffer besides them adds about 1,024 MiB more.
        checks.push(TargetCheck {
            target: "a 1 GiB NumPy array put by a driver with no copy of the buffer besides the \
                     store's (the driver's peak resident memory grows by under 1,536 MiB)"
                .into(),
            measured: format!("{} MiB more at the peak", num(grown.escher)),
            met: Some(grown.escher < 1536.0),
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_only_where_the_workload_ran() {
        assert!(targets(&[]).is_empty());
        let mut tasks = Figure::new("objects.one_mib_ref_tasks_per_s", "x", "tasks/s", 300.0);
        tasks.peer = Some(PeerFigure {
            peer: "ray".into(),
            value: 100.0,
            ratio: 3.0,
        });
        let fetch = Figure::new("objects.fetch_100mib_mb_per_s", "y", "MiB/s", 400.0);
        let tcp = Figure::new("objects.tcp_loopback_mb_per_s", "z", "MiB/s", 1000.0);
        let checks = targets(&[&tasks, &fetch, &tcp]);
        assert_eq!(checks.len(), 3);
        assert_eq!(
            (checks[0].met, checks[1].met, checks[2].met),
            (Some(true), None, Some(false))
        );
        let copied = Figure::new(
            "objects.same_node_1gib_task_rss_anon_mib",
            "r",
            "MiB",
            1100.0,
        );
        let mapped = Figure::new("objects.same_node_1gib_task_rss_anon_mib", "r", "MiB", 60.0);
        assert_eq!(targets(&[&copied])[0].met, Some(false));
        assert_eq!(targets(&[&mapped])[0].met, Some(true));
        let id = "objects.same_node_1gib_put_driver_peak_rss_growth_mib";
        let held = Figure::new(id, "p", "MiB", 2080.0);
        let handed = Figure::new(id, "p", "MiB", 1041.0);
        assert_eq!(targets(&[&held])[0].met, Some(false));
        assert_eq!(targets(&[&handed])[0].met, Some(true));
    }
}
