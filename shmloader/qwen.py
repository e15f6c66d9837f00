"""Qwen-VL's video input as pure functions: which frames, what size, which patches.

The same numbers qwen-vl-utils' ``fetch_video`` (decord and torchcodec readers) and transformers'
Qwen-VL video processors give, from a video's frame count, average rate and size, before
anything is decoded; their defaults and names:

- ``frame_indices(num_frames, video_fps, fps=, nframes=, min_frames=, max_frames=, video_start=,
  video_end=)``: the frames to read (``smart_nframes``, ``calculate_video_frame_range``,
  ``torch.linspace(...).round()`` in float32 as torch computes it);
- ``sample_fps(...)``, ``second_per_grid_ts(...)``: the rate the sampled frames show, the seconds
  one temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``);
- ``frame_size(height, width, nframes, ...)``: the size every frame is resized to (``smart_resize``
  under the per-frame share of the video's pixel budget);
- ``patches(frames)``, ``grid_thw(...)``, ``normalize(rows)``: ``pixel_values_videos`` and
  ``video_grid_thw`` as ``Qwen2VLVideoProcessor`` (and Qwen3-VL's) make them from resized frames;
- ``plan(num_frames, video_fps, height, width, ...)``: all of the above for one video, a ``VideoPlan``;
- ``clips(paths, ...)``: a source for ``shmloader.Loader`` of one sample per video as the model
  takes it, decoded at the planned size (``Recipe``, over ``shmloader.video.planned``);
  ``Loader(..., batch_tokens=N)`` packs as many videos as fit ``N`` tokens.

``model`` names the family: ``"qwen2-vl"`` and ``"qwen2.5-vl"`` (patch 14, CLIP's mean and std),
``"qwen3-vl"`` (patch 16, mean and std 0.5). The per-video budget follows the environment variable
``MODEL_SEQ_LEN`` (default 128000) as qwen-vl-utils does, read at each call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, overload

import numpy as np

from .vlm import frames as _frames
from .vlm import patches as _patches
from .vlm import sizes as _sizes

if TYPE_CHECKING:
    from .video.planned import PlannedVideos

__all__ = ["MODELS", "Recipe", "VideoPlan", "clips", "frame_indices", "frame_size", "grid_thw", "normalize", "patches", "plan",
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


@dataclass(frozen=True)
class Recipe:
    """Qwen-VL's inputs from a video (``video.planned.Recipe``): ``plan``'s frames and size for
    the keywords given, the frames as patch rows (``pixel_values_videos``, uint8: ``normalize``
    gives the model's floats), ``video_grid_thw`` and ``second_per_grid_ts``; a video's cost is its
    tokens."""

    model: str = "qwen2.5-vl"
    options: tuple[tuple[str, Any], ...] = ()
    audio_rate: int | None = None

    def spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        patch = _model(self.model)[0]
        spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {
                "pixel_values_videos": ((-1, 3 * FRAME_FACTOR * patch * patch), np.dtype(np.uint8)),
                "video_grid_thw": ((3,), np.dtype(np.int64)), "second_per_grid_ts": ((), np.dtype(np.float32))}
        if self.audio_rate is not None:  # room for the longest track the container allows; audio_len says
            spec.update(audio=((-1,), np.dtype(np.float32)), audio_len=((), np.dtype(np.int64)))
        return spec

    def plan(self, video: Any) -> Any:
        from .video.planned import Planned

        start, end = video.span if video.span is not None else (None, None)
        p = plan(video.frames, video.fps, video.height, video.width, model=self.model, pts=video.times,
                 video_start=start, video_end=end, **dict(self.options))
        t, gh, gw = p.grid_thw
        n = len(p.indices)
        rows = {"pixel_values_videos": t * gh * gw, "frames": n, "times": n}
        if self.audio_rate is not None:
            from .video.soundtrack import bound

            rows["audio"] = bound(video.duration, self.audio_rate)
        return Planned(indices=p.indices, size=(p.height, p.width), rows=rows, cost=p.tokens, extra=p)

    def fill(self, frames: np.ndarray, planned: Any, video: Any, out: dict[str, np.ndarray]) -> None:
        p = planned.extra
        patches(frames, model=self.model, out=out["pixel_values_videos"])
        out["video_grid_thw"][:] = p.grid_thw
        out["second_per_grid_ts"][...] = p.second_per_grid_ts
        if self.audio_rate is not None:
            from .video.soundtrack import read_track

            start, end = video.span if video.span is not None else (None, None)
            sound = read_track(video.path, self.audio_rate, start, end, storage=video.storage)
            room = out["audio"]
            if len(sound) > len(room):
                raise ValueError(f"the sound track gives {len(sound)} samples, more than the {len(room)} the "
                                 f"container's duration ({video.duration:.3f} s) allows")
            room[: len(sound)] = sound
            room[len(sound) :] = 0
            out["audio_len"][...] = len(sound)


def clips(paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *,
          model: str = "qwen2.5-vl", fps: float | None = FPS, nframes: int | None = None,
          min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES, min_pixels: float | None = None,
          max_pixels: float | None = None, total_pixels: float | None = None, resized_height: int | None = None,
          resized_width: int | None = None, spans: Sequence[tuple[float | None, float | None] | None] | None = None,
          decoder: str = "auto", decode_threads: int = 1, audio_rate: int | None = None,
          storage_options: Mapping[str, Any] | None = None, fetch: Mapping[str, Any] | None = None,
          allow_urls: bool = False, on_error: str = "raise", threads: int | None = None) -> PlannedVideos:
    """A source for ``shmloader.Loader`` of one sample per video, as Qwen-VL takes it: sample ``i``
    holds what ``qwen_vl_utils.fetch_video({"video": paths[i], "fps": fps, ...})`` and the model's
    video processor (``do_resize=False``) make of it — the same frame indices and size, the frames
    decoded at that size rather than at full size and resized — as uint8 patch rows
    ``pixel_values_videos`` (``normalize`` gives the processor's floats), ``video_grid_thw``,
    ``second_per_grid_ts``, and per frame ``frames`` (its index in the video) and ``times`` (its
    start in seconds, by the file's timestamps, for time markers). ``spans``: per video
    ``(video_start, video_end)`` seconds (None: open). Every video is probed here, once, to plan
    its size: ``Loader(..., batch_tokens=N)`` packs as many videos as fit ``N`` tokens.
    ``audio_rate=16000``: each sample also carries the video's sound as qwen-omni-utils extracts it
    for Qwen-Omni's ``use_audio_in_video`` (the whole track, or its ``spans`` from the track's first
    sample, mono, resampled with soxr; needs ``pip install soxr``), as ``audio`` rows (float32, room
    for the longest track the container's duration allows) and ``audio_len`` (the samples that are real).

    Where the videos live and how they are read, as for ``VideoClips`` (:class:`shmloader.Reading`):
    ``paths`` are local files or fsspec URLs (``s3://``, ``gs://``, ``hf://``, ``https://``), read
    by byte range with ``storage_options`` and ``fetch``; ``decoder``, ``decode_threads``.
    ``on_error="skip"``: a video that cannot be read or planned (missing, cut short, too few
    frames) is left out with a warning and listed in ``.skipped`` as (position, path, reason);
    ``index`` stays its position in ``paths``. ``"raise"`` (the default) names every such video in
    one ValueError.
    """
    from .video.planned import PlannedVideos

    options = dict(fps=fps, nframes=nframes, min_frames=min_frames, max_frames=max_frames, min_pixels=min_pixels,
                   max_pixels=max_pixels, total_pixels=total_pixels, resized_height=resized_height,
                   resized_width=resized_width)
    if nframes is not None:
        options["fps"] = None
    _model(model)  # an unknown model is refused here, before any probe
    if audio_rate is not None:
        if not isinstance(audio_rate, int) or isinstance(audio_rate, bool) or audio_rate < 1:
            raise ValueError(f"audio_rate must be a positive number of samples a second, got {audio_rate!r}")
        try:
            import soxr  # noqa: F401  (the resampler qwen-omni-utils' librosa uses)
        except ImportError as e:
            raise ImportError("qwen.clips(audio_rate=...) resamples the sound with soxr: pip install soxr") from e
    if threads is not None:  # the keyword's old name
        import warnings

        warnings.warn("threads= is now decode_threads=, as VideoClips and lerobot.dataset name it",
                      DeprecationWarning, stacklevel=2)
        decode_threads = threads
    return PlannedVideos(paths, labels, Recipe(model, tuple(options.items()), audio_rate), spans=spans,
                         decoder=decoder, decode_threads=decode_threads, storage_options=storage_options,
                         fetch=fetch, allow_urls=allow_urls, on_error=on_error)
