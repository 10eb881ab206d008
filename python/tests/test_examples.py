"""Every example in python/examples runs to its end (each starts its own embedded cluster)."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{name} printed nothing"


def test_there_are_examples():
    assert len(list(EXAMPLES.glob("*.py"))) >= 5
