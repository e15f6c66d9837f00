"""The README's framework examples, read from the README itself so that the tests run what it shows.

An example is the first ```python block after a line ``<!-- example: NAME -->``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example(name: str) -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    marker = f"<!-- example: {name} -->"
    assert text.count(marker) == 1, f"README has {text.count(marker)} examples named {name!r}"
    start = text.index("```python\n", text.index(marker)) + len("```python\n")
    return textwrap.dedent(text[start : text.index("```", start)])


def run_child(script: str, *args: str, env: dict | None = None, timeout: float = 200) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON line last, which is returned."""
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                          cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
