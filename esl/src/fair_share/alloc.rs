//! The pure core of hierarchical fair sharing: users' weights and demands and the domain's
//! nodes in, the node → user assignment out. No cluster, no clock, no I/O.
//!
//! Two steps:
//!
//! 1. **How many nodes each user gets** ([`shares`]): weighted max-min fairness by
//!    progressive filling over whole nodes. Each node in turn goes to the user whose
//!    normalised share `count / weight` is the smallest among those still below their demand
//!    (ties: the user holding more nodes now, then the heavier, then the smaller key). When
//!    every user's demand is met, the nodes left over are *lent*: filling goes on among the
//!    users that have demand, without their caps. Users with no demand get nothing while
//!    someone has demand; when nobody has any, the whole domain is split by weight alone, so
//!    that whoever arrives first finds nodes of its own.
//! 2. **Which nodes** ([`allocate`]): with the counts fixed, every user keeps as many of its
//!    current nodes as it may (its busiest ones, then the lower ids), and only the surplus
//!    moves, so the number of nodes taken from users is the least any assignment with these
//!    counts could take: `Σ max(0, held − count)`. Freed and unowned nodes go, least busy
//!    first, to the users short of nodes, in key order.
//!
//! Integers only (weights and demands are counts; shares are compared by cross-multiplying in
//! `u128`), and `BTreeMap`s everywhere: the same input gives the same assignment.

use std::collections::BTreeMap;

use escher_proto::types::NodeId;

/// What a user asks of the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Relative weight; a user of weight 0 never gets a node.
    pub weight: u64,
    /// How many nodes it can use now (0: idle; its share is lent to the others).
    pub demand: u64,
}

/// Whether `a`'s normalised share `a.0 / a.1` is below `b`'s.
fn below(a: (u64, u64), b: (u64, u64)) -> bool {
    (a.0 as u128) * (b.1 as u128) < (b.0 as u128) * (a.1 as u128)
}

/// How many nodes each user gets out of `nodes` (see the module doc). Every user of
/// `claims` appears in the result, with 0 if it gets nothing. `held` is how many nodes each
/// user holds now, used only to break ties in favour of keeping them.
pub fn shares<K: Ord + Clone>(
    claims: &BTreeMap<K, Claim>,
    nodes: u64,
    held: &BTreeMap<K, u64>,
) -> BTreeMap<K, u64> {
    let mut counts: BTreeMap<K, u64> = claims.keys().map(|k| (k.clone(), 0)).collect();
    let weighted: Vec<&K> = claims
        .iter()
        .filter(|(_, c)| c.weight > 0)
        .map(|(k, _)| k)
        .collect();
    let active: Vec<&K> = weighted
        .iter()
        .copied()
        .filter(|k| claims[*k].demand > 0)
        .collect();
    // Phase 1 fills up to the demands; phase 2 lends what is left, without caps, to the
    // users with demand (or to everyone, when nobody has any).
    let lenders = if active.is_empty() {
        &weighted
    } else {
        &active
    };
    for capped in [true, false] {
        let eligible: Vec<&K> = if capped {
            active.clone()
        } else {
            lenders.clone()
        };
        let mut left = nodes - counts.values().sum::<u64>();
        while left > 0 {
            let pick = eligible
                .iter()
                .copied()
                .filter(|k| !capped || counts[*k] < claims[*k].demand)
                .min_by(|a, b| {
                    let (ca, cb) = (counts[*a], counts[*b]);
                    let (wa, wb) = (claims[*a].weight, claims[*b].weight);
                    let incumbent = |k: &K, c: u64| held.get(k).copied().unwrap_or(0) > c;
                    if below((ca, wa), (cb, wb)) {
                        std::cmp::Ordering::Less
                    } else if below((cb, wb), (ca, wa)) {
                        std::cmp::Ordering::Greater
                    } else {
                        incumbent(b, cb)
                            .cmp(&incumbent(a, ca))
                            .then(wb.cmp(&wa))
                            .then(a.cmp(b))
                    }
                });
            let Some(k) = pick else { break };
            *counts.get_mut(k).expect("every claim has a count") += 1;
            left -= 1;
        }
    }
    counts
}

/// The node → user assignment over `nodes` (see the module doc). `current` is who holds each
/// node now (entries for nodes outside `nodes`, or for users no longer in `claims`, are
/// ignored); `busy` how many tasks the current holder runs on each node. Every node is
/// assigned unless no user has a positive weight.
pub fn allocate<K: Ord + Clone>(
    claims: &BTreeMap<K, Claim>,
    nodes: &[NodeId],
    current: &BTreeMap<NodeId, K>,
    busy: &BTreeMap<NodeId, u64>,
) -> BTreeMap<NodeId, K> {
    let mut nodes = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let load = |n: &NodeId| busy.get(n).copied().unwrap_or(0);
    let mut holdings: BTreeMap<K, Vec<NodeId>> = BTreeMap::new();
    for n in &nodes {
        if let Some(k) = current.get(n).filter(|k| claims.contains_key(*k)) {
            holdings.entry(k.clone()).or_default().push(*n);
        }
    }
    let held = holdings
        .iter()
        .map(|(k, ns)| (k.clone(), ns.len() as u64))
        .collect();
    let counts = shares(claims, nodes.len() as u64, &held);

    let mut assignment = BTreeMap::new();
    let mut free: Vec<NodeId> = nodes
        .iter()
        .copied()
        .filter(|n| !current.get(n).is_some_and(|k| claims.contains_key(k)))
        .collect();
    for (k, mut mine) in holdings {
        // Keep the busiest (their tasks would hold them anyway), then the lower ids.
        mine.sort_by(|a, b| load(b).cmp(&load(a)).then(a.cmp(b)));
        let keep = counts.get(&k).copied().unwrap_or(0) as usize;
        for (i, n) in mine.into_iter().enumerate() {
            if i < keep {
                assignment.insert(n, k.clone());
            } else {
                free.push(n);
            }
        }
    }
    free.sort_by(|a, b| load(a).cmp(&load(b)).then(a.cmp(b)));
    let mut free = free.into_iter();
    for (k, count) in &counts {
        let have = assignment.values().filter(|v| *v == k).count() as u64;
        for _ in have..*count {
            match free.next() {
                Some(n) => assignment.insert(n, k.clone()),
                None => break,
            };
        }
    }
    assignment
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::Rng;

    fn claims(list: &[(&'static str, u64, u64)]) -> BTreeMap<&'static str, Claim> {
        list.iter()
            .map(|(k, weight, demand)| {
                (
                    *k,
                    Claim {
                        weight: *weight,
                        demand: *demand,
                    },
                )
            })
            .collect()
    }

    fn ids(n: u64) -> Vec<NodeId> {
        (0..n).map(NodeId).collect()
    }

    fn counts<K: Ord + Clone>(a: &BTreeMap<NodeId, K>) -> BTreeMap<K, u64> {
        let mut c = BTreeMap::new();
        for k in a.values() {
            *c.entry(k.clone()).or_insert(0) += 1;
        }
        c
    }

    #[test]
    fn the_thesis_timeline_in_shares() {
        let none = BTreeMap::new();
        // A alone takes everything.
        let s = shares(&claims(&[("A", 2, 100), ("B", 3, 0)]), 10, &none);
        assert_eq!((s["A"], s["B"]), (10, 0));
        // B arrives: 2:3.
        let s = shares(&claims(&[("A", 2, 100), ("B", 3, 100)]), 10, &none);
        assert_eq!((s["A"], s["B"]), (4, 6));
        // Two sub-orgs of equal weight: 5 / 5, then 2:3 inside the first.
        let s = shares(&claims(&[("org1", 1, 200), ("org2", 1, 100)]), 10, &none);
        assert_eq!((s["org1"], s["org2"]), (5, 5));
        let s = shares(&claims(&[("A", 2, 100), ("B", 3, 100)]), 5, &none);
        assert_eq!((s["A"], s["B"]), (2, 3));
        // 100 nodes, as in Fig. 4.5c.
        let s = shares(&claims(&[("A", 2, 1000), ("B", 3, 1000)]), 50, &none);
        assert_eq!((s["A"], s["B"]), (20, 30));
    }

    #[test]
    fn demand_caps_and_idle_share_is_lent() {
        let none = BTreeMap::new();
        // C wants only 1 of its 5: the rest goes to A and B by weight.
        let s = shares(
            &claims(&[("A", 1, 100), ("B", 1, 100), ("C", 2, 1)]),
            10,
            &none,
        );
        assert_eq!(s["C"], 1);
        assert_eq!(s["A"] + s["B"], 9);
        assert!(s["A"].abs_diff(s["B"]) <= 1);
        // Everyone satisfied: the surplus is lent to the users with demand, by weight.
        let s = shares(
            &claims(&[("A", 1, 1), ("B", 3, 1), ("idle", 5, 0)]),
            10,
            &none,
        );
        assert_eq!(s["idle"], 0, "no node to a user without demand");
        assert_eq!((s["A"], s["B"]), (3, 7));
        // Nobody has demand: split by weight, so that arrivals find nodes.
        let s = shares(&claims(&[("A", 2, 0), ("B", 3, 0)]), 10, &none);
        assert_eq!((s["A"], s["B"]), (4, 6));
        // Weight 0 never gets a node.
        let s = shares(&claims(&[("A", 0, 5), ("B", 1, 1)]), 3, &none);
        assert_eq!((s["A"], s["B"]), (0, 3));
    }

    /// Weighted max-min fairness, checked as "no node can move to a user that is short of
    /// its demand and raise the smaller of the two normalised shares", plus the lending rules.
    fn assert_max_min(claims: &BTreeMap<u32, Claim>, s: &BTreeMap<u32, u64>, nodes: u64) {
        let weighted: Vec<u32> = claims
            .iter()
            .filter(|(_, c)| c.weight > 0)
            .map(|(k, _)| *k)
            .collect();
        let expected = if weighted.is_empty() { 0 } else { nodes };
        assert_eq!(s.values().sum::<u64>(), expected, "{claims:?} {s:?}");
        // (s_v - 1) / w_v <= s_u / w_u: v's last node could not have gone to u more fairly.
        let no_fairer_move = |u: u32, v: u32| {
            let (cu, cv) = (claims[&u], claims[&v]);
            u == v
                || s[&v] == 0
                || (s[&v] - 1) as u128 * cu.weight as u128 <= s[&u] as u128 * cv.weight as u128
        };
        let demand: u64 = weighted.iter().map(|k| claims[k].demand).sum();
        for (u, c) in claims {
            if c.weight == 0 || (demand > 0 && c.demand == 0) {
                assert_eq!(s[u], 0, "{u} has no weight or no demand: {claims:?} {s:?}");
            }
        }
        if demand == 0 {
            // Everybody idle: split by weight alone.
            for u in &weighted {
                for v in &weighted {
                    assert!(no_fairer_move(*u, *v), "idle split {claims:?} {s:?}");
                }
            }
        } else if demand >= nodes {
            for u in &weighted {
                assert!(
                    s[u] <= claims[u].demand,
                    "{u} above its demand: {claims:?} {s:?}"
                );
                if s[u] < claims[u].demand {
                    for v in &weighted {
                        assert!(no_fairer_move(*u, *v), "{v}->{u}: {claims:?} {s:?}");
                    }
                }
            }
        } else {
            // Every demand met; the surplus is lent to the users with demand, by weight.
            let active: Vec<u32> = weighted
                .iter()
                .copied()
                .filter(|k| claims[k].demand > 0)
                .collect();
            for v in &active {
                assert!(s[v] >= claims[v].demand, "{v} short: {claims:?} {s:?}");
                if s[v] > claims[v].demand {
                    for u in &active {
                        assert!(no_fairer_move(*u, *v), "lent {v}->{u}: {claims:?} {s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn random_instances_are_max_min_fair_and_deterministic() {
        let mut rng = Rng::new(42);
        for _ in 0..2000 {
            let users = rng.range(1, 6) as u32;
            let claims: BTreeMap<u32, Claim> = (0..users)
                .map(|u| {
                    let weight = if rng.chance(10) { 0 } else { rng.range(1, 9) };
                    let demand = if rng.chance(30) { 0 } else { rng.range(1, 40) };
                    (u, Claim { weight, demand })
                })
                .collect();
            let nodes = rng.range(0, 30);
            let held: BTreeMap<u32, u64> = (0..users).map(|u| (u, rng.range(0, 5))).collect();
            let s = shares(&claims, nodes, &held);
            assert_max_min(&claims, &s, nodes);
            assert_eq!(s, shares(&claims, nodes, &held), "deterministic");
        }
    }

    #[test]
    fn allocation_moves_as_few_nodes_as_possible() {
        let mut rng = Rng::new(9);
        for _ in 0..1000 {
            let users = rng.range(1, 5) as u32;
            let claims: BTreeMap<u32, Claim> = (0..users)
                .map(|u| {
                    (
                        u,
                        Claim {
                            weight: rng.range(1, 5),
                            demand: rng.range(0, 20),
                        },
                    )
                })
                .collect();
            let nodes = ids(rng.range(1, 25));
            let mut current: BTreeMap<NodeId, u32> = BTreeMap::new();
            for n in &nodes {
                if rng.chance(80) {
                    // User `users` is gone: its nodes are free.
                    current.insert(*n, rng.below(users as usize + 1) as u32);
                }
            }
            let busy: BTreeMap<NodeId, u64> = nodes.iter().map(|n| (*n, rng.range(0, 3))).collect();
            let a = allocate(&claims, &nodes, &current, &busy);
            assert_eq!(a.len(), nodes.len(), "every node is assigned");
            let got = counts(&a);
            let want = shares(&claims, nodes.len() as u64, &{
                let mut h = BTreeMap::new();
                for (n, k) in &current {
                    if claims.contains_key(k) && nodes.contains(n) {
                        *h.entry(*k).or_insert(0) += 1;
                    }
                }
                h
            });
            for (k, c) in &want {
                assert_eq!(got.get(k).copied().unwrap_or(0), *c);
            }
            // Nodes taken from a user that still exists: exactly the surplus.
            let taken = current
                .iter()
                .filter(|(n, k)| claims.contains_key(*k) && a.get(*n) != Some(*k))
                .count() as u64;
            let surplus: u64 = claims
                .keys()
                .map(|k| {
                    let held = current.values().filter(|v| *v == k).count() as u64;
                    held.saturating_sub(want[k])
                })
                .sum();
            assert_eq!(taken, surplus, "{current:?} -> {a:?}");
            assert_eq!(
                a,
                allocate(&claims, &nodes, &current, &busy),
                "deterministic"
            );
        }
    }

    #[test]
    fn a_shrinking_user_gives_up_its_idle_nodes_first() {
        let c = claims(&[("A", 2, 100), ("B", 3, 100)]);
        let nodes = ids(10);
        let current: BTreeMap<NodeId, &str> = nodes.iter().map(|n| (*n, "A")).collect();
        // A runs tasks on the even nodes only.
        let busy: BTreeMap<NodeId, u64> = nodes.iter().map(|n| (*n, 1 - n.0 % 2)).collect();
        let a = allocate(&c, &nodes, &current, &busy);
        let kept: Vec<u64> = a
            .iter()
            .filter(|(_, k)| **k == "A")
            .map(|(n, _)| n.0)
            .collect();
        assert_eq!(
            kept,
            vec![0, 2, 4, 6],
            "A keeps four busy nodes, B gets the idle ones first"
        );
        assert_eq!(counts(&a)["B"], 6);
    }

    #[test]
    fn no_users_no_assignment() {
        let c: BTreeMap<&str, Claim> = BTreeMap::new();
        assert!(allocate(&c, &ids(3), &BTreeMap::new(), &BTreeMap::new()).is_empty());
    }
}
