//! [`NetCluster`]: three durable head replicas and several workers, each a real process in a
//! host (network namespace) of its own, started with `ip netns exec`, and the faults a
//! process and a disk have: kill -9 and restart, SIGSTOP and SIGCONT, killing every process
//! of a worker's binary on its host (`pkill -9 escher-worker`), and a replica whose data
//! directory is a small tmpfs that can be filled.
//!
//! Heads listen on `HOST:7600` of their host and know each other by those addresses; workers
//! get every replica's URL. They share one `ESCHER_HOME` (namespaces share the file system),
//! so the workers join with the access file the heads wrote, as on one machine. Every process
//! carries a marker in its environment, passed on to its command tasks, so that dropping the
//! cluster kills whatever it started, tasks a killed worker left behind included; then the
//! tmpfs is unmounted and the namespaces removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use escher::types::{ClusterStatus, NodeId};
use escher::{Client, Credentials};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::net::{Host, Network, sh};

/// The port every head listens on, in its own host.
const HEAD_PORT: u16 = 7600;

/// The variable that marks every process of one cluster.
const MARKER_VAR: &str = "NEMESIS_MARKER";

/// How long a start or a recovery may take before the harness gives up.
pub const START_WAIT: Duration = Duration::from_secs(60);

/// How to start a [`NetCluster`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// Head replicas.
    pub heads: usize,
    /// Workers, `w1` .. `wN`.
    pub workers: usize,
    /// Each worker's `--resources`.
    pub resources: String,
    /// The heads' `--heartbeat-interval-ms`.
    pub heartbeat_interval_ms: u64,
    /// The heads' `--heartbeat-timeout-ms`.
    pub heartbeat_timeout_ms: u64,
    /// The replica (index) whose data directory is a small tmpfs, for the full-disk nemesis.
    pub small_disk: Option<usize>,
}

/// One process the cluster runs in a host.
#[derive(Debug)]
struct Member {
    host: Host,
    /// `h1`.., `w1`..
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    /// Variables set in its environment.
    env: Vec<(String, String)>,
    child: Option<Child>,
}

/// The cluster; everything it started is stopped and removed when dropped.
#[derive(Debug)]
pub struct NetCluster {
    dir: tempfile::TempDir,
    marker: String,
    heads: Vec<Member>,
    workers: Vec<Member>,
    mounts: Vec<PathBuf>,
    spawned: u32,
    /// Dropped last: the namespaces go once no process of ours is left in them.
    pub net: Network,
}

impl NetCluster {
    /// Makes the hosts and starts the heads (waiting for a leader), then the workers (waiting
    /// until each is a live node).
    pub async fn start(settings: &Settings) -> anyhow::Result<NetCluster> {
        remove_stale_runs();
        let (base, private_tmp) = crate::procs::cluster_base();
        let dir = tempfile::Builder::new()
            .prefix("escher-nemesis-")
            .tempdir_in(base)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        let mut net = Network::new()?;
        let marker = format!("{}:{}", std::process::id(), dir.path().display());
        let head_bin = crate::procs::binary("escher-head");
        let worker_bin = crate::procs::binary("escher-worker");
        let mut heads_hosts = Vec::new();
        for i in 1..=settings.heads {
            heads_hosts.push(net.add_host(&format!("h{i}"), i as u8)?);
        }
        let peers: Vec<String> = heads_hosts
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{}={}:{HEAD_PORT}", i + 1, h.ip))
            .collect();
        let mut cluster = NetCluster {
            dir,
            marker,
            heads: Vec::new(),
            workers: Vec::new(),
            mounts: Vec::new(),
            spawned: 0,
            net,
        };
        // The slow-disk shim every replica is started with (idle until its file says a delay).
        let shim = cluster.dir().join("slowdisk.so");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nemesis/slowdisk.c");
        let cc = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&shim)
            .arg(&source)
            .arg("-ldl")
            .output()
            .context("cc, to build the slow-disk shim (tests/nemesis/slowdisk.c)")?;
        anyhow::ensure!(
            cc.status.success(),
            "cc could not build the slow-disk shim: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        for (i, host) in heads_hosts.into_iter().enumerate() {
            let id = i + 1;
            let data = cluster.dir().join(format!("head-{id}.data"));
            std::fs::create_dir_all(&data)?;
            if settings.small_disk == Some(i) {
                let data_s = data.display().to_string();
                sh(
                    "mount",
                    &["-t", "tmpfs", "-o", "size=48m", "nemesis-disk", &data_s],
                )
                .context("a tmpfs for the full-disk nemesis")?;
                cluster.mounts.push(data.clone());
            }
            let args = vec![
                "--listen".to_string(),
                format!("{}:{HEAD_PORT}", host.ip),
                "--address-file".to_string(),
                cluster
                    .dir()
                    .join(format!("head-{id}.url"))
                    .display()
                    .to_string(),
                "--heartbeat-interval-ms".to_string(),
                settings.heartbeat_interval_ms.to_string(),
                "--heartbeat-timeout-ms".to_string(),
                settings.heartbeat_timeout_ms.to_string(),
                "--raft-tick-ms".to_string(),
                "50".to_string(),
                "--id".to_string(),
                id.to_string(),
                "--peers".to_string(),
                peers.join(","),
                "--group".to_string(),
                "nemesis".to_string(),
                "--data-dir".to_string(),
                data.display().to_string(),
            ];
            let slow = cluster.dir().join(format!("head-{id}.slow-disk"));
            cluster.heads.push(Member {
                host,
                name: format!("h{id}"),
                bin: head_bin.clone(),
                args,
                env: vec![
                    ("LD_PRELOAD".to_string(), shim.display().to_string()),
                    (
                        "NEMESIS_SLOW_DISK_FILE".to_string(),
                        slow.display().to_string(),
                    ),
                ],
                child: None,
            });
        }
        for i in 0..cluster.heads.len() {
            cluster.spawn_head(i)?;
        }
        for i in 0..cluster.heads.len() {
            let file = cluster.dir().join(format!("head-{}.url", i + 1));
            cluster
                .wait(&format!("head {} to listen", i + 1), || file.exists())
                .await?;
        }
        cluster.wait_leader().await?;
        let urls = cluster.head_urls();
        for i in 1..=settings.workers {
            let name = format!("w{i}");
            let host = cluster.net.add_host(&name, 10 + i as u8)?;
            let state = cluster.dir().join(format!("{name}.state"));
            let logs = cluster.dir().join(format!("{name}.tasks"));
            let mut args = vec![
                "--state-dir".to_string(),
                state.display().to_string(),
                "--head".to_string(),
                urls.clone(),
                "--name".to_string(),
                name.clone(),
                "--resources".to_string(),
                settings.resources.clone(),
                "--log-dir".to_string(),
                logs.display().to_string(),
                "--grace".to_string(),
                "1".to_string(),
                "--pass-env".to_string(),
                MARKER_VAR.to_string(),
            ];
            if !private_tmp {
                args.push("--no-private-tmp".to_string());
            }
            cluster.workers.push(Member {
                host,
                name: name.clone(),
                bin: worker_bin.clone(),
                args,
                env: Vec::new(),
                child: None,
            });
            cluster.spawn_worker(i - 1)?;
            cluster.wait_worker_alive(&name).await?;
        }
        Ok(cluster)
    }

    /// The cluster's directory (logs, data, the shared files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every replica's URL, comma-separated.
    pub fn head_urls(&self) -> String {
        self.heads
            .iter()
            .map(|h| format!("https://{}:{HEAD_PORT}", h.host.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The admin credentials of the heads' access file.
    pub fn credentials(&self) -> anyhow::Result<Credentials> {
        let file = self
            .dir()
            .join("escher-home")
            .join(escher::access::FILE_NAME);
        Credentials::from_access_file(&file).context("the heads' access file")
    }

    /// A client of the group (every replica's URL).
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_lazy(self.head_urls())?.with_credentials(self.credentials()?))
    }

    /// The head replicas' hosts.
    pub fn head_hosts(&self) -> Vec<Host> {
        self.heads.iter().map(|m| m.host.clone()).collect()
    }

    /// The workers' hosts.
    pub fn worker_hosts(&self) -> Vec<Host> {
        self.workers.iter().map(|m| m.host.clone()).collect()
    }

    /// The index of the replica that leads, by the group's account, asked with a bound.
    pub async fn leader(&self) -> Option<usize> {
        let client = self
            .client()
            .ok()?
            .with_failover_timeout(Duration::from_secs(2));
        let heads = tokio::time::timeout(Duration::from_secs(3), client.heads())
            .await
            .ok()?
            .ok()?;
        let id = heads.leader()?.id;
        Some(id as usize - 1)
    }

    /// Waits until a replica leads; its index.
    pub async fn wait_leader(&self) -> anyhow::Result<usize> {
        let deadline = tokio::time::Instant::now() + START_WAIT;
        loop {
            if let Some(i) = self.leader().await {
                return Ok(i);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "no head replica led within {START_WAIT:?}\n{}",
                    self.outputs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits at most `limit` until the group is whole again: every replica answers with a
    /// role, and every one has applied at least what the group had committed when the wait
    /// began (so a replica that answers but no longer applies anything does not pass).
    /// Returns the replicas (indexes) that did not get there, with what was seen last; returns
    /// at once when a replica's process has exited (to be restarted).
    pub async fn wait_group_whole(&mut self, limit: Duration) -> Result<(), (Vec<usize>, String)> {
        let deadline = tokio::time::Instant::now() + limit;
        let client = self
            .client()
            .map_err(|e| (Vec::new(), e.to_string()))?
            .with_failover_timeout(Duration::from_secs(2));
        let mut target = None;
        let mut last = String::from("no answer from the group");
        let mut behind: Vec<usize> = (0..self.heads.len()).collect();
        loop {
            if let Ok(Ok(reply)) =
                tokio::time::timeout(Duration::from_secs(3), client.heads()).await
            {
                let commit = reply
                    .replicas
                    .iter()
                    .map(|r| r.commit_index)
                    .max()
                    .unwrap_or(0);
                let goal = *target.get_or_insert(commit);
                behind = reply
                    .replicas
                    .iter()
                    .filter(|r| !r.reachable || r.role.is_none() || r.applied_index < goal)
                    .map(|r| r.id as usize - 1)
                    .collect();
                last = reply
                    .replicas
                    .iter()
                    .map(|r| {
                        format!(
                            "h{}: {} applied {} {}",
                            r.id,
                            r.role.map_or("unreachable".to_string(), |x| x.to_string()),
                            r.applied_index,
                            r.error.as_deref().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                if behind.is_empty() {
                    return Ok(());
                }
            }
            let exited: Vec<usize> = (0..self.heads.len())
                .filter(|i| self.head_exited(*i).is_some())
                .collect();
            if !exited.is_empty() {
                return Err((exited, format!("{last}; exited")));
            }
            if tokio::time::Instant::now() > deadline {
                return Err((behind, last));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The head's view of the cluster, asked with a bound.
    pub async fn status(&self) -> anyhow::Result<ClusterStatus> {
        let client = self.client()?;
        Ok(tokio::time::timeout(Duration::from_secs(5), client.cluster_status()).await??)
    }

    /// The node id of the live worker named `name`.
    pub async fn node_of(&self, name: &str) -> anyhow::Result<NodeId> {
        let status = self.status().await?;
        status
            .nodes
            .iter()
            .find(|n| n.alive && n.name == name)
            .map(|n| n.id)
            .with_context(|| format!("no live node named {name}"))
    }

    /// The node id of the worker named `name`, live or not (the latest node of that name).
    pub async fn node_named(&self, name: &str) -> anyhow::Result<NodeId> {
        let status = self.status().await?;
        status
            .nodes
            .iter()
            .filter(|n| n.name == name)
            .map(|n| n.id)
            .max()
            .with_context(|| format!("no node named {name}"))
    }

    /// Waits until the worker named `name` is a live node.
    pub async fn wait_worker_alive(&self, name: &str) -> anyhow::Result<NodeId> {
        let deadline = tokio::time::Instant::now() + START_WAIT;
        loop {
            if let Ok(node) = self.node_of(name).await {
                return Ok(node);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "worker {name} was not a live node within {START_WAIT:?}\n{}",
                    self.outputs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait(&self, what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + START_WAIT;
        while !ready() {
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for {what}\n{}", self.outputs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn spawn(&mut self, member: Member) -> anyhow::Result<Member> {
        let mut member = member;
        self.spawned += 1;
        let out = |kind: &str| {
            std::fs::File::create(
                self.dir()
                    .join(format!("{}.{}.{kind}", member.name, self.spawned)),
            )
        };
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &member.host.ns])
            .arg(&member.bin)
            .args(&member.args)
            .stdin(Stdio::null())
            .stdout(out("stdout")?)
            .stderr(out("stderr")?)
            .env(MARKER_VAR, &self.marker)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        for (var, _) in std::env::vars() {
            if var.starts_with("ESCHER_") {
                command.env_remove(var);
            }
        }
        command.env("ESCHER_HOME", self.dir().join("escher-home"));
        command.envs(member.env.iter().map(|(k, v)| (k, v)));
        member.child = Some(
            command
                .spawn()
                .with_context(|| format!("cannot start {} in {}", member.name, member.host.ns))?,
        );
        Ok(member)
    }

    fn spawn_head(&mut self, index: usize) -> anyhow::Result<()> {
        let member = self.take_head(index);
        let member = self.spawn(member)?;
        self.heads[index] = member;
        Ok(())
    }

    fn spawn_worker(&mut self, index: usize) -> anyhow::Result<()> {
        let member = std::mem::replace(&mut self.workers[index], placeholder());
        let member = self.spawn(member)?;
        self.workers[index] = member;
        Ok(())
    }

    fn take_head(&mut self, index: usize) -> Member {
        std::mem::replace(&mut self.heads[index], placeholder())
    }

    /// SIGKILLs replica `index` and reaps it.
    pub fn kill_head(&mut self, index: usize) {
        if let Some(mut child) = self.heads[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts replica `index` again with its flags and data directory.
    pub async fn restart_head(&mut self, index: usize) -> anyhow::Result<()> {
        self.kill_head(index);
        // The port may still be held for a moment by the killed process's sockets.
        let url = self.dir().join(format!("head-{}.url", index + 1));
        let _ = std::fs::remove_file(&url);
        self.spawn_head(index)?;
        self.wait(&format!("replica {} to listen again", index + 1), || {
            url.exists()
        })
        .await
    }

    /// Whether replica `index` has exited (and how), without waiting.
    pub fn head_exited(&mut self, index: usize) -> Option<std::process::ExitStatus> {
        self.heads[index]
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` to replica `index`'s process.
    pub fn signal_head(&self, index: usize, signal: Signal) -> anyhow::Result<()> {
        let child = self.heads[index]
            .child
            .as_ref()
            .context("the replica runs")?;
        kill(Pid::from_raw(child.id() as i32), signal)?;
        Ok(())
    }

    /// Sends `signal` to worker `index`'s main process.
    /// In a PID namespace of its own (a worker run as root), the worker is a descendant of the
    /// process started, which only waits: both get it.
    pub fn signal_worker(&self, index: usize, signal: Signal) -> anyhow::Result<()> {
        let child = self.workers[index]
            .child
            .as_ref()
            .context("the worker runs")?;
        for (pid, comm) in crate::procs::process_tree(child.id() as i32) {
            if comm == "escher-worker" {
                kill(Pid::from_raw(pid), signal)?;
            }
        }
        Ok(())
    }

    /// SIGKILLs worker `index`'s main process (the process started). In a PID namespace of
    /// its own, the namespace's init dies with it, and so everything in the namespace: the
    /// worker, its fence supervisor and its tasks.
    pub fn kill_worker(&mut self, index: usize) {
        if let Some(mut child) = self.workers[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs the processes named `escher-worker` in worker `index`'s host, as `pkill -9
    /// escher-worker` there would, or with `all` every escher process (its fence supervisor,
    /// `escher-fence`, too: `pkill -9 escher`); returns their names. The tasks, not being
    /// escher's, are left to whatever contains them.
    pub fn kill_worker_processes(&mut self, index: usize, all: bool) -> Vec<String> {
        let host = self.workers[index].host.clone();
        let mut killed = Vec::new();
        for pid in self.net.pids(&host) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let comm = comm.trim();
            let hit = if all {
                comm.starts_with("escher")
            } else {
                comm == "escher-worker"
            };
            if hit && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed.push(comm.to_string());
            }
        }
        if let Some(mut child) = self.workers[index].child.take() {
            let _ = child.wait();
        }
        killed
    }

    /// Starts worker `index` again (same name and state directory: the same node) and waits
    /// until it is live.
    pub async fn restart_worker(&mut self, index: usize) -> anyhow::Result<NodeId> {
        self.kill_worker(index);
        self.spawn_worker(index)?;
        let name = self.workers[index].name.clone();
        self.wait_worker_alive(&name).await
    }

    /// Worker `index`'s name.
    pub fn worker_name(&self, index: usize) -> &str {
        &self.workers[index].name
    }

    /// Fills the small disk's file system (of the replica given in [`Settings::small_disk`]);
    /// returns the bytes written.
    pub fn fill_disk(&self) -> anyhow::Result<u64> {
        use std::io::Write;
        let mount = self.mounts.first().context("no small disk")?;
        let mut file = std::fs::File::create(mount.join("nemesis-fill"))?;
        let block = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(_) => break, // ENOSPC: full
            }
        }
        Ok(written)
    }

    /// Makes every fsync and fdatasync of replica `index` wait `ms` milliseconds first (0: none),
    /// through the shim it was started with (`slowdisk.c`).
    pub fn slow_disk(&self, index: usize, ms: u64) -> anyhow::Result<()> {
        let file = self.dir().join(format!("head-{}.slow-disk", index + 1));
        std::fs::write(&file, ms.to_string()).with_context(|| format!("writing {}", file.display()))
    }

    /// Frees the small disk again.
    pub fn free_disk(&self) -> anyhow::Result<()> {
        let mount = self.mounts.first().context("no small disk")?;
        let _ = std::fs::remove_file(mount.join("nemesis-fill"));
        Ok(())
    }

    /// The tail of every process's output, for a failure message.
    pub fn outputs(&self) -> String {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| {
            p.extension()
                .is_some_and(|e| e == "stdout" || e == "stderr")
        });
        files.sort();
        let mut text = String::new();
        for path in files {
            let body = std::fs::read_to_string(&path).unwrap_or_default();
            if body.trim().is_empty() {
                continue;
            }
            let lines: Vec<&str> = body.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            text.push_str(&format!("===== {} =====\n{tail}\n", path.display()));
        }
        text
    }

    /// Stops everything this cluster started (SIGCONT first: a stopped process dies only
    /// once it runs).
    fn kill_all(&mut self) {
        for m in self.heads.iter_mut().chain(self.workers.iter_mut()) {
            if let Some(mut child) = m.child.take() {
                let pid = Pid::from_raw(child.id() as i32);
                let _ = kill(pid, Signal::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        kill_marked(&self.marker);
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        self.kill_all();
        for mount in &self.mounts {
            let m = mount.display().to_string();
            if sh("umount", &[&m]).is_err() {
                let _ = sh("umount", &["-l", &m]);
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "the nemesis run failed; its processes wrote:\n{}",
                self.outputs()
            );
        }
    }
}

fn placeholder() -> Member {
    Member {
        host: Host {
            label: String::new(),
            ns: String::new(),
            ip: std::net::Ipv4Addr::UNSPECIFIED,
        },
        name: String::new(),
        bin: PathBuf::new(),
        args: Vec::new(),
        env: Vec::new(),
        child: None,
    }
}

/// SIGKILLs (after a SIGCONT) every process whose environment carries `marker`.
fn kill_marked(marker: &str) {
    let needle = format!("{MARKER_VAR}={marker}");
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// What an earlier run of this harness left when its process died without dropping its
/// cluster (a SIGKILL, an abort): its processes (found by their marker, whose pid is gone)
/// are killed, its tmpfs unmounted and its directory removed. Its namespaces go with
/// [`Network::new`].
fn remove_stale_runs() {
    let mut dirs = std::collections::BTreeSet::new();
    for (pid, dir) in crate::procs::processes() {
        let Ok(environ) = std::fs::read(dir.join("environ")) else {
            continue;
        };
        let prefix = format!("{MARKER_VAR}=");
        let Some(marker) = environ
            .split(|b| *b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok())
            .find_map(|v| v.strip_prefix(prefix.as_str()))
        else {
            continue;
        };
        let Some((owner, dir)) = marker.split_once(':') else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{owner}")).exists();
        if !alive && dir.contains("escher-nemesis-") {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            dirs.insert(dir.to_string());
        }
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for dir in dirs {
        for line in mounts.lines() {
            if let Some(point) = line.split_whitespace().nth(1)
                && point.starts_with(&format!("{dir}/"))
            {
                let _ = sh("umount", &["-l", point]);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
