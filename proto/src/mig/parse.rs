//! Reading a [`Layout`] from text: a comma-separated list of `profile` (the start is chosen
//! by [`Layout::place`]) or `profile@start` (the start is given) entries, added in the order
//! written.
//!
//! ```text
//! layout = [ entry *( "," entry ) ]          ; the empty text is the empty layout
//! entry  = profile [ "@" start ]             ; e.g. 3g.20gb@4, 1g.5gb
//! ```
//!
//! Profile names are matched ignoring ASCII case; spaces around entries are ignored. Order
//! matters exactly as on the hardware (the MIG User Guide's `3g,2g,1g,1g` example fails if the
//! 3g is not created first): every entry is checked against the ones before it. `Display`
//! writes the explicit `@start` form, so `Layout::parse(m, &l.to_string()) == Ok(l)`.

use super::{GpuModel, Layout, MigError, Placement, Profile};

impl Layout {
    /// Reads a layout of `model` from text such as `3g.20gb,2g.10gb,1g.5gb,1g.5gb` or
    /// `3g.20gb@4,2g.10gb@0`; explicit and automatic entries may be mixed.
    ///
    /// A failing entry is reported as [`MigError::Entry`], with its position and text and
    /// the reason: unknown profile (the valid ones listed), illegal start (the legal ones
    /// listed), overlap (the instance in the way named), or too few GPCs or memory slices.
    pub fn parse(model: GpuModel, text: &str) -> Result<Layout, MigError> {
        let mut layout = Layout::new(model);
        if text.trim().is_empty() {
            return Ok(layout);
        }
        for (i, raw) in text.split(',').enumerate() {
            let entry = raw.trim();
            layout.add_entry(entry).map_err(|reason| MigError::Entry {
                position: i + 1,
                entry: entry.to_string(),
                reason: Box::new(reason),
            })?;
        }
        Ok(layout)
    }

    /// Adds one `profile[@start]` entry: at its start, or without one at the start MIGM's
    /// rule picks ([`Layout::place`]). Fails, changing nothing, like [`Layout::insert`].
    pub fn add_entry(&mut self, entry: &str) -> Result<(), MigError> {
        if entry.is_empty() {
            return Err(MigError::Syntax {
                entry: entry.to_string(),
                why: "empty entry; remove the extra ','",
            });
        }
        let (profile, start) = read_entry(self.model(), entry)?;
        match start {
            Some(start) => self.insert(Placement::new(profile, start)),
            None => self.place(profile).map(|_| ()),
        }
    }
}

impl Placement {
    /// Reads `profile@start` for `model`: the profile one of the model's and the start one of
    /// its legal starts (whether it is free is the layout's business).
    pub fn parse(model: GpuModel, text: &str) -> Result<Placement, MigError> {
        let entry = text.trim();
        match read_entry(model, entry)? {
            (profile, Some(start)) if profile.is_legal_start(start) => {
                Ok(Placement::new(profile, start))
            }
            (profile, Some(start)) => Err(MigError::IllegalStart {
                profile: profile.name,
                start,
                legal: profile.starts_text(),
            }),
            (_, None) => Err(MigError::Syntax {
                entry: entry.to_string(),
                why: "an instance is named profile@start (e.g. 1g.5gb@6)",
            }),
        }
    }
}

/// A `profile[@start]` entry's profile and start.
fn read_entry(model: GpuModel, entry: &str) -> Result<(&'static Profile, Option<u8>), MigError> {
    let (name, start) = match entry.split_once('@') {
        None => (entry, None),
        Some((name, start)) => {
            let start = start.trim().parse::<u8>().map_err(|_| MigError::Syntax {
                entry: entry.to_string(),
                why: "the start after '@' must be a memory-slice index, 0 to 7",
            })?;
            (name.trim(), Some(start))
        }
    };
    Ok((model.profile_named(name)?, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A100: GpuModel = GpuModel::A100_40GB;

    fn err(model: GpuModel, text: &str) -> String {
        Layout::parse(model, text).unwrap_err().to_string()
    }

    #[test]
    fn explicit_and_automatic_entries() {
        let l = Layout::parse(A100, "3g.20gb@4, 2g.10gb@0").unwrap();
        assert_eq!(l.to_string(), "2g.10gb@0,3g.20gb@4");
        // The guide's order: 3g first, then 2g, 1g, 1g, each where it keeps most options. The
        // 3g goes to 4 (6 maximal layouts reachable, against 3 at 0); the 2g ties between 0
        // and 2 (2 each) and takes 0; the 1g fill 2 and 3.
        let l = Layout::parse(A100, "3g.20gb,2g.10gb,1g.5gb,1g.5gb").unwrap();
        assert_eq!(l.to_string(), "2g.10gb@0,1g.5gb@2,1g.5gb@3,3g.20gb@4");
        assert_eq!(Layout::parse(A100, "  ").unwrap(), Layout::new(A100));
        assert_eq!(
            Layout::parse(A100, "7G.40GB").unwrap().to_string(),
            "7g.40gb@0"
        );
        let mixed = Layout::parse(A100, "4g.20gb@0,1g.5gb,1g.5gb").unwrap();
        assert_eq!(mixed.to_string(), "4g.20gb@0,1g.5gb@4,1g.5gb@6");
    }

    #[test]
    fn errors_name_the_entry_and_the_reason() {
        assert_eq!(
            err(A100, "3g.20gb,2g.20gb"),
            "layout entry 2 (\"2g.20gb\"): a100-40gb has no MIG profile \"2g.20gb\"; its \
             profiles are 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"
        );
        assert_eq!(
            err(A100, "1g.5gb@0,1g.5gb@1,3g.20gb@2"),
            "layout entry 3 (\"3g.20gb@2\"): 3g.20gb@2: 2 is not a legal start for 3g.20gb \
             (legal starts: 0, 4)"
        );
        assert_eq!(
            err(A100, "2g.10gb@2,3g.20gb@0"),
            "layout entry 2 (\"3g.20gb@0\"): 3g.20gb@0 overlaps 2g.10gb@2 on memory slices 2..4"
        );
        assert_eq!(
            err(A100, "7g.40gb,1g.5gb@3"),
            "layout entry 2 (\"1g.5gb@3\"): 1g.5gb needs 1 GPC(s) but only 0 of 7 are free"
        );
        assert_eq!(
            err(A100, "4g.20gb,3g.20gb,1g.5gb"),
            "layout entry 3 (\"1g.5gb\"): 1g.5gb needs 1 GPC(s) but only 0 of 7 are free"
        );
        assert_eq!(
            err(A100, "3g.20gb,3g.20gb,1g.5gb"),
            "layout entry 3 (\"1g.5gb\"): 1g.5gb needs 1 memory slice(s) but only 0 of 8 are \
             free"
        );
        assert_eq!(
            err(A100, "1g.5gb@1,1g.5gb@5,3g.20gb"),
            "layout entry 3 (\"3g.20gb\"): no legal start of 3g.20gb is free (0: overlaps \
             1g.5gb@1, 4: overlaps 1g.5gb@5); remove an instance or pick a smaller profile"
        );
        assert_eq!(
            err(A100, "1g.5gb+me,1g.5gb+me"),
            "layout entry 2 (\"1g.5gb+me\"): 1g.5gb+me: at most 1 instance(s) of this profile \
             fit on one GPU and the layout already has 1"
        );
        assert_eq!(
            err(A100, "1g.5gb,,1g.5gb"),
            "layout entry 2 (\"\"): \"\" is not a MIG layout entry: empty entry; remove the \
             extra ','"
        );
        assert_eq!(
            err(A100, "1g.5gb@x"),
            "layout entry 1 (\"1g.5gb@x\"): \"1g.5gb@x\" is not a MIG layout entry: the start \
             after '@' must be a memory-slice index, 0 to 7"
        );
        assert_eq!(
            err(GpuModel::H100_80GB, "1g.5gb"),
            "layout entry 1 (\"1g.5gb\"): h100-80gb has no MIG profile \"1g.5gb\"; its \
             profiles are 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
        );
    }

    #[test]
    fn one_instance_is_read_with_its_start() {
        let p = Placement::parse(A100, " 1g.5gb@6 ").unwrap();
        assert_eq!(p.to_string(), "1g.5gb@6");
        for (text, expected) in [
            ("1g.5gb", "is named profile@start"),
            ("3g.20gb@2", "not a legal start"),
            ("9g.80gb@0", "has no MIG profile"),
            ("1g.5gb@x", "memory-slice index"),
        ] {
            let e = Placement::parse(A100, text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
        let mut layout = Layout::parse(A100, "3g.20gb@4").unwrap();
        layout.add_entry("1g.5gb").unwrap();
        assert_eq!(layout.to_string(), "1g.5gb@0,3g.20gb@4");
        assert!(matches!(
            layout.add_entry("2g.10gb@4"),
            Err(MigError::Overlap { .. })
        ));
    }

    #[test]
    fn the_entry_error_keeps_the_reason() {
        let e = Layout::parse(A100, "7g.40gb,7g.40gb").unwrap_err();
        let MigError::Entry {
            position,
            entry,
            reason,
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((position, entry.as_str()), (2, "7g.40gb"));
        assert!(matches!(
            *reason,
            MigError::TooManyInstances {
                profile: "7g.40gb",
                max: 1
            }
        ));
    }
}
