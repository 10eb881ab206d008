//! Where a command task's output lives, and reading it back in bounded chunks.
//!
//! Each attempt of a task writes `{log_dir}/{task_id}-{attempt}.out` (stdout) and
//! `{log_dir}/{task_id}-{attempt}.err` (stderr); [`log_path`] is the one place that spells the
//! names. [`read_log`] serves a chunk of at most [`MAX_LOG_CHUNK`] bytes from an offset, so a
//! caller can page through a large log, or follow a running task's log by asking again from
//! `next_offset`. [`AttemptLogs`] holds an attempt's two files from their creation and reads the
//! end of a stream (what the worker reports to the head when an attempt ends, so that it
//! outlives the worker) and holds each stream to the worker's cap ([`AttemptLogs::cap`],
//! `--task-log-bytes`), and [`sweep_logs`] applies the worker's retention rule: files older
//! than an age go, then the oldest while the directory holds more than a byte budget; the logs
//! of running attempts always stay.

use std::fmt;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::error::ExecError;

/// The most bytes of each stream a task's log keeps, unless `--task-log-bytes` says (64 MiB).
pub const DEFAULT_TASK_LOG_BYTES: u64 = 64 * 1024 * 1024;

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

/// The two log files of one attempt, as the worker holds them while the command runs and
/// after: the end of the output is read through these handles (no path lookup, one blocking
/// trip only when there is output), whatever became of the files' names meanwhile.
#[derive(Debug)]
pub struct AttemptLogs {
    stdout: std::fs::File,
    stderr: std::fs::File,
    /// Each stream's (stdout, stderr) length once it ended with its marker line: it reached
    /// the cap, or the node's disk went under its reserve.
    capped: [Option<u64>; 2],
}

/// What [`AttemptLogs::create`] gives: the worker's handles, and the files the child writes.
pub(crate) type CreatedLogs = (AttemptLogs, std::fs::File, std::fs::File);

impl AttemptLogs {
    /// Creates (truncating) the two log files of an attempt, and `log_dir` first if it is
    /// missing. Blocking: the caller makes one trip to a blocking thread for all of it.
    pub(crate) fn create(
        log_dir: &Path,
        task_id: u64,
        attempt: u32,
    ) -> Result<CreatedLogs, ExecError> {
        // Read and write: the child writes through its copy, the worker reads the end.
        let open = |path: &Path| {
            use std::os::unix::fs::OpenOptionsExt;
            // Only the worker reads them: a task's output is its own.
            // Appending: the child's writes go to the end wherever the worker cut the file
            // (`cap`), never at an offset past it.
            std::fs::OpenOptions::new()
                .mode(0o600)
                .custom_flags(nix::fcntl::OFlag::O_APPEND.bits())
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
        };
        let create = |stream| {
            let path = log_path(log_dir, task_id, attempt, stream);
            // The directory exists unless someone removed it: on any failure, creating it
            // again either mends the cause or names it (a `LogDir` error) before a second try.
            let file = match open(&path) {
                Ok(file) => Ok(file),
                Err(_) => {
                    std::fs::create_dir_all(log_dir).map_err(|source| ExecError::LogDir {
                        path: log_dir.to_path_buf(),
                        source,
                    })?;
                    open(&path)
                }
            };
            let file = file.map_err(|source| ExecError::LogFile {
                path: path.clone(),
                source,
            })?;
            let kept = file
                .try_clone()
                .map_err(|source| ExecError::LogFile { path, source })?;
            Ok::<_, ExecError>((kept, file))
        };
        let (stdout, child_stdout) = create(Stream::Stdout)?;
        let (stderr, child_stderr) = create(Stream::Stderr)?;
        let logs = AttemptLogs {
            stdout,
            stderr,
            capped: [None; 2],
        };
        Ok((logs, child_stdout, child_stderr))
    }

    /// Holds each stream to `max` bytes: a stream that went past is cut back to `max`, followed
    /// by one line that says the rest was dropped; whatever the task appended after that line
    /// is cut again. The worker calls it while the task runs (so the disk holds at most what
    /// the task writes between two calls past the cap) and once after it ended. Blocking.
    pub fn cap(&mut self, max: u64) -> io::Result<()> {
        self.hold(max, None)
    }

    /// As [`AttemptLogs::cap`], and with `stop` (why: the node's disk is under its reserve)
    /// every stream not ended yet ends where it is now, with one line that says why. Blocking.
    pub fn hold(&mut self, max: u64, stop: Option<&str>) -> io::Result<()> {
        for (i, file) in [&self.stdout, &self.stderr].into_iter().enumerate() {
            let len = file.metadata()?.len();
            if let Some(kept) = self.capped[i] {
                if len > kept {
                    file.set_len(kept)?;
                }
                continue;
            }
            let (at, marker) = match stop {
                _ if len > max => (max, cap_marker(max)),
                Some(why) => (len, stop_marker(len, why)),
                None => continue,
            };
            file.set_len(at)?;
            // Written at `at` through a description of its own: the child's (and the
            // worker's) is in append mode, where a positioned write goes to the end.
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::FileExt;
            let writer = std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
            writer.write_all_at(marker.as_bytes(), at)?;
            // What the task appended between the cut and the marker.
            let kept = at + marker.len() as u64;
            file.set_len(kept)?;
            self.capped[i] = Some(kept);
        }
        Ok(())
    }

    /// Appends `buf` to `stream` from inside the worker (an in-process attempt's output,
    /// `TaskContext::stdout`), unless the stream already holds more than `max` bytes: then it
    /// is dropped, and [`AttemptLogs::cap`] at the attempt's end cuts the stream back to `max`
    /// and says so. Blocking.
    pub fn append(&mut self, stream: Stream, buf: &[u8], max: u64) -> io::Result<()> {
        use std::io::Write as _;
        let (i, mut file) = match stream {
            Stream::Stdout => (0, &self.stdout),
            Stream::Stderr => (1, &self.stderr),
        };
        if self.capped[i].is_some() || file.metadata()?.len() > max {
            return Ok(());
        }
        file.write_all(buf)
    }

    /// How many bytes each stream holds so far: (stdout, stderr).
    pub fn lens(&self) -> io::Result<(u64, u64)> {
        Ok((self.stdout.metadata()?.len(), self.stderr.metadata()?.len()))
    }

    /// The last `max` bytes of `stream`, and the stream's whole length. Blocking.
    pub fn tail(&self, stream: Stream, max: usize) -> io::Result<(Vec<u8>, u64)> {
        use std::os::unix::fs::FileExt;
        let file = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        };
        let len = file.metadata()?.len();
        let start = len.saturating_sub(max as u64);
        let mut data = vec![0; usize::try_from(len - start).unwrap_or(0)];
        // Positioned reads: the child's descriptors share this file's offset, which stays.
        let mut read = 0;
        while read < data.len() {
            match file.read_at(&mut data[read..], start + read as u64)? {
                0 => break,
                n => read += n,
            }
        }
        data.truncate(read);
        Ok((data, len))
    }
}

/// The line that ends a stream cut at `max` bytes.
fn cap_marker(max: u64) -> String {
    format!(
        "\n[escher: output past {max} bytes dropped: the task reached its log cap, the worker's \
         --task-log-bytes]\n"
    )
}

/// The line that ends a stream stopped at `at` bytes because the node's disk is low.
fn stop_marker(at: u64, why: &str) -> String {
    format!("\n[escher: output past {at} bytes dropped: {why}]\n")
}

/// How long a worker keeps command logs, and how much of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    /// Logs last written longer ago than this are removed.
    pub max_age: Duration,
    /// While the logs take more bytes than this, the oldest are removed.
    pub max_bytes: u64,
}

impl Default for LogRetention {
    /// A week, and 1 GiB.
    fn default() -> Self {
        LogRetention {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// What one [`sweep_logs`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Files removed.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Applies `policy` to the logs in `log_dir`, as of `now`: removes every log last written
/// before `now - max_age`, then the oldest (by last write) while the rest take more than
/// `max_bytes`. The logs of the attempts `running` names are never removed. Files whose
/// names are not log names are left alone. Blocking: call it from a blocking thread.
pub fn sweep_logs(
    log_dir: &Path,
    policy: LogRetention,
    running: &std::collections::HashSet<(u64, u32)>,
    now: SystemTime,
) -> io::Result<Swept> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(log_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(key) = name.to_str().and_then(parse_log_name) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue; // removed meanwhile
        };
        if !meta.is_file() || running.contains(&key) {
            continue;
        }
        let written = meta.modified().unwrap_or(now);
        files.push((written, meta.len(), entry.path()));
    }
    // Oldest first.
    files.sort();
    let cutoff = now
        .checked_sub(policy.max_age)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    let mut swept = Swept::default();
    for (written, len, path) in files {
        if written >= cutoff && total <= policy.max_bytes {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                swept.files += 1;
                swept.bytes += len;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        total -= len;
    }
    Ok(swept)
}

/// The file in a log directory that names the cluster its logs belong to.
pub const CLUSTER_MARKER: &str = ".escher-cluster";

/// Makes `log_dir` the log directory of cluster `cluster`: when it held another cluster's logs
/// (whose task ids mean nothing here, and would be served as this cluster's), they are
/// removed, except those of the attempts `running` names. Returns how many files went.
/// Blocking: call it from a blocking thread.
pub fn claim_log_dir(
    log_dir: &Path,
    cluster: &str,
    running: &std::collections::HashSet<(u64, u32)>,
) -> io::Result<usize> {
    let marker = log_dir.join(CLUSTER_MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(owner) if owner.trim() == cluster => return Ok(0),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut removed = 0;
    for entry in std::fs::read_dir(log_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_log_name) {
            Some(key) if !running.contains(&key) => match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
            _ => {}
        }
    }
    std::fs::write(&marker, cluster)?;
    Ok(removed)
}

/// The task and attempt of a log file name `{task_id}-{attempt}.{out,err}`.
fn parse_log_name(name: &str) -> Option<(u64, u32)> {
    let stem = name
        .strip_suffix(".out")
        .or_else(|| name.strip_suffix(".err"))?;
    let (task, attempt) = stem.split_once('-')?;
    // `from_str` accepts a leading `+`; log_path never writes one.
    if task.starts_with('+') || attempt.starts_with('+') {
        return None;
    }
    Some((task.parse().ok()?, attempt.parse().ok()?))
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

    #[test]
    fn a_tail_is_the_end_of_the_stream_and_its_length() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        // The directory is created with the files when it is missing.
        let log_dir = dir.path().join("logs");
        let (logs, mut out, _err) = AttemptLogs::create(&log_dir, 3, 1).unwrap();
        assert_eq!(logs.lens().unwrap(), (0, 0));
        out.write_all(b"0123456789").unwrap();
        assert_eq!(logs.lens().unwrap(), (10, 0));
        assert_eq!(
            logs.tail(Stream::Stdout, 4).unwrap(),
            (b"6789".to_vec(), 10)
        );
        let all = logs.tail(Stream::Stdout, 100).unwrap();
        assert_eq!(all, (b"0123456789".to_vec(), 10));
        assert_eq!(logs.tail(Stream::Stderr, 4).unwrap(), (Vec::new(), 0));
        // Written after the reads, read from where it was written: the reads moved nothing.
        out.write_all(b"ab").unwrap();
        assert_eq!(logs.tail(Stream::Stdout, 3).unwrap(), (b"9ab".to_vec(), 12));
        // The handles outlive the names.
        std::fs::remove_dir_all(&log_dir).unwrap();
        assert_eq!(logs.tail(Stream::Stdout, 2).unwrap(), (b"ab".to_vec(), 12));
    }

    #[test]
    fn log_names_parse_and_others_do_not() {
        assert_eq!(parse_log_name("5-10.out"), Some((5, 10)));
        assert_eq!(parse_log_name("5-2.err"), Some((5, 2)));
        for other in [
            "5-11.txt",
            "5-+12.out",
            "+5-1.out",
            "5.out",
            "x-1.err",
            "fence.pid",
        ] {
            assert_eq!(parse_log_name(other), None, "{other}");
        }
    }

    fn age(dir: &Path, name: &str, ago: Duration) {
        let file = std::fs::File::options()
            .write(true)
            .open(dir.join(name))
            .unwrap();
        file.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[tokio::test]
    async fn the_sweep_removes_old_logs_then_the_oldest_past_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let hour = Duration::from_secs(3600);
        write(d, 1, 1, Stream::Stdout, &[b'a'; 100]).await; // old, done
        write(d, 2, 1, Stream::Stdout, &[b'b'; 100]).await; // old, but running
        write(d, 3, 1, Stream::Stdout, &[b'c'; 100]).await; // older than the rest
        write(d, 4, 1, Stream::Stderr, &[b'd'; 100]).await; // newest
        tokio::fs::write(d.join("notes.txt"), b"keep")
            .await
            .unwrap();
        age(d, "1-1.out", 48 * hour);
        age(d, "2-1.out", 48 * hour);
        age(d, "3-1.out", 3 * hour);
        age(d, "4-1.err", hour);
        age(d, "notes.txt", 480 * hour);
        let running = [(2, 1)].into_iter().collect();
        let policy = LogRetention {
            max_age: 24 * hour,
            max_bytes: 150,
        };
        let swept = sweep_logs(d, policy, &running, SystemTime::now()).unwrap();
        // 1-1 by age; then 3-1 and 4-1 are 200 bytes: 3-1, the oldest, goes too.
        assert_eq!(
            swept,
            Swept {
                files: 2,
                bytes: 200
            }
        );
        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["2-1.out", "4-1.err", "notes.txt"]);
        // Within both limits, nothing goes.
        let again = sweep_logs(d, policy, &running, SystemTime::now()).unwrap();
        assert_eq!(again, Swept::default());
    }

    #[tokio::test]
    async fn another_clusters_logs_go_when_the_directory_is_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, 1, 1, Stream::Stdout, b"old").await;
        write(d, 2, 1, Stream::Stderr, b"running").await;
        let running = [(2, 1)].into_iter().collect();
        // A directory no cluster claimed yet holds logs of unknown origin: they go.
        assert_eq!(claim_log_dir(d, "c-1", &running).unwrap(), 1);
        write(d, 3, 1, Stream::Stdout, b"ours").await;
        // The same cluster again: nothing goes.
        assert_eq!(claim_log_dir(d, "c-1", &running).unwrap(), 0);
        assert!(log_path(d, 3, 1, Stream::Stdout).exists());
        // Another cluster: everything but the running attempt goes.
        assert_eq!(claim_log_dir(d, "c-2", &running).unwrap(), 1);
        assert!(!log_path(d, 3, 1, Stream::Stdout).exists());
        assert!(log_path(d, 2, 1, Stream::Stderr).exists());
        assert_eq!(
            std::fs::read_to_string(d.join(CLUSTER_MARKER)).unwrap(),
            "c-2"
        );
    }
}
