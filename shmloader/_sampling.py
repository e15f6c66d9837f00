"""Where the clips of a video sample lie: which frames, at what scale, which crop windows.

Pure numpy and decided before decoding: the worker computes a sample's frames from the
video's frame count (and timestamps, for clips in seconds) and the sample's generator, then
decodes the sorted union of every clip's frames in one pass (see ``_video``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SAMPLINGS", "SHORT_POLICIES", "CROP_AT", "clip_frames", "scaled_size", "crop_windows"]

SAMPLINGS = ("random", "uniform", "center")
SHORT_POLICIES = ("error", "repeat_last", "wrap")
CROP_AT = ("center", "random", "three")

# Sampling instants are nudged forward by this much before looking up the frame that holds
# them: an instant that lands on a frame's start time (the usual case when the video's frame
# rate is a multiple of `fps`) must not fall into the previous frame by a rounding error.
_EPS_S = 1e-6


def clip_frames(num_frames: int, pts: np.ndarray | None, *, clip_len: int, frame_step: int,
                fps: float | None, sampling: str, clips: list[int], total_clips: int,
                short_video: str, rng: np.random.Generator) -> np.ndarray:
    """Frame indices ``[len(clips), clip_len]`` of the clips ``clips`` (numbered ``0 ..
    total_clips - 1`` along the video for ``sampling="uniform"``).

    Index-based (``fps=None``): frames ``start + k * frame_step``. Time-based: the frame whose
    presentation interval ``pts[i] = (start_s, end_s)`` holds each instant ``t0 + k / fps``,
    where ``t0`` is the start time of the clip's first frame. A video shorter than one clip
    follows ``short_video``: ``"error"`` raises ValueError; ``"repeat_last"`` repeats the last
    frame the clip reaches; ``"wrap"`` repeats the clip's frames from its beginning.
    """
    if num_frames < 1:
        raise ValueError("video has no frames")
    if fps is None:
        span = (clip_len - 1) * frame_step + 1
        last = num_frames - span
        offsets = np.arange(clip_len, dtype=np.int64) * frame_step
        if last < 0:
            what = f"{clip_len} frames every {frame_step} = {span} frames"
            return _short(num_frames, offsets, clip_len, what, len(clips), short_video)
        starts = _starts(last, sampling, clips, total_clips, rng)
        return starts[:, None] + offsets[None, :]
    pts = _check_pts(pts, num_frames)
    begin = pts[:, 0]
    instants = np.arange(clip_len, dtype=np.float64) / fps
    latest = pts[-1, 1] - instants[-1] - _EPS_S  # a clip's first frame must start by then
    last = int(np.searchsorted(begin, latest, side="right")) - 1
    if last < 0:
        frames = np.searchsorted(begin, begin[0] + instants + _EPS_S, side="right") - 1
        inside = begin[0] + instants < pts[-1, 1]
        what = f"{clip_len} frames at {fps:g} fps = {instants[-1] + 1 / fps:.3g} s"
        return _short(num_frames, frames[inside], clip_len, what, len(clips), short_video)
    starts = _starts(last, sampling, clips, total_clips, rng)
    frames = np.searchsorted(begin, begin[starts][:, None] + instants[None, :] + _EPS_S, side="right") - 1
    return np.clip(frames, 0, num_frames - 1).astype(np.int64)


def _starts(last: int, sampling: str, clips: list[int], total: int, rng: np.random.Generator) -> np.ndarray:
    if sampling == "random":
        return np.array([int(rng.integers(0, last + 1)) for _ in clips], dtype=np.int64)
    if sampling == "uniform" and total > 1:
        return np.array([round(c * last / (total - 1)) for c in clips], dtype=np.int64)
    return np.full(len(clips), last // 2, dtype=np.int64)


def _short(num_frames: int, reached: np.ndarray, clip_len: int, what: str, nclips: int,
           policy: str) -> np.ndarray:
    """Clips of a video shorter than one clip: they start at frame 0 and ``reached`` are the
    frames the clip finds in the video before it runs out."""
    valid = np.asarray(reached, dtype=np.int64)
    valid = valid[valid < num_frames]
    if policy == "error" or len(valid) == 0:
        raise ValueError(f"video has {num_frames} frames, shorter than one clip ({what}); "
                         "pass short_video='repeat_last' or 'wrap' to use it anyway")
    if policy == "wrap":
        frames = valid[np.arange(clip_len) % len(valid)]
    else:  # repeat_last
        frames = np.concatenate([valid, np.full(clip_len - len(valid), valid[-1], dtype=np.int64)])
    return np.tile(frames, (nclips, 1))


def _check_pts(pts: np.ndarray | None, num_frames: int) -> np.ndarray:
    """The frame timestamps, if they can be trusted: increasing start times, positive
    durations, and each frame starting no earlier than half way through the one before (a
    container without timestamps gets made-up ones that fail this: 1 ms apart, 40 ms long)."""
    pts = None if pts is None else np.asarray(pts, dtype=np.float64)
    ok = pts is not None and pts.shape == (num_frames, 2) and bool(np.isfinite(pts).all())
    if ok:
        begin, end = pts[:, 0], pts[:, 1]
        length = end - begin
        ok = bool((length > 0).all() and (begin[1:] >= begin[:-1] + length[:-1] / 2).all())
    if not ok:
        raise ValueError("cannot read the video's frame timestamps, which fps= needs: the container "
                         "reports none, or they overlap or run backwards")
    return pts


def scaled_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """(height, width) with the short side ``short_side`` and the aspect ratio kept."""
    if height <= width:
        return short_side, max(1, round(width * short_side / height))
    return max(1, round(height * short_side / width)), short_side


def crop_windows(height: int, width: int, crop: tuple[int, int], crop_at: str, nclips: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Top-left corners ``[nclips, views, 2]`` of the crop windows in a ``height x width`` frame.

    ``"center"``: one central window per clip; ``"random"``: one seeded window per clip;
    ``"three"``: three windows along the long side (left/top, center, right/bottom).
    """
    ch, cw = crop
    if ch > height or cw > width:
        raise ValueError(f"crop {ch}x{cw} does not fit in the {height}x{width} frame")
    dy, dx = height - ch, width - cw
    if crop_at == "random":
        corners = [[(int(rng.integers(0, dy + 1)), int(rng.integers(0, dx + 1)))] for _ in range(nclips)]
    elif crop_at == "three":
        if width >= height:
            three = [(dy // 2, 0), (dy // 2, dx // 2), (dy // 2, dx)]
        else:
            three = [(0, dx // 2), (dy // 2, dx // 2), (dy, dx // 2)]
        corners = [three] * nclips
    else:
        corners = [[(dy // 2, dx // 2)]] * nclips
    return np.array(corners, dtype=np.int64)
