//! The deployment files of `deploy/`, checked by the tools that read them:
//!
//! - the systemd units by `systemd-analyze verify` (with `ExecStart=` pointing at the binaries
//!   cargo built, since it checks that they exist) and `systemd-analyze security --offline`
//!   (their exposure score may not grow past what they have now);
//! - the Kubernetes manifests by `kubernetes-validate --strict` (the API's own OpenAPI schemas,
//!   bundled with it: it runs offline), and their structure (a three-replica StatefulSet whose
//!   peer list names its own pods, the workers given only the worker Secret, every capability
//!   dropped but the worker's, and limits) by a script;
//! - the compose file's workers (no new privileges, only the worker unit's capabilities, memory
//!   and process limits) by a script on the parsed file;
//! - `deploy/make-access`, by using what it writes: a head started on its access file, a
//!   worker joining with its worker-only credential, `escher nodes` with the admin's;
//! - the Slurm example by `bash -n`, then run with a stand-in `srun` and `escher-worker` that
//!   record what the real ones would be given.
//!
//! Each check is also shown to fail on a broken copy, so that a tool that accepts anything
//! cannot pass it. The tools: `systemd-analyze` (Debian's `systemd` package) and
//! `kubernetes-validate` (PyPI), taken from `PATH` (or `KUBERNETES_VALIDATE`), the validator
//! otherwise installed into a virtual environment under cargo's target directory.

mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(path: &str) -> PathBuf {
    root().join("deploy").join(path)
}

fn run(command: &mut Command) -> Output {
    let shown = format!("{command:?}");
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

/// Like [`run`], killing the command (and failing) if it runs longer than `limit`.
fn run_for(command: &mut Command, limit: Duration) -> Output {
    let shown = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("waiting for a child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("the output of a child")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The units, copied into `dir` with their binaries' paths replaced by cargo's.
fn units_in(dir: &Path) -> Vec<PathBuf> {
    let bins = procs::binary("escher-head")
        .parent()
        .expect("a directory")
        .to_path_buf();
    procs::binary("escher-worker");
    ["escher-head.service", "escher-worker.service"]
        .iter()
        .map(|name| {
            let unit = std::fs::read_to_string(deploy("systemd").join(name)).expect("a unit");
            assert!(unit.contains("ExecStart=/usr/local/bin/escher-"), "{name}");
            let unit = unit.replace("/usr/local/bin/", &format!("{}/", bins.display()));
            let path = dir.join(name);
            std::fs::write(&path, unit).expect("writing a unit");
            path
        })
        .collect()
}

fn systemd_analyze() -> &'static str {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "systemd-analyze is not installed: apt-get install --no-install-recommends systemd"
    );
    "systemd-analyze"
}

#[test]
fn needs_systemd_the_systemd_units_verify_and_keep_their_hardening() {
    let tool = systemd_analyze();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let units = units_in(dir.path());
    let verify =
        |units: &[PathBuf]| run(Command::new(tool).args(["verify", "--man=no"]).args(units));
    let out = verify(&units);
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "systemd-analyze verify: {}",
        text(&out)
    );

    // The exposure scores (0 to 10, in tenths for --threshold) of the units as written: the
    // head 1.2 (all but its port closed), the worker 6.2 (it must change user, signal
    // other users' processes and leave its tasks ordinary programs).
    for (unit, threshold) in [(&units[0], "15"), (&units[1], "63")] {
        let out = run(Command::new(tool)
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!("--threshold={threshold}"))
            .arg(unit));
        assert!(
            out.status.success(),
            "{} is more exposed than {threshold}/100: {}",
            unit.display(),
            text(&out)
        );
    }

    // The same checks fail on a broken unit and on a weakened one.
    let broken = dir.path().join("broken.service");
    let head = std::fs::read_to_string(&units[0]).expect("the unit");
    std::fs::write(
        &broken,
        head.replace("Restart=on-failure", "Restart=sometimes"),
    )
    .expect("writing");
    let out = verify(std::slice::from_ref(&broken));
    assert!(
        text(&out).contains("sometimes"),
        "a bad Restart= passed: {}",
        text(&out)
    );
    std::fs::write(
        &broken,
        head.replace("ProtectSystem=strict", "ProtectSystem=no")
            .replace("PrivateDevices=yes", "PrivateDevices=no")
            .replace("CapabilityBoundingSet=\n", ""),
    )
    .expect("writing");
    let out = run(Command::new(tool)
        .args(["security", "--offline=true", "--no-pager", "--threshold=15"])
        .arg(&broken));
    assert!(
        !out.status.success(),
        "a weakened unit passed: {}",
        text(&out)
    );

    // What the worker needs to run tasks as users of their own stays in its bounding set.
    let worker = std::fs::read_to_string(&units[1]).expect("the unit");
    let caps = worker
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the worker's capability bounding set");
    for cap in ["CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"] {
        assert!(
            caps.split_whitespace().any(|c| c == cap),
            "{cap} missing: {caps}"
        );
    }
    assert!(worker.contains("--require-isolation"));
    assert!(worker.contains("LoadCredential=worker.json:"));
}

/// `kubernetes-validate` (from `KUBERNETES_VALIDATE`, else `PATH`, else installed into a
/// virtual environment under cargo's target directory) and the Python it runs with (the one
/// its script names: PyYAML, which it needs, is there).
///
/// Made once per test binary: two tests need it and run in parallel, and a second
/// `python3 -m venv` into the directory the first is filling fails with "File exists".
fn kubernetes_validate() -> (PathBuf, PathBuf) {
    static ONCE: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    ONCE.get_or_init(find_or_install_kubernetes_validate)
        .clone()
}

fn find_or_install_kubernetes_validate() -> (PathBuf, PathBuf) {
    let on_path = || {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join("kubernetes-validate"))
            .find(|p| p.is_file())
    };
    let validate = match std::env::var_os("KUBERNETES_VALIDATE") {
        Some(path) => PathBuf::from(path),
        None => on_path().unwrap_or_else(|| {
            let venv =
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-validate-1.37.0");
            let bin = venv.join("bin/kubernetes-validate");
            if !bin.is_file() {
                // What an interrupted earlier run left is started again.
                let _ = std::fs::remove_dir_all(&venv);
                let out = run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
                assert!(
                    out.status.success(),
                    "python3 -m venv (Debian: apt-get install python3-venv): {}",
                    text(&out)
                );
                let out = run(Command::new(venv.join("bin/pip")).args([
                    "install",
                    "--quiet",
                    "kubernetes-validate==1.37.0",
                ]));
                assert!(
                    out.status.success(),
                    "pip install kubernetes-validate: {}",
                    text(&out)
                );
            }
            bin
        }),
    };
    let script = std::fs::read_to_string(&validate)
        .unwrap_or_else(|e| panic!("{}: {e}", validate.display()));
    let python = script
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .map(|l| PathBuf::from(l.trim()))
        .unwrap_or_else(|| panic!("{} names no interpreter", validate.display()));
    (validate, python)
}

/// Checks of meaning the schemas cannot express, on the parsed manifests (PyYAML comes with
/// the validator).
const STRUCTURE: &str = r#"
import sys, yaml
docs = []
for path in sys.argv[1:]:
    with open(path) as f:
        docs += [d for d in yaml.safe_load_all(f) if d]
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
sts = by[("StatefulSet", "escher-head")]
spec = sts["spec"]
assert spec["replicas"] == 3, spec["replicas"]
assert spec["podManagementPolicy"] == "Parallel"
headless = by[("Service", spec["serviceName"])]
assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
pod = spec["template"]["spec"]
head = next(c for c in pod["containers"] if c["name"] == "head")
env = {e["name"]: e.get("value") for e in head["env"]}
peers = env["ESCHER_HEAD_PEERS"].split(",")
want = ["%d=%s-%d.%s:7600" % (i + 1, sts["metadata"]["name"], i, spec["serviceName"]) for i in range(3)]
assert peers == want, (peers, want)
assert any(t["metadata"]["name"] == "data" for t in spec["volumeClaimTemplates"])
assert any(m["name"] == "data" and m["mountPath"] == env["ESCHER_HEAD_DATA_DIR"] for m in head["volumeMounts"])
ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
for name in ("escher-dashboard", "escher-metrics", "escher"):
    for port in by[("Service", name)]["spec"]["ports"]:
        assert port["targetPort"] in ports, (name, port)
head_secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
ds = by[("DaemonSet", "escher-worker")]["spec"]["template"]["spec"]
worker_secrets = {v["secret"]["secretName"] for v in ds["volumes"] if "secret" in v}
assert worker_secrets == {"escher-worker-credential"}, worker_secrets
assert not head_secrets & worker_secrets, (head_secrets, worker_secrets)
worker = ds["containers"][0]
assert "--require-isolation" in worker["command"]
caps = set(worker["securityContext"]["capabilities"]["add"])
assert {"SETUID", "SETGID", "CHOWN", "KILL"} <= caps, caps
assert worker["securityContext"]["capabilities"]["drop"] == ["ALL"]
assert worker["securityContext"]["allowPrivilegeEscalation"] is False
limits = worker["resources"]["limits"]
assert limits.get("memory") and limits.get("cpu"), limits
print("ok")
"#;

/// What every worker service of `deploy/compose.yaml` must set (argv: the compose file, then
/// the capabilities the worker needs): no new privileges, every capability dropped but those,
/// and a memory and a process limit.
const COMPOSE_WORKERS: &str = r#"
import sys, yaml
with open(sys.argv[1]) as f:
    compose = yaml.safe_load(f)
needed = set(sys.argv[2:])
workers = {name: s for name, s in compose["services"].items()
           if (s.get("command") or [None])[0] == "escher-worker"}
assert len(workers) >= 2, workers.keys()
for name, s in workers.items():
    assert "no-new-privileges:true" in s.get("security_opt", []), (name, s.get("security_opt"))
    assert s.get("cap_drop") == ["ALL"], (name, s.get("cap_drop"))
    assert set(s.get("cap_add", [])) == needed, (name, s.get("cap_add"), needed)
    assert s.get("mem_limit") and s.get("pids_limit"), (name, s.get("mem_limit"), s.get("pids_limit"))
print("ok")
"#;

#[test]
fn needs_pypi_the_kubernetes_manifests_validate() {
    let (validate, python) = kubernetes_validate();
    let manifests: Vec<PathBuf> = ["namespace.yaml", "head.yaml", "worker.yaml"]
        .iter()
        .map(|m| deploy("kubernetes").join(m))
        .collect();
    let out = run(Command::new(&validate)
        .args(["--strict", "--kubernetes-version", "1.30.0"])
        .args(&manifests));
    assert!(out.status.success(), "kubernetes-validate: {}", text(&out));
    let out = run(Command::new(&python)
        .arg("-c")
        .arg(STRUCTURE)
        .args(&manifests));
    assert!(
        out.status.success(),
        "the manifests' structure: {}",
        text(&out)
    );

    // The kustomization generates the Secrets from the files deploy/make-access writes.
    let kustomization =
        std::fs::read_to_string(deploy("kubernetes/kustomization.yaml")).expect("kustomization");
    for file in ["access.json", "tls-cert.pem", "tls-key.pem", "worker.json"] {
        assert!(kustomization.contains(&format!("secrets/{file}")), "{file}");
    }

    // Both checks fail on broken copies.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let head = std::fs::read_to_string(&manifests[1]).expect("head.yaml");
    let bad = dir.path().join("head.yaml");
    std::fs::write(
        &bad,
        head.replace("serviceName: escher-head", "serviceNam: escher-head"),
    )
    .expect("writing");
    let out = run(Command::new(&validate).arg("--strict").arg(&bad));
    assert!(
        !out.status.success(),
        "an unknown field passed: {}",
        text(&out)
    );
    std::fs::write(
        &bad,
        head.replace("escher-head-2.escher-head:7600", "escher-head-2:7600"),
    )
    .expect("writing");
    let out = run(Command::new(&python).arg("-c").arg(STRUCTURE).args([
        &manifests[0],
        &bad,
        &manifests[2],
    ]));
    assert!(
        !out.status.success(),
        "a wrong peer list passed: {}",
        text(&out)
    );
}

/// The compose file's workers run with no new privileges, only the capabilities the worker
/// unit has (which the unit's test shows are what tasks as their own users need), and memory
/// and process limits; a copy that keeps a capability more, or lifts the process limit, fails.
#[test]
fn needs_pypi_the_compose_workers_are_held_to_what_they_need() {
    let (_, python) = kubernetes_validate();
    let unit = std::fs::read_to_string(deploy("systemd/escher-worker.service")).expect("unit");
    let needed: Vec<String> = unit_capabilities(&unit)
        .iter()
        .map(|c| c.to_ascii_uppercase())
        .collect();
    assert!(needed.len() >= 4, "{needed:?}");
    let check = |file: &Path| {
        run(Command::new(&python)
            .arg("-c")
            .arg(COMPOSE_WORKERS)
            .arg(file)
            .args(&needed))
    };
    let out = check(&deploy("compose.yaml"));
    assert!(out.status.success(), "deploy/compose.yaml: {}", text(&out));

    let compose = std::fs::read_to_string(deploy("compose.yaml")).expect("compose.yaml");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bad = dir.path().join("compose.yaml");
    for (what, from, to) in [
        ("a capability more", "KILL]", "KILL, SYS_ADMIN]"),
        ("no process limit", "  pids_limit: 16384\n", ""),
        (
            "privileges gained",
            "no-new-privileges:true",
            "no-new-privileges:false",
        ),
    ] {
        assert!(compose.contains(from), "{from}");
        std::fs::write(&bad, compose.replacen(from, to, 1)).expect("writing");
        let out = check(&bad);
        assert!(!out.status.success(), "{what} passed: {}", text(&out));
    }
}

/// A child killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn make_access_writes_secrets_a_head_and_a_worker_use() {
    let head_bin = procs::binary("escher-head");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let secrets = dir.path().join("secrets");
    let out = run(Command::new(deploy("make-access"))
        .arg("--escher-head")
        .arg(&head_bin)
        .args([
            "--heads",
            "https://escher-head-0.escher-head:7600,https://127.0.0.1:7600",
        ])
        .arg(&secrets));
    assert!(out.status.success(), "make-access: {}", text(&out));
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(secrets.join(name)).expect(name))
            .expect("JSON")
    };
    let access = read("access.json");
    let worker = read("worker.json");
    assert!(
        access["admin_token"]
            .as_str()
            .unwrap()
            .starts_with("escher-admin-")
    );
    assert_eq!(worker["admin_token"], "");
    assert_eq!(worker["worker_token"], access["worker_token"]);
    assert_eq!(worker["ca_cert"], access["ca_cert"]);
    assert_eq!(
        access["heads"],
        serde_json::json!(["https://127.0.0.1:7600"])
    );
    assert_eq!(
        worker["heads"],
        serde_json::json!([
            "https://escher-head-0.escher-head:7600",
            "https://127.0.0.1:7600"
        ])
    );
    for name in ["access.json", "worker.json", "tls-key.pem"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(secrets.join(name))
                .expect(name)
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0, "{name} is open to others: {mode:o}");
    }
    // A second run refuses to replace the secrets.
    let again = run(Command::new(deploy("make-access"))
        .arg("--escher-head")
        .arg(&head_bin)
        .arg(&secrets));
    assert!(!again.status.success());

    // A replica started on a copy of them (as the init container makes one), a worker joining
    // with the worker's file, the admin's CLI seeing it.
    let replica = dir.path().join("replica");
    std::fs::create_dir(&replica).expect("mkdir");
    for name in ["access.json", "tls-cert.pem", "tls-key.pem"] {
        std::fs::copy(secrets.join(name), replica.join(name)).expect("copy");
    }
    let address = dir.path().join("address");
    let _head = Killed(
        Command::new(&head_bin)
            .args(["--tls", "--listen", "127.0.0.1:0"])
            .arg("--access-file")
            .arg(replica.join("access.json"))
            .arg("--address-file")
            .arg(&address)
            .env("ESCHER_HOME", dir.path().join("home"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("escher-head"),
    );
    let deadline = Instant::now() + procs::WAIT;
    let url = loop {
        if let Ok(url) = std::fs::read_to_string(&address)
            && !url.trim().is_empty()
        {
            break url.trim().replace("http://", "https://");
        }
        assert!(Instant::now() < deadline, "the head did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _worker = Killed(
        Command::new(procs::binary("escher-worker"))
            .args(["--name", "made-access", "--resources", "cpu=1", "--no-nvml"])
            .args(["--task-uids", "off", "--head", &url])
            .arg("--access-file")
            .arg(secrets.join("worker.json"))
            .arg("--state-dir")
            .arg(dir.path().join("worker"))
            .env("ESCHER_HOME", dir.path().join("worker-home"))
            .env_remove("ESCHER_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("escher-worker"),
    );
    loop {
        let out = run_for(
            Command::new(procs::binary("escher"))
                .args(["--head", &url, "nodes"])
                .env("ESCHER_ACCESS_FILE", replica.join("access.json"))
                .env_remove("ESCHER_TOKEN"),
            procs::WAIT,
        );
        if out.status.success() && text(&out).contains("made-access") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not join with the credential: {}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The worker's file is no admin credential.
    let out = run_for(
        Command::new(procs::binary("escher"))
            .args(["--head", &url, "token", "list"])
            .env("ESCHER_ACCESS_FILE", secrets.join("worker.json"))
            .env_remove("ESCHER_TOKEN"),
        procs::WAIT,
    );
    assert!(
        !out.status.success(),
        "the worker's file listed tokens: {}",
        text(&out)
    );
}

#[test]
fn the_slurm_example_starts_one_worker_per_node_with_the_allocation() {
    let script = deploy("slurm/escher-workers.sbatch");
    let out = run(Command::new("bash").arg("-n").arg(&script));
    assert!(out.status.success(), "bash -n: {}", text(&out));

    // Stand-ins: srun runs its command as two nodes would; escher-worker records its
    // arguments.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let record = dir.path().join("record");
    let write = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(&path, body).expect("writing a stand-in");
        let mut perms = std::fs::metadata(&path).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).expect("chmod");
    };
    write(
        "srun",
        "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n\
         for n in 1 2; do TMPDIR=\"$STANDIN_TMP/$n\" \"$@\"; done\n",
    );
    write(
        "escher-worker",
        &format!(
            "#!/bin/bash\nprintf '%s\\n' \"$@\" >> {}\necho --- >> {}\n",
            record.display(),
            record.display()
        ),
    );
    write("hostname", "#!/bin/bash\necho node7\n");
    let credential = dir.path().join("worker.json");
    std::fs::write(&credential, "{}").expect("writing");
    let mut perms = std::fs::metadata(&credential).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    std::fs::set_permissions(&credential, perms.clone()).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sbatch = |credential: &Path| {
        run(Command::new("bash")
            .arg(&script)
            .env("PATH", &path)
            .env("ESCHER_WORKER_CREDENTIAL", credential)
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_CPUS_ON_NODE", "16")
            .env("SLURM_MEM_PER_NODE", "64000")
            .env("STANDIN_TMP", dir.path())
            .env_remove("SLURM_TMPDIR"))
    };
    // A credential others may read is refused.
    let out = sbatch(&credential);
    assert!(
        !out.status.success() && text(&out).contains("chmod 600"),
        "{}",
        text(&out)
    );
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&credential, perms).expect("chmod");
    let out = sbatch(&credential);
    assert!(out.status.success(), "the sbatch script: {}", text(&out));
    let recorded = std::fs::read_to_string(&record).expect("the stand-in ran");
    let runs: Vec<Vec<&str>> = recorded
        .split("---\n")
        .filter(|r| !r.trim().is_empty())
        .map(|r| r.lines().collect())
        .collect();
    assert_eq!(runs.len(), 2, "one worker per node: {recorded}");
    let args = &runs[0];
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| *a == flag)
            .unwrap_or_else(|| panic!("{flag}: {args:?}"));
        args[i + 1]
    };
    assert_eq!(after("--access-file"), credential.display().to_string());
    assert_eq!(after("--name"), "slurm-4242-node7");
    assert_eq!(after("--cpus"), "16");
    assert_eq!(after("--memory"), "64000");
    assert_eq!(after("--labels"), "slurm-job=4242,slurm-node=node7");
    assert!(after("--state-dir").starts_with(&dir.path().join("1").display().to_string()));
}

/// The capabilities a unit's `CapabilityBoundingSet=` line names, lower case without `CAP_`
/// (as setpriv and Kubernetes spell them, up to case).
fn unit_capabilities(unit: &str) -> Vec<String> {
    unit.lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("a CapabilityBoundingSet= line")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect()
}

/// The processes running `program` (by its file name: the worker starts it by its full path)
/// with the arguments `args`.
fn processes_running(program: &str, args: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let words: Vec<&[u8]> = cmdline
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .collect();
            words.len() == args.len() + 1
                && Path::new(std::str::from_utf8(words[0]).unwrap_or_default())
                    .file_name()
                    .is_some_and(|name| name == program)
                && words[1..].iter().zip(args).all(|(w, a)| *w == a.as_bytes())
        })
        .collect()
}

#[test]
fn needs_root_the_worker_units_capabilities_run_and_cancel_tasks_as_their_own_users() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test starts a worker as root with only the unit's capabilities: run it as root"
    );
    let unit = std::fs::read_to_string(deploy("systemd/escher-worker.service")).expect("unit");
    let caps = unit_capabilities(&unit);
    // The DaemonSet adds the same ones.
    let daemonset = std::fs::read_to_string(deploy("kubernetes/worker.yaml")).expect("manifest");
    let added = daemonset
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: "))
        .expect("the DaemonSet's added capabilities");
    let mut k8s: Vec<String> = added
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_ascii_lowercase())
        .collect();
    let mut sorted = caps.clone();
    sorted.sort();
    k8s.sort();
    assert_eq!(
        sorted, k8s,
        "the unit and the DaemonSet give the worker different capabilities"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let home = dir.path().join("home");
    let address = dir.path().join("address");
    let _head = Killed(
        Command::new(procs::binary("escher-head"))
            .args(["--listen", "127.0.0.1:0"])
            .arg("--address-file")
            .arg(&address)
            .env("ESCHER_HOME", &home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("escher-head"),
    );
    let deadline = Instant::now() + procs::WAIT;
    let url = loop {
        if let Ok(url) = std::fs::read_to_string(&address)
            && !url.trim().is_empty()
        {
            break url.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the head did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    // As systemd starts it: root, the unit's bounding set, no new privileges.
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let worker_log = dir.path().join("worker.log");
    let mut worker = Killed(
        Command::new("setpriv")
            .args(["--bounding-set", &bounding, "--no-new-privs"])
            .arg(procs::binary("escher-worker"))
            .args([
                "--head",
                &url,
                "--name",
                "unit-caps",
                "--no-nvml",
                "--grace",
                "1",
            ])
            .args(["--task-uids", "364900-364999", "--require-isolation"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--log-dir")
            .arg(dir.path().join("logs"))
            .env("ESCHER_HOME", &home)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&worker_log).expect("a log file"))
            .spawn()
            .expect("setpriv"),
    );
    let escher = |args: &[&str]| {
        let out = run_for(
            Command::new(procs::binary("escher"))
                .arg("--head")
                .arg(&url)
                .args(args)
                .env("ESCHER_HOME", &home)
                .env_remove("ESCHER_TOKEN"),
            procs::WAIT,
        );
        assert!(
            out.status.success(),
            "escher {args:?}: {}\nthe worker's log:\n{}",
            text(&out),
            std::fs::read_to_string(&worker_log).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The worker starts (it refuses to, with --require-isolation, if it cannot change user)
    // and joins.
    let deadline = Instant::now() + procs::WAIT;
    while !escher(&["nodes"]).contains("unit-caps") {
        if let Some(status) = worker.0.try_wait().expect("the worker's status") {
            panic!(
                "the worker exited ({status}) under the unit's capabilities {caps:?}:\n{}",
                std::fs::read_to_string(&worker_log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the worker did not join");
        std::thread::sleep(Duration::from_millis(100));
    }
    let submitted = escher(&["submit", "--wait", "--", "id", "-u"]);
    let id = submitted.lines().next().expect("an id").trim().to_string();
    let uid: u32 = escher(&["logs", &id]).trim().parse().expect("a uid");
    assert!(
        (364_900..=364_999).contains(&uid),
        "the task ran as uid {uid}"
    );

    // A task of another user is stopped when cancelled: nothing of it is left running.
    let marker = ["3600.364"];
    let submitted = escher(&["submit", "--", "sleep", marker[0]]);
    let id = submitted.lines().next().expect("an id").trim().to_string();
    let deadline = Instant::now() + procs::WAIT;
    while processes_running("sleep", &marker).is_empty() {
        assert!(Instant::now() < deadline, "the task never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    escher(&["cancel", &id]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_running("sleep", &marker);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for pid in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!(
                "the cancelled task's process is still running ({left:?}): the unit's capabilities cannot stop it"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
