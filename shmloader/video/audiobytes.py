"""The bytes a clip's audio is read from in a remote MP4/MOV, fetched before the clip with its
frames' (NOTE [ Reading remote files ] in ``video.storage``; where a clip's audio lies: NOTE
[ Where a clip's audio lies ] in ``video.audio``).

An MP4's index places every sample of every track: the probe of a remote file keeps its first
audio track's packets (time, first byte, end byte: ``mp4index.audio_packets``). A clip's audio
bytes are the packets ``read_audio`` demuxes for the window of spans it is read in, from the
seek before the pre-roll to the first packet past the tail, one more either side (a decoder
that holds a packet back), as one stretch: between two audio packets the demuxer reads through
the video's, where they are short, rather than seek. While the audio is read, the video track
is discarded (``audio_only``) and the demuxer reads none of its packets: after the audio's seek
it would start them at the keyframe before the pre-roll, a GOP before the clip's own keyframe
where one falls inside the pre-roll.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from .audio import PREROLL_S, TAIL_S, windows
from .mp4index import US

__all__ = ["audio_ranges", "audio_only"]


def audio_ranges(packets: np.ndarray, spans: np.ndarray) -> list[tuple[int, int]]:
    """Byte ranges of the file that reading the audio of ``spans`` (``[K, 2]`` seconds on the
    container's timeline, as ``read_audio`` is given them) demuxes from ``packets``
    (``audio_packets``): one stretch per window of spans decoded together."""
    if not len(spans) or not len(packets):
        return []
    times = packets[:, 0]
    out = []
    for group in windows(spans):
        t0 = float(spans[group, 0].min()) - PREROLL_S
        t1 = float(spans[group, 1].max()) + TAIL_S
        # The seek lands on the last packet at or before t0; decoding stops at the first frame
        # at or past t1. One packet more either side for a decoder's delay.
        lo = max(int(np.searchsorted(times, round(t0 * US), side="right")) - 2, 0)
        hi = min(int(np.searchsorted(times, round(t1 * US), side="left")) + 1, len(packets) - 1)
        if lo <= hi:
            out.append((int(packets[lo : hi + 1, 1].min()), int(packets[lo : hi + 1, 2].max())))
    return out


@contextlib.contextmanager
def audio_only(c: Any) -> Iterator[None]:
    """The video streams of an MP4/MOV container discarded while the block runs: the demuxer
    reads no byte of their samples (elsewhere, and with a PyAV without ``Stream.discard``,
    nothing changes)."""
    import av.stream

    discard: Any = getattr(av.stream, "Discard", None)
    others = list(c.streams.video) if discard is not None and c.format.name.split(",")[0] == "mov" else []
    kept = [s.discard for s in others]
    try:
        for s in others:
            s.discard = discard.all
        yield
    finally:
        for s, was in zip(others, kept):
            s.discard = was
