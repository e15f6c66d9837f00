"""Qwen-VL's video input as pure functions of a video's frame count, rate and size: which frames,
what size, which patches (qwen-vl-utils' and transformers' numbers, before anything is decoded)."""


from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..vlm import frames as _frames
from ..vlm import patches as _patches
from ..vlm import sizes as _sizes

__all__ = ["MODELS", "VideoPlan", "frame_indices", "frame_size", "grid_thw", "normalize", "patches", "plan",
           "sample_fps", "second_per_grid_ts"]

# qwen-vl-utils' constants (vision_process.py), under its names.
FPS = 2.0
FRAME_FACTOR = 2  # frames per temporal patch: every count is a multiple of it
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_TOKEN_NUM = 128  # per frame, in merged patches (tokens)
VIDEO_MAX_TOKEN_NUM = 768
IMAGE_MIN_TOKEN_NUM = 4  # the bounds smart_resize takes for a resized_height/width given outright
IMAGE_MAX_TOKEN_NUM = 16384
SPATIAL_MERGE_SIZE = 2
_MODEL_SEQ_LEN = 128000

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# model -> (patch size, mean, std): the transformers processor's defaults for the family.
MODELS: dict[str, tuple[int, tuple[float, ...], tuple[float, ...]]] = {
    "qwen2-vl": (14, _CLIP_MEAN, _CLIP_STD),
    "qwen2.5-vl": (14, _CLIP_MEAN, _CLIP_STD),
    "qwen3-vl": (16, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}


def _model(model: str) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {model!r}")
    return MODELS[model]


def _count(num_frames: int, video_fps: float, fps: float | None, nframes: int | None, min_frames: int,
           max_frames: int) -> int:
    if nframes is not None:
        if fps is not None:
            raise ValueError("give fps or nframes, not both (qwen-vl-utils: only accept either `fps` or `nframes`)")
        return _frames.fixed_count(nframes, num_frames, multiple=FRAME_FACTOR)
    return _frames.rate_count(num_frames, video_fps, FPS if fps is None else fps, min_frames=min_frames,
                              max_frames=max_frames, multiple=FRAME_FACTOR)


def frame_indices(num_frames: int, video_fps: float, *, fps: float | None = None, nframes: int | None = None,
                  min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES,
                  video_start: float | None = None, video_end: float | None = None) -> np.ndarray:
    """The frames Qwen-VL reads of a video of ``num_frames`` frames at ``video_fps`` (int64, sorted,
    a frame may repeat where frames are fewer than wanted).

    As qwen-vl-utils' decord and torchcodec readers: the span ``[video_start, video_end]`` seconds
    (``calculate_video_frame_range``) holds ``T`` frames; ``smart_nframes`` takes ``T / video_fps *
    fps`` frames (``fps`` 2.0 unless ``nframes`` is given) kept within ``[min_frames, max_frames]``
    and ``T``, rounded down to an even count, or ``nframes`` rounded to an even count; then
    ``torch.linspace(first, last, n).round()`` in torch's float32 (``vlm.frames.linspace_indices``).
    A ValueError in words where that leaves fewer than 2 frames or more than ``T``, or for a span
    that holds none.
    """
    first, last = _frames.frame_range(num_frames, video_fps, video_start, video_end)
    n = _count(last - first + 1, video_fps, fps, nframes, min_frames, max_frames)
    return _frames.linspace_indices(first, last, n)


def sample_fps(num_frames: int, video_fps: float, nframes: int, *, video_start: float | None = None,
               video_end: float | None = None) -> float:
    """The rate ``nframes`` sampled frames show (qwen-vl-utils' ``sample_fps``): ``nframes`` over
    the span's frame count times ``video_fps``."""
    first, last = _frames.frame_range(num_frames, video_fps, video_start, video_end)
    return _frames.sample_fps(nframes, last - first + 1, video_fps)


def second_per_grid_ts(sample_fps: float, *, temporal_patch_size: int = FRAME_FACTOR) -> float:
    """The seconds one temporal patch spans: ``temporal_patch_size / sample_fps``, as Qwen2.5-VL's
    processor computes ``second_per_grid_ts`` from the ``sample_fps`` of ``fetch_video``."""
    return temporal_patch_size / sample_fps


def _model_seq_len() -> int:
    return int(float(os.environ.get("MODEL_SEQ_LEN", _MODEL_SEQ_LEN)))


def frame_size(height: int, width: int, nframes: int, *, min_pixels: float | None = None,
               max_pixels: float | None = None, total_pixels: float | None = None,
               resized_height: int | None = None, resized_width: int | None = None,
               factor: int = 28) -> tuple[int, int]:
    """The (height, width) each of ``nframes`` sampled ``height x width`` frames is resized to, as
    qwen-vl-utils' ``fetch_video`` (``factor``: patch x merge, 28 for Qwen2/2.5-VL, 32 for Qwen3-VL).

    ``smart_resize`` to multiples of ``factor`` within ``[min_pixels, cap]`` (``min_pixels``
    default ``128 * factor²``), where the cap is ``max(min(768 * factor², total_pixels / nframes
    * 2), int(min_pixels * 1.05))`` (``total_pixels`` default ``MODEL_SEQ_LEN * factor² * 0.9``)
    and a given ``max_pixels`` can only lower it. ``resized_height`` with ``resized_width`` go
    through ``smart_resize`` alone (with its image bounds, ``4..16384 * factor²``), as there.
    A ValueError for an aspect ratio past 200, for bounds that cross, or one of the two resized sides
    given alone (qwen-vl-utils ignores it).
    """
    f2 = factor * factor
    if (resized_height is None) != (resized_width is None):
        raise ValueError(f"give resized_height and resized_width together, got resized_height={resized_height}, "
                         f"resized_width={resized_width}")
    if resized_height is not None and resized_width is not None:
        return _sizes.smart_resize(resized_height, resized_width, factor, IMAGE_MIN_TOKEN_NUM * f2,
                                   IMAGE_MAX_TOKEN_NUM * f2)
    low = VIDEO_MIN_TOKEN_NUM * f2 if min_pixels is None else min_pixels
    total = _model_seq_len() * f2 * 0.9 if total_pixels is None else total_pixels
    cap = _sizes.frame_pixel_cap(nframes, min_pixels=low, max_pixels=VIDEO_MAX_TOKEN_NUM * f2, total_pixels=total,
                                 frame_factor=FRAME_FACTOR)
    if max_pixels is not None:
        cap = min(max_pixels, cap)
    return _sizes.smart_resize(height, width, factor, low, cap)


def grid_thw(num_frames: int, height: int, width: int, *, model: str = "qwen2.5-vl") -> tuple[int, int, int]:
    """``video_grid_thw`` of ``num_frames`` resized frames: ``(ceil(num_frames / 2), height / patch,
    width / patch)``."""
    return _patches.grid(num_frames, height, width, patch=_model(model)[0], temporal=FRAME_FACTOR)


def patches(frames: np.ndarray, *, model: str = "qwen2.5-vl", out: np.ndarray | None = None) -> np.ndarray:
    """Resized frames ``[T, H, W, 3]`` as the rows of ``pixel_values_videos`` before normalising:
    ``[grid t * h * w, 3 * 2 * patch²]`` in ``Qwen2VLVideoProcessor.patchify``'s order, the frames'
    dtype (or ``out``'s: see ``vlm.patches.rows``)."""
    return _patches.rows(frames, patch=_model(model)[0], temporal=FRAME_FACTOR, merge=SPATIAL_MERGE_SIZE, out=out)


@overload
def normalize(rows: np.ndarray, *, model: str = ...) -> np.ndarray[Any, np.dtype[np.float32]]: ...
@overload
def normalize(rows: _patches.ArrayT, *, model: str = ...) -> _patches.ArrayT: ...
def normalize(rows: Any, *, model: str = "qwen2.5-vl") -> Any:
    """Patch rows of pixels 0..255 (numpy, or a torch tensor on any device) as the model takes
    them: float32 ``(x / 255 - mean) / std`` per channel, computed as transformers' fused rescale
    and normalise (the same float32 bits)."""
    _, mean, std = _model(model)
    return _patches.normalize(rows, mean, std)


@dataclass(frozen=True, eq=False, slots=True)
class VideoPlan:
    """What Qwen-VL makes of one video, decided before decoding (see ``plan``).

    ``indices``: the frames to read (int64); ``height``, ``width``: their size after resizing;
    ``grid_thw``: ``video_grid_thw``; ``tokens``: the video's tokens (patches / merge²);
    ``sample_fps``: the rate the frames show; ``second_per_grid_ts``: seconds per temporal patch;
    ``times``: the frames' start times in seconds where the video's timestamps were given, else None.
    """

    indices: np.ndarray
    height: int
    width: int
    grid_thw: tuple[int, int, int]
    tokens: int
    sample_fps: float
    second_per_grid_ts: float
    times: np.ndarray | None = None


def plan(num_frames: int, video_fps: float, height: int, width: int, *, model: str = "qwen2.5-vl",
         pts: np.ndarray | None = None, fps: float | None = None, nframes: int | None = None,
         min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES, video_start: float | None = None,
         video_end: float | None = None, min_pixels: float | None = None, max_pixels: float | None = None,
         total_pixels: float | None = None, resized_height: int | None = None,
         resized_width: int | None = None) -> VideoPlan:
    """One video's ``VideoPlan`` from its frame count, average rate and (displayed) size: the
    frames of ``frame_indices``, the size of ``frame_size`` for that many frames, the grid and
    tokens they make. ``pts``: each frame's start time in seconds (``[num_frames]``, or
    ``[num_frames, 2]`` start and end) for ``times``. The keywords are ``frame_indices``' and
    ``frame_size``'s, which say where each follows qwen-vl-utils."""
    patch, _, _ = _model(model)
    indices = frame_indices(num_frames, video_fps, fps=fps, nframes=nframes, min_frames=min_frames,
                            max_frames=max_frames, video_start=video_start, video_end=video_end)
    n = len(indices)
    h, w = frame_size(height, width, n, min_pixels=min_pixels, max_pixels=max_pixels, total_pixels=total_pixels,
                      resized_height=resized_height, resized_width=resized_width, factor=patch * SPATIAL_MERGE_SIZE)
    grid = grid_thw(n, h, w, model=model)
    rate = sample_fps(num_frames, video_fps, n, video_start=video_start, video_end=video_end)
    times = None
    if pts is not None:
        starts = np.asarray(pts, np.float64)
        if len(starts) != num_frames:
            raise ValueError(f"pts must hold the times of all {num_frames} frames, got {len(starts)}")
        times = (starts[:, 0] if starts.ndim == 2 else starts)[indices]
    return VideoPlan(indices=indices, height=h, width=w, grid_thw=grid,
                     tokens=_patches.tokens(grid, merge=SPATIAL_MERGE_SIZE), sample_fps=rate,
                     second_per_grid_ts=second_per_grid_ts(rate), times=times)
