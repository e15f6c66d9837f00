"""The argument checks every family shares, each raising a ValueError that names the argument: the
paths (local, remote or FFmpeg protocols), the labels, the time spans, the columns of a manifest
or a shard listing (one row per path, read-only)."""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from .manifest import URL
from .media import is_remote, local_path
from .storage import Storage

__all__ = ["path_list", "checked_paths", "columns", "read_only", "checked_labels", "check_spans", "renamed_threads"]


def path_list(paths: Any) -> list[str]:
    """``paths`` as a list of strings; TypeError for one path given alone (a string is iterable:
    read as paths it would be one per character)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"paths must be a list of paths, got one {type(paths).__name__}: "
                        f"VideoClips([{os.fspath(paths)!r}]) for one video")
    return [os.fspath(p) for p in paths]


def checked_paths(given: list[str], allow_urls: bool) -> tuple[list[str], bool]:
    """The paths as the workers read them (local ones absolute, ``file://`` taken off), and
    whether any is read through fsspec; a remote protocol's missing package is named now, not in
    a worker."""
    resolved: list[str] = []
    for p in given:
        if p[:1] == "/" and ":" not in p and "//" not in p and "/." not in p and p[-1:] != "/":
            resolved.append(p)  # absolute and normal already (a million-row table's, mostly): as it is
            continue
        p = local_path(p)
        if is_remote(p):
            resolved.append(p)
            continue
        if URL.match(p) and not allow_urls:
            raise ValueError(f"{p!r} looks like an FFmpeg protocol, not a file or an fsspec URL; "
                             "pass allow_urls=True to hand it to FFmpeg")
        # An absolute path starts with '/', which FFmpeg never reads as a protocol prefix.
        resolved.append(p if URL.match(p) else os.path.abspath(p))
    protocols = {Storage.protocol(p) for p in resolved if is_remote(p)}
    for protocol in protocols - {"file"}:
        Storage.filesystem_class(protocol)
    return resolved, bool(protocols)


def columns(name: str, given: Mapping[str, np.ndarray] | None, names: tuple[str, ...],
             count: int) -> dict[str, np.ndarray] | None:
    """``given`` as read-only arrays of one row per path; ValueError naming what is wrong."""
    if given is None:
        return None
    if set(given) != set(names):
        raise ValueError(f"{name} must have the columns {names}, got {sorted(given)}")
    out = {}
    for k in names:
        out[k] = a = np.array(given[k], copy=True)
        if a.shape[:1] != (count,):
            raise ValueError(f"{name}[{k!r}] has shape {a.shape}: one row per path ({count})")
        read_only(a)
    return out


def read_only(*arrays: np.ndarray | None) -> None:
    for a in arrays:
        if a is not None:
            a.flags.writeable = False


def checked_labels(labels: Sequence[int], count: int) -> np.ndarray:
    codes = np.asarray(labels)
    if codes.shape != (count,):
        raise ValueError(f"labels has shape {codes.shape}, expected ({count},): one per path")
    if codes.dtype.kind not in "iub":
        raise ValueError(f"labels must be integers, got dtype {codes.dtype}")
    return codes.astype(np.int64)


def check_spans(spans: Any, count: int) -> np.ndarray | None:
    """Per-video time spans ``[(start, end)]`` in seconds (None or NaN: open) as a float64
    ``[count, 2]`` array (open ends 0 and inf), or a ValueError naming the bad one."""
    if spans is None:
        return None
    out = np.empty((count, 2), np.float64)
    try:
        rows = list(spans)
    except TypeError:
        raise ValueError("spans must be a sequence of (start, end) pairs in seconds, one per path") from None
    if len(rows) != count:
        raise ValueError(f"spans has {len(rows)} entries, expected {count}: one per path")
    for i, span in enumerate(rows):
        try:
            a, b = span
            a = 0.0 if a is None else float(a)
            b = np.inf if b is None else float(b)
        except (TypeError, ValueError):
            raise ValueError(f"spans[{i}] must be (start, end) in seconds, got {span!r}") from None
        a = 0.0 if np.isnan(a) else a
        b = np.inf if np.isnan(b) else b
        if not (np.isfinite(a) and a >= 0 and b > a):
            raise ValueError(f"spans[{i}] = {span!r}: need 0 <= start < end (seconds)")
        out[i] = a, b
    return out


def renamed_threads(decode_threads: int, threads: int | None) -> int:
    """``decode_threads``, or ``threads`` where the caller's caller gave that old name (a
    DeprecationWarning attributed to the user's line, two calls up: a family's function or
    constructor calls this)."""
    if threads is None:
        return decode_threads
    warnings.warn("threads= is now decode_threads=, as VideoClips and lerobot.dataset name it",
                  DeprecationWarning, stacklevel=3)
    return threads
