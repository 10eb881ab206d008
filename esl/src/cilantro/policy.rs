//! The uncertainty-aware policies (thesis §3.4): each round, allocations from the learners'
//! confidence bounds, within the budget of change `B` per round.

use super::learner::Learner;

/// What a round optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Objective {
    /// NJC fairness (Cilantro-NJC): every job gets its demand when it is below its fair share,
    /// the rest is split equally; demands come from the learners (Eq. 3.5, 3.6).
    Njc,
    /// Social welfare (Cilantro-SW): the most total utility, optimistic (perf-UCB).
    SocialWelfare,
    /// Egalitarian welfare (Cilantro-EW): the highest least utility, optimistic.
    Egalitarian,
    /// The baseline: an equal share each, whatever the jobs do.
    ResourceFair,
}

impl Objective {
    /// Every objective.
    pub const ALL: [Objective; 4] = [
        Objective::Njc,
        Objective::SocialWelfare,
        Objective::Egalitarian,
        Objective::ResourceFair,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Njc => "cilantro-njc",
            Objective::SocialWelfare => "cilantro-sw",
            Objective::Egalitarian => "cilantro-ew",
            Objective::ResourceFair => "resource-fair",
        }
    }
}

/// The parameters of a round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundConfig {
    /// The units to share (R).
    pub total: u64,
    /// The most a job's allocation (NJC: its demand) may change in one round (B).
    pub budget: u64,
    /// The weight of the conservative demand against the exploratory one (β).
    pub beta: f64,
}

impl Default for RoundConfig {
    /// The thesis' parameters: B = 10, β = 3/4 (R must be set).
    fn default() -> RoundConfig {
        RoundConfig {
            total: 0,
            budget: 10,
            beta: 0.75,
        }
    }
}

/// One job as a round sees it.
#[derive(Debug, Clone, Copy)]
pub struct JobView<'a> {
    /// What it learned.
    pub learner: &'a Learner,
    /// Its performance objective: utility reaches 1 there.
    pub slo: f64,
    /// Its allocation in the previous round.
    pub previous: u64,
    /// Its demand in the previous round (NJC), if any.
    pub previous_demand: Option<f64>,
}

/// A job's utility at `performance`: linear, clipped at the SLO (thesis §3.4).
pub fn utility(performance: f64, slo: f64) -> f64 {
    if slo <= 0.0 {
        return 1.0;
    }
    (performance / slo).clamp(0.0, 1.0)
}

/// The NJC procedure on demands (thesis §3.4, its reference \[93\]): with share = R/n, every job whose
/// demand is below the share gets its demand; the share is recomputed over the others and
/// the rest; repeat; the jobs left split what remains equally.
pub fn njc_split(demands: &[f64], total: f64) -> Vec<f64> {
    let n = demands.len();
    let mut out = vec![0.0; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut left = total;
    loop {
        if open.is_empty() {
            return out;
        }
        let share = left / open.len() as f64;
        let (below, above): (Vec<usize>, Vec<usize>) =
            open.iter().partition(|j| demands[**j] < share);
        if below.is_empty() {
            for j in &open {
                out[*j] = share;
            }
            return out;
        }
        for j in below {
            out[j] = demands[j].max(0.0);
            left -= out[j];
        }
        open = above;
    }
}

/// The conservative demand estimate d̂: the least allocation whose performance LCB meets the
/// SLO (the whole of `total` when none does).
pub fn demand_ucb(learner: &Learner, slo: f64, total: u64) -> f64 {
    (0..=total)
        .find(|a| learner.lcb(*a as f64) >= slo)
        .unwrap_or(total) as f64
}

/// The exploratory demand d̄ (Eq. 3.5): the allocation where the SLO lies deepest inside the
/// confidence band, `argmax_a min(UCB(a) − SLO, SLO − LCB(a))`. Where the band is equally
/// wide over a range (the bounds are flat where nothing was observed), the middle of that
/// range: each round then halves what is unknown, a bisection for the demand.
pub fn exploratory_demand(learner: &Learner, slo: f64, total: u64) -> f64 {
    let scores: Vec<f64> = (0..=total)
        .map(|a| (learner.ucb(a as f64) - slo).min(slo - learner.lcb(a as f64)))
        .collect();
    let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tied: Vec<usize> = (0..scores.len())
        .filter(|a| (scores[*a] - best).abs() <= 1e-9)
        .collect();
    tied[tied.len() / 2] as f64
}

/// What a round decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Units per job, in the jobs' order; they sum to at most `total`.
    pub allocations: Vec<u64>,
    /// The demands NJC used (empty for the other objectives).
    pub demands: Vec<f64>,
}

/// One round's allocation for `jobs` under `objective`.
pub fn decide(objective: Objective, jobs: &[JobView<'_>], config: RoundConfig) -> Decision {
    match objective {
        Objective::ResourceFair => Decision {
            allocations: equal(jobs.len(), config.total),
            demands: Vec::new(),
        },
        Objective::Njc => njc(jobs, config),
        Objective::SocialWelfare | Objective::Egalitarian => welfare(objective, jobs, config),
    }
}

/// `total` in `n` near-equal whole parts.
fn equal(n: usize, total: u64) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    let (each, rest) = (total / n as u64, (total % n as u64) as usize);
    (0..n).map(|j| each + u64::from(j < rest)).collect()
}

fn njc(jobs: &[JobView<'_>], config: RoundConfig) -> Decision {
    let fair = config.total as f64 / jobs.len().max(1) as f64;
    let b = config.budget as f64;
    let demands: Vec<f64> = jobs
        .iter()
        .map(|j| {
            let previous = j.previous_demand.unwrap_or(fair);
            let hat = demand_ucb(j.learner, j.slo, config.total);
            let bar = exploratory_demand(j.learner, j.slo, config.total);
            let d = config.beta * hat + (1.0 - config.beta) * bar;
            d.clamp((previous - b).max(0.0), previous + b)
        })
        .collect();
    let split = njc_split(&demands, config.total as f64);
    Decision {
        allocations: whole(&split, config.total),
        demands,
    }
}

/// Rounds a fractional split down, then hands the units left to the largest remainders.
fn whole(split: &[f64], total: u64) -> Vec<u64> {
    let mut out: Vec<u64> = split.iter().map(|s| s.max(0.0).floor() as u64).collect();
    let mut left = total.saturating_sub(out.iter().sum());
    let mut order: Vec<usize> = (0..split.len()).collect();
    order.sort_by(|a, b| {
        let fa = split[*a] - split[*a].floor();
        let fb = split[*b] - split[*b].floor();
        fb.total_cmp(&fa)
    });
    for j in order {
        if left == 0 {
            break;
        }
        if split[j] - split[j].floor() > 1e-9 {
            out[j] += 1;
            left -= 1;
        }
    }
    out
}

/// Social or egalitarian welfare of the optimistic utilities, greedily, within the budget.
/// (The thesis optimises with an evolutionary algorithm; a greedy ascent that may take up to
/// `B` units at once finds the same optimum on the monotone utilities used here, and is
/// deterministic.)
fn welfare(objective: Objective, jobs: &[JobView<'_>], config: RoundConfig) -> Decision {
    let b = config.budget;
    let lower: Vec<u64> = jobs.iter().map(|j| j.previous.saturating_sub(b)).collect();
    let upper: Vec<u64> = jobs
        .iter()
        .map(|j| (j.previous + b).min(config.total))
        .collect();
    let mut alloc = lower.clone();
    let mut left = config.total.saturating_sub(alloc.iter().sum());
    let u = |j: usize, a: u64| utility(jobs[j].learner.ucb(a as f64), jobs[j].slo);
    while left > 0 {
        let step = match objective {
            Objective::Egalitarian => (0..jobs.len())
                .filter(|j| alloc[*j] < upper[*j] && u(*j, alloc[*j]) < 1.0)
                .min_by(|a, b| u(*a, alloc[*a]).total_cmp(&u(*b, alloc[*b])))
                .map(|j| (j, 1)),
            _ => {
                let mut best: Option<(f64, usize, u64)> = None;
                for j in 0..jobs.len() {
                    let room = (upper[j] - alloc[j]).min(left);
                    let base = u(j, alloc[j]);
                    for k in 1..=room {
                        let ratio = (u(j, alloc[j] + k) - base) / k as f64;
                        if ratio > 1e-12 && best.is_none_or(|(r, _, _)| ratio > r) {
                            best = Some((ratio, j, k));
                        }
                    }
                }
                best.map(|(_, j, k)| (j, k))
            }
        };
        let Some((j, k)) = step else { break };
        alloc[j] += k;
        left -= k;
    }
    Decision {
        allocations: alloc,
        demands: Vec::new(),
    }
}
