"""Command tasks, ephemeral resources, reservations, watching, logs, telemetry, tokens and
namespaces, and the errors a caller can cause, from Python."""

import json
import time

import pytest

import escher
from conftest import run_python


def test_command_tasks_run_and_keep_their_output(cluster):
    ref = escher.submit(["sh", "-c", "echo hello from $ESCHER_TASK_ID; echo oops >&2"])
    assert escher.get(ref, timeout=60) == 0
    assert escher.logs(ref) == f"hello from {ref.id}\n"
    assert escher.logs(ref, "stderr") == "oops\n"
    failed = escher.submit(["sh", "-c", "exit 3"])
    with pytest.raises(escher.TaskError, match="code 3"):
        escher.get(failed, timeout=60)
    with pytest.raises(escher.InvalidArgumentError, match="list of strings"):
        escher.submit("echo hi")


def test_set_adjust_and_delete_resources_and_read_the_cluster_status(cluster):
    node = cluster.nodes[0]
    assert escher.set_resource("py-dataset", 2, escher.Node(node)) == [node]
    status = escher.cluster_status()
    mine = [n for n in status["nodes"] if n["id"] == node][0]
    res = {r["name"]: r for r in mine["resources"]}
    assert "py-dataset" in res and "shared/python" in res
    assert escher.available_resources()["py-dataset"] == 2
    escher.adjust_resource("py-dataset", 3, escher.Node(node))
    assert escher.cluster_resources()["py-dataset"] == 5
    escher.adjust_resource("py-dataset", -4, node)
    assert escher.cluster_resources()["py-dataset"] == 1
    escher.delete_resource("py-dataset", escher.Node(node))
    assert "py-dataset" not in escher.cluster_resources()
    both = escher.set_resource("py-everywhere", "unbounded", escher.Match())
    assert sorted(both) == sorted(cluster.nodes)
    escher.delete_resource("py-everywhere", escher.Match())


def test_resource_calls_refuse_what_is_wrong(cluster):
    with pytest.raises(escher.InvalidArgumentError, match="physical"):
        escher.set_resource("gpu", 2, escher.Node(cluster.nodes[0]))
    with pytest.raises(escher.EscherError, match="[Ll]ocal"):
        escher.set_resource("mine", 1, escher.Local)
    with pytest.raises(escher.InvalidArgumentError, match="node target"):
        escher.set_resource("mine", 1, "node-1")


@escher.remote
def mark_here(name):
    # Inside a task, Local is the task's own node (P1 locality).
    (node,) = escher.set_resource(name, "unbounded", escher.Local)
    return node


@escher.remote(resources={"cpu": 1, "py-marked": 1})
def where_am_i():
    import os

    return int(os.environ["ESCHER_NODE_ID"])


def test_a_task_marks_its_node_and_another_follows_it_there(cluster):
    node = mark_here.remote("py-marked").result(timeout=60)
    assert node in cluster.nodes
    assert where_am_i.remote().result(timeout=60) == node
    escher.delete_resource("py-marked", escher.Match())


def test_a_task_waiting_for_a_missing_resource_runs_once_it_exists(cluster):
    waiting = where_am_i.options(resources={"cpu": 1, "py-later": 1}).remote()
    ready, _ = escher.wait([waiting], timeout=0.5)
    assert ready == []
    escher.set_resource("py-later", 1, escher.Node(cluster.nodes[-1]))
    assert waiting.result(timeout=60) == cluster.nodes[-1]


@escher.remote
def reporter():
    escher.report(progress=0.5, loss=0.25)
    escher.report(progress=1.0)
    return "done"


def test_telemetry_reported_inside_a_task_is_read_outside(cluster):
    ref = reporter.remote()
    assert ref.result(timeout=60) == "done"
    samples = escher.telemetry(ref)[ref.id]
    keys = [s["key"] for s in samples]
    assert keys.count("progress") == 2 and "loss" in keys
    with pytest.raises(escher.EscherError, match="inside a task"):
        escher.report(progress=1)


def _of_task(event, task_id):
    """The kind of a task event (``Submitted``, ``Started``, ``Finished``) if it is one of
    task ``task_id``'s, else None."""
    (kind, body), = event["event"].items()
    return kind if isinstance(body, dict) and body.get("task") == task_id else None


def test_watching_sees_a_task_start_and_finish(cluster):
    events = escher.watch(timeout=30)  # everything, from now on
    ref = escher.submit(["sleep", "0.2"])
    seen = []
    for event in events:
        kind = _of_task(event, ref.id)
        if kind:
            seen.append(kind)
            if kind == "Finished":
                assert event["event"]["Finished"]["state"] == "Succeeded", event
                break
    assert seen == ["Submitted", "Started", "Finished"], seen


def test_watching_works_as_an_async_iterator(cluster):
    import asyncio

    async def finished():
        events = escher.watch(timeout=30)
        ref = escher.submit(["true"])
        async for event in events:
            if _of_task(event, ref.id) == "Finished":
                return event
        return None

    assert asyncio.run(finished()) is not None


def test_a_reservation_holds_bundles_and_tasks_run_inside(cluster):
    gang = escher.reserve("py-gang", [{"cpu": 1}, {"cpu": 1}], strategy="strict-spread",
                          timeout=60)
    assert len(gang.holders) == 2
    res = gang.bundle_resource(1, "cpu")
    ref = escher.submit(["true"], resources={res: 1})
    assert escher.get(ref, timeout=60) == 0
    gang.release()
    with pytest.raises(escher.InvalidArgumentError):
        escher.reserve("py-bad", [{"cpu": 1}], strategy="sideways")


def test_a_call_before_init_says_to_call_init():
    done = run_python(
        "import escher\n"
        "try:\n"
        "    escher.cluster_status()\n"
        "except escher.NotInitializedError as e:\n"
        "    print('refused:', e)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "call escher.init() first" in done.stdout


def test_a_wrong_token_is_refused_with_an_auth_error(cluster):
    done = run_python(
        "import escher, sys\n"
        "try:\n"
        f"    escher.init({cluster.head_url!r}, token='escher-app-wrong')\n"
        "except escher.AuthError as e:\n"
        "    print('refused:', e); sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused" in done.stdout and "token" in done.stdout


def test_an_app_token_acts_in_its_namespace_only(cluster):
    token = escher.create_token("app", "team-py")
    theirs = escher.submit(["true"])
    escher.get(theirs, timeout=60)
    done = run_python(
        "import escher, json\n"
        f"escher.init({cluster.head_url!r}, token={token!r})\n"
        "@escher.remote\n"
        "def one():\n"
        "    return 1\n"
        "print('value', one.remote().result(timeout=60))\n"
        "try:\n"
        f"    escher.get(escher.TaskRef({theirs.id}, kind='command'), timeout=10)\n"
        "except escher.NotFoundError as e:\n"
        "    print('unknown:', e)\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "value 1" in done.stdout
    assert "unknown:" in done.stdout


def test_init_twice_is_an_error_unless_asked(cluster):
    with pytest.raises(escher.EscherError, match="already"):
        escher.init()
    assert escher.init(ignore_reinit_error=True).head_url == cluster.head_url


def test_following_a_command_tasks_output_as_it_runs(cluster):
    ref = escher.submit(["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done"])
    text = "".join(escher.logs(ref, follow=True))
    assert text == "line 1\nline 2\nline 3\n"
    with pytest.raises(escher.InvalidArgumentError, match="stdout"):
        escher.logs(ref, "stdlog")


def test_escher_log_shows_the_embedded_clusters_logs_and_only_when_asked():
    code = ("import escher\n"
            "escher.init()\n"
            "print(escher.get(escher.submit(['true'])))\n"
            "escher.shutdown()\n")
    quiet = run_python(code)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "0" and "INFO" not in quiet.stderr, quiet.stderr
    logged = run_python(code, ESCHER_LOG="info")
    assert logged.returncode == 0, logged.stderr
    # The head's and the worker's own lines, on the driver's stderr.
    assert "escher_head" in logged.stderr and "escher_worker" in logged.stderr, logged.stderr
    wrong = run_python(code, ESCHER_LOG="escher_worker=loud")
    assert wrong.returncode == 0, wrong.stderr
    assert "ESCHER_LOG=\"escher_worker=loud\" is not a log filter" in wrong.stderr, wrong.stderr
