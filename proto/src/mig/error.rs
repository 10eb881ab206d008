//! The one error type of the MIG model: every way a model name, a profile, a placement or a
//! layout text can be wrong, each saying what was wrong and what would be right.

use thiserror::Error;

use super::GpuModel;

/// A GPU model, MIG profile, placement or layout was not valid.
///
/// Placement errors name the placement (`3g.20gb@2`) and, where one is to blame, the existing
/// instance it collides with; errors while reading a layout text are wrapped in
/// [`MigError::Entry`], which names the entry that failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigError {
    /// The text does not name a GPU model this module knows.
    #[error(
        "unknown GPU model {input:?}: expected one of a100-40gb, a100-80gb, h100-80gb, h200-141gb"
    )]
    UnknownModel {
        /// What was given.
        input: String,
    },
    /// An NVML product name does not match a GPU with a MIG table here.
    #[error(
        "GPU product {product:?} has no MIG profile table here: supported are the A100 40GB and \
         80GB, the H100 80GB and the H200 141GB"
    )]
    UnsupportedProduct {
        /// The product name, as NVML reports it.
        product: String,
    },
    /// The profile name is not one of the model's profiles.
    #[error("{model} has no MIG profile {profile:?}; its profiles are {valid}")]
    UnknownProfile {
        /// The GPU model whose table was searched.
        model: GpuModel,
        /// The name that was given.
        profile: String,
        /// The model's profile names, comma-separated.
        valid: String,
    },
    /// The start is not one of the profile's legal start slots.
    #[error(
        "{profile}@{start}: {start} is not a legal start for {profile} (legal starts: {legal})"
    )]
    IllegalStart {
        /// The profile name.
        profile: &'static str,
        /// The start that was asked for.
        start: u8,
        /// The profile's legal starts, comma-separated.
        legal: String,
    },
    /// The profile allows fewer instances per GPU than the layout would hold.
    #[error(
        "{profile}: at most {max} instance(s) of this profile fit on one GPU and the layout \
             already has {max}"
    )]
    TooManyInstances {
        /// The profile name.
        profile: &'static str,
        /// The profile's per-GPU instance limit.
        max: u8,
    },
    /// Too few GPCs (compute slices) are left for the profile.
    #[error("{profile} needs {needed} GPC(s) but only {free} of 7 are free")]
    NotEnoughCompute {
        /// The profile name.
        profile: &'static str,
        /// GPCs the profile needs.
        needed: u8,
        /// GPCs still free.
        free: u8,
    },
    /// Too few memory slices are left for the profile.
    #[error("{profile} needs {needed} memory slice(s) but only {free} of 8 are free")]
    NotEnoughMemory {
        /// The profile name.
        profile: &'static str,
        /// Memory slices the profile needs.
        needed: u8,
        /// Memory slices still free.
        free: u8,
    },
    /// The placement's memory slices overlap those of an existing instance.
    #[error("{placement} overlaps {existing} on memory slices {first}..{end}")]
    Overlap {
        /// The placement that was asked for (`profile@start`).
        placement: String,
        /// The existing instance it collides with (`profile@start`).
        existing: String,
        /// First shared memory slice.
        first: u8,
        /// One past the last shared memory slice.
        end: u8,
    },
    /// Enough GPCs and memory slices are free, but not at any legal start of the profile.
    #[error(
        "no legal start of {profile} is free ({blocked}); remove an instance or pick a \
             smaller profile"
    )]
    NoRoom {
        /// The profile name.
        profile: &'static str,
        /// For each legal start, the instance that blocks it (`0: overlaps 1g.5gb@1, ...`).
        blocked: String,
    },
    /// A layout entry is not of the form `profile` or `profile@start`.
    #[error("{entry:?} is not a MIG layout entry: {why}")]
    Syntax {
        /// The offending text.
        entry: String,
        /// What was wrong with it.
        why: &'static str,
    },
    /// An entry of a layout text could not be added; `reason` says why.
    #[error("layout entry {position} ({entry:?}): {reason}")]
    Entry {
        /// 1-based position of the entry in the comma-separated list.
        position: usize,
        /// The entry's text.
        entry: String,
        /// Why it could not be added.
        reason: Box<MigError>,
    },
}
