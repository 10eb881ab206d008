//! The backup file (`escher admin snapshot save FILE`, `escher-head --restore FILE`): the head
//! group's whole replicated state as of one moment, in the data format of the head that wrote
//! it, with what a restore checks first.
//!
//! ```text
//! ESCHER-BACKUP\n                      magic
//! {"version":1,...}\n                  the header, one line of JSON (BackupHeader)
//! <image bytes>                        total_bytes of the state, SHA-256 in the header
//! ```

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use thiserror::Error;

/// The first line of every backup file.
const MAGIC: &[u8] = b"ESCHER-BACKUP\n";
/// The backup file format this build writes and reads.
pub const BACKUP_VERSION: u32 = 1;

/// What a backup file says about the state it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The backup file format.
    pub version: u32,
    /// The data format of the image (a head reads every format up to its own).
    pub data_format: u32,
    /// The cluster the state belongs to.
    pub cluster_id: String,
    /// The state's event revision.
    pub revision: u64,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    /// The image's length.
    pub total_bytes: u64,
    /// The image's SHA-256, hex.
    pub sha256: String,
}

/// A backup file that cannot be written or used.
#[derive(Debug, Error)]
pub enum BackupError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a backup, or not a whole one.
    #[error("{path} is not a usable escher backup: {why}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// Writes `image` with `header` (its length and checksum filled in) to a new file at `path`,
/// private to its owner (the state holds the hashes of every token and node secret).
pub fn write_backup(
    path: &Path,
    mut header: BackupHeader,
    image: &[u8],
) -> Result<BackupHeader, BackupError> {
    let io = |source| BackupError::Io {
        path: path.display().to_string(),
        source,
    };
    header.version = BACKUP_VERSION;
    header.total_bytes = image.len() as u64;
    header.sha256 = hex::encode(sha2::Sha256::digest(image));
    let line = serde_json::to_vec(&header).map_err(|e| io(std::io::Error::other(e)))?;
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?
    };
    file.write_all(MAGIC).map_err(io)?;
    file.write_all(&line).map_err(io)?;
    file.write_all(b"\n").map_err(io)?;
    file.write_all(image).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(header)
}

/// Reads the backup at `path`: its header, and its image once the length and checksum match.
pub fn read_backup(path: &Path) -> Result<(BackupHeader, Vec<u8>), BackupError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| BackupError::Io {
        path: name.clone(),
        source,
    })?;
    let invalid = |why: String| BackupError::Invalid {
        path: name.clone(),
        why,
    };
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| invalid("it does not start as a backup does (ESCHER-BACKUP)".into()))?;
    let end = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| invalid("its header ends nowhere".into()))?;
    let header: BackupHeader =
        serde_json::from_slice(&rest[..end]).map_err(|e| invalid(format!("its header: {e}")))?;
    if header.version > BACKUP_VERSION {
        return Err(invalid(format!(
            "it is in backup format {}, newer than this build reads ({BACKUP_VERSION})",
            header.version
        )));
    }
    let image = &rest[end + 1..];
    if image.len() as u64 != header.total_bytes {
        return Err(invalid(format!(
            "it holds {} bytes of state where its header says {}: it was cut short",
            image.len(),
            header.total_bytes
        )));
    }
    if hex::encode(sha2::Sha256::digest(image)) != header.sha256 {
        return Err(invalid(
            "its state does not match its checksum: it is damaged".into(),
        ));
    }
    Ok((header, image.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> BackupHeader {
        BackupHeader {
            version: 0,
            data_format: 1,
            cluster_id: "c".into(),
            revision: 9,
            taken_at_ms: 1,
            total_bytes: 0,
            sha256: String::new(),
        }
    }

    #[test]
    fn a_backup_reads_back_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let written = write_backup(&path, header(), b"state bytes").unwrap();
        let (read, image) = read_backup(&path).unwrap();
        assert_eq!((read, image.as_slice()), (written, &b"state bytes"[..]));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            write_backup(&path, header(), b"x").is_err(),
            "never overwritten"
        );

        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_backup(&path).unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");
        bytes.pop();
        std::fs::write(&path, &bytes).unwrap();
        assert!(
            read_backup(&path)
                .unwrap_err()
                .to_string()
                .contains("cut short")
        );
        std::fs::write(&path, b"hello").unwrap();
        assert!(
            read_backup(&path)
                .unwrap_err()
                .to_string()
                .contains("ESCHER-BACKUP")
        );
    }
}
