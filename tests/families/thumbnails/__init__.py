"""Thumbnails: every video as ``count`` frames spread evenly over it, each at ``side`` x ``side``,
as video-retrieval models (CLIP4Clip, X-CLIP) take a video.

A family of whole videos planned one by one: a ``Recipe`` (its fields, each video's plan, the
fields filled from the decoded frames) over ``shmloader.planned.PlannedVideos``, which brings the
rest: local and remote files, the decoder, files that cannot be read, resume, Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from shmloader.planned import Planned, PlannedVideos, Video

__all__ = ["Recipe", "clips"]


@dataclass(frozen=True)
class Recipe:
    count: int = 8
    side: int = 64
    tokens_per_frame: int = 49  # what a batch budget counts: a 7x7 grid of patches a frame

    def spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        # A field of rows (first dimension -1): each video holds as many frames as its plan says.
        return {"pixels": ((-1, self.side, self.side, 3), np.dtype(np.uint8))}

    def plan(self, video: Video) -> Planned:
        if video.frames < 1:
            raise ValueError("the video has no frames")
        n = min(self.count, video.frames)  # a short video gives each of its frames once
        indices = np.linspace(0, video.frames - 1, n).round().astype(np.int64)
        return Planned(indices=indices, size=(self.side, self.side), rows={"pixels": n},
                       cost=n * self.tokens_per_frame)

    def fill(self, frames: np.ndarray, planned: Planned, video: Video, out: dict[str, np.ndarray]) -> None:
        out["pixels"][:] = frames  # decoded at side x side already


def clips(paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *, count: int = 8,
          side: int = 64, **house: Any) -> PlannedVideos:
    """A source for ``shmloader.Loader``: sample ``i`` is ``paths[i]``'s thumbnails (``pixels``,
    ``frames``, ``times``, ``label``, ``index``). ``house``: what ``PlannedVideos`` takes for every
    family (``decoder``, ``decode_threads``, ``storage_options``, ``fetch``, ``on_error``...)."""
    return PlannedVideos(paths, labels, Recipe(count, side), **house)
