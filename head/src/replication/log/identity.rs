//! Which log a directory holds: the file `IDENTITY`, written once when the directory becomes a
//! log and checked at every open, so that a head never replays another group's or another
//! replica's log as its own.
//!
//! It is plain text so that an operator can read it:
//!
//! ```text
//! # escher raft log: written when this directory was created; do not edit.
//! format = 1
//! group = production
//! replica = 2
//! ```

use std::fs;
use std::path::Path;

use super::LogError;
use super::files::write_atomically;
use super::format::FORMAT_VERSION;

/// The name of the identity file in a log directory.
pub(super) const FILE_NAME: &str = "IDENTITY";

/// Which raft group a log belongs to, and which replica of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogIdentity {
    /// The group's name, the same on every replica.
    pub group: String,
    /// This replica's raft id (1 or more).
    pub replica: u64,
}

impl LogIdentity {
    fn validate(&self) -> Result<(), LogError> {
        let why = if self.group.is_empty() {
            "the group name is empty".to_string()
        } else if self.group.len() > 256 {
            format!(
                "the group name is {} bytes long; at most 256 are allowed",
                self.group.len()
            )
        } else if self.group.chars().any(char::is_control) || self.group.trim() != self.group {
            format!(
                "the group name {:?} has control characters or surrounding spaces",
                self.group
            )
        } else if self.replica == 0 {
            "replica 0 is not a raft id; replica ids start at 1".to_string()
        } else {
            return Ok(());
        };
        Err(LogError::InvalidIdentity { why })
    }

    fn render(&self) -> String {
        format!(
            "# escher raft log: written when this directory was created; do not edit.\n\
             format = {FORMAT_VERSION}\ngroup = {}\nreplica = {}\n",
            self.group, self.replica
        )
    }
}

/// Records `identity` in `dir` if it has none (`fresh`: the directory holds no log yet), or
/// checks that the one recorded there is the same.
pub(super) fn ensure(dir: &Path, identity: &LogIdentity, fresh: bool) -> Result<(), LogError> {
    identity.validate()?;
    let path = dir.join(FILE_NAME);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && fresh => {
            return write_atomically(dir, FILE_NAME, identity.render().as_bytes());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LogError::Inconsistent {
                dir: dir.to_path_buf(),
                detail: format!("it holds log files but no {FILE_NAME} file"),
            });
        }
        Err(e) => return Err(LogError::io("read", &path)(e)),
    };
    let found = parse(&path, &text)?;
    if found.group != identity.group {
        return Err(LogError::WrongGroup {
            dir: dir.to_path_buf(),
            found: found.group,
            expected: identity.group.clone(),
        });
    }
    if found.replica != identity.replica {
        return Err(LogError::WrongReplica {
            dir: dir.to_path_buf(),
            found: found.replica,
            expected: identity.replica,
        });
    }
    Ok(())
}

fn parse(path: &Path, text: &str) -> Result<LogIdentity, LogError> {
    let corrupt = |detail: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        detail,
    };
    let (mut format, mut group, mut replica) = (None, None, None);
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(corrupt(format!("the line {line:?} is not `key = value`")));
        };
        let value = value.trim();
        match key.trim() {
            "format" => {
                format = Some(
                    value
                        .parse::<u32>()
                        .map_err(|_| corrupt(format!("format {value:?} is not a number")))?,
                )
            }
            "group" => group = Some(value.to_string()),
            "replica" => {
                replica = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| corrupt(format!("replica {value:?} is not a number")))?,
                )
            }
            other => return Err(corrupt(format!("unknown key {other:?}"))),
        }
    }
    let format = format.ok_or_else(|| corrupt("no format line".into()))?;
    if format != FORMAT_VERSION {
        return Err(LogError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: format,
            supported: FORMAT_VERSION,
        });
    }
    Ok(LogIdentity {
        group: group.ok_or_else(|| corrupt("no group line".into()))?,
        replica: replica.ok_or_else(|| corrupt("no replica line".into()))?,
    })
}
