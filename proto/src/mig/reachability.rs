//! Fully configured (maximal) layouts and MIGM's "future configuration reachability".
//!
//! A layout is **maximal** over a set of profiles when no instance of any of them can be added.
//! MIGM (§4.2) models a GPU as a state machine whose final states are these maximal layouts,
//! and scores a partial layout by its *future configuration reachability*: how many final
//! states it can still grow into by adding instances, never moving one. Its allocator
//! (Algorithm 3) places a new instance at the start whose successor scores highest;
//! [`best_start`] does that, ties going to the lowest start.
//!
//! **Which profiles count.** MIGM's state machine knows only the base sizes (5, 10, 20, 40 GB
//! on the A100-40GB), and so does our count of 19 maximal layouts (14 GPC multisets), found by
//! enumerating NVIDIA's placement table (MIG User Guide, `nvidia-smi mig -lgipp`). So:
//! - [`maximal_layouts`] enumerates over the model's five base profiles;
//!   [`maximal_layouts_with`] takes any profile set (all seven A100-40GB profiles give 239).
//! - [`reachable`] and [`reachability`] count over the profiles *in play*: the base profiles
//!   plus any extra (`+me`, id 15) profile the layout already uses; [`reachable_with`] takes
//!   the set explicitly. Over a fixed set, adding an instance never raises the count. Adding
//!   the first instance of an extra profile enlarges the set and can (on the A100-40GB,
//!   `1g.10gb@6` is reachable to 33 layouts over base + `1g.10gb`, against 19 for the empty
//!   GPU over the base).
//! - [`best_start`] compares the candidate starts over one set, the profiles in play plus the
//!   profile being placed, so the comparison is always like with like.
//!
//! **MIGM's worked example**, for a 1g on an empty A100-40GB, scores the first slices 7 and
//! the last 9, then says it places "on the second slice"; the counting rule is not stated.
//! Counting maximal supersets as here gives 6 for starts 0 to 5 and 12 for start 6, so a lone
//! 1g goes to start 6 (the last slice, which MIGM's own scores also rank highest).
//!
//! Enumeration is a depth-first search over the candidate placements (each profile at each
//! legal start), taking or skipping each in turn; it visits every legal layout once, a few
//! thousand at most, and returns the maximal ones sorted.

use super::{GpuModel, Layout, Placement, Profile};

/// Every maximal layout of `model` over its five base profiles, sorted.
///
/// For the A100-40GB (and every model here, which all share its placement table) there are
/// 19, with 14 distinct GPC multisets.
pub fn maximal_layouts(model: GpuModel) -> Vec<Layout> {
    maximal_layouts_with(model, model.base_profiles())
}

/// Every layout of `model` built from `profiles` to which none of `profiles` can be added,
/// sorted. Profiles of another model are ignored.
pub fn maximal_layouts_with(
    model: GpuModel,
    profiles: impl IntoIterator<Item = &'static Profile>,
) -> Vec<Layout> {
    reachable_with(&Layout::new(model), profiles)
}

/// The maximal layouts (over the profiles in play: the base ones and those `layout` uses) that
/// `layout` can grow into by adding instances, sorted.
pub fn reachable(layout: &Layout) -> Vec<Layout> {
    reachable_with(layout, in_play(layout, None))
}

/// How many maximal layouts `layout` can grow into: MIGM's future configuration reachability.
pub fn reachability(layout: &Layout) -> usize {
    reachable(layout).len()
}

/// The maximal layouts over `profiles` that contain `layout`, sorted. The layout's own
/// instances are kept whatever their profile; maximality is judged over `profiles` only.
pub fn reachable_with(
    layout: &Layout,
    profiles: impl IntoIterator<Item = &'static Profile>,
) -> Vec<Layout> {
    let model = layout.model();
    let mut set: Vec<&'static Profile> = Vec::new();
    for p in profiles {
        if model.has_profile(p) && !set.contains(&p) {
            set.push(p);
        }
    }
    let candidates: Vec<Placement> = set
        .iter()
        .flat_map(|&p| p.starts.iter().map(move |&s| Placement::new(p, s)))
        .filter(|c| layout.can_place(c.profile, c.start))
        .collect();
    let mut out = Vec::new();
    extend(&mut layout.clone(), &candidates, 0, &mut out);
    out.sort();
    out
}

/// The start at which adding `profile` to `layout` keeps the most maximal layouts reachable
/// (MIGM Algorithm 3), ties to the lowest start; `None` if it fits nowhere.
///
/// Every candidate is scored over the same profile set: the profiles in play plus `profile`.
pub fn best_start(layout: &Layout, profile: &'static Profile) -> Option<u8> {
    let set = in_play(layout, Some(profile));
    let mut best: Option<(usize, u8)> = None;
    for start in layout.legal_starts(profile) {
        let mut next = layout.clone();
        next.insert_unchecked(Placement::new(profile, start));
        let score = reachable_with(&next, set.iter().copied()).len();
        // Strictly greater: the lowest start wins a tie.
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, start));
        }
    }
    best.map(|(_, start)| start)
}

/// The base profiles, those `layout` uses and `extra`, in table order.
fn in_play(layout: &Layout, extra: Option<&'static Profile>) -> Vec<&'static Profile> {
    let used = |p: &Profile| layout.placements().iter().any(|q| q.profile == p);
    layout
        .model()
        .profiles()
        .iter()
        .filter(|p| p.base || used(p) || extra.is_some_and(|e| e == *p))
        .collect()
}

/// Takes or skips each candidate from `i` on; at the end, keeps the layout if no candidate
/// fits any more.
fn extend(layout: &mut Layout, candidates: &[Placement], i: usize, out: &mut Vec<Layout>) {
    let Some(&c) = candidates.get(i) else {
        if candidates
            .iter()
            .all(|c| !layout.can_place(c.profile, c.start))
        {
            out.push(layout.clone());
        }
        return;
    };
    if layout.can_place(c.profile, c.start) {
        layout.insert_unchecked(c);
        extend(layout, candidates, i + 1, out);
        layout.remove(c.start);
    }
    extend(layout, candidates, i + 1, out);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const A100: GpuModel = GpuModel::A100_40GB;

    fn p(name: &str) -> &'static Profile {
        A100.profile(name).unwrap()
    }

    fn layout(text: &str) -> Layout {
        Layout::parse(A100, text).unwrap()
    }

    fn texts(layouts: &[Layout]) -> Vec<String> {
        layouts.iter().map(Layout::to_string).collect()
    }

    /// The 19 maximal layouts of the A100-40GB over its five base profiles, in sorted order.
    const A100_MAXIMAL: [&str; 19] = [
        "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,2g.10gb@4,1g.5gb@6",
        "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,3g.20gb@4",
        "1g.5gb@0,1g.5gb@1,2g.10gb@2,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "1g.5gb@0,1g.5gb@1,2g.10gb@2,2g.10gb@4,1g.5gb@6",
        "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4",
        "2g.10gb@0,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "2g.10gb@0,1g.5gb@2,1g.5gb@3,2g.10gb@4,1g.5gb@6",
        "2g.10gb@0,1g.5gb@2,1g.5gb@3,3g.20gb@4",
        "2g.10gb@0,2g.10gb@2,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "2g.10gb@0,2g.10gb@2,2g.10gb@4,1g.5gb@6",
        "2g.10gb@0,2g.10gb@2,3g.20gb@4",
        "3g.20gb@0,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "3g.20gb@0,2g.10gb@4,1g.5gb@6",
        "3g.20gb@0,3g.20gb@4",
        "4g.20gb@0,1g.5gb@4,1g.5gb@5,1g.5gb@6",
        "4g.20gb@0,2g.10gb@4,1g.5gb@6",
        "4g.20gb@0,3g.20gb@4",
        "7g.40gb@0",
    ];

    #[test]
    fn a100_40gb_has_19_maximal_layouts() {
        let all = maximal_layouts(A100);
        assert_eq!(texts(&all), A100_MAXIMAL);
        for l in &all {
            l.validate().unwrap();
            assert!(l.is_maximal(), "{l}");
        }
    }

    #[test]
    fn they_collapse_to_14_gpc_multisets_11_full_and_3_stranding_one() {
        let mut multisets: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
        for l in maximal_layouts(A100) {
            *multisets.entry(l.compute_sizes()).or_default() += 1;
        }
        let full: Vec<_> = multisets
            .keys()
            .filter(|m| m.iter().sum::<u8>() == 7)
            .collect();
        let stranding: Vec<_> = multisets
            .keys()
            .filter(|m| m.iter().sum::<u8>() == 6)
            .collect();
        assert_eq!(multisets.len(), 14);
        let v = |m: &[&[u8]]| m.iter().map(|x| x.to_vec()).collect::<Vec<_>>();
        // Our enumeration of the placement table: {7}, {4,3}, {4,2,1}, {4,1,1,1}, {3,2,2},
        // {3,2,1,1}, {3,1,1,1,1}, {2,2,2,1}, {2,2,1,1,1}, {2,1^5}, {1^7}; stranding one: {3,3},
        // {3,2,1}, {3,1,1,1}.
        assert_eq!(
            full.into_iter().cloned().collect::<Vec<_>>(),
            v(&[
                &[1, 1, 1, 1, 1, 1, 1],
                &[2, 1, 1, 1, 1, 1],
                &[2, 2, 1, 1, 1],
                &[2, 2, 2, 1],
                &[3, 1, 1, 1, 1],
                &[3, 2, 1, 1],
                &[3, 2, 2],
                &[4, 1, 1, 1],
                &[4, 2, 1],
                &[4, 3],
                &[7],
            ])
        );
        assert_eq!(
            stranding.into_iter().cloned().collect::<Vec<_>>(),
            v(&[&[3, 1, 1, 1], &[3, 2, 1], &[3, 3]])
        );
        // The multisets that occur more than once: several placements of the same sizes.
        let repeated: Vec<_> = multisets.iter().filter(|(_, n)| **n > 1).collect();
        assert_eq!(
            repeated,
            [
                (&vec![2, 1, 1, 1, 1, 1], &3),
                (&vec![2, 2, 1, 1, 1], &3),
                (&vec![3, 2, 1, 1], &2)
            ]
        );
    }

    #[test]
    fn counts_for_every_model_and_profile_set() {
        // Every model shares the A100-40GB placement table, so the counts agree: 19 over the
        // base profiles; 239 over all seven profiles (the +me variant may replace any one 1g,
        // and the double-memory 1g adds layouts using slice 7).
        for model in GpuModel::ALL {
            assert_eq!(maximal_layouts(model).len(), 19, "{model}");
            assert_eq!(
                maximal_layouts_with(model, model.profiles()).len(),
                239,
                "{model}"
            );
        }
        let h100 = GpuModel::H100_80GB;
        let base_and_15 = h100.profiles().iter().filter(|p| p.id != 20);
        assert_eq!(maximal_layouts_with(h100, base_and_15).len(), 78);
        let base_and_me = h100.profiles().iter().filter(|p| p.id != 15);
        assert_eq!(maximal_layouts_with(h100, base_and_me).len(), 67);
        // Over the base profiles, H100 layouts are the A100's with the names changed.
        let h100_texts = texts(&maximal_layouts(h100));
        let renamed: Vec<String> = A100_MAXIMAL
            .iter()
            .map(|t| {
                t.replace("7g.40gb", "7g.80gb")
                    .replace("4g.20gb", "4g.40gb")
                    .replace("3g.20gb", "3g.40gb")
                    .replace("2g.10gb", "2g.20gb")
                    .replace("1g.5gb", "1g.10gb")
            })
            .collect();
        assert_eq!(h100_texts, renamed);
    }

    #[test]
    fn a_lone_1g_goes_to_the_last_slice() {
        // MIGM §4.2's example; see the module doc for how our counts relate to its 7 and 9.
        let empty = Layout::new(A100);
        assert_eq!(reachability(&empty), 19);
        let scores: Vec<usize> = (0..7)
            .map(|s| {
                reachability(
                    &Layout::from_placements(A100, [Placement::new(p("1g.5gb"), s)]).unwrap(),
                )
            })
            .collect();
        assert_eq!(scores, [6, 6, 6, 6, 6, 6, 12]);
        assert_eq!(best_start(&empty, p("1g.5gb")), Some(6));
        // A 2g keeps 6 at each of 0, 2 and 4: the tie goes to 0.
        assert_eq!(best_start(&empty, p("2g.10gb")), Some(0));
        assert_eq!(best_start(&empty, p("3g.20gb")), Some(4));
        assert_eq!(best_start(&empty, p("7g.40gb")), Some(0));
        assert_eq!(best_start(&layout("7g.40gb"), p("1g.5gb")), None);
    }

    #[test]
    fn migm_example_reachability() {
        let l = layout("1g.5gb@0,1g.5gb@1");
        assert_eq!(
            texts(&reachable(&l)),
            [
                "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6",
                "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,2g.10gb@4,1g.5gb@6",
                "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,3g.20gb@4",
                "1g.5gb@0,1g.5gb@1,2g.10gb@2,1g.5gb@4,1g.5gb@5,1g.5gb@6",
                "1g.5gb@0,1g.5gb@1,2g.10gb@2,2g.10gb@4,1g.5gb@6",
                "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4",
            ]
        );
        // The only 20 GB placement, at 4, keeps 2 of them; 3g.20gb@2 is no layout at all.
        assert_eq!(best_start(&l, p("3g.20gb")), Some(4));
        let with_20gb = layout("1g.5gb@0,1g.5gb@1,3g.20gb@4");
        assert_eq!(reachability(&with_20gb), 2);
        assert!(!l.can_place(p("3g.20gb"), 2));
    }

    #[test]
    fn reachable_layouts_contain_the_layout_and_are_maximal() {
        let l = layout("2g.10gb@2");
        let reach = reachable(&l);
        let all = maximal_layouts(A100);
        assert_eq!(reach.len(), 6);
        for m in &reach {
            assert!(l.is_subset_of(m) && all.contains(m), "{m}");
        }
        let expected: Vec<_> = all.iter().filter(|m| l.is_subset_of(m)).cloned().collect();
        assert_eq!(reach, expected);
    }

    /// Every legal layout of `model` built from `profiles`.
    fn every_layout(model: GpuModel, profiles: &[&'static Profile]) -> Vec<Layout> {
        let mut seen = std::collections::BTreeSet::from([Layout::new(model)]);
        let mut out = vec![Layout::new(model)];
        let mut i = 0;
        while i < out.len() {
            let l = out[i].clone();
            for &p in profiles {
                for s in l.legal_starts(p) {
                    let mut next = l.clone();
                    next.insert_unchecked(Placement::new(p, s));
                    if seen.insert(next.clone()) {
                        out.push(next);
                    }
                }
            }
            i += 1;
        }
        out
    }

    #[test]
    fn adding_an_instance_never_raises_reachability() {
        // Exhaustively, over the base profiles and over all profiles (a fixed set each).
        let base: Vec<_> = A100.base_profiles().collect();
        let all: Vec<_> = A100.profiles().iter().collect();
        for set in [&base, &all] {
            let layouts = every_layout(A100, set);
            for l in &layouts {
                let here = reachable_with(l, set.iter().copied()).len();
                assert!(here >= 1, "{l}");
                for &p in set.iter() {
                    for s in l.legal_starts(p) {
                        let mut next = l.clone();
                        next.insert_unchecked(Placement::new(p, s));
                        let there = reachable_with(&next, set.iter().copied()).len();
                        assert!(there <= here, "{l} ({here}) + {p}@{s} ({there})");
                    }
                }
            }
        }
        // 298 legal layouts over the base profiles, 2319 over all seven.
        assert_eq!(every_layout(A100, &base).len(), 298);
        assert_eq!(every_layout(A100, &all).len(), 2319);
    }

    #[test]
    fn the_first_extra_instance_widens_the_profile_set() {
        // Documented exception to monotonicity: reachability counts over the profiles in play.
        assert_eq!(reachability(&Layout::new(A100)), 19);
        assert_eq!(reachability(&layout("1g.10gb@6")), 33);
        assert_eq!(reachability(&layout("1g.5gb+me@6")), 12);
        // best_start compares like with like: over base + 1g.10gb, @6 keeps the most.
        assert_eq!(best_start(&Layout::new(A100), p("1g.10gb")), Some(6));
    }
}
