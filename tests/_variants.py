"""Files as they turn up in real datasets, written with PyAV from frame-code videos, and the
reference every loader frame is checked against: a sequential libavformat decode of the file.

The reference is written here, apart from the loader's decoders: PyAV's own ``reformat``
(bicubic) scales, ``np.rot90`` turns frames as the container's rotation asks (as ``ffmpeg``
and players do), and frame ``i`` is simply the ``i``-th frame the decoder puts out.
"""

from __future__ import annotations

import fractions
import os
import subprocess

import av
import numpy as np

from shmloader.video.samples import frame_image, read_codes, write_video

FPS = 25
GOP = 12
# av 17.1's VideoStream.set_display_rotation (a stream's attributes reach its codec context's).
WRITES_ROTATION = hasattr(av.video.stream.VideoStream, "set_display_rotation")


def _remux(src: str, dst: str, edit=None, rotation: int = 0, fmt: str | None = None) -> str:
    """Copy the video packets of ``src`` into ``dst``; ``edit(packet)`` may change timestamps.
    ``rotation``: the display rotation (degrees counter-clockwise) the container tags the stream
    with; where PyAV cannot write one (``set_display_rotation`` came in av 17.1), the FFmpeg
    command line of imageio-ffmpeg copies the packets with that tag instead."""
    if rotation and not WRITES_ROTATION:
        import imageio_ffmpeg

        plain = _remux(src, dst + ".plain" + os.path.splitext(dst)[1], edit=edit, fmt=fmt)
        subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-display_rotation", str(rotation),
                        "-i", plain, "-c", "copy", *(["-f", fmt] if fmt else []), dst], check=True)
        os.remove(plain)
        return dst
    with av.open(src) as i, av.open(dst, "w", format=fmt) as o:
        s = i.streams.video[0]
        out = o.add_stream_from_template(s)
        if rotation:
            out.set_display_rotation(rotation)
        for p in i.demux(s):
            if p.dts is None:
                continue
            if edit is not None:
                edit(p, s.time_base)
            p.stream = out
            o.mux(p)
    return dst


def _encoder(size: tuple[int, int]):
    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = size[1], size[0], "yuv420p"
    cc.time_base, cc.framerate = fractions.Fraction(1, FPS), FPS
    cc.options = {"crf": "18", "preset": "veryfast", "g": str(GOP), "keyint_min": str(GOP), "sc_threshold": "0"}
    return cc


def two_sizes(path: str, video_id: int, sizes=((96, 128), (72, 160)), frames: int = 30) -> str:
    """One H.264 stream whose frame size changes at frame ``frames`` (joined segments): each
    segment's encoder sends its own SPS in band."""
    with av.open(path, "w") as dst:
        o = dst.add_stream("libx264", rate=FPS)
        o.width, o.height, o.pix_fmt = sizes[0][1], sizes[0][0], "yuv420p"
        n = 0
        for size in sizes:
            cc = _encoder(size)
            packets = []
            for i in range(frames):
                f = av.VideoFrame.from_ndarray(frame_image(video_id, n + i, *size), format="rgb24")
                f = f.reformat(format="yuv420p")
                f.pts = n + i
                packets += cc.encode(f)
            packets += cc.encode(None)
            for p in packets:
                p.stream, p.time_base = o, fractions.Fraction(1, FPS)
                dst.mux(p)
            n += frames
    return path


def write_variants(folder) -> dict[str, tuple[str, int]]:
    """{name: (path, video id)} of every variant, in ``folder``."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    j = lambda name: os.path.join(folder, name)  # noqa: E731
    plain = write_video(j("plain.mp4"), 1, frames=60, size=(96, 128), fps=FPS, gop=GOP)
    cut = 13  # frames before the edit list's start, as `ffmpeg -ss 0.52 -c copy` leaves them

    def shift(p, tb):
        d = int(round(cut / FPS / tb))
        p.pts, p.dts = p.pts - d, p.dts - d

    gap_at, gap = 30, 10  # frames 30.. start 10 frame durations late

    def hole(p, tb):
        if p.pts >= int(round(gap_at / FPS / tb)):
            d = int(round(gap / FPS / tb))
            p.pts, p.dts = p.pts + d, p.dts + d

    src2 = write_video(j("src2.mp4"), 2, frames=60, size=(96, 128), fps=FPS, gop=GOP)
    src4 = write_video(j("src4.mp4"), 4, frames=60, size=(96, 128), fps=FPS, gop=GOP)
    src5 = write_video(j("src5.mp4"), 5, frames=60, size=(96, 128), fps=FPS, gop=GOP)
    variants = {
        "plain": (plain, 1),
        "edit_list": (_remux(src2, j("edit_list.mp4"), edit=shift), 2),
        "mpegts": (write_video(j("stream.ts"), 3, frames=60, size=(96, 128), fps=FPS, gop=GOP), 3),
        "rotation": (_remux(src4, j("rotated.mp4"), rotation=90), 4),
        "timestamp_gap": (_remux(src5, j("gap.mkv"), edit=hole), 5),
        "size_change": (two_sizes(j("two_sizes.mkv"), 6), 6),
    }
    for p in (src2, src4, src5):
        os.remove(p)
    return variants


def textured(path: str, video_id: int, frames: int = 60, size=(96, 128), gop: int = 30,
             bframes: int | None = None) -> str:
    """A frame-code video over a panning noise texture: inter frames carry real residuals, so
    damage in one frame spreads to the frames decoded from it, as in camera footage.
    ``bframes``: B-frames between references (None: x264's choice, up to 3)."""
    h, w = size
    rng = np.random.default_rng(video_id)
    texture = np.kron(rng.integers(0, 256, ((h + frames) // 4 + 2, (w + frames) // 4 + 2, 3)),
                      np.ones((4, 4, 1))).astype(np.float32)
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"crf": "18", "preset": "veryfast", "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0",
                     **({} if bframes is None else {"bf": str(bframes)})}
        for i in range(frames):
            image = frame_image(video_id, i, h, w) + 0.25 * (texture[i // 2 : i // 2 + h, i : i + w] - 128)
            image += rng.normal(0.0, 3.0, image.shape)
            for p in s.encode(av.VideoFrame.from_ndarray(image.clip(0, 255).astype(np.uint8), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def damage(src: str, dst: str, at: float = 0.6, length: int = 600, seed: int = 1) -> str:
    """``src`` (an MP4) with ``length`` random bytes written over its frame data (the ``mdat``
    box) at ``at`` of the way through."""
    data = bytearray(open(src, "rb").read())
    box = data.index(b"mdat") - 4
    size = int.from_bytes(data[box : box + 4], "big")
    start = box + 8 + int((size - 8 - length) * at)
    data[start : start + length] = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()
    with open(dst, "wb") as f:
        f.write(data)
    return dst


def reference(path: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """Every frame a sequential decode shows, turned for display, at ``size`` (None: the first
    frame's size as shown); ``[n, h, w, 3]``."""
    out = []
    with av.open(path) as c:
        for f in c.decode(video=0):
            turns = int(round(f.rotation / 90)) % 4
            if size is None:
                size = (f.width, f.height) if turns % 2 else (f.height, f.width)
            h, w = size
            sh, sw = (w, h) if turns % 2 else (h, w)
            img = f.reformat(width=sw, height=sh, format="rgb24", interpolation="BICUBIC").to_ndarray()
            out.append(np.rot90(img, turns))
    return np.stack(out)


def codes(video: np.ndarray, rotation: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, frame numbers) of frames shown turned by ``rotation`` degrees."""
    video = np.asarray(video)
    if rotation:
        video = np.rot90(video, -(rotation // 90), axes=(-3, -2))
    return read_codes(video)


def variable_rate(path: str, video_id: int, durations_ms, size=(96, 128)) -> str:
    """A frame-code H.264 video whose frame ``i`` lasts ``durations_ms[i]`` milliseconds (a
    variable frame rate, as phone cameras record): timestamps in a 1/1000 s time base."""
    h, w = size
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.time_base = s.codec_context.time_base = fractions.Fraction(1, 1000)
        s.options = {"crf": "18", "preset": "veryfast", "g": str(GOP), "keyint_min": str(GOP), "sc_threshold": "0"}
        t = 0
        for i, d in enumerate(durations_ms):
            f = av.VideoFrame.from_ndarray(frame_image(video_id, i, h, w), format="rgb24")
            f.pts, f.time_base = t, fractions.Fraction(1, 1000)
            t += int(d)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def frame_times(path: str) -> np.ndarray:
    """``[n, 2]`` (start, end) seconds of every frame a sequential decode shows, from the first
    frame's start (the last frame ends one frame duration after it starts)."""
    with av.open(path) as c:
        got = [(f.time, float(f.duration * f.time_base) if f.duration else None) for f in c.decode(video=0)]
    begin = np.array([t for t, _ in got]) - got[0][0]
    end = np.append(begin[1:], begin[-1] + (got[-1][1] or (begin[-1] - begin[-2])))
    return np.stack([begin, end], axis=1)


def cut_start(src: str, dst: str, frames: int) -> str:
    """``src`` cut ``frames`` frames into it without re-encoding, as ``ffmpeg -ss T -i src -c copy
    dst`` cuts: every packet kept, timestamps moved back so that an edit list starts at the first
    frame kept; the frames before it (the keyframe among them) are only decoded, never shown."""
    with av.open(src) as c:
        rate = c.streams.video[0].average_rate

    def shift(p, tb):
        d = int(round(frames / rate / tb))
        p.pts, p.dts = p.pts - d, p.dts - d

    return _remux(src, dst, edit=shift)


def cut_slice(src: str, dst: str, frame: int, filler: bool = True) -> str:
    """``src`` (an H.264 MP4, one slice per frame) with the slice of frame ``frame`` (in
    presentation order) cut off halfway, as a lost network packet leaves it: the rest of its
    packet becomes a filler NAL unit, so the container stays whole. Every FFmpeg build logs
    "error while decoding MB ..." for it and conceals the missing part from other frames, where
    random bytes often still parse (CABAC seldom notices) and no decoder can tell.
    ``filler=False`` leaves the rest as it was: the packet no longer splits into NAL units and
    the decoder rejects it whole (an error, no frame)."""
    with av.open(src) as c:
        s = c.streams.video[0]
        rate = s.average_rate
        pos, size = next((p.pos, p.size) for p in c.demux(s)
                         if p.size and int(round(p.pts * s.time_base * rate)) == frame)
    data = bytearray(open(src, "rb").read())
    nal = int.from_bytes(data[pos : pos + 4], "big")
    assert nal == size - 4, "one NAL unit per packet"
    keep = nal // 2
    rest = nal - keep - 4  # the filler unit: its header byte (type 12), 0xFF bytes, stop bit
    data[pos : pos + 4] = keep.to_bytes(4, "big")
    if filler:
        data[pos + 4 + keep : pos + size] = rest.to_bytes(4, "big") + b"\x0c" + b"\xff" * (rest - 2) + b"\x80"
    with open(dst, "wb") as f:
        f.write(data)
    return dst


def decode_order(path: str) -> np.ndarray:
    """Each frame's (presentation order) position in decode order, from the packets' order."""
    with av.open(path) as c:
        s = c.streams.video[0]
        rate = s.average_rate
        shown = [int(round(p.pts * s.time_base * rate)) for p in c.demux(s) if p.size]
    pos = np.empty(len(shown), np.int64)
    pos[shown] = np.arange(len(shown))
    return pos
