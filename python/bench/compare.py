"""escher beside Ray, each from one Python driver on this machine, in the same run: no-op
remote functions (tasks/s with one ``.remote()`` per task, and escher's batched ``f.map``),
the ``f.remote()`` then ``get`` round trip (p50, ms), 1 MiB arguments through a task
(tasks/s), and actors: a method call's round trip (p50, ms), pipelined calls (calls/s) and an
actor created then called once (p50, ms). Each system runs in a process of its own, with 4 CPUs (Ray: ``num_cpus=4``;
escher: one embedded worker with ``cpu=4``, so 4 Python slots). One JSON line per measurement.

    python python/bench/compare.py [--tasks 2000] [--runs 3] [--systems escher,ray]

Needs escher installed (``pip install ./python``; a release build for numbers worth quoting)
and, for the comparison, ``pip install ray``. ``escher-bench python`` runs it (``--one`` per
system) in the harness' own virtual environment, installing both, and reports its figures
beside the other workloads' with the Python targets (no-op remote functions ≥ 3× Ray's, the
round trip's p50 ≤ ½ of Ray's).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(system: str, tasks: int) -> dict:
    if system == "ray":
        import ray

        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)

        @ray.remote
        def noop():
            return None

        @ray.remote
        def size(data):
            return len(data)

        @ray.remote(num_cpus=0)
        class Bench:
            def noop(self):
                return None

        @ray.remote(num_cpus=1)
        class Fresh:
            def noop(self):
                return None

        submit = lambda f, *a: f.remote(*a)  # noqa: E731
        get = ray.get
        kill = ray.kill
        batch = None
    else:
        import escher

        escher.init(num_workers=1, resources={"cpu": 4})

        @escher.remote
        def noop():
            return None

        @escher.remote
        def size(data):
            return len(data)

        @escher.remote(num_cpus=0)
        class Bench:
            def noop(self):
                return None

        @escher.remote(num_cpus=1)
        class Fresh:
            def noop(self):
                return None

        submit = lambda f, *a: f.remote(*a)  # noqa: E731
        get = escher.get
        kill = escher.kill
        batch = lambda f, n: f.map([() for _ in range(n)])  # noqa: E731

    get([submit(noop) for _ in range(50)])  # warm: workers, interpreters, connections
    out = {"system": system}

    start = time.perf_counter()
    get([submit(noop) for _ in range(tasks)])
    out["noop_tasks_per_s"] = tasks / (time.perf_counter() - start)

    if batch is not None:
        start = time.perf_counter()
        get(batch(noop, tasks))
        out["noop_batched_tasks_per_s"] = tasks / (time.perf_counter() - start)

    trips = []
    for _ in range(200):
        start = time.perf_counter()
        get(submit(noop))
        trips.append(time.perf_counter() - start)
    out["round_trip_p50_ms"] = statistics.median(trips) * 1000

    blob = b"x" * (1 << 20)
    n = 50
    start = time.perf_counter()
    assert get([submit(size, blob) for _ in range(n)]) == [1 << 20] * n
    out["one_mib_args_tasks_per_s"] = n / (time.perf_counter() - start)

    actor = Bench.remote()
    get([actor.noop.remote() for _ in range(100)])  # warm: placed, constructed, connected
    calls = []
    for _ in range(1000):
        start = time.perf_counter()
        get(actor.noop.remote())
        calls.append(time.perf_counter() - start)
    out["actor_round_trip_p50_ms"] = statistics.median(calls) * 1000
    start = time.perf_counter()
    get([actor.noop.remote() for _ in range(tasks * 5)])
    out["actor_calls_per_s"] = tasks * 5 / (time.perf_counter() - start)
    kill(actor)
    created = []
    for _ in range(30):
        start = time.perf_counter()
        fresh = Fresh.remote()
        get(fresh.noop.remote())
        created.append(time.perf_counter() - start)
        kill(fresh)
    out["actor_create_to_first_call_p50_ms"] = statistics.median(created) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--systems", default="escher,ray")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.tasks)))
        return
    for run in range(1, args.runs + 1):
        for system in args.systems.split(","):
            done = subprocess.run([sys.executable, __file__, "--one", system, "--tasks",
                                   str(args.tasks)], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{system} failed:\n{done.stderr}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["run"] = run
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    main()
