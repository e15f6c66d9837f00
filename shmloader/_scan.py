"""``shmloader scan PATH...``: probe every video once, in worker processes, into a manifest.

Inputs are folders (class sub-folders give labels, as ``VideoClips.from_folder``; a folder
without class folders is scanned unlabelled), manifests (CSV with a ``path`` column and an
optional ``label`` column, or JSON) and lists (one path per line), or video files. Each file
is probed (``_probe``, ``check="keyframes"`` by default: every keyframe decoded, so a size
change is found in any codec) and written as one CSV row, in input order:

    path, label, frames, width, height, fps, duration, codec, pix_fmt, rotation, decoder,
    problem, bytes, mtime_ns

``decoder`` is the one the loader will use (see NOTE [ Which decoder reads a file ] in
``_probe``: with ``--check keyframes`` or ``frames`` a file decord would read is checked by
seeking into it); ``problem`` is empty when the file is fine, else ``unreadable: ...``,
``damaged at frame N``, ``truncated at frame N of M``, ``size change at frame N``, ``edit list
drops N frames``, ``timestamp gap at frame N``, ``variable frame rate``, ``decord seeks wrong
at frame N (read by PyAV)``... (``; `` between several). Files in the folders given without a
video extension are passed over and counted in the summary.
``VideoClips.from_csv`` reads the manifest and spares its workers the probes.

Memory stays flat in the number of files: inputs are walked lazily, at most a few probes per
worker are in flight, and rows go to the file as they come. A scan that stopped (or was
stopped) resumes: rows already in ``--out`` are checked against the inputs and skipped.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import csv
import multiprocessing
import os
import sys
from typing import Iterable, Iterator

from ._manifest import VIDEO_EXTENSIONS, iter_manifest, walk_folder
from ._probe import CHECKS, probe

__all__ = ["scan", "COLUMNS"]

COLUMNS = ("path", "label", "frames", "width", "height", "fps", "duration", "codec", "pix_fmt", "rotation",
           "decoder", "problem", "bytes", "mtime_ns")

# Probes in flight per worker: enough to keep every worker busy, few enough that memory and
# the work lost to a stuck probe stay small.
_IN_FLIGHT = 4


def iter_inputs(inputs: Iterable[str], extensions=VIDEO_EXTENSIONS,
                passed_over: collections.Counter | None = None) -> Iterator[tuple[str, int]]:
    """(absolute path, label or -1) of every video the inputs name, in a fixed order; files in
    folders without a video extension are counted by extension in ``passed_over``."""
    for item in inputs:
        item = os.path.abspath(os.fspath(item))
        if os.path.isdir(item):
            yield from walk_folder(item, extensions, loose=True, passed_over=passed_over)
        elif item.lower().endswith((".csv", ".json")):
            for path, _, row in iter_manifest(item, label_column=None):
                label = row.get("label")
                yield path, int(label) if label not in (None, "") else -1
        elif item.lower().endswith(".txt"):
            base = os.path.dirname(item)
            with open(item) as f:
                for line in f:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        yield os.path.normpath(os.path.join(base, line)), -1
        else:
            yield item, -1


def _blank(path: str, label: int, problem: str = "") -> dict:
    """A row with only its path, label and problem filled in."""
    row = dict.fromkeys(COLUMNS, "")
    row.update(path=path, label=label, problem=problem)
    return row


def _row(path: str, label: int, check: str) -> dict:
    """One manifest row (in a worker process)."""
    row = _blank(path, label)
    try:
        st = os.stat(path)
        row.update(bytes=st.st_size, mtime_ns=st.st_mtime_ns)
        info = probe(path, check=check)
    except Exception as e:  # every file gets its row; the reason goes in it
        text = " ".join(str(e).split()) or type(e).__name__
        row["problem"] = f"unreadable: {text[:300]}"
        return row
    row.update(frames=info.frames, width=info.width, height=info.height, fps=f"{info.fps:.6g}",
               duration=f"{info.duration:.6g}", codec=info.codec, pix_fmt=info.pix_fmt, rotation=info.rotation,
               decoder=info.decoder, problem=info.problem)
    return row


def _resume(out: str, inputs: Iterator[tuple[str, int]]) -> int:
    """Rows already in ``out``; checks they are the inputs' first rows, in order."""
    done = 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return 0
        if tuple(reader.fieldnames) != COLUMNS:
            raise ValueError(f"{out!r} is not a scan manifest (its columns are {reader.fieldnames}); "
                             "pass --overwrite or another --out")
        for row in reader:
            want = next(inputs, None)
            if want is None or want[0] != row["path"]:
                raise ValueError(f"{out!r} row {done + 2} is {row['path']!r}, but the inputs list "
                                 f"{want[0] if want else 'nothing'!r} there: not a scan of these inputs; "
                                 "pass --overwrite to start again")
            done += 1
    return done


def scan(inputs: Iterable[str], out: str, *, workers: int | None = None, check: str = "keyframes",
         timeout: float = 120.0, overwrite: bool = False, progress: bool = True) -> dict:
    """Probe every video the inputs name into the CSV manifest ``out``; returns a summary:
    ``{"rows", "resumed", "decoders": {...}, "problems": {...}, "unreadable", "passed_over":
    {extension: files}}`` (files in the folders given that have no video extension)."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    workers = workers or len(os.sched_getaffinity(0))
    passed_over: collections.Counter = collections.Counter()
    todo = iter_inputs(inputs, passed_over=passed_over)
    resumed = 0
    if os.path.exists(out) and not overwrite:
        resumed = _resume(out, todo)
    mode = "a" if resumed else "w"
    summary = {"rows": resumed, "resumed": resumed, "decoders": collections.Counter(),
               "problems": collections.Counter(), "unreadable": 0, "passed_over": passed_over}
    from tqdm import tqdm

    with open(out, mode, newline="") as f, tqdm(unit="file", desc="scan", disable=not progress,
                                                initial=resumed) as bar:
        writer = csv.DictWriter(f, COLUMNS)
        if not resumed:
            writer.writeheader()
        pending: collections.deque = collections.deque()
        pool = _pool(workers)
        try:
            while True:
                while len(pending) < workers * _IN_FLIGHT:
                    item = next(todo, None)
                    if item is None:
                        break
                    pending.append((item, pool.submit(_row, item[0], item[1], check)))
                if not pending:
                    break
                (path, label), fut = pending.popleft()
                try:
                    row = fut.result(timeout=timeout)
                except (cf.TimeoutError, cf.process.BrokenProcessPool) as e:
                    why = f"probe took over {timeout:g} s" if isinstance(e, cf.TimeoutError) else "probe crashed"
                    row = _blank(path, label, f"unreadable: {why}")
                    # The pool cannot cancel one running probe: start a new pool, resubmit the rest.
                    _kill(pool)
                    pool = _pool(workers)
                    pending = collections.deque((it, pool.submit(_row, it[0], it[1], check)) for it, _ in pending)
                writer.writerow(row)
                f.flush()
                _count(summary, row)
                bar.update(1)
        finally:
            _kill(pool)
    for k in ("decoders", "problems", "passed_over"):
        summary[k] = dict(summary[k])
    return summary


def _pool(workers: int) -> cf.ProcessPoolExecutor:
    # forkserver: probes run in clean processes whatever the caller has imported (TensorFlow...)
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))


def _kill(pool: cf.ProcessPoolExecutor) -> None:
    for p in list((pool._processes or {}).values()):
        p.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _count(summary: dict, row: dict) -> None:
    summary["rows"] += 1
    problem = row["problem"]
    if problem.startswith("unreadable"):
        summary["unreadable"] += 1
        summary["problems"]["unreadable"] += 1
        return
    summary["decoders"][row["decoder"]] += 1
    for p in filter(None, problem.split("; ")):
        kind = " ".join(w for w in p.split(" (")[0].split() if not w.isdigit() and not w.endswith("s)"))
        summary["problems"][kind] += 1


def main(args) -> int:
    try:
        summary = scan(args.paths, args.out, workers=args.workers, check=args.check, timeout=args.timeout,
                       overwrite=args.overwrite, progress=not args.quiet)
    except ValueError as e:
        print(f"shmloader scan: {e}", file=sys.stderr)
        return 2
    print(f"{summary['rows']} files in {args.out}" + (f" ({summary['resumed']} from an earlier run)"
                                                      if summary["resumed"] else ""), file=sys.stderr)
    for name, n in sorted(summary["decoders"].items()):
        print(f"  decoder {name}: {n}", file=sys.stderr)
    for name, n in sorted(summary["problems"].items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {n}", file=sys.stderr)
    skipped = summary["passed_over"]
    if skipped:
        kinds = ", ".join(f"{ext} {n}" for ext, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"passed over {sum(skipped.values())} files without a video extension ({kinds})", file=sys.stderr)
    return 0
