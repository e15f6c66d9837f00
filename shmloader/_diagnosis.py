"""``Loader.stats_line()``: the diagnosis of ``stats()`` in one line, and what to do about it."""

from __future__ import annotations

from typing import Any

__all__ = ["PREPARE_FROM", "grouped_decode_estimate", "head_per_frame", "prepare_hint", "prepare_pays",
           "stats_line", "too_short"]

# Clips per video the line prices grouped decode at (``clips_per_video=K, group_clips=True``).
_GROUPINGS = (4, 8)

# From this many frames decoded per delivered frame, one clip per sample is told of prepared
# copies: a clip of every 2nd frame decodes ~2 per delivered frame from a keyframe every 16
# frames (what ``shmloader prepare`` writes), more only when its keyframes are further apart.
PREPARE_FROM = 3.0


def head_per_frame(s: dict[str, Any]) -> float | None:
    """Frames decoded before each pass's first wanted frame (from its keyframe) per delivered
    frame, from ``Loader.stats()``'s counters; None before any counted pass."""
    delivered = s.get("frames_delivered", 0)
    return s.get("frames_head", 0) / delivered if delivered else None


def prepare_pays(decoded_per_frame: float | None, head: float | None) -> bool:
    """Whether copies with a keyframe every 16 frames would decode fewer frames per delivered
    frame: ``PREPARE_FROM`` or more now, and at least one of them before a clip's first frame
    (a copy's clip has at most 15 there). Many frames between a clip's own (a large
    ``frame_step``) are not the keyframes' doing: a copy would decode them too."""
    return decoded_per_frame is not None and head is not None and decoded_per_frame >= PREPARE_FROM \
        and head >= 1.0


def prepare_hint() -> str:
    """What ``stats_line`` and ``calibrate`` suggest where ``prepare_pays``: the ``prepare``
    command, its sources and folder to fill in."""
    return ("copies at the training size with a keyframe every 16 frames read random clips faster: "
            "shmloader prepare SRC... --out DST --short-side 128 --gop 16 (the guide's 'Preparing a dataset')")


def grouped_decode_estimate(s: dict[str, Any], k: int) -> float | None:
    """Frames decoded per delivered frame if ``k`` clips of a video shared one decode pass: the
    frames before each pass's first wanted frame (from its keyframe) paid once per ``k`` clips,
    the rest as now. From the workers' own counters; None before any counted pass."""
    delivered = s.get("frames_delivered", 0)
    if not delivered:
        return None
    head = s["frames_head"]
    return (s["frames_decoded"] - head + head / k) / delivered


def stats_line(s: dict[str, Any], group: int) -> str:
    """``s``: a ``Loader.stats()`` dict; ``group``: the source's samples per decode group."""
    if not s.get("judged", True):
        return too_short(s)
    busy = ", ".join(f"{100 * b:.0f}%" for b in s["worker_busy_fraction"]) or "-"
    verdict = "input-bound" if s["input_bound"] else "compute-bound"
    parts = [f"{verdict}: consumer waited {100 * s['consumer_wait_fraction']:.0f}% of the time",
             f"{s['samples_per_s']:.1f} samples/s after the first batch", f"workers busy {busy}",
             f"{s['samples_per_worker_s']:.1f} samples/s per busy worker"]
    per = s.get("decoded_per_frame")
    if per is not None:
        parts.append(f"{per:.1f} frames decoded per delivered frame")
    rec, workers, cpus = s["recommended_workers"], s["workers"], s.get("cpus", s["workers"])
    if rec and rec != workers:
        parts.append(f"recommended workers: {rec}")
    if s["input_bound"] and rec is not None and rec <= workers and workers >= cpus:
        advice = f"all {cpus} CPUs decode already: decode less per clip or add cores"
        if group == 1 and per is not None:
            saved = [(k, grouped_decode_estimate(s, k)) for k in _GROUPINGS]
            advice += " (clips_per_video=K, group_clips=True would decode ~" + ", ".join(
                f"{e:.1f} at K={k}" for k, e in saved if e is not None) + " per delivered frame)"
            if prepare_pays(per, head_per_frame(s)):
                advice += f"; or {prepare_hint()}"
        parts.append(advice)
    return "; ".join(parts)


def too_short(s: dict[str, Any]) -> str:
    """The line of a run of ``JUDGE_BATCHES`` batches or fewer: what happened, no verdict (its
    waits are the ring filling, whatever the training does next)."""
    from .engine.stats import JUDGE_BATCHES

    first = s["first_batch_s"]
    start = "no batch yet" if first is None else f"the first after {first:.1f} s (the workers' start)"
    return (f"too short to judge: {s['batches']} batches ({s['samples']} samples) in {s['elapsed_s']:.1f} s, "
            f"{start}; from {JUDGE_BATCHES + 1} batches this line says whether training waits for input "
            "and how many workers to use")
