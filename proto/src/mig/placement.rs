//! [`Placement`]: one MIG instance on a GPU, a profile at a start memory slice, written
//! `profile@start` (`3g.20gb@4`).
//!
//! A placement on its own is unchecked; [`Layout`](super::Layout) decides whether it is legal
//! next to the others.

use std::cmp::Ordering;
use std::fmt;
use std::ops::Range;

use super::Profile;

/// A profile placed at a start memory slice: the instance occupies memory slices
/// `start..start + profile.memory_slices` (NVML's `{start, size}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Placement {
    /// The instance's profile (an entry of its model's static table).
    pub profile: &'static Profile,
    /// The first memory slice it occupies.
    pub start: u8,
}

impl Placement {
    /// A placement; legality is checked when it joins a [`Layout`](super::Layout).
    pub fn new(profile: &'static Profile, start: u8) -> Placement {
        Placement { profile, start }
    }

    /// One past the last memory slice it occupies.
    pub fn end(&self) -> u8 {
        self.start.saturating_add(self.profile.memory_slices)
    }

    /// The memory slices it occupies.
    pub fn slices(&self) -> Range<u8> {
        self.profile.slices_at(self.start)
    }

    /// Its memory slices as a bitmap (bit `i` is memory slice `i`).
    pub fn mask(&self) -> u32 {
        self.slices().filter(|&i| i < 32).fold(0, |m, i| m | 1 << i)
    }

    /// The memory slices it shares with `other`, if any.
    pub fn overlap(&self, other: &Placement) -> Option<Range<u8>> {
        let first = self.start.max(other.start);
        let end = self.end().min(other.end());
        (first < end).then_some(first..end)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile.name, self.start)
    }
}

impl Ord for Placement {
    /// By start, then by size, GPCs and profile id, so that a layout lists its instances from
    /// memory slice 0 upwards. (Consistent with `==` for the profiles of the static tables.)
    fn cmp(&self, other: &Placement) -> Ordering {
        let key = |p: &Placement| {
            let q = p.profile;
            (
                p.start,
                q.memory_slices,
                q.compute,
                q.id,
                q.name,
                q.memory_mib,
            )
        };
        key(self).cmp(&key(other))
    }
}

impl PartialOrd for Placement {
    fn partial_cmp(&self, other: &Placement) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::super::GpuModel;
    use super::*;

    #[test]
    fn geometry() {
        let m = GpuModel::A100_40GB;
        let three = Placement::new(m.profile("3g.20gb").unwrap(), 4);
        let two = Placement::new(m.profile("2g.10gb").unwrap(), 2);
        let one = Placement::new(m.profile("1g.5gb").unwrap(), 5);
        assert_eq!(
            (three.slices(), three.end(), three.mask()),
            (4..8, 8, 0b1111_0000)
        );
        assert_eq!(three.overlap(&one), Some(5..6));
        assert_eq!(three.overlap(&two), None);
        assert_eq!(three.to_string(), "3g.20gb@4");
        assert!(two < three && three < one);
    }
}
