"""Which decoder reads a shape of file with less CPU, measured in the worker that reads it.

NOTE [ Measuring the decoder ]
Where a file's probe says both decoders read it exactly (``measurable``: the probe chose decord,
or chose PyAV for speed alone, ``VideoInfo.pyav_faster``; NOTE [ Which decoder reads a file ] in
``video.probe``), the faster one is measured, not ruled: the rule's choice is the first guess.
A file's *shape* (``shape_of``: container, codec, profile, frame size, B-frames or not, frames
per keyframe up to the next power of two) is undecided in a worker until measured: the reads of
files of that shape alternate the two decoders, the rule's first, each read's frames delivered
as usual (both give the same pixels where both are allowed: the same scaler and flags,
tests/test_frames.py, tests/test_measuring.py). The first ``WARM`` reads of each decoder are not
timed (they pay what later reads reuse: a container opened, a scaler graph built); the next
``TIMED`` of each are, in process CPU seconds (``time.process_time``: decord's own decoding
thread counts, the machine's other load does not). A read's CPU is weighed by the frames a
seeking decoder goes through for it (``decode_cost``: from the keyframe before each jump), so a
clip drawn far from its keyframe does not count against the decoder that drew it. The decoder
with less CPU per frame gone through is kept for that shape for the rest of the run in that
worker; the figures (CPU ms per read, both at the measured reads' mean frames gone through) go
to a DEBUG line on the ``shmloader`` logger and to ``Loader.stats()["decoder_shapes"]`` (each
worker's decision, appended to a segment the loader reads: ``ChoiceLog``).

The cut (output size, clip length, step, clips decoded in one read: ``Cut``) is the reader's,
one per loader: it is what the figures are for, not part of the key. A scan manifest's row is
not measured (its decoder column is the scan's choice, measured there with ``--measure-cut``,
``tools.scan``); nor a file one decoder alone reads (decord refused it, or cannot copy its
width out on this CPU), nor a remote one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, TypeVar

import numpy as np

from .probe import VideoInfo

__all__ = ["Cut", "Shape", "Measuring", "ChoiceLog", "Choices", "decode_cost", "measurable", "measures", "shape_of",
           "summary", "WARM", "TIMED"]

log = logging.getLogger("shmloader")

WARM = 1  # reads of each decoder per shape not timed
TIMED = 3  # reads of each decoder per shape timed before the choice


class Cut(NamedTuple):
    """What the loader reads of each file: the figures are for this."""

    size: str  # "112x112", "short side 128-160", "native"
    length: int  # frames a clip
    step: int  # frames between a clip's frames (0: by time, fps=)
    together: int  # clips of a video decoded in one read (group_clips), else 1

    def __str__(self) -> str:
        if not self.length:  # a planned family's: each video its own frames and size
            return self.size
        return (f"{self.size}, {self.length} frames every {self.step}"
                + ("" if self.together == 1 else f", {self.together} clips a read"))

    @classmethod
    def parse(cls, text: str) -> Cut:
        """``"LEN,STEP[,HxW[,K]]"`` (``shmloader scan --measure-cut``): clips of LEN frames every
        STEP, decoded at HxW (default: the native size), K clips of a video a read (default 1)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            length, step = int(parts[0]), int(parts[1])
            size = parts[2].lower() if len(parts) > 2 and parts[2] else "native"
            together = int(parts[3]) if len(parts) > 3 else 1
            if size != "native":
                h, w = (int(x) for x in size.split("x"))
                size = f"{h}x{w}"
            ok = length >= 1 and step >= 1 and together >= 1 and len(parts) <= 4 and (size == "native" or h * w > 0)
        except (ValueError, IndexError):
            ok = False
        if not ok:
            raise ValueError(f"a cut to measure is LEN,STEP[,HxW[,K]] (e.g. 16,2,112x112), got {text!r}")
        return cls(size, length, step, together)

    @property
    def decode_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of a cut given as ``HxW``; None for the native size."""
        if "x" not in self.size or " " in self.size:
            return None
        h, w = self.size.split("x")
        return int(h), int(w)


class Shape(NamedTuple):
    """The files a measurement speaks for (``shape_of``)."""

    container: str
    codec: str
    profile: str
    height: int
    width: int
    bframes: bool
    gop: int  # frames per keyframe, on average, up to this power of two

    def __str__(self) -> str:
        return (f"{self.container} {self.codec}{' ' + self.profile if self.profile else ''} "
                f"{self.height}x{self.width}{'' if self.bframes else ' no B'} GOP<={self.gop}")


def shape_of(info: VideoInfo) -> Shape:
    keyframes = 1 if info.keyframes is None else max(1, len(info.keyframes))
    gop = 1 << max(0, math.ceil(math.log2(max(1.0, info.frames / keyframes))))
    return Shape(info.container, info.codec, info.profile, info.height, info.width, info.bframes, gop)


def measures(decoder: str, remote: bool) -> bool:
    """Whether a loader's workers measure the decoder at all: ``decoder="auto"`` over local files
    (a remote file is PyAV's)."""
    return decoder == "auto" and not remote


def measurable(info: VideoInfo) -> bool:
    """Whether both decoders read ``info``'s file exactly, by its probe (not a manifest row)."""
    return ((info.decoder == "decord" or info.pyav_faster) and info.pts is not None
            and info.keyframes is not None and not (info.media is not None and info.media.remote))


def decode_cost(union: np.ndarray, keyframes: np.ndarray) -> tuple[int, int]:
    """Frames a seeking decoder goes through to show the sorted frames ``union``, and how many of
    them come before the first: it seeks to the keyframe at or before a frame whenever that
    keyframe lies past what it has decoded, else it decodes on (decord's ``get_batch`` and PyAV's
    seek + decode forward both do; skipping non-reference frames is not counted)."""
    frames = np.asarray(union, np.int64)
    kf = np.asarray(keyframes, np.int64)
    key = kf[np.maximum(np.searchsorted(kf, frames, side="right") - 1, 0)]
    key = np.minimum(key, frames)  # a frame before the first keyframe: decoded from itself
    prev = np.concatenate([[-1], frames[:-1]])
    start = np.where(key > prev, key, prev + 1)
    return int((frames - start + 1).sum()), int(frames[0] - start[0])


@dataclass
class _Trial:
    """One shape's measurement in one worker."""

    guess: str  # the rule's choice, read first
    reads: Counter = field(default_factory=Counter)  # reads done by each decoder
    timed: dict[str, list[tuple[float, int]]] = field(
        default_factory=lambda: {"decord": [], "pyav": []})  # (CPU s, frames gone through)
    chosen: str | None = None
    ms: dict[str, float] = field(default_factory=dict)


class Measuring:
    """A worker's measurements, shape by shape (NOTE [ Measuring the decoder ]).

    :param cut: what the reader reads of each file.
    :param choices: where the decisions go for the loader to report (None: kept here alone).
    """

    def __init__(self, cut: Cut, choices: ChoiceLog | None = None) -> None:
        self.cut = cut
        self._choices = choices
        self._trials: dict[Shape, _Trial] = {}
        self.reads = 0  # reads timed
        self.chosen: Counter = Counter()  # shapes decided, by the decoder kept

    def pick(self, info: VideoInfo) -> tuple[str, Shape | None]:
        """The decoder for this read of ``info``'s (measurable) file, and its shape where the read
        is part of the measurement (``done`` is then told how it went), else None."""
        key = shape_of(info)
        t = self._trials.get(key)
        if t is None:
            t = self._trials[key] = _Trial(guess=info.decoder)
        if t.chosen is not None:
            return t.chosen, None
        other = "pyav" if t.guess == "decord" else "decord"
        return (t.guess if t.reads[t.guess] <= t.reads[other] else other), key

    def done(self, key: Shape, name: str, cpu_s: float, frames: np.ndarray, keyframes: np.ndarray) -> None:
        """A read of shape ``key`` by decoder ``name`` took ``cpu_s`` for ``frames``."""
        t = self._trials[key]
        if t.chosen is not None:
            return
        t.reads[name] += 1
        if t.reads[name] <= WARM:
            return
        t.timed[name].append((cpu_s, decode_cost(frames, keyframes)[0]))
        self.reads += 1
        if all(len(v) >= TIMED for v in t.timed.values()):
            self._decide(key, t)

    def _decide(self, key: Shape, t: _Trial) -> None:
        per_frame = {n: sum(c for c, _ in v) / max(1, sum(f for _, f in v)) for n, v in t.timed.items()}
        mean = float(np.mean([f for v in t.timed.values() for _, f in v]))
        t.ms = {n: round(1000 * x * mean, 2) for n, x in per_frame.items()}
        other = "pyav" if t.guess == "decord" else "decord"
        t.chosen = other if per_frame[other] < per_frame[t.guess] else t.guess
        self.chosen[t.chosen] += 1
        log.debug("decoder for %s (%s): %s, CPU ms a read decord %.1f, PyAV %.1f (%d reads each; the rule "
                  "said %s)", key, self.cut, t.chosen, t.ms["decord"], t.ms["pyav"], TIMED, t.guess)
        if self._choices is not None:
            self._choices.append({"shape": str(key), "cut": str(self.cut), "decoder": t.chosen, "rule": t.guess,
                                  "decord_ms": t.ms["decord"], "pyav_ms": t.ms["pyav"], "reads": TIMED,
                                  "pid": os.getpid()})

    def report(self) -> dict[str, dict[str, Any]]:
        """Shape -> ``{"decoder": chosen or None while measuring, "rule": the first guess,
        "decord_ms", "pyav_ms": CPU ms a read (once chosen), "reads": reads done by each}``."""
        return {str(k): {"decoder": t.chosen, "rule": t.guess, **{f"{n}_ms": ms for n, ms in t.ms.items()},
                         "reads": dict(t.reads)} for k, t in self._trials.items()}


_T = TypeVar("_T")


def timed(fn: Callable[[], _T]) -> tuple[_T, float]:
    """``fn()`` and the process CPU seconds it took."""
    t0 = time.process_time()
    got = fn()
    return got, time.process_time() - t0


def summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The workers' decisions (``ChoiceLog.records``) per shape: ``{"decoder": {name: workers},
    "decord_ms", "pyav_ms": medians over the workers' figures, "rule", "cut"}``."""
    out: dict[str, dict[str, Any]] = {}
    for shape in dict.fromkeys(r["shape"] for r in records):
        mine = [r for r in records if r["shape"] == shape]
        out[shape] = {"decoder": dict(Counter(r["decoder"] for r in mine)), "rule": mine[0]["rule"],
                      "cut": mine[0]["cut"], "workers": len(mine),
                      **{k: round(float(np.median([r[k] for r in mine])), 2) for k in ("decord_ms", "pyav_ms")}}
    return out


_LIMIT = 1 << 20  # bytes of decisions a loader keeps (a few thousand shapes)


class ChoiceLog:
    """The decisions of a loader's workers, a JSON line each, appended to one shared segment
    (a ``memfd`` they inherit) that the loader reads for ``stats()``. Appends take a lock on its
    first byte; a reader takes the whole lines (a line being written is not one yet)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("shmloader-choices", os.MFD_CLOEXEC)
        self._finalizer: weakref.finalize[[int], ChoiceLog] | None = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        if self._finalizer is not None:  # the loader's process made it; a worker's exit closes its copy
            self._finalizer()

    def __getstate__(self) -> dict[str, int]:  # the workers inherit the descriptor
        return {"fd": self.fd}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.fd, self._finalizer = state["fd"], None

    def append(self, record: dict[str, Any]) -> bool:
        """Add ``record``; False where the segment is full."""
        data = (json.dumps(record) + "\n").encode()
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
        try:
            end = os.fstat(self.fd).st_size
            if end + len(data) > _LIMIT:
                return False
            os.pwrite(self.fd, data, end)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        return True

    def records(self) -> list[dict[str, Any]]:
        data = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        out = []
        for line in data.split(b"\n")[:-1]:  # after the last newline: nothing, or a line being written
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


class Choices:
    """What one loader keeps of the decoders its workers measured (every family's worker source
    has one): the log they append to (``log``: made when the loader starts, None where nothing is
    measured) and ``stats()``' ``decoder_shapes`` from it, kept once the log is closed.

    :param measured: whether the workers measure (``decoder="auto"``, local files).
    """

    def __init__(self, measured: bool) -> None:
        self.measured = measured
        self.log: ChoiceLog | None = None
        self._chosen: dict[str, Any] = {}  # the workers' choices as last read (kept past close)

    def __getstate__(self) -> dict[str, Any]:  # to the workers: the log's descriptor, inherited
        return {"measured": self.measured, "log": self.log}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.measured, self.log, self._chosen = state["measured"], state["log"], {}

    def open(self) -> ChoiceLog | None:
        if self.measured and self.log is None:
            self.log = ChoiceLog()
        return self.log

    def report(self) -> dict[str, Any]:
        """``{"decoder_shapes": summary}``; empty where the decoder is not measured."""
        if self.log is not None:
            self._chosen = summary(self.log.records())
        return {"decoder_shapes": self._chosen} if self.measured else {}

    def close(self) -> None:
        if self.log is not None:
            self.report()  # kept for stats() after the loader closed
            self.log.close()
            self.log = None
