//! W7 gang scheduling (thesis Fig. 4.8): 32 nodes × 8 CPUs, gangs of 8 one-CPU bundles
//! requested concurrently from 4 clients, for each gang design of `escher_esl::gang`:
//!
//! - **AppSpace** ([`GhostGangs`]): each application's own ghost tasks, with timeouts and
//!   back-off (one instance per client, each with its own seed);
//! - **LibSpace** ([`GangCoordinator`]): one shared service that serializes every client's
//!   requests;
//! - **FrameSpace** ([`NativeGangs`]): the head's atomic reservations.
//!
//! Each client acquires a gang, releases it, and repeats; the latency is the acquire call,
//! from the request until every bundle is held. Reported per design: p50, p95 and max latency,
//! gangs per second over all clients (acquire and release), and the design's lines of code
//! (non-blank, non-comment lines of its module, tests excluded). Then the placement-group
//! microbenchmark that Ray publishes (`ray microbenchmark`'s placement_group_create/removal),
//! on the head-native reservations: one-bundle reservations in rounds of 100, each round's
//! requested at once (as Ray's `placement_group()` calls, which return before the group
//! exists), waited ready and released at once, through the client API (`Client::reserve`,
//! `Reservation::release`) and through the FrameSpace ESL; the Ray peer runs the same with
//! placement groups. With `--peers` Ray
//! also runs the gang loop itself: placement groups of 8 one-slot bundles from 4 threads.
//!
//! The gangs are small next to the cluster (4 gangs of 8 CPUs on 256 CPUs), on
//! purpose: the designs are compared on their overhead, not on deadlock under contention.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use escher::Client;
use escher::esl::gang::{
    CoordinatorConfig, GangCoordinator, GangRequest, GangScheduler, GhostConfig, GhostGangs,
    NativeGangs,
};
use escher::types::{GangStrategy, ResourceSet};
use futures_util::future::try_join_all;
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::Ctx;
use crate::cluster;
use crate::peers::PeerOutcome;
use crate::report::{Figure, Plot, PlotData, WorkloadReport};
use crate::stats::Summary;

/// One design's measurements.
struct DesignRun {
    latencies: Vec<Duration>,
    wall: Duration,
}

/// The designs, as the thesis names them, with their module files under `esl/src/gang/`.
const DESIGNS: [(&str, &str, &str); 3] = [
    ("ghosts", "AppSpace (ghosts + timeouts)", "ghosts.rs"),
    (
        "coordinator",
        "LibSpace (coordinator service)",
        "coordinator.rs",
    ),
    ("native", "FrameSpace (head-native)", "native.rs"),
];

/// The thesis' lines of code per design.
const THESIS_LOC: [(&str, f64); 3] = [("ghosts", 78.0), ("coordinator", 261.0), ("native", 1624.0)];

/// Runs W7.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let p = &ctx.params;
    let mut report = WorkloadReport::new(
        "w7",
        "gang scheduling: request latency per design",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{} in-process workers, cpu={},custom=100 each", p.w7_nodes, p.w7_cpus),
        "gang": format!("{} bundles of cpu=1, strategy pack", p.w7_gang),
        "clients": p.w7_clients,
        "gangs_per_client": p.w7_gangs_per_client,
        "latency": "acquire(): from the request until every bundle is held",
        "pg_rate": format!("{} one-bundle (custom=0.001) reservations, 100 at a time, created, awaited, released", p.w7_pg_rate),
        "designs": "escher_esl::gang::{ghosts, coordinator, native}",
    });
    let resources = format!("cpu={},custom=100", p.w7_cpus);
    let cluster = cluster::start(p.w7_nodes, &resources).await?;
    let mut clients = Vec::new();
    for _ in 0..p.w7_clients {
        clients.push(cluster.client().await?);
    }
    let bundle: ResourceSet = "cpu=1".parse()?;
    let bundles = vec![bundle; p.w7_gang];

    let mut categories = Vec::new();
    let mut detail = serde_json::Map::new();
    for (key, label, file) in DESIGNS {
        let designs: Vec<Design> = match key {
            "ghosts" => clients
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let config = GhostConfig {
                        seed: i as u64 + 1,
                        ..GhostConfig::default()
                    };
                    Design::Ghosts(Arc::new(GhostGangs::new(c.clone(), config)))
                })
                .collect(),
            "coordinator" => {
                let service =
                    GangCoordinator::spawn(cluster.client().await?, CoordinatorConfig::default());
                let service = Arc::new(service);
                clients
                    .iter()
                    .map(|_| Design::Coordinator(Arc::clone(&service)))
                    .collect()
            }
            _ => clients
                .iter()
                .map(|c| Design::Native(Arc::new(NativeGangs::new(c.clone(), None))))
                .collect(),
        };
        // Warm-up: one gang per client.
        measure(&designs, key, 1, &bundles).await?;
        let run = measure(&designs, key, p.w7_gangs_per_client, &bundles).await?;
        let s = Summary::of_ms(&run.latencies);
        let rate = run.latencies.len() as f64 / run.wall.as_secs_f64();
        let loc = design_loc(file);
        let mut figures = vec![
            Figure::new(
                format!("w7.{key}.p50"),
                format!("{label}: latency p50"),
                "ms",
                s.p50,
            ),
            Figure::new(
                format!("w7.{key}.p95"),
                format!("{label}: latency p95"),
                "ms",
                s.p95,
            ),
            Figure::new(
                format!("w7.{key}.max"),
                format!("{label}: latency max"),
                "ms",
                s.max,
            ),
            Figure::new(
                format!("w7.{key}.rate"),
                format!("{label}: gangs acquired and released"),
                "gangs/s",
                rate,
            ),
        ];
        if key == "native" {
            for (f, peer_key) in
                figures
                    .iter_mut()
                    .zip(["gang.p50", "gang.p95", "gang.max", "gang.rate"])
            {
                f.peer_key = Some(format!("ray:{peer_key}"));
            }
        }
        if let Some(loc) = loc {
            let thesis = THESIS_LOC.iter().find(|(k, _)| *k == key).map(|x| x.1);
            let mut f = Figure::new(
                format!("w7.{key}.loc"),
                format!("{label}: lines of code (esl/src/gang/{file})"),
                "lines",
                loc as f64,
            );
            if let Some(t) = thesis {
                f = f.thesis(t);
            }
            figures.push(f);
        }
        report.figures.extend(figures);
        categories.push((label.split(' ').next().unwrap_or(label).to_string(), s));
        detail.insert(
            key.to_string(),
            json!({"latency_ms": s, "gangs_per_s": rate, "loc": loc}),
        );
    }
    if let Some(loc) = design_loc("hold.rs") {
        report.notes.push(format!(
            "AppSpace and LibSpace share esl/src/gang/hold.rs ({loc} lines: ghost specs, waiting, \
             rollback), not counted in either; FrameSpace's head side is the reservation code in \
             head/ ({} lines in core/src/scheduler/gang.rs).",
            count_loc(&crate::peers::venv::workspace_root().join("core/src/scheduler/gang.rs"))
                .map_or("?".to_string(), |n| n.to_string())
        ));
    }

    // Ray's placement-group microbenchmark on the head-native reservations: through the
    // client API (`Client::reserve`, `Reservation::release`), as Ray's runs through its own,
    // and through the ESL's FrameSpace design (which also waits for the holders to end).
    let one: Vec<ResourceSet> = vec!["custom=0.001".parse()?];
    let warm = 100.min(p.w7_pg_rate);
    pg_rounds_client(&clients[0], &one, "w", warm).await?;
    let start = Instant::now();
    pg_rounds_client(&clients[0], &one, "m", p.w7_pg_rate).await?;
    let pg_rate = p.w7_pg_rate as f64 / start.elapsed().as_secs_f64();
    let native = NativeGangs::new(clients[0].clone(), None);
    pg_rounds(&native, &one, warm).await?;
    let start = Instant::now();
    pg_rounds(&native, &one, p.w7_pg_rate).await?;
    let esl_pg_rate = p.w7_pg_rate as f64 / start.elapsed().as_secs_f64();
    report.figures.push(
        Figure::new(
            "w7.native.pg_rate",
            "head-native reservations of one bundle created, ready, released (100 requested at once)",
            "gangs/s",
            pg_rate,
        )
        .vs("ray", "pg.rate"),
    );
    report.figures.push(
        Figure::new(
            "w7.native_esl.pg_rate",
            "the same through the FrameSpace ESL (release waits for the holders' end)",
            "gangs/s",
            esl_pg_rate,
        )
        .vs("ray", "pg.rate"),
    );
    detail.insert("esl_pg_rate".into(), json!(esl_pg_rate));
    detail.insert("pg_rate".into(), json!(pg_rate));
    report.detail = serde_json::Value::Object(detail);
    report.plots.push(Plot {
        file: "fig4.8-gang-latency.png".into(),
        title: format!(
            "Fig. 4.8: gang request latency, {} nodes × {} CPUs, gangs of {}, {} clients",
            p.w7_nodes, p.w7_cpus, p.w7_gang, p.w7_clients
        ),
        x_label: "design (box p50–p95, whisker min–max)".into(),
        y_label: "request latency (ms)".into(),
        data: PlotData::Distributions { categories },
    });
    drop(clients);
    cluster.shutdown().await;
    Ok(report)
}

/// The designs behind one enum, so that clients of every design run the same loop.
#[derive(Clone)]
enum Design {
    Ghosts(Arc<GhostGangs<Client>>),
    Coordinator(Arc<GangCoordinator<Client>>),
    Native(Arc<NativeGangs<Client>>),
}

impl Design {
    /// Acquires `req` and returns how long that took; then releases it.
    async fn cycle(&self, req: &GangRequest) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let elapsed = match self {
            Design::Ghosts(d) => {
                let gang = d.acquire(req).await?;
                let t = start.elapsed();
                d.release(gang).await?;
                t
            }
            Design::Coordinator(d) => {
                let gang = d.acquire(req).await?;
                let t = start.elapsed();
                d.release(gang).await?;
                t
            }
            Design::Native(d) => {
                let gang = d.acquire(req).await?;
                let t = start.elapsed();
                d.release(gang).await?;
                t
            }
        };
        Ok(elapsed)
    }
}

/// Every client runs `gangs` acquire-release cycles at once; returns the latencies.
async fn measure(
    designs: &[Design],
    key: &str,
    gangs: usize,
    bundles: &[ResourceSet],
) -> anyhow::Result<DesignRun> {
    let barrier = Arc::new(Barrier::new(designs.len() + 1));
    let mut set = JoinSet::new();
    for (c, design) in designs.iter().enumerate() {
        let design = design.clone();
        let barrier = Arc::clone(&barrier);
        let bundles = bundles.to_vec();
        let key = key.to_string();
        set.spawn(async move {
            barrier.wait().await;
            let mut latencies = Vec::with_capacity(gangs);
            for g in 0..gangs {
                let req = GangRequest::new(&format!("w7-{key}-c{c}-g{g}"), bundles.clone())?;
                latencies.push(design.cycle(&req).await?);
            }
            anyhow::Ok(latencies)
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut latencies = Vec::new();
    while let Some(done) = set.join_next().await {
        latencies.extend(done??);
    }
    Ok(DesignRun {
        latencies,
        wall: start.elapsed(),
    })
}

/// `n` one-bundle reservations with the client API, in rounds of 100: reserve all of a round
/// `n` one-bundle reservations through the client API, in rounds of 100 as Ray's
/// microbenchmark does them: a round's reservations requested at once (Ray's
/// `placement_group()` returns before the group exists), each waited ready, then all released
/// at once.
async fn pg_rounds_client(
    client: &Client,
    bundles: &[ResourceSet],
    tag: &str,
    n: usize,
) -> anyhow::Result<()> {
    let mut done = 0;
    while done < n {
        let k = 100.min(n - done);
        let names: Vec<String> = (done..done + k)
            .map(|i| format!("w7-pgc-{tag}-{i}"))
            .collect();
        let held =
            try_join_all(names.iter().map(|name| {
                client.reserve(name.as_str(), bundles.to_vec(), GangStrategy::Pack, None)
            }))
            .await?;
        for r in held.iter().filter(|r| !r.placed()) {
            r.ready(client, Some(Duration::from_secs(30))).await?;
        }
        try_join_all(held.iter().map(|r| r.release(client))).await?;
        done += k;
    }
    Ok(())
}

/// `n` one-bundle reservations through the FrameSpace ESL, in the same rounds.
async fn pg_rounds(
    native: &NativeGangs<Client>,
    bundles: &[ResourceSet],
    n: usize,
) -> anyhow::Result<()> {
    let mut done = 0;
    while done < n {
        let k = 100.min(n - done);
        let requests = (done..done + k)
            .map(|i| GangRequest::new(&format!("w7-pg-{i}"), bundles.to_vec()))
            .collect::<Result<Vec<_>, _>>()?;
        let gangs = try_join_all(requests.iter().map(|req| native.acquire(req))).await?;
        try_join_all(gangs.into_iter().map(|gang| native.release(gang))).await?;
        done += k;
    }
    Ok(())
}

/// Non-blank, non-comment lines of `esl/src/gang/<file>`, up to its test module.
fn design_loc(file: &str) -> Option<usize> {
    count_loc(
        &crate::peers::venv::workspace_root()
            .join("esl/src/gang")
            .join(file),
    )
}

/// Non-blank lines that are not `//` comments, up to the first `#[cfg(test)]`.
pub fn count_loc(path: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .map(str::trim)
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .count(),
    )
}

/// Adds Ray's placement groups of the same shape to the Fig. 4.8 plot, when Ray ran.
pub fn add_peer(reports: &mut [WorkloadReport], outcomes: &[PeerOutcome]) {
    let Some(values) = outcomes
        .iter()
        .find(|o| o.peer == "ray")
        .and_then(|o| o.result.as_ref().ok())
        .map(|r| &r.values)
    else {
        return;
    };
    let get = |k: &str| values.get(&format!("gang.{k}")).copied();
    let (Some(min), Some(p50), Some(p95), Some(max)) =
        (get("min"), get("p50"), get("p95"), get("max"))
    else {
        return;
    };
    let summary = Summary {
        count: 0,
        min,
        p50,
        p95,
        p99: max,
        max,
        mean: get("mean").unwrap_or(p50),
    };
    for plot in reports
        .iter_mut()
        .filter(|r| r.id == "w7")
        .flat_map(|r| r.plots.iter_mut())
    {
        if let PlotData::Distributions { categories } = &mut plot.data {
            categories.push(("Ray placement group".into(), summary));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_code_skip_blanks_comments_and_tests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.rs");
        std::fs::write(
            &path,
            "//! doc\n\nuse x;\n/// item doc\nfn f() {\n    // note\n    g();\n}\n#[cfg(test)]\nmod tests {}\n",
        )
        .unwrap();
        assert_eq!(count_loc(&path), Some(4));
        assert_eq!(count_loc(&dir.path().join("missing.rs")), None);
    }
}
