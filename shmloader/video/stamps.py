"""Frames found by their times: for seconds on a file's own timeline, the file's frames that
start nearest to them, and those frames decoded in one pass.

A file's timeline is its presentation timestamps in seconds (``pts * time_base``, what PyAV's
``frame.pts * stream.time_base`` and torchcodec's ``pts_seconds`` give), read by the probe
(``video.probe``) once per reader and file. A dataset that stores where its samples lie in a
file by time (LeRobot's episodes, many to a file, each from its ``from_timestamp``) asks
:meth:`TimedFrames.nearest` which frames those are, and how far from the time asked each one
starts, then decides itself what distance it accepts; :meth:`TimedFrames.decode` then decodes the
sorted union of every frame asked of the file at once (NOTE [ Decoding less, exactly ] in
``clips.reader``), so the samples that read one stretch of a file decode it once. For remote files,
:meth:`TimedFrames.probe_ahead` and :meth:`TimedFrames.prefetch` put the probes and the frames'
bytes of several files in one round of requests (NOTE [ Reading remote files ] in ``video.storage``).
"""

from __future__ import annotations

import numpy as np

from .decoding import Decoding
from .measuring import Measuring
from .storage import LOCAL, Storage

__all__ = ["TimedFrames", "nearest_starts"]


def nearest_starts(starts: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``seconds``, the frame whose start (``starts``: ascending seconds) is nearest,
    and how far from it that start lies (seconds, >= 0); the earlier frame where two are as near."""
    seconds = np.asarray(seconds, np.float64)
    if not len(starts):
        raise ValueError("the video has no frames")
    right = np.clip(np.searchsorted(starts, seconds, side="left"), 0, len(starts) - 1)
    left = np.maximum(right - 1, 0)
    gap_left, gap_right = np.abs(seconds - starts[left]), np.abs(starts[right] - seconds)
    frames = np.where(gap_left <= gap_right, left, right).astype(np.int64)
    return frames, np.minimum(gap_left, gap_right)


class TimedFrames:
    """A worker's reader of frames by time: each file probed once (kept as ``Decoding`` keeps
    probes), each decode through the decoder the probe (or ``decoder``) chooses.

    :param threads: decoding threads per decode (1: the workers are the parallelism).
    :param decoder: ``"auto"`` (the probe's choice per file), ``"pyav"`` or ``"decord"``.
    :param storage: how the files are read (local files by default).
    :param measuring: the decoder measured per shape of file (NOTE [ Measuring the decoder ]), or None.
    """

    def __init__(self, threads: int = 1, decoder: str = "auto", storage: Storage = LOCAL,
                 measuring: Measuring | None = None) -> None:
        self.decoding = Decoding(threads, decoder, storage, measuring)

    def starts(self, path: str) -> np.ndarray:
        """Every frame's start in seconds on ``path``'s own timeline, in presentation order."""
        times = self.decoding.info(path).times()
        if times is None:
            raise ValueError("the video has no timestamps to find its frames by")
        return times[:, 0]

    def size(self, path: str) -> tuple[int, int]:
        """(height, width) of ``path``'s frames as shown."""
        info = self.decoding.info(path)
        return info.height, info.width

    def keyframes(self, path: str) -> np.ndarray:
        """The keyframes a pass over ``path`` decodes from (``Decoding.keyframes``)."""
        return self.decoding.keyframes(self.decoding.info(path))

    def nearest(self, path: str, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frames of ``path`` starting nearest to ``seconds`` and their distances (``nearest_starts``)."""
        return nearest_starts(self.starts(path), seconds)

    def probe_ahead(self, paths: list[str]) -> None:
        """Probe the remote files ``paths`` not probed yet, together (``Decoding.probe_ahead``)."""
        self.decoding.probe_ahead(paths)

    def prefetch(self, wanted: list[tuple[str, np.ndarray]]) -> None:
        """Fetch the bytes that decoding each (path, frames) of ``wanted`` reads, all at once
        (``Decoding.prefetch``); local files need none."""
        self.decoding.prefetch([(self.decoding.info(p), np.asarray(f, np.int64), None) for p, f in wanted])

    def decode(self, path: str, frames: np.ndarray) -> np.ndarray:
        """Frames ``frames`` (ascending, unique) of ``path`` at their own size, ``[n, H, W, 3]``
        uint8, in one pass. The array may be the decoder's scratch buffer: copy out of it before
        the next decode."""
        return self.decoding.decode(self.decoding.info(path), None, np.asarray(frames, np.int64))

    def counters(self) -> dict[str, int]:
        """Decodes by decord and by PyAV, decodes decord handed to PyAV, files probed, bytes and
        requests fetched from remote storage."""
        return self.decoding.counters()
