//! [`ProcessCluster`]: real `escher-head` processes (one, or the replicas of a raft group) and
//! real `escher-worker` processes on loopback, for end-to-end tests that kill, stop, restart
//! and partition them.
//!
//! A replicated head ([`ProcessClusterBuilder::heads`]) is started on ports chosen up front,
//! every replica with the same `--peers` list (or, with [`ProcessClusterBuilder::proxied`],
//! each replica reaching each other one through a [`Proxy`] the test controls, so that it can
//! cut any replica off: a partition). Durable heads ([`ProcessClusterBuilder::durable`]) keep
//! their raft logs in the cluster's directory and are restarted on the same port and data
//! directory.
//!
//! The binaries are the ones cargo built next to the test executable (`target/<profile>/`);
//! `cargo test --workspace` builds them, `cargo test --test NAME` alone does not, and then the
//! tests fail with a message saying so rather than skip.
//!
//! Everything a cluster starts lives in one temporary directory: the head's address file, each
//! process's stdout and stderr, each worker's task logs and state directory (its node
//! identity: a worker started again under the same name keeps its node id), `ESCHER_HOME`,
//! and whatever the tests' tasks write. It is made in [`cluster_base`] (cargo's
//! `target/tmp`), not in `/tmp`: a root worker gives each command task its own `/tmp`, so a
//! task reaches nothing of the host's.
//! Every process the cluster starts, and every process those start (command tasks, to which
//! the workers pass it on with `--pass-env`), carries a marker in its environment, so dropping
//! the cluster kills them all: the head and the workers with kill + wait, and the task
//! processes that a SIGKILLed worker left behind by their marker. When a test panics, the processes' output is
//! printed to help whoever reads the failure.

#![allow(dead_code)] // each test file uses a different part of the support

pub mod proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use escher::types::{ClusterStatus, NodeId};
use escher::{Client, Credentials};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use proxy::Proxy;

/// How long any one wait in these tests may take before the test fails. Generous: the
/// machine may be small and busy with other tests.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often a condition is checked again.
const POLL: Duration = Duration::from_millis(50);

/// The environment variable that marks every process of one cluster.
const MARKER_VAR: &str = "E2E_CLUSTER_MARKER";

/// Where clusters make their directories, and whether their command tasks can reach it with
/// a private `/tmp` (the workers' default as root): `ESCHER_E2E_DIR` when set, else cargo's
/// `target/tmp` (`CARGO_TARGET_TMPDIR`) when every directory above it may be passed through
/// (the tasks of a root worker run as other users). Where neither is, the system's temporary
/// directory, and then `false`: the workers are started with `--no-private-tmp`, as their
/// tasks could not reach the cluster's files otherwise.
pub fn cluster_base() -> (PathBuf, bool) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = std::env::var_os("ESCHER_E2E_DIR") {
        return (PathBuf::from(dir), true);
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::create_dir_all(target);
    let passable = target.ancestors().all(|dir| {
        std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
    });
    if passable {
        (target.to_path_buf(), true)
    } else {
        (std::env::temp_dir(), false)
    }
}

/// Polls `probe` until it gives `Some`, at most `limit`; panics naming `what` if it never does.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let wait = async {
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(limit, wait).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Where cargo put the workspace's binaries: the directory above the test executable's
/// `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable is in a directory");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps/ has a parent")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// A client of the lone head that writes its URL to `address_file` (`--address-file`), with
/// the admin token of `access_file`, once the head answers.
pub async fn admin_client_of(address_file: &Path, access_file: &Path) -> Client {
    let url = eventually("the head to write its address", WAIT, || {
        let text = std::fs::read_to_string(address_file).ok();
        async move { text.filter(|t| !t.trim().is_empty()) }
    })
    .await;
    let url = match url.trim() {
        u if u.starts_with("http") => u.to_string(),
        u => format!("http://{u}"),
    };
    let access = escher::access::AccessFile::read(access_file).expect("the head's access file");
    eventually("the head to answer", WAIT, || {
        let (url, token) = (url.clone(), access.admin_token.clone());
        async move {
            let client = Client::connect(&url).await.ok()?.with_token(token);
            client.cluster_status().await.ok()?;
            Some(client)
        }
    })
    .await
}

/// The bytes of the regular files under `dir` (a store's directory), 0 for what cannot be read.
pub fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

/// The path of binary `name`, or a panic that says how to build it.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} does not exist: these end-to-end tests run the real binaries; build them with \
         `cargo build --workspace --bins`, or run `cargo test --workspace`, which builds them",
        path.display()
    );
    path
}

/// The path of example program `name` of a workspace crate (`target/<profile>/examples/`), or
/// a panic that says how to build it.
pub fn example(name: &str) -> PathBuf {
    let path = bin_dir().join("examples").join(name);
    assert!(
        path.is_file(),
        "{} does not exist: build it with `cargo build -p escher-worker --examples`, or run \
         `cargo test --workspace`, which builds it",
        path.display()
    );
    path
}

/// One child process and where its output goes.
#[derive(Debug)]
struct Proc {
    label: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("a pid fits in i32"))
    }

    /// SIGKILLs the process and reaps it. A process that already ended is only reaped.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A head replica of the cluster.
#[derive(Debug)]
struct HeadProc {
    /// Its replica id (index + 1).
    id: u64,
    /// The address it listens on; `None` until the first start of a lone head (port 0).
    listen: Option<String>,
    /// Its flags, less `--listen`.
    args: Vec<String>,
    /// Variables set in its environment (see [`ProcessCluster::set_head_env`]).
    env: Vec<(String, String)>,
    /// What it wrote before it last exited by SIGTERM.
    last_output: String,
    proc: Option<Proc>,
}

/// A worker process of the cluster.
#[derive(Debug)]
struct WorkerProc {
    name: String,
    node: NodeId,
    proc: Proc,
}

/// How to start a [`ProcessCluster`].
#[derive(Debug, Clone)]
pub struct ProcessClusterBuilder {
    workers: usize,
    resources: String,
    heartbeat_interval_ms: u64,
    heartbeat_timeout_ms: u64,
    heads: usize,
    durable: bool,
    proxied: bool,
    raft_tick_ms: u64,
    head_args: Vec<String>,
    /// With `durable`: each replica's data directory a tmpfs of this many bytes.
    small_disks: Option<u64>,
}

impl ProcessClusterBuilder {
    /// `n` workers named `w1` .. `wN`, started with the cluster.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// The `--resources` of the workers started with the cluster.
    pub fn resources(mut self, resources: &str) -> Self {
        self.resources = resources.to_string();
        self
    }

    /// The head's heartbeat timeout (600 ms unless told otherwise).
    pub fn heartbeat_timeout_ms(mut self, ms: u64) -> Self {
        self.heartbeat_timeout_ms = ms;
        self
    }

    /// `n` head replicas in one raft group (default 1: a lone head).
    pub fn heads(mut self, n: usize) -> Self {
        self.heads = n;
        self
    }

    /// Heads keep their raft logs on disk (`--data-dir`), in the cluster's directory.
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// With [`ProcessClusterBuilder::durable`]: each replica's data directory is a tmpfs of
    /// `bytes` the cluster mounts (and unmounts when dropped), so that a test can fill one (see
    /// [`ProcessCluster::head_data_dir`]). Needs root, as CI runs.
    pub fn small_disks(mut self, bytes: u64) -> Self {
        self.small_disks = Some(bytes);
        self
    }

    /// More `escher-head` arguments, given to every replica.
    pub fn head_args(mut self, args: &[&str]) -> Self {
        self.head_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Replicas reach one another through proxies the test controls (see
    /// [`ProcessCluster::isolate`]).
    pub fn proxied(mut self) -> Self {
        self.proxied = true;
        self
    }

    /// Starts the heads, then the workers, and waits until every worker is a live node.
    pub async fn start(self) -> ProcessCluster {
        let (base, private_tmp) = cluster_base();
        let dir = tempfile::Builder::new()
            .prefix("escher-e2e-")
            .tempdir_in(&base)
            .expect("a temporary directory");
        let marker = format!("{}:{}", std::process::id(), dir.path().display());
        let mut cluster = ProcessCluster {
            head_bin: binary("escher-head"),
            worker_bin: binary("escher-worker"),
            dir,
            marker,
            settings: self.clone(),
            heads: Vec::new(),
            proxies: BTreeMap::new(),
            head_url: String::new(),
            workers: Vec::new(),
            worker_proxy: None,
            private_tmp,
            spawned: 0,
            mounts: Vec::new(),
            worker_extra: WorkerExtra::default(),
        };
        cluster.plan_heads().await;
        for i in 0..cluster.heads.len() {
            cluster.start_head_at(i).await;
        }
        cluster.head_url = cluster
            .heads
            .iter()
            .map(|h| format!("http://{}", h.listen.as_deref().expect("listening")))
            .collect::<Vec<_>>()
            .join(",");
        if cluster.heads.len() > 1 {
            cluster.wait_leader().await;
        }
        for i in 1..=self.workers {
            cluster
                .start_worker(&format!("w{i}"), &self.resources)
                .await;
        }
        cluster
    }
}

/// A head process and worker processes on loopback, all stopped when dropped.
#[derive(Debug)]
pub struct ProcessCluster {
    head_bin: PathBuf,
    worker_bin: PathBuf,
    dir: tempfile::TempDir,
    marker: String,
    settings: ProcessClusterBuilder,
    heads: Vec<HeadProc>,
    /// With `proxied`: the proxy replica `from` reaches replica `to` through, by (from, to).
    proxies: BTreeMap<(u64, u64), Proxy>,
    /// Every replica's URL, comma-separated.
    head_url: String,
    workers: Vec<WorkerProc>,
    /// The proxy workers started with [`ProcessCluster::start_worker_behind_proxy`] reach the
    /// head through.
    worker_proxy: Option<Proxy>,
    /// Whether the workers may give their tasks a private `/tmp` (see [`cluster_base`]).
    private_tmp: bool,
    /// Processes started so far, to give each its own output files.
    spawned: u32,
    /// The tmpfs data directories of [`ProcessClusterBuilder::small_disks`], unmounted on drop.
    mounts: Vec<PathBuf>,
    /// What the next workers get besides the usual: environment, arguments, and a user to run
    /// as (see [`ProcessCluster::next_workers`]).
    worker_extra: WorkerExtra,
}

/// Environment, arguments and a user for the workers started from now on.
#[derive(Debug, Clone, Default)]
pub struct WorkerExtra {
    /// Variables set in the worker's environment.
    pub env: Vec<(String, String)>,
    /// More `escher-worker` arguments.
    pub args: Vec<String>,
    /// The uid (also gid) to run the worker as; its state and log directories are given to it.
    pub uid: Option<u32>,
    /// Another `escher-worker` binary to run instead of the one built (a copy a test removes).
    pub binary: Option<PathBuf>,
}

impl ProcessCluster {
    /// Settings: one worker with `cpu=2,memory=512`, heartbeats every 100 ms, a node lost after
    /// 1.2 s of silence (a worker's lease: 600 ms).
    pub fn builder() -> ProcessClusterBuilder {
        ProcessClusterBuilder {
            workers: 1,
            resources: "cpu=2,memory=512".to_string(),
            heartbeat_interval_ms: 100,
            heartbeat_timeout_ms: 1_200,
            heads: 1,
            durable: false,
            proxied: false,
            raft_tick_ms: 50,
            head_args: Vec::new(),
            small_disks: None,
        }
    }

    /// The cluster's temporary directory, which tasks may write to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The head's URL (every replica's, comma-separated).
    pub fn head_url(&self) -> &str {
        &self.head_url
    }

    /// Replica `index`'s own URL (index 0 is replica 1).
    pub fn head_url_of(&self, index: usize) -> String {
        format!(
            "http://{}",
            self.heads[index].listen.as_deref().expect("listening")
        )
    }

    /// Decides every replica's flags: ports, peers (through proxies if asked), data dirs.
    async fn plan_heads(&mut self) {
        let n = self.settings.heads.max(1);
        let mut common = vec![
            "--heartbeat-interval-ms".to_string(),
            self.settings.heartbeat_interval_ms.to_string(),
            "--heartbeat-timeout-ms".to_string(),
            self.settings.heartbeat_timeout_ms.to_string(),
            "--raft-tick-ms".to_string(),
            self.settings.raft_tick_ms.to_string(),
        ];
        common.extend(self.settings.head_args.iter().cloned());
        if n == 1 && !self.settings.proxied {
            if self.settings.durable {
                common.push("--data-dir".into());
                common.push(self.dir().join("head-1.data").display().to_string());
            }
            self.heads.push(HeadProc {
                id: 1,
                listen: None,
                args: common,
                env: Vec::new(),
                last_output: String::new(),
                proc: None,
            });
            return;
        }
        // Ports chosen now, so that every replica can be told every other's address.
        let mut listen = Vec::with_capacity(n);
        for _ in 0..n {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listen.push(probe.local_addr().expect("its address").to_string());
        }
        for i in 1..=n as u64 {
            for j in 1..=n as u64 {
                if self.settings.proxied && i != j {
                    let target = listen[j as usize - 1].parse().expect("an address");
                    self.proxies.insert((i, j), Proxy::start(target).await);
                }
            }
        }
        for (index, address) in listen.iter().enumerate() {
            let id = index as u64 + 1;
            let peers: Vec<String> = (1..=n as u64)
                .map(|j| match self.proxies.get(&(id, j)) {
                    Some(proxy) => format!("{j}={}", proxy.addr()),
                    None => format!("{j}={}", listen[j as usize - 1]),
                })
                .collect();
            let mut args = common.clone();
            args.extend([
                "--id".to_string(),
                id.to_string(),
                "--peers".to_string(),
                peers.join(","),
                "--group".to_string(),
                "e2e".to_string(),
            ]);
            if self.settings.durable {
                let data = self.dir().join(format!("head-{id}.data"));
                if let Some(bytes) = self.settings.small_disks {
                    std::fs::create_dir_all(&data).expect("a data directory");
                    let status = Command::new("mount")
                        .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                        .arg(&data)
                        .status()
                        .expect("mount (small disks need root)");
                    assert!(status.success(), "mount -t tmpfs {}", data.display());
                    self.mounts.push(data.clone());
                }
                args.push("--data-dir".into());
                args.push(data.display().to_string());
            }
            self.heads.push(HeadProc {
                id,
                listen: Some(address.clone()),
                args,
                env: Vec::new(),
                last_output: String::new(),
                proc: None,
            });
        }
    }

    /// The index of the replica that leads, by the account of the replicas that answer.
    pub async fn leader(&self) -> Option<usize> {
        let client = Client::connect_lazy(&self.head_url)
            .ok()?
            .with_credentials(self.credentials())
            .with_failover_timeout(Duration::from_millis(500));
        let heads = client.heads().await.ok()?;
        let leader = heads.leader()?;
        let index = self.heads.iter().position(|h| h.id == leader.id)?;
        self.heads[index].proc.is_some().then_some(index)
    }

    /// Waits until a replica leads; returns its index.
    pub async fn wait_leader(&self) -> usize {
        let what = "a head replica to lead";
        eventually(what, WAIT, || self.leader()).await
    }

    /// Cuts replica `index` off from the other replicas (both ways), or heals it.
    pub fn isolate(&self, index: usize, cut: bool) {
        let id = self.heads[index].id;
        for ((from, to), proxy) in &self.proxies {
            if *from == id || *to == id {
                proxy.block(cut);
            }
        }
    }

    /// Sends SIGTERM to replica `index` and waits until it has exited by itself.
    pub async fn terminate_head_at(&mut self, index: usize) -> ExitStatus {
        let head = self.heads[index].proc.as_mut().expect("the replica runs");
        kill(head.pid(), Signal::SIGTERM).expect("SIGTERM to a head");
        let status = eventually("the head to exit after SIGTERM", WAIT, || {
            let exited = head.child.try_wait().expect("try_wait on a head");
            async move { exited }
        })
        .await;
        let proc = self.heads[index].proc.take().expect("the replica ran");
        self.heads[index].last_output = [&proc.stdout, &proc.stderr]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        status
    }

    /// What replica `index` wrote (stdout and stderr) before it last exited through
    /// [`ProcessCluster::terminate_head_at`].
    pub fn exited_head_output(&self, index: usize) -> &str {
        &self.heads[index].last_output
    }

    /// Whether the worker process named `name` is still running.
    pub fn worker_running(&mut self, name: &str) -> bool {
        matches!(self.worker_mut(name).proc.child.try_wait(), Ok(None))
    }

    /// SIGKILLs replica `index` and reaps it.
    pub fn kill_head_at(&mut self, index: usize) {
        if let Some(mut p) = self.heads[index].proc.take() {
            p.kill();
        }
    }

    /// Freezes (SIGSTOP, `true`) or thaws (SIGCONT) replica `index`.
    pub fn freeze_head_at(&mut self, index: usize, frozen: bool) {
        let head = self.heads[index].proc.as_ref().expect("the replica runs");
        let signal = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(head.pid(), signal).expect("SIGSTOP/SIGCONT to a head");
    }

    /// Starts replica `index` again with the same flags (port, peers, data directory).
    pub async fn restart_head_at(&mut self, index: usize) {
        assert!(
            self.heads[index].proc.is_none(),
            "kill the replica before restarting it"
        );
        self.start_head_at(index).await;
    }

    /// Starts replica `index` (stopped) again from the backup `file` (`escher-head --restore`)
    /// on its address, in a new, empty data directory (`head-N.restored`, kept from now on).
    pub async fn restore_head_at(&mut self, index: usize, file: &Path) {
        assert!(
            self.heads[index].proc.is_none(),
            "stop the replica before restoring it"
        );
        let id = self.heads[index].id;
        let fresh = self.dir().join(format!("head-{id}.restored"));
        let saved = self.restoring(index, &fresh, file);
        self.start_head_at(index).await;
        // The new data directory is kept from now on; `--restore` is not.
        self.heads[index].args.truncate(saved.len());
    }

    /// Gives replica `index`'s next start the data directory `fresh` and `--restore file`;
    /// returns its flags as they were.
    fn restoring(&mut self, index: usize, fresh: &Path, file: &Path) -> Vec<String> {
        let saved = self.heads[index].args.clone();
        let args = &mut self.heads[index].args;
        let at = args
            .iter()
            .position(|a| a == "--data-dir")
            .expect("a durable replica");
        args[at + 1] = fresh.display().to_string();
        args.extend(["--restore".to_string(), file.display().to_string()]);
        saved
    }

    /// Starts replica `index` (stopped) from the backup `file` as [`Self::restore_head_at`]
    /// does, expecting it to refuse and exit; returns its exit status and what it printed. Its
    /// flags are then as before (its own data directory), and the fresh one it was given is
    /// returned too, to check that nothing was written there.
    pub async fn restore_head_expecting_exit(
        &mut self,
        index: usize,
        file: &Path,
    ) -> (ExitStatus, String, PathBuf) {
        let id = self.heads[index].id;
        let fresh = self.dir().join(format!("head-{id}.refused"));
        let saved = self.restoring(index, &fresh, file);
        let (status, output) = self.start_head_expecting_exit(index).await;
        self.heads[index].args = saved;
        (status, output, fresh)
    }

    /// Sets the environment replica `index` gets from its next start on.
    pub fn set_head_env(&mut self, index: usize, env: &[(&str, &str)]) {
        self.heads[index].env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Starts replica `index` (stopped) again with its flags and environment, expecting it to
    /// exit by itself; returns its exit status and everything it printed.
    pub async fn start_head_expecting_exit(&mut self, index: usize) -> (ExitStatus, String) {
        assert!(
            self.heads[index].proc.is_none(),
            "stop the replica before starting it again"
        );
        let id = self.heads[index].id;
        let listen = self.heads[index]
            .listen
            .clone()
            .expect("a replica that ran");
        let mut args = vec!["--listen".to_string(), listen];
        args.extend(self.heads[index].args.iter().cloned());
        let (head_bin, env) = (self.head_bin.clone(), self.heads[index].env.clone());
        let mut proc = self.spawn_as(&format!("head{id}"), &head_bin, &args, &env, None);
        let status = eventually("the replica to exit by itself", WAIT, || {
            let exited = proc.child.try_wait().expect("try_wait on a head");
            async move { exited }
        })
        .await;
        let text = [&proc.stdout, &proc.stderr]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        (status, text)
    }

    /// Replica `index`'s data directory (with [`ProcessClusterBuilder::durable`]).
    pub fn head_data_dir(&self, index: usize) -> PathBuf {
        self.dir()
            .join(format!("head-{}.data", self.heads[index].id))
    }

    /// A new client of the head.
    pub async fn client(&self) -> Client {
        Client::connect(&self.head_url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the head at {}: {e}", self.head_url))
            .with_credentials(self.credentials())
    }

    /// The access file the cluster's heads wrote (they share `ESCHER_HOME`).
    pub fn access_file(&self) -> PathBuf {
        self.dir()
            .join("escher-home")
            .join(escher::access::FILE_NAME)
    }

    /// The admin credentials of the access file (once a head has started).
    pub fn credentials(&self) -> Credentials {
        Credentials::from_access_file(&self.access_file())
            .unwrap_or_else(|e| panic!("the heads' access file: {e}"))
    }

    /// `name` in a directory every task may write, whatever user it runs as (the workers run
    /// each namespace's tasks as a user of their own when the tests run as root, as in CI):
    /// like /tmp, sticky and open to all.
    pub fn shared_path(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let shared = self.dir().join("shared");
        std::fs::create_dir_all(&shared).expect("the shared directory");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        std::fs::set_permissions(self.dir(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        shared.join(name)
    }

    /// What the worker named `name` (its latest process) has written so far (stdout and
    /// stderr).
    pub fn worker_output(&self, name: &str) -> String {
        let Some(worker) = self.workers.iter().rev().find(|w| w.name == name) else {
            return String::new();
        };
        [&worker.proc.stdout, &worker.proc.stderr]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What the running process of replica `index` has written so far (stdout and stderr).
    pub fn head_output(&self, index: usize) -> String {
        let Some(proc) = &self.heads[index].proc else {
            return String::new();
        };
        [&proc.stdout, &proc.stderr]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts the workers started from now on with `extra`.
    pub fn next_workers(&mut self, extra: WorkerExtra) {
        self.worker_extra = extra;
    }

    /// The state directory of the worker named `name` (its node id and secret).
    pub fn state_dir(&self, name: &str) -> PathBuf {
        self.dir().join(format!("{name}.state"))
    }

    /// Forgets the identity of the worker named `name` (not running): started again, it
    /// joins as a new node.
    pub fn forget_worker(&self, name: &str) {
        let _ = std::fs::remove_dir_all(self.state_dir(name));
    }

    /// The node id of the running worker process named `name`.
    pub fn node(&self, name: &str) -> NodeId {
        self.worker(name).node
    }

    fn worker(&self, name: &str) -> &WorkerProc {
        self.workers
            .iter()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("no worker process named {name}"))
    }

    fn worker_mut(&mut self, name: &str) -> &mut WorkerProc {
        self.workers
            .iter_mut()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("no worker process named {name}"))
    }

    /// Spawns one of the binaries with its output in files, marked as this cluster's.
    fn spawn(&mut self, label: &str, bin: &Path, args: &[String]) -> Proc {
        self.spawn_as(label, bin, args, &[], None)
    }

    fn spawn_as(
        &mut self,
        label: &str,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
        uid: Option<u32>,
    ) -> Proc {
        self.spawned += 1;
        let stdout = self.dir().join(format!("{label}.{}.stdout", self.spawned));
        let stderr = self.dir().join(format!("{label}.{}.stderr", self.spawned));
        let file = |p: &Path| std::fs::File::create(p).expect("an output file");
        let mut command = Command::new(bin);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file(&stdout))
            .stderr(file(&stderr))
            .env(MARKER_VAR, &self.marker)
            .env("ESCHER_HOME", self.dir().join("escher-home"))
            .env("RUST_LOG", "info,escher_head=debug,escher_worker=debug")
            .env("NO_COLOR", "1");
        for var in [
            "ESCHER_HEAD",
            "ESCHER_TASK_ID",
            "ESCHER_NAMESPACE",
            "ESCHER_HEAD_LISTEN",
            "ESCHER_HEAD_ADDRESS_FILE",
            "ESCHER_HEARTBEAT_INTERVAL_MS",
            "ESCHER_HEARTBEAT_TIMEOUT_MS",
            "ESCHER_WORKER_STATE_DIR",
            "ESCHER_HEAD_ID",
            "ESCHER_HEAD_PEERS",
            "ESCHER_HEAD_GROUP",
            "ESCHER_RAFT_TICK_MS",
        ] {
            command.env_remove(var);
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(uid);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Proc {
            label: label.to_string(),
            child,
            stdout,
            stderr,
        }
    }

    /// Starts replica `index` (a lone head: on a free port the first time, on the same port
    /// later) and waits until it has written its address file. A replica started on a port the
    /// kernel is still releasing is started again, a bounded number of times.
    async fn start_head_at(&mut self, index: usize) {
        let id = self.heads[index].id;
        let address_file = self.dir().join(format!("head-{id}.url"));
        for _ in 0..50 {
            let _ = std::fs::remove_file(&address_file);
            let listen = self.heads[index]
                .listen
                .clone()
                .unwrap_or_else(|| "127.0.0.1:0".to_string());
            let mut args = vec![
                "--listen".to_string(),
                listen,
                "--address-file".to_string(),
                address_file.display().to_string(),
            ];
            args.extend(self.heads[index].args.iter().cloned());
            let head_bin = self.head_bin.clone();
            let env = self.heads[index].env.clone();
            let proc = self.spawn_as(&format!("head{id}"), &head_bin, &args, &env, None);
            self.heads[index].proc = Some(proc);
            let file = address_file.clone();
            let head = self.heads[index].proc.as_mut().expect("just started");
            let started = eventually("the head to write its address file", WAIT, || {
                let url = std::fs::read_to_string(&file).ok();
                let exited = head.child.try_wait().ok().flatten();
                async move {
                    match (url, exited) {
                        (Some(url), _) if !url.is_empty() => Some(Ok(url)),
                        (_, Some(status)) => Some(Err(status)),
                        _ => None,
                    }
                }
            })
            .await;
            match started {
                Ok(url) => {
                    let address = url.trim().trim_start_matches("http://").to_string();
                    self.heads[index].listen = Some(address);
                    if self.heads.len() == 1 {
                        self.head_url = url.trim().to_string();
                    }
                    return;
                }
                Err(status) if self.heads[index].listen.is_some() => {
                    eprintln!("head {id} exited with {status} at start; trying again");
                    self.heads[index].proc = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("the head exited with {status} before listening"),
            }
        }
        panic!("head {id} could not be started");
    }

    /// Starts a worker process named `name` with `--resources resources` and waits until it is
    /// a live node the head did not know before, with its stream attached (a registered node
    /// shows its resources, takes tasks and holds objects only then); returns that node's id.
    pub async fn start_worker(&mut self, name: &str, resources: &str) -> NodeId {
        let known: BTreeSet<NodeId> = self.status().await.nodes.iter().map(|n| n.id).collect();
        self.spawn_worker(name, resources);
        let node = self.wait_registered(name, &known).await;
        let index = self.workers.len() - 1;
        self.workers[index].node = node;
        self.wait_status(&format!("worker {name}'s stream to attach"), |s| {
            s.nodes
                .iter()
                .any(|n| n.id == node && n.alive && !n.resources.is_empty())
                .then_some(())
        })
        .await;
        node
    }

    /// Starts a worker process named `name` that has been a node before (its state directory
    /// is kept) and waits until it has attached to the head again; returns its node id.
    pub async fn start_worker_known(&mut self, name: &str, resources: &str) -> NodeId {
        self.spawn_worker(name, resources);
        let stdout = self
            .workers
            .last()
            .expect("just spawned")
            .proc
            .stdout
            .clone();
        let what = format!("worker {name} to attach to the head again");
        eventually(&what, WAIT, || {
            let text = std::fs::read_to_string(&stdout).unwrap_or_default();
            async move { text.contains("attached to the head").then_some(()) }
        })
        .await;
        let node = self
            .wait_status(&what, |s| {
                s.nodes
                    .iter()
                    .find(|n| n.alive && n.name == name)
                    .map(|n| n.id)
            })
            .await;
        let index = self.workers.len() - 1;
        self.workers[index].node = node;
        node
    }

    /// Starts a worker like [`Self::start_worker`] that reaches the (lone) head through a
    /// proxy the test controls ([`Self::cut_worker_links`]).
    pub async fn start_worker_behind_proxy(&mut self, name: &str, resources: &str) -> NodeId {
        let known: BTreeSet<NodeId> = self.status().await.nodes.iter().map(|n| n.id).collect();
        let target = self.heads[0]
            .listen
            .as_deref()
            .expect("listening")
            .parse()
            .expect("a socket address");
        let proxy = Proxy::start(target).await;
        let url = format!("http://{}", proxy.addr());
        self.worker_proxy = Some(proxy);
        self.spawn_worker_to(name, resources, &url);
        let node = self.wait_registered(name, &known).await;
        let index = self.workers.len() - 1;
        self.workers[index].node = node;
        node
    }

    /// Cuts the streams of the workers behind the proxy and refuses their reconnections
    /// (`true`), or lets them through again.
    pub fn cut_worker_links(&self, cut: bool) {
        self.worker_proxy
            .as_ref()
            .expect("a worker behind a proxy")
            .block(cut);
    }

    fn spawn_worker(&mut self, name: &str, resources: &str) {
        let url = self.head_url.clone();
        self.spawn_worker_to(name, resources, &url);
    }

    fn spawn_worker_to(&mut self, name: &str, resources: &str, head_url: &str) {
        let log_dir = self.dir().join(format!("{name}.tasks"));
        let state_dir = self.state_dir(name);
        let mut args = vec![
            "--state-dir".to_string(),
            state_dir.display().to_string(),
            "--head".to_string(),
            head_url.to_string(),
            "--name".to_string(),
            name.to_string(),
            "--resources".to_string(),
            resources.to_string(),
            "--log-dir".to_string(),
            log_dir.display().to_string(),
            "--grace".to_string(),
            "1".to_string(),
            // Tasks start with almost nothing of their worker's environment: the marker that
            // lets the cluster find them is passed on purpose.
            "--pass-env".to_string(),
            MARKER_VAR.to_string(),
        ];
        if !self.private_tmp {
            args.push("--no-private-tmp".to_string());
        }
        let extra = self.worker_extra.clone();
        args.extend(extra.args.iter().cloned());
        if let Some(uid) = extra.uid {
            for dir in [&state_dir, &log_dir] {
                std::fs::create_dir_all(dir).expect("a worker directory");
                std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
            }
            // The cluster's directory is 0700: let the worker reach its own.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(self.dir(), std::fs::Permissions::from_mode(0o711))
                .expect("chmod");
        }
        let worker_bin = extra
            .binary
            .clone()
            .unwrap_or_else(|| self.worker_bin.clone());
        let proc = self.spawn_as(name, &worker_bin, &args, &extra.env, extra.uid);
        // Recorded before the wait, so a failed wait still kills it and shows its output.
        self.workers.push(WorkerProc {
            name: name.to_string(),
            node: NodeId(0),
            proc,
        });
    }

    /// Waits until a live node named `name` whose id is not in `known` appears, and records it
    /// as the node of the worker process of that name.
    pub async fn wait_registered(&mut self, name: &str, known: &BTreeSet<NodeId>) -> NodeId {
        let what = format!("worker {name} to register with the head");
        let node = self
            .wait_status(&what, |s| {
                s.nodes
                    .iter()
                    .find(|n| n.alive && n.name == name && !known.contains(&n.id))
                    .map(|n| n.id)
            })
            .await;
        if let Some(w) = self.workers.iter_mut().rev().find(|w| w.name == name) {
            w.node = node;
        }
        node
    }

    /// The head's view of the cluster now.
    pub async fn status(&self) -> ClusterStatus {
        let client = self.client().await;
        client
            .cluster_status()
            .await
            .unwrap_or_else(|e| panic!("cluster_status failed: {e}"))
    }

    /// Polls the cluster status until `probe` gives `Some`, at most [`WAIT`].
    pub async fn wait_status<T>(
        &self,
        what: &str,
        mut probe: impl FnMut(&ClusterStatus) -> Option<T>,
    ) -> T {
        let client = self.client().await;
        let mut last = None;
        let wait = async {
            loop {
                // A head that is restarting answers with errors for a moment; keep asking.
                if let Ok(status) = client.cluster_status().await {
                    if let Some(value) = probe(&status) {
                        return value;
                    }
                    last = Some(status);
                }
                tokio::time::sleep(POLL).await;
            }
        };
        match tokio::time::timeout(WAIT, wait).await {
            Ok(value) => value,
            Err(_) => panic!("timed out after {WAIT:?} waiting for {what}; last status: {last:#?}"),
        }
    }

    /// SIGKILLs the worker process named `name`, as if its machine died, and reaps it.
    pub fn kill_worker(&mut self, name: &str) {
        self.worker_mut(name).proc.kill();
        self.workers.retain(|w| w.name != name);
    }

    /// What `pkill -9 escher-worker` does to the worker named `name`: SIGKILLs its process and
    /// every descendant whose process name is `escher-worker` too (the worker inside its PID
    /// namespace; its fence supervisor, if it still went by that name); returns how many
    /// processes it killed.
    pub fn kill_worker_by_name(&mut self, name: &str) -> usize {
        self.signal_worker_tree(name, Signal::SIGKILL, |comm| comm == "escher-worker")
            .len()
    }

    /// SIGKILLs every escher process of the worker named `name` at once: the process started,
    /// and in a PID namespace of its own the namespace's init and the worker in it, and the
    /// fence supervisor. Returns their names.
    pub fn kill_every_escher_process_of(&mut self, name: &str) -> Vec<String> {
        self.signal_worker_tree(name, Signal::SIGKILL, |comm| comm.starts_with("escher"))
    }

    /// Sends `signal` to the processes of the worker named `name` (the one started and its
    /// descendants) whose name `pick` accepts; returns their names. A SIGKILL reaps the one
    /// started.
    fn signal_worker_tree(
        &mut self,
        name: &str,
        signal: Signal,
        pick: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let root = self.worker(name).proc.pid().as_raw();
        let mut hit = Vec::new();
        for (pid, comm) in process_tree(root) {
            // A process gone since the listing counts: it died as another did and was reaped
            // at once (a namespace's init takes its processes with it; a worker reaps its fence
            // supervisor as soon as it dies, to start another).
            if !pick(&comm) {
                continue;
            }
            let sent = kill(Pid::from_raw(pid), signal);
            if matches!(sent, Ok(()) | Err(nix::errno::Errno::ESRCH)) {
                hit.push(comm);
            }
        }
        if signal == Signal::SIGKILL {
            let _ = self.worker_mut(name).proc.child.wait();
        }
        hit
    }

    /// The pids of the fence supervisors (`escher-fence`) of the worker named `name`.
    pub fn fence_pids(&self, name: &str) -> Vec<i32> {
        let root = self.worker(name).proc.pid().as_raw();
        process_tree(root)
            .into_iter()
            .filter(|(_, comm)| comm == "escher-fence")
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Freezes (SIGSTOP, `true`) or thaws (SIGCONT) the worker named `name`: its process, and
    /// in a PID namespace of its own the worker inside (the process started only waits).
    pub fn freeze_worker(&mut self, name: &str, frozen: bool) {
        let signal = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        // The test worker with Rust actors (`procs::example("test_actor_worker")`) too: a
        // command name is cut to 15 bytes. Its fence supervisor is `escher-fence`.
        let hit = self.signal_worker_tree(name, signal, |comm| {
            comm == "escher-worker" || comm == "test_actor_work"
        });
        assert!(!hit.is_empty(), "no worker process named {name} to signal");
    }

    /// Sends SIGTERM to the worker process named `name`: it drains and exits by itself.
    pub fn terminate_worker(&mut self, name: &str) {
        let pid = self.worker(name).proc.pid();
        kill(pid, Signal::SIGTERM).expect("SIGTERM to a worker");
    }

    /// Waits until the worker process named `name` has exited by itself; returns its status.
    /// Starts a worker process that is expected not to get as far as registering; returns
    /// how it exited and what it wrote.
    pub async fn start_worker_expecting_exit(
        &mut self,
        name: &str,
        resources: &str,
    ) -> (ExitStatus, String) {
        let url = self.head_url.clone();
        self.spawn_worker_to(name, resources, &url);
        let (stdout, stderr) = {
            let proc = &self.worker(name).proc;
            (proc.stdout.clone(), proc.stderr.clone())
        };
        let status = self.wait_worker_exit(name).await;
        let text = [stdout, stderr]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        (status, text)
    }

    pub async fn wait_worker_exit(&mut self, name: &str) -> ExitStatus {
        let what = format!("worker process {name} to exit");
        let worker = self.worker_mut(name);
        let status = eventually(&what, WAIT, || {
            let exited = worker.proc.child.try_wait().expect("try_wait on a worker");
            async move { exited }
        })
        .await;
        self.workers.retain(|w| w.name != name);
        status
    }

    /// SIGKILLs the (first) head process and reaps it.
    pub fn kill_head(&mut self) {
        self.kill_head_at(0);
    }

    /// Starts the (first) head again on the address it listened on (the workers know no other),
    /// after [`kill_head`](Self::kill_head).
    pub async fn restart_head(&mut self) {
        self.restart_head_at(0).await;
    }

    /// Kills every process of this cluster still running: the head and the workers, then any
    /// task process that a killed worker left behind.
    fn kill_all(&mut self) {
        for w in &mut self.workers {
            w.proc.kill();
        }
        for head in &mut self.heads {
            if let Some(p) = &mut head.proc {
                p.kill();
            }
        }
        kill_marked(&self.marker);
    }

    /// The output of every process started so far, for a failure message.
    fn outputs(&self) -> String {
        let mut text = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| {
            p.extension()
                .is_some_and(|e| e == "stdout" || e == "stderr")
        });
        files.sort();
        for path in files {
            let body = std::fs::read_to_string(&path).unwrap_or_default();
            if body.is_empty() {
                continue;
            }
            let tail: String = {
                let skip = body.len().saturating_sub(16 * 1024);
                let start = (skip..body.len())
                    .find(|i| body.is_char_boundary(*i))
                    .unwrap_or(body.len());
                body[start..].to_string()
            };
            let _ = writeln!(text, "===== {} =====\n{tail}", path.display());
        }
        text
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        self.kill_all();
        for mount in &self.mounts {
            let _ = Command::new("umount").arg(mount).status();
        }
        if std::thread::panicking() {
            eprintln!(
                "the test failed; the cluster's processes wrote:\n{}",
                self.outputs()
            );
            let labels: Vec<&str> = self.workers.iter().map(|w| w.proc.label.as_str()).collect();
            eprintln!("workers still recorded: {labels:?}");
        }
    }
}

/// `root` and every process descended from it, with their names (`comm`), by pid.
pub fn process_tree(root: i32) -> Vec<(i32, String)> {
    let mut parent_of = BTreeMap::new();
    let mut name_of = BTreeMap::new();
    for (pid, dir) in processes() {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // PID (COMM) STATE PPID ...; COMM may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            parent_of.insert(pid, ppid);
            name_of.insert(pid, stat[open + 1..close].to_string());
        }
    }
    let under = |mut pid: i32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parent_of.get(&pid) {
                Some(&ppid) if ppid > 0 && ppid != pid => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    name_of.into_iter().filter(|(pid, _)| under(*pid)).collect()
}

/// Every process of this machine (of this PID namespace): its pid and its `/proc` directory.
pub fn processes() -> impl Iterator<Item = (i32, PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            Some((pid, entry.path()))
        })
}

/// What a task's shell writes to say which process it is: its pid and its PID namespace (a
/// worker run as root gives its tasks a PID namespace of their own, so `$$` alone does not name
/// a process of the host). [`host_pid`] reads it back.
pub const RECORD_PID: &str = r#"echo $$ $(readlink /proc/self/ns/pid)"#;

/// The host's pid of the live process a task recorded with [`RECORD_PID`] (`PID pid:[INODE]`);
/// `None` if none lives (gone, or a zombie).
pub fn host_pid(recorded: &str) -> Option<i32> {
    let (pid, ns) = recorded.trim().split_once(' ')?;
    let pid: i32 = pid.parse().ok()?;
    processes()
        .find(|(_, dir)| {
            let same_ns =
                std::fs::read_link(dir.join("ns/pid")).is_ok_and(|link| link.to_str() == Some(ns));
            let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|ids| ids.split_whitespace().last()?.parse::<i32>().ok());
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains("zombie"));
            same_ns && inner == Some(pid) && !zombie
        })
        .map(|(host, _)| host)
}

/// SIGKILLs every process whose environment carries this cluster's marker (task processes
/// whose worker was killed and that no one else will stop).
fn kill_marked(marker: &str) {
    let needle = format!("{MARKER_VAR}={marker}");
    let me = std::process::id();
    for (pid, dir) in processes() {
        if pid as u32 == me {
            continue;
        }
        // Other users' processes are unreadable and skipped.
        let Ok(environ) = std::fs::read(dir.join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
