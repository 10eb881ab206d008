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


@pytest.fixture(params=["two-workers"])
def processes(request, tmp_path):
    """A head and two workers; every process is killed at the end."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, ESCHER_HOME=str(home))
    for key in ("ESCHER_HEAD", "ESCHER_TOKEN", "ESCHER_TASK_TOKEN", "ESCHER_NAMESPACE"):
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
    workers = {}
    if request.param == "one-without-python":
        workers["nopy"] = start([binary("escher-worker"), "--head", url, "--name", "nopy",
                                 "--resources", "cpu=2"], "nopy", {"ESCHER_PYTHON": "none"})
    else:
        # As root, workers run each namespace's tasks as a user of their own, which must be
        # able to run this interpreter; where it cannot (a Python under /root), they run tasks
        # as themselves, and the driver checks that instead.
        users = [] if others_can_run(sys.executable) else ["--task-uids", "off"]
        for name in ("wa", "wb"):
            workers[name] = start(
                [binary("escher-worker"), "--head", url, "--name", name, "--resources",
                 "cpu=2", *users], name,
                {"ESCHER_PYTHON": sys.executable, "ESCHER_PYTHON_SLOTS": "2"})
    access = json.loads((home / "access.json").read_text())
    yield {"url": url, "home": str(home), "admin": access["admin_token"], "workers": workers,
           "logs": tmp_path}
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


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
                            "pid": os.getpid(), "uid": os.getuid(),
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
def alive(pid):
    # An exited process that nobody reaped yet (a zombie) does not run.
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"

assert not alive(first["pid"]), "the killed worker's interpreter outlived it"
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
        "@escher.remote\n"
        "def big():\n"
        "    return b'x' * 500_000\n"
        "try:\n"
        "    big.remote().result(timeout=60)\n"
        "except escher.TaskError as e:\n"
        "    print('refused:', e)\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused:" in done.stdout and "quota" in done.stdout.lower(), done.stdout


@pytest.mark.parametrize("processes", ["one-without-python"], indirect=True)
def test_a_python_task_on_a_cluster_without_python_waits_saying_so(processes):
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
        "command = escher.submit(['true'])\n"
        "print('command', escher.get(command, timeout=60))\n"
    )
    done = run_python(code, ESCHER_HOME=processes["home"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pending |" in done.stdout, done.stdout
    assert "shared/python" in done.stdout and "no live node" in done.stdout, done.stdout
    assert "command 0" in done.stdout
