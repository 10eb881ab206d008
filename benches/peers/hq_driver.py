"""HyperQueue side of escher-bench: command tasks (`true`).

Written for the harness; run by it with its own virtualenv (`.venv-bench/`, hyperqueue
pinned). The `hyperqueue` wheel embeds the server and the worker in its Python extension, so
`LocalCluster` needs no `hq` binary. One worker with C cores; N program tasks `true`, each
with HyperQueue's default request of one CPU and its default stdout/stderr files, submitted as
one job; tasks/s from submission until `wait_for_jobs` returns.

`wait_for_jobs` polls the server about once a second, so the measured time can exceed the real
one by up to a second, and a job of a few seconds comes out in whole seconds of polling: the
job is run three times and the fastest counts (its time is the closest to the real one, and it
favours HyperQueue). The wait of a one-task job (the polling floor) and every run's time are
reported alongside. Prints one last line:

    RESULT {"values": {"cmd": tasks_per_s, "cmd.floor_s": s}, "info": {"cmd_walls_s": [...], ...}}
"""

import argparse
import json
import sys
import tempfile
import time

# How many times the measured job runs; the fastest counts.
RUNS = 3


def log(*args):
    print("hq_driver:", *args, file=sys.stderr, flush=True)


def run_job(client, Job, n):
    job = Job()
    for _ in range(n):
        job.program(["true"])
    start = time.perf_counter()
    submitted = client.submit(job)
    client.wait_for_jobs([submitted])
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--cores", type=int, default=8)
    args = ap.parse_args()

    import hyperqueue
    from hyperqueue import Job, LocalCluster
    from hyperqueue.cluster import WorkerConfig

    from importlib import metadata

    info = {"hyperqueue": metadata.version("hyperqueue"), "cores": args.cores}
    values = {}
    with tempfile.TemporaryDirectory() as server_dir:
        with LocalCluster(server_dir=server_dir) as cluster:
            cluster.start_worker(WorkerConfig(cores=args.cores))
            client = cluster.client()
            run_job(client, Job, 20)  # warm-up
            values["cmd.floor_s"] = run_job(client, Job, 1)
            walls = [run_job(client, Job, args.tasks) for _ in range(RUNS)]
            info["cmd_walls_s"] = walls
            values["cmd"] = args.tasks / min(walls)
            log(f"{args.tasks} tasks in {walls} s; the fastest = {values['cmd']:.0f} tasks/s")
    del hyperqueue
    print("RESULT " + json.dumps({"values": values, "info": info}), flush=True)


if __name__ == "__main__":
    main()
