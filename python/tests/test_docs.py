"""Every Python block of the README and of the pages under docs/ runs (each in a fresh
interpreter, on its own cluster)."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks():
    """Each ```python block with the page it is on."""
    return [(page.relative_to(ROOT), code)
            for page in PAGES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def test_the_python_page_has_examples():
    pages = {str(page) for page, _ in blocks()}
    assert "docs/python.md" in pages, f"docs/python.md has no ```python block (found in {pages})"


def test_every_python_block_runs():
    for page, code in blocks():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{page}:\n{code}\n{done.stdout}\n{done.stderr}"
