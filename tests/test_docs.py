"""The docs site (mkdocs.yml, docs/) and README.md: the strict build, and every Python block run.

How a block is tested is said by the line before it (see ``_examples``): run here with the blocks
before it on its page, run by a named test, or not run for a stated reason.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from ._needs import need
from ._examples import ROOT, doc_files, python_blocks

# Runs each block of a page in order, in one namespace, as a reader would paste them; says which
# block failed. argv[1]: a JSON list of [where, code].
_RUNNER = r"""
import json, linecache, sys, traceback
namespace = {"__name__": "__main__"}
for where, code in json.loads(sys.argv[1]):
    print(f"--- {where}", flush=True)
    # the block's source, for tracebacks and for what reads it (tf.function's AutoGraph)
    linecache.cache[where] = (len(code), None, code.splitlines(True), where)
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: the block at {where}", flush=True)
        sys.exit(1)
"""

# A page's blocks together: small videos, few workers, a few batches. TensorFlow, torch, JAX and
# Keras imports take most of it.
_PAGE_TIMEOUT_S = 240


def _runnable_pages() -> list[str]:
    return [p for p in doc_files() if any(b.kind != "no-run" for b in python_blocks(p))]


def _processes(page: str) -> list[list[list[str]]]:
    """The page's blocks a reader runs, named examples included, in page order: one list per
    interpreter, [where, code] each; a ``new-process`` mark starts a new one, after the page's
    first block."""
    blocks = python_blocks(page)
    groups: list[list[list[str]]] = [[]]
    for b in blocks:
        if b.new_process and groups[-1]:
            groups.append([[blocks[0].where, blocks[0].code]] if b is not blocks[0] else [])
        if b.kind != "no-run":
            groups[-1].append([b.where, b.code])
    return [g for g in groups if g]


@pytest.mark.parametrize("page", _runnable_pages())
def test_the_python_blocks_of_a_page_run(page, tmp_path):
    """Every block not marked no-run, named examples too, runs in page order in a fresh
    interpreter whose working folder is empty, with only what the page's own blocks define
    (blocks that need videos make them with ``shmloader.samples.make_videos``); a page that asks
    for a new process (``<!-- new-process: ... -->``) gets one there."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("KERAS_BACKEND", None)  # the pages speak of the default backend, tensorflow
    for blocks in _processes(page):
        proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(blocks)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=_PAGE_TIMEOUT_S)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def test_every_python_block_is_run_or_says_why():
    """A block is run here, or by the test that names its example, or says why it is not run."""
    tests = "".join(open(p).read() for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    for page in doc_files():
        for b in python_blocks(page):
            if b.kind == "no-run":
                assert len(b.value) >= 10, f"{b.where}: a block that is not run says why, got {b.value!r}"
            if b.new_process:
                assert len(b.new_process) >= 10, f"{b.where}: a new process says why, got {b.new_process!r}"
            elif b.kind == "example":
                assert f'doc_example("{b.value}")' in tests, f"{b.where}: no test runs the example {b.value!r}"
            compile(b.code, b.where, "exec")  # even a block that is not run is Python


def test_named_examples_are_unique():
    names = [b.value for p in doc_files() for b in python_blocks(p) if b.kind == "example"]
    assert sorted(names) == sorted(set(names)), names


def test_strict_build(tmp_path):
    """``make docs``: mkdocs build --strict. A broken link or anchor, a page left out of the nav, an
    API object that does not resolve, a NOTE the Architecture page lacks: any warning fails."""
    need("mkdocstrings_handlers.python", reason="the docs extra (make test installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "WARNING" not in out, out[-6000:]
    for page in ("index.html", "api/loader/index.html", "guide/sources/index.html", "bench/results/cpu2_throughput.png"):
        assert (tmp_path / "site" / page).exists(), page
    api = (tmp_path / "site" / "api" / "loader" / "index.html").read_text()
    assert 'id="shmloader.Loader.as_dataset"' in api  # the reference was generated from the docstrings


def test_the_api_reference_uses_public_import_paths():
    """Modules move inside the package; the reference names what users import."""
    for page in glob.glob(os.path.join(ROOT, "docs", "api", "*.md")):
        for ident in re.findall(r"^::: *(\S+)", open(page).read(), re.M):
            assert not any(part.startswith("_") for part in ident.split(".")), f"{page}: {ident}"


def test_every_note_of_the_code_is_on_the_architecture_page():
    """Each NOTE [ ... ] block in the package has its section on the Architecture page, which the
    API pages link the NOTEs' names to."""
    notes = set()
    for path in glob.glob(os.path.join(ROOT, "shmloader", "**", "*.py"), recursive=True):
        notes |= set(re.findall(r"^NOTE \[ (.+?) \]$", open(path).read(), re.M))
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    assert notes, "no NOTE found"
    for note in sorted(notes):
        assert f"NOTE [ {note} ]" in page, note


def test_the_readme_is_a_landing_page():
    """At most ~200 lines: what it is, the two commands, an example per framework, the headline
    numbers and links; the rest lives in docs/."""
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.splitlines()) <= 200
    for phrase in ("make demo", "make test", "docs/"):
        assert phrase in text


def test_the_package_page_says_where_it_runs():
    """PyPI's sidebar: Linux only (memfd_create, O_TMPFILE, /proc), the Pythons the lanes test
    (3.10 oldest, 3.11 the lab, 3.12 and 3.13 newest), typed, and words to be found by."""
    from ._pyproject import pyproject

    project = pyproject()["project"]
    classifiers = project.get("classifiers", [])
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert not [c for c in classifiers if c.startswith("Operating System") and "Linux" not in c]
    pythons = sorted(c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert pythons == ["3.10", "3.11", "3.12", "3.13"], pythons
    assert project["requires-python"] == ">=3.10"
    assert "Typing :: Typed" in classifiers and not [c for c in classifiers if c.startswith("License ::")]
    assert {"video", "data-loader", "tf.data", "pytorch", "jax", "shared-memory"} <= set(project.get("keywords", []))


def test_the_sampling_figure_is_drawn_from_the_sampling_functions(tmp_path):
    """docs/assets/sampling.png comes from docs/assets/sampling_figure.py, which asks
    shmloader.sampling for the frames: the script runs, every recipe row gives frames inside the
    video, and the page shows the committed figure."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sampling_figure", os.path.join(ROOT, "docs", "assets",
                                                                                  "sampling_figure.py"))
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    for row in figure.rows():
        for frames in row["clips"]:
            assert len(frames) and 0 <= min(frames) and max(frames) < figure.FRAMES, row["label"]
    assert os.path.getsize(figure.draw(str(tmp_path / "sampling.png"))) > 10_000
    assert os.path.isfile(os.path.join(ROOT, "docs", "assets", "sampling.png"))
    assert "](../assets/sampling.png)" in open(os.path.join(ROOT, "docs", "guide", "sampling.md")).read()


# Characters of a code line the site shows without scrolling at 1280 px (both sidebars shown:
# about 88 fit in the column, seen in headless Chromium); a little margin below that.
CODE_COLUMNS = 84


@pytest.mark.parametrize("page", ["index.md", "getting-started.md"])
def test_first_pages_code_fits_a_1280_px_window(page):
    """A newcomer reads these two pages first: no code line, comments included, runs off the
    column (the long comments of the two commands did)."""
    long = []
    inside = False
    for n, line in enumerate(open(os.path.join(ROOT, "docs", page)), start=1):
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside and len(line.rstrip("\n")) > CODE_COLUMNS:
            long.append((n, line.rstrip()))
    assert not long, long


def test_no_notebook_mixes_tensorflow_and_torch():
    """TensorFlow's fit and a torch step in one process have crashed (the frameworks guide says
    so): a notebook, one kernel, keeps to one of them."""
    for path in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.load(open(path))["cells"] if c["cell_type"] == "code")
        tf = re.search(r"^\s*import (tensorflow|keras)\b", code, re.M)
        torch = re.search(r"^\s*(import torch|from torch)\b", code, re.M)
        assert not (tf and torch), f"{path}: TensorFlow and torch in one kernel"
