"""One video made into a training copy (``shmloader prepare``'s per-file work, in a worker process).

NOTE [ A copy's frame i is the source's frame i ]
The copy is written from the frames the loader reads, numbered as the loader numbers them:
the source is probed as the loader probes it (its timeline from every packet: presentation
order, an edit list's dropped frames left out), then decoded once from the start; a decoded
frame is frame ``i`` where its timestamp is the ``i``-th of that timeline (in containers PyAV
does not seek by time, and in files without usable timestamps, the ``i``-th frame decoded, as
``video.pyav`` counts them). A frame off the timeline (decoded only, never shown) is left
out; a frame missing, repeated or out of order fails the file. Each frame is scaled, then
turned as the container's rotation asks (upright, no rotation tag), in the YUV it was stored in
(the colour matrix untouched, the range kept, 10 bits to 8), and encoded with the presentation
time of source frame ``i`` measured from the first frame (in the source's own time base: a
variable frame rate and timestamp gaps stay). The copy is probed afterwards and must count the
source's frames. x264 gets a keyframe every ``gop`` frames exactly (``keyint = min-keyint``, no
scene cuts, closed GOPs): a random clip decodes at most ``gop - 1`` frames before its first.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..video.media import Media
from ..video.packets import index_of
from ..video.probe import VideoInfo, probe
from ..video.pyav import PYAV_SEEKS
from ..video.storage import Storage

__all__ = ["CopySpec", "container_of", "copy_size", "transcode"]

# The time base of copies made from files without usable timestamps (frames counted, shown at
# the stream's rate): fine enough for 23.976, 29.97 and 59.94 frames per second exactly.
_COUNTED_TB = Fraction(1, 90000)

# B-frames between references: what the measurements of prepared copies used (2 B-frames).
_BFRAMES = 2

# Containers a copy keeps (they hold H.264 with B-frames, per-frame timestamps and audio);
# every other source extension gets an MP4 copy of the same name (``.mp4``).
_KEEP_EXTENSIONS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}

# Audio codecs an MP4 or MOV copy takes as they are (copied packet for packet); Matroska takes any.
_MP4_AUDIO = frozenset({"aac", "mp3", "ac3", "eac3", "opus", "flac", "alac"})
_MOV_AUDIO = _MP4_AUDIO | {"pcm_s16le", "pcm_s16be", "pcm_s24le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"}


@dataclass(frozen=True, slots=True)
class CopySpec:
    """What a copy is made at: ``short_side`` or ``size`` (None, None: the source's size),
    a keyframe every ``gop`` frames, x264's ``crf``."""

    short_side: int | None = None
    size: tuple[int, int] | None = None
    gop: int = 16
    crf: int = 23


def _even(x: float) -> int:
    """``x`` rounded to an even whole number, at least 2: 4:2:0 video has even sides."""
    return max(2, 2 * round(x / 2))


def copy_size(height: int, width: int, spec: CopySpec) -> tuple[int, int]:
    """(height, width) of the copy of a video shown at ``height`` x ``width``."""
    if spec.size is not None:
        return _even(spec.size[0] + spec.size[0] % 2), _even(spec.size[1] + spec.size[1] % 2)
    if spec.short_side is None:
        return _even(height - height % 2), _even(width - width % 2)
    n = spec.short_side
    if height <= width:
        return _even(n), _even(width * n / height)
    return _even(height * n / width), _even(n)


def container_of(name: str) -> tuple[str, str]:
    """(the copy's file name, libavformat's muxer) for a source named ``name``."""
    stem, ext = os.path.splitext(name)
    fmt = _KEEP_EXTENSIONS.get(ext.lower())
    return (name, fmt) if fmt is not None else (stem + ".mp4", "mp4")


def _audio_fits(codec: str, fmt: str) -> bool:
    return fmt == "matroska" or codec in (_MOV_AUDIO if fmt == "mov" else _MP4_AUDIO)


class _Turner:
    """``scale,transpose/flip,format=yuv420p`` in a libavfilter graph: a frame at the copy's size,
    upright, in 8-bit 4:2:0 with the source's range (the matrix is not converted). Rebuilt when a
    frame's size or format changes (a stream that changes size mid-way)."""

    def __init__(self, width: int, height: int, rotation: int, full_range: bool) -> None:
        turns = rotation // 90 % 4
        # Scaled before turning: a 90-degree turn swaps the sides the scaler must produce.
        self._sw, self._sh = (height, width) if turns % 2 else (width, height)
        # np.rot90's counter-clockwise turns (the loader's), as filters.
        self._turn = {0: [], 1: [("transpose", "cclock")], 2: [("hflip", ""), ("vflip", "")],
                      3: [("transpose", "clock")]}[turns]
        self._range = "pc" if full_range else "tv"
        self._key: tuple | None = None
        self._graph: Any = None

    def __call__(self, frame) -> Any:
        key = (frame.width, frame.height, frame.format.name)
        if key != self._key:
            from ..video._av import filter_graph

            g = filter_graph()  # one thread, as the decoder and encoder
            chain = [g.add_buffer(width=frame.width, height=frame.height, format=frame.format,
                                  time_base=Fraction(1, 1000)),
                     g.add("scale", f"{self._sw}:{self._sh}:out_range={self._range}")]
            chain += [g.add(name, args) if args else g.add(name) for name, args in self._turn]
            chain += [g.add("format", "yuv420p"), g.add("buffersink")]
            for a, b in itertools.pairwise(chain):
                a.link_to(b)
            g.configure()
            self._graph, self._key = g, key
        frame.pts = None
        self._graph.push(frame)
        return self._graph.pull()


def transcode(media: Media, dest: str, fmt: str, spec: CopySpec, storage: Storage) -> dict[str, Any]:
    """Write the copy of ``media`` to ``dest`` (NOTE [ A copy's frame i is the source's frame i ]);
    return what the row says of it: ``{"frames", "note", "problem"}`` (a source cut short:
    ``truncated at frame N of M``, N the frames copied). Raises ValueError naming the frame and
    the cause where the source cannot be read whole (a cut source: up to its cut)."""
    import av

    from ..video._av import open_input

    info = probe(media, index=False, storage=storage)
    # A file cut short (its index lists more frames than it holds): the frames before the cut
    # are copied, as the loader reads them; the row says how many of how many.
    found = re.search(r"truncated at frame \d+ of (\d+)", info.problem)
    cut = int(found[1]) if found else None
    h, w = copy_size(info.height, info.width, spec)
    t = _Times(info)
    rate = Fraction(info.fps).limit_denominator(1001) if info.fps > 0 else Fraction(25)
    with open_input(storage.media(media)) as c, av.open(dest, "w", format=fmt) as o:
        src = c.streams.video[0]
        src.codec_context.thread_count = 1  # one core per worker
        out = _video_out(o, w, h, t.tb, rate, spec)
        audio, a_out, note = _audio_out(c, o, fmt)
        frames = _Frames(info, t, o, out, src, w, h)
        start = float(info.pts[0] * info.time_base) if t.by_time and info.pts is not None else 0.0
        sound = _Sound(o, a_out, start)
        try:
            for p in c.demux(*([src] if a_out is None else [src, audio])):
                if p.stream.type == "audio":
                    sound.put(p)
                    continue
                for frame in p.decode():
                    frames.put(frame)
        except av.error.FFmpegError as e:
            if cut is None:
                raise ValueError(f"damaged or cut-off data: the decoder stopped with {frames.n} of the "
                                 f"{info.frames} frames out: {e}") from e
            try:  # the frames decoded before the cut and held back for reordering (whole packets)
                for frame in src.decode(None):
                    frames.put(frame)
            except av.error.FFmpegError:
                pass
        n = frames.n
        if n < info.frames and (cut is None or n == 0):
            raise ValueError(f"the stream ends at frame {n} of the {info.frames} its probe counted "
                             "(damaged or truncated?)")
        _mux(o, out.encode(), t.lasts)
    problem = f"truncated at frame {n} of {cut}" if cut is not None else ""
    return {"frames": n, "note": note, "problem": problem}


class _Times:
    """The copy's time base (``tb``), frame ``i``'s presentation time (``times[i]``, from the
    first frame) and each packet's duration by its time (``lasts``); ``by_time``: the source's
    frames are placed by their timestamps, not counted."""

    def __init__(self, info: VideoInfo) -> None:
        self.by_time = info.pts is not None and (not info.container or info.container in PYAV_SEEKS)
        if self.by_time:
            assert info.pts is not None
            tb, times = info.time_base, info.pts - info.pts[0]
            last = int(info.durations[-1]) if info.durations is not None and len(info.durations) else 0
        else:
            tb = _COUNTED_TB
            times = np.round(np.arange(info.frames + 1) / info.fps / float(tb)).astype(np.int64)
            times, last = times[:-1], int(times[-1] - times[-2])
        if last <= 0 and len(times) > 1:  # a container that stores none (FLV): the usual step, as the probe's duration
            last = int(np.median(np.diff(times)))
        self.tb: Fraction = tb
        self.times: np.ndarray = times
        # Each packet's duration: to the next frame's time, the last frame's as the source's. An MP4
        # stores the durations, and the frame rate a demuxer reports is counted from them.
        self.lasts: dict[int, int] = dict(zip(times.tolist(),
                                              np.diff(times, append=times[-1] + max(last, 1)).tolist()))


def _video_out(o, w: int, h: int, tb: Fraction, rate: Fraction, spec: CopySpec) -> Any:
    """The copy's video stream in ``o``: x264 at ``w`` x ``h``, a keyframe every ``spec.gop``
    frames exactly."""
    out = o.add_stream("libx264", rate=rate)
    out.width, out.height, out.pix_fmt = w, h, "yuv420p"
    out.time_base = out.codec_context.time_base = tb
    out.codec_context.thread_count = 1
    out.options = {"preset": "veryfast", "crf": str(spec.crf),
                   "x264-params": f"keyint={spec.gop}:min-keyint={spec.gop}:scenecut=0:open-gop=0:"
                                  f"bframes={_BFRAMES}"}
    return out


def _audio_out(c, o, fmt: str) -> tuple[Any, Any, str]:
    """(the source's first audio stream, its stream in the copy, the row's note): an audio
    stream the copy's container cannot hold as it is is left out (no stream in the copy), and
    the note says so."""
    audio = c.streams.audio[0] if c.streams.audio else None
    if audio is None:
        return None, None, ""
    name = audio.codec_context.codec.canonical_name  # the codec's, not its decoder's (mp3float)
    if _audio_fits(name, fmt):
        return audio, o.add_stream_from_template(audio), ""
    return audio, None, f"audio ({name}) left out: {fmt.upper()} cannot hold it as it is"


class _Frames:
    """The copy's video: each source frame checked against the probe's timeline, turned upright
    at the copy's size and encoded as the copy's frame ``n`` (the frames written so far)."""

    def __init__(self, info: VideoInfo, t: _Times, o, out, src, w: int, h: int) -> None:
        self._info, self._t, self._o, self._out, self._src = info, t, o, out, src
        self._w, self._h = w, h
        self._turner: _Turner | None = None
        self.n = 0  # frames written; the next one wanted

    def put(self, frame) -> None:
        """Source frame ``frame`` into the copy, as its frame ``n``."""
        import av

        info, t, n = self._info, self._t, self.n
        i = index_of(info.pts, frame.pts) if t.by_time else n
        if i is None:
            return  # decoded only, not shown (before an edit list's start)
        if i != n:
            raise ValueError(f"frame {n} is missing: the decoder gave frame {i} after frame {n - 1}")
        if n >= info.frames:
            raise ValueError(f"the stream holds more than the {info.frames} frames its probe counted")
        if frame.is_corrupt:
            raise ValueError(f"frame {n} is damaged")
        if self._turner is None:
            self._turner = _Turner(self._w, self._h, info.rotation, frame.color_range == 2)
            _tag(self._out.codec_context, frame, self._src.codec_context)
        img = self._turner(frame)
        img.pts, img.time_base = int(t.times[n]), t.tb
        img.pict_type = av.video.frame.PictureType.NONE  # a source keyframe forces none here
        _mux(self._o, self._out.encode(img), t.lasts)
        self.n += 1


class _Sound:
    """The copy's audio, packet for packet: shifted so the first frame shown is at 0, what is
    over before it left out (but for the packet just before the first one kept)."""

    def __init__(self, o, a_out, start: float) -> None:
        self._o, self._a_out, self._start = o, a_out, start
        self._held = None  # the latest audio packet over before the first frame shown

    def put(self, p) -> None:
        """Audio packet ``p`` into the copy (or held, or left out)."""
        if p.dts is None or p.pts is None or self._a_out is None:
            return
        shift = round(self._start / p.time_base)
        if shift and p.pts - shift + (p.duration or 0) <= 0:
            self._held = p  # over before the first frame shown: left out, but for the last
            return
        # The packet before the first one kept stays (before 0, so the decoder drops
        # its samples): AAC's and MP3's decoders need it to decode the next one whole.
        for q in (self._held, p) if self._held is not None else (p,):
            q.pts, q.dts = q.pts - shift, q.dts - shift
            q.stream = self._a_out
            self._o.mux(q)
        self._held = None


def _mux(o, packets, durations: dict[int, int]) -> None:
    for q in packets:
        q.duration = durations.get(int(q.pts), 0)
        o.mux(q)


def _tag(cc, frame, decoder) -> None:
    """The copy's colour matrix, range, primaries and transfer: the source's (its first frame's,
    decoded by ``decoder``). An RGB source's "matrix" (identity, 0) is not the copy's: its YUV is
    the scaler's default, BT.601, which an unspecified matrix (2) means to decoders."""
    from ..video._av import colour_tags

    cc.colorspace, cc.color_range = frame.colorspace or 2, frame.color_range
    cc.color_primaries, cc.color_trc = colour_tags(frame, decoder)
