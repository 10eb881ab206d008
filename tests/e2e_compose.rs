//! The compose cluster of `deploy/` started for real: the base image (`deploy/make-base-image`,
//! nothing pulled), the escher image on it with the binaries cargo built for this test
//! (`deploy/build-image`, the Dockerfile's `prebuilt` target), then `deploy/compose.yaml` under a
//! project name of its own: three durable head replicas and three workers (one with a
//! simulated A100). Against it, docs/operations.md's multi-machine commands, run in a head's
//! container as an operator would (`escher heads`, `status`, `nodes`, `submit --wait`, `logs`);
//! what the workers were given (a worker-only credential, never the admin's file); tasks run
//! as users of their own; a Python driver on the Docker host (a virtual environment with this
//! checkout's wheel, which the base image has too) running remote functions, a chained
//! `TaskRef`, an actor, a value held in a worker's store, and objects (`escher.put` passed to a
//! task, `escher.get` and `escher.put` inside tasks), with an app credential and the containers' addresses as
//! deploy/README.md says (see [`python_from_the_host`]); a failover of the leader; `down` then `up` again keeping every task
//! (the named volumes); and a rolling upgrade to a release with a new data format, replica by
//! replica under load (see [`rolling_upgrade`]). Everything it creates (containers, the
//! network, the volumes, the images) is removed at the end, also when it fails, and the
//! containers' logs are printed then.
//!
//! It needs a Docker engine and `docker-compose` (1.29, as CI has), the binaries
//! `cargo test --workspace` builds beside this test, `/usr/bin/python3` with `venv` and `pip`,
//! and PyPI (maturin for escher's wheel, cloudpickle for the image and the driver). It prints the image's size, the time from
//! `docker-compose up` to the first task's end, and the rolling upgrade's longest gap between
//! two acknowledged submits (BENCHMARKS.md).

mod procs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use escher_head::replication::DATA_FORMAT;
use serde_json::Value;

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command` to its end or for at most `limit` (then kills it and panics), and returns
/// its output.
fn run_for(command: &mut Command, limit: Duration) -> Output {
    let shown = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    // Read both pipes on threads, so that a command that writes much never blocks.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("the stdout reader"),
        stderr: err.join().expect("the stderr reader"),
    }
}

/// `output`'s stdout, or a panic with everything it printed if it failed.
fn ok(what: &str, output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The images and the compose project of one test, removed when dropped.
struct Deployment {
    project: String,
    base: String,
    image: String,
    compose_file: PathBuf,
    /// Container ids by service, as of the last `up`.
    containers: BTreeMap<String, String>,
    /// Images and containers the test made beside the project (removed with it).
    extra_images: Vec<String>,
    extra_containers: Vec<String>,
}

impl Deployment {
    fn compose(&self, args: &[&str]) -> Command {
        self.compose_over(&[], args)
    }

    /// `docker-compose` with `overrides` (compose files) read after deploy/compose.yaml.
    fn compose_over(&self, overrides: &[PathBuf], args: &[&str]) -> Command {
        let mut command = Command::new("docker-compose");
        command
            .args(["--ansi", "never"])
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(&self.compose_file);
        for file in overrides {
            command.arg("-f").arg(file);
        }
        command.args(args).env("ESCHER_IMAGE", &self.image);
        command
    }

    /// Learns `service`'s container id again (after it was recreated).
    fn learn_container(&mut self, service: &str) {
        let id = ok(
            "docker-compose ps -q",
            run_for(
                &mut self.compose(&["ps", "-q", service]),
                Duration::from_secs(60),
            ),
        );
        self.containers
            .insert(service.to_string(), id.trim().to_string());
    }

    /// Starts the project (or starts it again) and learns its containers' ids.
    fn up(&mut self) {
        ok(
            "docker-compose up",
            run_for(&mut self.compose(&["up", "-d"]), Duration::from_secs(300)),
        );
        self.containers.clear();
        for service in SERVICES {
            let id = ok(
                "docker-compose ps -q",
                run_for(
                    &mut self.compose(&["ps", "-q", service]),
                    Duration::from_secs(60),
                ),
            );
            let id = id.trim();
            assert!(!id.is_empty(), "service {service} has no container");
            self.containers.insert(service.to_string(), id.to_string());
        }
    }

    /// `docker exec` in `service`'s container (faster than `docker-compose exec`).
    fn exec(&self, service: &str, args: &[&str]) -> Output {
        let id = &self.containers[service];
        run_for(
            Command::new("docker").arg("exec").arg(id).args(args),
            Duration::from_secs(120),
        )
    }

    /// The escher CLI in a head's container, with the admin's access file there.
    fn escher(&self, head: &str, args: &[&str]) -> Output {
        let mut all = vec!["escher"];
        all.extend_from_slice(args);
        self.exec(head, &all)
    }

    /// Like [`Deployment::escher`], with its JSON output parsed; panics if it fails.
    fn escher_json(&self, head: &str, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let text = ok(&format!("escher {args:?}"), self.escher(head, &all));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("escher {args:?}: {e}: {text}"))
    }

    /// Retries `escher ARGS` in `head` until it succeeds, for at most `limit`.
    fn escher_eventually(&self, head: &str, args: &[&str], limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.escher(head, args);
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                Instant::now() < deadline,
                "escher {args:?} kept failing for {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = run_for(
                &mut self.compose(&["logs", "--no-color", "--tail", "60"]),
                Duration::from_secs(60),
            );
            eprintln!(
                "--- the compose project's logs ---\n{}{}",
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        for container in &self.extra_containers {
            let _ = run_for(
                Command::new("docker").args(["rm", "--force", container]),
                Duration::from_secs(60),
            );
        }
        let down = run_for(
            &mut self.compose(&["down", "--volumes", "--remove-orphans", "--timeout", "5"]),
            Duration::from_secs(180),
        );
        if !down.status.success() {
            eprintln!(
                "docker-compose down failed: {}",
                String::from_utf8_lossy(&down.stderr)
            );
        }
        for image in self.extra_images.iter().chain([&self.image, &self.base]) {
            let _ = run_for(
                Command::new("docker").args(["rmi", "--force", image]),
                Duration::from_secs(60),
            );
        }
    }
}

/// Every service of deploy/compose.yaml that keeps running.
const SERVICES: [&str; 6] = [
    "head-1",
    "head-2",
    "head-3",
    "worker-gpu",
    "worker-cpu-1",
    "worker-cpu-2",
];

/// The name of the replica that leads, from `escher heads --json`.
fn leader(heads: &Value) -> u64 {
    let replicas = heads["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("no replicas in {heads}"));
    let leaders: Vec<u64> = replicas
        .iter()
        .filter(|r| {
            r["role"]
                .as_str()
                .is_some_and(|role| role.eq_ignore_ascii_case("leader"))
        })
        .map(|r| r["id"].as_u64().expect("a replica id"))
        .collect();
    assert_eq!(leaders.len(), 1, "one leader in {heads}");
    leaders[0]
}

/// The id `escher submit` printed (its first line).
fn task_id(submitted: &str) -> String {
    let id = submitted
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
        "escher submit printed no task id: {submitted}"
    );
    id
}

#[test]
fn needs_docker_and_pypi_the_compose_cluster_runs_the_readme_tour() {
    let bins = procs::binary("escher-head")
        .parent()
        .expect("a binary's directory")
        .to_path_buf();
    for name in ["escher-worker", "escher"] {
        procs::binary(name);
    }
    let unique = format!(
        "escher-e2e-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .subsec_nanos()
    );
    let mut deployment = Deployment {
        project: unique.replace('-', ""),
        base: format!("{unique}-base:test"),
        image: format!("{unique}:test"),
        compose_file: root().join("deploy/compose.yaml"),
        containers: BTreeMap::new(),
        extra_images: Vec::new(),
        extra_containers: Vec::new(),
    };

    // escher's wheel, built once (the module's build is the longest step when the Python
    // suite has not built it yet): the image's workers and the host's driver both install it.
    let driver_dir = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let wheel = escher_wheel(driver_dir.path(), &bins);
    let wheel_took = started.elapsed();
    // The host's Python driver's environment, made meanwhile.
    let driver = {
        let (dir, wheel) = (driver_dir.path().to_path_buf(), wheel.clone());
        std::thread::spawn(move || driver_venv(&dir, &wheel))
    };

    // The base, made of this machine's files and its system Python (with cloudpickle from
    // PyPI and escher's wheel): nothing is pulled.
    let started = Instant::now();
    let bin = |name: &str| bins.join(name).display().to_string();
    ok(
        "deploy/make-base-image",
        run_for(
            Command::new(root().join("deploy/make-base-image"))
                .args(["--tag", &deployment.base])
                .args(["--python", SYSTEM_PYTHON])
                .arg("--wheel")
                .arg(&wheel)
                .args([bin("escher-head"), bin("escher-worker"), bin("escher")]),
            Duration::from_secs(300),
        ),
    );
    let base_took = started.elapsed();
    let started = Instant::now();
    ok(
        "deploy/build-image",
        run_for(
            Command::new(root().join("deploy/build-image"))
                .arg("--bin-dir")
                .arg(&bins)
                .args(["--base", &deployment.base, "--tag", &deployment.image]),
            Duration::from_secs(600),
        ),
    );
    let image_took = started.elapsed();
    let size = |image: &str| -> u64 {
        let out = run_for(
            Command::new("docker").args(["image", "inspect", "--format", "{{.Size}}", image]),
            Duration::from_secs(60),
        );
        ok("docker image inspect", out)
            .trim()
            .parse()
            .expect("an image size in bytes")
    };
    let (base_size, image_size) = (size(&deployment.base), size(&deployment.image));
    println!(
        "escher's wheel in {wheel_took:.1?}; base image: {:.1} MB in {base_took:.1?}; escher \
         image: {:.1} MB in {image_took:.1?} (binaries of {})",
        base_size as f64 / 1e6,
        image_size as f64 / 1e6,
        bins.display()
    );
    // The image is the base and the three binaries, nothing else.
    let binaries: u64 = ["escher-head", "escher-worker", "escher"]
        .iter()
        .map(|b| std::fs::metadata(bins.join(b)).expect("a binary").len())
        .sum();
    assert!(
        image_size >= base_size + binaries && image_size < base_size + binaries + 1_000_000,
        "the image ({image_size} bytes) should be the base ({base_size}) and the binaries \
         ({binaries})"
    );

    // `up`, then docs/operations.md's first task: from `up` to its end.
    let up_at = Instant::now();
    deployment.up();
    let up_took = up_at.elapsed();
    deployment.escher_eventually("head-1", &["status"], Duration::from_secs(60));
    let leader_after = up_at.elapsed();
    let submitted = ok(
        "the first task",
        deployment.escher(
            "head-1",
            &[
                "submit",
                "--resources",
                "cpu=1",
                "--wait",
                "--",
                "echo",
                "hello",
            ],
        ),
    );
    let first_task_after = up_at.elapsed();
    println!(
        "from docker-compose up to the first task's end: {first_task_after:.2?} (`up -d` \
         returned after {up_took:.2?}, `escher status` answered after {leader_after:.2?})"
    );
    let first = task_id(&submitted);

    // Three replicas, one leader, every one reachable; the same answer from every replica.
    let heads = deployment.escher_json("head-2", &["heads"]);
    let replicas = heads["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 3, "{heads}");
    assert!(
        replicas
            .iter()
            .all(|r| r["reachable"] == true && r["in_memory"] == false),
        "{heads}"
    );
    let lead = leader(&heads);
    assert_eq!(leader(&deployment.escher_json("head-3", &["heads"])), lead);
    // `escher logs` in the leader's container: through a follower it fails today ("this head
    // replica is not the leader") where every other command follows the leader.
    let leader_service = format!("head-{lead}");
    let logs = ok(
        "escher logs",
        deployment.escher(&leader_service, &["logs", &first]),
    );
    assert_eq!(logs.trim(), "hello");

    // Three workers, named as in the compose file, the GPU on gpu-box.
    let nodes_before = deployment.escher_json("head-1", &["nodes"]);
    let nodes = nodes_before.as_array().expect("a list of nodes");
    let mut by_name = BTreeMap::new();
    for row in nodes {
        let node = &row["node"];
        by_name.insert(
            node["name"].as_str().expect("a node name").to_string(),
            node.clone(),
        );
    }
    assert_eq!(
        by_name.keys().map(String::as_str).collect::<Vec<_>>(),
        ["cpu-box-1", "cpu-box-2", "gpu-box"],
        "{nodes:?}"
    );
    let status = ok("escher status", deployment.escher("head-1", &["status"]));
    assert!(status.contains("gpu-box"), "{status}");
    assert!(!status.contains("share one user"), "{status}");

    // A GPU task runs on the worker with the (simulated) GPU.
    let gpu_node = by_name["gpu-box"]["id"].as_u64().expect("a node id");
    let submitted = ok(
        "a GPU task",
        deployment.escher(
            "head-1",
            &[
                "submit",
                "--resources",
                "gpu=1",
                "--wait",
                "--",
                "sh",
                "-c",
                "echo on node $ESCHER_NODE_ID",
            ],
        ),
    );
    let gpu_task = task_id(&submitted);
    let logs = ok(
        "escher logs",
        deployment.escher(&leader_service, &["logs", &gpu_task]),
    );
    assert_eq!(logs.trim(), format!("on node {gpu_node}"));

    // Tasks run as a user of their own, not as the worker's root.
    let submitted = ok(
        "a task that prints its uid",
        deployment.escher(
            "head-1",
            &["submit", "--resources", "cpu=1", "--wait", "--", "id", "-u"],
        ),
    );
    let uid_task = task_id(&submitted);
    let uid: u32 = ok(
        "escher logs",
        deployment.escher(&leader_service, &["logs", &uid_task]),
    )
    .trim()
    .parse()
    .expect("a uid");
    assert!(
        (300_000..=365_535).contains(&uid),
        "the task ran as uid {uid}"
    );

    // The workers hold a worker-only credential, and nothing of the admin's.
    let access: Value = serde_json::from_str(&ok(
        "reading the heads' access file",
        deployment.exec("head-1", &["cat", "/var/lib/escher/access/access.json"]),
    ))
    .expect("the access file is JSON");
    let admin_token = access["admin_token"].as_str().expect("an admin token");
    assert!(admin_token.starts_with("escher-admin-"), "{admin_token}");
    for worker in ["worker-gpu", "worker-cpu-1", "worker-cpu-2"] {
        let credential: Value = serde_json::from_str(&ok(
            "reading a worker's credential",
            deployment.exec(worker, &["cat", "/var/lib/escher/credential/worker.json"]),
        ))
        .expect("the worker's credential is JSON");
        assert_eq!(
            credential["admin_token"], "",
            "{worker} holds an admin token"
        );
        let token = credential["worker_token"].as_str().expect("a worker token");
        assert!(token.starts_with("escher-worker-"), "{token}");
        assert_ne!(
            token, access["worker_token"],
            "the join token of the heads' file"
        );
        let listed = deployment.exec(worker, &["ls", "/var/lib/escher/access"]);
        assert!(
            !listed.status.success(),
            "{worker} sees the heads' access directory"
        );
        let inspect = ok(
            "docker inspect",
            run_for(
                Command::new("docker").args(["inspect", &deployment.containers[worker]]),
                Duration::from_secs(60),
            ),
        );
        assert!(
            !inspect.contains(admin_token),
            "{worker}'s configuration holds the admin token"
        );
    }

    let python = driver
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    python_from_the_host(&deployment, &unique, &python);

    every_escher_process_of_a_worker_killed(&deployment, &unique, &by_name);

    // The heads' health check passes (their `escher status`), and the dashboard, on each head's
    // loopback, answers `escher dashboard` there.
    let deadline = Instant::now() + Duration::from_secs(90);
    for head in ["head-1", "head-2", "head-3"] {
        loop {
            let health = ok(
                "docker inspect",
                run_for(
                    Command::new("docker").args([
                        "inspect",
                        "--format",
                        "{{.State.Health.Status}}",
                        &deployment.containers[head],
                    ]),
                    Duration::from_secs(60),
                ),
            );
            if health.trim() == "healthy" {
                break;
            }
            assert!(Instant::now() < deadline, "{head} is {health}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let dashboard = ok(
        "escher dashboard",
        deployment.escher(&leader_service, &["dashboard"]),
    );
    // A login ticket for the head's own dashboard, never the token.
    assert!(
        dashboard.contains("http://127.0.0.1:8265/#ticket=") && !dashboard.contains("token="),
        "{dashboard}"
    );

    // The leader's container stops: another replica leads, and tasks still run.
    let other = if lead == 1 { "head-2" } else { "head-1" };
    ok(
        "docker-compose stop",
        run_for(
            &mut deployment.compose(&["stop", "--timeout", "5", &leader_service]),
            Duration::from_secs(120),
        ),
    );
    let submitted = ok(
        "a task after the leader stopped",
        deployment.escher(
            other,
            &[
                "submit",
                "--resources",
                "cpu=1",
                "--wait",
                "--",
                "echo",
                "after failover",
            ],
        ),
    );
    let after_failover = task_id(&submitted);
    let heads = deployment.escher_json(other, &["heads"]);
    assert_ne!(leader(&heads), lead, "{heads}");
    ok(
        "docker-compose start",
        run_for(
            &mut deployment.compose(&["start", &leader_service]),
            Duration::from_secs(120),
        ),
    );

    // `down` and `up` again (the volumes kept): every task is there, with its result, and the
    // workers come back as the same nodes.
    ok(
        "docker-compose down",
        run_for(
            &mut deployment.compose(&["down", "--timeout", "10"]),
            Duration::from_secs(180),
        ),
    );
    deployment.up();
    let restarted_at = Instant::now();
    for id in [&first, &after_failover] {
        let task = loop {
            let out = deployment.escher("head-1", &["--json", "get", id]);
            if out.status.success() {
                break serde_json::from_slice::<Value>(&out.stdout).expect("JSON");
            }
            assert!(
                restarted_at.elapsed() < Duration::from_secs(120),
                "escher get {id} after the restart: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        assert_eq!(
            task["state"], "Succeeded",
            "task {id} after the restart: {task}"
        );
    }
    let heads = deployment.escher_json("head-1", &["heads"]);
    let leader_service = format!("head-{}", leader(&heads));
    let logs = ok(
        "escher logs after the restart",
        deployment.escher(&leader_service, &["logs", &after_failover]),
    );
    assert_eq!(logs.trim(), "after failover");
    // The workers come back as the nodes they were.
    let ids = |nodes: &Value| -> BTreeMap<String, u64> {
        nodes
            .as_array()
            .expect("a list of nodes")
            .iter()
            .map(|row| {
                (
                    row["node"]["name"].as_str().expect("a name").to_string(),
                    row["node"]["id"].as_u64().expect("an id"),
                )
            })
            .collect()
    };
    let before = ids(&nodes_before);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = ids(&deployment.escher_json("head-1", &["nodes"]));
        if now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workers did not come back as the same nodes: {before:?} then {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    rolling_upgrade(&mut deployment, &unique);
}

/// The host pids of the processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    procs::processes()
        .filter(|(_, dir)| {
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(marker)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The host pids of the processes descended from `root` (itself included) whose name starts
/// with `escher`.
fn escher_processes_under(root: i32) -> Vec<i32> {
    procs::process_tree(root)
        .into_iter()
        .filter(|(_, name)| name.starts_with("escher"))
        .map(|(pid, _)| pid)
        .collect()
}

/// `kill -9` of every escher process of a worker's container at once, the worker and its fence
/// supervisor together (the `kill-worker-and-fence` nemesis, which on a bare host leaves the
/// tasks running until the worker is back, docs/RELIABILITY.md): in a container the runtime
/// is the supervisor. The container's init sees its child die and exits, and the kernel ends
/// every process of the container's PID namespace with it, a task's process that left its
/// process group with `setsid` too, at once, long before the head retries the task; the
/// container restarts (`restart: unless-stopped`) and the task's retry runs.
fn every_escher_process_of_a_worker_killed(
    deployment: &Deployment,
    unique: &str,
    by_name: &BTreeMap<String, Value>,
) {
    let marker = format!("{unique}-fenced");
    let script = format!(
        r#"if [ "$ESCHER_ATTEMPT" -gt 1 ]; then echo retried; exit 0; fi; setsid sh -c 'sleep 600; :' {marker} & sleep 600; :"#
    );
    let submitted = ok(
        "a long task",
        deployment.escher(
            "head-1",
            &[
                "submit",
                "--resources",
                "cpu=1",
                "--retries",
                "1",
                "--",
                "sh",
                "-c",
                &script,
                &marker,
            ],
        ),
    );
    let long = task_id(&submitted);
    // Running, with both its shell and the shell it left behind with `setsid`.
    let deadline = Instant::now() + Duration::from_secs(60);
    let node = loop {
        let info = deployment.escher_json("head-1", &["info", &long]);
        let node = info["status"]["node"].as_u64();
        if info["status"]["state"] == "Running"
            && let Some(node) = node
            && processes_with(&marker).len() >= 2
        {
            break node;
        }
        if Instant::now() > deadline {
            let top: Vec<String> = deployment
                .containers
                .keys()
                .filter(|s| s.starts_with("worker"))
                .map(|s| {
                    let out = Command::new("docker")
                        .args(["top", &deployment.containers[s], "-eo", "pid,args"])
                        .output()
                        .expect("docker top");
                    format!("{s}: {}", String::from_utf8_lossy(&out.stdout))
                })
                .collect();
            panic!(
                "the long task never ran with its two processes (found {:?}): {info}\n{}",
                processes_with(&marker),
                top.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let name = by_name
        .iter()
        .find(|(_, n)| n["id"].as_u64() == Some(node))
        .map(|(name, _)| name.clone())
        .expect("the task's node is one of the three");
    let service = match name.as_str() {
        "gpu-box" => "worker-gpu".to_string(),
        other => other.replace("cpu-box", "worker-cpu"),
    };
    let init: i32 = ok(
        "docker inspect",
        run_for(
            Command::new("docker").args([
                "inspect",
                "--format",
                "{{.State.Pid}}",
                &deployment.containers[&service],
            ]),
            Duration::from_secs(60),
        ),
    )
    .trim()
    .parse()
    .expect("the container's init pid");
    let escher = escher_processes_under(init);
    assert!(
        escher.len() >= 2,
        "the worker and its fence supervisor in {service}: {escher:?}"
    );
    let killed_at = Instant::now();
    for pid in &escher {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Gone within a few seconds, where the head retries only after its heartbeat timeout.
    loop {
        let left = processes_with(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "the task's processes {left:?} outlived every escher process of {service} by \
             {:.1?}",
            killed_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "every escher process of {service} killed: the task's processes, the one it left with \
         setsid included, gone after {:.2?}",
        killed_at.elapsed()
    );
    // The container comes back, and the task's retry runs to its end.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let info = deployment.escher_json("head-1", &["info", &long]);
        if info["status"]["state"] == "Succeeded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the long task was not retried to its end: {info}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Each replica's (newest data format read, format written) from `escher heads --json` in
/// `head`'s container (`None` for one that did not answer), and the replica that leads.
fn formats(deployment: &Deployment, head: &str) -> (BTreeMap<u64, Option<(u64, u64)>>, u64) {
    let heads = deployment.escher_json(head, &["heads"]);
    let replicas = heads["replicas"].as_array().expect("replicas");
    let formats = replicas
        .iter()
        .map(|r| {
            let id = r["id"].as_u64().expect("an id");
            let known = (r["reachable"] == true)
                .then(|| {
                    r["data_format"]
                        .as_u64()
                        .zip(r["writes_data_format"].as_u64())
                })
                .flatten();
            (id, known)
        })
        .collect();
    (formats, leader(&heads))
}

/// A rolling upgrade on the compose cluster (docs/data-directory.md's procedure): each head
/// replica's container is replaced by one of "the next release" (this image under the test seam
/// `ESCHER_TEST_NEXT_DATA_FORMAT=1`, one data format more), followers first and the leader last,
/// while a container of its own on the project's network submits tasks in a loop (each under
/// an idempotency key, retried under it until acknowledged). The group keeps writing this
/// release's format until every replica reads the next, then writes that; every acknowledged task runs; the
/// longest time between two acknowledgements is printed (BENCHMARKS.md).
fn rolling_upgrade(deployment: &mut Deployment, unique: &str) {
    // The next release's image: this one with the seam set.
    let next_image = format!("{unique}-next:test");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!(
            "FROM {}\nENV ESCHER_TEST_NEXT_DATA_FORMAT=1\n",
            deployment.image
        ),
    )
    .expect("a Dockerfile");
    deployment.extra_images.push(next_image.clone());
    ok(
        "docker build (the next release)",
        run_for(
            Command::new("docker")
                .args(["build", "--quiet", "--tag", &next_image])
                .arg(dir.path()),
            Duration::from_secs(300),
        ),
    );
    // This release's data format, and the next release's.
    let (this, next) = (u64::from(DATA_FORMAT), u64::from(DATA_FORMAT) + 1);
    let (before, _) = formats(deployment, "head-1");
    assert!(
        before.values().all(|f| *f == Some((this, this))),
        "before the upgrade: {before:?}"
    );

    // The load, in a container on the project's network with the admin's access file.
    let loader = format!("{unique}-load");
    deployment.extra_containers.push(loader.clone());
    let script = r#"
        # One client id for the loop (hexadecimal: the seconds' digits are hex digits too),
        # one sequence number per task: CLIENT-SEQ, the form of `escher submit --key`.
        client=$(date +%s)
        i=0
        while [ ! -e /tmp/stop ]; do
            i=$((i + 1))
            tries=0
            until out=$(escher submit --key "$client-$i" --name "upgrade-$i" \
                            --resources cpu=0.1 -- true 2>&1); do
                tries=$((tries + 1))
                if [ $tries -ge 600 ]; then echo "failed $i $out"; exit 1; fi
                sleep 0.05
            done
            echo "ok $i $(date +%s%N) $(echo "$out" | head -1) $tries"
            sleep 0.02
        done
        echo done
    "#;
    ok(
        "docker run (the load)",
        run_for(
            Command::new("docker")
                .args(["run", "--detach", "--name", &loader])
                .args(["--network", &format!("{}_default", deployment.project)])
                .args([
                    "--volume",
                    &format!(
                        "{}_head-access:/var/lib/escher/access:ro",
                        deployment.project
                    ),
                ])
                .args([
                    "--env",
                    "ESCHER_ACCESS_FILE=/var/lib/escher/access/access.json",
                    "--env",
                    "ESCHER_HEAD=https://head-1:7600,https://head-2:7600,https://head-3:7600",
                ])
                .args([&deployment.image, "sh", "-c", script]),
            Duration::from_secs(120),
        ),
    );
    // (loop number, when acknowledged in ns, task id, failed tries before it).
    let acknowledged = || -> Vec<(u64, u128, String, u32)> {
        let logs = ok(
            "docker logs (the load)",
            run_for(
                Command::new("docker").args(["logs", &loader]),
                Duration::from_secs(60),
            ),
        );
        assert!(!logs.contains("failed "), "the load gave up: {logs}");
        logs.lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                (words.next()? == "ok").then_some(())?;
                let n = words.next()?.parse().ok()?;
                let at = words.next()?.parse().ok()?;
                let id = words.next()?.to_string();
                Some((n, at, id, words.next()?.parse().ok()?))
            })
            .collect()
    };
    let wait_for_more = |what: &str, more: usize| {
        let count = acknowledged().len();
        let deadline = Instant::now() + Duration::from_secs(120);
        while acknowledged().len() < count + more {
            assert!(Instant::now() < deadline, "no writes acknowledged {what}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait_for_more("before the upgrade", 10);

    // Followers first, the leader last.
    let (_, lead) = formats(deployment, "head-1");
    let mut order: Vec<u64> = (1..=3).filter(|id| *id != lead).collect();
    order.push(lead);
    let mut upgraded = Vec::new();
    for (step, id) in order.iter().enumerate() {
        let service = format!("head-{id}");
        upgraded.push(service.clone());
        let override_file = dir.path().join(format!("upgrade-{step}.yaml"));
        let mut yaml = String::from("services:\n");
        for service in &upgraded {
            yaml.push_str(&format!("  {service}:\n    image: {next_image}\n"));
        }
        std::fs::write(&override_file, yaml).expect("an override file");
        let started = Instant::now();
        ok(
            "docker-compose up (one replica on the next release)",
            run_for(
                &mut deployment
                    .compose_over(&[override_file], &["up", "--detach", "--no-deps", &service]),
                Duration::from_secs(180),
            ),
        );
        deployment.learn_container(&service);
        // It runs the next release and has caught up; the group goes on.
        let other = format!("head-{}", order.iter().find(|o| *o != id).expect("another"));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (now, _) = formats(deployment, &other);
            if now[id].is_some_and(|(reads, _)| reads == next) {
                if step < 2 {
                    assert!(
                        now.values()
                            .all(|f| f.is_some_and(|(_, writes)| writes == this)),
                        "with {} replica(s) upgraded: {now:?}",
                        step + 1
                    );
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica {id} did not come back on the next release: {now:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        println!(
            "replica {id} replaced by the next release and answering after {:.2?}",
            started.elapsed()
        );
        wait_for_more(&format!("after replica {id} was replaced"), 20);
    }
    // Every replica reads the next format: the group writes it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (now, _) = formats(deployment, "head-1");
        if now.values().all(|f| *f == Some((next, next))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not move to format {next}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_for_more(&format!("in format {next}"), 20);
    ok(
        "stopping the load",
        run_for(
            Command::new("docker").args(["exec", &loader, "sh", "-c", ": > /tmp/stop"]),
            Duration::from_secs(60),
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ok(
        "docker logs (the load)",
        run_for(
            Command::new("docker").args(["logs", &loader]),
            Duration::from_secs(60),
        ),
    )
    .contains("\ndone")
    {
        assert!(Instant::now() < deadline, "the load did not stop");
        std::thread::sleep(Duration::from_millis(250));
    }

    // Every acknowledged task ran, once per key, and the longest wait between two.
    let acked = acknowledged();
    let gap = acked
        .windows(2)
        .map(|pair| pair[1].1.saturating_sub(pair[0].1))
        .max()
        .unwrap_or(0);
    let retried = acked.iter().filter(|(_, _, _, tries)| *tries > 0).count();
    println!(
        "rolling upgrade of the compose cluster's three replicas: {} submits acknowledged \
         ({retried} of them after a failed try), longest gap between two acknowledgements: \
         {:.2} s",
        acked.len(),
        gap as f64 / 1e9
    );
    let ids: Vec<String> = acked.iter().map(|(_, _, id, _)| id.clone()).collect();
    let unique_ids: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique_ids.len(), ids.len(), "a key gave two tasks: {ids:?}");
    for chunk in ids.chunks(200) {
        let mut args = vec!["wait", "--timeout", "120"];
        args.extend(chunk.iter().map(String::as_str));
        ok(
            "escher wait (every acknowledged task)",
            deployment.escher("head-1", &args),
        );
    }
}

/// The interpreter of the base image (`make-base-image --python`) and of the host driver's
/// virtual environment: one interpreter for both, so that the driver's Python agrees with the
/// workers' in its minor version by construction (a system interpreter every task user can
/// read, as docs/python.md asks of a worker's).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// The cloudpickle of the image (`make-base-image`'s default) and of the driver: they must agree
/// in their major and minor version.
const CLOUDPICKLE: &str = "cloudpickle>=3.1,<3.2";

/// The target directory of the cargo that built this test (where `escher-head` is, one up).
fn target_dir(bins: &std::path::Path) -> PathBuf {
    bins.parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| bins.to_path_buf())
}

/// escher's wheel in `dir`, built as docs/python.md installs the package (`./python`) and as
/// tests/python.rs does: maturin builds the native module with the dev profile in this build's
/// target directory, so that the Python suite's build and this one share its compiled crates
/// (the second is cargo's check that nothing changed, and the packaging). Returns its path.
fn escher_wheel(dir: &std::path::Path, bins: &std::path::Path) -> PathBuf {
    let wheels = dir.join("wheels");
    ok(
        "pip wheel ./python (escher's wheel)",
        run_for(
            Command::new(SYSTEM_PYTHON)
                .args([
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--wheel-dir",
                ])
                .arg(&wheels)
                .arg("./python")
                .current_dir(root())
                .env("MATURIN_PEP517_ARGS", "--profile dev")
                .env("CARGO_TARGET_DIR", target_dir(bins)),
            Duration::from_secs(40 * 60),
        ),
    );
    let mut built: Vec<PathBuf> = std::fs::read_dir(&wheels)
        .expect("the wheel's directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "whl"))
        .collect();
    assert_eq!(built.len(), 1, "pip wheel made {built:?}");
    built.pop().expect("one wheel")
}

/// A virtual environment in `dir` with escher's `wheel` and cloudpickle, as docs/python.md
/// installs the package. Returns the environment's `python`.
fn driver_venv(dir: &std::path::Path, wheel: &std::path::Path) -> PathBuf {
    let venv = dir.join("venv");
    ok(
        "python3 -m venv (the driver's environment)",
        run_for(
            Command::new(SYSTEM_PYTHON).args(["-m", "venv"]).arg(&venv),
            Duration::from_secs(300),
        ),
    );
    let python = venv.join("bin/python");
    ok(
        "pip install escher's wheel (the driver's escher)",
        run_for(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg(wheel)
                .arg(CLOUDPICKLE),
            Duration::from_secs(600),
        ),
    );
    python
}

/// What the host's driver runs against the compose cluster: a remote function, a `TaskRef`
/// chained into a second task, an actor with two ordered calls, and a value of 300 KiB (above
/// the 100 KiB that stay in the worker's store) fetched by the driver from the worker's data
/// plane and passed by reference into another task (fetched worker to worker). Prints one
/// line, `RESULT` and a JSON object, for the test to check.
const DRIVER: &str = r#"
import hashlib, json, os, time
import escher

def payload(n, seed):
    return bytes((seed + i * 7) % 251 for i in range(n))

started = time.monotonic()
escher.init()

@escher.remote
def square(x):
    return x * x

@escher.remote
def add_one(x):
    return x + 1

@escher.remote
def who():
    import os, sys
    return {"uid": os.getuid(), "python": sys.executable}

@escher.remote
def blob(n, seed):
    return bytes((seed + i * 7) % 251 for i in range(n))

@escher.remote
def digest(data):
    import hashlib
    return hashlib.sha256(data).hexdigest()

@escher.remote
def digest_inside(box):
    # A reference inside a list stays one: the task reads it with its own escher.get.
    import hashlib, escher
    return hashlib.sha256(escher.get(box[0])).hexdigest()

@escher.remote
def put_inside(n, seed):
    # The task's own session to the heads (TLS here): a put, read back inside the task.
    import hashlib, escher
    made = escher.put(bytes((seed + i * 7) % 251 for i in range(n)))
    return type(made).__name__, hashlib.sha256(escher.get(made)).hexdigest()

@escher.remote
class Counter:
    def __init__(self, start):
        self.total = start

    def add(self, k):
        self.total += k
        return self.total

out = {}
out["square"] = escher.get(square.remote(7), timeout=120)
out["chained"] = escher.get(add_one.remote(square.remote(6)), timeout=120)
out["who"] = escher.get(who.remote(), timeout=120)
counter = Counter.remote(10)
first, second = counter.add.remote(1), counter.add.remote(5)
out["actor"] = escher.get([first, second], timeout=120)
n, seed = 300 * 1024, 3
big = blob.remote(n, seed)
value = escher.get(big, timeout=120)
out["blob_len"] = len(value)
out["blob_sha256"] = hashlib.sha256(value).hexdigest()
out["blob_sha256_on_a_worker"] = escher.get(digest.remote(big), timeout=120)
out["expected_sha256"] = hashlib.sha256(payload(n, seed)).hexdigest()
# Objects: the driver's put passed to a task, read inside a task, and one a task put.
m = 200 * 1024
put = escher.put(payload(m, 5))
out["put_sha256_on_a_worker"] = escher.get(digest.remote(put), timeout=120)
out["put_sha256_read_inside"] = escher.get(digest_inside.remote([put]), timeout=120)
out["put_expected_sha256"] = hashlib.sha256(payload(m, 5)).hexdigest()
out["made_type"], out["made_sha256"] = escher.get(put_inside.remote(m, 9), timeout=120)
out["made_expected_sha256"] = hashlib.sha256(payload(m, 9)).hexdigest()
out["seconds"] = round(time.monotonic() - started, 2)
escher.kill(counter)
escher.shutdown()
print("RESULT " + json.dumps(out), flush=True)
"#;

/// The container's address on the project's network (the Docker host reaches it directly).
fn container_address(id: &str) -> String {
    let address = ok(
        "docker inspect (an address)",
        run_for(
            Command::new("docker").args([
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                id,
            ]),
            Duration::from_secs(60),
        ),
    );
    let address = address.trim().to_string();
    assert!(!address.is_empty(), "container {id} has no address");
    address
}

/// docs/python.md on the compose cluster, as deploy/README.md tells a user to run it: every
/// worker offers Python (its `escher.python` label names the image's interpreter's version);
/// an app credential made in a head's container (`escher token create --role app --out`) and
/// the heads' addresses on the project's network are all a driver on the Docker host needs.
fn python_from_the_host(deployment: &Deployment, unique: &str, python: &std::path::Path) {
    // Every worker offers Python, with the image's interpreter and cloudpickle.
    let expected = ok(
        "the image's Python version",
        run_for(
            Command::new(SYSTEM_PYTHON)
                .args(["-c", "import platform; print(platform.python_version())"]),
            Duration::from_secs(60),
        ),
    );
    let expected = expected.trim();
    let nodes = deployment.escher_json("head-1", &["nodes"]);
    for row in nodes.as_array().expect("a list of nodes") {
        assert_eq!(
            row["node"]["labels"]["escher.python"], expected,
            "{} does not offer Python {expected}: {row}",
            row["node"]["name"]
        );
    }

    // The driver's credential: an app token, written in head-1's container and read out.
    let inside = format!("/tmp/{unique}-driver.json");
    ok(
        "escher token create --role app",
        deployment.escher(
            "head-1",
            &[
                "token",
                "create",
                "--role",
                "app",
                "--namespace",
                "drivers",
                "--description",
                "the host's Python driver",
                "--out",
                &inside,
            ],
        ),
    );
    let credential = ok(
        "reading the driver's credential",
        deployment.exec("head-1", &["cat", &inside]),
    );
    ok(
        "removing the driver's credential in the container",
        deployment.exec("head-1", &["rm", "-f", &inside]),
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let access = dir.path().join("driver.json");
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        // 0600, as the client requires of a file that holds a token.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&access)
            .and_then(|mut f| f.write_all(credential.as_bytes()))
            .expect("writing the credential");
    }
    let script = dir.path().join("driver.py");
    std::fs::write(&script, DRIVER).expect("writing the driver");
    let heads: Vec<String> = ["head-1", "head-2", "head-3"]
        .iter()
        .map(|head| {
            format!(
                "https://{}:7600",
                container_address(&deployment.containers[*head])
            )
        })
        .collect();
    let started = Instant::now();
    let out = ok(
        "the host's Python driver",
        run_for(
            Command::new(python)
                .arg(&script)
                .current_dir(dir.path())
                .env("ESCHER_HEAD", heads.join(","))
                .env("ESCHER_ACCESS_FILE", &access)
                .env_remove("ESCHER_TOKEN")
                .env_remove("ESCHER_NAMESPACE")
                .env_remove("ESCHER_PYTHON"),
            Duration::from_secs(300),
        ),
    );
    let took = started.elapsed();
    let result: Value = out
        .lines()
        .find_map(|line| line.strip_prefix("RESULT "))
        .map(|json| serde_json::from_str(json).expect("the driver's JSON"))
        .unwrap_or_else(|| panic!("the driver printed no result: {out}"));
    assert_eq!(result["square"], 49, "{result}");
    assert_eq!(result["chained"], 37, "{result}");
    assert_eq!(result["actor"], serde_json::json!([11, 16]), "{result}");
    assert_eq!(result["blob_len"], 300 * 1024, "{result}");
    assert_eq!(result["blob_sha256"], result["expected_sha256"], "{result}");
    assert_eq!(
        result["blob_sha256_on_a_worker"], result["expected_sha256"],
        "{result}"
    );
    // The image's escher package: a put passed to a task, read inside a task, put by a task.
    for key in ["put_sha256_on_a_worker", "put_sha256_read_inside"] {
        assert_eq!(
            result[key], result["put_expected_sha256"],
            "{key}: {result}"
        );
    }
    assert_eq!(result["made_type"], "ObjectRef", "{result}");
    assert_eq!(
        result["made_sha256"], result["made_expected_sha256"],
        "{result}"
    );
    // Run as a user of the namespace's own, with the image's interpreter.
    let uid = result["who"]["uid"].as_u64().expect("a uid");
    assert!((300_000..=365_535).contains(&uid), "{result}");
    println!(
        "a Python driver on the Docker host against the compose cluster (a function, a chained \
         TaskRef, an actor's two calls, a 300 KiB value by reference, a put passed to a task, \
         read inside one and made by one): {took:.2?} with the \
         interpreter's start, {} s from escher.init() to its end",
        result["seconds"]
    );
}
