"""One harness for every benchmark: a benchmark is a declaration (``Benchmark``), the harness runs it.

A benchmark names its own options, the blocks of cells it measures (cells compared with each
other share a block and run back to back, so they see the same spell of a shared machine), how
one cell runs (``measure`` holds the runners), what it measures once after the cells (``after``)
and how its report reads (``report`` writes json, Markdown and PNG). The harness does the rest,
once for all: the common options, the heavy imports (TensorFlow by default) and the forkserver
before any measurement, repetitions interleaved (each runs every block,
and every cell of a block, in a shuffled order), a run spoilt by other load repeated
(``--max-other-load``, ``--retries``), and ``--commit REV``: the whole run against shmloader as
committed in REV (a ``git archive`` of its ``shmloader/`` first on ``PYTHONPATH``), since the
working tree may change under a long run.

This module imports neither TensorFlow nor torch at the top: spawned processes of a benchmark
import its script as their main module, and with it this one.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Set in the run that --commit starts: the commit its shmloader was archived from, and the folder
# the command was given in (relative paths in it are relative to that folder).
_SNAPSHOT_ENV, _CWD_ENV = "SCALE_BENCH_COMMIT", "BENCH_COMMIT_CWD"
# In that run the commit's shmloader, first on PYTHONPATH, must come before the repository's root,
# which a script that imports this module may have put first on sys.path (to import shmloader
# when run from anywhere): else its own process would import the working tree's.
if os.environ.get(_SNAPSHOT_ENV):
    for _path in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
        while _path in sys.path:
            sys.path.remove(_path)
        sys.path.insert(0, _path)


@dataclass
class Benchmark:
    """What a benchmark declares. ``cells(args, ctx)``: blocks of cells; ``run(cell, rep, args,
    ctx)``: one run's row (a dict); ``after(args, ctx)``: what is measured once after the runs
    (a dict merged into the document); ``close(ctx)``: always, last (a cluster shut down);
    ``report(doc, runs, args, ctx)`` fills the document's summary, targets and notes;
    ``markdown(doc)`` and ``plot(doc, folder, name)`` render it."""

    script: str  # as the report's command line shows it: "bench/scale.py"
    name: str  # default results name: <out>/<name>.{json,md} and its plots
    about: str  # the script's docstring: its first paragraph is --help's description
    options: Callable[[argparse.ArgumentParser], None]
    cells: Callable[[Any, dict], list[list]]
    run: Callable[[Any, int, Any, dict], dict]
    report: Callable[[dict, list[dict], Any, dict], None]
    markdown: Callable[[dict], str]
    plot: Callable[[dict, str, str], list[str]]
    prepare: Callable[[Any, list[str]], dict] = lambda args, notes: {}
    after: Callable[[Any, dict], dict] = lambda args, ctx: {}
    close: Callable[[dict], None] = lambda ctx: None
    label: Callable[[Any], str] = str
    brief: Callable[[Any, dict], str | None] = lambda cell, row: row.get("error") and f"{cell}: {row['error']}"
    forkserver: bool = False  # start torch's forkserver before measuring (see loaders.start_forkserver)
    retry: bool = True  # --max-other-load and --retries: repeat runs spoilt by other load
    reps: int = 3  # --reps' default
    # Imported in this order once, before any measurement (torch before tensorflow where both are:
    # tensorflow 2.21 imported first, then triton, crashes the process, tensorflow#124205).
    preload: tuple[str, ...] = ("tensorflow",)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def names(allowed):
    def parse(text: str) -> list[str]:
        chosen = [x for x in text.split(",") if x]
        bad = [x for x in chosen if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
        return chosen

    return parse


def size(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def video_options(p: argparse.ArgumentParser, folder: str, count: int, frames: int, codec: bool = True) -> None:
    """The synthetic videos' options (written once into ``.cache/<folder>``, reused when present)."""
    p.add_argument("--cache", default=os.path.join(ROOT, ".cache", folder),
                   help="where synthetic videos are written (reused when present)")
    p.add_argument("--video-count", type=int, default=count)
    p.add_argument("--video-frames", type=int, default=frames)
    p.add_argument("--video-size", type=size, default=(240, 320), help="HxW of synthetic videos")
    if codec:
        p.add_argument("--codec", default="libx264", choices=("libx264", "mpeg4"))


def parse_args(bench: Benchmark, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=bench.about.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--name", default=bench.name, help="results are <out>/<name>.{json,md} and its plots")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--reps", type=int, default=bench.reps, help="interleaved repetitions")
    p.add_argument("--seed", type=int, default=0, help="seed of the run order shuffle")
    if bench.retry:
        p.add_argument("--max-other-load", type=float, default=50.0,
                       help="CPU %% used by other programs above which a run is repeated")
        p.add_argument("--retries", type=int, default=1,
                       help="repeats of a run spoilt by other load; the quietest attempt is kept")
    p.add_argument("--commit", default=None,
                   help="measure shmloader as in this commit (a git archive of it), not the working tree")
    p.add_argument("--no-plots", action="store_true")
    bench.options(p)
    args = p.parse_args(argv)
    for key in ("out", "cache", "videos", "folder"):  # a --commit run works in another folder (see _run_at_commit)
        if isinstance(getattr(args, key, None), str):
            setattr(args, key, os.path.join(os.environ.get(_CWD_ENV, os.getcwd()), os.path.expanduser(getattr(args, key))))
    if args.reps < 1 or getattr(args, "duration", 1) <= 0:
        p.error("--reps >= 1 and --duration > 0")
    return args


def quietly(run: Callable[[], dict], args) -> dict:
    """``run()``, repeated up to ``--retries`` times while other programs load the machine; the
    quietest attempt is kept. Freed heap goes back to the OS first, so that one run's RSS does
    not carry the last's."""
    from measure import release_memory

    best, attempts = None, 0
    for attempts in range(1, 2 + max(0, getattr(args, "retries", 0))):
        release_memory()
        t0 = time.perf_counter()
        row = run()
        row["wall_s"] = time.perf_counter() - t0
        if best is None or row.get("other_cpu_pct", 0) < best.get("other_cpu_pct", 0):
            best = row
        if row.get("error") or row.get("other_cpu_pct", 0) <= getattr(args, "max_other_load", float("inf")):
            break
    best["attempts"] = attempts
    return best


def retry_notes(rows: list[dict], args) -> list[str]:
    retried = [r for r in rows if r.get("attempts", 1) > 1]
    if not retried:
        return []
    still = sum(r.get("other_cpu_pct", 0) > args.max_other_load for r in retried)
    return [f"{len(retried)} of {len(rows)} runs were repeated because other programs used more than "
            f"{args.max_other_load:g} % CPU during them; the quietest attempt is kept "
            f"({still} stayed above the threshold)."]


def main(bench: Benchmark, argv: list[str]) -> int:
    args = parse_args(bench, argv)
    if args.commit and not os.environ.get(_SNAPSHOT_ENV):
        return _run_at_commit(args.commit, argv)
    t_start = time.perf_counter()
    import report

    code = code_state()
    os.makedirs(args.out, exist_ok=True)
    notes: list[str] = []
    ctx: dict = {}
    try:
        ctx = bench.prepare(args, notes)
        machine, runs, measured = _measure(bench, args, ctx)
    finally:
        bench.close(ctx)
    config = dict(vars(args))
    doc = {"name": args.name, "command": " ".join(shlex.quote(a) for a in ["python", bench.script, *argv]),
           "machine": machine, "code": code, "config": config, "runs": runs, "notes": notes, **measured}
    bench.report(doc, runs, args, ctx)
    if bench.retry:
        doc["notes"] += retry_notes(runs, args)
    after = code_state()
    if after["package_sha256"] != code["package_sha256"]:
        doc["notes"].append(f"shmloader's files changed during the run ({code['package_sha256']} -> "
                            f"{after['package_sha256']}): workers started later imported other code. Run "
                            "again, or with --commit.")
    doc["wall_s"] = time.perf_counter() - t_start
    if not args.no_plots:
        doc["plots"] = bench.plot(doc, args.out, args.name)
    report.save(doc, bench.markdown(doc), args.out, args.name)
    return 0


def _measure(bench: Benchmark, args, ctx: dict) -> tuple[dict, list[dict], dict]:
    """Every cell ``--reps`` times, interleaved, then ``bench.after``: the machine (as the runs
    began), the runs and what ``after`` measured."""
    from measure import machine_info
    from tqdm import tqdm

    blocks = [b for b in bench.cells(args, ctx) if b]
    # Paid once, outside every measurement: the heavy imports and the forkserver's start.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for module in bench.preload:
        importlib.import_module(module)
    if bench.forkserver:
        from loaders import start_forkserver

        start_forkserver()
    gc.freeze()  # the imported modules' own objects: keeps the collection between runs short
    machine = machine_info()

    runs: list[dict] = []
    order = random.Random(args.seed)
    with tqdm(total=sum(map(len, blocks)) * args.reps, unit="run", dynamic_ncols=True) as bar:
        for rep in range(args.reps):
            for block in order.sample(blocks, len(blocks)):
                for cell in order.sample(block, len(block)):
                    bar.set_description(f"rep {rep + 1}/{args.reps} {bench.label(cell)}")
                    row = quietly(lambda: bench.run(cell, rep, args, ctx), args)
                    if line := bench.brief(cell, row):
                        tqdm.write(line)
                    runs.append(row)
                    bar.update()
    return machine, runs, bench.after(args, ctx)


# --------------------------------------------------------------- which shmloader runs
def _git(*a: str, text: bool = True):
    try:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=text, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "" if text else b""


def _digest(files: list[tuple[str, bytes]]) -> str:
    """sha256 over ``*.py`` files (name and content, sorted by name)."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        if name.endswith(".py"):
            digest.update(name.encode() + b"\0" + data)
    return digest.hexdigest()[:12]


def _package_digest(folder: str) -> str:
    """Every ``.py`` file of the package, its subpackages' too, by path within it."""
    def read(f: str) -> bytes:
        with open(os.path.join(folder, f), "rb") as fh:
            return fh.read()

    names_ = [os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder)
              for f in files if f.endswith(".py")]
    return _digest([(f, read(f)) for f in names_])


def _commit_digest(rev: str) -> str:
    names_ = [n for n in _git("ls-tree", "-r", "--name-only", rev, "shmloader/").split() if n.endswith(".py")]
    return _digest([(n[len("shmloader/"):], _git("show", f"{rev}:{n}", text=False)) for n in names_])


def code_state() -> dict:
    """Which shmloader this process imported (and its workers import: they find the same folder),
    as a digest of its files, and whether that is exactly the repository's HEAD commit."""
    import shmloader

    folder = os.path.dirname(os.path.abspath(shmloader.__file__))
    sha = _package_digest(folder)
    commit = _git("rev-parse", "--short", "HEAD").strip()
    snapshot = os.environ.get(_SNAPSHOT_ENV)
    if snapshot:
        head = _commit_digest(snapshot)
        where = f"commit {snapshot}" + ("" if head == sha else " (?? the files differ from it)")
        where += " exactly, run from a `git archive` of it (`--commit`)"
    elif _commit_digest("HEAD") == sha:
        where = f"commit {commit} exactly (the working tree's shmloader/ matched it)"
    else:
        dirty = [line[3:] for line in _git("status", "--porcelain", "--", "shmloader").splitlines() if line]
        where = f"commit {commit} with uncommitted changes to {', '.join(dirty) or '(files not in git)'}"
    return {"commit": snapshot or commit, "package": folder, "package_sha256": sha,
            "describe": f"shmloader at {where} (shmloader/**/*.py sha256 {sha})"}


def _run_at_commit(rev: str, argv: list[str]) -> int:
    """Run the script again against shmloader as it is in commit ``rev``: ``git archive`` of its
    shmloader/ into a temporary folder, first on PYTHONPATH and the run's working folder: workers
    start as ``python -m shmloader.engine.worker``, which puts the working folder before PYTHONPATH, so
    from the repository's root they would run the working tree's worker beside the commit's main
    process. Others may edit the working tree meanwhile."""
    import tempfile

    full = _git("rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    if not full:
        raise SystemExit(f"--commit {rev}: not a commit of {ROOT}")
    with tempfile.TemporaryDirectory(prefix="bench-commit-") as tmp:
        archive = subprocess.run(["git", "archive", full, "shmloader"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, *filter(None, [os.environ.get("PYTHONPATH")])]))
        env[_SNAPSHOT_ENV], env[_CWD_ENV] = full[:7], os.getcwd()
        return subprocess.run([sys.executable, os.path.abspath(sys.argv[0]), *argv], env=env, cwd=tmp).returncode
