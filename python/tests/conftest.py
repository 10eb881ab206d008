"""One embedded cluster (a head and two workers in this process) for the whole suite."""

import os
import subprocess
import sys

import pytest

import escher


@pytest.fixture(scope="session")
def cluster():
    info = escher.init(num_workers=2)
    yield info
    escher.shutdown()


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a process with no escher session of its own)."""
    full = dict(os.environ)
    for key in ("ESCHER_HEAD", "ESCHER_TOKEN", "ESCHER_TASK_TOKEN", "ESCHER_NAMESPACE"):
        full.pop(key, None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=120)
