"""A clip's sound: the audio of the instants its frames show, resampled, mixed and placed.

With ``VideoClips(audio_rate=R)`` every clip of a sample gets the audio of its span, read by
PyAV (libavformat + libavcodec, whichever decoder gives the frames) from the same file, and
converted to float32 at ``R`` Hz and ``audio_channels`` channels by libswresample (as
``ffmpeg -ar R -ac C`` converts into 16-bit PCM: stereo to mono is the mean, no mix sums past
1; mono is copied to both channels of stereo).

NOTE [ Where a clip's audio lies ]

A clip's span starts at the presentation time of its first frame and ends where its latest
frame stops being shown (that frame's time plus its duration; with ``short_video="wrap"`` the
latest frame, not the last delivered). Times are the container's own: the video's frame times
as the probe reads them and the audio's sample times (packet timestamps in the audio stream's
time base, after the decoder drops the encoder's priming samples where the file says so, as
FFmpeg's does), one timeline for both. Sample ``n`` of the clip's audio is the sound at
``start + n / R``, on the grid of a decode of the whole track (the run of audio is cut where
the input's and output's sample grids meet before the clip, so that the resampler's phase is
the whole track's). ``audio_len`` counts the samples from the start to the span's end or the
end of the audio track, whichever comes first: silence before the track starts (audio that
starts later than the video) is zeros inside ``audio_len``, past it the buffer is zeros. A file
without an audio stream gives zeros and ``audio_len`` 0. A gap in the timestamps (a packet
later than the samples before it end) stays silent; each stretch of contiguous audio is
resampled on its own, decoded from ``PREROLL_S`` before the clip (a decoder such as AAC's needs
the packet before to decode a packet whole, a resampler's filter some samples before its first
output). The clips of one video read together (a sample's ``K`` clips, the samples decoded in one
pass) whose spans lie within ``_MERGE_S`` of each other are decoded and converted in one window
on the track's sample grid and sliced: each clip's samples are those it would get alone (in
Matroska/WebM to their half millisecond: a stretch read from another seek is timed by other
packets' stamps, below). A packet the decoder refuses inside the span, or the one before it, is
an error naming its time (``on_error``); one further before only starts a new stretch.

Placement is as exact as the file's timestamps: to the sample where the audio's clock is as
fine as its samples (MP4 and MOV, MPEG-TS's 90 kHz, AVI), to half a millisecond in
Matroska/WebM, which stamps packets to the millisecond (FFmpeg seeking there knows no better;
only a decode from the track's start counts the samples). A stretch's start is timed by all its
frames (``_begin``: each frame's timestamp less the samples before it), which narrows it below
a tick where frame lengths are not whole ticks. Bands an AAC encoder coded as noise (PNS) are
random noise in every decoder, and differ between two decodes.

Every sample holds ``S = audio_samples`` samples per clip, the longest span a clip may have:
``ceil(audio_seconds * R)``, where ``audio_seconds`` is given, or ``(clip_len + 1) / fps`` for
``fps=`` clips (``clip_len`` instants ``1/fps`` apart, the first frame starting up to one
frame before the first instant and the last ending up to one after the last), or for
``clip_len``/``frame_step`` clips ``((clip_len - 1) * frame_step + 1)`` frame durations at the
first video's frame rate (probed when the description is made). A clip whose span is longer (a
video slower than that) is an error naming the file: ``audio_seconds`` sets it for a dataset of
several frame rates.

Segments and ``max_frames`` samples spread over the whole video (TSN; the video-LLMs that hear
take N frames over the video and its whole sound, padded or cut to a fixed length, such as a
Whisper encoder's 30 s), whose length varies: they need ``audio_seconds``, which sets ``S``. Such
a sample is one span, placed as a clip's: from its first delivered frame's time to the end of its
latest frame, cut to its ``spans=`` row (as sampling cuts the frames at the row's edges). A span
longer than ``S`` samples is cut there (``audio_len`` is ``S``), not refused: these recipes' videos
vary in length by nature; a shorter one is zeros past ``audio_len``. Segments with
``clips_per_sample=K`` are ``K`` draws over the video: each has its own span, ``[K, S, C]``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple, cast

import numpy as np

from ..engine.source import Spec

__all__ = ["PREROLL_S", "TAIL_S", "audio_spec", "clip_spans", "read_audio", "windows"]

_LAYOUTS = {1: "mono", 2: "stereo"}

# Decoding starts this long before a clip: an AAC or MP3 packet decodes whole only after the one
# before it (overlapping transforms), Opus asks for 80 ms of pre-roll, and the resampler's filter
# reaches back some samples; what is decoded before the clip is dropped.
PREROLL_S = 0.2
# A seek that lands less than half the pre-roll before the clip is tried again this many times,
# each twice as far back, then from the start (byte-based seeking, as in MPEG-TS, can overshoot).
_SEEK_RETRIES = 3
# Decoded past the span's end by this much, for the resampler's filter to see past it.
TAIL_S = 0.05
# Spans this close are decoded together: decoding and converting the second between them costs
# about what a seek, a fresh decoder state and a new converter cost.
_MERGE_S = 1.0
# The converter's output comes in frames of this many samples (a second at 16 kHz): few pulls.
_PULL_SAMPLES = 16384


def audio_spec(clips_per_sample: int, samples: int, channels: int) -> Spec:
    """The fields audio adds to a sample: ``audio`` float32 ``[S, C]`` (``[K, S, C]``) and
    ``audio_len`` int32 (``[K]``)."""
    lead = () if clips_per_sample == 1 else (clips_per_sample,)
    return {"audio": ((*lead, samples, channels), np.dtype(np.float32)),
            "audio_len": (lead, np.dtype(np.int32))}


def clip_spans(times: np.ndarray, frames: np.ndarray, *, within: tuple[float, float] | None = None,
               longest: float | None = None) -> np.ndarray:
    """``[K, 2]`` seconds each clip of ``frames [K, T]`` spans, from the ``[n, 2]`` (start, end)
    ``times`` of the video's frames; a whole-video sample's cut to ``within`` (seconds from the
    first frame's start: its ``spans=`` row) and to ``longest`` seconds from its start (NOTE
    [ Where a clip's audio lies ])."""
    first = times[frames[:, 0], 0]
    last = times[frames.max(axis=1), 1]
    spans = np.stack([first, np.maximum(last, first)], axis=1)
    if within is not None:
        spans = np.clip(spans, times[0, 0] + within[0], times[0, 0] + within[1])
    if longest is not None:
        spans[:, 1] = np.minimum(spans[:, 1], spans[:, 0] + longest)
    return spans


def read_audio(container: Any, spans: np.ndarray, rate: int, outs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The audio of each span ``spans[k]`` (seconds on the container's timeline) at ``rate`` Hz
    into ``outs[k] = (audio [S, C], length)``: zeros past the span, the samples that are real.
    Spans less than ``_MERGE_S`` apart (the clips of a sample, or of a video's samples decoded
    together) are decoded and converted in one go. A container without audio gives zeros and
    length 0; the audio stream's damage raises a ValueError saying the time."""
    import av

    room = outs[0][0].shape[0] if outs else 0
    for (audio, length), (t0, t1) in zip(outs, spans.tolist()):
        audio[...] = 0
        length[...] = 0
        n = round((t1 - t0) * rate)  # the clips' spans, whether the file has sound or not
        if n > room:
            raise ValueError(f"a clip spans {t1 - t0:.3f} s ({n} audio samples at {rate} Hz), more than "
                             f"the {room} a sample holds; pass audio_seconds={t1 - t0:.3f} or more")
    if not container.streams.audio or not outs:
        return
    stream = container.streams.audio[0]
    anchor = 0.0 if stream.start_time is None else float(stream.start_time * Fraction(stream.time_base))
    layout = _LAYOUTS[outs[0][0].shape[-1]]
    for group in windows(spans):
        # On the track's sample grid, so that slicing a clip out rounds once (as decoding it alone).
        w0 = anchor + math.floor((float(spans[group, 0].min()) - anchor) * rate + 1e-6) / rate
        w1 = float(spans[group, 1].max())
        at = [round((spans[k, 0] - w0) * rate) for k in group]
        lengths = [round((spans[k, 1] - spans[k, 0]) * rate) for k in group]
        buf = np.zeros((max(a + n for a, n in zip(at, lengths)), outs[0][0].shape[-1]), np.float32)
        try:
            end = _read_span(container, stream, w0, w1, rate, layout, buf, anchor)
        except av.error.FFmpegError as e:  # the demuxer's, or the converter's
            raise ValueError(f"unreadable audio between {w0:.3f} s and {w1:.3f} s: {e}") from e
        for k, a, n in zip(group, at, lengths):
            audio, length = outs[k]
            audio[:n] = buf[a : a + n]
            length[...] = n if end is None else min(n, max(0, round((end - spans[k, 0]) * rate)))


def windows(spans: np.ndarray) -> list[list[int]]:
    """The spans' indices in groups decoded together: sorted by start, each less than
    ``_MERGE_S`` after the end of the group before."""
    groups: list[list[int]] = []
    end = -math.inf
    for k in np.argsort(spans[:, 0], kind="stable").tolist():
        if not groups or spans[k, 0] - end > _MERGE_S:
            groups.append([])
            end = -math.inf
        groups[-1].append(k)
        end = max(end, float(spans[k, 1]))
    return groups


class _Stretch(NamedTuple):
    """A run of contiguous audio: decoded frames of one format and rate, and the time each starts
    at (seconds on the container's timeline, from its timestamp)."""

    frames: list[Any]
    times: list[float]


class _Decoded(NamedTuple):
    """What the decoding from one seek gives: its stretches in order, and ``track_end``, the time
    the track ends at where that is before the span's end (None: it goes on past the span)."""

    stretches: list[_Stretch]
    track_end: float | None


def _read_span(c: Any, s: Any, t0: float, t1: float, rate: int, layout: str, out: np.ndarray,
               anchor: float) -> float | None:
    """Decode ``s`` around ``[t0, t1)`` and place its samples, resampled, into ``out``; the time
    the track ends at when it ends before ``t1``, else None."""
    tb = Fraction(s.time_base)
    start = None if s.start_time is None else float(s.start_time * tb)
    back = PREROLL_S
    for attempt in range(_SEEK_RETRIES + 2):
        from_start = attempt > _SEEK_RETRIES or (start is not None and t0 - back <= start)
        if from_start:
            _seek_start(c, s)
        else:
            c.seek(_ticks(t0 - back, tb), stream=s, backward=True)
        # A first frame after the stream's start, too late for the clip, means the seek landed
        # late; never so from the start, always where the stream's start is unknown.
        late_after = math.inf if from_start else -math.inf if start is None else start
        got = _stretches(c, s, tb, t0, t1, late_after)
        if got is not None:
            out[...] = 0
            for stretch in got.stretches:
                _place(stretch, tb, rate, layout, t0, anchor, out)
            return got.track_end
        back *= 2  # the seek landed too late: go further back
    raise AssertionError("unreachable: the last attempt decodes from the start")


def _stretches(c: Any, s: Any, tb: Fraction, t0: float, t1: float, late_after: float) -> _Decoded | None:
    """The frames decoded from where ``c`` stands to past ``t1``, as stretches of contiguous
    audio (a gap in the timestamps, a change of format or a damaged packet starts another); None
    when the first frame comes too late for the clip and after ``late_after``: seek further back."""
    stretches: list[_Stretch] = []
    key, expected, last_end, slack = None, 0.0, None, 0.0
    num, den = tb.numerator, tb.denominator  # pts * num / den: float(pts * tb), without a Fraction
    for frame in _decoded(c, s):
        if isinstance(frame, _Damage):
            at = None if frame.pts is None else float(frame.pts * tb)
            if at is not None and at >= t1:
                return _Decoded(stretches, None)
            # The packet after a damaged one decodes wrong too (its transform overlaps it).
            reach = PREROLL_S / 2 if not frame.duration else 2 * float(frame.duration * tb) + 0.005
            if at is None or at + reach > t0:  # a packet the clip's samples come from
                where = "" if at is None else f" at {at:.3f} s"
                raise ValueError(f"damaged audio{where}, in the clip's span {t0:.3f}-{t1:.3f} s: "
                                 f"{frame.error}") from frame.error
            key = None  # before the clip: the next frame starts a stretch
            continue
        pts, n = frame.pts, frame.samples
        if pts is None or n == 0:
            continue
        ft = pts * num / den
        if not stretches and ft > t0 - PREROLL_S / 2 and ft > late_after + 1e-3:
            return None
        if ft >= t1 + TAIL_S:
            return _Decoded(stretches, None)  # the track goes on past the span
        sr = frame.sample_rate
        now = (frame.format.name, frame.layout.name, sr)
        if now != key or abs(ft - expected) > slack:
            stretches.append(_Stretch([], []))
            key, expected = now, ft
            # Contiguous within a tick of the stream's clock (Matroska's 1 ms) or two samples.
            slack = max(float(tb) * 1.5, 2.0 / sr)
        stretches[-1].frames.append(frame)
        stretches[-1].times.append(ft)
        expected += n / sr
        last_end = ft + n / sr
    if last_end is None:
        return _Decoded(stretches, t0)  # nothing from the span on: the track ended before it
    return _Decoded(stretches, last_end if last_end < t1 else None)


def _begin(stretch: _Stretch, tb: Fraction) -> float:
    """When a stretch's first sample plays. Each frame's timestamp, less the samples before it,
    says so to within half a tick of the stream's clock; where the clock is coarser than the
    samples (Matroska's milliseconds) the frames together narrow it down. The first frame is
    left out where others speak: after a seek the decoder may drop its first samples (Opus's
    pre-skip) and move its timestamp by a rounded amount."""
    sr = stretch.frames[0].sample_rate
    before = np.cumsum([0] + [f.samples for f in stretch.frames[:-1]]) / sr
    says = np.array(stretch.times) - before
    if len(says) > 1:
        says = says[1:]
    half = float(tb) / 2
    lo, hi = float((says - half).max()), float((says + half).min())
    return (lo + hi) / 2 if lo <= hi else float(np.median(says))


def _place(stretch: _Stretch, tb: Fraction, rate: int, layout: str, t0: float, anchor: float,
           out: np.ndarray) -> None:
    """A stretch of contiguous audio resampled in one go into ``out`` (sample 0 at ``t0``), its
    output on the grid of a decode of the whole track, which starts at ``anchor``."""
    begin = _begin(stretch, tb)
    trimmed = _on_grid(stretch, begin, rate, anchor, t0)
    if trimmed is not None:
        stretch, begin = trimmed, trimmed.times[0]
    written = 0
    for data in _Converter(stretch.frames[0], rate, layout)(stretch.frames):
        m = data.shape[1]  # [C, m]: one channel is copied to both of stereo
        at = round((begin - t0) * rate) + written
        written += m
        lo, hi = max(at, 0), min(at + m, len(out))
        if lo < hi:
            out[lo:hi] = data[:, lo - at : hi - at].T


def _on_grid(stretch: _Stretch, begin: float, rate: int, anchor: float, t0: float) -> _Stretch | None:
    """``stretch`` (playing from ``begin``) without its first frame's first samples, starting
    where the input's and output's sample grids from the track's start meet: the output samples
    are then those of a decode of the whole track (not half a sample off). None to keep it
    whole: a stretch that starts inside the clip keeps all its samples."""
    frame = stretch.frames[0]
    sr = frame.sample_rate
    step = 1.0 / math.gcd(sr, rate)  # the grids meet every `step` seconds
    target = anchor + math.ceil((begin - anchor) / step - 1e-9) * step
    drop = round((target - begin) * sr)
    if drop <= 0 or drop >= frame.samples or target > t0:
        return None
    import av

    data = frame.to_ndarray()
    cut = data[:, drop:] if frame.format.is_planar else data[:, drop * len(frame.layout.channels):]
    trimmed = av.AudioFrame.from_ndarray(np.ascontiguousarray(cut), format=frame.format.name,
                                         layout=frame.layout.name)
    trimmed.sample_rate = sr
    return _Stretch([trimmed, *stretch.frames[1:]], [target, *stretch.times[1:]])


class _Damage:
    """A packet the decoder refused, at ``pts`` for ``duration`` (the stream's time base, or None)."""

    def __init__(self, pts: int | None, duration: int | None, error: Exception) -> None:
        self.pts, self.duration, self.error = pts, duration, error


class _Converter:
    """``aresample`` then ``aformat`` in a libavfilter graph: a frame's rate, format and layout
    to float planar at ``rate`` Hz in ``layout``, mixed by libswresample's matrix normalised so
    that no output sums its inputs past 1 (stereo to mono: the mean, as ``ffmpeg -ac 1`` mixes
    into an integer format); one channel is kept one (``_place`` copies it to both of stereo:
    libswresample would lower it 3 dB). A stretch's frames in, ``[C, m]`` arrays out."""

    def __init__(self, frame: Any, rate: int, layout: str) -> None:
        import av

        from ._av import filter_graph

        one = len(frame.layout.channels) == 1
        g = filter_graph()
        chain = [g.add("abuffer", sample_rate=str(frame.sample_rate), sample_fmt=frame.format.name,
                       channel_layout=frame.layout.name, time_base=f"1/{frame.sample_rate}"),
                 g.add("aresample", osr=str(rate), rematrix_maxval="1"),
                 g.add("aformat", sample_fmts="fltp", sample_rates=str(rate),
                       channel_layouts="mono" if one else layout),
                 g.add("abuffersink")]
        for a, b in zip(chain, chain[1:]):
            a.link_to(b)
        g.configure()
        g.set_audio_frame_size(_PULL_SAMPLES)
        self._graph, self._source, self._sink = g, chain[0], cast(Any, chain[-1])
        self._done = (av.error.BlockingIOError, av.error.EOFError, EOFError)

    def __call__(self, frames: list[Any]) -> list[np.ndarray]:
        """Every frame pushed, then the end, then the output pulled: the graph queues what it is
        given and converts on the pull, in the sink's large frames rather than one per frame
        pushed (the samples are the same, the calls and arrays fewer)."""
        for frame in frames:
            frame.pts = None  # placed by the run's sample count, not by the filter's clock
            self._source.push(frame)
        self._source.push(None)
        out = []
        while True:
            try:
                out.append(self._sink.pull().to_ndarray())
            except self._done:
                return out


def _decoded(c: Any, s: Any):
    """The frames of ``s`` from where ``c`` stands, and a :class:`_Damage` for each packet the
    decoder refuses (the decoding goes on after it)."""
    import av

    for packet in c.demux(s):
        try:
            frames = packet.decode()
        except av.error.FFmpegError as e:
            yield _Damage(packet.pts, packet.duration, e)
            continue
        yield from frames


def _seek_start(c: Any, s: Any) -> None:
    """To the stream's start: below its first timestamp (seeking to the first one itself can
    land late where seeking is byte-based, MPEG-TS), or to 0 where the demuxer refuses a time
    before the start (AVI)."""
    import av

    try:
        c.seek(min(0, (s.start_time or 0) - 1), stream=s, backward=True)
    except av.error.FFmpegError:
        c.seek(0, stream=s, backward=True)


def _ticks(seconds: float, tb: Fraction) -> int:
    return math.floor(seconds / tb)
