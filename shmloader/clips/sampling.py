"""Where the clips of a video sample lie: which frames, at what scale, which crop windows.

Pure numpy and decided before decoding: the worker computes a sample's frames from the
video's frame count (and timestamps, for clips in seconds) and the sample's generator, then
decodes the sorted union of every clip's frames in one pass (see ``clips.description``).

NOTE [ Time spans, segments and frame rates ]

Every rule below that speaks of time uses the timestamps stored in the file as libavformat
reads them, measured from the start of the video's first frame (so a span ``[0, 2)`` is the
first two seconds a player shows, whatever the first timestamp is).

- A span ``[start, end)`` (seconds) holds the frames on screen during it: those whose
  presentation interval overlaps it. Sampling then runs on those frames alone, as on a video of
  its own, whose first frame starts at ``max(its start, start)`` and whose last ends at
  ``min(its end, end)``: clips, segments and frame-rate instants all lie inside the span. A span
  that holds no frame of the video is an error under ``short_video="error"``; otherwise it
  stands for the video's frame nearest to it (its last frame for a span after the end).
- Segments (TSN): the (span of the) video, from its first frame's start to its last frame's
  end, is cut into ``N = clip_len`` segments of equal duration. Segment ``k`` holds the frames
  from the one on screen at its start up to the one on screen at the next segment's start
  (excluded): ``[floor(k·L/N), floor((k+1)·L/N))`` for ``L`` frames at a constant rate. In
  training (``"segments"``) each clip takes a seeded frame of each segment, so the ``N`` frames
  are distinct; with ``C`` draws per video in evaluation (``"segments_uniform"``) draw ``c``
  takes the frame on screen ``(c + 1/2) / C`` of the way through each segment: the centre for
  ``C = 1``. Two segments may show one frame only when a frame lasts longer than a segment
  (variable rate): ``frames`` says so. A video of fewer than ``N`` frames is shorter than one
  clip (``short_video``).
- Frame rate with a cap (``fps=F, max_frames=M``): instants ``F`` per second from the start,
  (training: from a seeded phase within the first ``1/F`` s), as long as the video lasts; when
  there are more than ``M``, ``M`` of them evenly spread from the first to the last.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SEGMENTS", "clip_frames", "rate_frames", "span_frames", "scaled_size", "crop_windows"]

SEGMENTS = ("segments", "segments_uniform")  # the sampling modes that cut a video in equal stretches

# Sampling instants are nudged forward by this much before looking up the frame that holds
# them: an instant that lands on a frame's start time (the usual case when the video's frame
# rate is a multiple of `fps`) must not fall into the previous frame by a rounding error.
_EPS_S = 1e-6


def clip_frames(num_frames: int, pts: np.ndarray | None, *, clip_len: int, frame_step: int,
                fps: float | None, sampling: str, clips: list[int], total_clips: int,
                short_video: str, rng: np.random.Generator,
                span: tuple[float, float] | None = None) -> np.ndarray:
    """Frame indices ``[len(clips), clip_len]`` of the clips ``clips`` (numbered ``0 ..
    total_clips - 1`` along the video for ``sampling="uniform"`` and ``"segments_uniform"``).

    Index-based (``fps=None``): frames ``start + k * frame_step``. Time-based: the frame whose
    presentation interval ``pts[i] = (start_s, end_s)`` holds each instant ``t0 + k / fps``,
    where ``t0`` is the start time of the clip's first frame. ``sampling="segments"`` /
    ``"segments_uniform"``: one frame in each of ``clip_len`` segments of equal duration. A
    video shorter than one clip follows ``short_video``: ``"error"`` raises ValueError;
    ``"repeat_last"`` repeats the last frame the clip reaches; ``"wrap"`` repeats the clip's
    frames from its beginning. ``span=(start, end)``: seconds from the first frame's start,
    the clips lie inside it (NOTE [ Time spans, segments and frame rates ]).
    """
    if num_frames < 1:
        raise ValueError("video has no frames")
    if span is not None:
        first, sub = span_frames(num_frames, pts, span, short_video)
        try:
            return first + clip_frames(len(sub), sub, clip_len=clip_len, frame_step=frame_step, fps=fps,
                                       sampling=sampling, clips=clips, total_clips=total_clips,
                                       short_video=short_video, rng=rng)
        except ValueError as e:
            raise ValueError(f"in the span {_span_text(span)}: {e}") from None
    if sampling in SEGMENTS:
        return _segment_frames(num_frames, pts, clip_len, sampling, clips, total_clips, short_video, rng)
    if fps is None:
        reach = (clip_len - 1) * frame_step + 1
        last = num_frames - reach
        offsets = np.arange(clip_len, dtype=np.int64) * frame_step
        if last < 0:
            what = f"{clip_len} frames every {frame_step} = {reach} frames"
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
    return np.asarray(np.clip(frames, 0, num_frames - 1), np.int64)


def _segment_frames(n: int, pts: np.ndarray | None, segments: int, sampling: str, clips: list[int],
                    total: int, short_video: str, rng: np.random.Generator) -> np.ndarray:
    """TSN: the frame on screen at one instant of each of ``segments`` equal stretches of time."""
    if n < segments:
        return _short(n, np.arange(n), segments, f"{segments} segments of at least a frame each", len(clips),
                      short_video)
    pts = _check_pts(pts, n)
    t0, length = pts[0, 0], (pts[-1, 1] - pts[0, 0]) / segments
    if sampling == "segments":
        # Segment k holds the frames from the one on screen at its start up to the one on screen at
        # the next segment's start (excluded): [floor(k·n/N), floor((k+1)·n/N)) at a constant rate.
        # A seeded frame among them, never an instant: the frame that straddles a boundary would
        # be drawn by both its segments.
        edges = np.searchsorted(pts[:, 0], t0 + np.arange(segments + 1) * length + _EPS_S, side="right") - 1
        edges[-1] = n
        lo, hi = edges[:-1], np.maximum(edges[1:], edges[:-1] + 1)  # a frame longer than a segment
        frames = lo + np.floor(rng.random((len(clips), segments)) * (hi - lo)).astype(np.int64)
        return np.asarray(np.clip(frames, 0, n - 1), np.int64)
    where = np.repeat(((np.asarray(clips, np.float64) + 0.5) / total)[:, None], segments, axis=1)
    instants = t0 + (np.arange(segments) + where) * length
    frames = np.searchsorted(pts[:, 0], instants + _EPS_S, side="right") - 1
    return np.asarray(np.clip(frames, 0, n - 1), np.int64)


def rate_frames(num_frames: int, pts: np.ndarray | None, *, fps: float, max_frames: int, sampling: str,
                short_video: str, rng: np.random.Generator, span: tuple[float, float] | None = None) -> np.ndarray:
    """Frame indices (1-D, at most ``max_frames``): the frame on screen at every ``1/fps``
    seconds of the video (or ``span``) from its start (``sampling="random"``: from a seeded
    phase within the first ``1/fps`` s), evenly thinned to ``max_frames`` when there are more."""
    if num_frames < 1:
        raise ValueError("video has no frames")
    if span is not None:
        first, sub = span_frames(num_frames, pts, span, short_video)
        return first + rate_frames(len(sub), sub, fps=fps, max_frames=max_frames, sampling=sampling,
                                   short_video=short_video, rng=rng)
    pts = _check_pts(pts, num_frames)
    t0, t1, step = pts[0, 0], pts[-1, 1], 1.0 / fps
    phase = float(rng.random()) * min(step, t1 - t0) if sampling == "random" else 0.0
    count = max(1, int(np.ceil((t1 - t0 - phase) * fps - 1e-9)))  # instants before the end
    k = np.arange(count, dtype=np.float64)
    if count > max_frames:
        k = np.round(np.linspace(0, count - 1, max_frames)) if max_frames > 1 else np.array([(count - 1) // 2])
    frames = np.searchsorted(pts[:, 0], t0 + phase + k * step + _EPS_S, side="right") - 1
    return np.asarray(np.clip(frames, 0, num_frames - 1), np.int64)


def span_frames(num_frames: int, pts: np.ndarray | None, span: tuple[float, float],
                short_video: str) -> tuple[int, np.ndarray]:
    """``(first, times)``: the frames on screen during ``span`` (seconds from the first frame's
    start) are ``first .. first + len(times) - 1``, and ``times`` their (start, end) seconds, the
    first start and the last end cut to the span. A span that holds none is a ValueError under
    ``short_video="error"``, else it stands for the video's last frame (it lies after the end)."""
    pts = _check_pts(pts, num_frames)
    a, b = pts[0, 0] + span[0], pts[0, 0] + span[1]
    inside = np.flatnonzero((pts[:, 1] > a + _EPS_S) & (pts[:, 0] < b - _EPS_S))
    if len(inside) == 0:
        if short_video == "error":
            raise ValueError(f"the span {_span_text(span)} holds no frame of the video "
                             f"({pts[-1, 1] - pts[0, 0]:.3f} s long); pass short_video='repeat_last' or 'wrap' "
                             "to take its last frame")
        return num_frames - 1, pts[-1:].copy()
    first, last = int(inside[0]), int(inside[-1])
    times = pts[first : last + 1].copy()
    times[0, 0], times[-1, 1] = max(times[0, 0], a), min(times[-1, 1], b)
    return first, times


def _span_text(span: tuple[float, float]) -> str:
    return f"{span[0]:g}-{span[1]:g} s"


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
    times = None if pts is None else np.asarray(pts, dtype=np.float64)
    ok = times is not None and times.shape == (num_frames, 2) and bool(np.isfinite(times).all())
    if times is not None and ok:
        begin, end = times[:, 0], times[:, 1]
        length = end - begin
        ok = bool((length > 0).all() and (begin[1:] >= begin[:-1] + length[:-1] / 2).all())
    if times is None or not ok:
        raise ValueError("cannot read the video's frame timestamps, which sampling by time needs (fps=, "
                         "segments, spans): the container reports none, or they overlap or run backwards")
    return times


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
