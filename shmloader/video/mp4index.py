"""A long MP4/MOV's timeline from its own sample index instead of a pass over every packet
(``video.probe``; a remote file's at any length: its packets are not all fetched), and where
its audio track's packets lie (what a remote clip's audio bytes are fetched by)."""

from __future__ import annotations

import contextlib
from fractions import Fraction
from typing import Any

import numpy as np

from .media import Media
from .packets import Pass, byte_spans, indexed_end, profile_of, sequence_headers
from .storage import Storage

__all__ = ["from_index", "audio_packets", "INDEXED_MIN_FRAMES", "US"]

# A long video: from this many frames, an MP4/MOV is timed from its own index (``from_index``;
# shorter ones by reading every packet, a few ms), and PyAV reads it: decord's reader reads its
# whole index on every open, which is once per clip (38 ms for 30 000 frames, growing with
# length), where PyAV opens an MP4 in 1-3 ms and seeks by the probe's timeline.
INDEXED_MIN_FRAMES = 1000
# A GOP longer than this (packets) is read by the full pass instead.
_INDEXED_GOP_MAX = 1200
# Ticks a second of the audio packets' times (FFmpeg's AV_TIME_BASE): far finer than the
# margins a clip's audio bytes are fetched with.
US = 1_000_000


def from_index(c, media: Media, touched: list, storage: Storage) -> Pass | None:
    """What ``read_open(c, media, "first")`` finds, from a long MP4/MOV's own sample index instead of a
    pass over every packet (which costs ~3 us a frame: 100 ms for 20 minutes at 25 fps, on
    every open of every file); None where the index cannot show it, and ``_read`` runs.

    The index lists every sample's decode time, position and keyframe flag; presentation times
    it lacks (B-frames). Taken where the decode times run at one constant step from the first
    sample to the last, no frame is cut by an edit list, and the first and last GOPs, demuxed,
    show every frame's presentation time on the grid ``first + i * step``: then, with the frame
    count, the timeline is that grid. A decoder that meets a frame off it anywhere (PyAV checks
    every frame it decodes) probes the file fully (``video.decoders``). Keyframes are found by
    searching the index from the end (one search per keyframe), their sequence headers read by
    position (a size change needs the full read). ``c`` is the open container; ``touched``
    gets True once it has been read from (the full read must then open the file again)."""
    from ._av import INDEX_ENTRIES, fraction

    if not INDEX_ENTRIES or not c.streams.video or c.format.name.split(",")[0] != "mov":
        return None
    s = c.streams.video[0]
    entries = s.index_entries
    n = len(entries)
    remote = media.remote  # a full read would fetch every byte: the index at any length
    if n < (2 if remote else INDEXED_MIN_FRAMES) or n != s.frames or not s.time_base:
        return None
    first_e, last_e = entries[0], entries[n - 1]
    end = indexed_end(s)
    if end is None or end > media.size or first_e.is_discard:
        return None  # cut off, or an edit list: the full read says what is shown
    cc = s.codec_context
    cc.thread_count = 1
    r = Pass()
    r.container, r.codec, r.declared = "mov", cc.codec.canonical_name, n
    r.profile = profile_of(cc)
    r.time_base = fraction(s.time_base) or Fraction(1, 1)
    touched.append(True)
    head = _gop(c, s, r, first=True)
    if head is None or len(head) < 2:
        return None
    step = head[1][1] - head[0][1]
    if step <= 0 or any(b[1] - a[1] != step for a, b in zip(head, head[1:])):
        return None
    if last_e.timestamp - first_e.timestamp != (n - 1) * step:
        return None
    start = min(t for t, _ in head)
    shift = head[0][0] - head[0][1]  # presentation minus decode time of a keyframe
    if sorted(t for t, _ in head) != [start + i * step for i in range(len(head))]:
        return None
    keys, headers = [], None
    # A remote file's keyframes are not fetched for their headers (each would cost a request):
    # a size change there goes unreported, and PyAV scales its frames to the first size.
    with contextlib.nullcontext() if remote else storage.open_bytes(media) as f:
        t = last_e.timestamp
        while True:
            i = entries.search_timestamp(t, backward=True)
            if i < 0:
                break
            e = entries[i]
            pos = (e.timestamp + shift - start) / step
            if pos != int(pos) or not 0 <= pos < n:
                return None
            keys.append(int(pos))
            if f is not None:
                f.seek(e.pos)
                h = sequence_headers(f.read(e.size), r.codec)
                if h and headers is not None and h != headers:
                    return None  # new sequence headers: did the size change? The full read tells.
                headers = h or headers
            if i == 0:
                break
            t = e.timestamp - 1
    if not keys or keys[-1] != 0:
        return None
    c.seek(entries[entries.search_timestamp(last_e.timestamp, backward=True)].timestamp + shift,
           stream=s, backward=True)
    tail = _gop(c, s, r, first=False)
    end = start + (n - 1) * step
    if not tail or max(t for t, _ in tail) != end or \
            sorted(t for t, _ in tail) != [end - i * step for i in range(len(tail))][::-1]:
        return None
    r.kept, r.dropped, r.indexed = n, 0, True
    if remote:
        r.spans = byte_spans([(int(e.pos), int(e.size)) for e in (entries[i] for i in range(n))])
    r.pts = start + np.arange(n, dtype=np.int64) * step
    r.keyframes = np.array(keys[::-1], np.int64)
    r.durations = np.full(n, step, np.int64)
    r.decode_pos = None  # unknown: counted as reordered, and any damage spoils the whole decode
    r.step = float(step * r.time_base)
    r.fps = float(s.average_rate) if s.average_rate else 1.0 / r.step
    return r


def audio_packets(c: Any) -> np.ndarray | None:
    """``[packets, 3]`` int64 (time in microseconds on the container's timeline, first byte,
    end byte) of the first audio stream of the open container ``c`` in decode order, from an
    MP4/MOV's own index; None without an audio stream or such an index (or a PyAV that cannot
    show it)."""
    from ._av import INDEX_ENTRIES

    if not INDEX_ENTRIES or not c.streams.audio or c.format.name.split(",")[0] != "mov":
        return None
    s = c.streams.audio[0]
    entries = s.index_entries
    if not len(entries) or not s.time_base:
        return None
    a = np.array([(e.timestamp, e.pos, e.size) for e in entries], np.int64)
    if (a[:, 1] < 0).any() or (np.diff(a[:, 0]) < 0).any():
        return None  # a place unknown, or times out of order: read as the demuxer asks
    tb = s.time_base
    return np.stack([a[:, 0] * tb.numerator * US // tb.denominator, a[:, 1], a[:, 1] + a[:, 2]], axis=1)


def _gop(c, s, r: Pass, first: bool) -> list[tuple[int, int]] | None:
    """(pts, dts) of the packets from here to the next keyframe (``first``: decoding the first
    frame into ``r.first`` on the way) or to the end; None if any is unstamped or discarded."""
    out: list[tuple[int, int]] = []
    for p in c.demux(s):
        if p.size == 0:
            break
        if p.pts is None or p.dts is None or p.is_discard:
            return None
        if first and p.is_keyframe and out:
            break
        out.append((p.pts, p.dts))
        if first and r.first is None:
            for frame in p.decode():
                r.first = frame
                break
        if len(out) > _INDEXED_GOP_MAX:
            return None
    if first and r.first is None:
        return None
    return out
