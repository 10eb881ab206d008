//! The few file-system steps the log repeats: make a directory entry durable, replace a file
//! atomically, remove a file that is no longer needed.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use super::LogError;

/// The suffix of a file being written before its atomic rename; leftovers are removed at open.
pub(super) const TMP_SUFFIX: &str = ".tmp";

/// Makes the creation, rename or removal of entries in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LogError::io("fsync directory", dir))
}

/// Writes `bytes` to `dir/name` so that a crash leaves either the old file or the whole new one:
/// write `name.tmp`, fsync it, rename it over `name`, fsync the directory.
pub(super) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), LogError> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut file = File::create(&tmp).map_err(LogError::io("create", &tmp))?;
    file.write_all(bytes).map_err(LogError::io("write", &tmp))?;
    file.sync_all().map_err(LogError::io("fsync", &tmp))?;
    drop(file);
    let path = dir.join(name);
    fs::rename(&tmp, &path).map_err(LogError::io("rename into place", &path))?;
    sync_dir(dir)
}

/// Removes a file the log no longer needs. A failure only leaves garbage that the next open
/// removes, so it is logged, not returned.
pub(super) fn remove_stale(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an old raft log file")
        }
    }
}
