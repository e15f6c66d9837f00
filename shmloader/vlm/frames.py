"""Frames at a rate: how many frames a video-LLM samples from a video (a rate, bounds, a multiple),
which ones, and the rate that sampling shows.

Pure arithmetic on a video's frame count and average rate, decided before decoding. The rules
are those of qwen-vl-utils' ``smart_nframes`` and ``calculate_video_frame_range``; the indices
are ``torch.linspace(first, last, n).round()`` computed as torch computes it (see
``linspace_indices``).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fixed_count", "frame_range", "linspace_indices", "rate_count", "sample_fps"]


def _floor_by(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def _ceil_by(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _in_range(n: int, num_frames: int, multiple: int, how: str, fewer: str, more: str = "") -> int:
    """``n`` where it lies in ``[multiple, num_frames]``, else a ValueError in words: the video's
    frames, what ``how`` (the options as set) gives, and what to change (``fewer``: where ``n`` is
    under the ``multiple``; ``more``: where it is over the frame count)."""
    if num_frames < multiple:
        raise ValueError(f"the video has {_frames(num_frames)}, and Qwen-VL needs at least {multiple} (FRAME_FACTOR: "
                         f"it reads frames {multiple} to a temporal patch), whatever the options (set: {how}): leave "
                         f"such videos out (qwen.clips(on_error='skip') does) or make them {multiple} frames or longer")
    if n < multiple:
        raise ValueError(f"with {how}: {_frames(n)} of a video of {num_frames}, and Qwen-VL needs at least {multiple} "
                         f"(FRAME_FACTOR: it reads frames {multiple} to a temporal patch): {fewer}")
    if n > num_frames:
        raise ValueError(f"with {how}: {_frames(n)} of a video of {num_frames}, more than it has: {more}")
    return n


def _frames(n: int) -> str:
    return f"{n} frame{'' if n == 1 else 's'}"


def rate_count(num_frames: int, video_fps: float, fps: float, *, min_frames: int, max_frames: int | None = None,
               multiple: int = 2) -> int:
    """How many frames ``fps`` frames a second give of a video of ``num_frames`` frames at
    ``video_fps``: ``num_frames / video_fps * fps`` kept within ``[min_frames, max_frames]``
    (``min_frames`` rounded up, ``max_frames`` down to the ``multiple``; ``max_frames`` None: the
    frame count), then within the frame count, then rounded down to the ``multiple``.

    As qwen-vl-utils' ``smart_nframes`` with ``fps`` (its order of operations, in float64). Raises
    a ValueError when that leaves fewer than ``multiple`` frames (a video of fewer frames than the
    multiple) or more than the video has.
    """
    if video_fps <= 0 or fps <= 0:
        raise ValueError(f"video_fps and fps must be positive, got video_fps={video_fps!r}, fps={fps!r}")
    low = _ceil_by(min_frames, multiple)
    high = _floor_by(max_frames if max_frames is not None else num_frames, multiple)
    n = min(max(num_frames / video_fps * fps, low), high, num_frames)
    fewer = (f"raise max_frames to {multiple} or more" if high < multiple else
             f"raise fps, or min_frames to {multiple} or more")
    return _in_range(_floor_by(n, multiple), num_frames, multiple,
                     f"fps={fps}, min_frames={min_frames}, max_frames={max_frames} at video_fps={video_fps}", fewer)


def fixed_count(nframes: int, num_frames: int, *, multiple: int = 2) -> int:
    """``nframes`` rounded to the nearest ``multiple`` (half to even, as Python's ``round``), as
    qwen-vl-utils' ``smart_nframes`` with ``nframes``; a ValueError unless that lies in
    ``[multiple, num_frames]``."""
    n = round(nframes / multiple) * multiple
    return _in_range(n, num_frames, multiple, f"nframes={nframes}" + (f" (rounded to a multiple of {multiple})"
                                                                     if n != nframes else ""),
                     f"set nframes to {multiple} or more",
                     f"set nframes to {_floor_by(num_frames, multiple)} or fewer, or give fps instead")


def frame_range(num_frames: int, video_fps: float, start: float | None = None,
                end: float | None = None) -> tuple[int, int]:
    """The first and last frame (inclusive) of the span ``[start, end]`` seconds of a video of
    ``num_frames`` frames at ``video_fps``; the whole video where both are None.

    As qwen-vl-utils' ``calculate_video_frame_range``: times are clamped to ``[0, duration]``,
    the first frame is ``ceil(start * video_fps)``, the last ``floor(end * video_fps)`` (at most
    the video's last); a span whose first frame is not before its last is a ValueError.
    """
    if video_fps <= 0:
        raise ValueError(f"video_fps must be a positive number, got {video_fps!r}")
    if num_frames <= 0:
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if start is None and end is None:
        return 0, num_frames - 1
    duration = num_frames / video_fps
    first = math.ceil(max(0.0, min(start, duration)) * video_fps) if start is not None else 0
    last = min(math.floor(max(0.0, min(end, duration)) * video_fps), num_frames - 1) if end is not None \
        else num_frames - 1
    if first >= last:
        raise ValueError(f"the span video_start={start}, video_end={end} of a video of {duration:.2f} s "
                         f"({num_frames} frames at {video_fps} fps) holds frames {first} to {last}: the "
                         f"first frame must come before the last")
    return first, last


def linspace_indices(first: int, last: int, n: int, *, fused: bool = True) -> np.ndarray:
    """``n`` frame indices from ``first`` to ``last``, int64: ``torch.linspace(first, last,
    n).round().long()`` to the bit, without torch.

    torch computes linspace in float32 (its default dtype), which past some thousands of frames
    rounds to another frame than float64 does (``np.linspace``) now and then. Its CPU kernel
    takes ``step = (last - first) / (n - 1)`` in float32, then ``first + i * step`` for ``i < n //
    2`` and ``last - (n - 1 - i) * step`` after, each with one rounding (a fused multiply-add:
    the kernels for AVX2 and AVX-512 are compiled with it); ``fused=False`` rounds the product
    and the sum apart, as its kernel without SIMD (``ATEN_CPU_CAPABILITY=default``) does. The
    values are rounded half to even, as ``torch.round``.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    start, end = np.float32(first), np.float32(last)
    if n == 1:
        return np.array([round(float(start))], np.int64)
    step = np.float32((end - start) / np.float32(n - 1))
    i = np.arange(n, dtype=np.int64)
    back = n - 1 - i
    if fused:  # i * step is exact in float64 (24-bit operands) and so is the sum: one rounding
        ahead = (np.float64(start) + i * np.float64(step)).astype(np.float32)
        behind = (np.float64(end) - back * np.float64(step)).astype(np.float32)
    else:
        ahead = start + i.astype(np.float32) * step
        behind = end - back.astype(np.float32) * step
    indices: np.ndarray = np.rint(np.where(i < n // 2, ahead, behind)).astype(np.int64)
    return indices


def sample_fps(n: int, num_frames: int, video_fps: float) -> float:
    """The rate ``n`` frames spread over ``num_frames`` frames at ``video_fps`` show, as
    qwen-vl-utils reports it: ``n / max(num_frames, 1e-6) * video_fps``."""
    return n / max(num_frames, 1e-6) * video_fps
