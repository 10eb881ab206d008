"""Where a Python no-op remote function's time goes: rounds of no-op calls (one ``.remote()``
each, then one ``escher.get`` of all) on an embedded cluster, printing each round's rate and,
at the end, the CPU time per task of this process's threads by name (``python``: the driver's
own thread; ``escher-py``: the package's runtime, which runs the embedded head, worker and
client) and of the worker's interpreters (this process's Python children).

    python python/bench/cpu_per_task.py [--cpus 4] [--rounds 5] [--tasks 2000]

Linux only (it reads ``/proc``). Needs escher installed (``pip install ./python``; a release
build for figures worth quoting). ``BENCHMARKS.md`` quotes it beside ``escher-bench python``.
"""

import argparse
import glob
import os
import time

import escher


def thread_ticks() -> dict:
    """CPU ticks (user + system) of each thread of this process, by thread path."""
    out = {}
    for path in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            with open(path + "/comm") as f:
                name = f.read().strip()
            with open(path + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[path] = (name, int(fields[11]) + int(fields[12]))
        except OSError:
            pass
    return out


def children_ticks() -> int:
    """CPU ticks of this process's child Python processes (the worker's interpreters)."""
    total = 0
    me = os.getpid()
    for path in glob.glob("/proc/[0-9]*"):
        try:
            with open(path + "/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            if comm.startswith("python") and int(fields[1]) == me:
                total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError):
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    escher.init(num_workers=1, resources={"cpu": args.cpus})

    @escher.remote
    def noop():
        return None

    escher.get([noop.remote() for _ in range(200)])  # warm: interpreters, connections
    before, children_before = thread_ticks(), children_ticks()
    start = time.perf_counter()
    for n in range(args.rounds):
        began = time.perf_counter()
        escher.get([noop.remote() for _ in range(args.tasks)])
        print(f"round {n}: {args.tasks / (time.perf_counter() - began):.0f} tasks/s", flush=True)
    elapsed = time.perf_counter() - start
    after, children_after = thread_ticks(), children_ticks()
    tasks = args.rounds * args.tasks
    per_task = 1e6 / os.sysconf("SC_CLK_TCK") / tasks
    by_name: dict = {}
    for path, (name, ticks) in after.items():
        by_name[name] = by_name.get(name, 0) + ticks - before.get(path, (name, 0))[1]
    cpu = {name: round(t * per_task, 1) for name, t in sorted(by_name.items()) if t}
    cpu["interpreters"] = round((children_after - children_before) * per_task, 1)
    print(f"total {tasks / elapsed:.0f} tasks/s; CPU µs per task: {cpu}")


if __name__ == "__main__":
    main()
