"""Failover from Python: a head of three replicas (real ``escher-head`` processes in one raft
group) and two ``escher-worker``s; a Python driver submits remote functions one ``.remote()``
at a time and gets their results while its leader is SIGKILLed. Every call the head
acknowledged (its ``TaskRef`` has an id) returns its result; no call is submitted twice (its
retries carry one idempotency key); and no two attempts of a call ever run at the same time,
by the record each attempt writes when it starts and when it ends."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

from conftest import run_python
from test_processes import binary, others_can_run, wait_until


def free_ports(n: int):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


DRIVER = r'''
import json, os, pathlib, signal, sys, time
import escher

CALLS = int(os.environ["CALLS"])
KILL_AT = int(os.environ["KILL_AT"])
escher.init(os.environ["HEADS"])  # every replica's URL; the access file in ESCHER_HOME
deadline = time.time() + 60
while len(escher.nodes()) < 2:
    assert time.time() < deadline, "the workers never joined"
    time.sleep(0.1)

@escher.remote(retries=3)
def work(i, trace):
    import json, os, time
    me = {"call": i, "task": int(os.environ["ESCHER_TASK_ID"]),
          "attempt": int(os.environ["ESCHER_ATTEMPT"]), "pid": os.getpid()}
    with open(trace, "a") as f:
        f.write(json.dumps(dict(me, at=time.time(), what="start")) + "\n")
    time.sleep(0.05)
    with open(trace, "a") as f:
        f.write(json.dumps(dict(me, at=time.time(), what="end")) + "\n")
    return i * i + 1

trace = os.environ["TRACE"]
pids = json.loads(os.environ["HEAD_PIDS"])
refs = []
killed = None
for i in range(CALLS):
    if i == KILL_AT:
        leader = next(r for r in escher.heads()["replicas"] if r["role"] == "Leader")
        os.kill(pids[str(leader["id"])], signal.SIGKILL)
        killed = (leader["id"], time.time())
        print("killed leader", leader["id"], "at call", i, flush=True)
    refs.append(work.remote(i, trace))
    time.sleep(0.02)

acknowledged, refused = {}, {}
for i, ref in enumerate(refs):
    try:
        acknowledged[i] = ref.id
    except escher.EscherError as e:
        refused[i] = str(e)
results = {}
for i, tid in acknowledged.items():
    results[i] = refs[i].result(timeout=120)
wrong = {i: r for i, r in results.items() if r != i * i + 1}
assert not wrong, f"wrong results: {wrong}"
leader = next(r for r in escher.heads()["replicas"] if r["role"] == "Leader")
assert leader["id"] != killed[0], leader
print(json.dumps({"acknowledged": len(acknowledged), "refused": refused,
                  "ids": acknowledged, "new_leader": leader["id"]}), flush=True)
'''


def test_a_python_driver_rides_through_a_leader_failover(tmp_path):
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

    ports = free_ports(3)
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    heads = {}
    for i, port in enumerate(ports):
        rid = i + 1
        heads[rid] = start([binary("escher-head"), "--listen", f"127.0.0.1:{port}",
                            "--address-file", str(tmp_path / f"head-{rid}.url"),
                            "--id", str(rid), "--peers", peers, "--group", "py",
                            "--heartbeat-interval-ms", "200", "--heartbeat-timeout-ms", "3000"],
                           f"head-{rid}")
    for rid in heads:
        wait_until(lambda: (tmp_path / f"head-{rid}.url").exists(), f"head replica {rid}")
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    users = [] if others_can_run(sys.executable) else ["--task-uids", "off"]
    for name in ("wa", "wb"):
        start([binary("escher-worker"), "--head", urls, "--name", name, "--resources", "cpu=2",
               *users], name, {"ESCHER_PYTHON": sys.executable, "ESCHER_PYTHON_SLOTS": "2"})
    shared = tempfile.mkdtemp(prefix="escher-py-failover-")
    os.chmod(shared, 0o777)
    trace = os.path.join(shared, "trace")
    try:
        done = run_python(DRIVER, HEADS=urls, ESCHER_HOME=str(home), TRACE=trace,
                          CALLS="150", KILL_AT="50",
                          HEAD_PIDS=json.dumps({str(r): p.pid for r, p in heads.items()}))
        logs = "".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
                       for p in sorted(tmp_path.glob("*.log")))
        assert done.returncode == 0, done.stdout + done.stderr + logs
        assert "killed leader" in done.stdout, done.stdout
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        records = [json.loads(line) for line in open(trace)]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    # The client follows the new leader: every call was acknowledged, under one task each.
    assert summary["refused"] == {}, summary
    assert summary["acknowledged"] == 150, summary
    ids = {int(i): tid for i, tid in summary["ids"].items()}
    assert len(set(ids.values())) == 150, "a call was submitted as two tasks"
    by_call = {}
    for r in records:
        assert ids[r["call"]] == r["task"], ("a call ran under another task", r)
        by_call.setdefault(r["call"], {}).setdefault(r["attempt"], {})[r["what"]] = r["at"]
    assert set(by_call) == set(range(150)), "a call never ran"
    for call, attempts in by_call.items():
        ended = [a for a in attempts.values() if "end" in a]
        assert ended, (call, attempts)
        # Attempts one after another, never two at once: each started after the one before
        # it ended (an attempt that never ended was killed, and the fence killed it first).
        spans = sorted((a["start"], a.get("end", a["start"])) for a in attempts.values())
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, ("two attempts of one call ran at once", call, attempts)
    again = sorted(c for c, attempts in by_call.items() if len(attempts) > 1)
    print(f"failover: leader killed at call 50, new leader {summary['new_leader']}, "
          f"{summary['acknowledged']} calls acknowledged, calls run more than once: {again}")
