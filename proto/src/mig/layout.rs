//! [`Layout`]: the MIG instances on one GPU, kept legal at every step.
//!
//! A layout is a set of [`Placement`]s of one [`GpuModel`], listed by start. Every way in
//! checks legality (NVIDIA's rules, MIG User Guide): each instance at one of its profile's
//! legal starts, no two instances sharing a memory slice, at most 7 GPCs in all, and no more
//! instances of a profile than it allows (one `+me`). [`Layout::validate`] re-checks all of it
//! and is what tests call after each step.
//!
//! [`Layout::place`] chooses the start itself, by MIGM's rule (§4.2): the legal start that keeps
//! the most fully configured layouts reachable, ties to the lowest start (see
//! [`best_start`](super::best_start)). The text form, read by [`Layout::parse`] and written by
//! `Display`, is `3g.20gb@4,2g.10gb@0`.

use std::collections::BTreeMap;
use std::fmt;

use super::profile::join;
use super::{GpuModel, MigError, Placement, Profile, best_start};

/// The MIG instances on one GPU of a given model; always legal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layout {
    model: GpuModel,
    /// Sorted by start; starts are distinct because placements never overlap.
    placements: Vec<Placement>,
}

impl Layout {
    /// An empty layout: MIG enabled, no instances.
    pub fn new(model: GpuModel) -> Layout {
        Layout {
            model,
            placements: Vec::new(),
        }
    }

    /// A layout of these placements, added in order; fails on the first illegal one.
    pub fn from_placements(
        model: GpuModel,
        placements: impl IntoIterator<Item = Placement>,
    ) -> Result<Layout, MigError> {
        let mut layout = Layout::new(model);
        for p in placements {
            layout.insert(p)?;
        }
        Ok(layout)
    }

    /// The GPU model.
    pub fn model(&self) -> GpuModel {
        self.model
    }

    /// The instances, by start.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// How many instances there are.
    pub fn len(&self) -> usize {
        self.placements.len()
    }

    /// Whether there are no instances.
    pub fn is_empty(&self) -> bool {
        self.placements.is_empty()
    }

    /// Whether this exact instance (profile and start) is in the layout.
    pub fn contains(&self, placement: &Placement) -> bool {
        self.placements.contains(placement)
    }

    /// Whether every instance of `self` is also in `other` (same model).
    pub fn is_subset_of(&self, other: &Layout) -> bool {
        self.model == other.model && self.placements.iter().all(|p| other.contains(p))
    }

    /// The instance starting at `start`, if any.
    pub fn at(&self, start: u8) -> Option<&Placement> {
        self.placements.iter().find(|p| p.start == start)
    }

    /// Occupied memory slices as a bitmap (bit `i` is memory slice `i`).
    pub fn occupied(&self) -> u8 {
        // A legal layout stays within the 8 memory slices.
        self.placements.iter().fold(0, |m, p| m | p.mask() as u8)
    }

    /// GPCs taken by the instances.
    pub fn used_compute(&self) -> u8 {
        self.placements.iter().map(|p| p.profile.compute).sum()
    }

    /// GPCs still free.
    pub fn free_compute(&self) -> u8 {
        self.model
            .compute_slices()
            .saturating_sub(self.used_compute())
    }

    /// Memory slices taken by the instances.
    pub fn used_memory_slices(&self) -> u8 {
        self.occupied().count_ones() as u8
    }

    /// Memory slices still free (not necessarily usable: see [`Layout::legal_starts`]).
    pub fn free_memory_slices(&self) -> u8 {
        self.model
            .memory_slices()
            .saturating_sub(self.used_memory_slices())
    }

    /// How many instances of each profile there are, by profile name.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for p in &self.placements {
            *counts.entry(p.profile.name).or_insert(0) += 1;
        }
        counts
    }

    /// The instances' GPC counts, largest first: the layout's GPC multiset (`[4, 2, 1]`).
    pub fn compute_sizes(&self) -> Vec<u8> {
        let mut sizes: Vec<u8> = self.placements.iter().map(|p| p.profile.compute).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes
    }

    /// Why `profile` cannot be added at `start`, or `Ok` if it can.
    ///
    /// The checks, in order: the profile belongs to the model, the start is one of its legal
    /// starts, the profile's instance limit, free GPCs, and overlap with an existing instance
    /// (the lowest-starting one is named).
    pub fn check_place(&self, profile: &'static Profile, start: u8) -> Result<(), MigError> {
        if !self.model.has_profile(profile) {
            return Err(self.unknown_profile(profile));
        }
        if !profile.is_legal_start(start) {
            return Err(MigError::IllegalStart {
                profile: profile.name,
                start,
                legal: profile.starts_text(),
            });
        }
        self.check_room(profile)?;
        let wanted = Placement { profile, start };
        if let Some((existing, shared)) = self
            .placements
            .iter()
            .find_map(|p| wanted.overlap(p).map(|r| (p, r)))
        {
            return Err(MigError::Overlap {
                placement: wanted.to_string(),
                existing: existing.to_string(),
                first: shared.start,
                end: shared.end,
            });
        }
        Ok(())
    }

    /// Whether `profile` can be added at `start`: [`Layout::check_place`] without building
    /// the error, for the enumeration's inner loop.
    pub fn can_place(&self, profile: &'static Profile, start: u8) -> bool {
        let wanted = Placement { profile, start };
        self.model.has_profile(profile)
            && profile.is_legal_start(start)
            && self.count_of(profile) < usize::from(profile.max_instances)
            && self.free_compute() >= profile.compute
            && u32::from(self.occupied()) & wanted.mask() == 0
    }

    /// How many instances of `profile` there are.
    fn count_of(&self, profile: &Profile) -> usize {
        self.placements
            .iter()
            .filter(|p| p.profile == profile)
            .count()
    }

    /// The starts at which `profile` can be added now, ascending (empty if the profile is not
    /// the model's).
    pub fn legal_starts(&self, profile: &'static Profile) -> Vec<u8> {
        profile
            .starts
            .iter()
            .copied()
            .filter(|&s| self.can_place(profile, s))
            .collect()
    }

    /// Adds an instance at the start it names; fails, changing nothing, if that is illegal.
    pub fn insert(&mut self, placement: Placement) -> Result<(), MigError> {
        self.check_place(placement.profile, placement.start)?;
        self.insert_unchecked(placement);
        Ok(())
    }

    /// Adds an instance of `profile` at the start MIGM's rule picks (the one that keeps the
    /// most fully configured layouts reachable, ties to the lowest), and returns it.
    ///
    /// Fails, changing nothing, when no legal start is free; the error says whether GPCs,
    /// memory slices or a free legal start are missing, and what blocks each start.
    pub fn place(&mut self, profile: &'static Profile) -> Result<Placement, MigError> {
        if !self.model.has_profile(profile) {
            return Err(self.unknown_profile(profile));
        }
        let Some(start) = best_start(self, profile) else {
            return Err(self.why_no_room(profile));
        };
        let placement = Placement { profile, start };
        self.insert_unchecked(placement);
        Ok(placement)
    }

    /// Removes the instance that starts at `start`, returning it.
    pub fn remove(&mut self, start: u8) -> Option<Placement> {
        let i = self.placements.iter().position(|p| p.start == start)?;
        Some(self.placements.remove(i))
    }

    /// Whether no profile of the model, base or extra, can be added any more.
    pub fn is_maximal(&self) -> bool {
        self.model
            .profiles()
            .iter()
            .all(|p| self.legal_starts(p).is_empty())
    }

    /// Re-checks every rule: each instance a profile of the model at a legal start, starts
    /// ascending, no shared memory slice, instance limits, at most 7 GPCs and 8 memory slices.
    pub fn validate(&self) -> Result<(), MigError> {
        let mut fresh = Layout::new(self.model);
        for p in &self.placements {
            fresh.insert(*p)?;
        }
        // Internal invariant (every way in keeps it), so a bug rather than a user error.
        assert!(
            self.placements.windows(2).all(|w| w[0].start < w[1].start),
            "layout not sorted by start: {self}"
        );
        Ok(())
    }

    /// Adds without checking; callers have checked. Keeps the start order.
    pub(super) fn insert_unchecked(&mut self, placement: Placement) {
        let i = self
            .placements
            .partition_point(|p| p.start < placement.start);
        self.placements.insert(i, placement);
    }

    /// Instance limit and free GPCs, the checks that do not depend on the start.
    fn check_room(&self, profile: &'static Profile) -> Result<(), MigError> {
        if self.count_of(profile) >= usize::from(profile.max_instances) {
            return Err(MigError::TooManyInstances {
                profile: profile.name,
                max: profile.max_instances,
            });
        }
        if self.free_compute() < profile.compute {
            return Err(MigError::NotEnoughCompute {
                profile: profile.name,
                needed: profile.compute,
                free: self.free_compute(),
            });
        }
        Ok(())
    }

    /// The error for a profile that is not one of the model's.
    fn unknown_profile(&self, profile: &Profile) -> MigError {
        MigError::UnknownProfile {
            model: self.model,
            profile: profile.name.to_string(),
            valid: join(self.model.profiles().iter().map(|p| p.name)),
        }
    }

    /// The error for a profile with no free legal start.
    fn why_no_room(&self, profile: &'static Profile) -> MigError {
        if let Err(e) = self.check_room(profile) {
            return e;
        }
        if self.free_memory_slices() < profile.memory_slices {
            return MigError::NotEnoughMemory {
                profile: profile.name,
                needed: profile.memory_slices,
                free: self.free_memory_slices(),
            };
        }
        let blocked = profile.starts.iter().map(|&s| {
            let wanted = Placement { profile, start: s };
            match self.placements.iter().find(|p| wanted.overlap(p).is_some()) {
                Some(p) => format!("{s}: overlaps {p}"),
                None => format!("{s}: free"),
            }
        });
        MigError::NoRoom {
            profile: profile.name,
            blocked: join(blocked),
        }
    }
}

impl fmt::Display for Layout {
    /// The explicit form `1g.5gb@0,2g.10gb@2,3g.20gb@4`, which [`Layout::parse`] reads back;
    /// an empty layout is the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.placements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::reachability;
    use super::*;

    const A100: GpuModel = GpuModel::A100_40GB;

    fn p(name: &str) -> &'static Profile {
        A100.profile(name).unwrap()
    }

    fn layout(text: &str) -> Layout {
        Layout::parse(A100, text).unwrap()
    }

    #[test]
    fn migm_example_a_20gb_instance_after_two_5gb_fits_only_at_4() {
        // MIGM §4.1: from (5GB, 5GB, 30GB free) a 20 GB instance can only go to
        // (5, 5, 10 free, 20); (5, 5, 20, 10 free) is illegal.
        let mut l = layout("1g.5gb@0,1g.5gb@1");
        assert_eq!(l.free_memory_slices(), 6);
        assert_eq!(l.legal_starts(p("3g.20gb")), [4]);
        assert_eq!(l.legal_starts(p("4g.20gb")), Vec::<u8>::new());
        assert_eq!(
            l.check_place(p("3g.20gb"), 2).unwrap_err().to_string(),
            "3g.20gb@2: 2 is not a legal start for 3g.20gb (legal starts: 0, 4)"
        );
        assert_eq!(
            l.check_place(p("3g.20gb"), 0).unwrap_err().to_string(),
            "3g.20gb@0 overlaps 1g.5gb@0 on memory slices 0..1"
        );
        assert_eq!(l.place(p("3g.20gb")).unwrap().to_string(), "3g.20gb@4");
        assert_eq!(l.to_string(), "1g.5gb@0,1g.5gb@1,3g.20gb@4");
        // The 10 GB left is still usable: the state can be extended (MIGM's validity).
        assert!(reachability(&l) > 0);
        assert_eq!(l.legal_starts(p("2g.10gb")), [2]);
    }

    #[test]
    fn seven_1g_fill_the_gpu() {
        let mut l = Layout::new(A100);
        for _ in 0..7 {
            l.place(p("1g.5gb")).unwrap();
        }
        assert_eq!(
            l.to_string(),
            (0..7)
                .map(|s| format!("1g.5gb@{s}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            (l.free_compute(), l.free_memory_slices(), l.occupied()),
            (0, 1, 0x7f)
        );
        assert!(l.is_maximal());
        assert_eq!(l.counts(), BTreeMap::from([("1g.5gb", 7)]));
        assert_eq!(
            l.place(p("1g.5gb")).unwrap_err().to_string(),
            "1g.5gb: at most 7 instance(s) of this profile fit on one GPU and the layout \
             already has 7"
        );
    }

    #[test]
    fn two_20gb_instances_are_a_4g_and_a_3g() {
        for text in ["4g.20gb,3g.20gb", "3g.20gb,4g.20gb"] {
            let l = layout(text);
            assert_eq!(l.to_string(), "4g.20gb@0,3g.20gb@4", "{text}");
            assert_eq!(l.compute_sizes(), [4, 3]);
            assert!(l.is_maximal());
        }
        // Two 3g leave one GPC stranded but all memory used.
        let l = layout("3g.20gb,3g.20gb");
        assert_eq!((l.free_compute(), l.free_memory_slices()), (1, 0));
        assert!(l.is_maximal());
    }

    #[test]
    fn accessors_and_remove() {
        let mut l = layout("2g.10gb@0,1g.5gb@2,3g.20gb@4");
        assert_eq!((l.len(), l.used_compute(), l.free_compute()), (3, 6, 1));
        assert_eq!((l.used_memory_slices(), l.free_memory_slices()), (7, 1));
        assert_eq!(l.occupied(), 0b1111_0111);
        assert_eq!(
            l.counts(),
            BTreeMap::from([("1g.5gb", 1), ("2g.10gb", 1), ("3g.20gb", 1)])
        );
        assert_eq!(l.at(4).unwrap().to_string(), "3g.20gb@4");
        assert!(!l.is_maximal());
        assert_eq!(l.legal_starts(p("1g.5gb")), [3]);
        assert_eq!(l.remove(2).unwrap().to_string(), "1g.5gb@2");
        assert_eq!(l.remove(2), None);
        assert_eq!(l.legal_starts(p("2g.10gb")), [2]);
        assert!(layout("2g.10gb@0").is_subset_of(&l));
        assert!(!layout("2g.10gb@2").is_subset_of(&l));
        l.validate().unwrap();
    }

    #[test]
    fn extras_share_the_geometry() {
        // 1g.10gb takes two memory slices, even starts, and reaches slice 7.
        let l = layout("3g.20gb@0,2g.10gb@4,1g.10gb@6");
        assert_eq!((l.free_compute(), l.free_memory_slices()), (1, 0));
        assert!(l.is_maximal());
        // One +me instance at most, beside plain 1g instances.
        let l = layout("1g.5gb+me,1g.5gb,1g.5gb");
        assert_eq!(
            l.counts(),
            BTreeMap::from([("1g.5gb", 2), ("1g.5gb+me", 1)])
        );
        assert!(!l.can_place(p("1g.5gb+me"), 0));
        // A profile of another model is refused.
        let h100 = GpuModel::H100_80GB.profile("1g.10gb").unwrap();
        assert!(!Layout::new(A100).can_place(h100, 0));
        assert!(matches!(
            Layout::new(A100).place(h100),
            Err(MigError::UnknownProfile { .. })
        ));
    }

    #[test]
    fn legal_and_illegal_layouts() {
        let legal = [
            "",
            "7g.40gb@0",
            "4g.20gb@0,2g.10gb@4,1g.5gb@6",
            "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4",
            "3g.20gb@0,3g.20gb@4",
            "1g.10gb@0,1g.10gb@2,1g.10gb@4,1g.10gb@6",
            "1g.5gb@6",
        ];
        for text in legal {
            let l = layout(text);
            l.validate().unwrap();
            assert_eq!(l.to_string(), text);
        }
        let illegal = [
            (
                "2g.10gb@1",
                "2g.10gb@1: 1 is not a legal start for 2g.10gb (legal starts: 0, 2, 4)",
            ),
            (
                "1g.5gb@7",
                "1g.5gb@7: 7 is not a legal start for 1g.5gb (legal starts: 0, 1, 2, 3, 4, 5, 6)",
            ),
            (
                "4g.20gb@4",
                "4g.20gb@4: 4 is not a legal start for 4g.20gb (legal starts: 0)",
            ),
            (
                "4g.20gb@0,2g.10gb@2",
                "2g.10gb@2 overlaps 4g.20gb@0 on memory slices 2..4",
            ),
            (
                "3g.20gb@4,1g.5gb@6",
                "1g.5gb@6 overlaps 3g.20gb@4 on memory slices 6..7",
            ),
            (
                "7g.40gb@0,7g.40gb@0",
                "7g.40gb: at most 1 instance(s) of this profile fit on one GPU and the layout already has 1",
            ),
            (
                "4g.20gb@0,3g.20gb@4,1g.10gb@6",
                "1g.10gb needs 1 GPC(s) but only 0 of 7 are free",
            ),
        ];
        for (text, why) in illegal {
            let e = Layout::parse(A100, text).unwrap_err();
            let MigError::Entry { reason, .. } = &e else {
                panic!("{e:?}")
            };
            assert_eq!(reason.to_string(), why, "{text}");
        }
    }

    #[test]
    fn can_place_agrees_with_check_place() {
        // Over every sub-layout of every maximal layout over all profiles.
        for max in reachability::maximal_layouts_with(A100, A100.profiles()) {
            let n = max.len();
            for mask in 0u32..(1 << n) {
                let sub = Layout::from_placements(
                    A100,
                    (0..n)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| max.placements()[i]),
                )
                .unwrap();
                for profile in A100.profiles() {
                    for start in 0..8 {
                        assert_eq!(
                            sub.can_place(profile, start),
                            sub.check_place(profile, start).is_ok(),
                            "{sub} + {profile}@{start}"
                        );
                    }
                }
            }
        }
    }

    /// A model and a sequence of profile picks (indices into its table).
    fn picks() -> impl Strategy<Value = (GpuModel, Vec<usize>)> {
        (
            0..GpuModel::ALL.len(),
            prop::collection::vec(0..7usize, 0..12),
        )
            .prop_map(|(m, picks)| (GpuModel::ALL[m], picks))
    }

    proptest! {
        #[test]
        fn random_layouts_built_by_place_round_trip((model, picks) in picks()) {
            let mut l = Layout::new(model);
            for i in picks {
                let profile = &model.profiles()[i % model.profiles().len()];
                let before = l.clone();
                let starts = l.legal_starts(profile);
                match l.place(profile) {
                    Ok(placed) => {
                        prop_assert!(starts.contains(&placed.start));
                        prop_assert_eq!(Some(placed.start), best_start(&before, profile));
                        prop_assert!(before.is_subset_of(&l));
                    }
                    Err(_) => {
                        prop_assert!(starts.is_empty());
                        prop_assert_eq!(&l, &before);
                    }
                }
                l.validate().unwrap();
                prop_assert!(reachability(&l) >= 1);
                let text = l.to_string();
                prop_assert_eq!(Layout::parse(model, &text).unwrap(), l.clone());
            }
        }
    }
}
