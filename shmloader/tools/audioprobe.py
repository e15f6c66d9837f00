"""What a file's audio stream is, for ``shmloader scan``'s manifest: codec, sample rate,
channels, and where its sound lies on the video's timeline.

``audio_start`` is the time of the track's first decoded sample less the presentation time of
the video's first frame, the zero the loader places a clip's audio by (NOTE [ Where a clip's
audio lies ] in ``video.audio``): the same container timestamps, read the same way (packet
timestamps after the decoder drops the encoder's priming where the file says so). Positive:
the sound starts after the first frame (silence before it in the clips); negative: before it.
``audio_seconds`` runs from that first sample to the end of the last decoded frame, where the
loader's ``audio_len`` stops counting. Only the first few packets and the last second of the
track are decoded: the end is found by seeking there, or by decoding the whole track where the
container cannot seek or says no duration. A scan deeper than ``check="headers"`` decodes
the whole track (every audio packet is a keyframe), and the first packet the decoder refuses is
a problem, ``damaged audio at T s`` (T on the container's timeline, as the loader's error says
it).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterator

from ..video.media import Media
from ..video.probe import VideoInfo, probe
from ..video.storage import Storage

__all__ = ["AUDIO_COLUMNS", "audio_cells", "with_audio"]

AUDIO_COLUMNS = ("audio_codec", "audio_rate", "audio_channels", "audio_start", "audio_seconds")

# The end is looked for from this far before the track's stated end: past a Matroska cue's
# spacing and an AAC decoder's need for the packet before.
_TAIL_S = 1.0


def audio_cells(media: Media, info: VideoInfo, storage: Storage,
                whole: bool = False) -> tuple[dict[str, Any], str]:
    """(the audio columns of the file ``info`` was probed from, a problem or ""); every cell
    empty for a file without an audio stream. ``whole``: every packet decoded, not only the
    track's ends, and a packet the decoder refuses is the problem ``damaged audio at T s``."""
    import av

    from ..video._av import open_input

    cells: dict[str, Any] = dict.fromkeys(AUDIO_COLUMNS, "")
    with open_input(storage.media(media)) as c:
        if not c.streams.audio:
            return cells, ""
        s = c.streams.audio[0]
        cc = s.codec_context
        cells.update(audio_codec=getattr(cc.codec, "canonical_name", cc.name), audio_rate=cc.sample_rate,
                     audio_channels=len(cc.layout.channels))
        damage: list[float] = []
        try:
            span = _span(c, s, whole, damage)
        except av.error.FFmpegError as e:  # the demuxer's: the track cannot be read to its end
            why = storage.redact(" ".join(str(getattr(e, "strerror", None) or e).split()))
            return cells, f"damaged audio: {why[:200]}"
        if span is not None:
            zero = _video_zero(c, info)
            cells.update(audio_start=_seconds(span[0] - zero), audio_seconds=_seconds(span[1] - span[0]))
    return cells, f"damaged audio at {min(damage):.3f} s" if damage and whole else ""


def with_audio(row: dict, storage: Storage) -> dict:
    """An earlier run's row of a scan from before the audio columns, with them: its file's
    video timeline probed from the headers (a quick probe), and its audio read as a scan does.
    A row the scan found unreadable gets them empty."""
    empty = dict.fromkeys(AUDIO_COLUMNS, "")
    if str(row["problem"]).startswith("unreadable"):
        return dict(row, **empty)
    try:
        media = storage.resolve(row["path"])
        cells, why = audio_cells(media, probe(media, storage=storage), storage)
    except Exception:  # readable once, not now: the row says what the scan found, the audio nothing
        return dict(row, **empty)
    return dict(row, **cells, problem="; ".join(p for p in (row["problem"], why) if p))


def _video_zero(c: Any, info: VideoInfo) -> float:
    """Seconds of the video's first frame on the container's timeline (``Decoding.timeline``'s
    zero): the probe's first timestamp, or, for a video timed by its frame rate, its stream's start."""
    if info.pts is not None:
        return float(info.pts[0] * info.time_base)
    v = c.streams.video[0] if c.streams.video else None
    return 0.0 if v is None or v.start_time is None else float(v.start_time * Fraction(v.time_base))


def _span(c: Any, s: Any, whole: bool, damage: list[float]) -> tuple[float, float] | None:
    """(the first decoded sample's time, the end of the last decoded frame) of the stream ``s``,
    in seconds; None where no frame decodes. The times of the packets the decoder refuses go
    into ``damage``; ``whole``: every packet is decoded."""
    frames = _frames(c, s, damage)
    first = next((t for t, _ in frames), None)
    if first is None:
        return None
    if whole:
        end = _last_end(frames)
        return first, max(first, end if end is not None else first)
    tb = Fraction(s.time_base)
    stated = _stated_end(c, s, tb)
    end = None
    if stated is not None and stated - _TAIL_S > first:
        try:
            c.seek(math.floor((stated - _TAIL_S) / tb), stream=s, backward=True)
            end = _last_end(_frames(c, s, damage))
        except Exception:
            end = None  # a container that cannot seek there: from the start
    if end is None:
        c.seek(min(0, (s.start_time or 0) - 1), stream=s, backward=True)
        end = _last_end(_frames(c, s, damage))
    return first, max(first, end if end is not None else first)


def _stated_end(c: Any, s: Any, tb: Fraction) -> float | None:
    """Where the container says the track ends (its stream's or, failing that, its own duration)."""
    start = float(s.start_time * tb) if s.start_time is not None else 0.0
    if s.duration:
        return start + float(s.duration * tb)
    return c.duration / 1e6 if c.duration else None


def _last_end(frames: Iterator[tuple[float, float]]) -> float | None:
    end = None
    for t, seconds in frames:
        end = t + seconds
    return end


def _frames(c: Any, s: Any, damage: list[float]) -> Iterator[tuple[float, float]]:
    """(time, seconds) of each frame of ``s`` decoded from where ``c`` stands; a packet the
    decoder refuses is passed over, its time put in ``damage``."""
    import av

    tb = Fraction(s.time_base)
    for packet in c.demux(s):
        try:
            frames = packet.decode()
        except av.error.FFmpegError:
            if packet.pts is not None:
                damage.append(float(packet.pts * tb))
            continue
        for frame in frames:
            if frame.pts is not None and frame.samples:
                yield float(frame.pts * tb), frame.samples / frame.sample_rate


def _seconds(x: float) -> str:
    """Seconds to the microsecond, without trailing zeros (``0.376009``, ``2``, ``-0.1``)."""
    return f"{round(x, 6) + 0.0:.6f}".rstrip("0").rstrip(".")
