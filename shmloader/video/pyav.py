"""PyAV: libavformat + libavcodec, the frames a player shows at any size.

Frames are found by their timestamp in the probe's timeline (so edit lists, MPEG-TS and size
changes come out as a player shows them), seeking to the keyframe before each stretch of wanted
frames and decoding forward with ``threads`` threads; scaled in a libavfilter graph built as
decord builds its own (the same swscale flags: the same pixels wherever decord works), then
turned as the container's rotation asks. A remote file's clip bytes are prefetched by the
probe's byte spans first (NOTE [ Reading remote files ] in ``video.storage``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import replace
from typing import Any, overload

import numpy as np

from .decoders import FrameSink, scratch
from .media import Media
from .packets import index_of
from .probe import SKIPS_NONREF, VideoInfo, probe
from .storage import LOCAL, Storage, first_line

__all__ = ["PyAV", "OffTimeline", "PYAV_SEEKS", "byte_ranges"]

# On a wanted frame missing after a seek (a seek that landed past it, as byte-based seeking in
# MPEG-TS can), seek again this many keyframes further back before decoding from the start.
_SEEK_RETRIES = 3

# Containers in which seeking by the probe's timestamps is shown exact (tests/test_shapes.py,
# tests/test_realworld.py); in others PyAV decodes from the start, counting frames. MPEG program
# streams are not among them: after a seek, FFmpeg stamps the frames there a B-frame delay late.
PYAV_SEEKS = frozenset({"mov", "matroska", "mpegts", "avi", "flv", "asf"})

# Containers a worker's PyAV keeps open, most recent last: opening an MP4 parses its whole index
# (2.7 ms for 30 000 frames), once per clip otherwise. An idle container holds a descriptor and
# its index, and runs nothing (no decoder thread decodes ahead, as decord's reader does).
_OPEN_CONTAINERS = 4

# H.264 and HEVC hold back at most 16 frames for reordering.
_REORDER_MAX = 16

# NOTE [ Decoding less, exactly ]
# A clip is decoded from the keyframe before it; of the frames on the way (and between the wanted
# frames of frame_step > 1, segments, fps=), those no later frame references need not be decoded.
# Every packet whose timestamp is not a wanted frame's goes to the decoder with
# skip_frame = "NONREF" (it drops the frame unless it is a reference), a wanted frame's packet
# with "DEFAULT". Under B-frames decode order is not presentation order: the choice follows the
# packet's own timestamp, never its position. A non-reference frame feeds no other frame, so
# every frame that comes out is the one a full decode gives (bit for bit, tests/test_skipping.py,
# per codec). Not where frames are counted from the start (no timestamps: a dropped frame would
# shift the count), nor for codecs outside SKIPS_NONREF. After a stretch of wanted frames the
# decoder is flushed (no further packet decoded) to let out the frames it holds back.
# The codecs: ``probe.SKIPS_NONREF``.
_SKIP = "NONREF"


class OffTimeline(Exception):
    """A decoded frame's timestamp is not on the timeline a probe read from the container's
    index (``VideoInfo.indexed``): probe the file fully and decode again."""


class _Unordered(Exception):
    """Decoded frames' timestamps go backwards: the file's stamps name packets in decode order
    (AVI stores no presentation times), so they cannot find a frame."""


class PyAV:
    """libavformat + libavcodec through PyAV: the frames a player shows, at any size."""

    name = "pyav"

    def __init__(self, threads: int, storage: Storage = LOCAL, skip_nonref: bool = True) -> None:
        import av

        from ._av import open_input

        self._av, self._open_input = av, open_input
        self._threads = threads
        self._storage = storage
        self.skip_nonref = skip_nonref  # False: decode every frame on the way (a reference to compare with)
        self._scale = _Scaler()
        self._buf: np.ndarray | None = None
        self.frames_out = 0  # frames the decoder put out, wanted or passed on the way
        self._open: OrderedDict[str, tuple[tuple[int, int], Any]] = OrderedDict()  # path -> (stamp, container)

    def _container(self, media: Media):
        """An open container of the file kept from an earlier clip while the file is unchanged
        (the stamp it was resolved with), else a new one (kept, the least recent closed beyond
        ``_OPEN_CONTAINERS``)."""
        path, stamp = media.path, media.stamp
        hit = self._open.pop(path, None)
        if hit is not None and hit[0] == stamp:
            self._open[path] = hit
            return hit[1]
        if hit is not None:
            hit[1].close()
        c = self._open_file(media)
        self._open[path] = (stamp, c)
        while len(self._open) > _OPEN_CONTAINERS:
            self._open.popitem(last=False)[1][1].close()
        return c

    def _open_file(self, media: Media):
        c = self._open_input(self._storage.media(media))
        c.streams.video[0].codec_context.thread_count = self._threads
        return c

    def _media(self, info: VideoInfo) -> Media:
        """The file's handle, as its probe resolved it (resolved here for an info made by hand)."""
        return info.media if info.media is not None else self._storage.resolve(info.path)

    def _forget(self, path: str) -> None:
        hit = self._open.pop(path, None)
        if hit is not None:
            hit[1].close()

    forget = _forget

    def container(self, info: VideoInfo) -> Any:
        """The file's open container, kept for the next clip (the audio of a clip is read
        through the one its frames came from)."""
        return self._container(self._media(info))

    def video_start(self, info: VideoInfo) -> float:
        """Seconds the video stream starts at on the container's timeline."""
        s = self.container(info).streams.video[0]
        return 0.0 if s.start_time is None else float(s.start_time * s.time_base)

    @overload
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray: ...
    @overload
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: FrameSink) -> FrameSink: ...
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | FrameSink | None = None) -> np.ndarray | FrameSink:
        h, w = size if size is not None else (info.height, info.width)
        turns = info.rotation // 90
        shape = (len(frames), h, w, 3)
        dest = out if out is not None and out.shape == shape else scratch(self, shape)
        # Scaled before turning: a 90-degree turn swaps the sides the scaler must produce.
        sh, sw = (w, h) if turns % 2 else (h, w)
        if info.container and info.container not in PYAV_SEEKS:
            info = _by_count(info)
        if info.spans is not None:
            self._storage.prefetch(self._media(info), byte_ranges(info, frames))  # cached already from a task's prefetch
        try:
            try:
                return self._decode(info, frames, dest, sw, sh, turns)
            except _Unordered:
                return self._decode(_by_count(info), frames, dest, sw, sh, turns)
        except ValueError as e:
            cut = _truncation(self._media(info), self._storage)
            if cut is None:
                raise
            raise ValueError(f"the file ends at frame {cut[0]} of the {cut[1]} its index lists (truncated?); "
                             f"{first_line(e, 160)}") from e

    def _decode(self, info: VideoInfo, frames: np.ndarray, dest: np.ndarray | FrameSink, sw: int, sh: int,
                turns: int) -> np.ndarray | FrameSink:
        got, damaged = np.zeros(len(frames), bool), []
        # Seeking by timestamps, a container is kept open for the next clip: opening parses the
        # whole index (2.7 ms for a 30 000-frame MP4). Counting from the start needs a fresh one.
        keep = info.pts is not None
        media = self._media(info)
        c = self._container(media) if keep else self._open_file(media)
        s = c.streams.video[0]
        whole = False  # the pass ended as it meant to: a kept container is left where it can seek on
        try:
            for j, i, frame in self._frames(c, s, info, frames):
                self.frames_out += 1
                if frame.is_corrupt:
                    damaged.append(i)
                if j is not None:
                    img = self._scale(frame, sw, sh)
                    dest[j] = np.rot90(img, turns) if turns else img
                    got[j] = True
            whole = True
        except self._av.error.FFmpegError as e:
            if not got.all():  # else the data breaks off after the last wanted frame
                raise ValueError(f"damaged or cut-off data before frame {int(frames[~got][0])}: {e}") from e
        finally:
            if not keep:
                c.close()
            elif not whole:
                self._forget(info.path)  # its demuxer and decoder may be left anywhere
        if not got.all():
            raise ValueError(f"frames {frames[~got].tolist()[:4]} of {info.frames} cannot be decoded: "
                             f"the stream ends at frame {int(frames[~got][0])} (damaged or truncated?)")
        spoiled = _spoiled(info, frames, damaged)
        if spoiled is not None:
            raise ValueError(f"frame {spoiled} is damaged, or decoded from a damaged frame "
                             f"(the decoder marked frame {min(damaged)} damaged)")
        return dest

    def _frames(self, c, s, info: VideoInfo, frames: np.ndarray):
        """``(j, i, frame)`` for every shown frame decoded on the way to ``frames``: ``i`` its
        index in the video, ``j`` its place in ``frames`` or None for a frame passed on the way.
        After each stretch of wanted frames the frames the decoder holds back come out (counting
        from the start, ``_drain`` more are decoded; by timestamps, the decoder is flushed and
        decodes nothing more), so that every frame decoded before a wanted one has shown whether
        it is damaged: a B-frame comes out before the frame it was decoded after."""
        if info.pts is None:  # no timestamps to seek by: count frames from the start
            j, left = 0, None
            for i, frame in enumerate(_decoded(c, s)):
                hit = j < len(frames) and i == frames[j]
                yield (j if hit else None), i, frame
                j += hit
                if j == len(frames):
                    left = _drain(s) if left is None else left - 1
                    if left <= 0:
                        return
            return
        pts = info.pts
        # NOTE [ Decoding less, exactly ]: the frames wanted, by timestamp; every other packet is
        # sent with skip_frame="NONREF".
        wanted = set(pts[frames].tolist()) if self.skip_nonref and skips_nonref(info, s) else None
        keys = info.keyframes if info.keyframes is not None and len(info.keyframes) else np.zeros(1, np.int64)

        def keyframe_before(i: int) -> int:  # -1: none shown before i (an edit list cut one off)
            return int(keys[np.searchsorted(keys, i, side="right") - 1]) if keys[0] <= i else -1

        j, back = 0, 0  # next wanted; keyframes further back than needed, after a missed frame
        while j < len(frames):
            target = int(frames[j])
            k = int(np.searchsorted(keys, target, side="right")) - 1 - back
            from_start = k < 0 or keyframe_before(target) < 0 or back > _SEEK_RETRIES
            if from_start:
                # Below the first timestamp: seeking to the first one itself can land a GOP
                # late where seeking is byte-based (MPEG-TS).
                c.seek(min(0, int(pts[0]) - 1), stream=s, backward=True)
            else:
                c.seek(int(pts[keys[k]]), stream=s, backward=True)
            s.codec_context.flush_buffers()
            missed, first, last = False, True, None
            flush = [False]  # set at a stretch's end: _decoded flushes the decoder instead of decoding on
            for frame in _decoded(c, s, wanted, flush):
                if frame.pts is not None:
                    if last is not None and frame.pts <= last:
                        raise _Unordered
                    last = frame.pts
                found = index_of(pts, frame.pts)
                if found is None:
                    if info.indexed and frame.pts is not None:
                        raise OffTimeline(f"{info.path!r}: a frame at {frame.pts} is off the index's timeline")
                    continue  # not a shown frame
                i = found
                if flush[0]:  # held back for reordering, let out after the stretch
                    yield None, i, frame
                    continue
                if (first and i > target) or i > frames[j]:
                    missed = True  # the seek landed past the frame, or the frame never came out
                    break
                first = False
                if i < frames[j]:
                    yield None, i, frame
                    continue
                yield j, i, frame
                j, back = j + 1, 0
                if j == len(frames) or keyframe_before(int(frames[j])) > i + 1:
                    flush[0] = True  # then seek to the keyframe before the next wanted frame
            else:
                if flush[0] or not first or from_start:
                    if j == len(frames) or not flush[0]:
                        return  # the stream ended: the caller reports what is missing
                    continue
                missed = True  # a seek past the last keyframe found nothing
            if missed:
                if from_start:
                    return
                back += 1


def _by_count(info: VideoInfo) -> VideoInfo:
    """``info`` without timestamps to seek by: PyAV counts frames from the start."""
    return replace(info, pts=None, keyframes=None, decode_pos=None)


def byte_ranges(info: VideoInfo, frames: np.ndarray) -> list[tuple[int, int]]:
    """The bytes a decode of ``frames`` reads: from the packet of the keyframe before each
    wanted frame to the wanted frame's packet, ``_REORDER_MAX`` packets of reordering either
    side where the decode order of frames is not known (a timeline read from the index)."""
    spans = info.spans
    assert spans is not None, "byte spans are probed for remote files only"
    n = len(spans)
    keys = info.keyframes if info.keyframes is not None and len(info.keyframes) else np.zeros(1, np.int64)
    at = np.clip(np.searchsorted(keys, frames, side="right") - 1, 0, None)
    first = np.minimum(keys[at], frames)
    if info.decode_pos is not None and len(info.decode_pos) == n:
        lo, hi = info.decode_pos[first], info.decode_pos[frames] + _REORDER_MAX
    else:
        lo, hi = first - _REORDER_MAX, frames + _REORDER_MAX
    lo, hi = np.clip(lo, 0, n - 1), np.clip(hi, 0, n - 1)
    out: list[list[int]] = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        if not out or a > out[-1][1]:
            out.append([a, b])
        else:
            out[-1][1] = max(out[-1][1], b)
    return [(int(spans[a:b + 1, 0].min()), int(spans[a:b + 1, 1].max())) for a, b in out]


def _truncation(media: Media, storage: Storage = LOCAL) -> tuple[int, int] | None:
    """(whole frames, frames the index lists) when the file is cut off before its index's end."""
    try:
        info = probe(media, storage=storage)
    except Exception:
        return None
    m = re.search(r"truncated at frame (\d+) of (\d+)", info.problem)
    return (int(m[1]), int(m[2])) if m else None


def _decoded(c, s, wanted: set | None = None, flush: list[bool] | None = None):
    """``c.decode(s)``, except that a packet the decoder rejects (damaged, or cut off at the end
    of a truncated file) first lets out the frames already decoded and held back for
    reordering: they were decoded from earlier, whole packets. ``wanted``: the timestamps of
    the frames wanted; every other packet is sent with ``skip_frame = "NONREF"``. Once
    ``flush[0]`` is set, no packet more: the frames held back come out, and the decoder is at
    its end (``flush_buffers`` before it decodes again)."""
    import av

    cc, skipping = s.codec_context, False
    cc.skip_frame = "DEFAULT"
    try:
        for p in c.demux(s):
            if flush is not None and flush[0]:
                yield from cc.decode(None)
                return
            if wanted is not None and skipping != (p.pts is not None and p.pts not in wanted):
                skipping = not skipping
                cc.skip_frame = _SKIP if skipping else "DEFAULT"
            yield from p.decode()
    except av.error.FFmpegError:
        try:
            yield from cc.decode(None)
        except av.error.FFmpegError:
            pass
        raise
    finally:
        cc.skip_frame = "DEFAULT"


def skips_nonref(info: VideoInfo, s) -> bool:
    """Whether packets of frames not wanted may be sent with ``skip_frame = "NONREF"``: a codec
    of ``SKIPS_NONREF``; HEVC only where its configuration record (hvcC) says one temporal
    layer (a sub-layer non-reference picture may be referenced by a higher layer's)."""
    if info.codec not in SKIPS_NONREF:
        return False
    if info.codec != "hevc":
        return True
    extra = s.codec_context.extradata or b""
    return len(extra) > 22 and extra[0] == 1 and (extra[21] >> 3) & 7 == 1


def _drain(stream) -> int:
    """Frames to take after the last wanted one of a stretch: the decoder's reorder delay."""
    return min(int(stream.codec_context.has_b_frames or 0) + 1, _REORDER_MAX)


def _spoiled(info: VideoInfo, frames: np.ndarray, damaged: list[int]) -> int | None:
    """The first of ``frames`` decoded after a damaged frame with no keyframe between them
    (decode order), or None. Without decode positions, any damage spoils every frame."""
    if not damaged:
        return None
    if info.decode_pos is None or info.keyframes is None:
        return int(frames[0])
    dpos = info.decode_pos
    keys = np.sort(dpos[info.keyframes]) if len(info.keyframes) else np.zeros(0, np.int64)
    for d_bad in sorted({int(dpos[i]) for i in damaged}):
        nxt = keys[np.searchsorted(keys, d_bad, side="right")] if keys.size and keys[-1] > d_bad else np.inf
        hit = frames[(dpos[frames] >= d_bad) & (dpos[frames] < nxt)]
        if hit.size:
            return int(hit[0])
    return None


class _Scaler:
    """``scale=W:H,format=rgb24`` in a libavfilter graph, as decord builds it: the same swscale
    flags and steps, so PyAV's pixels equal decord's wherever decord can decode. Rebuilt when
    the input frame's size or format changes (a stream that changes size mid-way).

    Not ``VideoFrame.reformat`` with the same flags: from av 17 it scales through
    ``sws_scale_frame``, which sites the chroma where the frame says (left, for H.264) while the
    graph and decord centre it, so a scaled frame differs by up to 9 grey levels; it costs the
    same (the bicubic resize is the cost, not the graph). Cheaper filters and OpenCV change the
    pixels more (``bench/convert.py``, ``bench/results/convert-cpu2.md``)."""

    def __init__(self, options: str = "") -> None:
        self._options = f":{options}" if options else ""  # more scale-filter options (bench/convert.py's variants)
        self._key: tuple | None = None
        self._graph: Any = None  # av.filter.Graph

    def __call__(self, frame, width: int, height: int) -> np.ndarray:
        key = (frame.width, frame.height, frame.format.name, width, height)
        if key != self._key:
            from fractions import Fraction

            from ._av import filter_graph

            g = filter_graph()
            chain = [g.add_buffer(width=frame.width, height=frame.height, format=frame.format,
                                  time_base=Fraction(1, 1000)),
                     g.add("scale", f"{width}:{height}{self._options}"), g.add("format", "rgb24"), g.add("buffersink")]
            for a, b in zip(chain, chain[1:]):
                a.link_to(b)
            g.configure()
            self._graph, self._key = g, key
        frame.pts = None
        self._graph.push(frame)
        return self._graph.pull().to_ndarray()
