"""The limit of Qwen-VL's planned reads (issue 68): what decoding only what each video's plan needs
costs, in W processes with PyAV alone: no loader, no patches, no consumer.

For every video, the plan (``qwen.clips(paths).plans()``, made once in the main process) names
the frames and the size. A process opens the file, seeks to the keyframe before each stretch of
wanted frames and sends the packets from there in decode order, each with ``skip_frame="NONREF"``
unless its frame is wanted (a non-reference frame no wanted frame needs is never decoded); once a
stretch's last wanted packet is sent the decoder is drained, nothing more decoded. Each wanted
frame is converted to rgb24 at the planned size (``VideoReformatter.reformat``, bicubic as the
loader's scaler, which costs the same per frame) into a new array, and that is all. One thread
per process, as ``qwen.clips``' default ``decode_threads=1``: one decoding thread, one scaling
thread. The process keeps one ``VideoReformatter``: ``VideoFrame.reformat`` on each new frame
builds a new scaler, with a thread pool by default (PyAV 18: ~7.6 ms CPU a 720p frame, against
~2.6 ms with one kept single-threaded scaler).

A new stretch starts where the keyframe before the next wanted frame lies past the frame after
the last one decoded: the loader's own rule (``video.pyav``), so both seek alike. Frames are
found by timestamp: frame ``i`` of a video is the ``i``-th smallest packet timestamp, keyframes
are the packets flagged so (files whose timeline needs edit lists are not what this measures).

Run by ``bench/qwen.py`` (``--arms limit``) through ``limit.run_timed``: the processes start
together, each on its share of the videos (``workloads.sample_keys``, shuffled per epoch), and
the videos/s is the sum of each process's own rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from limit import run_timed
from measure import Result
from workloads import sample_keys

__all__ = ["PlanRead", "Stretch", "physical_limit", "plan_reads", "plan_steps", "read_plan", "stretches"]


@dataclass(frozen=True)
class Stretch:
    """One seek and the frames decoded from there: ``seek`` the keyframe's timestamp,
    ``wanted`` the timestamps of the frames wanted in it."""

    seek: int
    wanted: frozenset[int]


@dataclass(frozen=True)
class PlanRead:
    """What one video's plan needs decoded: its stretches, the planned size, and the frames the
    plan delivers (repeats counted)."""

    path: str
    height: int
    width: int
    stretches: tuple[Stretch, ...]
    delivered: int

    @property
    def nbytes(self) -> int:
        """The planned frames' bytes as rgb24."""
        return self.delivered * self.height * self.width * 3


def _timeline(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(every shown frame's timestamp, ascending; the indices of the keyframes among them)."""
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        packets = [(p.pts, p.is_keyframe) for p in c.demux(s) if p.pts is not None]
    packets.sort()
    pts = np.array([p for p, _ in packets], np.int64)
    keys = np.flatnonzero([k for _, k in packets])
    return pts, keys


def stretches(pts: np.ndarray, keys: np.ndarray, indices: np.ndarray) -> tuple[Stretch, ...]:
    """The stretches that decode frames ``indices`` (the loader's seeking rule)."""
    wanted = np.unique(indices)
    out: list[tuple[int, list[int]]] = []
    last = None
    for i in wanted.tolist():
        key = int(keys[np.searchsorted(keys, i, side="right") - 1])
        if last is None or key > last + 1:
            out.append((int(pts[key]), []))
        out[-1][1].append(int(pts[i]))
        last = i
    return tuple(Stretch(seek, frozenset(w)) for seek, w in out)


def plan_reads(paths: list[str], plans: list) -> list[PlanRead]:
    """Each video's ``PlanRead`` from its plan (``video.planned.Planned``: ``indices``, ``size``)."""
    reads = []
    for path, plan in zip(paths, plans):
        pts, keys = _timeline(path)
        h, w = plan.size
        reads.append(PlanRead(path, h, w, stretches(pts, keys, plan.indices), len(plan.indices)))
    return reads


def read_plan(task: PlanRead, scaler=None) -> list[np.ndarray]:
    """The planned frames of ``task``'s video, decoded as little as its plan allows, each a new
    ``[h, w, 3]`` uint8 array (in timestamp order; a repeated frame once). ``scaler``: a PyAV
    ``VideoReformatter`` kept between videos (a new one otherwise)."""
    import av
    from av.video.reformatter import VideoReformatter

    scaler = scaler or VideoReformatter()
    frames: list[np.ndarray] = []

    def convert(decoded, wanted: frozenset[int]) -> None:
        for frame in decoded:
            if frame.pts in wanted:
                frames.append(scaler.reformat(frame, width=task.width, height=task.height, format="rgb24",
                                              interpolation="BICUBIC", threads=1).to_ndarray())

    with av.open(task.path) as c:
        s = c.streams.video[0]
        cc = s.codec_context
        cc.thread_count = 1
        for stretch in task.stretches:
            c.seek(stretch.seek, stream=s, backward=True)
            cc.flush_buffers()
            left = set(stretch.wanted)
            for packet in c.demux(s):
                if packet.pts is None:
                    continue
                cc.skip_frame = "DEFAULT" if packet.pts in left else "NONREF"
                convert(cc.decode(packet), stretch.wanted)
                left.discard(packet.pts)
                if not left:
                    break
            convert(cc.decode(None), stretch.wanted)  # drain: the frames held back for reordering
    return frames


def plan_steps(tasks: list[PlanRead], shard: int, shards: int):
    """One step reads the next video of this process's share (``limit.run_timed``'s ``steps``)."""
    from av.video.reformatter import VideoReformatter

    n = len(tasks)  # fewer videos than processes: each process reads them all
    keys, scaler = sample_keys(n, shard % n, min(shards, n)), VideoReformatter()
    return lambda: read_plan(tasks[next(keys)[1]], scaler)


def physical_limit(tasks: list[PlanRead], workers: int, duration: float, workload: str, rep: int) -> Result:
    """``read_plan`` in ``workers`` spawned processes for ``duration`` s (``limit.run_timed``):
    ``clips_per_s`` is videos/s, ``cpu_ms_per_clip`` CPU ms per video."""
    res = Result(loader="limit", workload=workload, workers=str(workers), rep=rep)
    frames = int(np.mean([t.delivered for t in tasks]))
    nbytes = int(np.mean([t.nbytes for t in tasks]))
    return run_timed(plan_steps, lambda i: (tasks, i, workers), workers, duration, res, 1, frames, nbytes)
