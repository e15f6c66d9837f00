"""``shmloader prepare SRC... --out DST``: copies of the videos made for training, and their manifest.

Every video the sources name (folders, manifests, lists, files; URLs and tar shards through
``video.storage``, as ``shmloader scan`` lists them) is decoded and encoded again in a worker
process (``tools.transcode``: NOTE [ A copy's frame i is the source's frame i ]) at the training
size, with a keyframe every ``gop`` frames. DST mirrors the sources' relative paths (a folder's
files below it, a file or URL by its name, a shard's members by theirs); a source in a container
other than MP4/MOV/MKV gets an MP4 copy (``clip.avi`` -> ``clip.mp4``). ``DST/manifest.csv`` has
scan's columns for the copies (labels as the sources gave them), which ``VideoClips.from_csv``
loads without probing, and after them:

    source, source_bytes, source_mtime_ns, spec, note

(``path`` relative to DST, so that the folder can move): the file each copy was made from and
its version, what it was made at, and what was left out (an audio stream the copy's container
cannot hold as it is). The ``audio_*`` columns are the copy's: its audio stream as copied
(the same packets, placed on the copy's timeline as on the source's), empty where it has none.
A file that could not be prepared is a row whose ``problem`` starts with
``unreadable: cannot prepare``, with the cause.

NOTE [ Preparing safely, again ]
Nothing is written inside a source: DST may not be in a folder given as a source, and no copy
may land on a source file. Each copy is written to a hidden temporary name beside its place
(``.NAME.preparing``) and renamed there when whole; a stopped run (Ctrl-C, once or more, an
error) kills its workers, removes their temporary files and writes the manifest of what is
finished (NOTE [ A stop that leaves every output whole ]). A file whose process dies, or that
takes over ``timeout``, is tried once more alone with twice the time before its row says so
(NOTE [ Running per-file work ]). A run
into a DST that has a manifest keeps each earlier row whose source has its recorded size and
modification time, whose copy has the size and modification time its row records and whose
``spec`` is this run's; every other file (new, changed, failed before) is prepared again.
On Ray a try writes ``.NAME.TAG.preparing``, a name of its own (NOTE [ Preparing on Ray ]).
"""

from __future__ import annotations

import collections
import contextlib
import csv
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._checks import check_int, check_seconds
from .._cpus import usable_cpus
from .audioprobe import AUDIO_COLUMNS, with_audio
from ..engine.interrupts import held, stoppable
from ..video.media import is_remote, split_member
from .rescan import check_fail_on, count, fails, read_manifest, unchanged
from .runner import Backend, Failure, Outcome, ProcessBackend, Work, run
from .scan import COLUMNS, blank_row, is_shards, iter_inputs, probe_row
from ..video.storage import LOCAL, Storage
from .transcode import CopySpec, container_of, transcode

__all__ = ["FILE_TIMEOUT", "MANIFEST", "PREPARE_COLUMNS", "Listed", "check_spec", "prepare", "prepare_files",
           "prepare_one", "raise_for_fail_on", "remove_temporaries"]

PREPARE_COLUMNS = COLUMNS + ("source", "source_bytes", "source_mtime_ns", "spec", "note")
MANIFEST = "manifest.csv"

# Files in flight per worker: every worker kept busy, little work lost when a run stops.
_IN_FLIGHT = 2

# Seconds one file may take by default: a two-hour film at short side 320 takes minutes on a core;
# a file that hangs its decoder must not stop the night's run.
FILE_TIMEOUT = 3600.0

# What the copy is probed with for its row: every keyframe decoded (scan's default).
_CHECK = "keyframes"


def _spec_text(spec: CopySpec) -> str:
    size = f"size {spec.size[0]}x{spec.size[1]}" if spec.size else (
        f"short side {spec.short_side}" if spec.short_side else "source size")
    return f"{size}, gop {spec.gop}, crf {spec.crf}"


def _relative(item: str, path: str) -> str:
    """Where the copy of ``path``, listed by the input ``item``, goes below DST."""
    member = split_member(path)
    if member is not None:
        return member[0]
    if is_remote(item):
        return path[len(item):] if item.endswith("/") and path.startswith(item) else path.rsplit("/", 1)[-1]
    item = os.path.abspath(item)
    base = item if os.path.isdir(item) else os.path.dirname(item) if item.lower().endswith(
        (".csv", ".json", ".txt")) else None
    if base is not None and not is_remote(path) and os.path.abspath(path).startswith(base + os.sep):
        return os.path.relpath(path, base)
    return path.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class Listed:
    """A file to prepare: its ``source`` (path or URL), ``label``, ``place`` in its tar shard
    (offset, size; None for other files), where its ``copy`` goes and the copy's muxer ``fmt``."""

    source: str
    label: int
    place: tuple[int, int] | None
    copy: str
    fmt: str


def _listing(inputs: list[str], out: str, storage: Storage, passed_over: collections.Counter) -> list[Listed]:
    """Every video the inputs name, each once, in input order; ValueError where DST is inside a
    source folder, a copy would land on a source, or two sources would have the same copy."""
    out = os.path.realpath(out)
    for item in inputs:
        if not is_remote(item) and not is_shards(item) and not os.path.exists(item):
            raise FileNotFoundError(f"no such file or folder: {item!r}")
        if not is_remote(item) and os.path.isdir(item):
            folder = os.path.realpath(item)
            if out == folder or out.startswith(folder + os.sep):
                raise ValueError(f"--out {out!r} is inside the source folder {item!r}: prepare never writes "
                                 "inside its sources; give a folder outside it")
    listed: list[Listed] = []
    by_copy: dict[str, str] = {}
    for item in inputs:
        for path, label, place, _ in iter_inputs([item], passed_over=passed_over, storage=storage):
            name, fmt = container_of(_relative(item, path))
            copy = os.path.join(out, name)
            if copy in by_copy:
                if by_copy[copy] == path:
                    continue  # listed again (a manifest's spans): one copy
                raise ValueError(f"{by_copy[copy]!r} and {path!r} would both be copied to {copy!r}: "
                                 "rename one, or prepare them into different folders")
            if not is_remote(path) and os.path.realpath(path) == copy:
                raise ValueError(f"the copy of {path!r} would overwrite it: give an --out outside the sources")
            by_copy[copy] = path
            listed.append(Listed(path, label, place, copy, fmt))
    if not listed:
        raise ValueError(f"no video found in {inputs!r}")
    return listed


# A tag naming one attempt at a copy (``temporary``): 12 hex digits.
_TAG = re.compile(r"[0-9a-f]{12}")


def temporary(copy: str, tag: str = "") -> str:
    """Where ``copy`` is written before it is whole: ``.NAME.preparing`` beside it, or with
    ``tag`` (an attempt's own, 12 hex digits) ``.NAME.TAG.preparing``."""
    folder, name = os.path.split(copy)
    return os.path.join(folder, f".{name}.{tag}.preparing" if tag else f".{name}.preparing")


def prepare_one(listed: Listed, spec: CopySpec, storage: Storage, tag: str = "") -> dict:
    """The manifest row of ``listed``'s copy, made (in a worker process or a Ray task) under its
    temporary name (``temporary(copy, tag)``); a file that cannot be prepared gets a row saying
    why, and leaves no file behind."""
    path, label, place, copy = listed.source, listed.label, listed.place, listed.copy
    tmp = temporary(copy, tag)
    extra: dict[str, Any] = {"source": path, "spec": _spec_text(spec)}
    try:
        member = split_member(path)
        if member is not None and place is not None:
            storage.add_members(member[1], {member[0]: place})
        media = storage.resolve(path)
        extra["source_bytes"], extra["source_mtime_ns"] = media.stamp
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        made = transcode(media, tmp, listed.fmt, spec, storage)
        os.replace(tmp, copy)
    except Exception as e:  # noqa: BLE001  # every file gets its row; the reason goes in it
        if os.path.exists(tmp):
            os.unlink(tmp)
        text = storage.redact(" ".join(str(e).split())) or type(e).__name__
        text = text.removesuffix(f": {path!r}")  # FFmpeg's errors end with the path, said before them
        return dict(blank_row(copy, label, f"unreadable: cannot prepare {storage.name(path)}: {text[:300]}"), **extra)
    row = probe_row(copy, label, _CHECK, LOCAL, faster=True)  # NOTE [ Which decoder reads a file ]
    if row["frames"] != made["frames"]:  # the copy must count the frames it was written with
        os.unlink(copy)
        row = blank_row(copy, label, f"unreadable: cannot prepare {storage.name(path)}: its copy counts "
                                  f"{row['frames'] or 'no'} frames, not the {made['frames']} written")
    elif made["problem"]:  # the source's, which the copy's probe cannot see (a cut file's copy is whole)
        row["problem"] = "; ".join(p for p in (made["problem"], row["problem"]) if p)
    return dict(row, note=made["note"], **extra)


def prepare_tagged(listed: Listed, spec: CopySpec, storage: Storage) -> dict:
    """``prepare_one`` under a temporary name of this try's own (a Ray task: NOTE [ Preparing on Ray ])."""
    return prepare_one(listed, spec, storage, tag=uuid.uuid4().hex[:12])


def _earlier(manifest: str) -> dict[str, dict]:
    """source -> row of an earlier run's manifest in DST ({} where there is none)."""
    if not os.path.exists(manifest):
        return {}
    base = os.path.dirname(manifest)
    rows = read_manifest(manifest, PREPARE_COLUMNS, "a manifest of shmloader prepare", "give another --out")
    return {row["source"]: dict(row, path=os.path.normpath(os.path.join(base, row["path"]))) for row in rows}


def _finished(row: dict | None, spec: str, storage: Storage) -> bool:
    """Whether an earlier row stands: its copy made at ``spec``, both files as the row records them."""
    if row is None or row["spec"] != spec or row["problem"].startswith("unreadable"):
        return False
    return unchanged(row["source"], (row["source_bytes"], row["source_mtime_ns"]), storage) \
        and unchanged(row["path"], (row["bytes"], row["mtime_ns"]), LOCAL)


def check_spec(short_side: int | None, size: tuple[int, int] | None, gop: int, crf: int) -> CopySpec:
    """What the copies are made at; ValueError naming the argument that is wrong."""
    if short_side is not None and size is not None:
        raise ValueError("give short_side or size, not both")
    if short_side is not None:
        check_int("short_side", short_side, 2)
    if size is not None:
        if len(size) != 2:
            raise ValueError(f"size must be (height, width), got {size!r}")
        for side in size:
            check_int("size", side, 2)
        size = (int(size[0]), int(size[1]))
    check_int("gop", gop, 1)
    check_int("crf", crf, 0)
    if crf > 51:
        raise ValueError(f"crf must be 0..51 (x264's quality scale, lower is better), got {crf}")
    return CopySpec(short_side, size, gop, crf)


def prepare_files(sources: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                  short_side: int | None = None, size: tuple[int, int] | None = None, gop: int = 16,
                  crf: int = 23, workers: int | None = None, timeout: float | None = FILE_TIMEOUT,
                  fail_on: Iterable[str] | str = (), progress: bool = False,
                  storage_options: dict | None = None, backend: Backend | None = None,
                  tagged: bool = False) -> dict[str, Any]:
    """:func:`prepare`'s work; returns a summary: ``{"manifest", "rows", "prepared", "kept",
    "unreadable", "failed", "problems": {kind: rows}, "first": {kind: (path, problem)},
    "unlabelled", "passed_over": {extension: files}, "source_bytes", "copy_bytes", "seconds"}``
    (bytes of the readable rows' sources and copies; ``failed``: rows with a problem of a kind
    in ``fail_on``, as scan's). The listing, the check of an earlier run's rows and the manifest
    are this process's; the files left are prepared through ``tools.runner`` on ``backend``, by
    default ``workers`` local processes; ``tagged``: each try under a temporary name of its own
    (``prepare_tagged``, for a backend whose lost tries may run on: NOTE [ Preparing on Ray ])."""
    spec = check_spec(short_side, size, gop, crf)
    with stoppable():  # NOTE [ A stop that leaves every output whole ]
        return _prepare_files(sources, out, spec, workers, timeout, fail_on, progress, storage_options, backend,
                              tagged)


def _prepare_files(sources, out, spec: CopySpec, workers: int | None, timeout: float | None, fail_on, progress: bool,
                   storage_options: dict | None, backend: Backend | None, tagged: bool) -> dict[str, Any]:
    if workers is not None:
        check_int("workers", workers, 1)
    if timeout is not None:
        check_seconds("timeout", timeout)
    kinds = check_fail_on(fail_on)
    text = _spec_text(spec)
    out = os.path.abspath(os.fspath(out))
    storage = Storage(storage_options)
    passed_over: collections.Counter = collections.Counter()
    listed = _listing([os.fspath(s) for s in sources], out, storage, passed_over)
    manifest = os.path.join(out, MANIFEST)
    earlier = _earlier(manifest)
    os.makedirs(out, exist_ok=True)
    rows: dict[str, dict] = {}  # source -> its row of this run
    todo = []
    for item in listed:
        old = earlier.get(item.source)
        if old is not None and old["path"] == item.copy and _finished(old, text, storage):
            if AUDIO_COLUMNS[0] not in old:  # the copy's audio, read as a scan reads it
                old = with_audio(old, LOCAL)
            rows[item.source] = dict(old, label=item.label, _kept=True)
        else:
            todo.append(item)
    t0 = time.perf_counter()
    from tqdm import tqdm

    if backend is None:
        backend = ProcessBackend(min(workers or usable_cpus(), max(1, len(todo))), _IN_FLIGHT)
    attempt = prepare_tagged if tagged else prepare_one
    work = (Work(attempt, (item, spec, storage), meta=item) for item in todo)
    late: list[Outcome] = []  # answered as a stop came: their copies are whole, their rows still written
    try:
        with tqdm(total=len(listed), initial=len(rows), unit=" files", desc="prepare", disable=not progress) as bar, \
                contextlib.closing(run(work, backend, timeout, answered=late)) as outcomes:
            for outcome in outcomes:
                rows[outcome.meta.source] = _row(outcome, spec, storage)
                bar.update(1)
    finally:
        with held():  # the workers are gone (the runner's stop): what they left, then the manifest
            for outcome in late:
                rows.setdefault(outcome.meta.source, _row(outcome, spec, storage))
            remove_temporaries(todo, tagged)
            _write(manifest, listed, rows, earlier)
    summary: dict[str, Any] = {"manifest": manifest, "rows": 0, "prepared": 0, "kept": 0, "unreadable": 0,
                               "failed": 0, "problems": collections.Counter(), "first": {}, "unlabelled": 0,
                               "decoders": collections.Counter(), "passed_over": dict(passed_over),
                               "source_bytes": 0, "copy_bytes": 0, "seconds": time.perf_counter() - t0}
    for item in listed:
        row = rows[item.source]
        count(summary, row, kinds)
        if row["problem"].startswith("unreadable"):
            continue
        summary["kept" if row.get("_kept") else "prepared"] += 1
        summary["source_bytes"] += int(row["source_bytes"])
        summary["copy_bytes"] += int(row["bytes"])
    for k in ("problems", "decoders"):
        summary[k] = dict(summary[k])
    return summary


def _row(outcome: Outcome, spec: CopySpec, storage: Storage) -> dict:
    """The row of a file the runner gave back: its try's, or one saying why there is none."""
    if outcome.failure is None:
        return outcome.value
    return failed_row(outcome.meta, spec, storage, _words(outcome.failure))


def _words(failure: Failure) -> str:
    if failure.kind == "timeout":
        return f"took over {failure.seconds:g} s (timeout)"
    return failure.detail if failure.detail != "its process died" else \
        "its process died (a crash in the decoder or encoder)"


def failed_row(listed: Listed, spec: CopySpec, storage: Storage, why: str) -> dict:
    """The row of a listed file that its worker or task did not answer for, saying why."""
    row = blank_row(listed.copy, listed.label, f"unreadable: cannot prepare {storage.name(listed.source)}: {why}")
    return dict(row, source=listed.source, spec=_spec_text(spec))


def remove_temporaries(items: Iterable[Listed], tagged: bool = False) -> None:
    """Remove the temporary files of the listed files ``items``: the untagged one, or with
    ``tagged`` every attempt's (a folder listed once, whatever the number of its files)."""
    if not tagged:
        for item in items:
            tmp = temporary(item.copy)
            if os.path.exists(tmp):
                os.unlink(tmp)
        return
    names: dict[str, set[str]] = collections.defaultdict(set)
    for item in items:
        folder, name = os.path.split(item.copy)
        names[folder].add(name)
    for folder, mine in names.items():
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            continue
        for entry in entries:  # .NAME.TAG.preparing, NAME one of ``mine``
            name, _, tag = entry[1:].removesuffix(".preparing").rpartition(".")
            if entry.startswith(".") and entry.endswith(".preparing") and name in mine and _TAG.fullmatch(tag):
                try:
                    os.unlink(os.path.join(folder, entry))
                except FileNotFoundError:
                    pass  # its attempt renamed or removed it meanwhile


def _write(manifest: str, listed: list[Listed], rows: dict, earlier: dict) -> None:
    """The manifest, rewritten whole (a temporary file, renamed): this run's rows, and an earlier
    run's for the files this run did not reach."""
    tmp = manifest + ".writing"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, PREPARE_COLUMNS, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        for item in listed:
            row = rows.get(item.source, earlier.get(item.source))
            if row is not None:  # paths below DST relative to it: the folder can move
                writer.writerow(dict(row, path=os.path.relpath(row["path"], os.path.dirname(manifest))))
    os.replace(tmp, manifest)


def prepare(sources: Iterable[str | os.PathLike[str]] | str | os.PathLike[str], out: str | os.PathLike[str], *,
            short_side: int | None = None, size: tuple[int, int] | None = None, gop: int = 16, crf: int = 23,
            workers: int | None = None, timeout: float | None = FILE_TIMEOUT, fail_on: Iterable[str] | str = (),
            progress: bool = False, storage_options: dict | None = None) -> str:
    """Copies of the videos ``sources`` name, made for reading random clips fast, in the folder
    ``out``; returns the path of their manifest, ``out/manifest.csv``, for
    ``VideoClips.from_csv``.

    Each copy has its source's frames as the loader reads them (frame ``i`` is frame ``i``,
    with its presentation time; rotation applied, 8-bit 4:2:0 H.264), scaled to ``short_side``
    (keeping the aspect ratio) or to ``size=(height, width)`` (both None: the source's size;
    4:2:0 sides are even, an odd one is rounded up), with a keyframe every ``gop`` frames and
    x264's quality ``crf`` (lower: better and larger). ``out`` mirrors the sources' relative
    paths; it may not be inside a source folder. ``workers``: processes, one per CPU by
    default. A run into an ``out`` prepared before keeps the copies whose sources are unchanged.
    A file that takes over ``timeout`` seconds (None: no limit), or whose process dies, is tried
    once more alone with twice the time, and then its row says so.

    A file that cannot be prepared is a manifest row that says why (the others are prepared);
    ValueError after the manifest is written when a row has a problem of a kind in ``fail_on``
    (scan's kinds; ``()``: never)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    summary = prepare_files(sources, out, short_side=short_side, size=size, gop=gop, crf=crf, workers=workers,
                            timeout=timeout, fail_on=fail_on, progress=progress, storage_options=storage_options)
    return raise_for_fail_on(summary, fail_on)


def raise_for_fail_on(summary: dict[str, Any], fail_on: Iterable[str] | str) -> str:
    """The manifest's path of a prepare's ``summary``; ValueError naming the first row with a
    problem of a kind in ``fail_on`` where there is one."""
    if summary["failed"]:
        kinds = check_fail_on(fail_on)
        with open(summary["manifest"], newline="") as f:
            bad = [r for r in csv.DictReader(f) if fails(r["problem"], kinds)]
        raise ValueError(f"{len(bad)} of {summary['rows']} rows of {summary['manifest']} have a problem of "
                         f"fail_on {kinds}; the first: {bad[0]['source']}: {bad[0]['problem']}")
    return str(summary["manifest"])
