"""``shmloader scan PATH...``: probe every video once, in worker processes, into a manifest.

Inputs are folders (class sub-folders give labels, as ``VideoClips.from_folder``; a folder
without class folders is scanned unlabelled), manifests (CSV with a ``path`` column and an
optional ``label`` column, or JSON) and lists (one path per line), or video files; and, read
through fsspec (``video.storage``), URLs of files, prefixes ending in ``/`` (``s3://bucket/videos/``:
every video below, class sub-folders giving labels) and tar shards, their patterns included
(``s3://b/shard-{000..099}.tar``: every video member, as ``tar://key.mp4::<shard>``, labelled
by its ``key.cls`` where there is one). Each file
is probed (``video.probe``, ``check="keyframes"`` by default: every keyframe decoded, so a size
change is found in any codec) and written as one CSV row, in input order:

    path, label, frames, width, height, fps, duration, codec, pix_fmt, rotation, decoder,
    problem, bytes, mtime_ns, offset, check, audio_codec, audio_rate, audio_channels,
    audio_start, audio_seconds

``bytes`` and ``mtime_ns`` say which version of the file the row describes (remotely,
``mtime_ns`` is a hash of the object's ETag or modification time); ``offset`` is where a tar
member's data starts in its shard (empty for other files), so that ``from_csv`` hands the
members' places to the workers and no shard's headers are read again. The ``audio_*`` columns
describe the file's first audio stream (``tools.audioprobe``; empty without one): ``audio_start``
is where its sound starts, in seconds after the video's first frame.

``decoder`` is the one the loader will use reading from the row (see NOTE [ Which decoder reads
a file ] in ``video.probe``: decord also for a file PyAV reads only for speed, as PyAV would need
a probe first; with ``--check keyframes`` or ``frames`` a file decord would read is checked by
seeking into it). With ``measure_cut`` (``--measure-cut LEN,STEP[,HxW[,K]]``), three columns
follow ``COLUMNS``: ``cut``, ``decord_ms``, ``pyav_ms``: where both decoders read a file exactly,
each is timed on a few seeded clips of that cut (``tools.evidence.measure_decoders``) and
``decoder`` is the one that took less CPU a read; the loader reads such a row with its decoder
and measures nothing (a ``pyav`` row costs a worker a probe of the file first, kept for later
clips). ``problem`` is empty when the file is fine, else ``unreadable: ...``,
``damaged at frame N``, ``truncated at frame N of M``, ``size change at frame N``, ``edit list
drops N frames``, ``timestamp gap at frame N``, ``variable frame rate``, ``decord seeks wrong
at frame N (read by PyAV)``... (``; `` between several). A probe that passes ``timeout`` or
whose process dies (which breaks the whole pool) is tried once more alone, with twice the
time, before its file is blamed (NOTE [ Running per-file work ] in ``tools.runner``):
``unreadable: probe took over N s`` (N = 2 x ``timeout``) or ``unreadable: probe crashed``
when that try fails too.
Files in the folders given without a video extension are passed over and counted in the summary.
``VideoClips.from_csv`` reads the manifest and spares its workers the probes. When an input
manifest has ``start`` / ``end`` columns (time spans, see ``VideoClips``), the manifest written
keeps them after those columns, one row per input row; rows naming a file just probed reuse its
probe (a video of many spans is probed once).

Memory stays flat in the number of files: inputs are walked lazily, at most a few probes per
worker are in flight, and rows go to the file as they come. A scan that stopped (or was
stopped) resumes: rows already in ``--out`` are checked against the inputs and skipped.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import itertools
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from ..video.manifest import URL, VIDEO_EXTENSIONS, iter_manifest, walk_folder
from .._checks import check_choice, check_int, check_seconds
from .._cpus import usable_cpus
from .audioprobe import AUDIO_COLUMNS, audio_cells, with_audio
from .evidence import measure_decoders, probe_with_evidence
from ..engine.interrupts import held, stoppable
from ..video.measuring import Cut
from ..video.media import is_remote, member_url, split_member
from ..video.probe import CHECKS
from .rescan import changed, check_fail_on, count, earlier_rows, stale
from .runner import Outcome, ProcessBackend, Ready, Work, run
from ..video.shards import expand, shard_samples
from ..video.storage import Storage, tar_members

__all__ = ["scan", "COLUMNS"]


COLUMNS = ("path", "label", "frames", "width", "height", "fps", "duration", "codec", "pix_fmt", "rotation",
           "decoder", "problem", "bytes", "mtime_ns", "offset", "check", *AUDIO_COLUMNS)
# Written after COLUMNS when an input manifest has either (time spans, in seconds).
SPAN_COLUMNS = ("start", "end")
# Written after COLUMNS with measure_cut: the cut, and CPU ms a read of it by each decoder.
MEASURE_COLUMNS = ("cut", "decord_ms", "pyav_ms")

# Probes kept for rows that name a file again (the spans of one video usually follow each other).
_RECENT = 4096

# A scan reads whole remote files in order (every keyframe): larger blocks, fewer requests.
_SCAN_BLOCK = 4 << 20

# Probes in flight per worker: enough to keep every worker busy, few enough that memory and
# the work lost to a stuck probe stay small.
_IN_FLIGHT = 4


def iter_inputs(inputs: Iterable[str], extensions=VIDEO_EXTENSIONS,
                passed_over: collections.Counter | None = None,
                storage: Storage | None = None) -> Iterator[tuple[str, int, tuple[int, int] | None, dict]]:
    """(absolute path or URL, label or -1, a tar member's (offset, size) or None, span cells) of
    every video the inputs name, in a fixed order; the span cells are a manifest row's ``start``
    / ``end`` (``{}`` for other inputs). Files in folders without a video extension are counted
    by extension in ``passed_over``."""
    storage = storage or Storage()
    for item in inputs:
        item = os.fspath(item)
        if is_shards(item):
            yield from _shard_members(item, storage, extensions, passed_over)
            continue
        if is_remote(item):
            if item.endswith("/"):
                yield from _remote_folder(item, storage, extensions, passed_over)
            else:
                yield item, -1, None, {}
            continue
        item = os.path.abspath(item)
        if os.path.isdir(item):
            for path, label in walk_folder(item, extensions, loose=True, passed_over=passed_over):
                yield path, label, None, {}
        elif item.lower().endswith((".csv", ".json")):
            for path, _, row in iter_manifest(item, label_column=None):
                given = row.get("label")
                span = {c: "" if row[c] is None else row[c] for c in SPAN_COLUMNS if c in row}
                yield path, int(given) if given not in (None, "") else -1, None, span
        elif item.lower().endswith(".txt"):
            base = os.path.dirname(item)
            with open(item) as f:
                for line in f:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        yield (line if URL.match(line) else os.path.normpath(os.path.join(base, line))), -1, None, {}
        else:
            yield item, -1, None, {}


def is_shards(item: str) -> bool:
    """A tar shard or a pattern of them (a path, URL, glob or brace pattern ending in .tar)."""
    return item.lower().endswith(".tar") and split_member(item) is None


def _shard_members(item: str, storage: Storage, extensions, passed_over) -> Iterator:
    exts = tuple(e.lower() for e in extensions)
    for shard in expand(item, storage):
        members = tar_members(storage, shard)
        samples = shard_samples(members)
        key_of = {name: key for key, parts in samples.items() for name in parts.values()}
        for name, place in members.items():
            if not name.lower().endswith(exts):
                if passed_over is not None and not name.lower().endswith((".cls", ".json", ".txt")):
                    passed_over[os.path.splitext(name)[1].lower() or "(none)"] += 1
                continue
            cls = samples[key_of[name]].get("cls") if name in key_of else None
            text = storage.read_text(member_url(cls, shard)) if cls else ""
            label = int(text) if text.lstrip("-").isdigit() else -1
            yield member_url(name, shard), label, place, {}


def _remote_folder(prefix: str, storage: Storage, extensions, passed_over) -> Iterator:
    """Every video below the remote ``prefix``, sorted; files directly in it unlabelled, those in
    class sub-folders labelled by the sorted class names (as ``walk_folder``)."""
    scheme = prefix.split("://", 1)[0] + "://"
    found = storage.call(prefix, "listing", lambda fs: fs.find(prefix))
    if not found:
        raise ValueError(f"nothing is listed under {storage.name(prefix)} (a store that cannot list, such as a "
                         "plain HTTP server, needs the files' URLs, e.g. in a .txt list)")
    urls = sorted(f if "://" in f else scheme + f for f in found)
    exts = tuple(e.lower() for e in extensions)
    videos = []
    for url in urls:
        if url.lower().endswith(exts):
            videos.append(url)
        elif passed_over is not None:
            passed_over[os.path.splitext(url)[1].lower() or "(none)"] += 1
    rel = [u[len(prefix):] if u.startswith(prefix) else u.split("/")[-1] for u in videos]
    classes = sorted({r.split("/", 1)[0] for r in rel if "/" in r})
    loose = [u for u, r in zip(videos, rel) if "/" not in r]
    yield from ((u, -1, None, {}) for u in loose)
    for u, r in zip(videos, rel):
        if "/" in r:
            yield u, classes.index(r.split("/", 1)[0]), None, {}


def _columns(inputs: list[str], measure: bool) -> tuple[str, ...]:
    """The manifest's columns: ``COLUMNS``, ``MEASURE_COLUMNS`` where ``measure``, and
    ``SPAN_COLUMNS`` when an input manifest has a span column."""
    columns = COLUMNS + (MEASURE_COLUMNS if measure else ())
    for item in inputs:
        item = os.fspath(item)
        if os.path.isfile(item) and item.lower().endswith((".csv", ".json")):
            row = next((r for _, _, r in iter_manifest(os.path.abspath(item), label_column=None)), {})
            if any(c in row for c in SPAN_COLUMNS):
                return columns + SPAN_COLUMNS
    return columns


def blank_row(path: str, label: int, problem: str = "") -> dict[str, Any]:
    """A row with only its path, label and problem filled in."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
    row.update(path=path, label=label, problem=problem)
    return row


def probe_row(path: str, label: int, check: str, storage: Storage, place: tuple[int, int] | None = None,
         earlier: dict | None = None, faster: bool = False, cut: Cut | None = None) -> dict:
    """One manifest row (in a worker process); ``earlier`` (a row of an earlier run) is returned
    where the file's stamp has not changed since, its audio cells read where it has none.
    ``faster``: a file PyAV reads for speed alone keeps ``pyav`` in its row (prepare's copies).
    ``cut``: the decoders timed on it where both read the file exactly (``MEASURE_COLUMNS``)."""
    if earlier is not None:
        try:
            member = split_member(path)
            if member is not None and place is not None:
                storage.add_members(member[1], {member[0]: place})
            stamp = storage.resolve(path).stamp
        except Exception:
            stamp = None
        if stamp is not None and [str(x) for x in stamp] == [earlier["bytes"], earlier["mtime_ns"]]:
            return dict(earlier if AUDIO_COLUMNS[0] in earlier else with_audio(earlier, storage), _kept=True)
        return dict(probe_row(path, label, check, storage, place, cut=cut), _changed=True)
    row = blank_row(path, label)
    row["check"] = check
    try:
        member = split_member(path)
        if place is not None and member is not None:
            storage.add_members(member[1], {member[0]: place})
            row["offset"] = place[0]
        media = storage.resolve(path)
        row["bytes"], row["mtime_ns"] = media.stamp
        info = probe_with_evidence(media, check=check, storage=storage)
        audio, why = audio_cells(media, info, storage, whole=check != "headers")
    except Exception as e:  # every file gets its row; the reason goes in it
        text = storage.redact(" ".join(str(e).split())) or type(e).__name__
        row["problem"] = f"unreadable: {text[:300]}"
        return row
    row.update(frames=info.frames, width=info.width, height=info.height, fps=f"{info.fps:.6g}",
               duration=f"{info.duration:.6g}", codec=info.codec, pix_fmt=info.pix_fmt, rotation=info.rotation,
               decoder="decord" if info.pyav_faster and not faster else info.decoder,
               problem="; ".join(p for p in (info.problem, why) if p), **audio)
    if info.keyframes is not None and len(info.keyframes):  # for the summary (not a column)
        row["_gop"] = round(info.frames / len(info.keyframes))
    ms = None if cut is None else measure_decoders(info, cut)
    if cut is not None:
        row["cut"] = str(cut)
    if ms is not None:
        row.update(decord_ms=ms["decord"], pyav_ms=ms["pyav"], decoder=min(ms, key=ms.__getitem__))
    return row


def scan(inputs: Iterable[str], out: str, *, workers: int | None = None, check: str = "keyframes",
         timeout: float = 120.0, overwrite: bool = False, progress: bool = True,
         storage_options: dict | None = None, fail_on: Iterable[str] = (), measure_cut: str | None = None) -> dict:
    """Probe every video the inputs name into the CSV manifest ``out``; returns a summary:
    ``{"rows", "resumed", "kept", "rechecked": {why: rows}, "decoders": {...}, "problems": {kind:
    rows}, "first": {kind: (path, problem)}, "unreadable", "unlabelled", "failed", "passed_over":
    {extension: files}}``, counting every row of the manifest, earlier runs' included.
    A problem's kind is its text with numbers as ``N`` and without the parenthesis
    (``truncated at frame N of N``); ``first`` is the first row of each kind; ``unlabelled``
    counts rows labelled -1; ``failed`` counts the rows that have a problem of a kind in
    ``fail_on`` (see :func:`fails`); ``passed_over`` counts the files in the folders given
    that have no video extension; ``gops`` and ``short_sides`` count the readable rows by
    frames per keyframe (rows probed in this run) and by short side, for
    :func:`~shmloader.tools.rescan.preparing_pays`. ``storage_options``: for URLs, as ``VideoClips``'.
    ``measure_cut``: ``"LEN,STEP[,HxW[,K]]"``, the decoders timed on each file both read exactly,
    the faster in its row (``MEASURE_COLUMNS``); an earlier row measured for another cut, or
    none, is done again.

    Where ``out`` holds rows of an earlier run of the same inputs (``resumed`` of them), a row
    is kept (``kept``) unless its file's size or modification time changed, ``check`` is deeper
    than the row's, or its probe timed out or crashed: those are probed again (``rechecked``,
    by reason). Labels and spans always come from the inputs. The manifest is then rewritten
    whole (a temporary file, renamed), and a run stopped after the earlier rows keeps its rows."""
    check_choice("check", check, CHECKS)
    if workers is not None:
        check_int("workers", workers, 1)
    check_seconds("timeout", timeout)
    cut = None if measure_cut is None else Cut.parse(measure_cut)
    fail_on = check_fail_on(fail_on)
    passed_over: collections.Counter = collections.Counter()
    storage = Storage(storage_options, block_size=_SCAN_BLOCK)
    inputs = list(inputs)
    if os.path.isdir(out):
        raise ValueError(f"--out {out!r} is a folder: give the manifest's file, e.g. "
                         f"{os.path.join(out, 'manifest.csv')!r}")
    for given in map(os.fspath, inputs):  # a mistyped path is an error, not a row
        if not (is_remote(given) or is_shards(given) or os.path.exists(given)):
            raise FileNotFoundError(f"no such file or folder: {given!r}")
        if not (is_remote(given) or is_shards(given)) and os.path.realpath(given) == os.path.realpath(out):
            raise ValueError(f"--out {out!r} is one of the inputs: give another file for the manifest")
    columns = _columns(inputs, cut is not None)
    todo = iter_inputs(inputs, passed_over=passed_over, storage=storage)
    first_item = next(todo, None)  # nothing to probe: an error (from_csv refuses an empty manifest)
    if first_item is None:
        raise ValueError(f"no video found in {inputs!r}")
    todo = itertools.chain([first_item], todo)
    earlier = earlier_rows(out, columns, MEASURE_COLUMNS if cut else ()) if os.path.exists(out) and not overwrite \
        else iter(())
    first = next(earlier, None)  # rows of an earlier run: the new rows are written beside them
    earlier = itertools.chain([first], earlier) if first is not None else earlier
    summary: dict[str, Any] = {"rows": 0, "resumed": 0, "kept": 0, "rechecked": collections.Counter(),
               "decoders": collections.Counter(), "problems": collections.Counter(), "unreadable": 0,
               "passed_over": passed_over, "first": {}, "unlabelled": 0, "failed": 0,
               "gops": collections.Counter(), "short_sides": collections.Counter()}
    with stoppable():  # NOTE [ A stop that leaves every output whole ]
        work = _work(todo, earlier, check, storage, summary, out, cut)
        backend = ProcessBackend(workers or usable_cpus(), _IN_FLIGHT)
        _write(out, first is not None, columns, work, earlier, summary, backend, timeout, fail_on,
               _total(inputs) if progress else None, progress)
    for k in ("decoders", "problems", "passed_over", "rechecked", "gops", "short_sides"):
        summary[k] = dict(summary[k])
    return summary


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a row takes from its input rather than from the probe: the path, label and span cells."""

    path: str
    label: int
    span: dict


def _work(todo: Iterator, earlier: Iterator[dict], check: str, storage: Storage, summary: dict,
          out: str, cut: Cut | None) -> Iterator[Work | Ready]:
    """Each input's probe, or its earlier row where that stands (``resumed`` and ``rechecked``
    counted into ``summary``); ValueError where the earlier rows are not of these inputs."""
    for path, label, place, span in todo:
        entry = _Entry(path, label, span)
        old = next(earlier, None)
        if old is None:  # a file listed again (a video's spans) shares its probe
            yield Work(probe_row, (path, label, check, storage, place, None, False, cut), key=path, meta=entry)
            continue
        summary["resumed"] += 1
        if old["path"] != path:
            raise ValueError(f"{out!r} row {summary['resumed'] + 1} is {old['path']!r}, but the inputs "
                             f"list {path!r} there: not a scan of these inputs; pass --overwrite to start again")
        why = stale(old, check)
        if why is None and cut is not None and old.get("cut") != str(cut):
            why = "measured for another cut" if old.get("cut") else "not measured"
        moved = changed(old) if why is None else True
        if why is None and moved:
            why = "changed since"
        if why is not None:
            summary["rechecked"][why] += 1
            yield Work(probe_row, (path, label, check, storage, place, None, False, cut), key=path, meta=entry)
        elif moved is None or AUDIO_COLUMNS[0] not in old:  # remote, or no audio cells: its worker
            yield Work(probe_row, (path, label, check, storage, place, old, False, cut), meta=entry)  # compares the stamp
        else:
            yield Ready(dict(old, _kept=True), entry)


def _write(out: str, resuming: bool, columns: tuple[str, ...], work: Iterator[Work | Ready], earlier: Iterator[dict],
           summary: dict, backend: ProcessBackend, timeout: float, fail_on: tuple[str, ...], total: int | None,
           progress: bool) -> None:
    """The manifest ``out``, a row an input as the probes answer, in input order. ``resuming``:
    ``out`` has earlier rows (``earlier``, read as ``work`` reaches them); the rows then go to a
    temporary file beside it, renamed over it when done, or when stopped where they cover the
    earlier ones (the earlier file stays otherwise)."""
    from tqdm import tqdm

    target = f"{out}.scanning" if resuming else out
    written = 0
    f = open(target, "w", newline="")
    try:
        with tqdm(unit=" files", desc="scan", disable=not progress, total=total) as bar:
            writer = csv.DictWriter(f, columns, lineterminator="\n", extrasaction="ignore")
            writer.writeheader()
            with contextlib.closing(run(work, backend, timeout, reuse=_RECENT)) as outcomes:
                for outcome in outcomes:
                    row = _row(outcome, summary)
                    writer.writerow(row)
                    written += 1
                    f.flush()
                    count(summary, row, fail_on, shapes=True)
                    bar.update(1)
        if next(earlier, None) is not None:  # the inputs end before the earlier rows do
            raise ValueError(f"{out!r} has more rows than the inputs give: not a scan of these inputs; "
                             "pass --overwrite to start again")
    except BaseException:
        with held():
            f.close()
            if target != out:
                if written >= summary["resumed"] and summary["resumed"] and next(earlier, None) is None:
                    os.replace(target, out)
                else:
                    os.unlink(target)
        raise
    with held():
        f.close()
        if target != out:
            os.replace(target, out)


def _row(outcome: Outcome, summary: dict) -> dict[str, Any]:
    """The manifest row of an input: its probe's (labelled and spanned as the input says), or
    one saying why the probe gave none; an earlier run's row kept or found changed is counted."""
    entry = outcome.meta
    if outcome.failure is not None:
        why = "probe crashed" if outcome.failure.kind == "crash" else f"probe took over {outcome.failure.seconds:g} s"
        row = blank_row(entry.path, entry.label, f"unreadable: {why}")
    else:
        row = dict(outcome.value, label=entry.label)
    if row.pop("_kept", False):
        summary["kept"] += 1
    if row.pop("_changed", False):  # a remote file whose stamp its worker found changed
        summary["rechecked"]["changed since"] += 1
    row.update(entry.span)
    return row


def _total(inputs: list[str]) -> int | None:
    """The number of rows the inputs give, for the progress bar; None where counting would read
    remote listings or shards a second time."""
    if any(is_remote(os.fspath(i)) or is_shards(os.fspath(i)) for i in inputs):
        return None
    try:
        return sum(1 for _ in iter_inputs(inputs))
    except (OSError, ValueError):
        return None  # the scan itself reports it
