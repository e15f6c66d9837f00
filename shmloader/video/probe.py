"""What a video file holds, as libavformat presents it: the one frame truth both decoders follow.

``probe(path)`` reads the file's packets once (no decoding, a few ms for a 300-frame video)
plus its first frame, and returns a :class:`VideoInfo`: the frames a player shows (an edit list
that drops frames is honoured, as libavformat's ``discard`` flag says), their timestamps as
stored, the size as shown (after the rotation the container asks for), and which decoder reads
the file right.

NOTE [ Which decoder reads a file ]
decord reads a file only where its random access has been shown exact for that kind of file:
a (container, codec) shape in ``DECORD_SHAPES``, each backed by a test that seeks into a file
of that shape (tests/test_shapes.py), B-frame reordering included only where the entry says
so. Every other file goes to PyAV (libavformat + libavcodec, the same code as ``ffmpeg -i``,
seeking by the timestamps read here): a shape nobody tested is never trusted. Measured with
decord2 3.4.0: AVI with B-frames or H.264, MPEG program streams (``.mpg``/``.vob``), MPEG-4
Part 2 or HEVC with B-frames in MP4/MKV, and WMV seek a GOP early or late. Inside the shapes,
PyAV still reads what decord counts or turns wrong:

- an edit list that drops frames (``ffmpeg -ss T -c copy`` cuts): decord counts and returns
  the dropped frames, freezing the last ones;
- a size change inside the stream (joined segments, live recordings);
- a rotation tag: decord cannot copy turned frames out at their own size;
- a container frame count that disagrees with the stream (a truncated download among them);
- damage (``check="keyframes"`` or ``"frames"``);
- ``_LONG`` frames or more: decord reads its whole index for every clip.

``check="keyframes"`` and ``"frames"`` also gather evidence per file: a few seeded positions
decoded by decord as the loader seeks (a fresh reader each) are compared with PyAV's decode by
timestamps; a mismatch sends the file to PyAV (``decord seeks wrong at frame N (read by PyAV)``).

A size change is found cheaply: the sequence headers (H.264/HEVC SPS, MPEG-4 VOL, MPEG-1/2
sequence header) carried in keyframe packets are compared, and only when they change are the
keyframes decoded to see whether the size did. ``check="keyframes"`` decodes every keyframe
(any codec), ``check="frames"`` every frame (damaged frames, the exact count): what
``shmloader scan`` runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from .storage import LOCAL, Storage, first_line, is_remote

__all__ = ["VideoInfo", "probe", "index_of", "DECODERS", "CHECKS", "DECORD_SHAPES"]

DECODERS = ("decord", "pyav")
CHECKS = ("headers", "keyframes", "frames")

# (container, codec) -> reordered frames allowed: the shapes whose random access through decord
# has been shown exact, each by a test that seeks into a file of that shape (tests/test_shapes.py).
# Container: libavformat's first format name ("mov" is MP4/MOV/M4V/3GP, "matroska" MKV/WebM);
# codec: the codec's own name. False: exact only without B-frame reordering (decode order =
# presentation order); with it, decord's seek lands a GOP early or late in these.
DECORD_SHAPES: dict[tuple[str, str], bool] = {
    ("mov", "h264"): True, ("matroska", "h264"): True, ("flv", "h264"): True,
    ("mov", "hevc"): False, ("matroska", "hevc"): False,
    ("mov", "mpeg4"): False, ("matroska", "mpeg4"): False, ("avi", "mpeg4"): False,
    ("mov", "av1"): True, ("matroska", "av1"): True,
    ("matroska", "vp8"): True, ("matroska", "vp9"): True, ("mov", "vp9"): True,
    ("mov", "mjpeg"): True, ("avi", "mjpeg"): True, ("mov", "prores"): True,
    ("mov", "h263"): False, ("flv", "flv1"): False,
}


# A long video: from this many frames, an MP4/MOV is timed from its own index (``_from_index``;
# shorter ones by reading every packet, a few ms), and PyAV reads it: decord's reader reads its
# whole index on every open, which is once per clip (38 ms for 30 000 frames, growing with
# length), where PyAV opens an MP4 in 1-3 ms and seeks by the probe's timeline.
_INDEXED_MIN_FRAMES = _LONG = 1000
# A GOP longer than this (packets) is read by the full pass instead.
_INDEXED_GOP_MAX = 1200

# The random-access evidence (``check="keyframes"`` and ``"frames"``): keyframes it seeks around,
# and how far decord's frame may be from PyAV's (grey levels; both convert with swscale at the
# native size, measured within 1 on average): a wrong frame differs by far more in some region.
_SEEK_KEYFRAMES = 3
_SEEK_ONE_KEYFRAME = 12
_SEEK_MEAN = 3.0
_SEEK_P99 = 32.0

# Frames a probe decodes, where the decoder reorders, to see that decoded stamps follow
# presentation order (B-frames start in the first GOP).
_ORDER_FRAMES = 8

# Raw elementary streams (Annex B H.264/HEVC, MPEG-2 video): FFmpeg's parser keeps every byte it
# reads until it finds where the next frame starts, so a file that holds no start code (zeros,
# other data under a raw name) grows the probe's memory with the file (~160 MB/s, for as long as
# the file lasts). A probe reads them through _RawStream, which reads no further than this past
# the last packet out: far more than the largest frame.
_RAW_EXTENSIONS = (".h264", ".264", ".h265", ".hevc", ".265", ".m2v")
_RAW_GAP = 64 << 20

# The problem of a file whose stamps name packets in decode order (AVI with B-frames): its frames
# are counted, not sought by time, and shown at the stream's constant rate.
UNORDERED = "timestamps in decode order"

# Timestamps further apart than this many times the median step are a gap, not jitter.
_GAP = 1.5
# Steps within this share of the median count as one constant frame rate.
_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """One video as a player shows it. ``pts`` (stream time base, presentation order, one per
    frame) and ``keyframes`` (indices) are None when the info came from a manifest row."""

    path: str
    frames: int
    height: int  # as shown, after rotation
    width: int
    fps: float
    duration: float
    codec: str
    pix_fmt: str
    rotation: int  # degrees the frames are turned counter-clockwise for display: 0, 90, 180, 270
    container: str
    decoder: str  # "decord" or "pyav"
    problem: str = ""
    time_base: Fraction = Fraction(1, 1)
    pts: np.ndarray | None = field(default=None, repr=False, compare=False)
    keyframes: np.ndarray | None = field(default=None, repr=False, compare=False)
    durations: np.ndarray | None = field(default=None, repr=False, compare=False)
    # Position in decode order of every frame (presentation order): what a damaged frame can spoil.
    decode_pos: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The timeline was read from the container's index, checked at both ends (see _from_index):
    # a decoded frame off it sends the decoder back to a full probe.
    indexed: bool = field(default=False, repr=False, compare=False)
    # Remote files only: [packets, 2] byte (start, end) of every packet in decode order, what a
    # clip's bytes are fetched by before it is decoded (NOTE [ Reading remote files ]).
    spans: np.ndarray | None = field(default=None, repr=False, compare=False)

    def times(self) -> np.ndarray | None:
        """``[frames, 2]`` (start, end) seconds of every frame, or None without timestamps.

        Without ``pts`` (a manifest row, or an AVI whose stamps name packets in decode order), a
        constant-rate video (no ``problem`` but ``UNORDERED``) is timed by ``fps`` from 0, as a
        player shows it: sampling by time needs only the differences."""
        if self.pts is None or self.durations is None:
            if self.pts is None and self.problem in ("", UNORDERED) and self.fps > 0:
                begin = np.arange(self.frames + 1, dtype=np.float64) / self.fps
                return np.stack([begin[:-1], begin[1:]], axis=1)
            return None
        begin = self.pts.astype(np.float64) * float(self.time_base)
        end = np.empty_like(begin)
        end[:-1] = begin[1:]
        end[-1] = begin[-1] + float(self.durations[-1]) * float(self.time_base)
        return np.stack([begin, end], axis=1)

    def with_decoder(self, decoder: str, why: str = "") -> "VideoInfo":
        return replace(self, decoder=decoder, problem="; ".join(p for p in (self.problem, why) if p))


def probe(path: str, *, check: str = "headers", index: bool = True, storage: Storage | None = None) -> VideoInfo:
    """The frames of ``path`` as libavformat presents them, and the decoder that reads them right.

    ``index``: with ``check="headers"``, a long MP4/MOV's timeline comes from its own index
    (``_from_index``: a few GOPs read, not every packet) where that index shows a constant rate.

    ``storage``: how remote paths (fsspec URLs, tar members) are read; a remote file's timeline
    comes from its index at any length (its packets are not all fetched) and PyAV reads it.

    Raises FileNotFoundError, ValueError (no video stream, no frames) or PyAV's error for a file
    FFmpeg cannot open.
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    storage = storage or LOCAL
    if not is_remote(path) and not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path!r}" if not os.path.exists(path) else f"not a file: {path!r}")
    r = _read(path, "first" if check == "headers" else check, index=index, storage=storage)
    if check == "headers" and r.header_change:  # new sequence headers: did the size change?
        k = _read(path, "keyframes", storage=storage)
        r.sizes, r.damaged = k.sizes, r.damaged if r.damaged is not None else k.damaged
    first = r.first
    if first is None:
        raise ValueError("no frame of the video stream can be decoded")
    rotation = int(round(first.rotation / 90.0)) * 90 % 360
    fh, fw = first.height, first.width
    shown_h, shown_w = (fw, fh) if rotation in (90, 270) else (fh, fw)
    pts, kept, tb = r.pts, r.kept, r.time_base
    step = r.step
    duration = kept * step if pts is None else float((pts[-1] - pts[0]) * tb) + step
    problems, pyav = [], []
    # B-frames: stored out of presentation order, or a decoder that holds frames back to
    # reorder them (AVI stores no presentation times: there only the decoder tells).
    reorder = r.delay or r.decode_pos is None or bool((np.diff(r.decode_pos) < 0).any())
    shape = DECORD_SHAPES.get((r.container, r.codec))
    if shape is None or (reorder and not shape):
        pyav.append("shape")  # decord's seeking is unproven for this kind of file
    if kept >= _LONG:
        pyav.append("long")
    if is_remote(path):
        pyav.append("remote")  # decord reads whole files only
    if r.truncated:
        problems.append(f"truncated at frame {kept} of {r.declared}")
        pyav.append("truncated")
    if r.dropped and r.container != "mpegts":
        # The demuxer leaves out the stored frames not needed to decode the shown ones, and
        # flags the rest: the container's own count tells how many the cut dropped.
        problems.append(f"edit list drops {max(r.dropped, r.declared - kept)} frames")
        pyav.append("edit list")
    if len(r.sizes) > 1:
        i, h, w = r.sizes[1]
        problems.append(f"size change at frame {i} ({r.sizes[0][1]}x{r.sizes[0][2]} to {h}x{w})")
        pyav.append("size change")
    if rotation:
        pyav.append("rotation")
    if r.declared and r.declared != kept + r.dropped and not problems:
        problems.append(f"container says {r.declared} frames, stream has {kept}")
        pyav.append("frame count")
    if r.damaged is not None:
        problems.append(f"damaged at frame {r.damaged}")
        pyav.append("damage")  # PyAV marks damaged frames; decord may hand back a neighbour
    elif r.decoded is not None and r.decoded < kept:
        problems.append(f"damaged at frame {r.decoded}: {kept} frames stored, {r.decoded} decode")
    if r.unordered:
        problems.append(UNORDERED)
        if pts is not None:  # one packet every step: the frames are shown at the stream's rate
            problems.extend(_rate_problems(pts, tb, step))
        pts = None  # they name packets, not instants: PyAV counts frames instead
    if pts is None:
        if not r.unordered:
            problems.append("no usable timestamps")
    else:
        problems.extend(_rate_problems(pts, tb, step))
    info = VideoInfo(path=path, frames=kept, height=shown_h, width=shown_w, fps=r.fps, duration=duration,
                     codec=r.codec, pix_fmt=first.format.name, rotation=rotation, container=r.container,
                     decoder="pyav" if pyav else "decord", problem="; ".join(problems), time_base=tb,
                     pts=pts, keyframes=None if pts is None else r.keyframes,
                     durations=None if pts is None else r.durations,
                     decode_pos=None if pts is None else r.decode_pos, indexed=r.indexed,
                     spans=r.spans if is_remote(path) else None)
    if check != "headers" and not pyav:
        return _check_seeks(info)
    return info


def _seek_positions(info: VideoInfo) -> np.ndarray:
    """The frames the random-access evidence compares, seeded by the frame count (a scan
    repeats): the keyframe and the frame after it at a few keyframes past the first (where a
    seek that lands a GOP early or late shows, at the cost of decoding a frame or two); in a
    file with one keyframe, where nothing is seeked, a frame past the decoder's reorder delay."""
    n = info.frames
    keys = info.keyframes[info.keyframes > 0] if info.keyframes is not None else np.zeros(0, np.int64)
    if not len(keys):
        return np.array([min(n - 1, _SEEK_ONE_KEYFRAME)], np.int64)
    chosen = np.random.default_rng(n).choice(keys, min(_SEEK_KEYFRAMES, len(keys)), replace=False)
    return np.unique(np.minimum(np.concatenate([chosen, chosen + 1]), n - 1))


def _check_seeks(info: VideoInfo) -> VideoInfo:
    """``info`` sent to PyAV when decord, opening the file afresh and seeking as the loader
    does, gives other frames than PyAV's decode by timestamps at ``_seek_positions``."""
    from .decoders import Decord, DecoderLimit, PyAV

    frames = _seek_positions(info)
    try:
        want = PyAV(1).decode(info, None, frames)
    except Exception:
        return info  # damage (reported by the probe) or worse: no reference to compare with
    decord = Decord(1)
    for i, ref in zip(frames, want):
        try:
            got = decord.decode(info, None, np.array([i]))[0]
        except DecoderLimit:
            return info  # decord cannot copy this width out here: the loader uses PyAV anyway
        except decord.Error as e:
            return info.with_decoder("pyav", f"decord refuses it: {first_line(e, 160)}")
        diff = np.abs(got.astype(np.int16) - ref) if got.shape == ref.shape else None
        if diff is None or diff.mean() > _SEEK_MEAN or np.percentile(diff, 99) > _SEEK_P99:
            return info.with_decoder("pyav", f"decord seeks wrong at frame {int(i)} (read by PyAV)")
    return info


class _Pass:
    """What one read of a file found (see ``_read``)."""

    container: str
    codec: str
    declared: int  # the frame count the container declares (0: none)
    time_base: Fraction
    dropped: int  # frames an edit list drops
    kept: int
    pts: np.ndarray | None  # presentation timestamps in display order; None: no usable ones
    durations: np.ndarray | None
    decode_pos: np.ndarray | None
    keyframes: np.ndarray | None
    step: float
    fps: float
    first: Any = None  # the first decoded frame (av.VideoFrame)
    damaged: int | None = None
    # The timestamp of the first damaged packet or frame: ``damaged`` becomes its frame index
    # once the timeline is known (frames come out a reorder delay after their packets go in).
    damaged_at: int | None = None
    decoded: int | None = None
    header_change = False
    truncated = False
    unordered = False
    indexed = False
    delay = False
    spans: np.ndarray | None = None

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int, int]] = []  # (frame index, height, width) at each size


def _read(path: str, decode: str, index: bool = False, storage: Storage = LOCAL) -> _Pass:
    """Demux every packet of the first video stream once, decoding as ``decode`` says:
    ``"first"`` until the first frame, ``"keyframes"`` keyframes only, ``"frames"`` all.
    ``index``: a "first" read of a long MP4/MOV is taken from its index (``_from_index``)."""
    import av

    from ._av import fraction, open_input

    raw = _RawStream(path) if not is_remote(path) and path.lower().endswith(_RAW_EXTENSIONS) else None
    if raw is not None:
        with raw, open_input(raw) as c:
            return _read_open(c, path, decode, storage, raw)
    if index and decode == "first":
        touched: list = []
        with open_input(storage.media(path)) as c:
            fast = _from_index(c, path, touched, storage)
            if fast is not None:
                return fast
            if not touched:  # nothing read yet: the full read goes on with this container
                return _read_open(c, path, decode, storage)
    with open_input(storage.media(path)) as c:
        return _read_open(c, path, decode, storage)


class NoFrameBoundary(ValueError):
    """A raw stream's parser read ``_RAW_GAP`` bytes without finding where a frame starts."""


class _RawStream(io.RawIOBase):
    """A local raw stream as FFmpeg reads it (its ``name`` the path: the demuxer is chosen as
    for the path itself), refusing to read ``_RAW_GAP`` bytes past ``mark`` (the probe moves
    it on at every packet out)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._f = open(path, "rb")  # noqa: SIM115 (closed with the stream)
        self.name = path
        self.mark = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b) -> int:
        at = self._f.tell()
        if at - self.mark > _RAW_GAP:
            raise NoFrameBoundary(f"no frame starts in {_RAW_GAP >> 20} MiB of the raw stream from byte "
                                  f"{self.mark} (not a raw video stream?)")
        return self._f.readinto(b)

    def close(self) -> None:
        self._f.close()
        super().close()


def _read_open(c, path: str, decode: str, storage: Storage = LOCAL, raw: _RawStream | None = None) -> _Pass:
    """``_read`` in the open container ``c`` (read through ``raw`` for a raw stream)."""
    import av

    from ._av import fraction, open_input

    r = _Pass()
    if not c.streams.video:
        raise ValueError("no video stream")
    s = c.streams.video[0]
    cc = s.codec_context
    cc.thread_count = 1
    # "keyframes" decodes every frame until the first one shown, keyframes only from there: a
    # keyframe before an edit list's start is decoded but never shown, and in a file with one
    # keyframe (a stream-copied cut of a short clip) no frame would come out at all.
    r.container = c.format.name.split(",")[0]
    r.codec = cc.codec.canonical_name
    r.declared = int(s.frames or 0)
    r.time_base = fraction(s.time_base) or Fraction(1, 1)
    end = _indexed_end(s)
    size = storage.size(path)
    stamps: list[int | None] = []  # per packet in decode order; None: unstamped
    durations: list[int] = []
    key_stamps: list[int] = []
    frame_stamps: list[tuple[int, int | None, int, int]] = []  # (n, pts, height, width) per frame out
    dts: list[int | None] = []
    spans: list[tuple[int, int]] = []
    headers: bytes | None = None
    r.dropped, kept, n, broke = 0, 0, 0, False

    def take(p) -> bool:
        """Decode packet ``p`` (None: flush) as ``decode`` says; False once done."""
        nonlocal n
        try:
            for frame in (p.decode() if p is not None else cc.decode(None)):
                if r.first is None:
                    r.first = frame
                    if decode == "keyframes":
                        cc.skip_frame = "NONKEY"
                if frame.is_corrupt and r.damaged is None and decode != "first":
                    r.damaged, r.damaged_at = n, frame.pts
                if decode != "first" and frame.pts is not None and frame_stamps and \
                        frame_stamps[-1][1] is not None and frame.pts <= frame_stamps[-1][1]:
                    r.unordered = True  # frames come out in presentation order, their stamps do not
                frame_stamps.append((n, frame.pts, frame.height, frame.width))
                n += 1
                if decode == "first":
                    return False
        except av.error.FFmpegError:  # a damaged packet: note it, read on
            if r.damaged is None and decode != "first":
                r.damaged = n if decode == "frames" else kept - 1
                r.damaged_at = None if p is None else p.pts
        return True

    try:
        for p in c.demux(s):
            if raw is not None:
                raw.mark = raw.tell()
            if p.size == 0:
                continue  # the end: flushed below, also when the container breaks off
            if p.is_discard:  # before an edit list's start: a reference, never shown
                r.dropped += 1
                whole = True
            else:
                whole = p.pos is None or p.pos < 0 or p.pos + p.size <= size
                t = p.pts if p.pts is not None else p.dts
                stamps.append(t)
                durations.append(p.duration or 0)
                dts.append(p.dts if whole else None)
                spans.append((p.pos if p.pos is not None and p.pos >= 0 else -1, p.size))
                kept += 1
                if p.is_corrupt and r.damaged is None:
                    r.damaged, r.damaged_at = kept - 1, t
                if p.is_keyframe:
                    key_stamps.append(t)
                    h = _sequence_headers(bytes(p), r.codec)
                    if h:
                        if headers is None:
                            headers = h
                        elif h != headers:
                            r.header_change = True
            if decode == "first" and r.first is not None:
                continue
            take(p)
    except (av.error.FFmpegError, NoFrameBoundary):  # the container itself breaks off
        broke = True
    r.delay = bool(cc.has_b_frames)
    if decode != "first" or r.first is None:
        take(None)  # frames held back for reordering: a one-keyframe file gives its only one here
    if decode != "frames" and not r.unordered:  # "frames" saw every decoded stamp above
        r.unordered = _stamps_in_decode_order(path, stamps, r.delay, storage)
    if end is not None and end > size:
        # The container's index points past the end of the file: a cut download. The frames
        # shown up to the last whole packet's dts are whole (a later frame is stored later).
        last = max((d for d in dts if d is not None), default=None)
        keep = [i for i, t in enumerate(stamps) if last is not None and t is not None and t <= last
                and dts[i] is not None]
        stamps, durations = [stamps[i] for i in keep], [durations[i] for i in keep]
        key_stamps = [t for t in key_stamps if last is not None and t is not None and t <= last]
        kept, r.truncated = len(keep), True
        r.damaged = None if r.damaged is None or r.damaged >= kept else r.damaged
        if decode == "frames":
            n = min(n, kept)
    if broke and not r.truncated and r.damaged is None:
        r.damaged = kept
    if kept == 0:
        raise ValueError("the video stream holds no frames" + (" (the file is cut off before its first frame)"
                                                               if r.truncated else ""))
    r.kept = kept
    r.spans = _spans(spans) if is_remote(path) else None
    r.pts, order = _timeline(stamps)
    at = index_of(r.pts, r.damaged_at) if r.damaged is not None else None
    if at is not None:
        r.damaged = at
    r.durations = None if order is None else np.asarray(durations, np.int64)[order]
    r.decode_pos = order
    r.keyframes = None if r.pts is None else np.unique(np.searchsorted(r.pts, key_stamps))
    r.step = _median_step(r.pts, r.time_base, s)
    r.fps = float(s.average_rate) if s.average_rate else (1.0 / r.step if r.step > 0 else 0.0)
    if decode != "first":
        r.decoded = n if decode == "frames" else None
        for i, t, height, width in frame_stamps:
            j = i if decode == "frames" else index_of(r.pts, t)
            if j is not None and j >= kept:
                continue
            if not r.sizes or r.sizes[-1][1:] != (height, width):
                r.sizes.append((-1 if j is None else j, height, width))
    return r


def _stamps_in_decode_order(path: str, stamps: list, delay: bool, storage: Storage = LOCAL) -> bool:
    """Whether the stamps of a file whose decoder reorders frames (``delay``) name packets in
    decode order, not instants: stored in decode order (never going back over the first
    ``_ORDER_FRAMES`` packets) while the first frames the decoder puts out, in presentation
    order, carry stamps that go back. AVI stores no presentation times: there it is so."""
    head = [t for t in stamps[: _ORDER_FRAMES + 16] if t is not None]
    if not delay or len(head) < 3 or any(b <= a for a, b in zip(head, head[1:])):
        return False
    import av

    from ._av import fraction, open_input

    out: list[int] = []
    with open_input(storage.media(path)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        try:
            for frame in c.decode(s):
                if frame.pts is not None:
                    if out and frame.pts <= out[-1]:
                        return True
                    out.append(frame.pts)
                if len(out) >= _ORDER_FRAMES:
                    break
        except av.error.FFmpegError:
            pass
    return False


def _indexed_end(stream) -> int | None:
    """Where the container's own index says the stream's data ends (None without an index)."""
    try:
        entries = stream.index_entries
        if len(entries) == 0:
            return None
        last = entries[len(entries) - 1]
        return max(int(last.pos) + int(last.size), int(entries[0].pos) + int(entries[0].size))
    except (AttributeError, TypeError):
        return None


def _from_index(c, path: str, touched: list, storage: Storage = LOCAL) -> _Pass | None:
    """What ``_read(path, "first")`` finds, from a long MP4/MOV's own sample index instead of a
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
    from ._av import fraction

    if not c.streams.video or c.format.name.split(",")[0] != "mov":
        return None
    s = c.streams.video[0]
    entries = s.index_entries
    n = len(entries)
    remote = is_remote(path)  # a full read would fetch every byte: the index at any length
    if n < (2 if remote else _INDEXED_MIN_FRAMES) or n != s.frames or not s.time_base:
        return None
    first_e, last_e = entries[0], entries[n - 1]
    end = _indexed_end(s)
    if end is None or end > storage.size(path) or first_e.is_discard:
        return None  # cut off, or an edit list: the full read says what is shown
    cc = s.codec_context
    cc.thread_count = 1
    r = _Pass()
    r.container, r.codec, r.declared = "mov", cc.codec.canonical_name, n
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
    with contextlib.nullcontext() if remote else storage.open_bytes(path) as f:
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
                h = _sequence_headers(f.read(e.size), r.codec)
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
        r.spans = _spans([(int(e.pos), int(e.size)) for e in (entries[i] for i in range(n))])
    r.pts = start + np.arange(n, dtype=np.int64) * step
    r.keyframes = np.array(keys[::-1], np.int64)
    r.durations = np.full(n, step, np.int64)
    r.decode_pos = None  # unknown: counted as reordered, and any damage spoils the whole decode
    r.step = float(step * r.time_base)
    r.fps = float(s.average_rate) if s.average_rate else 1.0 / r.step
    return r


def _spans(pos_size: list) -> np.ndarray:
    """[packets, 2] (start, end) bytes from (pos, size) pairs; an unknown position (-1) takes
    its neighbours' (the range fetched before a clip only needs to cover it roughly)."""
    a = np.asarray(pos_size, np.int64).reshape(-1, 2)
    out = np.stack([a[:, 0], a[:, 0] + a[:, 1]], axis=1)
    bad = a[:, 0] < 0
    if bad.any() and not bad.all():
        good = np.flatnonzero(~bad)
        near = good[np.clip(np.searchsorted(good, np.flatnonzero(bad)), 0, len(good) - 1)]
        out[bad] = out[near]
    return out


def _gop(c, s, r: _Pass, first: bool) -> list[tuple[int, int]] | None:
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


def _timeline(stamps: list) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Timestamps sorted into presentation order, or (None, None) when any is missing or repeats."""
    if any(t is None for t in stamps):
        return None, None
    a = np.asarray(stamps, np.int64)
    order = np.argsort(a, kind="stable")
    pts = a[order]
    if len(pts) > 1 and not (np.diff(pts) > 0).all():
        return None, None
    return pts, order


def _median_step(pts: np.ndarray | None, tb: Fraction, stream) -> float:
    if pts is not None and len(pts) > 1:
        return float(np.median(np.diff(pts))) * float(tb)
    rate = stream.average_rate or stream.guessed_rate
    return 1.0 / float(rate) if rate else 0.0


def _rate_problems(pts: np.ndarray, tb: Fraction, step: float) -> list[str]:
    if len(pts) < 3 or step <= 0:
        return []
    d = np.diff(pts).astype(np.float64) * float(tb)
    gaps = np.flatnonzero(d > _GAP * step)
    if len(gaps):
        i = int(gaps[0]) + 1
        return [f"timestamp gap at frame {i} ({d[i - 1]:.3g} s)" + (f", {len(gaps)} gaps" if len(gaps) > 1 else "")]
    if (np.abs(d - step) > _JITTER * step).any():
        return ["variable frame rate"]
    return []


def index_of(pts: np.ndarray | None, t) -> int | None:
    """The frame index of timestamp ``t`` in the sorted timeline ``pts``; None if it is not there."""
    if pts is None or t is None:
        return None
    i = int(np.searchsorted(pts, t))
    return i if i < len(pts) and pts[i] == t else None


# Sequence-level headers, where a stream states its frame size.
_START = re.compile(b"\x00\x00\x01")


def _sequence_headers(data: bytes, codec: str) -> bytes:
    """The sequence headers carried in a keyframe packet, concatenated (b"" if none): H.264 /
    HEVC SPS NAL units (Annex B or 4-byte length prefixed), MPEG-4 Part 2 VOL headers, MPEG-1/2
    sequence headers. A stream that changes size must send new ones."""
    if codec in ("h264", "hevc"):
        sps = (lambda b: b[0] & 0x1F == 7) if codec == "h264" else (lambda b: (b[0] >> 1) & 0x3F == 33)
        return b"".join(u for u in _nal_units(data) if u and sps(u))
    if codec == "mpeg4":
        return b"".join(u for u in _start_units(data) if u and 0x20 <= u[0] <= 0x2F)
    if codec in ("mpeg1video", "mpeg2video"):
        return b"".join(u for u in _start_units(data) if u and u[0] == 0xB3)
    return b""


def _start_units(data: bytes) -> list[bytes]:
    starts = [m.end() for m in _START.finditer(data)]
    return [data[a : b - 3] for a, b in zip(starts, starts[1:] + [len(data) + 3])]


def _nal_units(data: bytes) -> list[bytes]:
    units, i = [], 0
    while i + 4 <= len(data):  # length prefixed, as MP4 and Matroska store H.264/HEVC
        n = int.from_bytes(data[i : i + 4], "big")
        if n == 0 or i + 4 + n > len(data):
            break
        units.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    if i == len(data):
        return units
    return _start_units(data)  # Annex B, as MPEG-TS carries them
