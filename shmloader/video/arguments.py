"""What a ``VideoClips`` is given besides its options (``video.options``), checked: the paths
(local, remote or FFmpeg protocols), the labels, the time spans, the columns of a manifest or a
shard listing, a class folder's videos; and what the main process reads from a video (the first
one's native size, and its frame rate where it sets the audio's room)."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from .manifest import URL, walk_folder
from .media import is_remote, local_path
from .options import Audio, Sampling
from .probe import VideoInfo, probe
from .storage import Storage

__all__ = ["FirstVideo", "audio_samples", "first_rows", "class_videos", "path_list", "checked_paths", "columns",
           "read_only", "checked_labels", "check_spans"]


class FirstVideo:
    """The first video as the main process reads it (as a worker would), probed when first asked
    and once however often: ``size=None`` asks its native size, audio without ``audio_seconds``
    its frame rate, one ``VideoClips`` both."""

    def __init__(self, path: str, storage: Storage) -> None:
        self.path, self.storage = path, storage
        self._info: VideoInfo | None = None

    def info(self, why: str) -> VideoInfo:
        """The probe; a ValueError starting with ``why`` (the argument that needs it) where the
        file cannot be read."""
        if self._info is None:
            try:
                self._info = probe(self.path, storage=self.storage)
            except Exception as e:
                raise ValueError(f"{why} of {self.storage.name(self.path)!r}: "
                                 f"{self.storage.redact(str(e))}") from e
        return self._info

    def native_size(self) -> tuple[int, int]:
        info = self.info("size=None: cannot read the native size")
        return info.height, info.width


def first_rows(paths: list[str]) -> np.ndarray:
    """For every row, the index of the first row with the same path."""
    first: dict[str, int] = {}
    return np.fromiter((first.setdefault(p, i) for i, p in enumerate(paths)), np.int64, len(paths))


def class_videos(root: str, extensions: Sequence[str]) -> list[tuple[str, int]]:
    """(path, label) of the videos in ``root``'s class folders; ValueError saying what is there
    instead where there are none."""
    if not os.path.isdir(root):
        raise ValueError(f"{root!r} is not a folder")
    found = list(walk_folder(root, extensions))
    if found:
        return found
    loose = [p for p, _ in walk_folder(root, extensions, loose=True)]
    if loose:
        raise ValueError(f"{root!r} holds {len(loose)} videos but no class sub-folders: from_folder "
                         "labels each video by its folder (root/<class>/<video>). For videos without "
                         f"labels, VideoClips(paths) with the paths, e.g. sorted(glob.glob({os.path.join(root, '*')!r}))")
    raise ValueError(f"no videos ({', '.join(extensions)}) in class folders under {root!r}")


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


def audio_samples(sampling: Sampling, audio: Audio | None, first: FirstVideo) -> int:
    """``S``, the samples every clip's audio has room for (NOTE [ Where a clip's audio lies ]);
    0 without audio. Clips by index and no ``audio_seconds``: by the frame rate of the first
    video (``first``: probed once, for its size too)."""
    if audio is None:
        return 0
    seconds = audio.seconds
    if seconds is None and sampling.fps is not None:
        seconds = (sampling.length + 1) / sampling.fps
    elif seconds is None:
        rate = first.info("audio_rate: cannot read the frame rate that sets the audio's length "
                          "(or pass audio_seconds=)").fps
        if not rate > 0:
            raise ValueError(f"audio_rate: {first.storage.name(first.path)!r} has no frame rate to set the "
                             "audio's length by: pass audio_seconds=")
        seconds = ((sampling.length - 1) * sampling.frame_step + 1) / rate
    # A span of exactly `seconds` at a rate that rounds is not one sample longer.
    return max(1, math.ceil(seconds * audio.rate - 1e-6))
