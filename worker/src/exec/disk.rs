//! [`DiskReserve`]: the free space a worker keeps on the file systems of its log directory and
//! its tasks' directory (`--disk-reserve`), so that tasks filling the disk between them cannot
//! make another tenant's task fail.
//!
//! Each task's own writes are held elsewhere: its log streams to `--task-log-bytes`
//! (`logs.rs`), its home and `TMPDIR` to its scratch (`scratch.rs`). What they do not bound is
//! their sum: a hundred tasks each writing 64 MiB of logs. The reserve does, as the kubelet's
//! eviction threshold does for a Kubernetes node: while a file system of the worker has less
//! free than the reserve (checked with `statvfs`, at most every [`CHECK_EVERY`]), the node
//! starts no new task (an assignment waits, unstarted, until space returns; the heartbeats say
//! `disk_under_reserve = 1`), and a running task's log streams stop where they are, with one
//! line that says why. The reserve is the headroom those 100 ms of writes use.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The node label that says what the node holds its tasks' bytes on disk to: `reserve` (its
/// `--disk-reserve`) and `scratch` (a size-limited scratch per command task), joined by `+`.
/// The worker sets it.
pub const DISK_LABEL: &str = "escher.disk";

/// The node label with the scratch size (bytes) of a task that asks for no `disk`, set where
/// the node gives scratch directories.
pub const DISK_SCRATCH_LABEL: &str = "escher.disk.scratch-bytes";

/// The node label with the bytes the reserve comes to on the node's log file system.
pub const DISK_RESERVE_LABEL: &str = "escher.disk.reserve-bytes";

/// How long one `statvfs` answer stands: checks within it (every running task's log cap, each
/// assignment) reuse it.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// The reserve unless `--disk-reserve` says: 5% of the file system, at most 1 GiB.
pub const DEFAULT_DISK_RESERVE: Reserve = Reserve::Percent {
    percent: 5,
    at_most: 1 << 30,
};

/// How much free space a file system must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// A number of bytes.
    Bytes(u64),
    /// A share of the file system's size, capped.
    Percent {
        /// Percent of its size, 0 to 100.
        percent: u8,
        /// The most bytes it comes to.
        at_most: u64,
    },
}

impl Reserve {
    /// The bytes it comes to on a file system of `size` bytes.
    pub fn bytes(&self, size: u64) -> u64 {
        match *self {
            Reserve::Bytes(b) => b,
            Reserve::Percent { percent, at_most } => {
                (u128::from(size) * u128::from(percent) / 100).min(u128::from(at_most)) as u64
            }
        }
    }
}

impl FromStr for Reserve {
    type Err = String;

    /// `5%`, `512MiB`, `1GiB`, `10000000` (bytes), `0` (no reserve).
    fn from_str(text: &str) -> Result<Reserve, String> {
        let usage = "write a share such as 5% or a size such as 512MiB, 1GiB or a number of bytes";
        let text = text.trim();
        if let Some(percent) = text.strip_suffix('%') {
            return match percent.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Reserve::Percent {
                    percent: p,
                    at_most: u64::MAX,
                }),
                _ => Err(format!("{text:?} is not a share from 0% to 100%; {usage}")),
            };
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let scale: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            _ => return Err(format!("{text:?} is not a size; {usage}")),
        };
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .map(Reserve::Bytes)
            .ok_or_else(|| format!("{text:?} is not a size; {usage}"))
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reserve::Bytes(b) => write!(f, "{b} bytes"),
            Reserve::Percent { percent, at_most } if at_most == u64::MAX => write!(f, "{percent}%"),
            Reserve::Percent { percent, at_most } => {
                write!(f, "{percent}% (at most {} MiB)", at_most >> 20)
            }
        }
    }
}

/// The free space of one file system, as `statvfs` gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
    /// The file system's size in bytes.
    pub size: u64,
}

/// The free space of the file system that holds `dir`.
pub fn space_of(dir: &Path) -> std::io::Result<Space> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    let unit = st.fragment_size().max(1) as u64;
    Ok(Space {
        free: (st.blocks_available() as u64).saturating_mul(unit),
        size: (st.blocks() as u64).saturating_mul(unit),
    })
}

/// The reserve a worker keeps on the file systems of its directories.
#[derive(Debug)]
pub struct DiskReserve {
    reserve: Reserve,
    /// The directories whose file systems it watches (the log directory, the tasks'
    /// directory), one per file system.
    dirs: Vec<PathBuf>,
    /// The last answer: when, and why the node is under its reserve (`None`: it is not).
    last: Mutex<Option<(Instant, Option<String>, u64)>>,
}

impl DiskReserve {
    /// A reserve of `reserve` on the file systems that hold `dirs`.
    pub fn new(reserve: Reserve, dirs: impl IntoIterator<Item = PathBuf>) -> DiskReserve {
        use std::os::unix::fs::MetadataExt;
        let mut devices = Vec::new();
        let mut kept = Vec::new();
        for dir in dirs {
            let device = std::fs::metadata(&dir).map(|m| m.dev()).ok();
            if device.is_none() || !devices.contains(&device) {
                devices.push(device);
                kept.push(dir);
            }
        }
        DiskReserve {
            reserve,
            dirs: kept,
            last: Mutex::new(None),
        }
    }

    /// The reserve it keeps.
    pub fn reserve(&self) -> Reserve {
        self.reserve
    }

    /// Why the node is under its reserve now, or `None` when every file system has room.
    pub fn low(&self) -> Option<String> {
        self.check().0
    }

    /// The bytes the reserve comes to on the first file system (the log directory's).
    pub fn reserve_bytes(&self) -> u64 {
        self.dirs
            .first()
            .and_then(|d| space_of(d).ok())
            .map_or(0, |s| self.reserve.bytes(s.size))
    }

    /// The heartbeat's figures: `disk_free_bytes` (the least among the file systems) and
    /// `disk_under_reserve` (1 while the node starts no task for want of space).
    pub fn metrics(&self) -> Vec<escher_proto::types::Metric> {
        let (why, free) = self.check();
        vec![
            escher_proto::types::Metric {
                name: "disk_free_bytes".into(),
                value: free as f64,
            },
            escher_proto::types::Metric {
                name: "disk_under_reserve".into(),
                value: if why.is_some() { 1.0 } else { 0.0 },
            },
        ]
    }

    /// The least free space among the file systems, in bytes.
    pub fn free(&self) -> u64 {
        self.check().1
    }

    fn check(&self) -> (Option<String>, u64) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, why, free)) = &*last
            && at.elapsed() < CHECK_EVERY
        {
            return (why.clone(), *free);
        }
        let mut why = None;
        let mut least = u64::MAX;
        for dir in &self.dirs {
            // A directory that cannot be read (removed) holds nothing to protect.
            let Ok(space) = space_of(dir) else { continue };
            least = least.min(space.free);
            let reserve = self.reserve.bytes(space.size);
            if why.is_none() && space.free < reserve {
                why = Some(format!(
                    "the file system of {} has {} KiB free, under the worker's reserve of {} \
                     KiB ({}, --disk-reserve)",
                    dir.display(),
                    space.free >> 10,
                    reserve >> 10,
                    self.reserve
                ));
            }
        }
        *last = Some((Instant::now(), why.clone(), least));
        (why, least)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_parse_and_bad_ones_say_what_to_write() {
        assert_eq!("0".parse(), Ok(Reserve::Bytes(0)));
        assert_eq!("512MiB".parse(), Ok(Reserve::Bytes(512 << 20)));
        assert_eq!("1G".parse(), Ok(Reserve::Bytes(1 << 30)));
        assert_eq!(
            "5%".parse(),
            Ok(Reserve::Percent {
                percent: 5,
                at_most: u64::MAX
            })
        );
        for bad in ["101%", "x", "5 parsecs", "-1", "99999999999999TiB"] {
            let e = bad.parse::<Reserve>().unwrap_err();
            assert!(e.contains("512MiB"), "{bad}: {e}");
        }
        assert_eq!(DEFAULT_DISK_RESERVE.bytes(100 << 20), 5 << 20);
        assert_eq!(DEFAULT_DISK_RESERVE.bytes(1 << 40), 1 << 30);
    }

    #[test]
    fn a_reserve_larger_than_the_free_space_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let free = space_of(dir.path()).unwrap().free;
        let under = DiskReserve::new(Reserve::Bytes(free + (1 << 40)), [dir.path().into()]);
        let why = under.low().expect("under its reserve");
        assert!(
            why.contains(&dir.path().display().to_string()) && why.contains("--disk-reserve"),
            "{why}"
        );
        let fine = DiskReserve::new(Reserve::Bytes(0), [dir.path().into()]);
        assert_eq!(fine.low(), None);
    }
}
