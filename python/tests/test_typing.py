"""The package is typed (py.typed, stubs of the native module): mypy checks it, as installed,
and the examples against it."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_mypy_accepts_the_package_and_the_examples(tmp_path):
    for target in (["-p", "escher"], sorted(str(p) for p in EXAMPLES.glob("*.py"))):
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--check-untyped-defs", "--cache-dir",
             str(tmp_path / "cache"), *target],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )
        assert "No module named mypy" not in done.stderr, (
            "this test runs mypy: pip install mypy (tests/python.rs installs it)"
        )
        assert done.returncode == 0, done.stdout + done.stderr
