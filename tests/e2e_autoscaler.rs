//! `escher-autoscaler` against real processes and real workers: as root with a Docker engine,
//! the Docker provider starts a container of the project's image (`deploy/make-base-image`
//! and `deploy/build-image` with the binaries cargo built, nothing pulled) for a pending task,
//! the task runs there, and once the worker has idled the autoscaler drains it and removes
//! the container. It prints the time from the task's submission to its start on the new
//! worker. It fails (never skips) without Docker. Everything it creates (containers, images)
//! is removed at the end, also when it fails.
//!
//! Needs root and Docker, and the binaries: `cargo build -p escher-cli -p escher-head
//! -p escher-worker --bins`.

mod procs;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use escher::Task;
use escher::types::{ClusterEvent, TaskState, WatchKind, WatchRequest};
use procs::{ProcessCluster, binary, eventually};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command`; its stdout, or a panic with what it printed.
fn ok(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes the test's containers and images, and stops the autoscaler, when dropped.
struct Cleanup {
    group: String,
    images: Vec<String>,
    autoscaler: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut child) = self.autoscaler.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for id in containers(&self.group, true) {
            let _ = Command::new("docker").args(["rm", "--force", &id]).output();
        }
        for image in &self.images {
            let _ = Command::new("docker")
                .args(["rmi", "--force", image])
                .output();
        }
    }
}

/// The containers of `group` (`all`: stopped ones too).
fn containers(group: &str, all: bool) -> Vec<String> {
    let filter = format!("label=escher.autoscaler={group}");
    let mut args = vec!["ps", "--quiet", "--filter", &filter];
    if all {
        args.push("--all");
    }
    let out = Command::new("docker").args(&args).output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

fn status_text(status_file: &Path) -> String {
    ok(Command::new(binary("escher-autoscaler"))
        .args(["status", "--status-file"])
        .arg(status_file))
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_provider_starts_a_worker_for_pending_work_and_stops_it_after_idling_needs_root_and_docker()
 {
    let unique = format!("escher-as-{}", std::process::id());
    let mut cleanup = Cleanup {
        group: unique.clone(),
        images: Vec::new(),
        autoscaler: None,
    };
    let bins = binary("escher-worker")
        .parent()
        .expect("a bin dir")
        .to_path_buf();
    let bin = |name: &str| bins.join(name).display().to_string();
    let base = format!("{unique}-base:test");
    let image = format!("{unique}:test");
    cleanup.images.push(base.clone());
    ok(Command::new(root().join("deploy/make-base-image"))
        .args(["--tag", &base])
        .args([bin("escher-head"), bin("escher-worker"), bin("escher")]));
    cleanup.images.push(image.clone());
    ok(Command::new(root().join("deploy/build-image"))
        .arg("--bin-dir")
        .arg(&bins)
        .args(["--base", &base, "--tag", &image]));

    let cluster = ProcessCluster::builder().workers(0).start().await;
    let client = cluster.client().await;
    let mut decisions = client
        .watch(WatchRequest::all().kinds([WatchKind::Decision]))
        .await
        .expect("a watch");
    let status_file = cluster.dir().join("autoscaler.json");
    let access = cluster.access_file();
    let autoscaler = Command::new(binary("escher-autoscaler"))
        .args([
            "run",
            "--provider",
            "docker",
            "--image",
            &image,
            "--group",
            &unique,
        ])
        .args(["--head", cluster.head_url()])
        .arg("--access-file")
        .arg(&access)
        .arg("--worker-credential")
        .arg(&access)
        .args(["--worker-shape", "cpu=2,memory=512", "--max-workers", "2"])
        .args([
            "--pending-for",
            "0s",
            "--idle-for",
            "4s",
            "--interval",
            "250ms",
        ])
        .arg("--status-file")
        .arg(&status_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("escher-autoscaler starts");
    cleanup.autoscaler = Some(autoscaler);

    // No worker at all: the task is pending until the autoscaler's worker joins.
    let submitted = Instant::now();
    let task = client
        .submit(Task::command(["sleep", "1"]).resources_str("cpu=1"))
        .await
        .expect("submitted")
        .id();
    let started = eventually(
        "the task to run on an autoscaled worker",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let info = client.task_info(task).await.ok()?;
                (info.status.state != TaskState::Pending).then_some(Instant::now())
            }
        },
    )
    .await;
    println!(
        "docker provider: pending task to running on a new worker: {:.2} s",
        (started - submitted).as_secs_f64()
    );
    assert_eq!(
        containers(&unique, false).len(),
        1,
        "one container for one small task"
    );
    let done = client.wait([task], 1, Some(Duration::from_secs(60))).await;
    assert!(done.is_ok(), "the task finished: {done:?}");
    let info = client.task_info(task).await.expect("task info");
    assert_eq!(info.status.state, TaskState::Succeeded, "{info:?}");

    // Idle for 4 s: drained, then the container is removed.
    eventually(
        "the idle worker's container to be removed",
        Duration::from_secs(60),
        || {
            let unique = unique.clone();
            async move { containers(&unique, true).is_empty().then_some(()) }
        },
    )
    .await;
    // The status file is written each round: the stop may be said a round after the
    // container went.
    let text = eventually(
        "the status file to say the worker was stopped",
        Duration::from_secs(30),
        || {
            let text = status_text(&status_file);
            async move {
                text.contains("is drained and holds nothing: stopping it")
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(text.contains("provider: ok"), "{text}");
    assert!(text.contains("launching 1 worker(s)"), "{text}");
    assert!(text.contains("held no task or reservation"), "{text}");
    println!("{text}");
    // Watchers saw the same decisions, in order: launch, drain, stop.
    let source = format!("autoscaler/{unique}");
    let mut actions = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !actions.ends_with(&["stop".to_string()]) {
            let event = decisions
                .next()
                .await
                .expect("the watch stays open")
                .expect("an event");
            if let ClusterEvent::Decision {
                source: from,
                action,
                ..
            } = event.event
                && from == source
                && action != "hold"
            {
                actions.push(action);
            }
        }
    })
    .await
    .expect("the decisions as watch events");
    assert_eq!(actions, ["launch", "drain", "stop"]);
    // The head declares the stopped worker's node gone (its stream ended).
    eventually(
        "the drained node to leave the cluster",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let nodes = client.cluster_status().await.ok()?.nodes;
                nodes.iter().all(|n| !n.alive).then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_cannot_start_workers_says_why_and_the_cluster_keeps_running_needs_docker()
{
    let cluster = ProcessCluster::builder().workers(1).start().await;
    let client = cluster.client().await;
    // The autoscaler's decisions reach the watch API as they are made.
    let mut decisions = client
        .watch(WatchRequest::all().kinds([WatchKind::Decision]))
        .await
        .expect("a watch");
    let status_file = cluster.dir().join("autoscaler.json");
    let access = cluster.access_file();
    let autoscaler = Command::new(binary("escher-autoscaler"))
        .args([
            "run",
            "--provider",
            "docker",
            "--image",
            "escher-no-such-image:never",
        ])
        .args(["--group", "broken", "--head", cluster.head_url()])
        .arg("--access-file")
        .arg(&access)
        .arg("--worker-credential")
        .arg(&access)
        .args([
            "--worker-shape",
            "cpu=1",
            "--max-workers",
            "1",
            "--pending-for",
            "0s",
        ])
        .args(["--interval", "250ms"])
        .arg("--status-file")
        .arg(&status_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("escher-autoscaler starts");
    let mut cleanup = Cleanup {
        group: "broken".into(),
        images: Vec::new(),
        autoscaler: Some(autoscaler),
    };
    // A task no worker can hold (a resource nobody has) is demand the provider cannot meet.
    let stuck = client
        .submit(Task::command(["true"]).resources_str("cpu=1,widget=1"))
        .await
        .expect("submitted");
    let _ = stuck;
    let text = eventually("the status to say why", Duration::from_secs(60), || {
        let status_file = status_file.clone();
        async move {
            let text = std::fs::read_to_string(&status_file).ok()?;
            text.contains("escher-no-such-image:never is not there")
                .then(|| status_text(&status_file))
        }
    })
    .await;
    assert!(text.contains("CANNOT START WORKERS"), "{text}");
    // `escher autoscaler status` prints the same report.
    let shown = ok(Command::new(binary("escher"))
        .args(["autoscaler", "status", "--status-file"])
        .arg(&status_file));
    assert!(
        shown.contains("group broken (provider docker)") && shown.contains("CANNOT START WORKERS"),
        "{shown}"
    );
    // Watchers were told why it launches nothing for that task: a decision event from the
    // group.
    let (mut provider, mut demand) = (None, None);
    tokio::time::timeout(Duration::from_secs(60), async {
        while provider.is_none() || demand.is_none() {
            let event = decisions
                .next()
                .await
                .expect("the watch stays open")
                .expect("an event");
            let ClusterEvent::Decision {
                source,
                action,
                reason,
            } = event.event
            else {
                continue;
            };
            assert_eq!(source, "autoscaler/broken", "{reason}");
            assert_eq!(action, "hold", "{reason}");
            if reason.contains("cannot start workers") {
                provider = Some(reason);
            } else if reason.contains("cannot fit in one worker") {
                demand = Some(reason);
            }
        }
    })
    .await
    .expect("the autoscaler's holds as watch events");
    let (provider, demand) = (provider.unwrap(), demand.unwrap());
    assert!(
        provider.contains("the docker provider cannot start workers")
            && provider.contains("escher-no-such-image:never"),
        "{provider}"
    );
    assert!(demand.contains("widget=1"), "{demand}");
    // The cluster runs what it has meanwhile.
    let ran = client
        .run(
            Task::command(["true"]).resources_str("cpu=1"),
            Some(Duration::from_secs(60)),
        )
        .await;
    assert!(ran.is_ok(), "{ran:?}");
    cleanup.autoscaler.take().map(|mut c| c.kill());
}

/// The Slurm provider with Debian's `sbatch` (slurm-wlm, installed as root) and no Slurm
/// controller running for it: every submission fails, and the status says so with sbatch's
/// own words while the cluster runs its tasks. Needs root and the slurm-wlm package; fails
/// without `sbatch`.
#[tokio::test(flavor = "multi_thread")]
async fn slurm_provider_reports_a_failing_sbatch_needs_root_and_slurm() {
    let cluster = ProcessCluster::builder().workers(1).start().await;
    let client = cluster.client().await;
    let status_file = cluster.dir().join("autoscaler.json");
    let access = cluster.access_file();
    // A configuration naming a controller on a port nothing listens on.
    let conf = cluster.dir().join("slurm.conf");
    std::fs::write(
        &conf,
        "ClusterName=escher-test\nSlurmctldHost=localhost\nSlurmctldPort=1\n\
         NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n",
    )
    .expect("slurm.conf written");
    let autoscaler = Command::new(binary("escher-autoscaler"))
        .args(["run", "--provider", "slurm", "--group", "slurm-broken"])
        .arg("--sbatch-script")
        .arg(root().join("deploy/slurm/escher-workers.sbatch"))
        .args(["--head", cluster.head_url()])
        .arg("--access-file")
        .arg(&access)
        .arg("--worker-credential")
        .arg(&access)
        .args(["--worker-shape", "cpu=1,widget=1", "--max-workers", "1"])
        .args(["--pending-for", "0s", "--interval", "250ms"])
        .arg("--status-file")
        .arg(&status_file)
        .env("SLURM_CONF", &conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("escher-autoscaler starts");
    let mut cleanup = Cleanup {
        group: "slurm-broken".into(),
        images: Vec::new(),
        autoscaler: Some(autoscaler),
    };
    client
        .submit(Task::command(["true"]).resources_str("cpu=1,widget=1"))
        .await
        .expect("submitted");
    let text = eventually("the status to say why", Duration::from_secs(90), || {
        let status_file = status_file.clone();
        async move {
            let text = std::fs::read_to_string(&status_file).ok()?;
            text.contains("could not start worker")
                .then(|| status_text(&status_file))
        }
    })
    .await;
    assert!(text.contains("CANNOT START WORKERS"), "{text}");
    assert!(text.contains("\"sbatch\" failed"), "{text}");
    let ran = client
        .run(
            Task::command(["true"]).resources_str("cpu=1"),
            Some(Duration::from_secs(60)),
        )
        .await;
    assert!(ran.is_ok(), "{ran:?}");
    if let Some(mut c) = cleanup.autoscaler.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A Slurm of the test's own on this machine (munged, slurmctld, slurmd with a configuration
/// in a temporary directory), stopped (by their pid files) when dropped.
struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    fn start() -> Slurm {
        let dir = tempfile::Builder::new()
            .prefix("escher-slurm-")
            .tempdir()
            .expect("a temp dir");
        let d = dir.path().display().to_string();
        let host = ok(Command::new("hostname").arg("-s"));
        for sub in ["spool", "ctld"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("a directory");
        }
        let key: Vec<u8> = (0..1024).map(|_| fastrand::u8(..)).collect();
        std::fs::write(dir.path().join("munge.key"), key).expect("the munge key");
        ok(Command::new("chmod").args(["400", &format!("{d}/munge.key")]));
        let port = 20000 + (std::process::id() % 20000) as u16;
        let conf = format!(
            "ClusterName=escher\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={port}\n\
             SlurmdPort={}\nAuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\n\
             CredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/ctld\n\
             SlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\nSlurmctldLogFile={d}/slurmctld.log\n\
             SlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
             PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            port + 1
        );
        std::fs::write(dir.path().join("slurm.conf"), conf).expect("slurm.conf");
        let slurm = Slurm { dir };
        ok(Command::new("munged").args([
            format!("--key-file={d}/munge.key"),
            format!("--socket={d}/munge.sock"),
            format!("--pid-file={d}/munged.pid"),
            format!("--log-file={d}/munged.log"),
            format!("--seed-file={d}/munge.seed"),
        ]));
        ok(Command::new("slurmctld").args(["-c", "-f", &slurm.conf()]));
        ok(Command::new("slurmd").args(["-f", &slurm.conf()]));
        slurm
    }

    fn conf(&self) -> String {
        self.dir.path().join("slurm.conf").display().to_string()
    }

    /// The job ids in the queue.
    fn queue(&self) -> Vec<String> {
        let out = Command::new("squeue")
            .args(["--noheader", "--format=%i"])
            .env("SLURM_CONF", self.conf())
            .output()
            .expect("squeue runs");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for daemon in ["slurmd", "slurmctld", "munged"] {
            let pid_file = self.dir.path().join(format!("{daemon}.pid"));
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                let _ = Command::new("kill").arg(pid.trim()).output();
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The Slurm provider against a Slurm the test starts: a pending task makes the autoscaler
/// `sbatch` the worker script, the job's worker joins and runs the task, and once idle the
/// worker is drained and its job cancelled. Prints the time from submission to start. Needs
/// root and the slurm-wlm package (munged, slurmctld, slurmd, sbatch); fails without them.
#[tokio::test(flavor = "multi_thread")]
async fn slurm_provider_submits_and_cancels_real_jobs_needs_root_and_slurm() {
    let slurm = Slurm::start();
    eventually("the Slurm node to be idle", Duration::from_secs(60), || {
        let out = Command::new("sinfo")
            .args(["--noheader", "--format=%t"])
            .env("SLURM_CONF", slurm.conf())
            .output();
        async move {
            let out = out.ok()?;
            String::from_utf8_lossy(&out.stdout)
                .contains("idle")
                .then_some(())
        }
    })
    .await;
    let cluster = ProcessCluster::builder().workers(0).start().await;
    let client = cluster.client().await;
    let status_file = cluster.dir().join("autoscaler.json");
    let access = cluster.access_file();
    let credential = cluster.dir().join("worker.json");
    std::fs::copy(&access, &credential).expect("the credential copied");
    ok(Command::new("chmod").arg("600").arg(&credential));
    let autoscaler = Command::new(binary("escher-autoscaler"))
        .args(["run", "--provider", "slurm", "--group", "slurm-test"])
        .arg("--sbatch-script")
        .arg(root().join("deploy/slurm/escher-workers.sbatch"))
        .arg(format!(
            "--sbatch-arg=--output={}/job-%j.out",
            cluster.dir().display()
        ))
        .args(["--head", cluster.head_url()])
        .arg("--access-file")
        .arg(&access)
        .arg("--worker-credential")
        .arg(&credential)
        .args(["--worker-shape", "cpu=2", "--max-workers", "1"])
        .args([
            "--pending-for",
            "0s",
            "--idle-for",
            "4s",
            "--interval",
            "250ms",
        ])
        .arg("--status-file")
        .arg(&status_file)
        .env("SLURM_CONF", slurm.conf())
        .env("ESCHER_WORKER_BIN", binary("escher-worker"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("escher-autoscaler starts");
    let _cleanup = Cleanup {
        group: "slurm-test".into(),
        images: Vec::new(),
        autoscaler: Some(autoscaler),
    };
    let submitted = Instant::now();
    let task = client
        .submit(Task::command(["sleep", "1"]).resources_str("cpu=1"))
        .await
        .expect("submitted")
        .id();
    let started = eventually(
        "the task to run on a Slurm worker",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let info = client.task_info(task).await.ok()?;
                (info.status.state != TaskState::Pending).then_some(Instant::now())
            }
        },
    )
    .await;
    println!(
        "slurm provider: pending task to running on a new worker: {:.2} s",
        (started - submitted).as_secs_f64()
    );
    assert_eq!(slurm.queue().len(), 1, "one job for one small task");
    client
        .wait([task], 1, Some(Duration::from_secs(60)))
        .await
        .expect("the task finished");
    eventually(
        "the idle worker's job to be cancelled",
        Duration::from_secs(60),
        || {
            let empty = slurm.queue().is_empty();
            async move { empty.then_some(()) }
        },
    )
    .await;
    let text = status_text(&status_file);
    assert!(text.contains("provider: ok"), "{text}");
    assert!(
        text.contains("is drained and holds nothing: stopping it"),
        "{text}"
    );
    println!("{text}");
}

/// A decision made while the head is unreachable (the hold that says so) waits in the status
/// file and reaches the head's watch API, saying when it was made, once the head is back.
/// Runs the Docker provider with an image that is not there (or no engine at all): either way
/// it launches nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_made_while_the_head_is_unreachable_is_recorded_when_it_is_back() {
    let mut cluster = ProcessCluster::builder().workers(0).durable().start().await;
    let client = cluster.client().await;
    let mut decisions = client
        .watch(WatchRequest::all().kinds([WatchKind::Decision]))
        .await
        .expect("a watch");
    let status_file = cluster.dir().join("autoscaler.json");
    let access = cluster.access_file();
    let autoscaler = Command::new(binary("escher-autoscaler"))
        .args(["run", "--provider", "docker"])
        .args(["--image", "escher-no-such-image:never"])
        .args(["--group", "outage", "--head", cluster.head_url()])
        .arg("--access-file")
        .arg(&access)
        .arg("--worker-credential")
        .arg(&access)
        .args(["--worker-shape", "cpu=1", "--max-workers", "1"])
        .args(["--interval", "250ms"])
        .arg("--status-file")
        .arg(&status_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("escher-autoscaler starts");
    let mut cleanup = Cleanup {
        group: "outage".into(),
        images: Vec::new(),
        autoscaler: Some(autoscaler),
    };
    // Its first decision (the provider cannot start workers) reaches watchers as it is made.
    let first = tokio::time::timeout(Duration::from_secs(60), decisions.next())
        .await
        .expect("a first decision")
        .expect("the watch stays open")
        .expect("an event");
    drop(decisions);

    cluster.kill_head();
    let text = eventually(
        "the status to hold for the unreachable head",
        Duration::from_secs(60),
        || {
            let status_file = status_file.clone();
            async move {
                let text = status_text(&status_file);
                text.contains("decisions not yet recorded in the head (sent when it answers): 1")
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(
        text.contains("head: unreachable") && text.contains("the head is unreachable"),
        "{text}"
    );

    cluster.restart_head().await;
    let text = eventually(
        "the queued decision to be sent",
        Duration::from_secs(60),
        || {
            let status_file = status_file.clone();
            async move {
                let text = status_text(&status_file);
                (!text.contains("head: unreachable")
                    && !text.contains("decisions not yet recorded"))
                .then_some(text)
            }
        },
    )
    .await;
    // The head recorded it after the first, once: watchers that resume see it, with when it
    // was made.
    let client = cluster.client().await;
    let mut resumed = client
        .watch(
            WatchRequest::all()
                .kinds([WatchKind::Decision])
                .after(first.revision),
        )
        .await
        .expect("a watch that resumes");
    let held = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let event = resumed
                .next()
                .await
                .expect("the watch stays open")
                .expect("an event");
            if let ClusterEvent::Decision { reason, action, .. } = event.event
                && reason.contains("the head is unreachable")
            {
                return (action, reason);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no decision about the outage reached the head; status:\n{text}"));
    assert_eq!(held.0, "hold");
    assert!(
        held.1.starts_with("(decided at ") && held.1.contains("while the head was unreachable)"),
        "{}",
        held.1
    );
    cleanup.autoscaler.take().map(|mut c| c.kill());
}
