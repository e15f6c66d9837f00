"""Open-Sora 2.0's buckets, stated as rules (hpcaitech/Open-Sora ``opensora/datasets/aspect.py``,
``bucket.py``, ``utils.py``, ``sampler.py``; Apache-2.0): which bucket a video falls in for an
epoch, and the size each bucket decodes at.

A config is ``{resolution: {num_frames: (probability, batch_size)}}``. A resolution is a name:
``"256px"`` (256² pixels) or ``"360p"`` (360² × 16 / 9), optionally ``"_max"`` (its largest
aspect ratio alone) or ``"_ar16:9"`` (that one alone). Its aspect-ratio table: for each ratio of
``ASPECTS`` (width:height) the width ``⌊√(P·w/h) / 16⌋·16`` and height ``⌊P / width / 16⌋·16``,
moved by one step of 16 where that comes closer to ``P`` pixels; a size already in the table is
not added again; each landscape entry has its portrait twin. A probability is the chance to keep
the resolution at that length, or a pair: (that chance, the chance to skip to the next shorter
length first).

A video's bucket in an epoch: its rate brought under ``fps_max`` by keeping every ``interval``-th
frame (``interval = ⌈fps / fps_max⌉`` where ``fps ≥ fps_max``), so it holds ``frames // interval``
frames; the resolutions from the most pixels down, passed over where the video has under 0.8 of
their pixels; within one, the lengths from the longest down: one the video holds is skipped with
its pair's second chance, else kept with the first chance (else the next resolution); an image
(one frame) takes a one-frame bucket with its chance. The draws come from
``numpy.random.default_rng(seed + epoch + index × number_of_buckets)``, so a video's bucket is the
same wherever it is computed. The aspect ratio: the table's nearest to the video's height/width.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from .draws import first_draws

__all__ = ["ASPECTS", "BucketTable", "aspect_sizes", "interval_for", "pixels_of"]

# Aspect ratios as width:height, landscape first (each gets its portrait twin).
ASPECTS = ("2.39:1", "2:1", "16:9", "1.85:1", "9:16", "5:8", "3:2", "4:3", "1:1")
STEP = 16  # the autoencoder's spatial compression: every side a multiple of it
NEAR = 0.8  # a resolution takes videos with at least this share of its pixels
_NAME = re.compile(r"^(\d+)(px|p)$")


def pixels_of(resolution: str) -> int:
    """The pixels a resolution's name stands for: ``"256px"`` 256², ``"360p"`` 360² × 16 / 9."""
    m = _NAME.match(resolution.split("_")[0])
    if m is None:
        raise ValueError(f"bucket_config: resolution {resolution!r} is not a name like '256px' (256x256 pixels) "
                         "or '360p' (360 rows at 16:9), optionally with '_max' or '_ar16:9'")
    side = int(m.group(1))
    return side * side if m.group(2) == "px" else int(side * side / 9 * 16)


def _ratio(name: str) -> float:
    width, height = (float(x) for x in name.split(":"))
    return height / width


def aspect_sizes(pixels: int, step: int = STEP) -> dict[str, tuple[int, int]]:
    """The (height, width) of each aspect ratio at ``pixels`` (see the module's docstring)."""
    table: dict[str, tuple[int, int]] = {}
    portrait: dict[str, tuple[int, int]] = {}
    for name in ASPECTS:
        wr, hr = (float(x) for x in name.split(":"))
        width = int(math.sqrt(pixels * (wr / hr)) // step) * step
        height = int((pixels / width) // step) * step
        best = abs(height * width - pixels)
        for h, w in ((height - step, width), (height + step, width), (height, width - step), (height, width + step)):
            if abs(h * w - pixels) < best:
                height, width, best = h, w, abs(h * w - pixels)
        if (height, width) not in table.values():
            table[name] = (height, width)
            portrait[":".join(name.split(":")[::-1])] = (width, height)
    table.update(portrait)
    return table


def _resolution_sizes(resolution: str) -> tuple[int, dict[str, tuple[int, int]]]:
    pixels = pixels_of(resolution)
    table = aspect_sizes(pixels)
    setting = resolution.split("_", 1)[1] if "_" in resolution else ""
    if setting == "max":
        best = max(table, key=lambda k: table[k][0] * table[k][1])
        table = {best: table[best]}
    elif setting.startswith("ar") and setting[2:] in table:
        table = {setting[2:]: table[setting[2:]]}
    elif setting:
        raise ValueError(f"bucket_config: resolution {resolution!r}: {setting!r} is neither 'max' nor an aspect "
                         f"ratio 'ar<w:h>' of {sorted(table)}")
    return pixels, table


def interval_for(fps: float, fps_max: float) -> int:
    """Every how many frames a video at ``fps`` is read to stay under ``fps_max``."""
    if math.isnan(fps) or fps < fps_max:
        return 1
    return math.ceil(fps / fps_max)


@dataclass(frozen=True)
class _Length:
    frames: int
    keep: float  # the chance to keep the resolution at this length
    skip: float | None  # a pair's second: the chance to pass to the next shorter length first
    batch_size: int
    first: int  # the bucket number of its first aspect ratio


class BucketTable:
    """Every bucket of a config: ``shapes`` ``[K, 3]`` (frames, height, width), ``batch_sizes``
    ``[K]``, ``names`` (``"360p 33x352x656 (16:9)"``), and ``bucket(...)``, a video's bucket."""

    def __init__(self, config: Mapping[str, Mapping[int, Any]]) -> None:
        if not isinstance(config, Mapping) or not config:
            raise ValueError("bucket_config must be a non-empty dict {resolution: {num_frames: (probability, "
                             "batch_size)}}")
        sized = {res: _resolution_sizes(str(res)) for res in config}
        self.resolutions = sorted(config, key=lambda r: sized[r][0], reverse=True)
        self.pixels = {r: sized[r][0] for r in self.resolutions}
        self.aspects = {r: sized[r][1] for r in self.resolutions}
        self.lengths: dict[str, list[_Length]] = {}
        shapes: list[tuple[int, int, int]] = []
        sizes: list[int] = []
        names: list[str] = []
        for res in self.resolutions:
            lengths = []
            for frames in sorted(config[res], reverse=True):
                keep, skip, batch = _entry(res, frames, config[res][frames])
                lengths.append(_Length(int(frames), keep, skip, batch, len(shapes)))
                for ar, (h, w) in self.aspects[res].items():
                    shapes.append((int(frames), h, w))
                    sizes.append(batch)
                    names.append(f"{res} {frames}x{h}x{w} ({ar})")
            self.lengths[res] = lengths
        self.shapes = np.array(shapes, np.int64).reshape(-1, 3)
        self.batch_sizes = np.array(sizes, np.int64)
        self.names = tuple(names)

    def __len__(self) -> int:
        return len(self.shapes)

    def certain(self) -> BucketTable:
        """The same buckets, every length kept with certainty and none skipped (evaluation)."""
        copy = BucketTable.__new__(BucketTable)
        copy.__dict__.update(self.__dict__)
        copy.lengths = {res: [replace(ln, keep=1.0, skip=None) for ln in lns] for res, lns in self.lengths.items()}
        return copy

    def bucket(self, frames: int, height: int, width: int, fps: float, seed: int, fps_max: float) -> int:
        """The bucket of a video (``-1``: none) for the draws of ``default_rng(seed)``."""
        rng: list[np.random.Generator] = []

        def draw() -> float:
            if not rng:
                rng.append(np.random.default_rng(seed))
            return float(rng[0].random())

        return self._search(frames // interval_for(fps, fps_max), height, width, draw)

    def _search(self, t: int, height: int, width: int, draw: Callable[[], float]) -> int:
        area = height * width
        for res in self.resolutions:
            if area < self.pixels[res] * NEAR:
                continue
            lengths = self.lengths[res]
            if t == 1:
                one = next((ln for ln in lengths if ln.frames == 1), None)
                if one is not None and (one.keep >= 1 or draw() < one.keep):
                    return one.first + self._aspect(res, height, width)
                continue
            for ln in lengths:
                if ln.frames == 1 or t < ln.frames:
                    continue
                if ln.skip is not None and (ln.skip >= 1 or draw() <= ln.skip):
                    continue
                if ln.keep >= 1 or draw() <= ln.keep:
                    return ln.first + self._aspect(res, height, width)
                break
        return -1

    def _aspect(self, res: str, height: int, width: int) -> int:
        """The position in ``res``'s table of the aspect ratio nearest ``height / width``."""
        ratio = height / width
        names = list(self.aspects[res])
        return min(range(len(names)), key=lambda i: abs(ratio - _ratio(names[i])))

    def assign(self, frames: np.ndarray, heights: np.ndarray, widths: np.ndarray, rates: np.ndarray, *,
               seed: int, epoch: int, fps_max: float, ids: np.ndarray | None = None) -> np.ndarray:
        """Every video's bucket in ``epoch`` (``-1``: none); ``ids``: each video's number in the
        draws' seed (its row in the table; default its position). Videos alike in length, size and
        rate are searched once where the search draws nothing, and together, each with its own
        draws, where it draws."""
        n = len(frames)
        out = np.full(n, -1, np.int64)
        rates = np.asarray(rates, np.float64)
        with np.errstate(invalid="ignore"):
            slow = np.isfinite(rates) & (rates >= fps_max)
        intervals = np.where(slow, np.ceil(np.where(slow, rates, 1.0) / fps_max), 1).astype(np.int64)
        keys = np.stack([np.asarray(frames, np.int64) // intervals, np.asarray(heights, np.int64),
                         np.asarray(widths, np.int64)], axis=1)
        kinds, which = np.unique(keys, axis=0, return_inverse=True)
        order = np.argsort(which.reshape(-1), kind="stable")
        bounds = np.searchsorted(which.reshape(-1)[order], np.arange(len(kinds) + 1))
        drawn: list[tuple[tuple[int, int, int], np.ndarray]] = []
        for j, (t, h, w) in enumerate(kinds.tolist()):
            members = order[bounds[j] : bounds[j + 1]]
            try:
                out[members] = self._search(t, h, w, _no_draw)
            except _Drawn:
                drawn.append(((t, h, w), members))
        if drawn:
            every = np.concatenate([m for _, m in drawn])
            rows = every if ids is None else np.asarray(ids, np.int64)[every]
            draws = first_draws(seed + epoch + rows * len(self), self._most_draws())
            at = 0
            for (t, h, w), members in drawn:
                out[members] = self._search_many(t, h, w, draws[at : at + len(members)])
                at += len(members)
        return out

    def _most_draws(self) -> int:
        """The most draws one search can take: two a length (skip, keep), one an image's."""
        return sum(2 * len(lengths) + 1 for lengths in self.lengths.values())

    def _search_many(self, t: int, height: int, width: int, draws: np.ndarray) -> np.ndarray:
        """``_search`` for videos alike in length and size, each with its row of ``draws``: the
        same steps, taken for all of them at once."""
        m = len(draws)
        out = np.full(m, -1, np.int64)
        used = np.zeros(m, np.int64)  # each video's draws so far
        rows = np.arange(m)
        area = height * width
        for res in self.resolutions:
            if area < self.pixels[res] * NEAR:
                continue
            searching = out < 0  # not yet in a bucket: these search this resolution
            if t == 1:
                one = next((ln for ln in self.lengths[res] if ln.frames == 1), None)
                if one is not None:
                    won = searching & ((one.keep >= 1) | (draws[rows, used] < one.keep))
                    used += searching
                    out[won] = one.first + self._aspect(res, height, width)
                continue
            for ln in self.lengths[res]:
                if ln.frames == 1 or t < ln.frames or not searching.any():
                    continue
                if ln.skip is not None:
                    if ln.skip >= 1:
                        continue
                    skipped = searching & (draws[rows, used] <= ln.skip)
                    used += searching
                    searching &= ~skipped
                    here = searching.copy()
                    searching = skipped  # the skipped go on to the next length
                else:
                    here, searching = searching, np.zeros(m, bool)
                won = here & ((ln.keep >= 1) | (draws[rows, used] <= ln.keep))
                used += here if ln.keep < 1 else 0
                out[won] = ln.first + self._aspect(res, height, width)
        return out


class _Drawn(Exception):
    """The search needs a draw: each video of the kind is searched with its own."""


def _no_draw() -> float:
    raise _Drawn


def _entry(res: str, frames: Any, value: Any) -> tuple[float, float | None, int]:
    """(keep, skip, batch size) of one config entry, checked."""
    where = f"bucket_config[{res!r}][{frames!r}]"
    if not isinstance(frames, (int, np.integer)) or isinstance(frames, bool) or frames < 1:
        raise ValueError(f"{where}: a length must be a number of frames >= 1")
    try:
        prob, batch = value
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be (probability, batch_size), got {value!r}") from None
    pair = prob if isinstance(prob, (tuple, list)) else None
    try:
        keep, skip = (float(pair[0]), float(pair[1])) if pair is not None else (float(prob), None)
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"{where}: the probability must be a number or a pair (keep, skip to a shorter "
                         f"length), got {prob!r}") from None
    if not (0 <= keep <= 1) or (skip is not None and not 0 <= skip <= 1):
        raise ValueError(f"{where}: probabilities must lie in [0, 1], got {prob!r}")
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"{where}: the batch size must be an integer >= 1, got {batch!r}")
    return keep, skip, int(batch)
