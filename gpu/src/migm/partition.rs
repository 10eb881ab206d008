//! MIGM's partition manager (P2 §4.2): which instance to create for a memory request, by the
//! *future configuration reachability* rule, and how to make room by **fusion** (merging idle
//! neighbours) or **fission** (splitting a bigger idle instance) when no legal start is free.
//!
//! A request is a memory class: the smallest base-profile memory that holds the job (5, 10, 20
//! or 40 GB on an A100-40GB). A class may have several profiles (20 GB is both `3g.20gb` and
//! `4g.20gb`); any of them serves it. Among every legal (profile, start) of the class,
//! [`allocate`] picks the successor layout with the most reachable fully configured layouts
//! (Algorithm 3), ties to more GPCs (two 20 GB instances are a 4g and a 3g, not two 3g that
//! strand a GPC: MIGM §5.2.1's 4/7 and 3/7) and then the lowest start; the reachability itself is
//! `escher_proto::mig::reachability` (Algorithm 2's count, computed on demand: a few thousand
//! layouts at most).

use escher_proto::mig::{GpuModel, Layout, Placement, Profile, reachability};

use crate::GpuView;

/// The memory classes of `model`'s base profiles, ascending, GB (5, 10, 20, 40 on an
/// A100-40GB).
pub fn classes(model: GpuModel) -> Vec<u32> {
    let mut c: Vec<u32> = model.base_profiles().map(|p| p.memory_gb).collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// The smallest class that holds `gb` of memory; `None` when even the whole GPU is too small.
pub fn class_for(model: GpuModel, gb: f64) -> Option<u32> {
    classes(model).into_iter().find(|&c| f64::from(c) >= gb)
}

/// The class after `class`, if any.
pub fn next_class(model: GpuModel, class: u32) -> Option<u32> {
    classes(model).into_iter().find(|&c| c > class)
}

/// The base profiles of a class, fewest GPCs first.
pub fn profiles_of(model: GpuModel, class: u32) -> Vec<&'static Profile> {
    let mut p: Vec<&'static Profile> = model
        .base_profiles()
        .filter(|p| p.memory_gb == class)
        .collect();
    p.sort_by_key(|p| p.compute);
    p
}

/// The instance to create for `class` in `layout` by the reachability rule (ties to more
/// GPCs, then the lowest start), or `None` when no legal start of any of its profiles is free.
pub fn allocate(layout: &Layout, class: u32) -> Option<Placement> {
    let mut best: Option<(usize, u8, std::cmp::Reverse<u8>, Placement)> = None;
    for profile in profiles_of(layout.model(), class) {
        for start in layout.legal_starts(profile) {
            let p = Placement::new(profile, start);
            let mut next = layout.clone();
            if next.insert(p).is_err() {
                continue;
            }
            let key = (
                reachability(&next),
                profile.compute,
                std::cmp::Reverse(start),
                p,
            );
            if best
                .as_ref()
                .is_none_or(|b| (key.0, key.1, key.2) > (b.0, b.1, b.2))
            {
                best = Some(key);
            }
        }
    }
    best.map(|b| b.3)
}

/// A way to make room for `class` out of idle instances: destroy these, then create that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    /// Idle instances to destroy.
    pub destroy: Vec<Placement>,
    /// The instance to create in their place.
    pub create: Placement,
}

/// Fusion or fission: the cheapest set of **idle** instances whose removal lets an instance
/// of `class` be created, and that instance; `None` if busy instances are in the way of
/// every placement. Cheapest is fewest GPCs destroyed, then the most reachable result.
pub fn reshape(gpu: &GpuView, class: u32) -> Option<Reshape> {
    let layout = &gpu.layout;
    let idle: Vec<Placement> = gpu.idle().collect();
    let mut best: Option<((std::cmp::Reverse<u8>, usize), Reshape)> = None;
    for profile in profiles_of(layout.model(), class) {
        for &start in profile.starts {
            let wanted = Placement::new(profile, start);
            let blocking: Vec<Placement> = layout
                .placements()
                .iter()
                .filter(|p| p.overlap(&wanted).is_some())
                .copied()
                .collect();
            if blocking.is_empty() || !blocking.iter().all(|b| idle.contains(b)) {
                continue;
            }
            let mut next = layout.clone();
            for b in &blocking {
                next.remove(b.start);
            }
            // Too few GPCs left: also give up the smallest other idle instances.
            let mut destroy = blocking;
            let mut spare: Vec<Placement> = idle
                .iter()
                .filter(|p| !destroy.contains(p))
                .copied()
                .collect();
            spare.sort_by_key(|p| (p.profile.compute, p.start));
            let mut spare = spare.into_iter();
            while !next.can_place(profile, start) {
                let Some(s) = spare.next() else { break };
                next.remove(s.start);
                destroy.push(s);
            }
            if next.insert(wanted).is_err() {
                continue;
            }
            let cost: u8 = destroy.iter().map(|p| p.profile.compute).sum();
            let key = (std::cmp::Reverse(cost), reachability(&next));
            if best.as_ref().is_none_or(|(k, _)| key > *k) {
                best = Some((
                    key,
                    Reshape {
                        destroy,
                        create: wanted,
                    },
                ));
            }
        }
    }
    best.map(|(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Instance, InstanceState};
    use escher_proto::types::TaskId;

    const A100: GpuModel = GpuModel::A100_40GB;

    fn layout(text: &str) -> Layout {
        Layout::parse(A100, text).unwrap()
    }

    fn view(text: &str, busy: &[u8]) -> GpuView {
        let layout = layout(text);
        let instances = layout
            .placements()
            .iter()
            .map(|p| Instance {
                placement: *p,
                state: if busy.contains(&p.start) {
                    InstanceState::Busy(TaskId(u64::from(p.start)))
                } else {
                    InstanceState::Idle
                },
            })
            .collect();
        GpuView { instances, layout }
    }

    #[test]
    fn classes_and_tight_fit() {
        assert_eq!(classes(A100), [5, 10, 20, 40]);
        assert_eq!(class_for(A100, 4.7), Some(5));
        assert_eq!(class_for(A100, 5.0), Some(5));
        assert_eq!(class_for(A100, 12.2), Some(20));
        assert_eq!(class_for(A100, 41.0), None);
        assert_eq!(next_class(A100, 10), Some(20));
        assert_eq!(next_class(A100, 40), None);
        let names: Vec<_> = profiles_of(A100, 20).iter().map(|p| p.name).collect();
        assert_eq!(names, ["3g.20gb", "4g.20gb"]);
    }

    #[test]
    fn the_worked_example_a_5gb_request_goes_to_the_last_slice() {
        // MIGM §4.2: on an empty A100 a 5 GB request has seven placements; the last slice keeps
        // the most fully configured layouts reachable (12 here, 6 for the others).
        let p = allocate(&Layout::new(A100), 5).unwrap();
        assert_eq!(p.to_string(), "1g.5gb@6");
        // Then a 20 GB request next to two 5 GB instances can only go to slice 4 (§4.1).
        assert_eq!(
            allocate(&layout("1g.5gb@0,1g.5gb@1"), 20)
                .unwrap()
                .to_string(),
            "3g.20gb@4"
        );
        // A 20 GB request on an empty GPU: 3g@4 keeps 6 layouts reachable, 4g@0 and 3g@0 keep
        // 3 each.
        assert_eq!(
            allocate(&Layout::new(A100), 20).unwrap().to_string(),
            "3g.20gb@4"
        );
        assert_eq!(allocate(&layout("7g.40gb"), 5), None);
    }

    #[test]
    fn reachability_rule_is_greedy_over_successors() {
        // Every choice allocate makes is a successor with maximal reachability.
        let mut l = Layout::new(A100);
        for class in [10, 5, 5, 10, 5] {
            let chosen = allocate(&l, class).unwrap();
            let mut best = 0;
            for profile in profiles_of(A100, class) {
                for s in l.legal_starts(profile) {
                    let mut n = l.clone();
                    n.insert(Placement::new(profile, s)).unwrap();
                    best = best.max(reachability(&n));
                }
            }
            l.insert(chosen).unwrap();
            assert_eq!(reachability(&l), best, "{l}");
        }
        l.validate().unwrap();
    }

    #[test]
    fn fusion_merges_idle_neighbours_and_fission_splits() {
        // Fusion: two idle 1g next to each other become a 2g.
        let gpu = view(
            "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6",
            &[0, 1, 2, 3, 6],
        );
        let r = reshape(&gpu, 10).unwrap();
        assert_eq!(r.create.to_string(), "2g.10gb@4");
        assert_eq!(r.destroy.len(), 2);
        // Fission: an idle 3g becomes a 1g (the cheapest placement that frees enough).
        let gpu = view("4g.20gb@0,3g.20gb@4", &[0]);
        let r = reshape(&gpu, 5).unwrap();
        assert_eq!(
            r.destroy.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["3g.20gb@4"]
        );
        assert_eq!(r.create.profile.name, "1g.5gb");
        // Nothing idle in the way: no reshape.
        let gpu = view("4g.20gb@0,3g.20gb@4", &[0, 4]);
        assert_eq!(reshape(&gpu, 5), None);
    }
}
