"""Where the list of videos comes from: class folders, CSV/JSON manifests, and the probe columns
of a ``shmloader scan`` manifest. Shared by ``VideoClips.from_folder`` / ``from_csv`` and by
``scan``, which walks its inputs lazily (a million files, flat memory).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections import Counter
from typing import Iterator, Sequence

import numpy as np

from .probe import DECODERS, VideoInfo

__all__ = ["VIDEO_EXTENSIONS", "URL", "MANIFEST_INTS", "class_folders", "walk_folder", "iter_manifest", "known_columns", "row_info"]

# Every container FFmpeg reads that video datasets ship in (matched without regard to case).
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".vob", ".ts", ".m2ts",
                    ".mts", ".flv", ".f4v", ".wmv", ".asf", ".3gp", ".3g2", ".ogv", ".ogg", ".mxf", ".dv",
                    ".divx", ".ivf", ".h264", ".264", ".hevc", ".265", ".m2v", ".y4m")

# A URL or an FFmpeg protocol prefix (``http:``, ``concat:``...), never a local path.
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")

# Manifest columns (written by `shmloader scan`) that spare the workers a probe; with `bytes`
# and `mtime_ns` a row is trusted only while its file is unchanged.
MANIFEST_INTS = ("frames", "height", "width", "rotation", "bytes", "mtime_ns")


def class_folders(root: str) -> list[str]:
    """The class names under ``root``: its sub-folders, sorted (label ``i`` is the ``i``-th)."""
    return sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))


def walk_folder(root: str, extensions: Sequence[str] = VIDEO_EXTENSIONS, loose: bool = False,
                passed_over: Counter | None = None) -> Iterator[tuple[str, int]]:
    """(path, label) of the videos in ``root``'s class folders, in a fixed order; with
    ``loose``, videos directly in ``root`` come first, with label -1. Files without one of
    ``extensions`` are counted by extension in ``passed_over`` (hidden files aside)."""
    exts = tuple(e.lower() for e in extensions)

    def wanted(name: str) -> bool:
        if name.lower().endswith(exts):
            return True
        if passed_over is not None and not name.startswith("."):
            passed_over[os.path.splitext(name)[1].lower() or "(none)"] += 1
        return False

    if loose:
        for f in sorted(f.name for f in os.scandir(root) if f.is_file() and wanted(f.name)):
            yield os.path.join(root, f), -1
    for label, name in enumerate(class_folders(root)):
        for dirpath, dirnames, files in os.walk(os.path.join(root, name)):
            dirnames.sort()
            for f in sorted(files):
                if wanted(f):
                    yield os.path.join(dirpath, f), label


def iter_manifest(manifest: str, path_column: str = "path",
                  label_column: str | None = "label") -> Iterator[tuple[str, int | None, dict]]:
    """(path, label, row) of every row of a CSV (with a header) or JSON manifest (a list of
    objects); relative paths are taken against the manifest's folder."""
    base = os.path.dirname(manifest)
    with open(manifest, newline="") as f:
        if manifest.lower().endswith(".json"):
            rows = json.load(f)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ValueError(f"{manifest!r}: expected a JSON list of objects")
        else:
            rows = csv.DictReader(f)
        for n, row in enumerate(rows, start=2):
            if path_column not in row or not row[path_column]:
                raise ValueError(f"{manifest!r} row {n}: no {path_column!r}")
            p = str(row[path_column])
            path = p if URL.match(p) else os.path.normpath(os.path.join(base, p))  # one spelling per file
            label = None
            if label_column is not None:
                try:
                    label = int(row[label_column])
                except (KeyError, TypeError, ValueError):
                    raise ValueError(f"{manifest!r} row {n}: {label_column!r} must be an integer, "
                                     f"got {row.get(label_column)!r}") from None
            yield path, label, row


def known_columns(rows: list[dict]) -> dict[str, np.ndarray] | None:
    """The probe columns of a ``shmloader scan`` manifest, as arrays (frames 0: not known)."""
    need = (*MANIFEST_INTS, "fps", "decoder", "problem")
    if not rows or not all(c in rows[0] for c in need):
        return None
    n = len(rows)
    known = {c: np.zeros(n, np.int64) for c in MANIFEST_INTS}
    known.update(fps=np.zeros(n, np.float64), decoder=np.zeros(n, np.int8), cfr=np.zeros(n, np.bool_))
    for i, row in enumerate(rows):
        try:
            values = {c: int(row[c]) for c in MANIFEST_INTS}
            fps, decoder = float(row["fps"]), DECODERS.index(row["decoder"])
        except (TypeError, ValueError):
            continue  # a file the scan could not read: probed (and reported) when it is loaded
        for c, x in values.items():
            known[c][i] = x
        known["fps"][i], known["decoder"][i] = fps, decoder
        problem = str(row["problem"] or "")
        known["cfr"][i] = not any(w in problem for w in ("frame rate", "gap", "timestamps"))
    return known


def row_info(known: dict[str, np.ndarray], v: int, path: str) -> tuple[VideoInfo, tuple[int, int]] | None:
    """Row ``v`` of ``known_columns`` as a probe would give it, with the (size, mtime_ns) of the
    file it was made from; None when the scan could not read that file."""
    if known["frames"][v] < 1:
        return None
    info = VideoInfo(path=path, frames=int(known["frames"][v]), height=int(known["height"][v]),
                     width=int(known["width"][v]), fps=float(known["fps"][v]), duration=0.0, codec="",
                     pix_fmt="", rotation=int(known["rotation"][v]), container="",
                     decoder=DECODERS[int(known["decoder"][v])], problem="" if known["cfr"][v] else "vfr")
    return info, (int(known["bytes"][v]), int(known["mtime_ns"][v]))
