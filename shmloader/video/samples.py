"""Synthetic sample videos whose frames say who they are.

Every frame is a 4 x 8 grid of cells; each cell is light (bit 1) or dark (bit 0). Rows 0-1
hold the frame number, rows 2-3 the video id, 16 bits each, most significant bit first. The
cells are large enough to survive H.264/MPEG-4 compression and resizing down to 32 x 32, so
tests (and users) can check exactly which frames of which video arrived. Writing needs PyAV
(the ``samples`` extra); reading the codes needs numpy only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["make_videos", "write_video", "read_codes", "frame_image"]

_ROWS, _COLS = 4, 8
_BITS = 16


def frame_image(video_id: int, frame: int, height: int, width: int) -> np.ndarray:
    """The RGB frame ``frame`` of video ``video_id``."""
    bits = [(frame >> (_BITS - 1 - i)) & 1 for i in range(_BITS)]
    bits += [(video_id >> (_BITS - 1 - i)) & 1 for i in range(_BITS)]
    grid = np.array(bits, dtype=bool).reshape(_ROWS, _COLS)
    hue = np.array([(video_id * 67) % 256, (video_id * 151 + 80) % 256, (video_id * 37 + 160) % 256])
    light = 160 + hue // 4  # luma well above 128 whatever the tint
    dark = hue // 6  # and well below
    ys = np.arange(height) * _ROWS // height
    xs = np.arange(width) * _COLS // width
    cells = grid[ys[:, None], xs[None, :]]
    return np.where(cells[..., None], light, dark).astype(np.uint8)


def read_codes(video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(video ids, frame numbers) of frames ``[..., H, W, 3]`` written by :func:`write_video`."""
    video = np.asarray(video)
    h, w = video.shape[-3:-1]
    ys = ((np.arange(_ROWS) + 0.5) * h / _ROWS).astype(int)
    xs = ((np.arange(_COLS) + 0.5) * w / _COLS).astype(int)
    luma = video[..., ys[:, None], xs[None, :], :].astype(np.float32).mean(-1)
    bits = (luma > 100).reshape(*video.shape[:-3], _ROWS * _COLS).astype(np.int64)
    weights = 1 << np.arange(_BITS - 1, -1, -1, dtype=np.int64)
    frames = (bits[..., :_BITS] * weights).sum(-1)
    ids = (bits[..., _BITS:] * weights).sum(-1)
    return ids, frames


# The sound of ``audio=True``: AAC, mono, at this rate; video i's tone is 440 + 20 i Hz.
_AUDIO_RATE = 16000


def write_video(path: str | os.PathLike[str], video_id: int, frames: int = 48, size: tuple[int, int] = (96, 128),
                codec: str = "libx264", fps: int = 25, gop: int | None = None, audio: bool = False) -> str:
    """Write one synthetic video with a real codec (``libx264`` or ``mpeg4``).

    ``gop``: one keyframe every ``gop`` frames exactly (frames 0, gop, 2 * gop...), as long-GOP
    phone and web videos have; None leaves it to the encoder (x264: at most 250 frames apart, and
    at any scene cut it detects; FFmpeg's mpeg4: every 12 frames). ``audio``: a sound track too,
    as long as the video, a tone of ``440 + 20 * video_id`` Hz (AAC, mono, 16 kHz).
    """
    import av

    from ._av import encodes_beside_decord, require

    if gop is not None and (not isinstance(gop, int) or isinstance(gop, bool) or gop < 1):
        raise ValueError(f"gop must be a positive number of frames, got {gop!r}")
    _check_size(size, codec)
    require(encodes_beside_decord(codec), f"writing {codec} video in a process that imported decord "
            "(PyAV's FFmpeg sharing decord2's codec libraries)")
    h, w = size
    path = os.fspath(path)
    with av.open(path, "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        if codec == "libx264":
            options = {"crf": "18", "preset": "veryfast"}
            if gop is not None:
                # keyint_min = g and no scene-cut detection: keyframes at multiples of gop only.
                options.update(g=str(gop), keyint_min=str(gop), sc_threshold="0")
            stream.options = options
        else:
            stream.bit_rate = 4_000_000
            if gop is not None:
                stream.codec_context.gop_size = gop
        sound = container.add_stream("aac", rate=_AUDIO_RATE, layout="mono") if audio else None
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_image(video_id, i, h, w), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _write_tone(av, container, sound, 440.0 + 20 * video_id, frames / fps)
    return path


def _write_tone(av: Any, container: Any, stream: Any, hz: float, seconds: float) -> None:
    """``seconds`` of a sine at ``hz`` into the audio ``stream``, in AAC's 1024-sample frames."""
    n = round(seconds * _AUDIO_RATE)
    wave = (0.5 * np.sin(2 * np.pi * hz * np.arange(n) / _AUDIO_RATE)).astype(np.float32)
    for at in range(0, n, 1024):
        part = wave[None, at:at + 1024]
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(part), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = _AUDIO_RATE, at
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def _check_size(size: tuple[int, int], codec: str) -> None:
    """ValueError in words for a size the encoder refuses (its own error is a bare avcodec_open2)."""
    h, w = size
    if min(h, w) < 1:
        raise ValueError(f"size {h}x{w}: height and width must be at least 1")
    if codec == "libx264" and (h % 2 or w % 2):  # 4:2:0 chroma halves both sides
        raise ValueError(f"size {h}x{w}: libx264 in yuv420p takes even heights and widths only "
                         f"(e.g. {h + h % 2}x{w + w % 2}), or choose codec mpeg4")


def make_videos(folder: str | os.PathLike[str], count: int = 8, frames: int = 48, size: tuple[int, int] = (96, 128),
                codec: str = "libx264", classes: int = 2, fps: int = 25,
                gop: int | None = None, audio: bool = False) -> tuple[list[str], list[int]]:
    """Write ``count`` videos ``video_000.mp4``... (skipping those already there); return paths, labels.

    Video ``i`` has id ``i`` in its frame codes and label ``i % classes``. ``fps``, ``gop``
    (keyframe interval) and ``audio`` (a tone for sound) go to :func:`write_video`; non-default
    values are part of the file name.
    """
    _check_size(size, codec)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, labels = [], []
    for i in range(count):
        extra = (f"_{fps}fps" if fps != 25 else "") + (f"_gop{gop}" if gop is not None else "") \
            + ("_audio" if audio else "")
        p = folder / f"video_{i:03d}_{frames}f_{size[0]}x{size[1]}_{codec}{extra}.mp4"
        if not p.exists():
            tmp = p.with_suffix(".tmp.mp4")
            write_video(tmp, i, frames, size, codec, fps, gop, audio)
            os.replace(tmp, p)
        paths.append(str(p))
        labels.append(i % classes)
    return paths, labels
