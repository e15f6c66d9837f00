"""Which decoder reads which file, on evidence (NOTE [ Which decoder reads a file ] in _probe).

Every (container, codec) shape decord is trusted with is written here and seeked into: random
clips, each through a fresh reader as a worker reads it, must be the frames a sequential
libavformat decode shows at the reported index. Every other shape goes to PyAV and must come out
as exactly. The seek evidence of ``check="keyframes"`` is shown to catch a decoder that seeks
wrong; truncated downloads and one-keyframe B-frame clips read as what they hold.
"""

from __future__ import annotations

import contextlib
import os

import av
import numpy as np
import pytest

import shmloader
from shmloader.video.decord import Decord
from shmloader.video.decoding import Decoding
from shmloader.tools.evidence import probe_with_evidence, seek_positions
from shmloader.video.probe import DECORD_SHAPES, probe
import shmloader.video.probe as probe_module
from shmloader.video.samples import frame_image

from ._needs import written_apart
from ._variants import codes, reference
from .test_scan import rows_of
from .test_scan import scan as run_scan

pytestmark = pytest.mark.timeout(180)

FRAMES, GOP, CLIP = 72, 12, 6

# What an encoder writes depends on its thread count, which FFmpeg picks from the CPUs this
# process may use (3 on 2 CPUs): with 1 or 2, the MPEG-2 encoder stamps two B-frames of the VOB
# with their neighbours' times, and the probe rightly finds no usable timestamps. The files are
# the same on every host with the count fixed at what 2 CPUs give.
_ENCODER_THREADS = 3


def scan(inputs, out) -> tuple[list[dict], str]:
    """``shmloader scan`` in its own process (test_scan's runner): (rows, what it printed)."""
    r = run_scan(inputs, out, workers=1)
    return rows_of(out), r.stderr


def write(path, codec: str, *, bframes: int = 0, fmt: str | None = None, frames: int = FRAMES, gop: int = GOP,
          size=(96, 128), pix: str = "yuv420p", options: dict | None = None, container_options=None) -> str:
    """A frame-code video of ``codec`` in the container ``path``'s extension (or ``fmt``) names,
    one keyframe every ``gop`` frames and up to ``bframes`` B-frames between references."""
    return written_apart(codec, _write, path, codec, bframes=bframes, fmt=fmt, frames=frames, gop=gop, size=size,
                         pix=pix, options=options, container_options=container_options)


def _write(path, codec: str, *, bframes: int, fmt: str | None, frames: int, gop: int, size, pix: str,
           options: dict | None, container_options) -> str:
    h, w = size
    with _same_scheduling(), av.open(os.fspath(path), "w", format=fmt, options=container_options or {}) as c:
        s = c.add_stream(codec, rate=25)
        s.width, s.height, s.pix_fmt = w, h, pix
        s.codec_context.thread_count = _ENCODER_THREADS
        if codec == "libx264":
            s.options = {"crf": "18", "preset": "veryfast", "g": str(gop), "keyint_min": str(gop),
                         "sc_threshold": "0", "bf": str(bframes)}
        elif codec == "libx265":
            s.options = {"x265-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}:scenecut=0:log-level=error"}
        elif codec in ("libvpx", "libvpx-vp9", "libsvtav1"):
            s.options = {"g": str(gop), "keyint_min": str(gop)}
        else:
            s.bit_rate = 4_000_000
            s.codec_context.gop_size = gop
            if bframes:
                s.codec_context.max_b_frames = bframes
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_image(1, i, h, w), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return os.fspath(path)


@contextlib.contextmanager
def _same_scheduling():
    """SVT-AV1, run as root, puts the thread that encodes at real-time priority (SCHED_FIFO 99)
    and leaves it there: the test process, and every worker and encoder thread it starts after,
    would then run real-time, and on one CPU a thread that spins waiting for another of the same
    priority never lets it run (the suite hung under ``taskset -c 0``). Put back what it was."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


# One writer per shape decord is trusted with: B-frames wherever the shape admits them.
DECORD_WRITERS = {
    ("mov", "h264"): ("mp4", dict(codec="libx264", bframes=2)),
    ("matroska", "h264"): ("mkv", dict(codec="libx264", bframes=2)),
    ("flv", "h264"): ("flv", dict(codec="libx264", bframes=2)),
    ("mov", "hevc"): ("mp4", dict(codec="libx265")),
    ("matroska", "hevc"): ("mkv", dict(codec="libx265")),
    ("mov", "mpeg4"): ("mp4", dict(codec="mpeg4")),
    ("matroska", "mpeg4"): ("mkv", dict(codec="mpeg4")),
    ("avi", "mpeg4"): ("avi", dict(codec="mpeg4")),
    ("mov", "av1"): ("mp4", dict(codec="libsvtav1")),
    ("matroska", "av1"): ("mkv", dict(codec="libsvtav1")),
    ("matroska", "vp8"): ("webm", dict(codec="libvpx")),
    ("matroska", "vp9"): ("webm", dict(codec="libvpx-vp9")),
    ("mov", "vp9"): ("mp4", dict(codec="libvpx-vp9")),
    ("mov", "mjpeg"): ("mov", dict(codec="mjpeg", pix="yuvj420p")),
    ("avi", "mjpeg"): ("avi", dict(codec="mjpeg", pix="yuvj420p")),
    ("mov", "prores"): ("mov", dict(codec="prores_ks", pix="yuv422p10le")),
    ("mov", "h263"): ("3gp", dict(codec="h263", size=(144, 176))),
    ("flv", "flv1"): ("flv", dict(codec="flv")),
}

# Shapes outside the list, as datasets ship them: PyAV reads them.
PYAV_WRITERS = {
    "avi_mpeg4_bframes": ("avi", dict(codec="mpeg4", bframes=2)),  # XviD, UCF-101 / HMDB-51
    "avi_h264_bframes": ("avi", dict(codec="libx264", bframes=2)),  # camera and CCTV exports
    "avi_h264": ("avi", dict(codec="libx264")),
    "mpg_mpeg1_bframes": ("mpg", dict(codec="mpeg1video", bframes=2, fmt="mpeg")),
    "mpg_mpeg2_bframes": ("mpg", dict(codec="mpeg2video", bframes=2, fmt="mpeg")),
    "vob_mpeg2_bframes": ("vob", dict(codec="mpeg2video", bframes=2, fmt="vob")),
    "mp4_mpeg4_bframes": ("mp4", dict(codec="mpeg4", bframes=2)),
    "mp4_hevc_bframes": ("mp4", dict(codec="libx265", bframes=2)),
    "wmv_wmv2": ("wmv", dict(codec="wmv2")),
}


def _make(folder, name: str, ext: str, kw: dict) -> str:
    kw = dict(kw)
    return write(os.path.join(folder, f"{name}.{ext}"), kw.pop("codec"), **kw)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    made = {k: _make(folder, "_".join(k), ext, kw) for k, (ext, kw) in DECORD_WRITERS.items()}
    made.update({k: _make(folder, k, ext, kw) for k, (ext, kw) in PYAV_WRITERS.items()})
    return made


def random_clips(n: int, rng) -> list[np.ndarray]:
    starts = rng.permutation(np.arange(0, n - CLIP + 1, 5))
    return [np.arange(s, s + CLIP) for s in starts]


def test_every_trusted_shape_has_a_test():
    assert set(DECORD_WRITERS) == set(DECORD_SHAPES)


@pytest.mark.parametrize("shape", sorted(DECORD_SHAPES), ids="_".join)
def test_decord_seeks_exactly_in_every_trusted_shape(shapes, shape, monkeypatch):
    path = shapes[shape]
    # decord's exactness is on trial, not the speed rule that gives H.264 to PyAV
    monkeypatch.setattr(probe_module, "_FASTER", frozenset())
    info = probe(path)
    assert (info.container, info.codec, info.decoder, info.problem) == (*shape, "decord", "")
    if DECORD_SHAPES[shape] and shape[1] == "h264":
        assert (np.diff(info.decode_pos) < 0).any()  # B-frames stored out of order: the case is tested
    ref = reference(path)
    assert info.frames == len(ref) == FRAMES
    _, numbers = codes(ref)
    decoding = Decoding(1)
    for frames in random_clips(FRAMES, np.random.default_rng(0)):
        got = decoding.decode(info, None, frames)  # a fresh decord reader, as a worker reads a clip
        np.testing.assert_array_equal(codes(got)[1], numbers[frames], err_msg=f"{shape} clip {frames[0]}")
        assert np.abs(got.astype(np.int16) - ref[frames]).mean() < 2.0
    assert decoding.decodes == {"decord": len(random_clips(FRAMES, np.random.default_rng(0)))}


@pytest.mark.parametrize("name", sorted(PYAV_WRITERS) + sorted("_".join(k) for k in DECORD_WRITERS))
def test_a_shape_outside_the_list_is_read_by_pyav_exactly(shapes, name):
    """Outside the list PyAV reads; inside it, PyAV (decoder="pyav") reads as exactly."""
    path = shapes[name if name in PYAV_WRITERS else next(k for k in DECORD_WRITERS if "_".join(k) == name)]
    info = probe(path)
    if name in PYAV_WRITERS:
        assert info.decoder == "pyav"
        assert not DECORD_SHAPES.get((info.container, info.codec), False) or "bframes" in name
    else:
        info = info.with_decoder("pyav")
    assert "no usable timestamps" not in info.problem
    ref = reference(path)
    assert info.frames == len(ref) == FRAMES
    _, numbers = codes(ref)
    decoding = Decoding(1)
    for frames in random_clips(FRAMES, np.random.default_rng(1)):
        got = decoding.decode(info, (64, 80), frames)
        np.testing.assert_array_equal(codes(got)[1], numbers[frames], err_msg=f"{name} clip {frames[0]}")
    assert set(decoding.decodes) == {"pyav"} and decoding.fallbacks == 0


def test_the_loader_delivers_every_shape_exactly(shapes):
    """Through real workers, shuffled, both routes in one loader."""
    paths = [shapes[k] for k in sorted(shapes, key=str)]
    clips = shmloader.VideoClips(paths, clip_len=CLIP, clips_per_video=4, sampling="random", size=(48, 64))
    refs = {}
    with shmloader.Loader(clips, batch_size=8, workers=2, shuffle=True, seed=3, timeout=60) as loader:
        seen = 0
        for b in loader:
            for i in range(len(b["index"])):
                path = paths[int(b["index"][i])]
                if path not in refs:
                    refs[path] = codes(reference(path))[1]
                frames = np.asarray(b["frames"][i])
                ids, numbers = codes(b["video"][i])
                assert (ids == 1).all()
                np.testing.assert_array_equal(numbers, refs[path][frames], err_msg=path)
                seen += 1
    assert seen == len(clips)


# H.264 files (72 frames of 96x128 unless said) and the decoder auto gives them (NOTE [ Which
# decoder reads a file ]): PyAV where it measured less CPU per clip, single or grouped
# (bench/decoder_choice.py), decord where the two were even or nothing was measured.
AUTO_H264 = {
    "gop12_bframes.mp4": (dict(bframes=2), "pyav"),  # what `shmloader prepare` writes
    "gop12.mp4": ({}, "pyav"),
    "gop16.mkv": (dict(gop=16), "pyav"),  # without B-frames: a keyframe every 16 frames at most
    "gop36_bframes.mkv": (dict(bframes=2, gop=36), "pyav"),  # B-frames: any GOP
    "gop36.mp4": (dict(gop=36), "decord"),  # even: PyAV ahead on single clips, decord grouped
    "gop12.flv": ({}, "decord"),  # FLV unmeasured
    "gop4_bframes_1088x864.mp4": (dict(bframes=2, gop=4, frames=12, size=(1088, 864)), "decord"),  # > 720x1280
    "gop12_544x640.mp4": (dict(frames=24, size=(544, 640)), "decord"),  # no B-frames: > 480x640
}


@pytest.mark.parametrize("name", sorted(AUTO_H264))
def test_auto_reads_h264_with_pyav_where_pyav_measured_faster(tmp_path, name):
    kw, want = AUTO_H264[name]
    path = write(tmp_path / name, "libx264", **kw)
    info = probe(path)
    assert (info.codec, info.decoder, info.problem) == ("h264", want, ""), name
    decoding = Decoding(1)
    frames = kw.get("frames", FRAMES)
    _, numbers = codes(reference(path))
    for start in (frames - CLIP, 1, frames // 2):  # each through the decoder auto chose
        got = decoding.decode(decoding.info(path), (48, 64), np.arange(start, start + CLIP))
        np.testing.assert_array_equal(codes(got)[1], numbers[start : start + CLIP])
    assert decoding.decodes == {want: 3} and decoding.probes == 1
    if want == "pyav":  # the worker reads the file again through the container it opened once
        kept = decoding.decoder("pyav")._open[path][1]
        decoding.decode(decoding.info(path), (48, 64), np.arange(CLIP))
        assert decoding.decoder("pyav")._open[path][1] is kept


def test_a_manifest_row_gives_decord_a_file_pyav_reads_for_speed(tmp_path, monkeypatch):
    """PyAV seeks by a probe's timestamps, which a scan row does not hold: a file PyAV reads for
    speed alone gets decord in its row, whose reader then probes nothing; read by its path (probed
    anyway), PyAV reads it. The seek evidence still judges decord on it."""
    path = write(tmp_path / "copy.mp4", "libx264", bframes=2, gop=16)  # as `shmloader prepare` writes
    info = probe(path)
    assert (info.decoder, info.pyav_faster, info.problem) == ("pyav", True, "")
    (row,), _ = scan([path], tmp_path / "m.csv")
    assert (row["decoder"], row["problem"]) == ("decord", "")
    _, numbers = codes(reference(path))
    for clips in (shmloader.VideoClips.from_csv(str(tmp_path / "m.csv"), clip_len=CLIP, clips_per_video=4),
                  shmloader.VideoClips([path], clip_len=CLIP, clips_per_video=4)):
        with shmloader.Loader(clips, batch_size=4, workers=1, timeout=60) as loader:
            (b,) = list(loader)
            stats = loader.stats()
        np.testing.assert_array_equal(codes(b["video"])[1], numbers[np.asarray(b["frames"])])
        want = "decord" if clips.manifest is not None else "pyav"
        assert stats.get(want) == 1 and stats.get("probes", 0) == (want == "pyav"), stats
    _fake_seek_one_frame_early(monkeypatch)
    judged = probe_with_evidence(path, check="keyframes")
    assert (judged.decoder, judged.pyav_faster) == ("pyav", False) and "decord seeks wrong" in judged.problem


def _fake_seek_one_frame_early(monkeypatch):
    """Our decord wrapper made to return, for one-frame requests, the frame before: a stand-in
    for a decoder whose seek lands early, to show the evidence catches one."""
    real = Decord.decode

    def decode(self, info, size, frames, out=None):
        if len(frames) == 1 and frames[0] > 0:
            return real(self, info, size, frames - 1, out)
        return real(self, info, size, frames, out)

    monkeypatch.setattr(Decord, "decode", decode)


def test_seek_evidence_sends_a_file_decord_misreads_to_pyav(shapes, monkeypatch):
    path = shapes[("mov", "mpeg4")]  # a shape auto gives to decord
    assert probe_with_evidence(path, check="keyframes").decoder == "decord"
    _fake_seek_one_frame_early(monkeypatch)
    info = probe_with_evidence(path, check="keyframes")
    first = int(seek_positions(probe(path))[0])
    assert (info.decoder, info.problem) == ("pyav", f"decord seeks wrong at frame {first} (read by PyAV)")
    assert probe_with_evidence(path, check="frames").decoder == "pyav"
    assert probe(path, check="frames").decoder == "decord"  # the probe alone gathers no evidence
    assert probe_with_evidence(path, check="headers").decoder == "decord"  # nor the workers' quick one


@pytest.mark.parametrize("name", ["avi_h264_bframes", "mpg_mpeg2_bframes", "mp4_mpeg4_bframes"])
def test_seek_evidence_agrees_with_what_decord_delivers(shapes, monkeypatch, name):
    """Admit an untested shape: the evidence sends it to PyAV exactly when decord, seeking
    afresh, gives another frame than the sequential decode at one of the checked positions."""
    path = shapes[name]
    base = probe(path)
    monkeypatch.setitem(DECORD_SHAPES, (base.container, base.codec), True)
    # decord's seeking is what is on trial: not the rules that send a file to PyAV by its shape
    monkeypatch.setattr(probe_module, "LONG_GOP", 10**9)
    monkeypatch.setattr(probe_module, "open_gop", lambda decode_pos, keyframes: None)
    trusted = probe(path)
    if trusted.decoder != "decord":
        pytest.skip(f"{name} goes to PyAV for another reason: {trusted.problem}")
    _, numbers = codes(reference(path))
    wrong = [int(i) for i in seek_positions(trusted)
             if codes(Decord(1).decode(trusted, None, np.array([i])))[1][0] != numbers[i]]
    info = probe_with_evidence(path, check="keyframes")
    if wrong:
        why = f"decord seeks wrong at frame {wrong[0]} (read by PyAV)"
        assert (info.decoder, info.problem) == ("pyav", "; ".join(filter(None, [trusted.problem, why])))
    else:
        assert (info.decoder, info.problem) == ("decord", trusted.problem)


def test_one_keyframe_b_frame_clip_is_readable(tmp_path):
    """Most short clips: one keyframe (GOP 250 > the clip) held back by B-frame reordering."""
    path = write(tmp_path / "short.mp4", "libx264", bframes=3, frames=60, gop=250)
    ref = reference(path)
    for check in ("headers", "keyframes", "frames"):
        info = probe(path, check=check)
        assert (info.frames, info.problem) == (len(ref), ""), check
        assert list(info.keyframes) == [0]
    (row,), _ = scan([path], tmp_path / "scan.csv")
    # 60 frames to the keyframe, with B-frames: PyAV leaves out the non-reference frames, decord
    # would decode them all (NOTE [ Decoding less, exactly ] in video.pyav).
    assert (row["frames"], row["problem"], row["decoder"]) == (str(len(ref)), "", "pyav")


def test_a_stream_copied_cut_of_a_one_keyframe_file_scans_as_the_loader_reads_it(tmp_path):
    """``ffmpeg -ss 0.48 -c copy`` of a one-keyframe clip (72 frames at 25 fps): the keyframe lies
    before the edit list's start, so it is decoded but never shown. ``scan`` (every keyframe
    decoded) once found no frame in it and called it unreadable while the loader read it exactly."""
    from ._variants import cut_start

    whole = write(tmp_path / "whole.mp4", "libx264", bframes=3, frames=72, gop=250)
    path = cut_start(whole, str(tmp_path / "cut.mp4"), 12)
    _, numbers = codes(reference(path))
    assert list(numbers) == list(range(12, 72))  # what a player shows
    for check in ("headers", "keyframes", "frames"):
        info = probe(path, check=check)
        assert (info.frames, info.decoder, info.problem) == (60, "pyav", "edit list drops 12 frames"), check
    (row,), _ = scan([path], tmp_path / "scan.csv")
    assert (row["frames"], row["problem"], row["decoder"]) == ("60", "edit list drops 12 frames", "pyav")
    clips = shmloader.VideoClips.from_csv(str(tmp_path / "scan.csv"), clip_len=6, clips_per_video=4,
                                         sampling="uniform")
    with shmloader.Loader(clips, batch_size=4, workers=1, timeout=60) as loader:
        (b,) = list(loader)
    for frames, video in zip(np.array(b["frames"]), np.array(b["video"])):
        assert list(codes(video)[1]) == [12 + int(f) for f in frames]


def _cut(src: str, dst, share: float) -> str:
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(data[: int(len(data) * share)])
    return os.fspath(dst)


def test_a_truncated_download_reads_what_it_holds(tmp_path):
    whole = write(tmp_path / "whole.mp4", "libx264", bframes=2, container_options={"movflags": "faststart"})
    with av.open(whole) as c:
        assert c.streams.video[0].frames == FRAMES
    path = _cut(whole, tmp_path / "cut.mp4", 0.6)
    whole_ref = reference(whole)
    info = probe(path)
    n = info.frames
    assert 0 < n < FRAMES and info.problem == f"truncated at frame {n} of {FRAMES}" and info.decoder == "pyav"
    for check in ("keyframes", "frames"):
        assert probe(path, check=check).problem == info.problem
    _, numbers = codes(whole_ref)
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=n - 3, sampling="uniform")
    with shmloader.Loader(clips, batch_size=n - 3, workers=1, timeout=60) as loader:
        (b,) = list(loader)
    assert sorted(int(s) for s in b["start"]) == list(range(n - 3))  # every clip of the part that exists
    np.testing.assert_array_equal(codes(b["video"])[1], numbers[np.asarray(b["frames"])])
    diff = np.abs(b["video"].astype(np.int16) - whole_ref[np.asarray(b["frames"])])
    assert diff.mean() < 1.0
    (row,), printed = scan([path], tmp_path / "scan.csv")
    assert (row["frames"], row["problem"], row["decoder"]) == (str(n), info.problem, "pyav")
    assert f"  truncated at frame N of N: 1 file, {path}: {info.problem}" in printed.splitlines(), printed


def test_a_truncated_file_past_its_probe_names_the_frame_it_ends_at(tmp_path):
    """A manifest row (or an old probe) that promises more frames than the file now holds:
    the SampleError names the file and the frame the stream ends at."""
    whole = write(tmp_path / "whole.mp4", "libx264", bframes=2, container_options={"movflags": "faststart"})
    info = probe(whole)
    path = _cut(whole, tmp_path / "cut.mp4", 0.6)
    stale = info.__class__(**{**{f: getattr(info, f) for f in info.__dataclass_fields__}, "path": path,
                              "decoder": "pyav", "media": None})
    decoding = Decoding(1)
    n = probe(path).frames
    with pytest.raises(ValueError, match=rf"^the file ends at frame {n} of the {FRAMES} its index lists \(truncated\?\)"):
        decoding.decode(stale, None, np.arange(FRAMES - CLIP, FRAMES))
    np.testing.assert_array_equal(codes(decoding.decode(stale, None, np.arange(n - CLIP, n)))[1], np.arange(n - CLIP, n))


def test_every_dataset_container_is_found_and_the_rest_counted(tmp_path):
    exts = [".flv", ".wmv", ".asf", ".3gp", ".3g2", ".ogv", ".vob", ".mxf", ".MP4", ".avi", ".mpg"]
    src = write(tmp_path / "src.mp4", "libx264")
    for i, ext in enumerate(exts):
        d = tmp_path / "data" / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"v{i}{ext}").write_bytes(open(src, "rb").read())
    (tmp_path / "data" / "class0" / "notes.txt").write_text("x")
    (tmp_path / "data" / "class1" / "cover.jpg").write_bytes(b"x")
    (tmp_path / "data" / "class1" / "more.jpg").write_bytes(b"x")
    clips = shmloader.VideoClips.from_folder(tmp_path / "data", clip_len=4, size=(32, 32))
    assert sorted(os.path.splitext(p)[1] for p in clips.paths) == sorted(exts)
    only = shmloader.VideoClips.from_folder(tmp_path / "data", extensions=(".flv",), clip_len=4, size=(32, 32))
    assert [os.path.basename(p) for p in only.paths] == ["v0.flv"]
    rows, printed = scan([tmp_path / "data"], tmp_path / "scan.csv")
    assert sorted(os.path.splitext(r["path"])[1] for r in rows) == sorted(exts)
    assert "passed over 3 files without a video extension (.jpg 2, .txt 1)" in printed.splitlines(), printed


def test_a_truncated_matroska_reads_as_the_frames_it_holds(tmp_path):
    """Matroska states no frame count, and its index (cues) is at the end, cut off with the rest:
    the file reads as the frames a sequential decode gives, every clip of them exact."""
    whole = write(tmp_path / "whole.mkv", "libx264", bframes=2)
    path = _cut(whole, tmp_path / "cut.mkv", 0.6)
    ref = reference(path)
    info = probe(path, check="frames")
    assert 0 < info.frames == len(ref) < FRAMES and "no usable timestamps" not in info.problem
    _, numbers = codes(ref)
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=info.frames - 3, sampling="uniform")
    with shmloader.Loader(clips, batch_size=info.frames - 3, workers=1, timeout=60) as loader:
        (b,) = list(loader)
    assert sorted(int(s) for s in b["start"]) == list(range(info.frames - 3))
    np.testing.assert_array_equal(codes(b["video"])[1], numbers[np.asarray(b["frames"])])
