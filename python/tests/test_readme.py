"""Every Python block of the README runs (each in a fresh interpreter, on its own cluster)."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert blocks(), "the README's Python section has no ```python block"


def test_every_readme_python_block_runs():
    for code in blocks():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
