//! E3, AlphaZero-style co-location with load balancing (thesis §4.6.1, Fig. 4.6a, 4.7).
//!
//! **Setup.** `nodes` workers, each with 4 CPUs and 4 accelerator slots (`accel`, a logical
//! stand-in for the thesis' GPUs). `pairs` pairs of a *predictor* (holds one `accel`, answers
//! evaluation requests) and an *aggregator* (one CPU; its board explorations each make `moves`
//! rounds of tree search followed by one evaluation request to its own predictor). The two
//! talk over a real in-process channel; a message between two different nodes pays an
//! injected one-way latency ([`Costs::hop_s`]), one on the same node pays nothing. An
//! exploration's latency is measured end to end around its rounds.
//!
//! **Placements.** `none`: predictors request `accel=1`, aggregators `cpu=1`, and the scheduler
//! places them (predictors first, in pair order, as an application creates its serving actors
//! before their clients; aggregators then start as their games do, in a random order). `er`: the thesis' policy in ephemeral resources: load balancing over predictors
//! ([`LoadBalance`], an even number of slots per node) and co-location of each aggregator with
//! its predictor ([`Affinity`]: the predictor creates `aff-<pair>` where it starts, the
//! aggregator requests it). `hard-coded`: the application maps pair `i` to node `i mod nodes`
//! itself and pins both tasks there by the node's label.
//!
//! **Measured.** The median and P95 of the exploration latency over every exploration of every
//! pair, and how many pairs ran on one node. The costs are assumptions (the thesis gives
//! none): [`Costs::default`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use escher::esl::{Affinity, Domain, LoadBalance};
use escher::types::NodeId;
use escher::{Client, Functions, LocalCluster, Task};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::common::{AnyResult, Clock, cluster, host, quantile, submit_all};

/// This module's source, for counting its policy lines.
pub const SOURCE: &str = include_str!("alphazero.rs");

const LIMIT: Duration = Duration::from_secs(120);

/// Accelerator slots per node.
pub const ACCEL_PER_NODE: usize = 4;

/// The injected costs, in simulated seconds (here: milliseconds, `ms_per_s = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// Tree search between two evaluations, on the aggregator's CPU.
    pub search_s: f64,
    /// One evaluation on the predictor's accelerator.
    pub infer_s: f64,
    /// One message between two nodes, one way.
    pub hop_s: f64,
    /// Compressed time.
    pub clock: Clock,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            search_s: 8.0,
            infer_s: 3.0,
            hop_s: 1.0,
            clock: Clock { ms_per_s: 1.0 },
        }
    }
}

/// How the pairs are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Placement {
    /// The scheduler alone.
    None,
    /// Load balancing on predictors, co-location of aggregators, in ephemeral resources.
    Er,
    /// The application pins each pair to a node it chose.
    HardCoded,
}

impl Placement {
    /// Every placement, in report order.
    pub const ALL: [Placement; 3] = [Placement::None, Placement::Er, Placement::HardCoded];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Placement::None => "none",
            Placement::Er => "er",
            Placement::HardCoded => "hard-coded",
        }
    }
}

/// One run's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The placement.
    pub placement: Placement,
    /// Median exploration latency, simulated seconds.
    pub median_s: f64,
    /// 95th percentile.
    pub p95_s: f64,
    /// Pairs whose two tasks ran on one node.
    pub colocated: usize,
    /// Pairs.
    pub pairs: usize,
    /// Explorations measured.
    pub explorations: usize,
}

type Request = oneshot::Sender<()>;

/// Where each pair's predictor listens: pair → (its node, its inbox).
#[derive(Debug, Default)]
struct Registry {
    predictors: Mutex<HashMap<u32, (NodeId, mpsc::Sender<Request>)>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Predictor {
    pair: u32,
    costs: Costs,
}

#[derive(Debug, Serialize, Deserialize)]
struct Aggregator {
    pair: u32,
    explorations: u32,
    moves: u32,
    costs: Costs,
}

#[derive(Debug, Serialize, Deserialize)]
struct Explored {
    colocated: bool,
    latencies_s: Vec<f64>,
}

fn functions(registry: Arc<Registry>) -> Functions {
    let (serve, explore) = (registry.clone(), registry);
    Functions::new()
        .typed_function("az.predictor", move |ctx, p: Predictor| {
            let registry = serve.clone();
            async move {
                let (tx, mut rx) = mpsc::channel::<Request>(16);
                registry
                    .predictors
                    .lock()
                    .unwrap()
                    .insert(p.pair, (ctx.node_id(), tx));
                // Serves until its aggregator is done and the registry lets go of the inbox.
                while let Some(reply) = rx.recv().await {
                    p.costs.clock.sleep(p.costs.infer_s).await;
                    let _ = reply.send(());
                }
                Ok::<_, String>(())
            }
        })
        .typed_function("az.aggregator", move |ctx, a: Aggregator| {
            let registry = explore.clone();
            async move {
                let deadline = Instant::now() + LIMIT;
                let (node, inbox) = loop {
                    if let Some(p) = registry.predictors.lock().unwrap().get(&a.pair) {
                        break p.clone();
                    }
                    if Instant::now() > deadline {
                        return Err(format!("pair {}: the predictor never started", a.pair));
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                };
                let colocated = node == ctx.node_id();
                let hop = if colocated { 0.0 } else { a.costs.hop_s };
                let clock = a.costs.clock;
                let mut latencies_s = Vec::with_capacity(a.explorations as usize);
                for _ in 0..a.explorations {
                    let start = Instant::now();
                    for _ in 0..a.moves {
                        clock.sleep(a.costs.search_s).await;
                        clock.sleep(hop).await;
                        let (tx, rx) = oneshot::channel();
                        inbox.send(tx).await.map_err(|_| "the predictor stopped")?;
                        rx.await.map_err(|_| "the predictor dropped a request")?;
                        clock.sleep(hop).await;
                    }
                    latencies_s.push(clock.simulated(start.elapsed()));
                }
                registry.predictors.lock().unwrap().remove(&a.pair);
                Ok::<_, String>(Explored {
                    colocated,
                    latencies_s,
                })
            }
        })
}

/// A cluster ready to run AlphaZero's pairs.
#[derive(Debug)]
pub struct AlphaZero {
    cluster: LocalCluster,
    client: Client,
    nodes: usize,
    costs: Costs,
}

impl AlphaZero {
    /// Starts `nodes` workers with 4 CPUs and 4 accelerator slots each.
    pub async fn start(nodes: usize, costs: Costs) -> AnyResult<AlphaZero> {
        let registry = Arc::new(Registry::default());
        let resources = format!("cpu=4,accel={ACCEL_PER_NODE}");
        let cluster = cluster(nodes, &resources, functions(registry)).await?;
        let client = cluster.client().await?;
        Ok(AlphaZero {
            cluster,
            client,
            nodes,
            costs,
        })
    }

    /// Runs `pairs` pairs, each making `explorations` explorations of `moves` rounds.
    pub async fn run(
        &self,
        placement: Placement,
        pairs: usize,
        explorations: u32,
        moves: u32,
    ) -> AnyResult<Outcome> {
        let predictor = |i: usize| {
            let args = Predictor {
                pair: i as u32,
                costs: self.costs,
            };
            Task::function_typed("az.predictor", &args).resources_str("accel=1")
        };
        let aggregator = |i: usize| {
            let args = Aggregator {
                pair: i as u32,
                explorations,
                moves,
                costs: self.costs,
            };
            Task::function_typed("az.aggregator", &args).resources_str("cpu=1")
        };
        let per_node = pairs.div_ceil(self.nodes) as u64;
        let (mut predictors, mut aggregators) = (Vec::new(), Vec::new());
        let mut groups = Vec::new();
        let balance = match placement {
            Placement::Er => Some(
                LoadBalance::create(self.client.clone(), "predictors", per_node, Domain::All)
                    .await?,
            ), // policy
            _ => None,
        };
        for i in 0..pairs {
            let pin = |t: Task| {
                t.add_resources(
                    &format!("{}=1", host(i % self.nodes))
                        .parse()
                        .expect("a label"),
                )
            };
            match (placement, &balance) {
                (Placement::Er, Some(balance)) => {
                    let pair = Affinity::group(self.client.clone(), &format!("pair{i}"))?; // policy
                    predictors.push(pair.leader().and(&balance.spec())?.apply(predictor(i))); // policy
                    aggregators.push(pair.follower().apply(aggregator(i))); // policy
                    groups.push(pair);
                }
                (Placement::HardCoded, _) => {
                    predictors.push(pin(predictor(i)));
                    aggregators.push(pin(aggregator(i)));
                }
                _ => {
                    predictors.push(predictor(i));
                    aggregators.push(aggregator(i));
                }
            }
        }
        // Games start in no particular order: so do their aggregators.
        fastrand::Rng::with_seed(pairs as u64).shuffle(&mut aggregators);
        let serving = submit_all(&self.client, predictors).await?;
        let exploring = submit_all(&self.client, aggregators).await?;
        let mut latencies = Vec::new();
        let mut colocated = 0;
        for id in exploring {
            let e = self.client.get_typed::<Explored>(id, Some(LIMIT)).await?;
            colocated += usize::from(e.colocated);
            latencies.extend(e.latencies_s);
        }
        for id in serving {
            self.client.get_typed::<()>(id, Some(LIMIT)).await?;
        }
        for pair in groups {
            pair.dissolve().await?; // policy
        }
        if let Some(balance) = balance {
            balance.dissolve().await?; // policy
        }
        Ok(Outcome {
            placement,
            median_s: quantile(&latencies, 0.5),
            p95_s: quantile(&latencies, 0.95),
            colocated,
            pairs,
            explorations: latencies.len(),
        })
    }

    /// Stops the cluster.
    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}
