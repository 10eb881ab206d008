//! From sizes back to instances: which legal MIG layout, and which of its instances, carry a
//! step's allocation (each tenant's inference GPCs, each running retraining's one instance).
//!
//! A tuple of sizes is realizable when some legal layout has one instance of each running
//! retraining's size and, among the others, a disjoint set per tenant adding up to its
//! inference GPCs with one instance of at least its minimum (P0 eq. 5: "at least one
//! `L`-GPC instance"). Any legal layout is a subset of a maximal one, so the 19 maximal
//! layouts of the A100 are enough to decide it ([`realizable`]); choosing the layout for a
//! step ([`realize`]) searches every legal layout (298 on the A100) that keeps the pinned
//! retraining instances, for the one closest to the previous step's.

use escher_proto::mig::{GpuModel, Layout, Placement, maximal_layouts};

/// One step's instances: the layout and who holds what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The layout.
    pub layout: Layout,
    /// Each tenant's inference replicas.
    pub inference: Vec<Vec<Placement>>,
    /// Each tenant's running retraining instance.
    pub retraining: Vec<Option<Placement>>,
}

impl Assignment {
    /// The tenant whose inference holds `p`, if any.
    pub fn inference_of(&self, p: &Placement) -> Option<usize> {
        self.inference.iter().position(|v| v.contains(p))
    }

    /// The tenant whose retraining holds `p`, if any.
    pub fn retraining_of(&self, p: &Placement) -> Option<usize> {
        self.retraining.iter().position(|r| r.as_ref() == Some(p))
    }

    /// Whether nothing holds `p`.
    pub fn is_idle(&self, p: &Placement) -> bool {
        self.inference_of(p).is_none() && self.retraining_of(p).is_none()
    }
}

/// Every legal layout of `model` over its base profiles (298 on the A100-40GB), sorted.
pub fn every_layout(model: GpuModel) -> Vec<Layout> {
    let profiles: Vec<_> = model.base_profiles().collect();
    let mut seen = std::collections::BTreeSet::from([Layout::new(model)]);
    let mut queue = vec![Layout::new(model)];
    while let Some(l) = queue.pop() {
        for &p in &profiles {
            for s in l.legal_starts(p) {
                let mut next = l.clone();
                if next.insert(Placement::new(p, s)).is_ok() && seen.insert(next.clone()) {
                    queue.push(next);
                }
            }
        }
    }
    seen.into_iter().collect()
}

/// Whether some legal layout realizes these inference GPCs and retraining sizes (0: none).
pub fn realizable(model: GpuModel, inference: &[u8], retraining: &[u8], mins: &[u8]) -> bool {
    maximal_layouts(model).iter().any(|l| {
        let instances = l.placements().to_vec();
        pick_retraining(&instances, retraining, 0, &mut Vec::new(), &mut |rest| {
            split(rest, inference, mins, &[]).is_some()
        })
    })
}

/// Tries every choice of one distinct instance per non-zero retraining size; `f` gets the
/// instances left. True as soon as `f` is.
fn pick_retraining(
    instances: &[Placement],
    sizes: &[u8],
    i: usize,
    taken: &mut Vec<Placement>,
    f: &mut dyn FnMut(&[Placement]) -> bool,
) -> bool {
    if i == sizes.len() {
        let rest: Vec<Placement> = instances
            .iter()
            .filter(|p| !taken.contains(p))
            .copied()
            .collect();
        return f(&rest);
    }
    if sizes[i] == 0 {
        return pick_retraining(instances, sizes, i + 1, taken, f);
    }
    for p in instances {
        if p.profile.compute == sizes[i] && !taken.contains(p) {
            taken.push(*p);
            let ok = pick_retraining(instances, sizes, i + 1, taken, f);
            taken.pop();
            if ok {
                return true;
            }
        }
    }
    false
}

/// Splits `instances` into one group per tenant adding up to `wants[m]` GPCs with an instance
/// of at least `mins[m]`, the rest idle; among the splits, the one that keeps the most
/// instances with the tenant `prefer` gives them to. `None` if there is none.
pub fn split(
    instances: &[Placement],
    wants: &[u8],
    mins: &[u8],
    prefer: &[Vec<Placement>],
) -> Option<Vec<Vec<Placement>>> {
    let n = wants.len();
    let mut groups = vec![Vec::new(); n];
    let mut best: Option<(usize, Vec<Vec<Placement>>)> = None;
    fn rec(
        i: usize,
        instances: &[Placement],
        wants: &[u8],
        mins: &[u8],
        prefer: &[Vec<Placement>],
        groups: &mut Vec<Vec<Placement>>,
        best: &mut Option<(usize, Vec<Vec<Placement>>)>,
    ) {
        if i == instances.len() {
            let ok = groups.iter().enumerate().all(|(m, g)| {
                g.iter().map(|p| p.profile.compute).sum::<u8>() == wants[m]
                    && g.iter().any(|p| p.profile.compute >= mins[m].max(1))
            });
            if ok {
                let kept = groups
                    .iter()
                    .enumerate()
                    .map(|(m, g)| {
                        g.iter()
                            .filter(|p| prefer.get(m).is_some_and(|v| v.contains(p)))
                            .count()
                    })
                    .sum();
                if best.as_ref().is_none_or(|(k, _)| kept > *k) {
                    *best = Some((kept, groups.clone()));
                }
            }
            return;
        }
        let p = instances[i];
        for m in 0..wants.len() {
            let sum: u8 = groups[m].iter().map(|q| q.profile.compute).sum();
            if sum + p.profile.compute <= wants[m] {
                groups[m].push(p);
                rec(i + 1, instances, wants, mins, prefer, groups, best);
                groups[m].pop();
            }
        }
        rec(i + 1, instances, wants, mins, prefer, groups, best);
    }
    let total: u8 = instances.iter().map(|p| p.profile.compute).sum();
    if wants.iter().sum::<u8>() > total || n == 0 {
        return None;
    }
    rec(0, instances, wants, mins, prefer, &mut groups, &mut best);
    best.map(|(_, g)| g)
}

/// The assignment for one step: among `candidates` (legal layouts) those holding every pin,
/// the one that realizes `inference` closest to `prev` (fewest instances destroyed or
/// created, then the most replicas kept with their tenant, then the fewest instances).
pub fn realize(
    candidates: &[Layout],
    inference: &[u8],
    pins: &[Option<Placement>],
    mins: &[u8],
    prev: Option<&Assignment>,
) -> Option<Assignment> {
    let mut best: Option<((usize, usize, usize), Assignment)> = None;
    let prefer: Vec<Vec<Placement>> = prev.map(|a| a.inference.clone()).unwrap_or_default();
    for layout in candidates {
        if !pins.iter().flatten().all(|p| layout.contains(p)) {
            continue;
        }
        let total: u8 = layout.used_compute();
        let pinned: u8 = pins.iter().flatten().map(|p| p.profile.compute).sum();
        if total < pinned + inference.iter().sum::<u8>() {
            continue;
        }
        let rest: Vec<Placement> = layout
            .placements()
            .iter()
            .filter(|p| !pins.iter().flatten().any(|q| q == *p))
            .copied()
            .collect();
        let Some(groups) = split(&rest, inference, mins, &prefer) else {
            continue;
        };
        let churn = match prev {
            Some(a) => {
                let (gone, new) = escher_proto::mig::diff(&a.layout, layout);
                gone.len() + new.len()
            }
            None => layout.len(),
        };
        let moved = groups
            .iter()
            .enumerate()
            .map(|(m, g)| {
                g.iter()
                    .filter(|p| !prefer.get(m).is_some_and(|v| v.contains(p)))
                    .count()
            })
            .sum();
        let key = (churn, moved, layout.len());
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((
                key,
                Assignment {
                    layout: layout.clone(),
                    inference: groups,
                    retraining: pins.to_vec(),
                },
            ));
        }
    }
    best.map(|(_, a)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A100: GpuModel = GpuModel::A100_40GB;

    #[test]
    fn every_layout_counts_298() {
        assert_eq!(every_layout(A100).len(), 298);
    }

    #[test]
    fn two_tenants_every_tuple_within_7_gpcs_is_realizable() {
        // With minimum 1, every (inference, inference, retraining, retraining) within 7 GPCs
        // has a layout; with a 2-GPC minimum, 1+1 splits fail.
        let mut count = 0;
        for a in 1..=7u8 {
            for b in 1..=7u8 {
                for r1 in 0..=4u8 {
                    for r2 in 0..=4u8 {
                        if a + b + r1 + r2 <= 7 {
                            count += 1;
                            assert!(
                                realizable(A100, &[a, b], &[r1, r2], &[1, 1]),
                                "{a} {b} {r1} {r2}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(count, 124);
        assert!(realizable(A100, &[2, 2], &[3, 0], &[2, 2]));
        // 3g + 3g leave no room for anything: memory is full.
        assert!(!realizable(A100, &[1, 0], &[3, 3], &[1, 0]));
    }

    #[test]
    fn realize_keeps_pins_and_prefers_the_previous_layout() {
        let all = every_layout(A100);
        let pin = Placement::new(A100.profile("2g.10gb").unwrap(), 0);
        let first = realize(&all, &[3, 2], &[Some(pin), None], &[1, 1], None).unwrap();
        assert!(first.layout.contains(&pin));
        assert_eq!(first.retraining, vec![Some(pin), None]);
        let sums: Vec<u8> = first
            .inference
            .iter()
            .map(|g| g.iter().map(|p| p.profile.compute).sum())
            .collect();
        assert_eq!(sums, [3, 2]);
        // The same sizes again: nothing changes.
        let again = realize(&all, &[3, 2], &[Some(pin), None], &[1, 1], Some(&first)).unwrap();
        assert_eq!(again, first);
    }
}
