"""Recursive cancel, as Ray's ``ray.cancel(ref, recursive=True)``: a task that submitted tasks
from inside itself (the head records it as their parent, from its credential) is cancelled
with its children; ``recursive=False`` leaves them running."""

import os
import pathlib
import time

import pytest

import escher
from escher._api import TaskRef


@escher.remote
def sleepy_child(path):
    pathlib.Path(path).write_text("started")
    time.sleep(600)


@escher.remote
def spawner(where, n):
    refs = [sleepy_child.remote(os.path.join(where, f"child{i}")) for i in range(n)]
    pathlib.Path(where, "ids").write_text(" ".join(str(r.id) for r in refs))
    time.sleep(600)


def children_of(where, n):
    """The refs of the ``n`` children ``spawner`` started in ``where``, once all run."""
    ids = pathlib.Path(where, "ids")
    deadline = time.monotonic() + 120
    while not (ids.exists() and all(pathlib.Path(where, f"child{i}").exists()
                                    for i in range(n))):
        assert time.monotonic() < deadline, "the children never started"
        time.sleep(0.05)
    return [TaskRef(int(i), kind="python") for i in ids.read_text().split()]


def test_a_recursive_cancel_ends_the_tasks_a_task_submitted(cluster, tmp_path):
    root = spawner.remote(str(tmp_path), 2)
    kids = children_of(tmp_path, 2)
    assert [escher.task_info(k)["state"] for k in kids] == ["running", "running"]
    escher.cancel(root)  # recursive=True, as Ray's default
    with pytest.raises(escher.TaskCancelledError):
        escher.get(root, timeout=60)
    for kid in kids:
        with pytest.raises(escher.TaskCancelledError):
            escher.get(kid, timeout=60)


def test_a_cancel_that_is_not_recursive_leaves_the_children_running(cluster, tmp_path):
    root = spawner.remote(str(tmp_path), 1)
    kids = children_of(tmp_path, 1)
    escher.cancel(root, recursive=False)
    with pytest.raises(escher.TaskCancelledError):
        escher.get(root, timeout=60)
    assert escher.task_info(kids[0])["state"] == "running"
    escher.cancel(kids)
    with pytest.raises(escher.TaskCancelledError):
        escher.get(kids[0], timeout=60)
