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
PyAV still reads what decord counts or turns wrong, and what PyAV reads faster:

- an edit list that drops frames (``ffmpeg -ss T -c copy`` cuts): decord counts and returns
  the dropped frames, freezing the last ones;
- a size change inside the stream (joined segments, live recordings);
- a rotation tag: decord cannot copy turned frames out at their own size;
- a container frame count that disagrees with the stream (a truncated download among them);
- damage (``check="keyframes"`` or ``"frames"``);
- ``_LONG`` frames or more: decord reads its whole index for every clip;
- an open GOP: a keyframe with leading pictures (shown before it, decoded after it:
  x264 ``open-gop``, HEVC RASL pictures before a CRA; ``packets.open_gop``). decord counts a
  keyframe's place by packets in decode order, so it places such a keyframe as many frames early
  as it has leading pictures, and a clip that starts at or just before it comes back wrong (MP4:
  frame 45 for 44; MKV: frame 0 for 44, measured with decord2 3.4.0, tests/test_open_gop.py).
  PyAV seeks to the keyframe before the wanted frame by presentation order, so a leading
  picture is decoded from the GOP it references;
- a long GOP (``LONG_GOP`` frames per keyframe or more) with B-frames, in a codec of
  ``SKIPS_NONREF``: PyAV leaves out the non-reference frames before and between the wanted
  ones (NOTE [ Decoding less, exactly ] in ``video.pyav``), decord decodes them all: the
  cheaper exact path (bench/skipping.py);
- H.264 in MP4/MOV or MKV where PyAV took less CPU per clip than decord, one random clip a
  call and 8 clips of a video read together alike (bench/decoder_choice.py; bench/results/
  decoder-choice-cpu2.md, -gops.md, -mkv.md, -720p.md): with B-frames, any GOP, frames up to
  ``_FASTER_PIXELS`` (PyAV leaves out the non-reference frames and keeps the container open,
  where decord opens a reader, its index and a decoding thread for every clip); without
  B-frames, a keyframe every ``_FASTER_GOP`` frames or more often, frames up to
  ``_FASTER_PIXELS_NO_B``. Without B-frames, longer GOPs and larger frames came out even or
  decord's on grouped reads: decord keeps them, and every shape not measured (FLV, other
  codecs, larger frames).

That last bullet is a rule of thumb drawn from the shapes we wrote, and it misjudged files users
have (Big Buck Bunny, 720p without B-frames, one GOP: decord by the rule, PyAV's by CPU): it is
only the first guess. Where both decoders read a file exactly (``decord`` here, or ``pyav`` for
speed alone, ``VideoInfo.pyav_faster``), a loader's worker with ``decoder="auto"`` measures the
two on the files of each shape for the loader's own cut and keeps the faster
(NOTE [ Measuring the decoder ] in ``video.measuring``); the evidence above still decides which
files both may read. The rule alone decides a manifest row (``shmloader scan --measure-cut`` measures there)
and a remote file; the other speed reasons (a long GOP, a long file) are not measured.

PyAV seeks by the timestamps a probe reads, which a scan manifest's row does not hold: reading
from a row, a worker probes such a file first (kept per worker, ``video.decoding``), which
costs about what PyAV saves on a clip of a large frame (the results' probe column) and which a
decord row spares. So a file PyAV reads for speed alone (``VideoInfo.pyav_faster``) is
``decord`` in ``shmloader scan``'s decoder column. ``prepare``'s copies keep ``pyav``: at the
training sizes it writes (short side 256 or less), a clip with its probe still took less CPU
than decord's (the results' probe column; bench/results/prepare-cpu2.md).

``check="keyframes"`` and ``"frames"`` also gather evidence per file decord would read (a
manifest row's included): a few seeded positions decoded by decord as the loader seeks (a fresh
reader each) are compared with PyAV's decode by timestamps; a mismatch sends the file to PyAV
(``decord seeks wrong at frame N (read by PyAV)``).

A size change is found cheaply: the sequence headers (H.264/HEVC SPS, MPEG-4 VOL, MPEG-1/2
sequence header) carried in keyframe packets are compared, and only when they change are the
keyframes decoded to see whether the size did. ``check="keyframes"`` decodes every keyframe
(any codec), ``check="frames"`` every frame (damaged frames, the exact count): what
``shmloader scan`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from .._checks import check_choice
from .media import Media
from .mp4index import INDEXED_MIN_FRAMES, audio_packets, from_index
from .packets import RAW_EXTENSIONS, Pass, RawStream, open_gop, read_open
from .storage import LOCAL, Storage

__all__ = ["VideoInfo", "probe", "DECODERS", "CHECKS", "DECORD_SHAPES", "SKIPS_NONREF", "UNORDERED"]

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

# Codecs whose FFmpeg decoder, told ``skip_frame = "NONREF"``, leaves out exactly the frames no
# later frame references (NOTE [ Decoding less, exactly ] in ``video.pyav``; each compared frame
# for frame with a sequential decode in tests/test_skipping.py): H.264 (nal_ref_idc 0), HEVC
# (sub-layer non-reference pictures, in a stream of one temporal layer), MPEG-4 Part 2
# (B-frames), VP9 (frames that refresh no reference slot; libvpx writes none by default).
SKIPS_NONREF = frozenset({"h264", "hevc", "mpeg4", "vp9"})

# From this many frames per keyframe (on average), a file of a codec in SKIPS_NONREF with
# B-frames is read by PyAV: a random clip decodes the frames from the keyframe before it, and
# PyAV leaves out the non-reference ones on the way, decord decodes them all. Measured on
# x264 files (bench/skipping.py, bench/results/skipping-cpu2.md).
LONG_GOP = 60

# Where PyAV is faster than decord (NOTE [ Which decoder reads a file ]): H.264 in these
# containers, frames up to 720x1280 with B-frames; without them up to 480x640 and a keyframe
# every 16 frames or more often (on average). Beyond, decord was as fast or unmeasured.
_FASTER = frozenset({("mov", "h264"), ("matroska", "h264")})
_FASTER_PIXELS = 720 * 1280
_FASTER_PIXELS_NO_B = 480 * 640
_FASTER_GOP = 16

# From this many frames a video is long: PyAV reads it (decord's reader reads its whole index on
# every open, which is once per clip), and an MP4/MOV is timed from its own index (``mp4index``).
_LONG = INDEXED_MIN_FRAMES

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
    # Remote MP4/MOV with sound only: [packets, 3] (microseconds, first byte, end byte) of its
    # first audio stream, what a clip's audio bytes are fetched by (``video.audiobytes``).
    audio_packets: np.ndarray | None = field(default=None, repr=False, compare=False)
    # Where the file is and which version was probed (``video.media``): what the decoders read.
    media: Media | None = field(default=None, repr=False, compare=False)
    # PyAV reads it for speed alone: decord reads it right too, and without a probe (the decoder
    # of its manifest row).
    pyav_faster: bool = False
    # The codec's profile ("Main", "High"...) and whether frames are stored out of presentation
    # order (B-frames): with the sizes and GOP, the file's shape the decoder is measured for
    # (``video.measuring``). Unknown ("", False) in a manifest row.
    profile: str = ""
    bframes: bool = False

    def __post_init__(self) -> None:
        if self.media is not None and self.media.path != self.path:
            raise ValueError(f"VideoInfo of {self.path!r} given the handle of {self.media.path!r}")

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
        # A last packet without a duration (a container that stores none, or av 15 reading an
        # MP4 whose encoder ran at the stream's time base) lasts as long as the frame before it.
        last = float(self.durations[-1]) * float(self.time_base)
        if last <= 0:
            last = begin[-1] - begin[-2] if len(begin) > 1 else self.duration
        end[-1] = begin[-1] + last
        return np.stack([begin, end], axis=1)

    def with_decoder(self, decoder: str, why: str = "") -> "VideoInfo":
        return replace(self, decoder=decoder, problem="; ".join(p for p in (self.problem, why) if p),
                       pyav_faster=False)


def probe(path: str | Media, *, check: str = "headers", index: bool = True,
          storage: Storage | None = None) -> VideoInfo:
    """The frames of ``path`` (or of the file a :class:`~shmloader.video.media.Media` handle
    resolved) as libavformat presents them, and the decoder that reads them right.

    ``check``: ``"headers"`` decodes the first frame, ``"keyframes"`` every keyframe,
    ``"frames"`` every frame (the random-access evidence is ``tools.evidence``'s).

    ``index``: with ``check="headers"``, a long MP4/MOV's timeline comes from its own index
    (``mp4index``: a few GOPs read, not every packet) where that index shows a constant rate.

    ``storage``: how remote paths (fsspec URLs, tar members) are read; a remote file's timeline
    comes from its index at any length (its packets are not all fetched) and PyAV reads it.

    Raises FileNotFoundError, ValueError (no video stream, no frames) or PyAV's error for a file
    FFmpeg cannot open.
    """
    check_choice("check", check, CHECKS)
    storage = storage or LOCAL
    media = path if isinstance(path, Media) else storage.resolve(path)
    r = _read(media, "first" if check == "headers" else check, index=index, storage=storage)
    if check == "headers" and r.header_change:  # new sequence headers: did the size change?
        k = _read(media, "keyframes", storage=storage)
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
    if reorder and open_gop(r.decode_pos, r.keyframes) is not None:
        pyav.append("open GOP")  # decord places the keyframe early: its leading pictures come out wrong
    if reorder and r.codec in SKIPS_NONREF and r.keyframes is not None \
            and kept >= LONG_GOP * max(1, len(r.keyframes)):
        pyav.append("long GOP")  # PyAV decodes less (NOTE [ Decoding less, exactly ])
    if (r.container, r.codec) in _FASTER and r.keyframes is not None and (
            fh * fw <= _FASTER_PIXELS if reorder else
            fh * fw <= _FASTER_PIXELS_NO_B and kept <= _FASTER_GOP * max(1, len(r.keyframes))):
        pyav.append("faster")  # measured: less CPU per clip than decord, one at a time or grouped
    if media.remote:
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
    return VideoInfo(path=media.path, frames=kept, height=shown_h, width=shown_w, fps=r.fps, duration=duration,
                     codec=r.codec, pix_fmt=first.format.name, rotation=rotation, container=r.container,
                     decoder="pyav" if pyav else "decord", problem="; ".join(problems), time_base=tb,
                     pyav_faster=pyav == ["faster"], profile=r.profile, bframes=bool(reorder),
                     pts=pts, keyframes=None if pts is None else r.keyframes,
                     durations=None if pts is None else r.durations,
                     decode_pos=None if pts is None else r.decode_pos, indexed=r.indexed,
                     spans=r.spans if media.remote else None, media=media,
                     audio_packets=r.audio_packets if media.remote else None)


def _read(media: Media, decode: str, index: bool = False, storage: Storage = LOCAL) -> Pass:
    """Demux every packet of the first video stream once, decoding as ``decode`` says:
    ``"first"`` until the first frame, ``"keyframes"`` keyframes only, ``"frames"`` all.
    ``index``: a "first" read of a long MP4/MOV is taken from its index (``mp4index``)."""
    from ._av import open_input

    raw = RawStream(media.local) if not media.remote and media.path.lower().endswith(RAW_EXTENSIONS) else None
    if raw is not None:
        with raw, open_input(raw) as c:
            return read_open(c, media, decode, storage, raw)
    if index and decode == "first":
        touched: list = []
        with open_input(storage.media(media)) as c:
            fast = from_index(c, media, touched, storage)
            if fast is not None:
                return _with_sound(fast, c, media)
            if not touched:  # nothing read yet: the full read goes on with this container
                return _with_sound(read_open(c, media, decode, storage), c, media)
    with open_input(storage.media(media)) as c:
        return _with_sound(read_open(c, media, decode, storage), c, media)


def _with_sound(r: Pass, c, media: Media) -> Pass:
    """``r`` with where a remote MP4/MOV's audio packets lie (its index, already read)."""
    if media.remote:
        r.audio_packets = audio_packets(c)
    return r


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
