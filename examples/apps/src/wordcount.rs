//! E1, WordCount with data locality (thesis §4.6.1, Fig. 4.5a/b).
//!
//! **Setup.** `nodes` workers (one map slot each, `cpu=1`); the input is one chunk of random
//! words per node, placed by a random permutation (chunk `c` lives on node `perm[c]`). A
//! generator task writes each chunk on its node (the input layout, not timed). Then the job:
//! one map task per chunk (reads the chunk, counts its words, returns the counts split into
//! `reducers` partitions), then one reduce task per partition (sums them). The counting is
//! real; the costs of a cluster with data are injected, in simulated seconds ([`Costs`]): a
//! map reads its chunk at the disk's rate when the chunk is on its own node, or over the
//! holder's network link otherwise (one transfer at a time per link, so readers of one node
//! queue), then computes at the CPU's rate.
//!
//! **Placements.** `unaware`: maps request only `cpu=1`, the scheduler places them without
//! knowing where the data is (the thesis' "random"). `esl`: the locality ESL, the thesis' two
//! lines: the generator's spec creates `data-<chunk>` where it ran
//! ([`DataLocality::produce`]), each map requests it ([`DataLocality::consumer`]).
//! `hard-coded`: the application knows the layout and pins each map to its chunk's node with
//! the node's label resource (the "native" locality of Kubernetes in the thesis).
//!
//! **Measured.** The job's makespan (first map submitted to last reduce done) and the share of
//! the maps' time spent transferring input; the word total is checked against what was
//! written. Inputs the thesis does not give are assumed here: the rates of [`Costs::default`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use escher::esl::DataLocality;
use escher::types::NodeId;
use escher::{Client, Functions, LocalCluster, Task};
use serde::{Deserialize, Serialize};

use super::common::{AnyResult, Clock, cluster, host, median, submit_all};

/// This module's source, for counting its policy lines.
pub const SOURCE: &str = include_str!("wordcount.rs");

/// How long a wait for one task may take.
const LIMIT: Duration = Duration::from_secs(120);

/// Words in the vocabulary the chunks are drawn from.
const VOCABULARY: u32 = 400;

/// The injected costs, in simulated seconds per simulated megabyte.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// A map's counting rate, MB/s.
    pub compute_mb_s: f64,
    /// Reading a chunk on the map's own node, MB/s.
    pub disk_mb_s: f64,
    /// Reading a chunk from another node, MB/s of the holder's link (1 Gbit/s).
    pub net_mb_s: f64,
    /// A reduce task's fixed cost, simulated seconds.
    pub reduce_s: f64,
    /// Compressed time.
    pub clock: Clock,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            compute_mb_s: 200.0,
            disk_mb_s: 500.0,
            net_mb_s: 125.0,
            reduce_s: 2.0,
            clock: Clock { ms_per_s: 10.0 },
        }
    }
}

/// Where maps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Placement {
    /// The scheduler alone, without the data's location (the thesis' "random").
    Unaware,
    /// The locality ESL: `data-<chunk>` where the chunk is produced, requested by its map.
    Esl,
    /// The application pins each map to its chunk's node by the node's label.
    HardCoded,
}

impl Placement {
    /// Every placement, in report order.
    pub const ALL: [Placement; 3] = [Placement::Unaware, Placement::Esl, Placement::HardCoded];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Unaware => "unaware",
            Placement::Esl => "esl",
            Placement::HardCoded => "hard-coded",
        }
    }
}

/// One job's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The placement.
    pub placement: Placement,
    /// Input per chunk, simulated MB.
    pub chunk_mb: f64,
    /// First map submitted to last reduce done, simulated seconds.
    pub makespan_s: f64,
    /// The maps' time spent reading input from another node, over their whole time.
    pub transfer_share: f64,
    /// Maps that ran on their chunk's node.
    pub local_maps: usize,
    /// Maps in the job.
    pub maps: usize,
    /// Every job's makespan of this placement, simulated seconds, in the order they ran (one
    /// job: its own; [`WordCount::compare`]: all `reps`, the run-to-run spread).
    pub makespans_s: Vec<f64>,
}

impl Outcome {
    /// The outcome of `placement` among `outcomes` (one per placement, as [`WordCount::compare`]
    /// returns them).
    pub fn of(outcomes: &[Outcome], placement: Placement) -> &Outcome {
        outcomes
            .iter()
            .find(|o| o.placement == placement)
            .expect("compare runs every placement")
    }
}

/// The chunks and the network links of the simulated cluster.
#[derive(Debug, Default)]
struct Store {
    /// chunk → (its node, its words).
    chunks: Mutex<HashMap<u32, (NodeId, Arc<str>)>>,
    /// One link per node: a transfer out of a node holds it.
    links: Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Store {
    fn link(&self, node: NodeId) -> Arc<tokio::sync::Mutex<()>> {
        self.links.lock().unwrap().entry(node).or_default().clone()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Generate {
    chunk: u32,
    words: u32,
    seed: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Map {
    chunk: u32,
    chunk_mb: f64,
    reducers: u32,
    costs: Costs,
}

#[derive(Debug, Serialize, Deserialize)]
struct MapOut {
    local: bool,
    transfer_s: f64,
    total_s: f64,
    partitions: Vec<BTreeMap<String, u64>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reduce {
    parts: Vec<BTreeMap<String, u64>>,
    costs: Costs,
}

fn word(n: u32) -> String {
    format!("w{n:03}")
}

fn functions(store: Arc<Store>) -> Functions {
    let (gen_store, map_store) = (store.clone(), store);
    Functions::new()
        .typed_function("wc.generate", move |ctx, g: Generate| {
            let store = gen_store.clone();
            async move {
                let mut rng = fastrand::Rng::with_seed(g.seed);
                let text: Vec<String> = (0..g.words).map(|_| word(rng.u32(..VOCABULARY))).collect();
                let text: Arc<str> = text.join(" ").into();
                store
                    .chunks
                    .lock()
                    .unwrap()
                    .insert(g.chunk, (ctx.node_id(), text));
                Ok::<_, String>(ctx.node_id().0)
            }
        })
        .typed_function("wc.map", move |ctx, m: Map| {
            let store = map_store.clone();
            async move {
                let start = Instant::now();
                let held = store.chunks.lock().unwrap().get(&m.chunk).cloned();
                let (holder, text) = held.ok_or_else(|| format!("no chunk {}", m.chunk))?;
                let clock = m.costs.clock;
                let local = holder == ctx.node_id();
                let mut transfer = Duration::ZERO;
                if local {
                    clock.sleep(m.chunk_mb / m.costs.disk_mb_s).await;
                } else {
                    let link = store.link(holder);
                    let t = Instant::now();
                    let _sending = link.lock().await;
                    clock.sleep(m.chunk_mb / m.costs.net_mb_s).await;
                    transfer = t.elapsed();
                }
                let mut partitions = vec![BTreeMap::<String, u64>::new(); m.reducers as usize];
                for w in text.split(' ') {
                    let p = w.bytes().map(u32::from).sum::<u32>() % m.reducers;
                    *partitions[p as usize].entry(w.to_string()).or_default() += 1;
                }
                clock.sleep(m.chunk_mb / m.costs.compute_mb_s).await;
                Ok::<_, String>(MapOut {
                    local,
                    transfer_s: clock.simulated(transfer),
                    total_s: clock.simulated(start.elapsed()),
                    partitions,
                })
            }
        })
        .typed_function("wc.reduce", |_ctx, r: Reduce| async move {
            let mut total = BTreeMap::<String, u64>::new();
            for part in r.parts {
                for (w, n) in part {
                    *total.entry(w).or_default() += n;
                }
            }
            r.costs.clock.sleep(r.costs.reduce_s).await;
            Ok::<_, String>(total.values().sum::<u64>())
        })
}

/// A cluster holding a WordCount input, ready to run jobs over it.
#[derive(Debug)]
pub struct WordCount {
    cluster: LocalCluster,
    client: Client,
    store: Arc<Store>,
    /// chunk → the label index (`host-k`) of its node.
    layout: Vec<usize>,
    words_per_chunk: u32,
    reducers: u32,
    costs: Costs,
}

impl WordCount {
    /// Starts `nodes` one-slot workers; chunk `c` will live on node `layout[c]`, a random
    /// permutation drawn from `seed`.
    pub async fn start(
        nodes: usize,
        reducers: u32,
        costs: Costs,
        seed: u64,
    ) -> AnyResult<WordCount> {
        let store = Arc::new(Store::default());
        let cluster = cluster(nodes, "cpu=1", functions(store.clone())).await?;
        let client = cluster.client().await?;
        let mut layout: Vec<usize> = (0..nodes).collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut layout);
        Ok(WordCount {
            cluster,
            client,
            store,
            layout,
            words_per_chunk: 2_000,
            reducers,
            costs,
        })
    }

    /// Writes the input (each chunk on its node), with the locality ESL's marker when the
    /// job will use it.
    async fn generate(&self, placement: Placement) -> AnyResult<()> {
        self.store.chunks.lock().unwrap().clear();
        let mut tasks = Vec::new();
        for (c, k) in self.layout.iter().enumerate() {
            let args = Generate {
                chunk: c as u32,
                words: self.words_per_chunk,
                seed: c as u64,
            };
            let t = Task::function_typed("wc.generate", &args)
                .resources_str(&format!("cpu=1,{}=1", host(*k)));
            tasks.push(match placement {
                Placement::Esl => DataLocality::<Client>::produce(&chunk_id(c))?.apply(t), // policy
                _ => t,
            });
        }
        let ids = submit_all(&self.client, tasks).await?;
        for id in ids {
            self.client.get_typed::<u64>(id, Some(LIMIT)).await?;
        }
        Ok(())
    }

    /// Runs one job with `chunk_mb` simulated MB per chunk; the input is rewritten first.
    pub async fn job(&self, placement: Placement, chunk_mb: f64) -> AnyResult<Outcome> {
        self.generate(placement).await?;
        let start = Instant::now();
        let mut maps = Vec::new();
        for (c, k) in self.layout.iter().enumerate() {
            let args = Map {
                chunk: c as u32,
                chunk_mb,
                reducers: self.reducers,
                costs: self.costs,
            };
            let t = Task::function_typed("wc.map", &args).resources_str("cpu=1");
            maps.push(match placement {
                Placement::Unaware => t,
                Placement::Esl => DataLocality::<Client>::consumer(&chunk_id(c))?.apply(t), // policy
                Placement::HardCoded => t.resources_str(&format!("cpu=1,{}=1", host(*k))),
            });
        }
        let ids = submit_all(&self.client, maps).await?;
        let mut outs = Vec::with_capacity(ids.len());
        for id in ids {
            outs.push(self.client.get_typed::<MapOut>(id, Some(LIMIT)).await?);
        }
        let mut parts = vec![Vec::new(); self.reducers as usize];
        for out in &mut outs {
            for (r, p) in std::mem::take(&mut out.partitions).into_iter().enumerate() {
                parts[r].push(p);
            }
        }
        let reduces = parts
            .into_iter()
            .map(|parts| {
                let args = Reduce {
                    parts,
                    costs: self.costs,
                };
                Task::function_typed("wc.reduce", &args).resources_str("cpu=1")
            })
            .collect::<Vec<_>>();
        let ids = submit_all(&self.client, reduces).await?;
        let mut words = 0;
        for id in ids {
            words += self.client.get_typed::<u64>(id, Some(LIMIT)).await?;
        }
        let makespan = start.elapsed();
        let expected = u64::from(self.words_per_chunk) * self.layout.len() as u64;
        if words != expected {
            return Err(format!("counted {words} words, wrote {expected}").into());
        }
        if placement == Placement::Esl {
            let data = DataLocality::new(self.client.clone());
            for c in 0..self.layout.len() {
                data.forget(&chunk_id(c)).await?;
            }
        }
        let transfer: f64 = outs.iter().map(|o| o.transfer_s).sum();
        let total: f64 = outs.iter().map(|o| o.total_s).sum();
        let makespan_s = self.costs.clock.simulated(makespan);
        Ok(Outcome {
            placement,
            chunk_mb,
            makespan_s,
            makespans_s: vec![makespan_s],
            transfer_share: if total > 0.0 { transfer / total } else { 0.0 },
            local_maps: outs.iter().filter(|o| o.local).count(),
            maps: outs.len(),
        })
    }

    /// Runs `reps` jobs of each placement at `chunk_mb`, interleaved; per placement the job of
    /// median makespan, with every job's makespan in [`Outcome::makespans_s`].
    pub async fn compare(&self, chunk_mb: f64, reps: usize) -> AnyResult<Vec<Outcome>> {
        let mut runs: BTreeMap<Placement, Vec<Outcome>> = BTreeMap::new();
        for _ in 0..reps.max(1) {
            for p in Placement::ALL {
                runs.entry(p)
                    .or_default()
                    .push(self.job(p, chunk_mb).await?);
            }
        }
        Ok(runs
            .into_values()
            .map(|mut v| {
                let all: Vec<f64> = v.iter().map(|o| o.makespan_s).collect();
                let m = median(&all);
                let i = v.iter().position(|o| o.makespan_s == m).unwrap_or(0);
                Outcome {
                    makespans_s: all,
                    ..v.swap_remove(i)
                }
            })
            .collect())
    }

    /// Stops the cluster.
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

fn chunk_id(c: usize) -> String {
    format!("chunk{c}")
}
