//! A worker for tests only: `escher-worker`'s library with two Rust actor classes registered,
//! which the released `escher-worker` does not have. The end-to-end tests that need a Rust
//! actor in a real worker process (`tests/e2e_actor_faults.rs`: a partitioned worker's actor
//! fenced, the head's leader SIGKILLed under actor calls) run this binary in place of
//! `escher-worker` (`procs::WorkerExtra::binary`). It is not a program for users.
//!
//! It takes the flags the test harness gives every worker (`--head`, `--state-dir`, `--name`,
//! `--resources`, `--log-dir`, `--grace`, `--pass-env`), starts the fence supervisor like
//! `escher-worker`, and offers no Python.
//!
//! The classes leave a trace outside the worker, in files the test reads, so that what the
//! processes did can be checked rather than what they reported:
//!
//! - `Locker(path)` takes an exclusive lock on the file `path` (`flock`, without waiting) in its
//!   constructor and holds it until the instance is dropped. It appends one line per event to
//!   `path.journal`: `take INCARNATION WORKER` once it holds the lock, `call INCARNATION WORKER`
//!   for each call of `hold`, `release INCARNATION WORKER` as the instance is dropped (just
//!   before the lock goes), and `conflict INCARNATION WORKER` when the lock was held by someone
//!   else, which fails the constructor: two incarnations would have held it at once.
//!   `hold()` answers `(incarnation, worker)`.
//! - `Tally(journal)` counts: `add(n)` answers the new count, `get()` the count. Its constructor
//!   appends `made ACTOR INCARNATION WORKER` to the file `journal`, so that every incarnation
//!   ever made, in any worker process, is on record.
//!
//! - `PatientLocker((path, wait_ms))` is `Locker` whose constructor waits up to `wait_ms` for
//!   the lock instead of failing at once: it appends `wait INCARNATION WORKER` when the lock
//!   was held as it started (a stopped worker's incarnation still holds it), then `take` once
//!   it holds it, or `conflict` if the wait ran out. Same journal, same `hold()`.
//!
//! And one function (a task, not an actor):
//!
//! - `lock_for((path, ms))` takes the lock on `path` like `Locker` (`conflict ATTEMPT WORKER`
//!   and an error if it is held), appends `take ATTEMPT WORKER`, then `tick ATTEMPT WORKER`
//!   every 100 ms for `ms` milliseconds, and `release ATTEMPT WORKER` as it lets go (when it
//!   returns, or when its future is dropped: the worker stopped it). It returns
//!   `(attempt, worker)`.
//!
//! - `bytes((len, seed))` returns `len` bytes, each `seed` (raw): above 100 KiB the result stays
//!   in the worker's store as an object (`tests/e2e_object_sessions.rs`: results released with
//!   their client's session). Its worker takes `--object-store-dir` as `escher-worker` does.
//! - `bytes_after((len, seed, gate))` is `bytes` once the file `gate` exists (at most a
//!   minute), so that a test decides when the result is made.
//! - `pattern((len, seed))` returns `len` raw bytes that differ with `seed` (byte `i` is
//!   `i * 31 + seed`, wrapping): above 100 KiB, a result object kept in this worker's store
//!   (`tests/e2e_object_reconcile.rs`). `--object-store-dir DIR` puts the store under `DIR`.
//!
//! Build it with `cargo build -p escher-worker --examples` (`cargo test --workspace` builds it).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use escher_worker::{ActorClass, WorkerBuilder};

/// The flags the test harness gives a worker.
#[derive(Debug, Parser)]
#[command(name = "test_actor_worker")]
struct Args {
    #[arg(long)]
    head: String,
    #[arg(long)]
    state_dir: PathBuf,
    #[arg(long)]
    name: String,
    #[arg(long)]
    resources: String,
    #[arg(long)]
    log_dir: PathBuf,
    /// Seconds a stopped command gets between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 1.0)]
    grace: f64,
    #[arg(long)]
    pass_env: Vec<String>,
    /// The object store's memory directory (`escher-worker --object-store-dir`).
    #[arg(long)]
    object_store_dir: Option<PathBuf>,
}

/// `len` bytes that differ with `seed`: the result of the function `pattern`.
fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Appends `line` to the file at `path` in one write (lines of concurrent writers never mix).
fn journal(path: &Path, line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// An incarnation holding the lock.
struct Locker {
    /// Held open: the lock lasts as long as the file.
    _lock: File,
    journal: PathBuf,
    incarnation: u32,
    worker: String,
}

impl Drop for Locker {
    fn drop(&mut self) {
        let line = format!("release {} {}", self.incarnation, self.worker);
        let _ = journal(&self.journal, &line);
    }
}

fn locker(worker: String) -> ActorClass {
    ActorClass::new("Locker", move |ctx, path: String| {
        let worker = worker.clone();
        async move {
            let incarnation = ctx.attempt();
            let journal_path = PathBuf::from(format!("{path}.journal"));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open the lock file {path}: {e}"))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    journal(&journal_path, &format!("conflict {incarnation} {worker}"))?;
                    return Err(format!(
                        "the lock {path} is held by another incarnation: two would hold it"
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("cannot lock {path}: {e}"));
                }
            }
            journal(&journal_path, &format!("take {incarnation} {worker}"))?;
            Ok(Locker {
                _lock: file,
                journal: journal_path,
                incarnation,
                worker,
            })
        }
    })
    .method("hold", |l: &mut Locker, (): ()| {
        journal(&l.journal, &format!("call {} {}", l.incarnation, l.worker))?;
        Ok((l.incarnation, l.worker.clone()))
    })
}

/// Opens `path` and takes its lock without waiting: `Ok(None)` if someone else holds it.
fn try_lock(path: &str) -> Result<Option<File>, String> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open the lock file {path}: {e}"))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {path}: {e}")),
    }
}

fn patient_locker(worker: String) -> ActorClass {
    ActorClass::new(
        "PatientLocker",
        move |ctx, (path, wait_ms): (String, u64)| {
            let worker = worker.clone();
            async move {
                let incarnation = ctx.attempt();
                let journal_path = PathBuf::from(format!("{path}.journal"));
                let deadline = std::time::Instant::now() + Duration::from_millis(wait_ms);
                let mut waited = false;
                let file = loop {
                    if let Some(file) = try_lock(&path)? {
                        break file;
                    }
                    if !waited {
                        journal(&journal_path, &format!("wait {incarnation} {worker}"))?;
                        waited = true;
                    }
                    if std::time::Instant::now() >= deadline {
                        journal(&journal_path, &format!("conflict {incarnation} {worker}"))?;
                        return Err(format!(
                            "the lock {path} was still held by another incarnation after \
                             {wait_ms} ms"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                journal(&journal_path, &format!("take {incarnation} {worker}"))?;
                Ok(Locker {
                    _lock: file,
                    journal: journal_path,
                    incarnation,
                    worker,
                })
            }
        },
    )
    .method("hold", |l: &mut Locker, (): ()| {
        journal(&l.journal, &format!("call {} {}", l.incarnation, l.worker))?;
        Ok((l.incarnation, l.worker.clone()))
    })
}

/// `lock_for`'s hold on the lock: journals its release when dropped, returned or stopped.
struct Held {
    _lock: File,
    journal: PathBuf,
    line: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = journal(&self.journal, &format!("release {}", self.line));
    }
}

async fn lock_for(
    ctx: escher_worker::TaskContext,
    worker: String,
    path: String,
    ms: u64,
) -> Result<(u32, String), String> {
    let attempt = ctx.attempt();
    let journal_path = PathBuf::from(format!("{path}.journal"));
    let line = format!("{attempt} {worker}");
    let Some(file) = try_lock(&path)? else {
        journal(&journal_path, &format!("conflict {line}"))?;
        return Err(format!(
            "the lock {path} is held by another attempt: two would hold it"
        ));
    };
    journal(&journal_path, &format!("take {line}"))?;
    let _held = Held {
        _lock: file,
        journal: journal_path.clone(),
        line: line.clone(),
    };
    let until = tokio::time::Instant::now() + Duration::from_millis(ms);
    while tokio::time::Instant::now() < until {
        journal(&journal_path, &format!("tick {line}"))?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((attempt, worker))
}

fn tally(worker: String) -> ActorClass {
    ActorClass::new("Tally", move |ctx, path: String| {
        let worker = worker.clone();
        async move {
            let line = format!("made {} {} {worker}", ctx.task_id(), ctx.attempt());
            journal(Path::new(&path), &line)?;
            Ok(0u64)
        }
    })
    .method("add", |n: &mut u64, by: u64| {
        *n += by;
        Ok(*n)
    })
    .method("get", |n: &mut u64, (): ()| Ok(*n))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some(escher_worker::fence::SUPERVISOR_ARG) {
        escher_worker::fence::supervise();
        return Ok(());
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let program = std::env::current_exe()?;
    escher_worker::fence::start(&program)?;
    let mut builder = WorkerBuilder::new()
        .head(args.head)
        .state_dir(args.state_dir)
        .name(args.name.clone())
        .resources(args.resources.parse()?)
        .log_dir(args.log_dir)
        .grace(Duration::from_secs_f64(args.grace))
        .python(escher_worker::PythonDetection::Off)
        .actor(locker(args.name.clone()))
        .actor(patient_locker(args.name.clone()))
        .actor(tally(args.name.clone()));
    if let Some(dir) = args.object_store_dir {
        builder = builder.object_store_dir(dir);
    }
    builder = builder.function("bytes", |_ctx, args: Vec<u8>| async move {
        let (len, seed): (u64, u8) =
            escher_proto::codec::decode(&args).map_err(|e| e.to_string())?;
        Ok(vec![seed; len as usize])
    });
    builder = builder.function("bytes_after", |_ctx, args: Vec<u8>| async move {
        let (len, seed, gate): (u64, u8, String) =
            escher_proto::codec::decode(&args).map_err(|e| e.to_string())?;
        // Bounded, so that a test that never opens the gate does not leave it running.
        for _ in 0..1200 {
            if Path::new(&gate).exists() {
                return Ok(vec![seed; len as usize]);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("{gate} never appeared within a minute"))
    });
    let worker_name = args.name;
    builder = builder.typed_function("lock_for", move |ctx, (path, ms): (String, u64)| {
        lock_for(ctx, worker_name.clone(), path, ms)
    });
    builder = builder.function("pattern", |_ctx, args: Vec<u8>| async move {
        let (len, seed): (u64, u8) =
            escher_proto::codec::decode(&args).map_err(|e| e.to_string())?;
        Ok(pattern(len, seed))
    });
    for var in args.pass_env {
        builder = builder.pass_env(var);
    }
    let worker = builder.build()?;
    worker
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
