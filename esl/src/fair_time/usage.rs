//! [`DecayedUsage`]: what each namespace has used, in weighted resource-seconds, with past
//! use decayed by a half-life; and the fair-share factor computed from it.
//!
//! Usage accrues continuously at a namespace's *rate* (the weighted cost per second of what
//! it holds, [`ResourceWeights::cost`](super::ResourceWeights::cost)). Between two instants
//! `dt` seconds apart, with `d = 2^(-dt/h)`, the usage becomes
//!
//! ```text
//!   U' = U·d + rate · (h / ln 2) · (1 − d)
//! ```
//!
//! which is the exact integral of `rate · 2^(-(t' − s)/h)` over the interval: every
//! resource-second counts half after one half-life, whenever the ledger is brought up to date,
//! so the answer does not depend on how often it is.

use std::collections::BTreeMap;

use super::config::HalfLife;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Account {
    /// Decayed usage as of the ledger's `at_ms`, in weighted resource-seconds.
    usage: f64,
    /// Weighted cost per second of what the namespace holds now.
    rate: f64,
}

/// Decayed usage per namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct DecayedUsage {
    half_life: HalfLife,
    at_ms: u64,
    accounts: BTreeMap<String, Account>,
}

impl DecayedUsage {
    /// An empty ledger at time 0.
    pub fn new(half_life: HalfLife) -> DecayedUsage {
        DecayedUsage {
            half_life,
            at_ms: 0,
            accounts: BTreeMap::new(),
        }
    }

    /// Brings every account up to `now_ms` (a time before the last one is taken as the last).
    pub fn advance(&mut self, now_ms: u64) {
        if now_ms <= self.at_ms {
            return;
        }
        let dt = (now_ms - self.at_ms) as f64 / 1000.0;
        let d = self.half_life.decay(dt);
        let accrued = self.half_life.secs() / std::f64::consts::LN_2 * (1.0 - d);
        for account in self.accounts.values_mut() {
            account.usage = account.usage * d + account.rate * accrued;
        }
        self.at_ms = now_ms;
    }

    /// From `now_ms` on, `namespace` accrues `rate` weighted units per second.
    pub fn set_rate(&mut self, namespace: &str, rate: f64, now_ms: u64) {
        self.advance(now_ms);
        self.accounts.entry(namespace.to_string()).or_default().rate = rate;
    }

    /// Adds `resource_seconds` of usage to `namespace` at `now_ms` (history from elsewhere,
    /// e.g. carried over a restart of the policy).
    pub fn record(&mut self, namespace: &str, resource_seconds: f64, now_ms: u64) {
        self.advance(now_ms);
        self.accounts
            .entry(namespace.to_string())
            .or_default()
            .usage += resource_seconds.max(0.0);
    }

    /// `namespace`'s decayed usage as of the last [`advance`](DecayedUsage::advance).
    pub fn usage(&self, namespace: &str) -> f64 {
        self.accounts.get(namespace).map_or(0.0, |a| a.usage)
    }

    /// The sum of every namespace's decayed usage.
    pub fn total(&self) -> f64 {
        self.accounts.values().map(|a| a.usage).sum()
    }
}

/// Slurm's classic fair-share factor `F = 2^(-U/S)`: `U` the namespace's share of all decayed
/// usage (0 when nobody used anything), `S` its share of all weights. `F` is 1 for a
/// namespace that used nothing, ½ for one that used exactly its share, and tends to 0 the
/// more it used beyond it (Slurm, "Multifactor Priority Plugin", section "Fair-share Factor",
/// `https://slurm.schedmd.com/priority_multifactor.html`).
pub fn fair_share_factor(usage: f64, total_usage: f64, weight: f64, total_weight: f64) -> f64 {
    let used = if total_usage > 0.0 {
        usage / total_usage
    } else {
        0.0
    };
    let share = weight / total_weight;
    (-used / share).exp2()
}
