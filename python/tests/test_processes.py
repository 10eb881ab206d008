"""A cluster of real processes (``escher-head`` and two ``escher-worker``s, the binaries of this
repository), driven from Python by a client that connects with the access file: remote
functions on workers that run Python tasks because ``ESCHER_PYTHON`` says so, a worker killed
under a running Python task (the task is retried elsewhere, never run twice at once; run as
root, the interpreters run as the namespace's own user, so this interpreter and its packages
must be readable by others, as a Debian python3 and a virtual environment made by
tests/python.rs are), and a result past its namespace's quota."""

import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


def binary(name: str) -> str:
    folder = pathlib.Path(os.environ.get("ESCHER_TEST_BIN_DIR", ROOT / "target" / "debug"))
    path = folder / name
    assert path.is_file(), (
        f"{path} does not exist: build the binaries (cargo build --workspace --bins), or run "
        f"the suite through cargo test --workspace, which builds them"
    )
    return str(path)


def wait_until(probe, what: str, limit: float = 60):
    deadline = time.time() + limit
    while True:
        value = probe()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def others_can_run(program: str) -> bool:
    """Whether a user other than this one may run ``program`` (and read its environment's
    packages): every directory on the way searchable, the files readable, by others."""
    real = pathlib.Path(os.path.realpath(program))
    prefix = pathlib.Path(sys.prefix)
    for path in [*real.parents, *prefix.parents, prefix]:
        if path.exists() and not os.stat(path).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IROTH)


# How each parametrization of ``processes`` starts its workers: (names, extra environment,
# extra arguments); ``None`` in the environment removes the variable. Where ``PATH`` is
# ``"{bin}"`` it is the folder of a python3 made for the case (see ``python3_folder``).
NO_PYTHON_CASES = ["one-without-python", "no-python3-on-path", "python3-without-cloudpickle"]
# Cases whose workers run in the host's PID namespace (`--no-pid-namespace`).
HOST_PID_CASES = ("one-worker", "one-worker-without-cgroups")


def open_folder(prefix: str) -> pathlib.Path:
    """A new folder every user may pass (pytest's own are private): what a worker run as root
    checks as its tasks' user must be reachable by that user."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


def python3_folder(tmp_path: pathlib.Path, case: str, made: list) -> str:
    """A folder for ``PATH`` with (or without) a ``python3``: this interpreter's own folder
    (a virtual environment's ``bin``, with cloudpickle), an empty one, one whose ``python3``
    runs this interpreter without its site packages (so without cloudpickle). What it creates
    goes into ``made``, for the fixture to remove."""
    if case == "python3-on-path":
        return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    folder = open_folder(f"escher-path-{case}-")
    made.append(folder)
    if case == "python3-without-cloudpickle":
        script = folder / "python3"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
        script.chmod(0o755)
    return str(folder)


def private_venv(made: list) -> pathlib.Path:
    """A virtual environment of this Python, with cloudpickle (a ``.pth`` naming this
    environment's packages), under a directory only its owner may enter (0700), itself in one
    every user may pass: as one made under a private home is (pyenv's or conda's under
    ``/root``)."""
    outer = open_folder("escher-private-")
    made.append(outer)
    home = outer / "private-home"
    home.mkdir()
    home.chmod(0o700)
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    import cloudpickle

    site, = venv.glob("lib/python*/site-packages")
    packages = os.path.dirname(os.path.dirname(os.path.abspath(cloudpickle.__file__)))
    (site / "driver-packages.pth").write_text(packages + "\n")
    return venv


def other_cloudpickle() -> str:
    """A cloudpickle release whose major or minor version differs from this driver's."""
    import cloudpickle

    return "3.0.0" if cloudpickle.__version__.startswith("3.1.") else "3.1.1"


def venv_with_cloudpickle(version: str) -> pathlib.Path:
    """A virtual environment of this Python, in a folder every user may pass, with only
    cloudpickle ``version`` installed (from PyPI)."""
    venv = open_folder("escher-other-cloudpickle-") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", f"cloudpickle=={version}"], check=True,
                   timeout=600)
    return venv


@pytest.fixture(params=["two-workers"])
def processes(request, tmp_path):
    """A head and workers (two with ESCHER_PYTHON by default; see ``NO_PYTHON_CASES`` and
    ``python3-on-path`` for one worker that finds, or does not find, Python by itself); every
    process is killed at the end. ``start_worker(name, env, args)`` starts one more."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, ESCHER_HOME=str(home))
    for key in ("ESCHER_HEAD", "ESCHER_TOKEN", "ESCHER_TASK_TOKEN", "ESCHER_NAMESPACE",
                "ESCHER_PYTHON"):
        env.pop(key, None)
    started = []

    def start(args, name, extra=None):
        log = open(tmp_path / f"{name}.log", "wb")
        proc = subprocess.Popen(args, env=dict(env, **(extra or {})), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(proc)
        return proc

    address = tmp_path / "head-url"
    start([binary("escher-head"), "--listen", "127.0.0.1:0", "--address-file", str(address),
           "--heartbeat-interval-ms", "200", "--heartbeat-timeout-ms", "2000",
           "--namespace-result-bytes", "100000"], "head")
    url = wait_until(lambda: address.exists() and address.read_text().strip(), "the head")
    # As root, workers run each namespace's tasks as a user of their own, which must be able
    # to run this interpreter; where it cannot (a Python under /root), they run tasks as
    # themselves, and the driver checks that instead.
    users = [] if others_can_run(sys.executable) else ["--task-uids", "off"]
    with_python = {"ESCHER_PYTHON": sys.executable, "ESCHER_PYTHON_SLOTS": "2"}
    case = request.param
    if case == "private-venv":
        # What a new user runs: a root worker that gives each namespace a user of its own.
        users = []
    made = []
    # The cases that check what fences tasks in the host's PID namespace (the cgroups, their
    # sweep by the next worker, process groups) run there; the others in the PID namespace a
    # worker run as root gives itself by default.
    host_pids = ["--no-pid-namespace"] if case in HOST_PID_CASES else []

    def start_worker(name, extra=None, args=()):
        return start([binary("escher-worker"), "--head", url, "--name", name, "--resources",
                      "cpu=2", *users, *host_pids, *args], name, extra)

    workers = {}
    if case == "one-without-python":
        workers["nopy"] = start_worker("nopy", {"ESCHER_PYTHON": "none"})
    elif case in NO_PYTHON_CASES or case == "python3-on-path":
        # No ESCHER_PYTHON: the worker looks for python3 on PATH by itself.
        workers["auto"] = start_worker("auto", {"PATH": python3_folder(tmp_path, case, made)})
    elif case == "private-venv":
        venv = private_venv(made)
        path = str(venv / "bin") + os.pathsep + os.environ.get("PATH", "")
        workers["auto"] = start_worker("auto", {"PATH": path})
    elif case == "one-worker-without-cgroups":
        workers["nocg"] = start_worker("nocg", with_python, ["--no-task-cgroups"])
    elif case == "one-worker":
        workers["w1"] = start_worker("w1", with_python)
    elif case == "pip-env":
        # Its own home: where a worker runs tasks as itself, their pip environments go there
        # (a task user's go to that user's home).
        worker_home = open_folder("escher-pip-home-")
        made.append(worker_home)
        workers["pip"] = start_worker("pip", dict(with_python, ESCHER_PYTHON_SLOTS="4",
                                                  HOME=str(worker_home)))
    elif case in ("other-cloudpickle", "bare-interpreter"):
        import cloudpickle

        version = other_cloudpickle() if case == "other-cloudpickle" else cloudpickle.__version__
        venv = venv_with_cloudpickle(version)
        made.append(venv.parent)
        workers["other"] = start_worker("other", {"ESCHER_PYTHON": str(venv / "bin" / "python"),
                                                  "ESCHER_PYTHON_SLOTS": "1"})
    else:
        for name in ("wa", "wb"):
            workers[name] = start_worker(name, with_python)
    access = json.loads((home / "access.json").read_text())
    yield {"url": url, "home": str(home), "admin": access["admin_token"], "workers": workers,
           "logs": tmp_path, "case": case, "made": made,
           "start_worker": lambda name, extra=with_python: start_worker(name, extra)}
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def worker_log(processes, name: str) -> str:
    return (processes["logs"] / f"{name}.log").read_text(errors="replace")


DRIVER = r'''
import json, os, pathlib, signal, sys, time
import escher

info = escher.init()  # ESCHER_HEAD and the access file in ESCHER_HOME
wait = lambda: len(escher.nodes()) >= 2
deadline = time.time() + 60
while not wait():
    assert time.time() < deadline, "the workers never joined"
    time.sleep(0.1)

@escher.remote
def square(x):
    return x * x

assert escher.get([square.remote(i) for i in range(10)]) == [i * i for i in range(10)]
print("remote functions ran on worker processes")

trace = pathlib.Path(os.environ["TRACE"])

@escher.remote(retries=2)
def long_task(path):
    import os, time
    attempt = int(os.environ["ESCHER_ATTEMPT"])
    with open(path, "a") as f:
        f.write(json.dumps({"attempt": attempt, "node": int(os.environ["ESCHER_NODE_ID"]),
                            "pid": os.getpid(), "pidns": os.readlink("/proc/self/ns/pid"),
                            "uid": os.getuid(),
                            "at": time.time()}) + "\n")
    if attempt == 1:
        time.sleep(600)
    return attempt

ref = long_task.remote(str(trace))
first = None
deadline = time.time() + 60
while first is None:
    assert time.time() < deadline, "the first attempt never started"
    if trace.exists() and trace.read_text().strip():
        first = json.loads(trace.read_text().splitlines()[0])
    time.sleep(0.05)
names = {n["id"]: n["name"] for n in escher.cluster_status()["nodes"]}
pids = json.loads(os.environ["WORKER_PIDS"])
os.kill(pids[names[first["node"]]], signal.SIGKILL)
killed_at = time.time()
assert escher.get(ref, timeout=120) == 2
attempts = [json.loads(line) for line in trace.read_text().splitlines()]
assert [a["attempt"] for a in attempts] == [1, 2], attempts
second = attempts[1]
assert second["node"] != first["node"], attempts
assert second["at"] > killed_at, attempts
def alive(pid, pidns):
    # The task's pid is its PID namespace's (a worker run as root has one of its own): find
    # the host's process of that namespace and pid. A zombie does not run.
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.readlink(proc / "ns" / "pid") != pidns:
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        nspid = next(l for l in status.splitlines() if l.startswith("NSpid:")).split()[-1]
        state = next(l for l in status.splitlines() if l.startswith("State:"))
        if int(nspid) == pid and "zombie" not in state:
            return True
    return False

assert not alive(first["pid"], first["pidns"]), "the killed worker's interpreter outlived it"
# A worker that may change user runs a namespace's Python tasks as that namespace's user, as it
# runs its command tasks: never as root.
if os.environ["ISOLATED"] == "yes":
    assert first["uid"] != 0 and second["uid"] == first["uid"], attempts
else:
    assert first["uid"] == os.getuid(), attempts
print("retried on node", second["node"], "after node", first["node"], "was killed")
'''


def test_a_process_cluster_runs_python_tasks_and_retries_a_killed_workers_task(processes):
    pids = {name: proc.pid for name, proc in processes["workers"].items()}
    # Where the tasks write, whichever user they run as.
    shared = tempfile.mkdtemp(prefix="escher-py-trace-")
    os.chmod(shared, 0o777)
    try:
        isolated = os.getuid() == 0 and others_can_run(sys.executable)
        done = run_python(DRIVER, ESCHER_HEAD=processes["url"], ESCHER_HOME=processes["home"],
                          TRACE=os.path.join(shared, "trace"), WORKER_PIDS=json.dumps(pids),
                          ISOLATED="yes" if isolated else "no")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    logs = "".join(p.read_text(errors="replace")[-3000:]
                   for p in processes["logs"].glob("*.log"))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    assert "remote functions ran on worker processes" in done.stdout
    assert "retried on node" in done.stdout


def test_a_result_past_the_namespace_quota_fails_its_task_saying_so(processes):
    code = (
        "import escher, time\n"
        f"admin = escher._escher.connect({processes['url']!r}, {processes['admin']!r}, None)\n"
        "token = admin.create_token('app', 'quota', '')\n"
        f"escher.init({processes['url']!r}, token=token)\n"
        "deadline = time.time() + 60\n"
        "while len(escher.nodes()) < 2:\n"
        "    assert time.time() < deadline\n"
        "    time.sleep(0.1)\n"
        # Results the head keeps (up to 100 KiB each; larger ones stay on their worker as
        # objects, held to --namespace-object-bytes instead): the head's quota here is
        # 100,000 bytes, so the first 60,000-byte result fits and the second does not.
        "@escher.remote\n"
        "def big():\n"
        "    return b'x' * 60_000\n"
        "assert len(big.remote().result(timeout=60)) == 60_000\n"
        "try:\n"
        "    big.remote().result(timeout=60)\n"
        "except escher.TaskError as e:\n"
        "    print('refused:', e)\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused:" in done.stdout and "quota" in done.stdout.lower(), done.stdout


@pytest.mark.parametrize("processes", NO_PYTHON_CASES, indirect=True)
def test_a_python_task_on_a_cluster_without_python_waits_saying_so(processes):
    """A worker told to offer no Python, one with no python3 on its PATH and one whose python3
    cannot import cloudpickle offer no Python slots (their logs say why); a Python task waits
    with a reason that says so, and command tasks run."""
    true = shutil.which("true")
    code = (
        "import escher, time\n"
        f"escher.init({processes['url']!r}, token={processes['admin']!r})\n"
        "deadline = time.time() + 60\n"
        "while len(escher.nodes()) < 1:\n"
        "    assert time.time() < deadline\n"
        "    time.sleep(0.1)\n"
        "@escher.remote\n"
        "def here():\n"
        "    return 1\n"
        "ref = here.remote()\n"
        "deadline = time.time() + 30\n"
        "while not (escher.task_info(ref)['reason'] or ''):\n"
        "    assert time.time() < deadline\n"
        "    time.sleep(0.1)\n"
        "info = escher.task_info(ref)\n"
        "print(info['state'], '|', info['reason'])\n"
        "names = [r['name'] for n in escher.cluster_status()['nodes'] for r in n['resources']]\n"
        "print('resources', names)\n"
        f"command = escher.submit([{true!r}])\n"
        "print('command', escher.get(command, timeout=60))\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pending |" in done.stdout, done.stdout
    assert "shared/python" in done.stdout and "no live node" in done.stdout, done.stdout
    assert "'shared/python'" not in done.stdout.split("resources", 1)[1], done.stdout
    assert "command 0" in done.stdout
    name, = processes["workers"]
    log = worker_log(processes, name)
    why = {
        "one-without-python": "ESCHER_PYTHON turns them off",
        "no-python3-on-path": "no python3 on PATH",
        "python3-without-cloudpickle": "cannot import cloudpickle",
    }[processes["case"]]
    assert "no Python tasks on this worker" in log and why in log, log[-3000:]


@pytest.mark.parametrize("processes", ["python3-on-path"], indirect=True)
def test_a_worker_finds_python3_on_its_path_by_itself(processes):
    """Without ESCHER_PYTHON, a worker whose PATH has a python3 that can import cloudpickle
    offers Python slots (one per CPU) and runs remote functions with it."""
    code = (
        "import escher, time\n"
        f"escher.init({processes['url']!r}, token={processes['admin']!r})\n"
        "deadline = time.time() + 60\n"
        "def slots():\n"
        "    nodes = escher.cluster_status()['nodes']\n"
        "    found = [r['total'] for n in nodes for r in n['resources']\n"
        "             if r['name'] == 'shared/python']\n"
        "    return found[0] if found else None\n"
        "# A node is listed once registered; its resources once its stream is attached.\n"
        "while slots() is None:\n"
        "    assert time.time() < deadline, escher.cluster_status()\n"
        "    time.sleep(0.1)\n"
        "print('slots', slots())\n"
        "@escher.remote\n"
        "def where():\n"
        "    import sys\n"
        "    return sys.prefix\n"
        "print('prefix', where.remote().result(timeout=60))\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    log = worker_log(processes, "auto")
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    assert "slots 2" in done.stdout, done.stdout
    assert f"prefix {sys.prefix}" in done.stdout, done.stdout
    assert "Python tasks run with the python3 found on PATH" in log, log[-3000:]


ESCAPER = r'''
import json, os, pathlib, signal, sys, time
import escher

escher.init()  # ESCHER_HEAD and the access file in ESCHER_HOME
deadline = time.time() + 60
while len(escher.nodes()) < 1:
    assert time.time() < deadline, "the worker never joined"
    time.sleep(0.1)
shared = pathlib.Path(os.environ["SHARED"])

@escher.remote
def escape(path):
    """Starts a process in a session (and process group) of its own, then sleeps."""
    import os, subprocess, time
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    record = {"child": child.pid, "interpreter": os.getpid(),
              "attempt": int(os.environ["ESCHER_ATTEMPT"])}
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(record))
    os.rename(path + ".tmp", path)
    time.sleep(600)

def alive(pid):
    # An exited process that nobody reaped yet (a zombie) does not run.
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"

def started(name, ref):
    path = shared / name
    deadline = time.time() + 60
    while not path.exists():
        assert time.time() < deadline, f"{name} never started: {escher.task_info(ref)}"
        time.sleep(0.05)
    return json.loads(path.read_text())

def gone(pid, what, limit=30):
    deadline = time.time() + limit
    while alive(pid):
        assert time.time() < deadline, f"{what} (pid {pid}) still runs"
        time.sleep(0.05)

# Cancelled: the interpreter goes, and with it what it started, outside its group too.
ref = escape.remote(str(shared / "cancelled"))
run = started("cancelled", ref)
child = run["child"]
assert alive(child) and os.getsid(child) != os.getsid(run["interpreter"]), run
escher.cancel(ref)
gone(run["interpreter"], "the cancelled task's interpreter")
if os.environ["CGROUPS"] == "yes":
    gone(child, "the process the cancelled task started in a session of its own")
    print("cancel killed the escaped process")
else:
    # Held by its process group only: what left the group is beyond reach (the worker's log
    # says so at start).
    assert alive(child)
    os.kill(child, signal.SIGKILL)
    print("without cgroups, cancel killed the interpreter")
    sys.exit(0)

# The worker and its fence supervisor SIGKILLed together: the next worker that starts on the
# host kills what the dead one left in its cgroups.
ref = escape.remote(str(shared / "killed"))
run = started("killed", ref)
child = run["child"]
assert alive(child), run
print(json.dumps({"kill": True}), flush=True)
line = sys.stdin.readline()  # the test killed the worker and its supervisor, and started one
gone(child, "the process a task of the SIGKILLed worker started in a session of its own")
print("the next worker killed what the dead one left")
'''


def supervisor_of(pid: int) -> int:
    """The fence supervisor (``escher-fence``) the worker ``pid`` started."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid and name == "escher-fence":
            return int(entry)
    raise AssertionError(f"worker {pid} has no escher-fence supervisor")


def alive(pid: int) -> bool:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def run_escaper(processes, cgroups: bool) -> subprocess.Popen:
    shared = tempfile.mkdtemp(prefix="escher-py-escape-")
    os.chmod(shared, 0o777)
    env = dict(os.environ, ESCHER_HEAD=processes["url"], ESCHER_HOME=processes["home"],
               SHARED=shared, CGROUPS="yes" if cgroups else "no")
    for key in ("ESCHER_TOKEN", "ESCHER_TASK_TOKEN", "ESCHER_NAMESPACE"):
        env.pop(key, None)
    driver = subprocess.Popen([sys.executable, "-c", ESCAPER], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    driver.shared = shared  # type: ignore[attr-defined]
    return driver


@pytest.mark.parametrize("processes", ["one-worker"], indirect=True)
def test_what_a_python_task_starts_outside_its_group_dies_with_it(processes):
    """A Python task's interpreter is in a cgroup of the worker's: a process it started in a
    session of its own (``setsid``) is killed when the task is cancelled, and, when the worker
    is SIGKILLed together with its fence supervisor, by the next worker that starts."""
    wait_until(lambda: "cgroup of its own" in worker_log(processes, "w1"),
               "the worker to say that its tasks run in cgroups")
    worker = processes["workers"]["w1"]
    driver = run_escaper(processes, cgroups=True)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        line = driver.stdout.readline()
        assert "cancel killed the escaped process" in line, line + driver.stderr.read()
        line = driver.stdout.readline()
        assert '"kill"' in line, line + driver.stderr.read()
        fence = supervisor_of(worker.pid)
        os.kill(fence, signal.SIGKILL)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        wait_until(lambda: not alive(fence), "the supervisor to die")
        # Nobody is left to kill the task's processes until a worker starts on this host (here
        # w2; on a shared machine, another test's worker may start first and sweep them).
        time.sleep(1)
        escaped = json.loads(pathlib.Path(driver.shared, "killed").read_text())["child"]
        if not alive(escaped):
            print("the escaped process was swept before w2 started, by another worker")
        processes["start_worker"]("w2")
        driver.stdin.write("started\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=120)
        # (Any worker that starts on this host sweeps; w2's log says so where it was first.)
        log = worker_log(processes, "w2")
        assert driver.returncode == 0, out + err + log[-3000:]
        assert "the next worker killed what the dead one left" in out, out + err
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()
        shutil.rmtree(driver.shared, ignore_errors=True)  # type: ignore[attr-defined]


@pytest.mark.parametrize("processes", ["one-worker-without-cgroups"], indirect=True)
def test_without_task_cgroups_a_cancelled_python_tasks_interpreter_still_goes(processes):
    """``--no-task-cgroups``: Python tasks run, and cancelling one kills its interpreter (its
    process group), though not what left the group."""
    driver = run_escaper(processes, cgroups=False)
    try:
        out, err = driver.communicate(timeout=120)
        log = worker_log(processes, "nocg")
        assert driver.returncode == 0, out + err + log[-3000:]
        assert "without cgroups, cancel killed the interpreter" in out, out + err
        assert "no cgroup for tasks" in log, log[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()
        shutil.rmtree(driver.shared, ignore_errors=True)  # type: ignore[attr-defined]


NODE_LABEL = r'''
import escher, json, time
deadline = time.time() + 60
while len(escher.nodes()) < 1:
    assert time.time() < deadline, "the worker never joined"
    time.sleep(0.1)
node, = escher.cluster_status()["nodes"]
print("label", json.dumps(node["labels"].get("escher.python")),
      json.dumps(node["labels"].get("escher.cloudpickle")))
'''


@pytest.mark.parametrize("processes", ["private-venv"], indirect=True)
def test_a_root_worker_refuses_an_interpreter_its_tasks_users_cannot_run(processes):
    """A worker run as root runs each namespace's tasks as a user of its own. Its python3 (a
    virtual environment under a 0700 directory, as one made under pyenv or conda in /root is)
    runs as root but not as those users: the worker checks it as they would run it and offers
    no Python slots, saying why in its log and its node's ``escher.python`` label; a remote
    function waits with the reason every unplaceable task gets, instead of failing with
    ``Permission denied``. Named by ``ESCHER_PYTHON``, the same interpreter stops the worker
    at start, saying why. (Not as root, tasks run as the worker's user, who may run it.)"""
    private = str(processes["made"][0] / "private-home")
    code = (
        "import escher, time\n"
        f"escher.init({processes['url']!r}, token={processes['admin']!r})\n"
        + NODE_LABEL +
        "@escher.remote\n"
        "def where():\n"
        "    import sys\n"
        "    return sys.prefix\n"
        "ref = where.remote()\n"
        "try:\n"
        "    print('ran in', ref.result(timeout=5))\n"
        "except escher.GetTimeoutError as e:\n"
        "    print('waits |', e)\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    log = worker_log(processes, "auto")
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    named = processes["start_worker"](
        "named", {"ESCHER_PYTHON": os.path.join(private, "venv", "bin", "python")})
    if os.getuid() != 0:
        assert "ran in " + os.path.join(private, "venv") in done.stdout, done.stdout
        assert 'label "3.' in done.stdout, done.stdout
        return
    assert "waits |" in done.stdout and "shared/python" in done.stdout, done.stdout
    assert "no live node" in done.stdout, done.stdout
    assert "Permission denied" not in done.stdout, done.stdout
    assert f'label "none:closed-to-task-users:{private}" null' in done.stdout, done.stdout
    assert "no Python tasks on this worker" in log, log[-3000:]
    assert f"{private} (mode 700) is closed to it" in log, log[-3000:]
    assert "--task-uids off" in log, log[-3000:]
    assert named.wait(timeout=60) != 0
    log = worker_log(processes, "named")
    assert "cannot run Python tasks" in log and f"{private} (mode 700)" in log, log[-3000:]


@pytest.mark.parametrize("processes", ["other-cloudpickle"], indirect=True)
def test_a_worker_with_another_cloudpickle_says_so_naming_both_versions(processes):
    """A worker whose interpreter has another cloudpickle than the driver's (pinned from PyPI
    in a virtual environment of its own) fails the driver's calls, of a function and of an
    actor, with a message that names both versions and what to do, before anything is
    unpickled: never with what unpickling a function of one cloudpickle with another raises
    (``AttributeError: Can't get attribute '_function_setstate'``)."""
    import cloudpickle

    theirs = other_cloudpickle()
    code = (
        "import escher, time\n"
        f"escher.init({processes['url']!r}, token={processes['admin']!r})\n"
        + NODE_LABEL +
        "@escher.remote\n"
        "def double(x):\n"
        "    return 2 * x\n"
        "try:\n"
        "    print('ran', double.remote(2).result(timeout=60))\n"
        "except escher.TaskError as e:\n"
        "    print('failed |', str(e).replace('\\n', ' '))\n"
        "@escher.remote\n"
        "class Keeper:\n"
        "    def ping(self):\n"
        "        return 'pong'\n"
        "keeper = Keeper.remote()\n"
        "for attempt in (1, 2):\n"
        "    try:\n"
        "        print('actor ran', keeper.ping.remote().result(timeout=60))\n"
        "    except Exception as e:\n"
        "        print(f'actor {attempt} failed', type(e).__name__, '|',\n"
        "              str(e).replace('\\n', ' '))\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    log = worker_log(processes, "other")
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    assert f'"{theirs}"' in done.stdout.split("label ", 1)[1].splitlines()[0], done.stdout
    failed = done.stdout.split("failed |", 1)[-1].split("actor 1 failed", 1)[0]
    assert "failed |" in done.stdout, done.stdout
    assert f"cloudpickle {cloudpickle.__version__}" in failed, failed
    assert f"cloudpickle {theirs}" in failed, failed
    assert f"pip install cloudpickle=={theirs}" in failed, failed
    assert "AttributeError" not in failed, failed
    # An actor: its constructor is refused the same way, before anything is unpickled, and
    # every call (the first and the next) says why, never an AttributeError.
    assert "actor ran" not in done.stdout, done.stdout
    for attempt in (1, 2):
        said = done.stdout.split(f"actor {attempt} failed", 1)[-1].splitlines()[0]
        assert f"actor {attempt} failed" in done.stdout, done.stdout
        assert f"cloudpickle {cloudpickle.__version__}" in said, said
        assert f"cloudpickle {theirs}" in said, said
        assert "AttributeError" not in said, said


@pytest.mark.parametrize("processes", ["bare-interpreter"], indirect=True)
def test_a_runtime_env_reaches_a_worker_whose_python_has_only_cloudpickle(processes, tmp_path):
    """``runtime_env`` (environment variables and a working directory) travels with the
    function and with an actor's class: a worker whose interpreter has cloudpickle only (the
    driver's version, from PyPI), no escher package, runs the calls, and the actor, in the
    shipped directory with the variables set, and its next task without them."""
    work = open_folder("escher-working-dir-")
    processes["made"].append(work)
    (work / "shipped_helpers.py").write_text("def greet(name):\n    return 'hello ' + name\n")
    code = (
        "import escher, time\n"
        f"escher.init({processes['url']!r}, token={processes['admin']!r})\n"
        + NODE_LABEL +
        f"env = {{'working_dir': {str(work)!r}, 'env_vars': {{'GREETED': 'world'}}}}\n"
        "@escher.remote(runtime_env=env)\n"
        "def greet():\n"
        "    import os, sys, shipped_helpers\n"
        "    return shipped_helpers.greet(os.environ['GREETED']), 'escher' in sys.modules\n"
        "@escher.remote\n"
        "def after():\n"
        "    import os\n"
        "    return os.environ.get('GREETED')\n"
        "print('greeted', greet.remote().result(timeout=60))\n"
        "print('after', after.remote().result(timeout=60))\n"
        "@escher.remote(runtime_env=env)\n"
        "class Greeter:\n"
        "    def __init__(self):\n"
        "        import os, shipped_helpers\n"
        "        self.first = shipped_helpers.greet(os.environ['GREETED'])\n"
        "    def greet(self):\n"
        "        import os, sys\n"
        "        return self.first, os.environ['GREETED'], 'escher' in sys.modules\n"
        "greeter = Greeter.remote()\n"
        "print('actor', greeter.greet.remote().result(timeout=60))\n"
        "escher.kill(greeter)\n"
        "print('after the actor', after.remote().result(timeout=60))\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    log = worker_log(processes, "other")
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    assert "greeted ('hello world', False)" in done.stdout, done.stdout
    assert "after None" in done.stdout, done.stdout
    assert "actor ('hello world', 'world', False)" in done.stdout, done.stdout
    assert "after the actor None" in done.stdout, done.stdout


ACTOR_DRIVER = r'''
import json, os, signal, time
import escher

escher.init()  # ESCHER_HEAD and the access file in ESCHER_HOME
deadline = time.time() + 60
while len(escher.nodes()) < 2:
    assert time.time() < deadline, "the workers never joined"
    time.sleep(0.1)

@escher.remote(max_restarts=1)
class Counter:
    def __init__(self, lock_path, journal_path):
        import fcntl
        # An external lock each incarnation holds while it lives: a second live incarnation
        # would find it taken.
        self.lock = open(lock_path, "a")
        attempt = os.environ["ESCHER_ATTEMPT"]
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            with open(journal_path, "a") as f:
                f.write(f"conflict {attempt}\n")
            raise RuntimeError("the lock is held by another incarnation")
        with open(journal_path, "a") as f:
            f.write(f"locked {attempt}\n")
        self.n = 0
        self.born = time.time_ns()

    def add(self):
        self.n += 1
        return self.n, self.born

    def sleep(self, seconds):
        time.sleep(seconds)
        return "slept"

c = Counter.remote(os.environ["LOCK"], os.environ["JOURNAL"])
for i in range(1, 4):
    assert escher.get(c.add.remote(), timeout=60)[0] == i
_, born = escher.get(c.add.remote(), timeout=60)
state, incarnation, node, _reason = c._native.describe()
assert (state, incarnation) == ("running", 1), (state, incarnation)
names = {n["id"]: n["name"] for n in escher.cluster_status()["nodes"]}
in_flight = c.sleep.remote(60)
time.sleep(0.5)
# The actor's worker dies (SIGKILL): the actor is restarted on the other one.
os.kill(json.loads(os.environ["WORKER_PIDS"])[names[node]], signal.SIGKILL)
try:
    escher.get(in_flight, timeout=120)
    raise SystemExit("the call in flight on the killed worker was answered")
except escher.ActorDiedError as e:
    print("in flight:", e)
n, born2 = escher.get(c.add.remote(), timeout=120)
state, incarnation, node2, _reason = c._native.describe()
assert (n, incarnation) == (1, 2) and born2 != born and node2 != node, (n, incarnation, node2)
journal = open(os.environ["JOURNAL"]).read().split("\n")
assert journal == ["locked 1", "locked 2", ""], journal
print("restarted on", names[node2], "after", names[node], "was killed")
'''


def test_an_actor_whose_worker_is_sigkilled_restarts_on_another(processes):
    """A Python actor on worker processes: its calls keep state; when its worker is
    SIGKILLed, the call in flight fails naming why and the actor starts again (its
    constructor re-run) on the other worker once the lost one's lease has expired, never
    while the killed worker's incarnation lives: each incarnation takes an external lock
    (``flock``, without waiting) in its constructor, and the second finds it free."""
    pids = {name: proc.pid for name, proc in processes["workers"].items()}
    shared = open_folder("escher-actor-lock-")
    processes["made"].append(shared)
    shared.chmod(0o755)
    for name in ("actor.lock", "journal"):  # each worker's task user writes them
        (shared / name).touch()
        (shared / name).chmod(0o666)
    done = run_python(ACTOR_DRIVER, ESCHER_HEAD=processes["url"], ESCHER_HOME=processes["home"],
                      WORKER_PIDS=json.dumps(pids), LOCK=str(shared / "actor.lock"),
                      JOURNAL=str(shared / "journal"))
    logs = "".join(p.read_text(errors="replace")[-3000:]
                   for p in processes["logs"].glob("*.log"))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    assert "in flight: actor" in done.stdout and "died" in done.stdout, done.stdout
    assert "restarted on" in done.stdout, done.stdout


def tiny_wheel(folder: pathlib.Path, version: str) -> pathlib.Path:
    """A wheel of the package ``escher_tiny_pkg`` (its ``VERSION`` is ``version``), made here:
    pip installs it from its path without an index."""
    import base64
    import hashlib
    import zipfile

    name = "escher_tiny_pkg"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: escher-tests\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    wheel.chmod(0o644)
    return wheel


PIP_DRIVER = r'''
import json, os, sys
import escher

escher.init()  # ESCHER_HEAD and the access file in ESCHER_HOME
wheel, other, missing, full = sys.argv[1:5]

def probe():
    import json, os, sys
    import escher_tiny_pkg
    ready = os.path.join(sys.prefix, "escher-ready")
    with open(ready) as f:
        made = json.load(f)
    return escher_tiny_pkg.VERSION, sys.prefix, made["by"], os.stat(ready).st_mtime_ns

with_pkg = escher.remote(runtime_env={"pip": [wheel]})(probe)
# Four at once on a worker of four slots: one environment is made, under its lock.
first = escher.get([with_pkg.remote() for _ in range(4)], timeout=600)
again = escher.get([with_pkg.remote() for _ in range(4)], timeout=120)

@escher.remote
def plain():
    import importlib.util, sys
    return sys.prefix, importlib.util.find_spec("escher_tiny_pkg") is not None

class Holder:
    def where(self):
        import os, sys
        import escher_tiny_pkg
        return escher_tiny_pkg.VERSION, sys.prefix, os.environ.get("HOLDER")

# pip and variables together (an actor's runtime_env once took pip only).
holder = escher.remote(runtime_env={"pip": [wheel], "env_vars": {"HOLDER": "yes"}})(Holder).remote()
actor = holder.where.remote().result(timeout=600)
escher.kill(holder)
other_set = failed = None
if full == "full":
    other_set = escher.remote(runtime_env={"pip": [other]})(probe).remote().result(timeout=600)
    try:
        escher.remote(runtime_env={"pip": [missing]})(probe).remote().result(timeout=600)
    except escher.TaskError as e:
        failed = str(e)
plain_prefix = plain.remote().result(timeout=60)
# A session whose init gives the set: its functions and actors without one of their own.
escher.shutdown()
escher.init(runtime_env={"pip": [wheel]})
from_init = escher.remote(probe).remote().result(timeout=120)
holder = escher.remote(Holder).remote()
actor_from_init = holder.where.remote().result(timeout=120)
escher.kill(holder)
print("RESULT " + json.dumps({"first": first, "again": again, "plain": plain_prefix,
                              "other": other_set, "failed": failed, "actor": actor,
                              "from_init": [from_init, actor_from_init]}))
'''


@pytest.mark.parametrize("processes", ["pip-env"], indirect=True)
def test_a_pip_requirement_is_installed_once_per_set_and_reused(processes):
    """``runtime_env={"pip": [...]}`` on a worker process: the requirement (a wheel made here,
    required by its path: no index needed) is installed into a virtual environment made once
    for the set, under a lock (four calls at once make it once), reused by the next calls, by
    an actor and by another driver, and made again once removed; another set gets another
    environment; a call without pip runs in the worker's own interpreter, without the package;
    a requirement pip cannot install fails its call with pip's words."""
    wheels = open_folder("escher-wheels-")
    processes["made"].append(wheels)
    one = wheels / "one"
    two = wheels / "two"
    one.mkdir(mode=0o755)
    two.mkdir(mode=0o755)
    wheel, other = tiny_wheel(one, "1.0"), tiny_wheel(two, "2.0")
    missing = wheels / "escher_missing_pkg-1.0-py3-none-any.whl"

    def drive(full=False):
        done = subprocess.run([sys.executable, "-c", PIP_DRIVER, str(wheel), str(other),
                               str(missing), "full" if full else "reuse"],
                              capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, ESCHER_HEAD=processes["url"],
                                       ESCHER_HOME=processes["home"]))
        log = worker_log(processes, "pip")
        assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
        return json.loads(done.stdout.split("RESULT ", 1)[1])

    seen = drive(full=True)
    made = {tuple(r[1:]) for r in seen["first"] + seen["again"]}
    assert len(made) == 1, seen
    (prefix, builder, mtime), = made
    assert {r[0] for r in seen["first"] + seen["again"]} == {"1.0"}, seen
    assert os.path.basename(os.path.dirname(prefix)) == "python-envs", prefix
    assert seen["plain"][0] != prefix and seen["plain"][1] is False, seen
    # An actor of the same set runs in the same environment; so do a function and an actor
    # of a session whose init gave the set.
    assert seen["actor"] == ["1.0", prefix, "yes"], seen
    assert seen["from_init"] == [["1.0", prefix, builder, mtime], ["1.0", prefix, None]], seen
    assert seen["other"][0] == "2.0" and seen["other"][1] != prefix, seen
    failed = seen["failed"]
    assert failed is not None and "could not be installed" in failed, seen
    assert str(missing) in failed and "pip install" in failed, failed
    assert "No such file or directory" in failed, failed  # pip's own words
    # Another driver, later: the same environment, not made again.
    later = drive()
    assert {tuple(r[1:]) for r in later["first"] + later["again"]} == made, later
    # Removed to free its space: the next call makes it again, in the same place.
    shutil.rmtree(prefix)
    remade = drive()
    again = {tuple(r[1:]) for r in remade["first"] + remade["again"]}
    assert len(again) == 1 and again != made, (made, again)
    assert next(iter(again))[0] == prefix, again
