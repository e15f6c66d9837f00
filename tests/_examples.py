"""The Python blocks of the docs (docs/**/*.md and README.md), read from the files themselves so
that the tests run what a reader sees.

A block is a fenced ```python block. The line before it may say how it is tested:

- nothing: ``tests/test_docs.py`` runs it, after the blocks before it on the same page, in one
  fresh interpreter per page (a page reads top to bottom, and so do its blocks);
- ``<!-- example: NAME -->``: a named example, run by the test that calls ``doc_example(NAME)``
  with the names it needs, and which checks what it does;
- ``<!-- no-run: REASON -->``: not run, for the reason given (e.g. it needs a GPU or a bucket).

``tests/test_docs.py`` runs a named example too, in its place on the page, with only what the
blocks before it define: a reader has no test to give it names. A line
``<!-- new-process: REASON -->`` anywhere between blocks says the page asks for a fresh
interpreter from the next block on (e.g. frameworks that cannot share a process): those blocks
run in one of their own, after the page's first block (which makes what the page's blocks take).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>example|no-run):\s*(?P<value>.*?)\s*-->\s*$")
_NEW_PROCESS = re.compile(r"^\s*<!--\s*new-process:\s*(?P<why>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    code: str
    kind: str  # "run", "example" or "no-run"
    value: str = ""  # the example's name, or why it is not run
    new_process: str = ""  # why the page runs this block and those after it in a fresh interpreter

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[str]:
    """README.md and every page under docs/, relative to the root."""
    pages = sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))
    return ["README.md", *pages]


def python_blocks(path: str) -> list[Block]:
    """The ```python blocks of one file, in order, with how each is tested."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().splitlines()
    blocks, i, fresh = [], 0, ""
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            restart = _NEW_PROCESS.match(lines[i])
            fresh = restart["why"] if restart else fresh
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence) and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        if info.split(" ")[0] == "python":
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = _MARK.match(before)
            code = textwrap.dedent("\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:end]))
            kind, value = (mark["kind"], mark["value"]) if mark else ("run", "")
            blocks.append(Block(path, i + 1, code + "\n", kind, value, fresh))
            fresh = ""
        i = end + 1
    return blocks


def doc_example(name: str) -> str:
    """The code of the block marked ``<!-- example: NAME -->``, wherever in the docs it is."""
    found = [b for p in doc_files() for b in python_blocks(p) if b.kind == "example" and b.value == name]
    assert len(found) == 1, f"the docs have {len(found)} examples named {name!r}: {[b.where for b in found]}"
    return found[0].code


def run_child(script: str, *args: str, env: dict | None = None, timeout: float = 200) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON line last, which is returned."""
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                          cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
