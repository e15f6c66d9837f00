"""Whole videos, each planned on its own: frames, size and fields decided per video by a recipe
(a video-LLM's: ``shmloader.qwen``), decoded at that size in the workers.

A recipe sees each video's frame count, average rate and size as shown (``Video``) and returns a
``Planned``: the frames to read, the size to decode them at, and how many rows of each field of
rows the sample holds, with its cost (NOTE [ Samples of several sizes ] in ``engine.source``).
The main process probes every video once (or takes a scan manifest's rows) to plan them all
before the first read, so a loader can cut batches by cost; a worker plans its video again, with
the frames' timestamps, and the two agree because the plan is a function of the same probe.
Frames are decoded at the planned size by the file's decoder (decord or PyAV, as
``video.probe`` chooses), never at full size and resized afterwards. A recipe that fills its rows
a few frames at a time (``Recipe.part``: Qwen's temporal patches) is handed them as they come out
of the decoder (``Parts``), so a worker holds a part's frames, not the plan's (an hour-long video's
768 frames would be half a GiB).

What clips have, planned videos have by the same keywords (``video.reading.Reading``): local files
or fsspec URLs read by byte range with ``storage_options`` and ``fetch``, ``decoder``,
``decode_threads``; a fingerprint a loader's saved state carries; ``counters()`` for
``Loader.stats()`` (decodes, probes, bytes and requests). A file that cannot be probed or planned
is named with every other such file at once (``on_error="raise"``) or left out and listed in
``skipped`` (``on_error="skip"``); ``index`` stays the video's position in the paths given.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..engine.source import Sizes, Spec
from .arguments import checked_labels, renamed_threads
from .decoders import FrameSink
from .measuring import Cut, measures
from .reading import Reading
from .segments import SharedDescription
from .probe import VideoInfo
from .probing import Row, manifest_rows, probe_rows
from .storage import Storage
from .whole import WholeVideos, stacked

__all__ = ["Parts", "Planned", "PlannedReader", "PlannedVideos", "Recipe", "Video", "as_video", "manifest_videos", "probe_videos"]



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
    storage: Storage | None = field(default=None, compare=False, repr=False)
    """How ``path`` is read again by a recipe that reads more of the file (its sound): remote
    files by byte range, as the frames were; None: a local file."""


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
    """What a family of models makes of a video (``shmloader.qwen.Recipe``).

    A recipe may also have ``part`` (an int) and ``fill_part(frames, k, planned, out)``: then the
    planned frames ``[k * part, (k + 1) * part)`` (fewer for the last part) are handed to
    ``fill_part`` as soon as they are decoded, and ``fill`` gets ``frames=None`` for the rest."""

    def spec(self) -> Spec:
        """The recipe's own fields (fields of rows with first dimension -1)."""

    def plan(self, video: Video) -> Planned:
        """The video's plan; a ValueError in words where the video cannot give one."""

    def fill(self, frames: np.ndarray | None, planned: Planned, video: Video, out: dict[str, np.ndarray]) -> None:
        """Write the recipe's fields of a sample from its decoded ``frames`` ``[n, h, w, 3]``
        (None where ``fill_part`` had them)."""


class Parts(FrameSink):
    """Takes a read's frames as the decoder puts them out and hands ``fill(frames, k)`` each part
    of ``part`` planned frames as soon as it is whole. ``where[p]``: the read's frame that planned
    position ``p`` shows (ascending; a frame may fill several positions). A frame that comes before
    its turn is kept until then; a decoder's second pass starts the parts again."""

    def __init__(self, where: np.ndarray, size: tuple[int, int], part: int,
                 fill: Callable[[np.ndarray, int], None]) -> None:
        self._where, self._part, self._fill = where, part, fill
        self.shape = (int(where[-1]) + 1 if len(where) else 0, *size, 3)
        self._buf = np.empty((part, *size, 3), np.uint8)
        self._pos = 0  # the next planned position to fill
        self._early: dict[int, np.ndarray] = {}

    def __setitem__(self, j: int, frame: np.ndarray) -> None:
        if j == 0 and self._pos:
            self._pos, self._early = 0, {}  # the read again from the start
        want = int(self._where[self._pos]) if self._pos < len(self._where) else len(self._where)
        if j < want:
            raise RuntimeError(f"the decoder put out frame {j} of the read twice")
        if j > want:
            self._early[j] = np.array(frame)
            return
        self._take(j, frame)
        while self._pos < len(self._where) and int(self._where[self._pos]) in self._early:
            self._take(int(self._where[self._pos]), self._early.pop(int(self._where[self._pos])))

    def _take(self, j: int, frame: np.ndarray) -> None:
        while self._pos < len(self._where) and self._where[self._pos] == j:
            k, r = divmod(self._pos, self._part)
            self._buf[r] = frame
            self._pos += 1
            if r == self._part - 1:
                self._fill(self._buf, k)

    def finish(self) -> None:
        """Hand over the last part where it is short of frames."""
        if self._pos < len(self._where):
            raise RuntimeError(f"the decoder put out {self._pos} of the read's {len(self._where)} planned frames")
        k, r = divmod(self._pos, self._part)
        if r:
            self._fill(self._buf[:r], k)


class PlannedVideos(WholeVideos):
    """A source of whole videos planned by ``recipe`` (sample ``i`` is video ``i``): the recipe's
    fields, and ``frames`` (int64 rows: each delivered frame's index in the video), ``times``
    (float64 rows: its start in seconds from the first frame's, by the file's timestamps),
    ``label`` and ``index`` (int64)."""

    worker_imports = ("shmloader.video.preload", "shmloader.video.planned")  # for the fork server (engine.forkserver)
    _cut = Cut("each video's planned frames and size", 0, 0, 1)

    def __init__(self, paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None, recipe: Recipe, *,
                 spans: Sequence[tuple[float | None, float | None] | None] | None = None,
                 decoder: str = "auto", decode_threads: int = 1, storage_options: Mapping[str, Any] | None = None,
                 fetch: Mapping[str, Any] | None = None, allow_urls: bool = False, on_error: str = "raise",
                 metas: Sequence[Video | str] | None = None, threads: int | None = None,
                 probes: str | os.PathLike[str] | None = None) -> None:
        decode_threads = renamed_threads(decode_threads, threads)
        given = self._open(paths, on_error)
        codes = None if labels is None else checked_labels(labels, len(given))
        if spans is not None and len(spans) != len(given):
            raise ValueError(f"{len(spans)} spans for {len(given)} videos")
        if metas is not None and len(metas) != len(given):
            raise ValueError(f"{len(metas)} metas for {len(given)} videos")
        resolved = self._read(given, Reading(decoder=decoder, decode_threads=decode_threads,
                                             storage_options=storage_options, fetch=fetch, allow_urls=allow_urls))
        self.recipe = recipe
        self.paths = resolved
        self.spans = None if spans is None else [None if s is None else (s[0], s[1]) for s in spans]
        videos = self._probe_all(probes) if metas is None else [
            v if isinstance(v, str) or self.spans is None else replace(v, span=self.spans[i]) for i, v in enumerate(metas)]
        plans = [v if isinstance(v, str) else self._plan(v) for v in videos]
        kept = self._keep(resolved, {i: p for i, p in enumerate(plans) if isinstance(p, str)}, on_error,
                          "read or planned")
        self.labels = None if codes is None else np.ascontiguousarray(codes[kept])
        self.spans = None if self.spans is None else [self.spans[i] for i in kept]
        self._plans = [p for p in plans if not isinstance(p, str)]
        self._sizes = self._sizes_of(self._plans)  # the loader's plan and every Ray task read them
        # What a worker reads of each video besides its path, as columns (``SharedPlanned``): the
        # planned (height, width, frames) it checks its own plan against, the span (NaN: open).
        self._planned = np.array([(*p.size, len(p.indices)) for p in self._plans], np.int64).reshape(-1, 3)
        self._span_table = None if self.spans is None else np.array(
            [(np.nan, np.nan) if s is None else tuple(np.nan if t is None else float(t) for t in s)
             for s in self.spans], np.float64).reshape(-1, 2)
        self._digest = self._fingerprint()

    def _probe_all(self, probes: str | os.PathLike[str] | None) -> list[Video | str]:
        """Each video as probed, or why it cannot be (a string)."""
        return probe_videos(self.paths, self.storage, self.spans, probes=probes)

    def _span(self, i: int) -> tuple[float | None, float | None] | None:
        """Sample ``i``'s span as the recipe sees it (None: the whole video)."""
        if self._span_table is None:
            return None
        start, end = (None if np.isnan(t) else float(t) for t in self._span_table[i])
        return None if start is None and end is None else (start, end)

    def _plan(self, video: Video) -> Planned | str:
        """The recipe's plan of ``video``, or why it gives none (a string)."""
        try:
            return self.recipe.plan(video)
        except ValueError as e:
            return str(e)

    def _fingerprint(self) -> str:
        h = hashlib.sha256("\0".join(self.paths).encode("utf-8", "surrogateescape"))
        for part in (self.positions, self.labels, self._sizes.cost, *self._sizes.rows.values()):
            h.update(b";" if part is None else np.ascontiguousarray(part, np.int64).tobytes())
        h.update(repr([p.size for p in self._plans]).encode())
        h.update(repr(self.spans).encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        left = f", {len(self.skipped)} left out" if self.skipped else ""
        return (f"{type(self).__name__}({len(self)} videos{left}, {type(self.recipe).__name__}: "
                f"{int(self._sizes.cost.sum())} cost in all, decoder={self.decoder!r})")

    # --------------------------------------------------------------- the source
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

    def reader(self) -> PlannedReader:
        """Samples as new arrays in any process (a Ray task): ``reader().read(ids)``."""
        return PlannedReader(self)

    def for_workers(self) -> SharedPlanned:
        """What one loader's workers run (its columns shared, not pickled into each worker): the
        loader that asks owns it."""
        return SharedPlanned(self)

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        decoding = self._worker_decoding()
        info = decoding.info(self.paths[index])
        video = _video(info, self._span(index), storage=self.storage if self.remote else None)
        planned = self.recipe.plan(video)
        h, w, n = (int(x) for x in self._planned[index])
        if planned.size != (h, w) or len(planned.indices) != n:
            raise ValueError(f"the video changed since the loader planned it: {planned.size} "
                             f"{len(planned.indices)} frames, planned {(h, w)} {n} frames")
        union, where = np.unique(planned.indices, return_inverse=True)
        if self.remote:  # the bytes of every frame decoded, in one round of requests
            decoding.prefetch([(info, union, None)])
        part = getattr(self.recipe, "part", 0)
        frames: np.ndarray | None = None
        if part:
            parts = Parts(where.reshape(-1), planned.size, part,
                          lambda got, k: self.recipe.fill_part(got, k, planned, out))  # type: ignore[attr-defined]
            decoding.decode_to(info, planned.size, union, parts)
            parts.finish()
        else:
            decoded = decoding.decode(info, planned.size, union)
            frames = decoded if np.array_equal(union, planned.indices) else decoded[where.reshape(-1)]
        decoding.count(union, decoding.keyframes(info), len(planned.indices))
        decoding.close_file(info.path)
        self.recipe.fill(frames, planned, video, out)
        out["frames"][:] = planned.indices
        assert video.times is not None
        out["times"][:] = video.times[planned.indices]
        out["label"][...] = -1 if self.labels is None else self.labels[index]
        out["index"][...] = self.positions[index]


class SharedPlanned(SharedDescription):
    """The engine's source for planned videos (``engine.source.Source``): the paths and per-video
    columns in one shared segment every worker maps (made when the loader starts, closed when its
    workers are gone), so a worker's memory does not grow with the videos; each worker reads
    through a copy of the description that holds the segment's views instead of its lists."""

    # The description's columns that travel in the segment; the lists only the main process keeps.
    _COLUMNS = ("labels", "positions", "_planned", "_span_table")
    _MAIN_ONLY = ("paths", "spans", "skipped", "_plans", "_sizes")

    def __init__(self, videos: PlannedVideos) -> None:
        super().__init__(videos, measures(videos.decoder, videos.remote))


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
        return stacked(outs, spec)

    def counters(self) -> dict[str, int]:
        return self.clips.counters()


def _video(info: VideoInfo, span: tuple[float | None, float | None] | None, timed: bool = True,
           storage: Storage | None = None) -> Video:
    times = info.times() if timed else None
    return Video(frames=info.frames, fps=float(info.fps), height=info.height, width=info.width,
                 times=None if times is None else times[:, 0] - times[0, 0], span=span, path=info.path,
                 duration=float(info.duration), storage=storage)


def probe_videos(paths: Sequence[str], storage: Storage,
                 spans: Sequence[tuple[float | None, float | None] | None] | None = None, *,
                 probes: str | os.PathLike[str] | None = None) -> list[Video | str]:
    """Each of ``paths`` as a ``Video`` without timestamps (what a plan's sizes need), or why it
    cannot be read (a string): probed here (``video.probing``: processes or threads, a progress
    bar on a terminal), or taken from ``probes``, a file of probes an earlier run kept."""
    return [row if isinstance(row, str) else as_video(row, paths[i], None if spans is None else spans[i])
            for i, row in enumerate(probe_rows(paths, storage, kept=probes))]


def manifest_videos(manifest: str | os.PathLike[str], path_column: str = "path", label_column: str | None = None
                    ) -> tuple[list[str], list[int] | None, list[Video | str]]:
    """A ``shmloader scan`` manifest's (or a file of kept probes') paths, labels and videos as a
    recipe plans from them, no file opened (a changed file is found by the worker that reads it:
    its plan no longer matches); a row the scan could not read is a string saying why."""
    paths, labels, rows = manifest_rows(manifest, path_column, label_column)
    return paths, labels, [r if isinstance(r, str) else as_video(r, p) for p, r in zip(paths, rows)]


def as_video(row: Row, path: str, span: tuple[float | None, float | None] | None = None) -> Video:
    """A probe's or a manifest's row as a recipe plans from it (no timestamps)."""
    frames, fps, height, width, duration = row
    return Video(frames=frames, fps=fps, height=height, width=width, span=span, path=path, duration=duration)
