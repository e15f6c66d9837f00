"""The rows of a manifest written before: read back and kept or done again (one way for
``shmloader scan``'s rows and ``shmloader prepare``'s copies: a row stands while its file has
the size and modification time it records), and every row counted into the summary, with the
problem kinds ``--fail-on`` takes."""

from __future__ import annotations

import csv
import itertools
import re
from typing import Iterable, Iterator

from .audioprobe import AUDIO_COLUMNS
from ..video.media import is_remote, split_member
from ..video.probe import CHECKS, LONG_GOP
from ..video.storage import LOCAL, Storage

__all__ = ["FAIL_KINDS", "PREPARED_SIDE", "RUN_PROBLEMS", "changed", "check_fail_on", "count", "earlier_rows",
           "fails", "preparing_pays", "problem_kind", "read_manifest", "stale", "unchanged"]

# Problems that say how the probe ran, not what the file is: a later run probes such rows again.
RUN_PROBLEMS = ("unreadable: probe took over", "unreadable: probe crashed")


def read_manifest(path: str, columns: tuple[str, ...], what: str, instead: str,
                  optional: tuple[tuple[str, ...], ...] = (AUDIO_COLUMNS,)) -> Iterator[dict]:
    """The rows of the manifest ``path`` an earlier run wrote, lazily; ValueError (saying
    ``instead``) where its columns are not ``columns``, or those without some of the ``optional``
    groups (a manifest from before them: its rows lack those keys)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        try:
            fields = reader.fieldnames
        except UnicodeDecodeError:  # a video or other binary file
            raise ValueError(f"{path!r} is not {what} (not text); {instead}") from None
        if fields is None:
            return
        left = [()] + [group for n in range(1, len(optional) + 1) for group in _unions(optional, n)]
        if tuple(fields) not in [tuple(c for c in columns if c not in out) for out in left]:
            raise ValueError(f"{path!r} is not {what} (its columns are {fields}); {instead}")
        yield from reader


def _unions(groups: tuple[tuple[str, ...], ...], n: int) -> Iterator[tuple[str, ...]]:
    for chosen in itertools.combinations(groups, n):
        yield tuple(c for g in chosen for c in g)


def unchanged(path: str, recorded: tuple[str, str], storage: Storage) -> bool:
    """Whether the file ``path`` has the (bytes, mtime_ns) an earlier row ``recorded`` (a file
    that cannot be asked has none: ``("", "")``, as the row of a file that was not there)."""
    try:
        now = [str(x) for x in storage.stamp(path)]
    except (OSError, ValueError):
        now = ["", ""]
    return now == list(recorded)


def earlier_rows(out: str, columns: tuple[str, ...], measured: tuple[str, ...] = ()) -> Iterator[dict]:
    """The rows of the scan manifest ``out`` written by an earlier run, lazily. Rows of a manifest
    from before the ``check`` column have it empty; those from before the audio columns have
    none (``tools.scan`` reads their audio); those of a run that did not measure the decoders,
    none of the ``measured`` columns."""
    for row in read_manifest(out, columns, "a scan manifest", "pass --overwrite or another --out",
                             optional=(("check",), AUDIO_COLUMNS) + ((measured,) if measured else ())):
        row.setdefault("check", "")
        yield row


def stale(row: dict, check: str) -> str | None:
    """Why a row of an earlier run must be probed again, or None to keep it (the file's stamp
    is compared apart, see ``changed``)."""
    if row["problem"].startswith(RUN_PROBLEMS):
        return "earlier probe timed out or crashed"
    if row["check"] not in CHECKS:
        return "no check recorded"
    if CHECKS.index(row["check"]) < CHECKS.index(check):
        return f"deeper --check {check}"
    return None


def changed(row: dict) -> bool | None:
    """Whether a local file's size or modification time differs from its row's (a missing file
    is a change only where its row had a stamp); None for a remote file (its worker compares)."""
    path = row["path"]
    if is_remote(path) or split_member(path) is not None:
        return None
    return not unchanged(path, (row["bytes"], row["mtime_ns"]), LOCAL)


# What --fail-on takes besides "any": the start of a problem's text (FAIL_KINDS lists the usual ones).
FAIL_KINDS = ("unreadable", "damaged", "truncated", "size change", "edit list", "timestamp gap",
              "variable frame rate", "container says", "decord seeks wrong", "timestamps in decode order",
              "no usable timestamps")


def check_fail_on(kinds: Iterable[str] | str) -> tuple[str, ...]:
    """``kinds`` (a comma-separated string or names) checked against ``FAIL_KINDS`` and ``any``."""
    if isinstance(kinds, str):
        kinds = kinds.split(",")
    kinds = tuple(k.strip() for k in kinds if k.strip())
    unknown = [k for k in kinds if k != "any" and k not in FAIL_KINDS]
    if unknown:
        raise ValueError(f"--fail-on: unknown problem kind {unknown[0]!r}; the kinds are any, "
                         + ", ".join(FAIL_KINDS))
    return kinds


def fails(problem: str, kinds: tuple[str, ...]) -> bool:
    """Whether a row's ``problem`` has one of ``kinds`` (``any``: any problem at all)."""
    parts = [p for p in problem.split("; ") if p]
    return any(k == "any" or p.startswith(k) for k in kinds for p in parts)


def problem_kind(problem: str) -> str:
    """One problem's kind: its text without the parenthesis, numbers as N
    (``truncated at frame 29 of 64`` -> ``truncated at frame N of N``)."""
    if problem.startswith("unreadable"):
        return "unreadable"
    text = re.sub(r"\s*\([^)]*\)", "", problem).split(":")[0]
    return re.sub(r"\b\d+(\.\d+)?\b", "N", " ".join(text.split()))


def count(summary: dict, row: dict, fail_on: tuple[str, ...] = (), shapes: bool = False) -> None:
    """Count ``row`` into ``summary``: its problems by kind (the first row of each kind kept), its
    decoder, and with ``shapes`` (scan's summary, for :func:`preparing_pays`) its keyframe interval
    and short side."""
    summary["rows"] += 1
    problem = row["problem"]
    summary["unlabelled"] += str(row["label"]) == "-1"
    summary["failed"] += fails(problem, fail_on)
    if problem.startswith("unreadable"):
        summary["unreadable"] += 1
        summary["problems"]["unreadable"] += 1
        summary["first"].setdefault("unreadable", (row["path"], problem[len("unreadable: "):]))
        return
    summary["decoders"][row["decoder"]] += 1
    if shapes:
        if row.get("_gop"):  # probed in this run (an earlier run's kept rows do not say)
            summary["gops"][row["_gop"]] += 1
        if row["width"] and row["height"]:
            summary["short_sides"][min(int(row["width"]), int(row["height"]))] += 1
    for p in filter(None, problem.split("; ")):
        kind = problem_kind(p)
        summary["problems"][kind] += 1
        summary["first"].setdefault(kind, (row["path"], p))


# The short side of the copies the summary suggests (``shmloader prepare --short-side``): what
# R(2+1)D/C3D-style training (crops of 112) reads. Videos of twice that side have 4x its pixels.
PREPARED_SIDE = 128


def _median(counts: dict[int, int]) -> int | None:
    """The median of the values ``counts`` counts (the lower one of an even count); None if none."""
    n, seen = sum(counts.values()), 0
    for value in sorted(counts):
        seen += counts[value]
        if 2 * seen >= n:
            return value
    return None


def preparing_pays(summary: dict) -> tuple[str, list[str]] | None:
    """Why prepared copies would read random clips faster than the scanned files, and the
    ``shmloader prepare`` options that make them; None where they would not: the files' median
    frames per keyframe is ``LONG_GOP`` or more (a random clip decodes from the keyframe before
    it), or their median short side is ``2 * PREPARED_SIDE`` or more (4x the copies' pixels or
    more). The GOP is known for the rows probed in this run only; files no larger than the copies
    would be are copied at their own size."""
    gop, side = _median(summary.get("gops", {})), _median(summary.get("short_sides", {}))
    why = []
    if gop is not None and gop >= LONG_GOP:
        why.append(f"a keyframe every {gop} frames (median): a random clip decodes from the keyframe before it")
    if side is not None and side >= 2 * PREPARED_SIDE:
        why.append(f"a short side of {side} pixels (median): {(side / PREPARED_SIDE) ** 2:.0f}x the pixels of "
                   f"a copy at short side {PREPARED_SIDE}")
    if not why:
        return None
    scale = ["--short-side", str(PREPARED_SIDE)] if side is not None and side > PREPARED_SIDE else []
    return "; ".join(why), [*scale, "--gop", "16"]
