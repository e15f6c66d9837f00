"""Video files with sound for the audio tests, written with PyAV, and the references their clips'
audio is checked against.

The videos carry a 441 Hz tone whose amplitude changes at every video frame (frame ``i``:
``_level(i)``), so that audio placed one frame off shows in the levels, and audio half a sample
off shows against a decode of the whole track."""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np

from shmloader.video.samples import frame_image

from ._needs import written_apart

FPS = 25
FRAMES = 50
RATE = 16000  # what the loader delivers
_TONE = 441.0


def _level(i: np.ndarray | int) -> np.ndarray:
    """Frame ``i``'s amplitude: consecutive frames differ by at least 0.1 (a ratio of 1.2 or more)."""
    return 0.05 + 0.05 * ((7 * np.asarray(i)) % 11)


def _signal(t: np.ndarray, channels: int) -> np.ndarray:
    """``[channels, n]`` samples at times ``t``: the tone at the level of the frame on screen;
    the right channel at half the left's amplitude."""
    x = _level(np.floor(t * FPS + 1e-9).astype(np.int64)) * np.sin(2 * np.pi * _TONE * t)
    return np.stack([x, 0.5 * x][:channels]).astype(np.float32)


_FORMATS = {"aac": "fltp", "libmp3lame": "fltp", "libopus": "flt", "pcm_s16le": "s16", "vorbis": "fltp"}
# WebM holds VP8/VP9 (and AV1) only: its files get VP9 frames, the others H.264.
_VIDEO = {"webm": ("libvpx-vp9", {"crf": "20", "b": "0", "deadline": "realtime", "cpu-used": "8"})}
_H264 = ("libx264", {"crf": "18", "preset": "veryfast"})


def write_av(path, codec: str = "aac", rate: int = 44100, channels: int = 2, frames: int = FRAMES,
             audio_from: float = 0.0, audio_to: float | None = None, video_from: float = 0.0,
             gop: int | None = None, gap: tuple[float, float] | None = None) -> str:
    """Frames 0..frames-1 (frame codes of video 1; H.264, VP9 in WebM) shown from ``video_from``
    seconds (a whole number of frames: frame ``i`` at ``video_from + i / FPS``, the tone's level
    there ``_level(i + video_from * FPS)``), and ``codec`` audio from ``audio_from`` to
    ``audio_to`` seconds (the video's end), written with PyAV. ``gop``: H.264 with a keyframe
    every ``gop`` frames exactly (else x264's choice). ``gap``: no audio from ``gap[0]`` to
    ``gap[1]`` seconds (the packets after it stamped from ``gap[1]``)."""
    path = os.fspath(path)
    video = _VIDEO.get(path.rsplit(".", 1)[-1], _H264)[0]
    return written_apart(video, _write_av, path, codec, rate, channels, frames, audio_from, audio_to, video_from, gop,
                         gap)


def _write_av(path: str, codec: str, rate: int, channels: int, frames: int, audio_from: float,
              audio_to: float | None, video_from: float, gop: int | None, gap: tuple[float, float] | None) -> str:
    lead = round(video_from * FPS)
    end = (lead + frames) / FPS if audio_to is None else audio_to
    fmt = _FORMATS[codec]
    with av.open(path, "w") as c:
        name, options = _VIDEO.get(path.rsplit(".", 1)[-1], _H264)
        v = c.add_stream(name, rate=FPS)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        v.options = dict(options)
        if gop is not None:
            v.options = {**v.options, "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
        a = c.add_stream(codec, rate=rate)
        a.layout = "stereo" if channels == 2 else "mono"
        if codec == "aac":  # noise substitution: random noise in any decoder, other after a seek
            a.options = {"aac_pns": "0"}
        if codec == "vorbis":  # FFmpeg's own Vorbis encoder (libvorbis is not in PyAV's wheels)
            a.options = {"strict": "experimental"}
        first, total, chunk = round(audio_from * rate), round((end - audio_from) * rate), 1000
        done, shown = 0, 0
        while done < total or shown < frames:
            if done < total and gap is not None and gap[0] * rate <= first + done < gap[1] * rate:
                done = min(total, round(gap[1] * rate) - first)  # the packets after it start there
                continue
            if done < total:
                m = min(chunk, total - done)
                if gap is not None and first + done < gap[0] * rate:
                    m = min(m, round(gap[0] * rate) - first - done)
                x = _signal((first + done + np.arange(m)) / rate, channels)
                arr = x if fmt == "fltp" else x.T.reshape(1, -1)
                if fmt == "s16":
                    arr = (arr * 32767).astype(np.int16)
                f = av.AudioFrame.from_ndarray(np.ascontiguousarray(arr), format=fmt, layout=a.layout.name)
                f.sample_rate, f.time_base, f.pts = rate, Fraction(1, rate), first + done
                for p in a.encode(f):
                    c.mux(p)
                done += m
            reached = (first + done) / rate if done < total else float("inf")
            while shown < frames and (lead + shown) / FPS <= reached:
                img = av.VideoFrame.from_ndarray(frame_image(1, shown, 48, 64), format="rgb24")
                img.pts, img.time_base = lead + shown, Fraction(1, FPS)
                for p in v.encode(img):
                    c.mux(p)
                shown += 1
        for p in a.encode():
            c.mux(p)
        for p in v.encode():
            c.mux(p)
    return path


def _convert(frames: list, rate: int, channels: int) -> np.ndarray:
    """``frames`` as one stretch through libswresample (``aresample=osr=R:rematrix_maxval=1``, as
    ``ffmpeg -ar R -ac C`` into 16-bit PCM mixes), ``[n, C]`` float."""
    first = frames[0]
    g = av.filter.Graph()
    chain = [g.add("abuffer", sample_rate=str(first.sample_rate), sample_fmt=first.format.name,
                   channel_layout=first.layout.name, time_base=f"1/{first.sample_rate}"),
             g.add("aresample", osr=str(rate), rematrix_maxval="1"),
             g.add("aformat", sample_fmts="fltp", sample_rates=str(rate),
                   channel_layouts="mono" if channels == 1 else "stereo"),
             g.add("abuffersink")]
    for a, b in zip(chain, chain[1:]):
        a.link_to(b)
    g.configure()
    out = []
    for f in [*frames, None]:
        if f is not None:
            f.pts = None
        g.push(f)
        while True:
            try:
                out.append(g.pull().to_ndarray())
            except (av.error.BlockingIOError, av.error.EOFError, EOFError):
                break
    return np.concatenate(out, axis=1).T


def reference(path, rate: int = RATE, channels: int = 1) -> tuple[float, np.ndarray]:
    """(time of its first sample, ``[n, C]`` samples): the whole audio track decoded by PyAV from
    its start and converted in one go."""
    with av.open(os.fspath(path)) as c:
        s = c.streams.audio[0]
        frames = list(c.decode(s))
        t0 = float(frames[0].pts * s.time_base)
    return t0, _convert(frames, rate, channels)


def expected(ref: tuple[float, np.ndarray], start: float, n: int, rate: int = RATE) -> np.ndarray:
    """The reference's ``n`` samples from ``start`` seconds, zeros where it has none."""
    t_ref, samples = ref
    at = round((start - t_ref) * rate)
    out = np.zeros((n, samples.shape[1]), np.float32)
    lo, hi = max(at, 0), min(at + n, len(samples))
    if lo < hi:
        out[lo - at : hi - at] = samples[lo:hi]
    return out


def best_lag(got: np.ndarray, want_at, n: int, slack: int) -> tuple[int, float]:
    """The shift (samples) within ``slack`` that makes ``got`` closest to the reference, and the
    largest difference there."""
    tries = [(lag, float(np.abs(got[:n] - want_at(lag)).max())) for lag in range(-slack, slack + 1)]
    return min(tries, key=lambda t: t[1])


def frame_levels(audio: np.ndarray, frames: np.ndarray, first: int, rate: int = RATE) -> np.ndarray:
    """RMS of the first channel over each frame of ``frames`` (video frame numbers), 2 ms from
    its edges, the clip's audio starting at frame ``first``."""
    out = []
    for f in frames:
        lo = round((f - first) / FPS * rate + 0.002 * rate)
        hi = round((f - first + 1) / FPS * rate - 0.002 * rate)
        out.append(np.sqrt(np.mean(audio[lo:hi, 0] ** 2)))
    return np.array(out)


def assert_levels_follow_frames(audio: np.ndarray, frames: np.ndarray, first: int) -> None:
    """The tone's level over each frame is that frame's (to a common gain: the mix): a clip's
    audio one frame early or late fails."""
    ratio = frame_levels(audio, frames, first) / _level(frames)
    # Lossy codecs move a frame's level by up to ~8 %; neighbouring frames differ by 30 % or more.
    assert np.abs(ratio / np.median(ratio) - 1).max() < 0.15, ratio


def video_start(path) -> float:
    """Seconds the video stream starts at (MPEG-TS muxers start later than 0)."""
    with av.open(os.fspath(path)) as c:
        s = c.streams.video[0]
        return 0.0 if s.start_time is None else float(s.start_time * s.time_base)

