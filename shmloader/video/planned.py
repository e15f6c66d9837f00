"""Whole videos, each planned on its own: frames, size and fields decided per video by a recipe
(a video-LLM's: ``shmloader.qwen``), decoded at that size in the workers.

A recipe sees each video's frame count, average rate and size as shown (``Video``) and returns a
``Planned``: the frames to read, the size to decode them at, and how many rows of each field of
rows the sample holds, with its cost (NOTE [ Samples of several sizes ] in ``engine.source``).
The main process probes every video once (or takes a scan manifest's rows) to plan them all
before the first read, so a loader can cut batches by cost; a worker plans its video again, with
the frames' timestamps, and the two agree because the plan is a function of the same probe.
Frames are decoded at the planned size by the file's decoder (decord or PyAV, as
``video.probe`` chooses), never at full size and resized afterwards.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from ..engine.source import Sizes, Spec
from .decoding import Decoding
from .probe import VideoInfo, probe
from .storage import LOCAL

__all__ = ["Planned", "PlannedReader", "PlannedVideos", "Recipe", "Video"]

# Videos probed at once in the main process (the probe reads packets: I/O and libavformat, which
# let go of the GIL for most of it).
_PROBE_THREADS = 8


@dataclass(frozen=True)
class Video:
    """What a recipe plans a video from: its frames as a player shows them, their average rate,
    the size as shown; ``times``: each frame's start in seconds from the first frame's (in a
    worker; None in the main process), ``span``: the ``(start, end)`` seconds asked for, or None;
    ``path`` and ``duration`` (the container's, seconds): what a recipe that reads the sound needs."""

    frames: int
    fps: float
    height: int
    width: int
    times: np.ndarray | None = None
    span: tuple[float | None, float | None] | None = None
    path: str = ""
    duration: float = 0.0


@dataclass(frozen=True)
class Planned:
    """One video's plan: ``indices`` (the frames to deliver, in order; repeats allowed), decoded at
    ``size`` (height, width); ``rows``: the rows of each field of rows; ``cost``: what a budget
    counts; ``extra``: what the recipe's ``fill`` needs besides."""

    indices: np.ndarray
    size: tuple[int, int]
    rows: dict[str, int]
    cost: int
    extra: Any = field(default=None, compare=False)


class Recipe(Protocol):
    """What a family of models makes of a video (``shmloader.qwen.Recipe``)."""

    def spec(self) -> Spec:
        """The recipe's own fields (fields of rows with first dimension -1)."""

    def plan(self, video: Video) -> Planned:
        """The video's plan; a ValueError in words where the video cannot give one."""

    def fill(self, frames: np.ndarray, planned: Planned, video: Video, out: dict[str, np.ndarray]) -> None:
        """Write the recipe's fields of a sample from its decoded ``frames`` ``[n, h, w, 3]``."""


class PlannedVideos:
    """A source of whole videos planned by ``recipe`` (sample ``i`` is video ``i``): the recipe's
    fields, and ``frames`` (int64 rows: each delivered frame's index in the video), ``times``
    (float64 rows: its start in seconds from the first frame's, by the file's timestamps),
    ``label`` and ``index`` (int64)."""

    worker_imports = ("shmloader.video.preload",)  # for the fork server (engine.forkserver)

    def __init__(self, paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None, recipe: Recipe, *,
                 spans: Sequence[tuple[float | None, float | None] | None] | None = None,
                 decoder: str = "auto", threads: int = 1, metas: Sequence[Video] | None = None) -> None:
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("no videos given")
        if labels is not None and len(labels) != len(self.paths):
            raise ValueError(f"{len(labels)} labels for {len(self.paths)} videos")
        if spans is not None and len(spans) != len(self.paths):
            raise ValueError(f"{len(spans)} spans for {len(self.paths)} videos")
        self.labels = None if labels is None else np.asarray(labels, np.int64)
        self.spans = None if spans is None else [None if s is None else (s[0], s[1]) for s in spans]
        self.recipe = recipe
        self.decoder = decoder
        self.threads = threads
        videos = list(metas) if metas is not None else self._probe_all()
        self._plans = [self._plan(i, v) for i, v in enumerate(videos)]
        self._sizes = self._sizes_of(self._plans)  # the loader's plan and every Ray task read them
        self._decoding: Decoding | None = None

    def _probe_all(self) -> list[Video]:
        def one(i: int) -> Video:
            try:
                info = probe(self.paths[i])
            except Exception as e:
                raise ValueError(f"{self.describe(i)}: cannot read it: {e}") from e
            return _video(info, self._span(i), timed=False)  # a plan's sizes need no timestamps

        with ThreadPoolExecutor(min(_PROBE_THREADS, len(self.paths))) as pool:
            return list(pool.map(one, range(len(self.paths))))

    def _span(self, i: int) -> tuple[float | None, float | None] | None:
        return None if self.spans is None else self.spans[i]

    def _plan(self, i: int, video: Video) -> Planned:
        try:
            return self.recipe.plan(video)
        except ValueError as e:
            raise ValueError(f"{self.describe(i)}: {e}") from e

    # --------------------------------------------------------------- the source
    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoding": None}

    def spec(self) -> Spec:
        i64 = np.dtype(np.int64)
        return {**self.recipe.spec(), "frames": ((-1,), i64), "times": ((-1,), np.dtype(np.float64)),
                "label": ((), i64), "index": ((), i64)}

    def sizes(self) -> Sizes:
        return self._sizes

    def _sizes_of(self, plans: list[Planned]) -> Sizes:
        names = [name for name, (shape, _) in self.spec().items() if shape[:1] == (-1,)]
        rows = {name: np.fromiter((p.rows.get(name, len(p.indices)) for p in plans), np.int64, len(plans))
                for name in names}
        return Sizes(rows=rows, cost=np.fromiter((p.cost for p in plans), np.int64, len(plans)))

    def plans(self) -> list[Planned]:
        """Every video's plan, as the main process made it."""
        return list(self._plans)

    def describe(self, index: int) -> str:
        return self.paths[index]

    group_size = 1  # one sample a video (the plan of a loader, or of Ray's tasks)

    def reader(self) -> PlannedReader:
        """Samples as new arrays in any process (a Ray task): ``reader().read(ids)``."""
        return PlannedReader(self)

    def worker_init(self) -> None:
        self._decoding = Decoding(self.threads, self.decoder, LOCAL)

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        if self._decoding is None:
            self.worker_init()
        assert self._decoding is not None
        info = self._decoding.info(self.paths[index])
        video = _video(info, self._span(index))
        planned = self.recipe.plan(video)
        if planned.size != self._plans[index].size or len(planned.indices) != len(self._plans[index].indices):
            raise ValueError(f"the video changed since the loader planned it: {planned.size} "
                             f"{len(planned.indices)} frames, planned {self._plans[index].size} "
                             f"{len(self._plans[index].indices)} frames")
        union, where = np.unique(planned.indices, return_inverse=True)
        decoded = self._decoding.decode(info, planned.size, union)
        frames = decoded if np.array_equal(union, planned.indices) else decoded[where.reshape(-1)]
        self.recipe.fill(frames, planned, video, out)
        out["frames"][:] = planned.indices
        assert video.times is not None
        out["times"][:] = video.times[planned.indices]
        out["label"][...] = -1 if self.labels is None else self.labels[index]
        out["index"][...] = index


class PlannedReader:
    """``read(samples, seed=, epoch=)``: a batch of new arrays, a field of rows as an object array
    of each sample's own (Ray Data's variable-shaped tensors); ``counters()``: decodes so far."""

    def __init__(self, videos: PlannedVideos) -> None:
        self.clips = videos

    def read(self, samples: Sequence[int], *, seed: int = 0, epoch: int = 0) -> dict[str, np.ndarray]:
        from ..engine.source import seeded

        vc, spec = self.clips, self.clips.spec()
        sizes = vc.sizes()
        outs = []
        for s in (int(s) for s in samples):
            if not 0 <= s < len(vc):
                raise IndexError(f"sample {s} is not among the {len(vc)} samples")
            out = {k: np.zeros((int(sizes.rows[k][s]), *shape[1:]) if shape[:1] == (-1,) else shape, dtype)
                   for k, (shape, dtype) in spec.items()}
            vc.read(s, seeded((seed, epoch, s)), out)
            outs.append(out)
        batch = {}
        for k, (shape, dtype) in spec.items():
            if shape[:1] == (-1,):
                column = np.empty(len(outs), dtype=object)
                column[:] = [o[k] for o in outs] if outs else []
                batch[k] = column
            else:
                batch[k] = np.stack([o[k] for o in outs]) if outs else np.zeros((0, *shape), dtype)
        return batch

    def counters(self) -> dict[str, int]:
        d = self.clips._decoding
        return {} if d is None else {"decord": d.decodes["decord"], "pyav": d.decodes["pyav"]}


def _video(info: VideoInfo, span: tuple[float | None, float | None] | None, timed: bool = True) -> Video:
    times = info.times() if timed else None
    return Video(frames=info.frames, fps=float(info.fps), height=info.height, width=info.width,
                 times=None if times is None else times[:, 0] - times[0, 0], span=span, path=info.path,
                 duration=float(info.duration))
