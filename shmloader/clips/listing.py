"""The rows of a dataset as ``VideoClips.from_csv`` and ``from_shards`` find them: paths, labels,
time spans, a scan manifest's probe columns and tar members' places."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..video.manifest import iter_manifest, known_columns
from ..video.media import member_url, split_member
from ..video.shards import expand, shard_samples
from ..video.storage import Storage, tar_members

__all__ = ["Listing", "csv_listing", "shard_listing", "SHARD_VIDEO_KEYS"]

# The members of a WebDataset sample that hold its video, by extension (the first found wins).
SHARD_VIDEO_KEYS = ("mp4", "avi", "mkv", "webm", "mov", "m4v", "mpg", "mpeg", "ts", "flv", "wmv", "ogv", "3gp")


@dataclass
class Listing:
    """What a manifest or a set of shards lists: ``paths``, ``labels`` (None: none), ``spans``
    (None: no span column), ``known`` (a scan manifest's probe columns) and ``members`` (tar
    members' ``offset`` and ``size``, -1 where unknown)."""

    paths: list[str]
    labels: list[Any] | None
    spans: list[tuple[float | None, float | None]] | None = None
    known: dict[str, np.ndarray] | None = None
    members: dict[str, np.ndarray] | None = None


def csv_listing(manifest: str | os.PathLike[str], path_column: str, label_column: str | None, start_column: str,
                end_column: str) -> Listing:
    """The rows of a CSV or JSON manifest (see ``VideoClips.from_csv``)."""
    manifest = os.path.abspath(os.fspath(manifest))
    listed = list(iter_manifest(manifest, path_column, label_column))
    if not listed:
        raise ValueError(f"{manifest!r} lists no videos")
    listed = _readable_rows(manifest, listed)
    labels: list[Any] | None = None if label_column is None else [label for _, label, _ in listed]
    rows = [row for _, _, row in listed]
    spans = None
    if start_column in rows[0] or end_column in rows[0]:
        spans = [(_seconds(manifest, n, row.get(start_column)), _seconds(manifest, n, row.get(end_column)))
                 for n, row in enumerate(rows, start=2)]
    return Listing([p for p, _, _ in listed], labels, spans, known_columns(rows),
                   _member_columns([(p, row) for p, _, row in listed]))


def _readable_rows(manifest: str, listed: list[tuple[str, Any, dict[str, Any]]]
                   ) -> list[tuple[str, Any, dict[str, Any]]]:
    """``listed`` without the rows ``shmloader scan`` marked unreadable (a warning counts them)."""
    def unreadable(row: dict[str, Any]) -> bool:
        return str(row.get("problem") or "").startswith("unreadable")

    bad = [(path, row) for path, _, row in listed if unreadable(row)]
    if not bad:
        return listed
    first = f"the first: {bad[0][0]} ({bad[0][1]['problem']})"
    counted = f"{len(bad)} of {len(listed)} rows of {manifest} are marked unreadable by shmloader scan"
    if len(bad) == len(listed):
        raise ValueError(f"no readable video: {counted}; {first}")
    # stacklevel: the user's from_csv call (from_csv -> csv_listing -> here)
    warnings.warn(f"{counted} and are left out, {first}; scan again once they are fixed to load them",
                  UserWarning, stacklevel=4)
    return [(path, label, row) for path, label, row in listed if not unreadable(row)]


def shard_listing(urls: str | Sequence[str], video_key: str | Sequence[str], label_key: str | None,
                  storage: Storage) -> Listing:
    """Every sample of WebDataset tar shards (see ``VideoClips.from_shards``)."""
    shards = expand(urls, storage)
    if not shards:
        raise ValueError(f"no shards match {urls!r}")
    exts = (video_key,) if isinstance(video_key, str) else tuple(video_key)
    paths, labels, offsets, sizes = [], [], [], []
    for shard in shards:
        members = tar_members(storage, shard)
        storage.add_members(shard, members)
        for key, parts in shard_samples(members).items():
            video = next((parts[e] for e in exts if e in parts), None)
            if video is None:
                continue
            paths.append(member_url(video, shard))
            offsets.append(members[video][0])
            sizes.append(members[video][1])
            if label_key is not None:
                labels.append(_shard_label(storage, shard, key, parts, label_key))
    if not paths:
        raise ValueError(f"no member of the {len(shards)} shards {storage.redact(shards[0])}... has a video "
                         f"extension among {exts}")
    return Listing(paths, None if label_key is None else labels,
                   members={"offset": np.asarray(offsets, np.int64), "size": np.asarray(sizes, np.int64)})


def _member_columns(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, np.ndarray] | None:
    """Offsets and sizes of the tar members a manifest lists (its ``offset`` and ``bytes``
    columns); size -1 where a row does not say (the worker reads that shard's headers)."""
    if not any(split_member(p) and str(row.get("offset", "")).strip() for p, row in rows):
        return None
    offset, size = np.zeros(len(rows), np.int64), np.full(len(rows), -1, np.int64)
    for i, (p, row) in enumerate(rows):
        try:
            if split_member(p):
                offset[i], size[i] = int(row["offset"]), int(row["bytes"])
        except (KeyError, TypeError, ValueError):
            pass
    return {"offset": offset, "size": size}


def _shard_label(storage: Storage, shard: str, key: str, parts: dict[str, str], label_key: str) -> int:
    """The label of sample ``key`` of ``shard``: its ``.cls`` member, or a field of its ``.json``."""
    import json

    ext, _, field = label_key.partition(":")
    name = parts.get(ext)
    where = f"sample {key!r} of {storage.name(shard)}"
    if name is None:
        raise ValueError(f"{where} has no .{ext} member for its label (label_key={label_key!r}; None for no labels)")
    text = storage.read_text(member_url(name, shard))
    try:
        value = json.loads(text)[field] if field else text
        return int(value)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: the label in {name!r} is not an integer: {text[:80]!r}") from None


def _seconds(manifest: str, n: int, cell: str | float | None) -> float | None:
    """A manifest's start or end cell in seconds; None when empty."""
    if cell is None or (isinstance(cell, str) and not cell.strip()):
        return None
    try:
        return float(cell)
    except (TypeError, ValueError):
        raise ValueError(f"{manifest!r} row {n}: a start or end must be seconds, got {cell!r}") from None
