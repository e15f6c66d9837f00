"""Files the tests did not design for the loader: edit-list cuts, MPEG-TS, a size change inside
the stream, a rotation tag, a timestamp gap, damaged bytes. Every frame the loader delivers,
with either decoder and every way of sizing, is the frame a sequential libavformat decode
shows at the index the loader reports (by frame code), and close to it in pixels."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import shmloader
from shmloader.video.decoders import DecoderLimit
from shmloader.video.decoding import Decoding
from shmloader.video.measuring import measurable
from shmloader.video.probe import probe

from ._needs import written_apart
from ._variants import codes, cut_slice, damage, decode_order, reference, textured, write_variants

pytestmark = pytest.mark.timeout(120)

VARIANTS = ["plain", "edit_list", "mpegts", "rotation", "timestamp_gap", "size_change"]
# Sizings: native, stretched, and short side scaled then cropped (aspect kept: portrait stays portrait).
MODES = {"native": dict(size=None), "size": dict(size=(64, 80)), "scale_crop": dict(scale=72, crop=(64, 56))}
CLIPS = 5  # uniform clips per video: the first starts at frame 0, the last ends on the last frame
CLIP_LEN = 8


@pytest.fixture(scope="session")
def variants(tmp_path_factory):
    return write_variants(tmp_path_factory.mktemp("variants"))


def samples(clips, **kw):
    with shmloader.Loader(clips, batch_size=2, workers=2, timeout=60, **kw) as loader:
        out = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        return out, loader.stats()


def expected(path, mode, rotation):
    """The reference frames of ``path`` as the loader should deliver them in ``mode``."""
    kw = MODES[mode]
    if "scale" in kw:
        ref = reference(path)  # shown size of the first frame
        h, w = ref.shape[1:3]
        s = kw["scale"]
        scaled = (s, round(w * s / h)) if h <= w else (round(h * s / w), s)
        ref = reference(path, scaled)
        ch, cw = kw["crop"]
        y, x = (scaled[0] - ch) // 2, (scaled[1] - cw) // 2
        return ref[:, y : y + ch, x : x + cw]
    return reference(path, kw["size"])


# Every variant through auto's choice and through PyAV; through decord, those it reads right.
ROUTES = [(name, d) for name in VARIANTS for d in ("auto", "pyav")] + [("plain", "decord"), ("timestamp_gap", "decord")]


@pytest.mark.parametrize("name, decoder", ROUTES)
def test_every_frame_is_the_one_libavformat_shows(variants, name, decoder):
    path, vid = variants[name]
    shown = reference(path)
    n = len(shown)
    info = probe(path)
    assert info.frames == n and (info.height, info.width) == shown.shape[1:3]
    _, numbers = codes(shown, info.rotation)
    for mode, kw in MODES.items():
        if decoder == "decord" and mode == "scale_crop":
            continue  # scaled to width 96, which decord cannot copy out on AVX-512 CPUs (forced: refused)
        clips = shmloader.VideoClips([path], clip_len=CLIP_LEN, clips_per_video=CLIPS, sampling="uniform",
                                     decoder=decoder, **kw)
        got, stats = samples(clips)
        assert len(got) == CLIPS
        # Which decoder read it: the probe's choice, with no pass handed from decord to PyAV; both
        # where both read it exactly (auto measures which is faster: NOTE [ Measuring the decoder ]).
        want = info.decoder if decoder == "auto" else decoder
        if decoder == "auto" and want == "decord" and mode != "native" and stats.get("decoder_fallbacks"):
            want = "pyav"  # a width decord cannot copy out on this CPU (see test_decord_limit...)
        other = stats.get({"decord": "pyav", "pyav": "decord"}[want], 0)
        both = decoder == "auto" and measurable(info)
        assert stats.get(want, 0) + (other if both else 0) >= 1 and (both or other == 0), stats
        if want == info.decoder:  # measuring may try decord on a width it cannot copy out: once per worker
            assert stats.get("decoder_fallbacks", 0) <= (2 if both else 0) and not stats.get("reprobes"), stats
        ref = expected(path, mode, info.rotation)
        h, w = ref.shape[1:3]
        if mode == "scale_crop" and name == "rotation":
            assert info.height > info.width  # shown portrait: scaled by its width, cropped from the middle
        starts = sorted(int(s["start"]) for s in got)
        assert starts[0] == 0 and starts[-1] == n - CLIP_LEN  # the frame count is the one players show
        for s in got:
            frames = s["frames"]
            assert s["video"].shape == (CLIP_LEN, h, w, 3), (mode, s["video"].shape)
            assert list(frames) == list(range(int(s["start"]), int(s["start"]) + CLIP_LEN))
            # A crop cuts off code cells: there the pixels below say which frame it is.
            if mode != "scale_crop":
                ids, got_numbers = codes(s["video"], info.rotation)
                assert (ids == vid).all(), (mode, ids)
                np.testing.assert_array_equal(got_numbers, numbers[frames], err_msg=f"{name} {mode} {decoder}")
            diff = np.abs(s["video"].astype(np.int16) - ref[frames].astype(np.int16))
            assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 4, (mode, diff.mean(), diff.max())


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
@pytest.mark.parametrize("name", ["timestamp_gap", "edit_list", "mpegts"])
def test_fps_sampling_follows_the_stored_timestamps(variants, name, decoder):
    """Clips in seconds: each delivered frame is the one on screen at its instant, by the times a
    sequential libavformat decode gives its frames (not the probe the loader itself uses)."""
    import av

    path, vid = variants[name]
    with av.open(path) as c:
        starts = np.array([f.time for f in c.decode(video=0)])  # presentation times, in seconds
    _, numbers = codes(reference(path), probe(path).rotation)
    clips = shmloader.VideoClips([path], clip_len=6, fps=5, clips_per_video=4, sampling="uniform", size=(48, 64),
                                 decoder=decoder)
    got, _ = samples(clips)
    crossed = False
    for s in got:
        frames = s["frames"]
        instants = starts[frames[0]] + np.arange(6) / 5 + 1e-6
        on_screen = np.searchsorted(starts, instants, side="right") - 1
        np.testing.assert_array_equal(frames, on_screen)
        _, got_numbers = codes(s["video"])
        np.testing.assert_array_equal(got_numbers, numbers[frames])
        crossed |= bool((frames < 30).any() and (frames >= 30).any())
    if name == "timestamp_gap":
        assert crossed  # a clip spans the 0.4 s gap after frame 29: it shows frame 29 through it


def test_probe_names_the_decoder_and_the_problem(variants):
    # H.264 with a keyframe every 12 frames: PyAV, also where nothing else sends it there (faster)
    want = {"plain": ("pyav", ""), "edit_list": ("pyav", "edit list drops 13 frames"), "mpegts": ("pyav", ""),
            "rotation": ("pyav", ""), "timestamp_gap": ("pyav", "timestamp gap at frame 30 (0.44 s)"),
            "size_change": ("pyav", "size change at frame 30 (96x128 to 72x160)")}
    for name, (decoder, problem) in want.items():
        info = probe(variants[name][0])
        assert info.decoder == decoder, name
        assert info.problem == problem, (name, info.problem)
    assert probe(variants["rotation"][0]).rotation == 90
    assert probe(variants["mpegts"][0]).container == "mpegts"


def test_probe_names_the_damaged_frame(tmp_path):
    """"damaged at frame N" names the frame whose data was cut, in presentation order, whether
    the decoder conceals it (a frame marked corrupt) or rejects its packet (an error, no frame,
    while the frames before it are still held back for reordering): a keyframe, a P-frame and
    the B-frame decoded after it. ``"headers"`` (what the loader reads) sees none of them."""
    clean = textured(str(tmp_path / "clean.mp4"), 7, frames=90, gop=30)
    dpos = decode_order(clean)
    after_42 = int(np.flatnonzero(dpos == dpos[42] + 1)[0])  # a B-frame shown before 42
    assert after_42 < 42
    for frame in (30, 42, after_42):
        for filler in (True, False):
            bad = cut_slice(clean, str(tmp_path / f"cut{frame}{filler}.mp4"), frame, filler=filler)
            want = f"damaged at frame {frame}"
            assert probe(bad, check="frames").problem == want, (frame, filler)
            # Decoding keyframes only, a concealed P- or B-frame goes unseen; a packet that does
            # not split into NAL units is rejected before the decoder skips it.
            seen = frame == 30 or not filler
            assert probe(bad, check="keyframes").problem == (want if seen else ""), (frame, filler)
            assert probe(bad).problem == "" and probe(bad).decoder == probe(clean).decoder


@pytest.mark.parametrize("at", [0.3, 0.6])
@pytest.mark.parametrize("decoder", ["auto", "pyav"])
@pytest.mark.parametrize("kind", ["random_bytes", "cut_slice"])
def test_damaged_bytes_never_give_a_wrong_frame(variants, tmp_path, at, decoder, kind):
    """Clips over the damage fail with a SampleError naming the file, or are skipped and
    counted; every clip delivered holds the frames it says, in every pixel close to the clean
    file's frames. ``random_bytes``: 600 random bytes over the flat sample video's frame data;
    ``cut_slice``: a textured video (concealment there changes pixels) whose frame at ``at`` of
    its length lost half its slice, without B-frames and a keyframe every 20 frames: auto gives
    it to decord, which meets the damage and hands the pass to PyAV."""
    if kind == "random_bytes":
        clean = variants["plain"][0]
        bad = damage(clean, str(tmp_path / "damaged.mp4"), at=at)
    else:
        clean = textured(str(tmp_path / "textured.mp4"), 1, frames=60, gop=20, bframes=0)
        assert probe(clean).decoder == "decord"
        bad = cut_slice(clean, str(tmp_path / "damaged.mp4"), round(at * 60))
        concealed = np.abs(reference(bad).astype(np.int16) - reference(clean)).mean(axis=(1, 2, 3))
        assert concealed[round(at * 60)] > 1.0  # a concealed frame would fail the comparison below
    ref = reference(clean)
    clips = shmloader.VideoClips([bad], clip_len=CLIP_LEN, clips_per_video=7, sampling="uniform", decoder=decoder)
    got, stats = samples(clips, on_error="skip")
    assert stats["skipped"] >= 1 and stats["skipped"] + len(got) == 7
    for s in got:
        ids, numbers = codes(s["video"])
        assert (ids == 1).all()
        np.testing.assert_array_equal(numbers, s["frames"])
        diff = np.abs(s["video"].astype(np.int16) - ref[s["frames"]])
        # Per frame: a concealed frame among clean ones must not hide in a clip's mean.
        assert diff.mean(axis=(1, 2, 3)).max() < 1.0 and np.percentile(diff, 99) <= 4, (s["frames"], diff.mean())
    with shmloader.Loader(clips, batch_size=7, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError) as info:
            list(loader)
    assert bad in str(info.value)


def test_damage_decord_meets_is_handed_to_pyav(tmp_path):
    """A textured H.264 MP4 whose probe sees nothing wrong (``auto`` gives it to decord: no
    B-frames, a keyframe every 30 frames), with frame 42 in the middle GOP of three (keyframes
    0, 30, 60) cut halfway: decord's FFmpeg logs the error, decord's pass goes to PyAV
    (``decoder_fallbacks``), and PyAV refuses the frame and every frame decoded from it up to
    the next keyframe. Clips before it in its GOP, in the GOP before and from the next keyframe
    on are delivered, their frames equal to the clean file's."""
    clean = textured(str(tmp_path / "clean.mp4"), 7, frames=90, gop=30, bframes=0)
    bad = cut_slice(clean, str(tmp_path / "damaged.mp4"), 42)
    assert probe(bad).decoder == "decord" and probe(bad).problem == ""
    ref = reference(clean)
    concealed = np.abs(reference(bad).astype(np.int16) - ref).mean(axis=(1, 2, 3))
    assert (concealed[42:60] > 1.0).all()  # decord's frames here would fail the comparison below
    dpos = decode_order(clean)
    spoiled = np.flatnonzero((dpos >= dpos[42]) & (dpos < dpos[60]))
    starts = np.arange(15) * 6  # 15 uniform 6-frame clips of 90 frames
    want = [int(s) for s in starts if not np.isin(np.arange(s, s + 6), spoiled).any()]
    assert 30 in want and want[-5:] == [60, 66, 72, 78, 84]
    clips = shmloader.VideoClips([bad], clip_len=6, clips_per_video=15, sampling="uniform")
    with shmloader.Loader(clips, batch_size=3, workers=2, timeout=60, on_error="skip") as loader:
        got = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        stats, skipped = loader.stats(), loader.skipped
    assert sorted(int(s["start"]) for s in got) == want
    assert stats["skipped"] == 15 - len(want) and stats["decoder_fallbacks"] > 0 and stats["decord"] > 0, stats
    for _, sample, reason in skipped:
        assert "(the decoder marked frame 42 damaged)" in reason, reason
    for s in got:
        frames = s["frames"]
        ids, numbers = codes(s["video"])
        assert (ids == 7).all()
        np.testing.assert_array_equal(numbers, frames)
        # Native size: one YUV-to-RGB conversion from each side (0 apart here), per frame.
        diff = np.abs(s["video"].astype(np.int16) - ref[frames])
        assert diff.mean(axis=(1, 2, 3)).max() < 0.5 and diff.max() <= 2, (frames, diff.mean(axis=(1, 2, 3)))


@pytest.mark.parametrize("group_clips", [False, True])
def test_frames_decoded_from_a_damaged_frame_are_not_delivered(tmp_path, group_clips):
    """PyAV reading a file whose damage is inside a GOP that is not the last (frame 42 of a
    textured 90-frame H.264, keyframes 0, 30, 60, half its slice cut): the frame the decoder
    marks damaged and every frame decoded from it up to the next keyframe (in decode order: the
    B-frames shown before it too) fail; the clips before them, and every clip from keyframe 60
    on, arrive with the clean file's frames. One pass over a video's clips
    (``group_clips``) decodes through the damage into the next GOP: the same clips arrive."""
    clean = textured(str(tmp_path / "clean.mp4"), 7, frames=90, gop=30)
    bad = cut_slice(clean, str(tmp_path / "damaged.mp4"), 42)
    dpos = decode_order(clean)
    spoiled = np.flatnonzero((dpos >= dpos[42]) & (dpos < dpos[60]))
    assert spoiled.min() < 42 and spoiled.max() == 59  # B-frames before it, and the rest of its GOP
    starts = np.arange(15) * 6  # 15 uniform 6-frame clips of 90 frames
    want = [int(s) for s in starts if not np.isin(np.arange(s, s + 6), spoiled).any()]
    assert want[-5:] == [60, 66, 72, 78, 84] and 0 < len(want) < 15
    ref = reference(clean)
    clips = shmloader.VideoClips([bad], clip_len=6, clips_per_video=15, sampling="uniform", decoder="pyav",
                                 group_clips=group_clips)
    got, stats = samples(clips, on_error="skip")
    assert sorted(int(s["start"]) for s in got) == want
    assert stats["skipped"] == 15 - len(want) and stats["pyav"] > 0 and not stats.get("decord"), stats
    for s in got:
        np.testing.assert_array_equal(codes(s["video"])[1], s["frames"])
        diff = np.abs(s["video"].astype(np.int16) - ref[s["frames"]])
        assert diff.mean(axis=(1, 2, 3)).max() < 0.5 and diff.max() <= 2, (s["frames"], diff.mean())


@pytest.mark.parametrize("width", [24, 96])
def test_decord_limit_is_found_at_run_time_and_read_by_pyav(variants, width):
    """A width decord cannot copy out on this CPU (it follows the row alignment FFmpeg picks for
    the CPU's SIMD: 24 on every CPU model tried, 96 with AVX-512) is found by decord's own error,
    once per worker and width, and PyAV decodes it; where decord can, decord decodes it."""
    import decord

    path, vid = variants["plain"]
    info = probe(path).with_decoder("decord")  # as auto meets a file it gives decord (a manifest row may say so)
    try:
        decord.VideoReader(path, height=40, width=width).get_batch([0])
        limited = False
    except decord.DECORDError:
        limited = True
    dec = Decoding(1)
    frames = np.arange(3, 11)
    for _ in range(2):
        out = dec.decode(info, (40, width), frames)
        assert out.shape == (8, 40, width, 3)
        ids, numbers = codes(out)
        assert (ids == vid).all() and list(numbers) == list(frames)
        ref = reference(path, (40, width))[frames]
        assert np.abs(out.astype(np.int16) - ref).mean() < 1.0
    assert dec.unsupported == ({width} if limited else set())
    assert dec.fallbacks == (1 if limited else 0)  # found once, then PyAV straight away


def test_decord_limit_forced_sends_that_width_to_pyav(variants, monkeypatch):
    """The fallback branch on every CPU: decord made to refuse width 80 as it refuses some
    widths on AVX-512 CPUs (``DecoderLimit``). That width goes to PyAV, found once and then
    sent there straight away, with the right frames; other widths stay with decord."""
    from shmloader.video import decord as _decord

    path, vid = variants["plain"]
    info = probe(path).with_decoder("decord")  # as auto meets a file it gives decord
    real = _decord.Decord.decode
    tried = []

    def refuses_80(self, info, size, frames, out=None):
        tried.append(None if size is None else size[1])
        if size is not None and size[1] == 80:
            raise DecoderLimit("decord cannot produce 80 width")
        return real(self, info, size, frames, out)

    monkeypatch.setattr(_decord.Decord, "decode", refuses_80)
    dec = Decoding(1)
    frames = np.arange(3, 11)
    ref = reference(path, (40, 80))[frames]
    for _ in range(2):
        out = dec.decode(info, (40, 80), frames)
        ids, numbers = codes(out)
        assert (ids == vid).all() and list(numbers) == list(frames)
        assert np.abs(out.astype(np.int16) - ref).mean() < 1.0
    assert tried == [80] and dec.unsupported == {80} and dec.fallbacks == 1 and dict(dec.decodes) == {"pyav": 2}
    out = dec.decode(info, (40, 64), frames)
    assert list(codes(out)[1]) == list(frames) and tried == [80, 64] and dec.decodes["decord"] == 1


# Two FFmpeg builds (decord's and PyAV's wheels) run the same scaler with the same flags: their
# pixels may differ by rounding, never by a different filter (bilinear instead of bicubic moves
# the mean by 0.6 and the largest difference to 24 grey levels on these frames).
_SAME_SCALER_MEAN = 0.25
_SAME_SCALER_MAX = 2


def test_pyav_equals_decord_where_decord_decodes(variants):
    """Both decoders scale with the same filter: at every size decord can copy out on this CPU
    (the others skipped), their pixels agree within rounding."""
    path, _ = variants["plain"]
    info = probe(path)
    frames = np.array([0, 5, 13, 30, 31, 59])
    compared, refused = [], []
    for size in (None, (64, 80), (50, 70), (40, 24), (40, 32), (40, 96), (72, 144)):
        try:
            d = Decoding(1, "decord").decode(info, size, frames).copy()
        except DecoderLimit:
            refused.append(size[1])  # decord cannot copy this width out on this CPU
            continue
        p = Decoding(1, "pyav").decode(info, size, frames)
        diff = np.abs(p.astype(np.int16) - d)
        assert diff.mean() <= _SAME_SCALER_MEAN and diff.max() <= _SAME_SCALER_MAX, (size, diff.mean(), diff.max())
        compared.append(size)
    assert None in compared and (64, 80) in compared and (50, 70) in compared, (compared, refused)


def test_decoder_argument_checked(variants):
    with pytest.raises(ValueError, match="decoder"):
        shmloader.VideoClips([variants["plain"][0]], decoder="ffmpeg")


def test_m2ts_and_mts_files_are_read(tmp_path):
    """Blu-ray / AVCHD transport streams (192-byte packets: a 4-byte arrival time before each
    188-byte TS packet), as ``.m2ts`` and ``.MTS``: found by ``from_folder``, probed as MPEG-TS,
    read by PyAV, every clip's frames exact."""
    import shutil

    from shmloader.samples import write_video

    folder = tmp_path / "avchd" / "cls"
    folder.mkdir(parents=True)
    m2ts = write_video(folder / "a.m2ts", 3, frames=60, size=(96, 128), gop=12)
    mts = str(folder / "b.MTS")
    shutil.copy(m2ts, mts)
    data = open(m2ts, "rb").read()
    assert len(data) % 192 == 0 and data[4] == 0x47 and data[196] == 0x47  # 192-byte packets
    for path in (m2ts, mts):
        info = probe(path)
        assert (info.container, info.decoder, info.problem, info.frames) == ("mpegts", "pyav", "", 60)
    clips = shmloader.VideoClips.from_folder(tmp_path / "avchd", clip_len=6, clips_per_video=5, sampling="uniform",
                                             size=(48, 64))
    assert clips.paths == [m2ts, mts]
    got, stats = samples(clips)
    assert len(got) == 10 and stats.get("pyav") and not stats.get("decord")
    for s in got:
        ids, numbers = codes(s["video"])
        assert (ids == 3).all()
        np.testing.assert_array_equal(numbers, s["frames"])


def _remux_times(src: str, dst: str, times) -> str:
    """``src``'s packets (no B-frames: stored in the order shown) in ``dst`` (Matroska) with
    frame ``i`` shown at ``times[i]`` seconds."""
    import av

    with av.open(src) as i, av.open(dst, "w", format="matroska") as o:
        s = i.streams.video[0]
        out = o.add_stream_from_template(s)
        packets = [p for p in i.demux(s) if p.dts is not None]
        assert [p.pts for p in packets] == sorted(p.pts for p in packets)
        for k, p in enumerate(packets):
            p.pts = p.dts = round(times[k] / s.time_base)
            p.stream = out
            o.mux(p)
    return dst


def test_variable_frame_rate_is_named_and_fps_follows_it(tmp_path):
    """A screen recording's frame times (40, 50 and 60 ms by turns): the probe names it
    "variable frame rate", and ``fps=`` clips take the frame on screen at each instant by
    those times, with either decoder."""
    import av

    from shmloader.samples import write_video

    src = write_video(tmp_path / "src.mp4", 4, frames=60, size=(96, 128), codec="mpeg4", gop=12)
    times = np.cumsum([0.0] + [(0.04, 0.05, 0.06)[i % 3] for i in range(59)])
    path = _remux_times(src, str(tmp_path / "vfr.mkv"), list(times))
    with av.open(path) as c:
        shown = np.array([f.time for f in c.decode(video=0)])
    np.testing.assert_allclose(shown, times, atol=1e-3)
    info = probe(path)
    assert info.problem == "variable frame rate" and info.frames == 60
    for decoder in ("auto", "pyav"):
        clips = shmloader.VideoClips([path], clip_len=6, fps=10, clips_per_video=3, sampling="uniform",
                                     size=(48, 64), decoder=decoder)
        got, _ = samples(clips)
        assert len(got) == 3
        for s in got:
            instants = shown[s["frames"][0]] + np.arange(6) / 10 + 1e-6
            np.testing.assert_array_equal(s["frames"], np.searchsorted(shown, instants, side="right") - 1)
            np.testing.assert_array_equal(codes(s["video"])[1], s["frames"])
        steps = np.concatenate([np.diff(s["frames"]) for s in got])
        assert len(set(steps.tolist())) > 1  # not one constant stride: the times decide


def test_no_usable_timestamps_is_named_and_fps_refused(tmp_path):
    """A raw H.264 stream stores no timestamps: the probe says "no usable timestamps", PyAV
    reads it by counting frames (clips exact), and ``fps=`` clips are refused with the reason."""
    from shmloader.samples import write_video

    path = write_video(tmp_path / "raw.h264", 5, frames=60, size=(96, 128), gop=12)
    info = probe(path)
    assert (info.problem, info.decoder, info.frames, info.pts) == ("no usable timestamps", "pyav", 60, None)
    clips = shmloader.VideoClips([path], clip_len=6, clips_per_video=4, sampling="uniform", size=(48, 64))
    got, _ = samples(clips)
    assert len(got) == 4
    for s in got:
        np.testing.assert_array_equal(codes(s["video"])[1], s["frames"])
    timed = clips.with_options(fps=5)
    with shmloader.Loader(timed, batch_size=1, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError, match="cannot read the video's frame timestamps") as e:
            list(loader)
    assert path in str(e.value)


RAW_PROBE = textwrap.dedent("""
    import json, os, sys, threading, time

    def peak_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    def guard():  # an unbounded probe would take the machine's memory: stop it at 1 GiB
        while True:
            if peak_mib() > 1024:
                print(json.dumps({"error": "over 1 GiB"}), flush=True)
                os._exit(0)
            time.sleep(0.05)

    from shmloader.video.probe import probe
    before = peak_mib()
    threading.Thread(target=guard, daemon=True).start()
    out = {}
    for check in ("headers", "keyframes"):
        try:
            probe(sys.argv[1], check=check)
            out[check] = "read"
        except Exception as e:
            out[check] = f"{type(e).__name__}: {e}"
    print(json.dumps({**out, "grew_mib": peak_mib() - before}))
""")


def test_a_raw_stream_with_no_frame_in_it_is_refused_in_bounded_memory(tmp_path, caplog):
    """A raw H.264 stream (no container) of 1 TiB of zeros, a sparse file: FFmpeg's parser keeps
    every byte it reads looking for where a frame starts (~160 MB/s, for as long as the file
    lasts). The probe reads at most ``_RAW_GAP`` past the last frame, then refuses the file with
    the reason: its memory grows by a few times that, at most. Through the loader: the
    skip names the file and the reason; a real raw stream beside it is read."""
    from shmloader.samples import write_video
    from shmloader.video.packets import RAW_GAP as _RAW_GAP

    from ._examples import run_child

    zeros = str(tmp_path / "zeros.h264")
    with open(zeros, "wb") as f:
        f.truncate(1 << 40)
    r = run_child(RAW_PROBE, zeros, timeout=120)
    why = f"no frame starts in {_RAW_GAP >> 20} MiB of the raw stream from byte 0 (not a raw video stream?)"
    assert r.get("headers") == r.get("keyframes") == f"NoFrameBoundary: {why}", r
    assert r["grew_mib"] < 3 * (_RAW_GAP >> 20), r
    real = write_video(tmp_path / "real.h264", 5, frames=30, size=(96, 128), gop=12)
    clips = shmloader.VideoClips([zeros, real], clip_len=6, size=(48, 64))
    with shmloader.Loader(clips, batch_size=1, workers=1, timeout=60, on_error="skip") as loader:
        got = [int(b["index"][0]) for b in loader]
        skipped = loader.skipped
    assert got == [1] and [(i, why in reason) for i, _, reason in skipped] == [(0, True)], skipped
    assert f"skipped sample 0 ({zeros!r}): shmloader.video.packets.NoFrameBoundary: {why}" in caplog.text


def _vp9_two_sizes(path: str) -> str:
    """A VP9 WebM of 60 frame-code frames whose size changes at frame 30 (96x128 to 72x160)."""
    import fractions

    import av

    from shmloader.video.samples import frame_image

    sizes, n = ((96, 128), (72, 160)), 30
    with av.open(path, "w") as dst:
        o = dst.add_stream("libvpx-vp9", rate=25)
        o.width, o.height, o.pix_fmt = sizes[0][1], sizes[0][0], "yuv420p"
        for k, (h, w) in enumerate(sizes):
            cc = av.CodecContext.create("libvpx-vp9", "w")
            cc.width, cc.height, cc.pix_fmt = w, h, "yuv420p"
            cc.time_base, cc.framerate, cc.bit_rate = fractions.Fraction(1, 25), 25, 2_000_000
            cc.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
            packets = []
            for i in range(k * n, (k + 1) * n):
                f = av.VideoFrame.from_ndarray(frame_image(8, i, h, w), format="rgb24").reformat(format="yuv420p")
                f.pts = i
                packets += cc.encode(f)
            packets += cc.encode(None)
            for p in packets:
                p.stream, p.time_base = o, fractions.Fraction(1, 25)
                dst.mux(p)
    return path


def test_a_vp9_size_change_is_found_by_scan_not_by_the_loaders_probe(tmp_path):
    """VP9 states its frame size in each keyframe, not in sequence headers the loader's probe
    reads: the probe the loader runs (``check="headers"``) sees one size, as the docs say (FAQ, limits);
    ``scan``'s default ``check="keyframes"`` names the change and sends the file to PyAV, which
    then scales both sizes to the clip size (every frame's code exact)."""
    path = written_apart("libvpx-vp9", _vp9_two_sizes, str(tmp_path / "two_sizes.webm"))
    headers = probe(path)
    assert (headers.codec, headers.problem, headers.frames) == ("vp9", "", 60)
    scanned = probe(path, check="keyframes")
    assert scanned.problem == "size change at frame 30 (96x128 to 72x160)" and scanned.decoder == "pyav"
    ref = reference(path, (48, 64))
    assert (codes(ref)[1] == np.arange(60)).all()
    d = Decoding(1)
    out = d.decode(scanned, (48, 64), np.arange(24, 36))
    np.testing.assert_array_equal(codes(out)[1], np.arange(24, 36))
    assert np.abs(out.astype(np.int16) - ref[24:36]).mean() < 1.0 and dict(d.decodes) == {"pyav": 1}
