"""The notebooks run top to bottom in a real Jupyter kernel, draw their figures, and leave nothing behind.

Each notebook is read into memory and executed there (the committed files stay clean), with the
working directory set to ``notebooks/`` as JupyterLab would; the executed copy is saved under the
test's temporary directory for inspection. The kernel is this interpreter (a kernelspec written
for ``sys.executable`` is put first on ``JUPYTER_PATH``), so it imports the same shmloader.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ._needs import need
from .conftest import our_fds, shm_entries

nbformat = need("nbformat")
nbclient = need("nbclient")
# What the kernel will import; looked up, not imported, to keep TensorFlow out of this process.
_missing = [m for m in ("ipykernel", "matplotlib", "tensorflow", "keras", "av") if importlib.util.find_spec(m) is None]
if _missing:
    pytest.skip(f"the notebooks need {', '.join(_missing)} (pip install -e '.[tf,notebooks]')", allow_module_level=True)

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# Figures (image/png outputs) each notebook must produce, at least.
FIGURES = {
    "01_quickstart.ipynb": 3,
    "02_how_many_workers.ipynb": 2,
    "03_train_keras.ipynb": 1,
}

# Each notebook takes about a minute on two busy cores; a cell gets most of the budget because
# the benchmark notebook spends its time in one or two cells.
CELL_TIMEOUT_S = 240
NOTEBOOK_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A ``python3`` kernelspec that runs this very interpreter, ahead of any other on the path."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (shmloader tests)",
        "language": "python",
    }))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "MPLBACKEND")}
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(root), saved["JUPYTER_PATH"]) if p)
    os.environ.pop("MPLBACKEND", None)  # let ipykernel pick its inline backend, which emits image/png
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        spec = KernelSpecManager().get_kernel_spec("python3")
        assert spec.argv[0] == sys.executable, f"python3 kernel resolves to {spec.argv}"
        yield "python3"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _alive(pids: dict[int, float]) -> list[int]:
    """Which of ``pids`` (pid -> create time) still run, zombies counted as gone."""
    left = []
    for pid, created in pids.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def _images(nb) -> int:
    return sum(1 for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))


_FORK_SERVER = "-m shmloader.engine.forkserver"


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


class _Watcher:
    """Records every descendant of the kernel, polling in a thread while the notebook runs."""

    def __init__(self) -> None:
        self.kernel: psutil.Process | None = None
        self.seen: dict[int, float] = {}  # pid -> create time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self, pid: int) -> None:
        self.kernel = psutil.Process(pid)
        self._thread.start()

    def children(self) -> list[psutil.Process]:
        kids = []
        try:
            for p in self.kernel.children(recursive=True):
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        self.seen.setdefault(p.pid, p.create_time())
                        kids.append(p)
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass
        return kids

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            self.children()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


# Smaller settings for a notebook's test run, given as papermill does: a cell after the
# notebook's first (its settings), so every other cell runs as a reader runs it, in less time.
SETTINGS = {
    "02_how_many_workers.ipynb": "SECONDS = 0.5\nWORKERS = [1, 2]\nSTEP_FACTORS = [0, 2]\nSTEPS = 6",
}


def _run(name: str, kernel_name: str, tmp_path: Path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    if name in SETTINGS:
        first = min(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(first + 1, nbformat.v4.new_code_cell(SETTINGS[name]))
    last = max(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    watcher = _Watcher()
    at_end: dict[str, object] = {}

    def on_start(notebook):
        watcher.start(client.km.provisioner.pid)

    def after_cell(cell, cell_index, execute_reply):
        if cell_index != last:
            return
        # The last cell has run and the kernel is still up: a loader left open shows here,
        # before shutting the kernel down would hide it. Give closing workers a moment.
        # The fork server stays with its kernel by design (shmloader.engine.forkserver); the workers
        # it forked are the kernel's descendants, counted here, and the server must end with the kernel.
        def left() -> list[tuple[int, str]]:
            return [(p.pid, cmd) for p in watcher.children() if _FORK_SERVER not in (cmd := _cmdline(p))]

        deadline = time.monotonic() + 5
        while (kids := left()) and time.monotonic() < deadline:
            time.sleep(0.1)
        at_end["children"] = kids
        at_end["memfds"] = our_fds(watcher.kernel.pid)

    client = nbclient.NotebookClient(
        nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT_S, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        on_notebook_start=on_start, on_cell_executed=after_cell,
    )
    shm_before = shm_entries()
    t0 = time.monotonic()
    try:
        client.execute()
    finally:
        watcher.stop()
        nbformat.write(nb, tmp_path / name)  # the executed copy, outputs and all
    elapsed = time.monotonic() - t0
    print(f"{name}: {elapsed:.1f} s, {len(watcher.seen)} kernel child processes seen")
    assert watcher.seen, "no worker process was ever seen: is the watcher watching the kernel?"
    assert at_end, "the last cell never reported back"
    assert at_end["children"] == [], f"processes left when the notebook ended: {at_end['children']}"
    assert at_end["memfds"] == [], f"shared segments still open in the kernel: {at_end['memfds']}"
    deadline = time.monotonic() + 5
    while _alive(watcher.seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(watcher.seen) == [], f"processes outlived the kernel: {_alive(watcher.seen)}"
    assert shm_entries() - shm_before == set(), "entries left in /dev/shm"
    return nb


def _check(name: str, kernel_name: str, tmp_path: Path) -> None:
    nb = _run(name, kernel_name, tmp_path)
    assert _images(nb) >= FIGURES[name], f"{name} drew {_images(nb)} figures, expected {FIGURES[name]}"


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(FIGURES)


def test_every_cell_has_an_id():
    """nbformat 4.5 cells carry an ``id``; a missing one is a warning today and "will become an
    error" (nbformat's words). The committed files, as JSON, before nbformat fills anything in."""
    import json

    for name in FIGURES:
        cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
        ids = [c.get("id") for c in cells]
        missing = [i for i, x in enumerate(ids) if x is None]
        assert not missing and len(set(ids)) == len(ids), f"{name}: cells {missing} have no id"


def test_committed_notebooks_have_no_outputs():
    for name in FIGURES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        nbformat.validate(nb)
        dirty = [i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert dirty == [], f"{name}: cells {dirty} were committed with outputs; clear them"


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
def test_quickstart(kernel_name, tmp_path):
    _check("01_quickstart.ipynb", kernel_name, tmp_path)


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
def test_how_many_workers(kernel_name, tmp_path):
    _check("02_how_many_workers.ipynb", kernel_name, tmp_path)


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
def test_train_keras(kernel_name, tmp_path):
    _check("03_train_keras.ipynb", kernel_name, tmp_path)
