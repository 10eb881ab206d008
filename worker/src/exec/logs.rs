//! Where a command task's output lives, and reading it back in bounded chunks.
//!
//! Each attempt of a task writes `{log_dir}/{task_id}-{attempt}.out` (stdout) and
//! `{log_dir}/{task_id}-{attempt}.err` (stderr); [`log_path`] is the one place that spells the
//! names. [`read_log`] serves a chunk of at most [`MAX_LOG_CHUNK`] bytes from an offset, so a
//! caller can page through a large log, or follow a running task's log by asking again from
//! `next_offset`. [`latest_attempt`] finds the newest attempt of a task when the caller does not
//! know it.

use std::fmt;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::error::ExecError;

/// The most bytes one [`read_log`] call returns, whatever the caller asks for (4 MiB).
pub const MAX_LOG_CHUNK: u32 = 4 * 1024 * 1024;

/// One of a command task's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Standard output, kept in `{task_id}-{attempt}.out`.
    Stdout,
    /// Standard error, kept in `{task_id}-{attempt}.err`.
    Stderr,
}

impl Stream {
    /// The log file's extension for this stream, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Stream::Stdout => "out",
            Stream::Stderr => "err",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        })
    }
}

/// A chunk of a log, as returned by [`read_log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The bytes read, at most the capped `max_bytes`.
    pub data: Vec<u8>,
    /// The offset to ask for next: the requested offset plus `data.len()`.
    pub next_offset: u64,
    /// Whether `next_offset` is at (or past) the end of what has been written so far. A running
    /// task may still write more; ask again from `next_offset` to follow it.
    pub eof: bool,
}

/// The path of one stream's log for one attempt of a task.
pub fn log_path(log_dir: &Path, task_id: u64, attempt: u32, stream: Stream) -> PathBuf {
    log_dir.join(format!("{task_id}-{attempt}.{}", stream.extension()))
}

/// Reads up to `max_bytes` (capped at [`MAX_LOG_CHUNK`]) of a task attempt's log, from `offset`.
///
/// An offset past the end gives an empty chunk with `eof` set and `next_offset == offset`.
/// A log that does not exist gives [`ExecError::LogNotFound`].
pub async fn read_log(
    log_dir: &Path,
    task_id: u64,
    attempt: u32,
    stream: Stream,
    offset: u64,
    max_bytes: u32,
) -> Result<LogChunk, ExecError> {
    let path = log_path(log_dir, task_id, attempt, stream);
    let read_err = |source: io::Error| ExecError::LogRead {
        path: path.clone(),
        source,
    };
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ExecError::LogNotFound {
                task_id,
                attempt: Some(attempt),
                stream: Some(stream),
            });
        }
        Err(e) => return Err(read_err(e)),
    };
    let len = file.metadata().await.map_err(read_err)?.len();
    let want = u64::from(max_bytes.min(MAX_LOG_CHUNK)).min(len.saturating_sub(offset));
    let mut data = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
    if want > 0 {
        file.seek(SeekFrom::Start(offset)).await.map_err(read_err)?;
        file.take(want)
            .read_to_end(&mut data)
            .await
            .map_err(read_err)?;
    }
    let next_offset = offset + data.len() as u64;
    Ok(LogChunk {
        data,
        next_offset,
        eof: next_offset >= len,
    })
}

/// The highest attempt number that has a log (either stream) for `task_id` in `log_dir`.
///
/// Gives [`ExecError::LogNotFound`] when the task has no log there,
/// or when `log_dir` does not exist.
pub async fn latest_attempt(log_dir: &Path, task_id: u64) -> Result<u32, ExecError> {
    let not_found = ExecError::LogNotFound {
        task_id,
        attempt: None,
        stream: None,
    };
    let mut entries = match tokio::fs::read_dir(log_dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found),
        Err(source) => {
            return Err(ExecError::LogRead {
                path: log_dir.to_path_buf(),
                source,
            });
        }
    };
    let prefix = format!("{task_id}-");
    let mut latest = None;
    loop {
        let entry = match entries.next_entry().await {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(source) => {
                return Err(ExecError::LogRead {
                    path: log_dir.to_path_buf(),
                    source,
                });
            }
        };
        let name = entry.file_name();
        let Some(attempt) = name.to_str().and_then(|n| parse_attempt(n, &prefix)) else {
            continue;
        };
        latest = latest.max(Some(attempt));
    }
    latest.ok_or(not_found)
}

/// The attempt in a log file name `{task_id}-{attempt}.{out,err}`, given the `{task_id}-` prefix.
fn parse_attempt(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let attempt = rest
        .strip_suffix(".out")
        .or_else(|| rest.strip_suffix(".err"))?;
    // `u32::from_str` accepts a leading `+`; log_path never writes one.
    if attempt.starts_with('+') {
        return None;
    }
    attempt.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn write(dir: &Path, task_id: u64, attempt: u32, stream: Stream, data: &[u8]) {
        tokio::fs::write(log_path(dir, task_id, attempt, stream), data)
            .await
            .unwrap();
    }

    #[test]
    fn log_paths_follow_the_naming_scheme() {
        let dir = Path::new("/logs");
        assert_eq!(
            log_path(dir, 7, 2, Stream::Stdout),
            Path::new("/logs/7-2.out")
        );
        assert_eq!(
            log_path(dir, 7, 2, Stream::Stderr),
            Path::new("/logs/7-2.err")
        );
    }

    #[tokio::test]
    async fn reads_in_chunks_with_offsets() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 1, 0, Stream::Stdout, b"0123456789").await;

        let a = read_log(dir.path(), 1, 0, Stream::Stdout, 0, 4)
            .await
            .unwrap();
        assert_eq!(
            a,
            LogChunk {
                data: b"0123".to_vec(),
                next_offset: 4,
                eof: false
            }
        );
        let b = read_log(dir.path(), 1, 0, Stream::Stdout, a.next_offset, 4)
            .await
            .unwrap();
        assert_eq!(
            (b.data.as_slice(), b.next_offset, b.eof),
            (&b"4567"[..], 8, false)
        );
        let c = read_log(dir.path(), 1, 0, Stream::Stdout, b.next_offset, 4)
            .await
            .unwrap();
        assert_eq!(
            (c.data.as_slice(), c.next_offset, c.eof),
            (&b"89"[..], 10, true)
        );
        let past = read_log(dir.path(), 1, 0, Stream::Stdout, 50, 4)
            .await
            .unwrap();
        assert_eq!((past.data.len(), past.next_offset, past.eof), (0, 50, true));
    }

    #[tokio::test]
    async fn empty_log_is_eof_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 1, 0, Stream::Stderr, b"").await;
        let chunk = read_log(dir.path(), 1, 0, Stream::Stderr, 0, 100)
            .await
            .unwrap();
        assert_eq!(
            (chunk.data.len(), chunk.next_offset, chunk.eof),
            (0, 0, true)
        );
    }

    #[tokio::test]
    async fn chunk_size_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'x'; MAX_LOG_CHUNK as usize + 10];
        write(dir.path(), 3, 1, Stream::Stdout, &big).await;
        let chunk = read_log(dir.path(), 3, 1, Stream::Stdout, 0, u32::MAX)
            .await
            .unwrap();
        assert_eq!(chunk.data.len(), MAX_LOG_CHUNK as usize);
        assert!(!chunk.eof);
        let rest = read_log(
            dir.path(),
            3,
            1,
            Stream::Stdout,
            chunk.next_offset,
            u32::MAX,
        )
        .await
        .unwrap();
        assert_eq!((rest.data.len(), rest.eof), (10, true));
    }

    #[tokio::test]
    async fn unknown_task_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_log(dir.path(), 42, 0, Stream::Stderr, 0, 10)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ExecError::LogNotFound {
                    task_id: 42,
                    attempt: Some(0),
                    stream: Some(Stream::Stderr)
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "no stderr log for task 42 attempt 0");
    }

    #[tokio::test]
    async fn latest_attempt_picks_the_highest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 5, 0, Stream::Stdout, b"").await;
        write(dir.path(), 5, 2, Stream::Stderr, b"").await;
        write(dir.path(), 5, 10, Stream::Stdout, b"").await;
        write(dir.path(), 55, 99, Stream::Stdout, b"").await;
        write(dir.path(), 6, 20, Stream::Stdout, b"").await;
        tokio::fs::write(dir.path().join("5-11.txt"), b"")
            .await
            .unwrap();
        tokio::fs::write(dir.path().join("5-+12.out"), b"")
            .await
            .unwrap();
        assert_eq!(latest_attempt(dir.path(), 5).await.unwrap(), 10);
        assert_eq!(latest_attempt(dir.path(), 6).await.unwrap(), 20);
        let err = latest_attempt(dir.path(), 7).await.unwrap_err();
        assert!(matches!(
            err,
            ExecError::LogNotFound {
                task_id: 7,
                attempt: None,
                ..
            }
        ));
        assert_eq!(err.to_string(), "no log for task 7");
        let missing = dir.path().join("nope");
        assert!(matches!(
            latest_attempt(&missing, 5).await.unwrap_err(),
            ExecError::LogNotFound { .. }
        ));
    }
}
