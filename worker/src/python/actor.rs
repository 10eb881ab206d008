//! Python actors: the built-in dynamic actor class [`ACTOR_CLASS`], whose every instance is an
//! interpreter of its own that holds one object of a class pickled by the driver
//! (`@escher.remote` on a class).
//!
//! An incarnation's interpreter is started as a warm interpreter is (`Pool::spawn`: the
//! namespace's user, the tasks' environment, a process group and a cgroup of its own, held by
//! the fence), but it is never shared or reused: it serves its one object until the
//! incarnation ends, and is killed whole then. Its cgroup holds the actor's request's limits
//! (a CPU quota, a memory limit, a process limit: `exec/limits.rs`) for its whole life; an
//! interpreter the kernel's OOM killer ends there ends the actor with "exceeded its memory
//! request of N", as a command task that goes past its request fails. The constructor's argument bytes are an ESPY
//! envelope of kind 3 (little-endian integers):
//!
//! ```text
//! "ESPY" version:u8=2 kind:u8=3
//!   vlen:u8 versions:[u8;vlen]   the driver's Python and cloudpickle ("3.11.7 3.1.1")
//!   plen:u32 pip:[u8;plen]       version 3 only: runtime_env's pip requirements, one a line
//!   hash:[u8;32]                 SHA-256 of the class's bytes
//!   blob:u64                     the store task that holds the class, 0 when inline
//!   cls_len:u32 cls:[u8;cls_len] the cloudpickled class (cls_len 0 with a blob)
//!   args: the rest               the cloudpickled (args, kwargs) of its constructor
//! ```
//!
//! The versions are compared before anything is unpickled (`versions.rs`), as a function
//! call's are. An actor with pip requirements runs in an interpreter of their environment,
//! made once per set and shared with the functions of the same set (`pip_env.rs`). A class of more than 8 KiB travels as a large function does: once per session,
//! in a store task whose result the worker fetches (with the actor's credential) and keeps by
//! namespace and content hash, so that creating many actors of it does not put it in the
//! head's log each time. The interpreter gets the class and the arguments in a task frame whose header
//! has an `actor` entry (`{"max_concurrency": N}`), constructs the object and answers as it
//! answers a task (status 0: constructed; 1: the constructor raised; 2: the class or its
//! arguments could not be loaded). From then on the pipe carries calls and replies, numbered:
//!
//! ```text
//! call:  len:u32 | seq:u64 | mlen:u32 method[mlen] | args (the cloudpickled (args, kwargs))
//! reply: len:u32 | status:u8 | seq:u64 | body (status 0: the pickled value; 1: the text of
//!        the exception the method raised, with its remote traceback)
//! ```
//!
//! (big-endian, as the task frames). A call frame with an empty method and no arguments
//! cancels the call of its seq: an async actor cancels that call's coroutine (it then fails
//! with `CancelledError`, and the host answers it as cancelled); a sync or threaded actor
//! ignores it. The interpreter starts calls in the order they arrive:
//! one at a time, on a pool of `max_concurrency` threads, or as coroutines on one event loop
//! when the class has `async def` methods (`runner.py`). A method's exception fails its call
//! only. The incarnation ends when the interpreter exits (its status or signal is the reason)
//! or when the host stops it (its process group and cgroup killed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{MAGIC, Pool, Process, hex, versions};
use crate::actors::{ActorClass, DynamicActor};
use crate::context::TaskContext;
use crate::functions::BoxFuture;
use crate::runner::MAX_RESULT_BYTES;

/// The name of the built-in actor class that hosts Python actors.
pub const ACTOR_CLASS: &str = "escher.python";

/// A constructor's envelope, read.
#[derive(Debug, PartialEq)]
struct Construct {
    driver: versions::Versions,
    /// runtime_env's pip requirements, sorted (format 3; empty for none).
    pip: Vec<String>,
    hash: [u8; 32],
    /// The store task that holds the class (0: inline).
    blob: u64,
    class: Bytes,
    args: Bytes,
}

fn parse(bytes: Vec<u8>) -> Result<Construct, String> {
    let bad = |why: &str| {
        format!(
            "not a Python actor's constructor arguments ({why}): actors of class \
             {ACTOR_CLASS:?} are created by escher's Python package (`@escher.remote` on a \
             class)"
        )
    };
    if bytes.len() < 6 || &bytes[..4] != MAGIC {
        return Err(bad("no ESPY header"));
    }
    let format = bytes[4];
    if !(2..=3).contains(&format) || bytes[5] != 3 {
        return Err(bad(&format!(
            "format {} kind {}, this worker reads formats 2 and 3 of kind 3; upgrade the \
             worker or the package",
            bytes[4], bytes[5]
        )));
    }
    let all = Bytes::from(bytes);
    let mut at = 6;
    let mut take = |n: usize| -> Result<Bytes, String> {
        if all.len() < at + n {
            return Err(bad("truncated"));
        }
        at += n;
        Ok(all.slice(at - n..at))
    };
    let vlen = take(1)?[0] as usize;
    let text = take(vlen)?;
    let driver = std::str::from_utf8(&text)
        .ok()
        .and_then(versions::Versions::parse)
        .ok_or_else(|| bad("the driver's versions are unreadable"))?;
    let pip = if format >= 3 {
        let mut len = [0u8; 4];
        len.copy_from_slice(&take(4)?);
        super::pip_env::parse(&take(u32::from_le_bytes(len) as usize)?)?
    } else {
        Vec::new()
    };
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&take(32)?);
    let mut blob = [0u8; 8];
    blob.copy_from_slice(&take(8)?);
    let blob = u64::from_le_bytes(blob);
    let mut len = [0u8; 4];
    len.copy_from_slice(&take(4)?);
    let class = take(u32::from_le_bytes(len) as usize)?;
    if class.is_empty() && blob == 0 {
        return Err(bad("neither a class nor the task that stores it"));
    }
    let args = all.slice(at..);
    Ok(Construct {
        driver,
        pip,
        hash,
        blob,
        class,
        args,
    })
}

/// The class, made from the worker's interpreters.
pub(super) fn class(pool: Arc<Pool>) -> ActorClass {
    ActorClass::dynamic(ACTOR_CLASS, move |ctx, args, max_concurrency| {
        let pool = Arc::clone(&pool);
        Box::pin(async move {
            let actor = PythonActor::start(&pool, ctx, args, max_concurrency).await?;
            Ok(Arc::new(actor) as Arc<dyn DynamicActor>)
        })
    })
}

/// Calls waiting for their replies, by sequence number.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Vec<u8>, String>>>>>;

/// One incarnation's interpreter, serving calls.
struct PythonActor {
    seq: AtomicU64,
    /// Frames to write, in the order the calls were made (a writer task owns the pipe).
    frames: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Waiting,
    /// Why the interpreter ended, once it has.
    exited: watch::Receiver<Option<String>>,
    /// Cancelled to kill the interpreter.
    kill: CancellationToken,
    /// Cancelled once stopped: the calls left unanswered are dropped then (so that the host,
    /// which stops an instance only after it marked its incarnation ended, answers them with
    /// why it ended).
    stopped: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PythonActor {
    async fn start(
        pool: &Pool,
        ctx: TaskContext,
        args: Vec<u8>,
        max_concurrency: u32,
    ) -> Result<PythonActor, String> {
        let construct = parse(args)?;
        if let Some(why) = versions::mismatch(&construct.driver, &pool.found) {
            return Err(why);
        }
        let ns = ctx.namespace().map(|n| n.to_string()).unwrap_or_default();
        let header = serde_json::json!({
            "task_id": ctx.task_id().0,
            "attempt": ctx.attempt(),
            "node_id": ctx.node_id().0,
            "head": ctx.head_list(),
            "token": ctx.token_text(),
            "tls_ca": ctx.head_trust().0,
            "tls_name": ctx.head_trust().1,
            "namespace": ns,
            "hash": hex(&construct.hash),
            "deps": [],
            "actor": {"max_concurrency": max_concurrency},
        })
        .to_string();
        let class = if construct.class.is_empty() {
            pool.blob(&ctx, &ns, construct.hash, construct.blob).await?
        } else {
            super::verify(&construct.hash, &construct.class, "actor's class")?;
            construct.class.clone()
        };
        // A fresh interpreter, never one of the warm ones: it is this incarnation's alone.
        let exe = pool.interpreter(&ns, &construct.pip).await?;
        // Its cgroup holds the actor's request's limits for its whole life.
        let mut interp = pool.spawn(&ns, exe.as_deref(), ctx.cgroups(), &ctx.limits())?;
        // What the object prints, for as long as it lives, is the actor task's output.
        interp
            .give_output(&ctx, &[])
            .await
            .map_err(|e| format!("cannot give the actor's interpreter its log files: {e}"))?;
        interp
            .send(header.as_bytes(), &class, &[], &construct.args)
            .await
            .map_err(|e| format!("cannot send the actor's class to its interpreter: {e}"))?;
        let (status, body) = match interp.receive(&ctx).await {
            Ok(answer) => answer,
            Err(e) => {
                if let Some(limit) = interp.process.memory_exceeded() {
                    let how = interp.process.ended().await;
                    return Err(crate::exec::memory_exceeded(limit, &how));
                }
                let why = exit_text(&mut interp.process).await;
                return Err(format!(
                    "its Python interpreter ({}) ended while constructing it ({why}; {e})",
                    pool.found.exe.display()
                ));
            }
        };
        match status {
            0 => {}
            2 => {
                return Err(versions::load_failure(
                    &String::from_utf8_lossy(&body),
                    Some(&construct.driver),
                    &pool.found,
                ));
            }
            _ => return Err(String::from_utf8_lossy(&body).into_owned()),
        }
        let super::Interpreter {
            process,
            stdin,
            stdout,
            ctl,
            ..
        } = interp;
        let (frames, mut outgoing) = mpsc::unbounded_channel::<Vec<u8>>();
        let waiting: Waiting = Arc::default();
        let (exited_tx, exited) = watch::channel(None);
        let kill = CancellationToken::new();
        // The writer: frames in the order the calls were made. A pipe that broke means the
        // interpreter is gone; the waiter says why.
        tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(frame) = outgoing.recv().await {
                if stdin.write_all(&frame).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
        // The reader: each reply to the call of its number; each `escher.get` a call asks of
        // the worker served beside the calls (`objects.rs`: one at a time, the interpreter
        // holds one open), its copy pinned until the descriptor is handed over.
        let replies = Arc::clone(&waiting);
        let (ctl, gets) = (Arc::new(ctl), ctx.clone());
        tokio::spawn(async move {
            let mut stdout = stdout;
            while let Ok((status, seq, body)) = read_reply(&mut stdout).await {
                if status == super::objects::GET {
                    let Ok(id) = super::objects::parse(&body) else {
                        tracing::warn!(
                            "a Python actor's interpreter sent a malformed object request"
                        );
                        continue;
                    };
                    let (ctl, ctx) = (Arc::clone(&ctl), gets.clone());
                    tokio::spawn(async move {
                        let answer = super::objects::serve(&ctx, id).await;
                        if let Err(error) = super::objects::reply(&ctl, id, &answer).await {
                            tracing::warn!(object = %id, %error, "cannot answer a Python actor's object request");
                        }
                    });
                    continue;
                }
                if let Some(reply) = lock(&replies).remove(&seq) {
                    let _ = reply.send(match status {
                        0 => Ok(body),
                        _ => Err(String::from_utf8_lossy(&body).into_owned()),
                    });
                }
            }
        });
        // The waiter: holds the process until it exits or is killed, then says why it ended.
        let killed = kill.clone();
        let pid = process.pid.unwrap_or_default();
        let logs = ctx.logs().cloned();
        tokio::spawn(async move {
            let mut process = process;
            // Its log files are held to the worker's cap while it lives.
            let mut every = tokio::time::interval(super::LOG_CAP_EVERY);
            let why = loop {
                tokio::select! {
                    status = process.child.wait() => break match (status, super::memory_exceeded(process.cgroup.as_ref())) {
                        // Killed by the kernel for going past the actor's memory limit.
                        (Ok(status), Some(limit)) => {
                            let how = format!(
                                "its Python interpreter, pid {pid}, {}",
                                crate::exec::ProcessExit::from(status)
                            );
                            crate::exec::memory_exceeded(limit, &how)
                        }
                        (Ok(status), None) => status_text(pid, status),
                        (Err(e), _) => format!("its Python interpreter (pid {pid}) could not be waited for: {e}"),
                    },
                    () = killed.cancelled() => break "the actor was stopped".to_string(),
                    _ = every.tick() => if let Some(logs) = &logs {
                        super::cap(logs);
                    },
                }
            };
            if let Some(logs) = &logs {
                super::cap(logs);
            }
            // Dropped first: the group and the cgroup are killed before the end is told.
            drop(process);
            let _ = exited_tx.send(Some(why));
        });
        Ok(PythonActor {
            seq: AtomicU64::new(1),
            frames,
            waiting,
            exited,
            kill,
            stopped: CancellationToken::new(),
        })
    }
}

impl DynamicActor for PythonActor {
    fn call(&self, method: String, args: Bytes) -> BoxFuture<Result<Vec<u8>, String>> {
        self.call_cancellable(method, args, CancellationToken::new())
    }

    /// A cancel sends the interpreter a cancel frame for the call (its seq, an empty method):
    /// an async actor cancels the call's coroutine, which then fails with `CancelledError`;
    /// a sync or threaded actor's interpreter ignores it and the call runs on.
    fn call_cancellable(
        &self,
        method: String,
        args: Bytes,
        cancel: CancellationToken,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        lock(&self.waiting).insert(seq, reply);
        let body = 8 + 4 + method.len() + args.len();
        // Queued now, not when the future is first polled: calls reach the interpreter in the
        // order of these calls.
        match u32::try_from(body) {
            Ok(len) => {
                let mut frame = Vec::with_capacity(4 + body);
                frame.extend_from_slice(&len.to_be_bytes());
                frame.extend_from_slice(&seq.to_be_bytes());
                frame.extend_from_slice(&(method.len() as u32).to_be_bytes());
                frame.extend_from_slice(method.as_bytes());
                frame.extend_from_slice(&args);
                let _ = self.frames.send(frame);
            }
            Err(_) => {
                lock(&self.waiting).remove(&seq);
                let len = args.len();
                return Box::pin(async move {
                    Err(format!(
                        "the arguments of {method} are {len} bytes, more than a call carries \
                         (4 GiB)"
                    ))
                });
            }
        }
        let stopped = self.stopped.clone();
        let frames = self.frames.clone();
        Box::pin(async move {
            let mut answer = answer;
            let answer = tokio::select! {
                answer = &mut answer => answer,
                () = cancel.cancelled() => {
                    let mut frame = Vec::with_capacity(16);
                    frame.extend_from_slice(&12u32.to_be_bytes());
                    frame.extend_from_slice(&seq.to_be_bytes());
                    frame.extend_from_slice(&0u32.to_be_bytes());
                    let _ = frames.send(frame);
                    answer.await
                }
            };
            match answer {
                Ok(answer) => answer,
                // Dropped when the actor stopped: the host answers with why it ended.
                Err(_) => {
                    stopped.cancelled().await;
                    Err("the actor ended".to_string())
                }
            }
        })
    }

    fn ended(&self) -> BoxFuture<String> {
        let mut exited = self.exited.clone();
        Box::pin(async move {
            match exited.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                Err(_) => "its Python interpreter ended".to_string(),
            }
        })
    }

    fn stop(&self) -> BoxFuture<()> {
        self.kill.cancel();
        let mut exited = self.exited.clone();
        let (waiting, stopped) = (Arc::clone(&self.waiting), self.stopped.clone());
        Box::pin(async move {
            let _ = exited.wait_for(Option::is_some).await;
            lock(&waiting).clear();
            stopped.cancel();
        })
    }
}

async fn read_reply(
    stdout: &mut tokio::io::BufReader<tokio::process::ChildStdout>,
) -> std::io::Result<(u8, u64, Vec<u8>)> {
    let len = stdout.read_u32().await? as usize;
    if !(9..=MAX_RESULT_BYTES + 9).contains(&len) {
        return Err(std::io::Error::other(format!(
            "the actor answered with a frame of {len} bytes"
        )));
    }
    let status = stdout.read_u8().await?;
    let seq = stdout.read_u64().await?;
    let mut body = vec![0; len - 9];
    stdout.read_exact(&mut body).await?;
    Ok((status, seq, body))
}

/// Why an interpreter that was not asked to stop ended.
fn status_text(pid: i32, status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        let name = nix::sys::signal::Signal::try_from(signal)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|_| format!("signal {signal}"));
        return format!(
            "its Python interpreter (pid {pid}) was killed by signal {signal} ({name})"
        );
    }
    match status.code() {
        Some(code) => format!("its Python interpreter (pid {pid}) exited with status {code}"),
        None => format!("its Python interpreter (pid {pid}) ended"),
    }
}

/// How an interpreter that stopped answering ended, waiting briefly for it.
async fn exit_text(process: &mut Process) -> String {
    let pid = process.pid.unwrap_or_default();
    match tokio::time::timeout(std::time::Duration::from_secs(2), process.child.wait()).await {
        Ok(Ok(status)) => status_text(pid, status),
        _ => format!("its Python interpreter (pid {pid}) stopped answering"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(versions: &str, class: &[u8], args: &[u8]) -> Vec<u8> {
        stored(versions, 0, class, args)
    }

    fn stored(versions: &str, blob: u64, class: &[u8], args: &[u8]) -> Vec<u8> {
        let mut v = b"ESPY\x02\x03".to_vec();
        v.push(versions.len() as u8);
        v.extend_from_slice(versions.as_bytes());
        v.extend_from_slice(&[9u8; 32]);
        v.extend_from_slice(&blob.to_le_bytes());
        v.extend_from_slice(&(class.len() as u32).to_le_bytes());
        v.extend_from_slice(class);
        v.extend_from_slice(args);
        v
    }

    #[test]
    fn reads_a_constructors_envelope() {
        let c = parse(envelope("3.11.7 3.1.1", b"cls", b"args")).unwrap();
        assert_eq!(c.driver.python, "3.11.7");
        assert_eq!(c.driver.cloudpickle, "3.1.1");
        assert_eq!(c.hash, [9u8; 32]);
        assert_eq!((&c.class[..], &c.args[..]), (&b"cls"[..], &b"args"[..]));
        assert_eq!(c.blob, 0);
        assert!(c.pip.is_empty());
        let c = parse(stored("3.11.7 3.1.1", 12, b"", b"args")).unwrap();
        assert_eq!((c.blob, c.class.len(), &c.args[..]), (12, 0, &b"args"[..]));
    }

    #[test]
    fn format_3_carries_the_pip_requirements() {
        let plain = envelope("3.11.7 3.1.1", b"cls", b"args");
        let mut v = b"ESPY\x03\x03".to_vec();
        v.extend_from_slice(&plain[6..19]);
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(b"b==2\na==1");
        v.extend_from_slice(&plain[19..]);
        let c = parse(v).unwrap();
        assert_eq!(c.pip, vec!["a==1".to_string(), "b==2".into()]);
        assert_eq!((&c.class[..], &c.args[..]), (&b"cls"[..], &b"args"[..]));
    }

    #[test]
    fn refuses_what_is_not_a_constructors_envelope() {
        assert!(parse(b"hello".to_vec()).unwrap_err().contains("no ESPY"));
        // A function call's envelope is not an actor's.
        assert!(
            parse(b"ESPY\x02\x01xxxx".to_vec())
                .unwrap_err()
                .contains("kind 1")
        );
        let mut short = envelope("3.11.7 3.1.1", b"cls", b"");
        short.truncate(20);
        assert!(parse(short).unwrap_err().contains("truncated"));
        assert!(
            parse(envelope("3.11.7", b"cls", b""))
                .unwrap_err()
                .contains("unreadable")
        );
        assert!(
            parse(envelope("3.11.7 3.1.1", b"", b""))
                .unwrap_err()
                .contains("neither a class")
        );
    }
}
