"""One read of a video file's packets, as libavformat presents them: the presentation timeline,
keyframes, byte spans, sequence headers and what decoding finds on the way (``video.probe``
decides from it what the file is). Every packet is demuxed once; ``decode`` says how much is
decoded: the first frame, every keyframe, or every frame.
"""

from __future__ import annotations

import io
import os
import re
from fractions import Fraction
from typing import Any

import numpy as np

from .media import Media
from .storage import Storage

__all__ = ["Pass", "read_open", "profile_of", "RawStream", "NoFrameBoundary", "RAW_EXTENSIONS", "RAW_GAP", "indexed_end",
           "byte_spans", "timeline", "median_step", "index_of", "sequence_headers", "open_gop"]

# Frames a probe decodes, where the decoder reorders, to see that decoded stamps follow
# presentation order (B-frames start in the first GOP).
_ORDER_FRAMES = 8

# Raw elementary streams (Annex B H.264/HEVC, MPEG-2 video): FFmpeg's parser keeps every byte it
# reads until it finds where the next frame starts, so a file that holds no start code (zeros,
# other data under a raw name) grows the probe's memory with the file (~160 MB/s, for as long as
# the file lasts). A probe reads them through RawStream, which reads no further than this past
# the last packet out: far more than the largest frame.
RAW_EXTENSIONS = (".h264", ".264", ".h265", ".hevc", ".265", ".m2v")
RAW_GAP = 64 << 20


class Pass:
    """What one read of a file found (see ``_read``)."""

    container: str
    codec: str
    profile = ""  # the codec's profile ("Main", "High"...), "" where the codec names none
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
    audio_packets: np.ndarray | None = None  # a remote MP4/MOV's (``mp4index.audio_packets``)

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int, int]] = []  # (frame index, height, width) at each size


def profile_of(cc: Any) -> str:
    """The profile a codec context names ("Main", "High"...), "" where none (or an old PyAV)."""
    try:
        return str(cc.profile or "")
    except Exception:
        return ""


class NoFrameBoundary(ValueError):
    """A raw stream's parser read ``RAW_GAP`` bytes without finding where a frame starts."""


class RawStream(io.RawIOBase):
    """A local raw stream as FFmpeg reads it (its ``name`` the path: the demuxer is chosen as
    for the path itself), refusing to read ``RAW_GAP`` bytes past ``mark`` (the probe moves
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
        if at - self.mark > RAW_GAP:
            raise NoFrameBoundary(f"no frame starts in {RAW_GAP >> 20} MiB of the raw stream from byte "
                                  f"{self.mark} (not a raw video stream?)")
        return self._f.readinto(b)

    def close(self) -> None:
        self._f.close()
        super().close()


def read_open(c, media: Media, decode: str, storage: Storage, raw: RawStream | None = None) -> Pass:
    """Every packet of the open container ``c`` of ``media`` (read through ``raw`` for a raw
    stream), decoding as ``decode`` says: ``"first"`` until the first frame, ``"keyframes"``
    keyframes only (and every frame before the first shown), ``"frames"`` all."""
    r = Pass()
    if not c.streams.video:
        raise ValueError("no video stream")
    s = c.streams.video[0]
    cc = s.codec_context
    cc.thread_count = 1
    _describe(r, c, s, cc)
    end = _container_end(s, r.container, media, storage)
    d = _Demux(r, cc, decode, media.size)
    broke = d.read(c, s, raw)
    r.delay = bool(cc.has_b_frames)
    if decode != "first" or r.first is None:
        d.take(None)  # frames held back for reordering: a one-keyframe file gives its only one here
    if decode != "frames" and not r.unordered:  # "frames" saw every decoded stamp above
        r.unordered = stamps_in_decode_order(media, d.stamps, r.delay, storage)
    if end is not None and end > media.size:
        d.cut()
    if broke and not r.truncated and r.damaged is None:
        r.damaged = d.kept
    if d.kept == 0:
        raise ValueError("the video stream holds no frames" + (" (the file is cut off before its first frame)"
                                                               if r.truncated else ""))
    _place(r, d, s, media)
    return r


def _describe(r: Pass, c, s, cc) -> None:
    """What the container says of the video stream ``s`` (decoded by ``cc``) before any packet."""
    from ._av import fraction

    r.container = c.format.name.split(",")[0]
    r.codec = cc.codec.canonical_name
    r.profile = profile_of(cc)
    r.declared = int(s.frames or 0)
    r.time_base = fraction(s.time_base) or Fraction(1, 1)


def _container_end(s, container: str, media: Media, storage: Storage) -> int | None:
    """Where the container says the stream's data ends (``indexed_end``; for a MOV/MP4 whose
    index PyAV cannot show, where its boxes end), None where it does not say."""
    end = indexed_end(s)
    if end is None and container == "mov":
        from ._av import INDEX_ENTRIES, boxes_end

        if not INDEX_ENTRIES:  # a PyAV that cannot show the index: the file's boxes say it is cut
            with storage.open_bytes(media) as f:
                end = boxes_end(f)
    return end


class _Demux:
    """One pass over a stream's packets: what each packet says (its stamp, duration, dts, bytes,
    keyframe and sequence headers, in decode order) and what decoding finds (frames out, their
    stamps and sizes, damage, order), noted on the ``Pass`` ``r`` or kept here for ``_place``."""

    def __init__(self, r: Pass, cc, decode: str, size: int) -> None:
        self.r, self.cc, self.decode, self.size = r, cc, decode, size
        self.stamps: list[int | None] = []  # per packet in decode order; None: unstamped
        self.durations: list[int] = []
        self.key_stamps: list[int] = []
        self.frame_stamps: list[tuple[int, int | None, int, int]] = []  # (n, pts, height, width) per frame out
        self.dts: list[int | None] = []
        self.spans: list[tuple[int, int]] = []
        self.headers: bytes | None = None
        self.kept = 0  # packets shown
        self.n = 0  # frames out
        r.dropped = 0

    def read(self, c, s, raw: RawStream | None) -> bool:
        """Demux every packet of ``s``, decoding as ``decode`` says; True if the container broke off."""
        import av

        try:
            for p in c.demux(s):
                if raw is not None:
                    raw.mark = raw.tell()
                if p.size == 0:
                    continue  # the end: flushed below, also when the container breaks off
                self.note(p)
                if self.decode == "first" and self.r.first is not None:
                    continue
                self.take(p)
        except (av.error.FFmpegError, NoFrameBoundary):  # the container itself breaks off
            return True
        return False

    def note(self, p) -> None:
        """What packet ``p`` says of itself."""
        r = self.r
        if p.is_discard:  # before an edit list's start: a reference, never shown
            r.dropped += 1
            return
        whole = p.pos is None or p.pos < 0 or p.pos + p.size <= self.size
        t = p.pts if p.pts is not None else p.dts
        self.stamps.append(t)
        self.durations.append(p.duration or 0)
        self.dts.append(p.dts if whole else None)
        self.spans.append((p.pos if p.pos is not None and p.pos >= 0 else -1, p.size))
        self.kept += 1
        if p.is_corrupt and r.damaged is None:
            r.damaged, r.damaged_at = self.kept - 1, t
        if p.is_keyframe:
            self.key_stamps.append(t)
            h = sequence_headers(bytes(p), r.codec)
            if h:
                if self.headers is None:
                    self.headers = h
                elif h != self.headers:
                    r.header_change = True

    def take(self, p) -> bool:
        """Decode packet ``p`` (None: flush) as ``decode`` says; False once done."""
        import av

        r, decode, frame_stamps = self.r, self.decode, self.frame_stamps
        try:
            for frame in (p.decode() if p is not None else self.cc.decode(None)):
                if r.first is None:
                    r.first = frame
                    # "keyframes" decodes every frame until the first one shown, keyframes only
                    # from there: a keyframe before an edit list's start is decoded but never
                    # shown, and in a file with one keyframe (a stream-copied cut of a short clip)
                    # no frame would come out at all.
                    if decode == "keyframes":
                        self.cc.skip_frame = "NONKEY"
                if frame.is_corrupt and r.damaged is None and decode != "first":
                    r.damaged, r.damaged_at = self.n, frame.pts
                if decode != "first" and frame.pts is not None and frame_stamps and \
                        frame_stamps[-1][1] is not None and frame.pts <= frame_stamps[-1][1]:
                    r.unordered = True  # frames come out in presentation order, their stamps do not
                frame_stamps.append((self.n, frame.pts, frame.height, frame.width))
                self.n += 1
                if decode == "first":
                    return False
        except av.error.FFmpegError:  # a damaged packet: note it, read on
            if r.damaged is None and decode != "first":
                r.damaged = self.n if decode == "frames" else self.kept - 1
                r.damaged_at = None if p is None else p.pts
        return True

    def cut(self) -> None:
        """The container's index points past the end of the file: a cut download. The frames
        shown up to the last whole packet's dts are whole (a later frame is stored later): only
        they are kept."""
        r, stamps, dts = self.r, self.stamps, self.dts
        last = max((d for d in dts if d is not None), default=None)
        keep = [i for i, t in enumerate(stamps) if last is not None and t is not None and t <= last
                and dts[i] is not None]
        self.stamps, self.durations = [stamps[i] for i in keep], [self.durations[i] for i in keep]
        self.key_stamps = [t for t in self.key_stamps if last is not None and t is not None and t <= last]
        self.kept, r.truncated = len(keep), True
        r.damaged = None if r.damaged is None or r.damaged >= self.kept else r.damaged
        if self.decode == "frames":
            self.n = min(self.n, self.kept)


def _place(r: Pass, d: _Demux, s, media: Media) -> None:
    """The pass's findings on the presentation timeline: frame order, durations, keyframes, the
    frame rate, the first damaged frame and where the frame size changes, as frame indices."""
    r.kept = d.kept
    r.spans = byte_spans(d.spans) if media.remote else None
    r.pts, order = timeline(d.stamps)
    at = index_of(r.pts, r.damaged_at) if r.damaged is not None else None
    if at is not None:
        r.damaged = at
    r.durations = None if order is None else np.asarray(d.durations, np.int64)[order]
    r.decode_pos = order
    r.keyframes = None if r.pts is None else np.unique(np.searchsorted(r.pts, d.key_stamps))
    r.step = median_step(r.pts, r.time_base, s)
    r.fps = float(s.average_rate) if s.average_rate else (1.0 / r.step if r.step > 0 else 0.0)
    if d.decode != "first":
        r.decoded = d.n if d.decode == "frames" else None
        for i, t, height, width in d.frame_stamps:
            j = i if d.decode == "frames" else index_of(r.pts, t)
            if j is not None and j >= d.kept:
                continue
            if not r.sizes or r.sizes[-1][1:] != (height, width):
                r.sizes.append((-1 if j is None else j, height, width))


def stamps_in_decode_order(media: Media, stamps: list, delay: bool, storage: Storage) -> bool:
    """Whether the stamps of a file whose decoder reorders frames (``delay``) name packets in
    decode order, not instants: stored in decode order (never going back over the first
    ``_ORDER_FRAMES`` packets) while the first frames the decoder puts out, in presentation
    order, carry stamps that go back. AVI stores no presentation times: there it is so."""
    head = [t for t in stamps[: _ORDER_FRAMES + 16] if t is not None]
    if not delay or len(head) < 3 or any(b <= a for a, b in zip(head, head[1:])):
        return False
    import av

    from ._av import open_input

    out: list[int] = []
    with open_input(storage.media(media)) as c:
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


def indexed_end(stream) -> int | None:
    """Where the container's own index says the stream's data ends (None without an index, or
    with a PyAV that cannot show it)."""
    from ._av import INDEX_ENTRIES

    if not INDEX_ENTRIES:
        return None
    try:
        entries = stream.index_entries
        if len(entries) == 0:
            return None
        last = entries[len(entries) - 1]
        return max(int(last.pos) + int(last.size), int(entries[0].pos) + int(entries[0].size))
    except (AttributeError, TypeError):
        return None


def byte_spans(pos_size: list) -> np.ndarray:
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


def timeline(stamps: list) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Timestamps sorted into presentation order, or (None, None) when any is missing or repeats."""
    if any(t is None for t in stamps):
        return None, None
    a = np.asarray(stamps, np.int64)
    order = np.argsort(a, kind="stable")
    pts = a[order]
    if len(pts) > 1 and not (np.diff(pts) > 0).all():
        return None, None
    return pts, order


def median_step(pts: np.ndarray | None, tb: Fraction, stream) -> float:
    if pts is not None and len(pts) > 1:
        return float(np.median(np.diff(pts))) * float(tb)
    rate = stream.average_rate or stream.guessed_rate
    return 1.0 / float(rate) if rate else 0.0


def open_gop(decode_pos: np.ndarray | None, keyframes: np.ndarray | None) -> int | None:
    """The first keyframe (frame index) with leading pictures, None if none has: a frame shown
    before the keyframe but decoded after it (x264 ``open-gop``, HEVC RASL pictures before a
    CRA). They reference the GOP before, so a decode from that keyframe cannot show them; and a
    reader that counts a keyframe's place by packets in decode order (decord) puts it that many
    frames early (NOTE [ Which decoder reads a file ] in ``video.probe``)."""
    if decode_pos is None or keyframes is None or len(decode_pos) < 2:
        return None
    before = np.maximum.accumulate(decode_pos)  # the last-decoded frame shown up to each frame
    keys = keyframes[(keyframes > 0) & (keyframes < len(decode_pos))]
    hit = keys[before[keys - 1] > decode_pos[keys]]
    return int(hit[0]) if len(hit) else None


def index_of(pts: np.ndarray | None, t) -> int | None:
    """The frame index of timestamp ``t`` in the sorted timeline ``pts``; None if it is not there."""
    if pts is None or t is None:
        return None
    i = int(np.searchsorted(pts, t))
    return i if i < len(pts) and pts[i] == t else None


# Sequence-level headers, where a stream states its frame size.
_START = re.compile(b"\x00\x00\x01")


def sequence_headers(data: bytes, codec: str) -> bytes:
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
