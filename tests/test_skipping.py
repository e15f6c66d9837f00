"""Decoding less, exactly (NOTE [ Decoding less, exactly ] in video.pyav): the frames no clip shows
and no later frame references are not decoded, and every delivered frame is still bit for bit the
frame a plain sequential decode of the file gives.

The files are textured (a panning noise texture under the frame codes): a frame decoded from a
wrong or missing reference differs in its pixels, not only in a few cells. Each shape the issue
names: B-pyramid H.264 (MP4, MPEG-TS, an edit list, open GOP), HEVC with B-frames, VP9, MPEG-4
Part 2 with B-frames. Two sabotaged skips show that the comparison sees a wrong one.
"""

from __future__ import annotations

import os

import av
import numpy as np
import pytest

import shmloader
from shmloader.video import pyav
from shmloader.video import probe as probe_module
from shmloader.video.probe import probe
from shmloader.video.pyav import PyAV, _Scaler, skips_nonref

from ._needs import written_apart
from ._variants import _remux

pytestmark = pytest.mark.timeout(240)

FRAMES, GOP, SIZE, FPS = 90, 45, (96, 128), 25
CUT = 7  # frames an edit list drops at the start


def _image(i: int, rng_texture: np.ndarray, noise: np.random.Generator) -> np.ndarray:
    from shmloader.video.samples import frame_image

    h, w = SIZE
    image = frame_image(1, i, h, w) + 0.4 * (rng_texture[i // 2 : i // 2 + h, i : i + w] - 128)
    return (image + noise.normal(0.0, 2.0, image.shape)).clip(0, 255).astype(np.uint8)


def write(path: str, codec: str, options: dict | None = None, fmt: str | None = None, bframes: int = 0) -> str:
    """A textured frame-code video of ``codec``, one keyframe every ``GOP`` frames."""
    return written_apart(codec, _write, path, codec, options, fmt, bframes)


def _write(path: str, codec: str, options: dict | None, fmt: str | None, bframes: int) -> str:
    h, w = SIZE
    rng = np.random.default_rng(7)
    texture = np.kron(rng.integers(0, 256, ((h + FRAMES) // 4 + 2, (w + FRAMES) // 4 + 2, 3)),
                      np.ones((4, 4, 1))).astype(np.float32)
    with av.open(path, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=FPS)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.codec_context.thread_count = 3  # what FFmpeg picks on 2 CPUs: the same files on every host
        if options is not None:
            s.options = options
        if codec == "mpeg4":
            s.bit_rate, s.codec_context.gop_size, s.codec_context.max_b_frames = 2_000_000, GOP, bframes
        for i in range(FRAMES):
            for p in s.encode(av.VideoFrame.from_ndarray(_image(i, texture, rng), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


_X264 = {"crf": "20", "preset": "veryfast", "g": str(GOP), "keyint_min": str(GOP), "sc_threshold": "0",
         "bf": "3", "b_pyramid": "normal"}
_X265 = f"keyint={GOP}:min-keyint={GOP}:scenecut=0:bframes=4:b-pyramid=1:log-level=error"

# name: (extension, codec, options, format, MPEG-4 B-frames)
SHAPES = {
    "mp4_h264_pyramid": ("mp4", "libx264", _X264, None, 0),
    "ts_h264_pyramid": ("ts", "libx264", _X264, "mpegts", 0),
    "mkv_h264_open_gop": ("mkv", "libx264", {**_X264, "x264-params": "open-gop=1"}, None, 0),
    "mp4_hevc_bframes": ("mp4", "libx265", {"x265-params": _X265}, None, 0),
    "webm_vp9": ("webm", "libvpx-vp9", {"g": str(GOP), "keyint_min": str(GOP), "crf": "30", "b:v": "0"}, None, 0),
    "mp4_mpeg4_bframes": ("mp4", "mpeg4", None, None, 2),
}
# FFmpeg's decoders that leave frames out when told NONREF, on these files (VP9's encoder here
# refreshes a reference with every frame: nothing to leave out, and nothing is).
SKIPPING = {"mp4_h264_pyramid", "ts_h264_pyramid", "mkv_h264_open_gop", "mp4_h264_edit_list",
            "mp4_hevc_bframes", "mp4_mpeg4_bframes"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("skipping")
    made = {name: write(os.path.join(folder, f"{name}.{ext}"), codec, options, fmt, bf)
            for name, (ext, codec, options, fmt, bf) in SHAPES.items()}

    def shift(p, tb):  # as `ffmpeg -ss 0.28 -c copy` leaves it: the first CUT frames before the start
        d = round(CUT / FPS / tb)
        p.pts, p.dts = p.pts - d, p.dts - d

    made["mp4_h264_edit_list"] = _remux(made["mp4_h264_pyramid"], os.path.join(folder, "edit_list.mp4"), edit=shift)
    return made


_REFS: dict = {}


def sequential(path: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """Every frame of a plain sequential decode (the i-th frame out is frame i), converted by the
    loader's own scaler: what differs from a clip can only be the decoding."""
    key = (path, size)
    if key not in _REFS:
        scale, out = _Scaler(), []
        with av.open(path) as c:
            for f in c.decode(video=0):
                h, w = size or (f.height, f.width)
                out.append(scale(f, w, h))
        _REFS[key] = np.stack(out)
    return _REFS[key]


def frame_sets(n: int) -> list[np.ndarray]:
    """Clips of 8 frames every 2nd and every 3rd from every start, TSN segments, fps= picks."""
    sets = [np.arange(s, s + 15, 2) for s in range(n - 15)]
    sets += [np.arange(s, s + 22, 3) for s in range(0, n - 22, 5)]
    for k in (3, 5, 8):
        edges = np.linspace(0, n, k + 1)
        sets.append(np.unique(((edges[:-1] + edges[1:]) / 2).astype(int)))
    sets += [np.unique(np.round(np.arange(o, n - 1, r)).astype(int)) for o, r in ((0, 2.5), (3, 4.2), (1, 12.5))]
    return sets


def mismatches(decoder: PyAV, path: str) -> list[str]:
    """Frame sets whose decode differs from the sequential decode (or fails)."""
    info = probe(path).with_decoder("pyav")
    ref = sequential(path)
    assert info.frames == len(ref)
    bad = []
    for frames in frame_sets(info.frames):
        try:
            got = decoder.decode(info, None, frames)
        except ValueError as e:
            bad.append(f"{frames.tolist()}: {e}")
            continue
        wrong = np.flatnonzero((got != ref[frames]).any(axis=(1, 2, 3)))
        if len(wrong):
            bad.append(f"{frames.tolist()}: frames {frames[wrong].tolist()} differ")
    return bad


NAMES = sorted([*SHAPES, "mp4_h264_edit_list"])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_every_frame_equals_a_sequential_decode(files, name, threads):
    """Clips, segments and fps= picks from every position: bit for bit the sequential decode,
    with fewer frames decoded than without the skip wherever FFmpeg leaves frames out."""
    path = files[name]
    info = probe(path)
    if name == "mp4_h264_edit_list":
        assert "edit list drops" in info.problem
    with av.open(path) as c:
        assert skips_nonref(info, c.streams.video[0])
    skipping, full = PyAV(threads), PyAV(threads, skip_nonref=False)
    assert mismatches(skipping, path) == []
    assert mismatches(full, path) == []
    if name in SKIPPING:
        assert skipping.frames_out < 0.85 * full.frames_out, (skipping.frames_out, full.frames_out)
    else:
        assert skipping.frames_out <= full.frames_out


@pytest.mark.parametrize("sabotage", ["references skipped", "wanted frames skipped"])
def test_a_wrong_skip_is_seen(files, monkeypatch, sabotage):
    """The comparison above catches a skip that is wrong: B-frames that later frames reference
    (``BIDIR`` leaves out B-pyramid references), or the wanted frames themselves."""
    if sabotage == "references skipped":
        monkeypatch.setattr(pyav, "_SKIP", "BIDIR")
    else:
        real = pyav._decoded
        monkeypatch.setattr(pyav, "_decoded", lambda c, s, wanted=None, flush=None:
                            real(c, s, None if wanted is None else set(), flush))
    assert mismatches(PyAV(1), files["mp4_h264_pyramid"]) != []


def test_a_hevc_stream_of_several_temporal_layers_is_decoded_whole(tmp_path):
    """A sub-layer non-reference picture may be referenced by a higher layer: no skip there."""
    path = write(str(tmp_path / "layers.mp4"), "libx265", {"x265-params": _X265 + ":temporal-layers=2"})
    info = probe(path)
    with av.open(path) as c:
        assert not skips_nonref(info, c.streams.video[0])
    d = PyAV(1)
    assert mismatches(d, path) == []


def test_a_long_gop_with_b_frames_is_read_by_the_decoder_that_skips(files, tmp_path, monkeypatch):
    """decoder="auto": PyAV reads H.264 with B-frames and one keyframe in 60 frames or more (it
    leaves out the non-reference frames, decord decodes them all); VP9 stays decord's (no
    B-frames: nothing to leave out). A shorter GOP with B-frames goes to PyAV too, for speed
    (NOTE [ Which decoder reads a file ]), and the long-GOP reason alone would leave it to decord."""
    long_gop = write(str(tmp_path / "long_gop.mp4"), "libx264", {**_X264, "g": "250", "keyint_min": "25"})
    info = probe(long_gop)
    assert (info.container, info.codec, len(info.keyframes), info.decoder, info.problem) == \
        ("mov", "h264", 1, "pyav", "")
    short_gop = probe(files["mp4_h264_pyramid"])  # a keyframe every 45 frames
    assert (short_gop.decoder, short_gop.pyav_faster) == ("pyav", True) and not info.pyav_faster
    with monkeypatch.context() as m:
        m.setattr(probe_module, "_FASTER", frozenset())
        assert probe(long_gop).decoder == "pyav" and probe(files["mp4_h264_pyramid"]).decoder == "decord"
    vp9 = write(str(tmp_path / "long_gop.webm"), "libvpx-vp9", {"g": "250", "crf": "30", "b:v": "0"})
    assert probe(vp9).decoder == "decord"
    clips = shmloader.VideoClips([long_gop], clip_len=8, frame_step=2, clips_per_video=8)
    with shmloader.Loader(clips, batch_size=4, workers=2, seed=5, timeout=60) as loader:
        for b in loader:
            for i in range(len(b["index"])):
                np.testing.assert_array_equal(b["video"][i], sequential(long_gop)[np.asarray(b["frames"][i])])
        stats = loader.stats()
    assert stats["pyav"] > 0 and stats["decord"] == 0, stats


@pytest.mark.parametrize("size", [None, (48, 64)])
def test_the_loader_delivers_sequential_frames(files, size):
    """Real workers, every sampling the skip applies to: each delivered clip is the sequential
    decode's frames, bit for bit."""
    paths = [files[n] for n in NAMES]
    sources = [
        shmloader.VideoClips(paths, clip_len=8, frame_step=2, clips_per_video=6, size=size, decoder="pyav"),
        shmloader.VideoClips(paths, clip_len=5, frame_step=3, clips_per_video=3, size=size, decoder="pyav"),
        shmloader.VideoClips(paths, clip_len=6, sampling="segments", clips_per_video=2, size=size, decoder="pyav"),
        shmloader.VideoClips(paths, clip_len=6, fps=7.0, clips_per_video=3, size=size, decoder="pyav"),
    ]
    seen = 0
    for clips in sources:
        with shmloader.Loader(clips, batch_size=5, workers=2, shuffle=True, seed=2, timeout=60) as loader:
            for b in loader:
                for i in range(len(b["index"])):
                    path = paths[int(b["index"][i])]
                    frames = np.asarray(b["frames"][i])
                    np.testing.assert_array_equal(b["video"][i], sequential(path, size)[frames],
                                                  err_msg=f"{path} {frames.tolist()}")
                    seen += 1
    assert seen == len(paths) * (6 + 3 + 2 + 3)
