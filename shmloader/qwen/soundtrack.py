"""A video's sound track whole, as a speech encoder takes it: every sample FFmpeg decodes from the
first audio stream, from its first decoded sample (not placed on the video's timeline), as 16-bit
samples (what ``ffmpeg -f s16le`` writes), averaged to mono, then resampled with soxr's high
quality (librosa's ``soxr_hq``): what qwen-omni-utils' ``process_audio_info`` gives for a video
with ``use_audio_in_video`` (``librosa.load`` over ``audioread``'s FFmpeg reader), ``offset`` and
``duration`` counted in the track's own samples as ``librosa.load`` counts them.
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..video.storage import Storage

__all__ = ["bound", "read_track"]


def bound(duration: float, rate: int) -> int:
    """Samples at ``rate`` that a track no longer than the container's ``duration`` seconds can
    give (a margin for the encoder's last frame)."""
    return math.ceil((max(duration, 0.0) + 0.05) * rate) + 1


def read_track(path: str, rate: int, start: float | None = None, end: float | None = None,
               storage: Storage | None = None) -> np.ndarray:
    """float32 mono samples at ``rate`` Hz of ``path``'s first audio stream, ``[start, end)``
    seconds from its first decoded sample (None: from the start, to the end); a ValueError
    where the file has no sound. ``storage``: how a remote ``path`` is read (by byte range)."""
    import av
    import soxr

    with av.open(path if storage is None else storage.media(path)) as container:
        if not container.streams.audio:
            raise ValueError("the video has no audio stream (Qwen-Omni's use_audio_in_video needs one)")
        stream = container.streams.audio[0]
        native = stream.codec_context.sample_rate
        # The track's length as the container states it (an MP4 edit list's, without the encoder's
        # padding at the end, which FFmpeg's command line drops and a plain decode keeps).
        stated = None if not stream.duration else round(float(stream.duration * stream.time_base) * native)
        resampler = av.AudioResampler(format="s16", layout=stream.codec_context.layout.name, rate=native)
        parts = []
        for frame in container.decode(stream):
            parts += [out.to_ndarray().reshape(-1, len(out.layout.channels)) for out in resampler.resample(frame)]
        parts += [out.to_ndarray().reshape(-1, len(out.layout.channels)) for out in resampler.resample(None)]
    pcm = np.concatenate(parts) if parts else np.zeros((0, 1), np.int16)
    if stated is not None:
        pcm = pcm[:stated]
    mono = (pcm.astype(np.float32) / 32768).mean(axis=1)  # librosa's buf_to_float, then to_mono
    first = 0 if start is None else int(np.round(native * start))
    last = len(mono) if end is None else first + int(np.round(native * (end - (start or 0.0))))
    mono = mono[first:last]
    if native == rate:
        same: np.ndarray = mono.astype(np.float32)
        return same
    n = int(np.ceil(len(mono) * rate / native))  # librosa.resample's length
    out: np.ndarray = np.asarray(soxr.resample(mono, native, rate, quality="soxr_hq"), np.float32)
    return np.pad(out, (0, max(0, n - len(out))))[:n]
