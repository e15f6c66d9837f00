"""Patches: frames cut into the rows a vision transformer with temporal patches and a spatial
merge takes, their grid and token count, and their normalisation.

A row is one patch of ``temporal`` frames x ``patch`` x ``patch`` pixels x 3 channels; rows come
grouped ``merge x merge`` (the patches one token merges) in the order of transformers'
``Qwen2VLVideoProcessor.patchify`` (Qwen2-VL, Qwen2.5-VL and Qwen3-VL cut alike): grid time,
merged row, merged column, row within the merge, column within it; within a row, channel,
frame, pixel row, pixel column.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import numpy as np

__all__ = ["grid", "normalize", "rows", "tokens"]

ArrayT = TypeVar("ArrayT")


def grid(num_frames: int, height: int, width: int, *, patch: int = 14, temporal: int = 2) -> tuple[int, int, int]:
    """The patch grid (time, height, width) of ``num_frames`` frames of ``height x width``: a
    last temporal patch short of frames counts whole (its last frame repeats), as
    transformers' ``video_grid_thw``."""
    for name, side in (("height", height), ("width", width)):
        if side <= 0 or side % patch:
            raise ValueError(f"{name} must be a positive multiple of the patch ({patch}), got {side}")
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    return -(-num_frames // temporal), height // patch, width // patch


def tokens(grid_thw: tuple[int, int, int], *, merge: int = 2) -> int:
    """How many tokens a patch grid becomes: its patches over ``merge²``."""
    t, h, w = grid_thw
    return t * h * w // (merge * merge)


def rows(frames: np.ndarray, *, patch: int = 14, temporal: int = 2, merge: int = 2,
         out: np.ndarray | None = None) -> np.ndarray:
    """``frames`` ``[T, H, W, C]`` (as decoded: channels last) as patch rows
    ``[ceil(T / temporal) * (H / patch) * (W / patch), C * temporal * patch * patch]``, in
    transformers' order (see the module). ``H`` and ``W`` must be multiples of ``patch *
    merge``; a last temporal patch short of frames repeats the last frame.

    Written straight into ``out`` where given (C-contiguous, the rows' shape, any dtype the
    frames cast to safely: uint8 rows for the model's own normalisation on its device, float32
    to normalise here); one copy of the pixels, no temporary beyond a short last patch.
    """
    if frames.ndim != 4:
        raise ValueError(f"frames must be [T, H, W, C], got shape {frames.shape}")
    t, h, w, c = frames.shape
    g = grid(t, h, w, patch=patch, temporal=temporal)
    if h % (patch * merge) or w % (patch * merge):
        raise ValueError(f"frames of {h}x{w}: both sides must be multiples of patch * merge ({patch * merge})")
    shape = (g[0] * g[1] * g[2], c * temporal * patch * patch)
    if out is None:
        out = np.empty(shape, frames.dtype)
    elif out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous array of shape {shape}, got {out.shape}")
    gh, gw = g[1] // merge, g[2] // merge
    into = out.reshape(g[0], gh, gw, merge, merge, c, temporal, patch, patch)

    def cut(x: np.ndarray) -> np.ndarray:
        x = x.reshape(-1, temporal, gh, merge, patch, gw, merge, patch, c)
        return np.transpose(x, (0, 2, 5, 3, 6, 8, 1, 4, 7))

    whole = t // temporal
    np.copyto(into[:whole], cut(frames[: whole * temporal]), casting="safe")
    if whole < g[0]:
        rest = frames[whole * temporal:]
        last = np.concatenate([rest, np.repeat(rest[-1:], temporal - len(rest), axis=0)])
        np.copyto(into[whole:], cut(last), casting="safe")
    return out


@overload
def normalize(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], *,
              scale: float = 255.0) -> np.ndarray[Any, np.dtype[np.float32]]: ...
@overload
def normalize(x: ArrayT, mean: tuple[float, ...], std: tuple[float, ...], *, scale: float = 255.0) -> ArrayT: ...
def normalize(x: Any, mean: tuple[float, ...], std: tuple[float, ...], *, scale: float = 255.0) -> Any:
    """Patch rows ``[N, C * k]`` (numpy, or a torch tensor on any device) as float32
    ``(x - mean * scale) / (std * scale)``, the channel of column ``j`` being ``j // k``: what
    transformers' fused rescale (``1 / scale``) and normalise compute, to the bit, on pixels in
    ``[0, scale]``. The result is a new array (or tensor, on ``x``'s device); ``x`` is not changed.
    """
    arr: Any = x
    channels = len(mean)
    if len(std) != channels or arr.ndim != 2 or arr.shape[1] % channels:
        raise ValueError(f"rows [N, C * k] and C means and stds wanted, got shape {tuple(arr.shape)}, "
                         f"{len(mean)} means, {len(std)} stds")
    if hasattr(arr, "new_tensor"):  # torch: its own ops, on its device, without importing torch here
        y = arr.float()
        y = y.clone() if y is arr else y
        view = y.view(arr.shape[0], channels, -1)
        view.sub_(y.new_tensor(mean)[:, None] * scale).div_(y.new_tensor(std)[:, None] * scale)
        return y
    y = np.asarray(arr).astype(np.float32)
    view = y.reshape(y.shape[0], channels, -1)
    np.subtract(view, (np.asarray(mean, np.float32) * np.float32(scale))[:, None], out=view)
    np.divide(view, (np.asarray(std, np.float32) * np.float32(scale))[:, None], out=view)
    return y
