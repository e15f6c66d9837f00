"""A size per video from a pixel budget: each side a multiple of a factor (the model's patch
times its merge), the area within bounds, the aspect ratio kept as closely as that allows.

The rules are those of qwen-vl-utils' ``smart_resize`` and of the per-frame cap its
``fetch_video`` derives from a whole video's pixel budget, in float64 in the same order (a
reordered product can land on another multiple).
"""

from __future__ import annotations

import math

__all__ = ["MAX_RATIO", "frame_pixel_cap", "smart_resize"]

# The longest side over the shortest that a model's patch grid still takes (qwen-vl-utils'
# MAX_RATIO): past it one side would be a single patch wide.
MAX_RATIO = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: float, max_pixels: float) -> tuple[int, int]:
    """The (height, width) a ``height x width`` frame is resized to: both multiples of ``factor``,
    their product within ``[min_pixels, max_pixels]``, the aspect ratio kept as closely as that
    allows.

    As qwen-vl-utils' ``smart_resize``: each side rounded to the nearest multiple (half to even,
    at least one ``factor``); where the area is then above ``max_pixels`` both sides are scaled
    by ``1 / sqrt(h * w / max_pixels)`` and rounded down, where it is below ``min_pixels`` by
    ``sqrt(min_pixels / (h * w))`` and rounded up. A ValueError for an aspect ratio past
    ``MAX_RATIO`` (its words), bounds that cross, or a side rounded down to nothing.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive, got {height}x{width}")
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be at least min_pixels ({min_pixels})")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_RATIO}, "
                         f"got {max(height, width) / min(height, width)}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if not (h_bar and w_bar):  # qwen-vl-utils passes the 0 on to its resize, which fails there
        raise ValueError(f"{height}x{width} within max_pixels={max_pixels} leaves a side under {factor} pixels")
    return h_bar, w_bar


def frame_pixel_cap(nframes: int, *, min_pixels: float, max_pixels: float, total_pixels: float,
                    frame_factor: int = 2) -> float:
    """The most pixels one of ``nframes`` frames may have when the whole video may have
    ``total_pixels``: ``max(min(max_pixels, total_pixels / nframes * frame_factor),
    int(min_pixels * 1.05))``, as qwen-vl-utils' ``fetch_video`` (the budget counts a temporal
    patch of ``frame_factor`` frames once; the floor keeps a long video's frames at least a
    little above the smallest size). A float where the share is one.
    """
    if nframes <= 0:
        raise ValueError(f"nframes must be positive, got {nframes}")
    return max(min(max_pixels, total_pixels / nframes * frame_factor), int(min_pixels * 1.05))
