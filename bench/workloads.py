"""What every loader is asked to do: the same clips, decoded the same way, with the same transform.

Worker-safe: imports numpy (and decord, lazily) only, so spawned or forkserver children that
unpickle these functions never import TensorFlow or torch on their account.

Sample order and clip starts follow shmloader's own rules so that every loader decodes the
same frames: epoch ``e`` visits the samples in ``default_rng((seed, e)).permutation(n)``, and
sample ``s`` of epoch ``e`` starts at ``default_rng((seed, e, s)).integers(0, last + 1)``.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

# Each video yields this many clips per epoch, so an epoch is long enough to batch.
CLIPS_PER_VIDEO = 4
SEED = 0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    clip_len: int
    size: tuple[int, int]  # (height, width) the decoder scales to
    py_iters: int  # iterations of a pure-Python loop per clip; 0 = no transform
    about: str

    @property
    def clip_bytes(self) -> int:
        h, w = self.size
        return self.clip_len * h * w * 3

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.clip_len, *self.size, 3)


def default_workloads(clip_len: int, small: int, large: int, py_iters: int) -> dict[str, Workload]:
    return {
        "short": Workload("short", clip_len, (small, small), 0,
                          f"decode-bound {clip_len}x{small}x{small} clips"),
        "large": Workload("large", clip_len, (large, large), 0,
                          f"{clip_len}x{large}x{large} clips, where copies matter"),
        "python": Workload("python", clip_len, (small, small), py_iters,
                           f"{clip_len}x{small}x{small} clips + {py_iters} iterations of "
                           "pure-Python arithmetic per clip (GIL-bound)"),
    }


@dataclass(frozen=True, slots=True)
class ClipSet:
    """The videos and their labels; ``len(paths) * CLIPS_PER_VIDEO`` samples per epoch."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.paths) * CLIPS_PER_VIDEO

    def video(self, sample: int) -> tuple[str, int]:
        v = sample // CLIPS_PER_VIDEO
        return self.paths[v], self.labels[v]


def sample_keys(n: int, shard: int = 0, shards: int = 1) -> Iterator[tuple[int, int]]:
    """(epoch, sample) forever, shuffled per epoch like ``Loader(shuffle=True, seed=SEED)``."""
    for epoch in itertools.count():
        order = np.random.default_rng((SEED, epoch)).permutation(n)
        for sample in order[shard::shards].tolist():
            yield epoch, sample


class SharedKeys:
    """``sample_keys`` shared by several threads."""

    def __init__(self, n: int) -> None:
        self._it = sample_keys(n)
        self._lock = threading.Lock()

    def __next__(self) -> tuple[int, int]:
        with self._lock:
            return next(self._it)

    def __iter__(self) -> "SharedKeys":
        return self


def decode_clip(clips: ClipSet, wl: Workload, epoch: int, sample: int) -> tuple[np.ndarray, int]:
    """Open the video, pick the clip start as shmloader does, decode, transform: (clip, label)."""
    import decord

    path, label = clips.video(sample)
    h, w = wl.size
    reader = decord.VideoReader(path, width=w, height=h, num_threads=1)
    rng = np.random.default_rng((SEED, epoch, sample))
    start = int(rng.integers(0, len(reader) - wl.clip_len + 1))
    clip = reader.get_batch(list(range(start, start + wl.clip_len))).asnumpy()
    if wl.py_iters:
        python_heavy(clip, wl.py_iters)
    return clip, label


def python_heavy(clip: np.ndarray, iters: int) -> None:
    """A deliberately pure-Python per-clip transform: holds the GIL for its whole run."""
    acc = int(clip[0, 0, 0, 0])
    for i in range(iters):
        acc = (acc * 1103515245 + i) & 0xFFFFFFFF
    clip[0, 0, 0, 0] = acc & 0xFF


def shm_transform(iters: int):
    """The same transform with shmloader's signature, ``transform(sample, rng)`` in place."""

    def transform(sample: dict, rng) -> None:
        python_heavy(sample["video"], iters)

    return transform


def make_clipset(folder: str, count: int, frames: int, size: tuple[int, int], codec: str) -> ClipSet:
    from shmloader._samples import make_videos

    paths, labels = make_videos(folder, count=count, frames=frames, size=size, codec=codec)
    return ClipSet(tuple(paths), tuple(int(x) for x in labels))


def list_clipset(folder: str) -> ClipSet:
    """Every video file in ``folder`` (sorted), labelled by position modulo 2."""
    import os

    exts = (".mp4", ".avi", ".mkv", ".mov", ".webm")
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(exts))
    if not paths:
        raise SystemExit(f"no videos ({', '.join(exts)}) in {folder}")
    return ClipSet(tuple(paths), tuple(i % 2 for i in range(len(paths))))
