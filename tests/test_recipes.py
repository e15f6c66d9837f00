"""Video recipes: several clips per sample in one pass, clips in seconds, short videos,
aspect-preserving scale + crop, multi-view evaluation. Every clip is checked against decord's
own decode of the frames the sample says it holds, and against the frame codes."""

from __future__ import annotations

import os
import sys

import decord
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import frame_image, read_codes, write_video
from shmloader.sampling import clip_frames

from ._variants import reference as libav_reference

LANDSCAPE = (96, 128)
PORTRAIT = (128, 72)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """Video 10 landscape and video 11 portrait, 40 frames each."""
    d = tmp_path_factory.mktemp("shapes")
    return [write_video(d / "wide.mp4", 10, frames=40, size=LANDSCAPE),
            write_video(d / "tall.mp4", 11, frames=40, size=PORTRAIT)]


@pytest.fixture(scope="module")
def rates(tmp_path_factory):
    """The same 2.4 s at 25 fps (60 frames) and at 50 fps (120 frames)."""
    d = tmp_path_factory.mktemp("rates")
    return [write_video(d / "fps25.mp4", 20, frames=60, fps=25),
            write_video(d / "fps50.mp4", 21, frames=120, fps=50)]


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("short") / "short.mp4", 30, frames=5)


def samples_of(clips, workers=2, batch_size=2, **kw):
    out = []
    with shmloader.Loader(clips, batch_size=batch_size, workers=workers, **kw) as loader:
        for b in loader:
            out.extend({k: np.array(v[i]) for k, v in b.items()} for i in range(len(b["index"])))
    return out


def decord_frames(path, frames, size=None):
    vr = decord.VideoReader(path) if size is None else decord.VideoReader(path, height=size[0], width=size[1])
    return vr.get_batch(list(frames)).asnumpy()


def test_k_clips_are_decords_frames_at_their_starts(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, frame_step=3, clips_per_sample=3, size=(64, 64))
    samples = samples_of(clips, shuffle=True, seed=3)
    assert len(samples) == len(paths)
    starts = set()
    for s in samples:
        v = int(s["index"])
        assert s["video"].shape == (3, 4, 64, 64, 3) and s["frames"].shape == (3, 4) and s["start"].shape == (3,)
        for k in range(3):
            expected = int(s["start"][k]) + 3 * np.arange(4)
            np.testing.assert_array_equal(s["frames"][k], expected)
            np.testing.assert_array_equal(s["video"][k], decord_frames(paths[v], expected, (64, 64)))
            ids, numbers = read_codes(s["video"][k])
            assert (ids == v).all() and (numbers == expected).all()
        starts.add(tuple(s["start"]))
    # Independent random starts: not all equal within a sample, not the same in every sample.
    assert any(len(set(st)) > 1 for st in starts) and len(starts) > 1


def test_one_clip_keeps_todays_shapes_and_reports_frames(videos):
    paths, _ = videos
    (s, *_) = samples_of(shmloader.VideoClips(paths[:2], clip_len=5, frame_step=2, size=(64, 64)))
    assert s["video"].shape == (5, 64, 64, 3) and s["start"].shape == () and s["frames"].shape == (5,)
    np.testing.assert_array_equal(s["frames"], int(s["start"]) + 2 * np.arange(5))
    assert (read_codes(s["video"])[1] == s["frames"]).all()


def test_uniform_spreads_k_clips_over_the_video(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths[:2], clip_len=4, frame_step=2, clips_per_sample=5,
                                 sampling="uniform", size=(64, 64))
    last = 40 - 7
    for s in samples_of(clips):
        assert list(s["start"]) == [round(k * last / 4) for k in range(5)]
        assert (read_codes(s["video"])[1] == s["frames"]).all()


def test_fps_gives_clips_of_equal_duration_at_25_and_50_fps(rates):
    clips = shmloader.VideoClips(rates, clip_len=6, fps=5, size=(64, 64), clips_per_sample=4)
    samples = samples_of(clips, batch_size=2, epochs=3, shuffle=True)
    assert len(samples) == 6
    for s in samples:
        v = int(s["index"])
        native = (25, 50)[v]
        ts = decord.VideoReader(rates[v]).get_frame_timestamp(s["frames"].ravel()).reshape(4, 6, 2)
        for k in range(4):
            # every 1/5 s of video time: 5 frames apart at 25 fps, 10 at 50 fps
            np.testing.assert_array_equal(np.diff(s["frames"][k]), native // 5)
            assert ts[k, -1, 0] - ts[k, 0, 0] == pytest.approx(1.0, abs=1e-3)
            ids, numbers = read_codes(s["video"][k])
            assert (ids == 20 + v).all() and (numbers == s["frames"][k]).all()
        assert s["frames"].max() < 60 * native // 25


def test_fps_uses_the_timestamps_as_stored(tmp_path):
    """A Matroska file muxed without timestamps gets made-up ones 1 ms apart from libavformat,
    as every player sees them: by time the video lasts 20 ms, so a 0.8 s clip is refused
    naming the file; by frame index it is read as usual."""
    import av

    path = str(tmp_path / "nopts.mkv")
    with av.open(path, "w", format="matroska") as c:
        stream = c.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(21):
            frame = None if i == 20 else av.VideoFrame.from_ndarray(frame_image(1, i, 48, 64), format="rgb24")
            for packet in stream.encode(frame):
                packet.pts = packet.dts = None
                c.mux(packet)
    clips = shmloader.VideoClips([path], clip_len=4, fps=5, size=(48, 64))
    with shmloader.Loader(clips, batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="shorter than one clip") as info:
            next(iter(loader))
    assert "nopts.mkv" in str(info.value)
    (s,) = samples_of(shmloader.VideoClips([path], clip_len=4, size=(48, 64)), workers=1, batch_size=1)
    assert (read_codes(s["video"])[1] == s["frames"]).all()


@pytest.mark.parametrize("case", ["missing", "overlap", "backwards", "zero_length", "wrong_shape"])
def test_fps_refuses_timestamps_it_cannot_trust(case):
    """The timestamp check itself, on arrays: each broken case is refused, not sampled."""
    begin = np.arange(10) * 0.04
    pts = np.stack([begin, begin + 0.04], axis=1)
    broken = {"missing": None, "overlap": pts - np.where(np.arange(10) == 5, 0.03, 0)[:, None],
              "backwards": pts[::-1].copy(), "zero_length": np.stack([begin, begin], axis=1),
              "wrong_shape": pts[:9]}[case]
    kw = dict(clip_len=3, frame_step=1, fps=12.5, sampling="center", clips=[0], total_clips=1,
              short_video="error", rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="frame timestamps"):
        clip_frames(10, broken, **kw)
    frames = clip_frames(10, pts, **kw)  # the same video with sound timestamps
    assert frames.shape == (1, 3) and (np.diff(frames) == 2).all()
    gap = pts.copy()
    gap[5:] += 1.0  # a gap is not broken: the frame before it stays on screen through it
    gap[4, 1] = gap[5, 0]
    for start in range(10):
        f = clip_frames(10, gap, **{**kw, "sampling": "random", "rng": np.random.default_rng(start)})[0]
        instants = gap[f[0], 0] + np.arange(3) / 12.5 + 1e-6
        assert ((gap[f, 0] <= instants) & (instants < gap[f, 1])).all()


@pytest.mark.parametrize("policy, frames", [("repeat_last", [0, 2, 4, 4]), ("wrap", [0, 2, 4, 0])])
def test_short_video_policies(short, policy, frames):
    clips = shmloader.VideoClips([short], clip_len=4, frame_step=2, short_video=policy, size=(64, 64),
                                 clips_per_sample=2)
    (s,) = samples_of(clips, workers=1, batch_size=1)
    for k in range(2):
        assert list(s["frames"][k]) == frames
        ids, numbers = read_codes(s["video"][k])
        assert (ids == 30).all() and list(numbers) == frames
        np.testing.assert_array_equal(s["video"][k], decord_frames(short, frames, (64, 64)))


@pytest.mark.parametrize("policy, frames", [("repeat_last", [0, 2, 4, 4]), ("wrap", [0, 2, 4, 0])])
def test_short_video_policies_in_seconds(short, policy, frames):
    # 5 frames at 25 fps = 0.2 s; 4 frames at 12.5 fps need 0.32 s
    clips = shmloader.VideoClips([short], clip_len=4, fps=12.5, short_video=policy, size=(64, 64))
    (s,) = samples_of(clips, workers=1, batch_size=1)
    assert list(s["frames"]) == frames and list(read_codes(s["video"])[1]) == frames


def test_short_video_error_is_the_default(short):
    with shmloader.Loader(shmloader.VideoClips([short], clip_len=4, frame_step=2, size=(64, 64)),
                          batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="5 frames, shorter than one clip"):
            next(iter(loader))


def expected_scaled(path, native, short_side):
    h, w = native
    return (short_side, round(w * short_side / h)) if h <= w else (round(h * short_side / w), short_side)


def test_scale_keeps_aspect_and_crops_not_stretches(shapes):
    clips = shmloader.VideoClips(shapes, clip_len=3, frame_step=4, scale=64, crop=(48, 48))
    samples = samples_of(clips, workers=2)
    assert {int(s["index"]) for s in samples} == {0, 1}
    for s in samples:
        v = int(s["index"])
        sh, sw = expected_scaled(shapes[v], (LANDSCAPE, PORTRAIT)[v], 64)
        assert (sh, sw) == ((64, 85), (114, 64))[v]
        full = decord_frames(shapes[v], s["frames"], (sh, sw))
        y, x = (sh - 48) // 2, (sw - 48) // 2
        assert s["video"].shape == (3, 48, 48, 3)
        np.testing.assert_array_equal(s["video"], full[:, y : y + 48, x : x + 48])
        stretched = decord_frames(shapes[v], s["frames"], (64, 64))[:, 8:56, 8:56]
        assert np.abs(s["video"].astype(int) - stretched).mean() > 5  # stretching would differ


def test_scale_range_and_random_crop_are_seeded_and_worker_independent(shapes, videos):
    paths = shapes + videos[0][:4]
    clips = shmloader.VideoClips(paths, clip_len=3, frame_step=2, scale=(56, 80), crop=(48, 40),
                                 crop_at="random", clips_per_sample=2)
    one = samples_of(clips, workers=1, batch_size=3, shuffle=True, seed=5, epochs=2)
    three = samples_of(clips, workers=3, batch_size=3, shuffle=True, seed=5, epochs=2)
    other = samples_of(clips, workers=2, batch_size=3, shuffle=True, seed=6, epochs=2)
    assert len(one) == len(three) == 12
    for a, b in zip(one, three):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a["video"], b["video"]) for a, b in zip(one, other))
    # Each clip is some 48x40 window of decord's decode at some short side in [56, 80].
    s = one[0]
    v = int(s["index"])
    native = {0: LANDSCAPE, 1: PORTRAIT}.get(v, (96, 128))
    found = False
    for side in range(56, 81):
        full = decord_frames(paths[v], s["frames"][0], expected_scaled(paths[v], native, side))
        for y in range(full.shape[1] - 48 + 1):
            for x in range(full.shape[2] - 40 + 1):
                if np.array_equal(full[:, y : y + 48, x : x + 40], s["video"][0]):
                    found = True
                    break
            if found:
                break
        if found:
            break
    assert found


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """12 frames of random texture, 96x128: every crop window differs from every other."""
    import av

    path = str(tmp_path_factory.mktemp("textured") / "texture.mp4")
    rng = np.random.default_rng(0)
    with av.open(path, "w") as c:
        stream = c.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for _ in range(12):
            img = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return path


def windows_of(clip, full):
    """Top-left corners (y, x) of every window of ``full`` [T, H, W, 3] equal to ``clip`` [T, h, w, 3]."""
    h, w = clip.shape[1:3]
    views = np.lib.stride_tricks.sliding_window_view(full, (h, w), axis=(1, 2))  # [T, y, x, 3, h, w]
    equal = (views == clip.transpose(0, 3, 1, 2)[:, None, None]).all(axis=(0, 3, 4, 5))
    return [(int(y), int(x)) for y, x in np.argwhere(equal)]


def crop_windows_seen(path, seed, workers, **kw):
    """{(epoch, sample, clip): (y, x)} of a loader's random crops, each found as the one 48x40
    window of decord's decode at 64x85 that the clip equals."""
    clips = shmloader.VideoClips([path], clip_len=2, frame_step=3, clips_per_video=2, clips_per_sample=3,
                                 sampling="uniform", scale=64, crop=(48, 40), **kw)
    samples = samples_of(clips, workers=workers, batch_size=1, seed=seed, epochs=2)
    assert len(samples) == 4
    seen = {}
    for n, s in enumerate(samples):
        for k in range(3):
            (corner,) = windows_of(s["video"][k], decord_frames(path, s["frames"][k], (64, 85)))
            seen[n // 2, n % 2, k] = corner
    return seen


def test_random_crops_are_one_seeded_window_per_clip(textured):
    one = crop_windows_seen(textured, 5, 1, crop_at="random")
    # Each clip of a sample has its own window, drawn anew every epoch...
    for epoch in range(2):
        for sample in range(2):
            assert len({one[epoch, sample, k] for k in range(3)}) > 1
    assert [one[0, s, k] for s in range(2) for k in range(3)] != [one[1, s, k] for s in range(2) for k in range(3)]
    # ...from the seed: the same windows whatever the workers, other windows with another seed.
    assert crop_windows_seen(textured, 5, 2, crop_at="random") == one
    other = crop_windows_seen(textured, 6, 2, crop_at="random")
    assert sum(other[key] != one[key] for key in one) > len(one) // 2
    # And the evaluation version takes the center window: ((64 - 48) / 2, (85 - 40) / 2).
    clips = shmloader.VideoClips([textured], clip_len=2, frame_step=3, clips_per_sample=3, scale=(64, 80),
                                 crop=(48, 40), crop_at="random")
    assert clips.for_eval().pixels.crop_at == "center"
    with shmloader.eval_loader(clips, batch_size=1) as loader:
        (batch,) = list(loader)
    for k in range(3):
        full = decord_frames(textured, batch["frames"][0, k], (64, 85))
        assert windows_of(batch["video"][0, k], full) == [(8, 22)]


def test_three_crops_are_the_three_windows_along_the_long_side(shapes):
    clips = shmloader.VideoClips(shapes, clip_len=2, frame_step=5, scale=64, crop=(64, 64), crop_at="three")
    for s in samples_of(clips):
        v = int(s["index"])
        sh, sw = ((64, 85), (114, 64))[v]
        full = decord_frames(shapes[v], s["frames"], (sh, sw))
        assert s["video"].shape == (3, 2, 64, 64, 3)
        if v == 0:  # landscape: left, center, right
            windows = [full[:, :, 0:64], full[:, :, 10:74], full[:, :, 21:85]]
        else:  # portrait: top, center, bottom
            windows = [full[:, 0:64], full[:, 25:89], full[:, 50:114]]
        for c in range(3):
            np.testing.assert_array_equal(s["video"][c], windows[c])


def test_multi_view_eval_ten_clips_three_crops_in_view_order(shapes):
    clips = shmloader.VideoClips(shapes, clip_len=3, frame_step=2, scale=(64, 96), crop=(56, 56),
                                 crop_at="random")
    test_clips = clips.with_options(clips_per_sample=10, crop_at="three")
    with shmloader.eval_loader(test_clips, batch_size=2) as loader:
        (batch,) = list(loader)
        assert batch["video"].shape == (2, 30, 3, 56, 56, 3) and batch["frames"].shape == (2, 10, 3)
        for i, v in enumerate(batch["index"]):
            last = 40 - 5
            assert list(batch["start"][i]) == [round(k * last / 9) for k in range(10)]
            sh, sw = expected_scaled(shapes[v], (LANDSCAPE, PORTRAIT)[v], 64)  # eval: S_min
            for k in (0, 4, 9):
                full = decord_frames(shapes[v], batch["frames"][i, k], (sh, sw))
                dy, dx = sh - 56, sw - 56
                corners = [(dy // 2, 0), (dy // 2, dx // 2), (dy // 2, dx)] if v == 0 else \
                    [(0, dx // 2), (dy // 2, dx // 2), (dy, dx // 2)]
                for c, (y, x) in enumerate(corners):
                    np.testing.assert_array_equal(batch["video"][i, 3 * k + c], full[:, y : y + 56, x : x + 56])


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_native_width_96(tmp_path, decoder):
    """A 96-pixel-wide video (decord cannot copy that width out on some CPUs) is delivered at its
    own size and scaled: decord's own frames where it produces them, else libavformat's."""
    path = write_video(tmp_path / "narrow.mp4", 40, frames=12, size=(128, 96))
    clips = shmloader.VideoClips([path], clip_len=3, frame_step=2, decoder=decoder)
    (s,) = samples_of(clips, workers=1, batch_size=1)
    assert s["video"].shape == (3, 128, 96, 3)
    ids, numbers = read_codes(s["video"])
    assert (ids == 40).all() and (numbers == s["frames"]).all()
    scaled = shmloader.VideoClips([path], clip_len=3, frame_step=2, scale=56, crop=(56, 56), decoder=decoder)
    (c,) = samples_of(scaled, workers=1, batch_size=1)
    for got, size, window in ((s, None, slice(None)), (c, (75, 56), slice(9, 65))):
        try:
            ref = decord_frames(path, got["frames"], size)
        except decord.DECORDError:
            ref = libav_reference(path, size)[got["frames"]]
            assert np.abs(got["video"].astype(np.int16) - ref[:, window]).max() <= 4
        else:
            np.testing.assert_array_equal(got["video"], ref[:, window])


def threads_while_reading(clips):
    """(most threads this process had while ``clips`` read sample 0, the sample): read here as a
    worker reads, ``worker_init()`` then ``read()``; the threads are counted on every Python call
    made meanwhile (the decoders' own included), while their FFmpeg decoder is open."""
    source = clips.for_workers()
    source.worker_init()
    out = {k: np.zeros(shape, dtype) for k, (shape, dtype) in clips.spec().items()}
    peak = 0

    def count(frame, event, arg):
        nonlocal peak
        peak = max(peak, len(os.listdir("/proc/self/task")))

    sys.setprofile(count)
    try:
        source.read(0, np.random.default_rng(0), out)
    finally:
        sys.setprofile(None)
    return peak, out


@pytest.mark.parametrize("decoder", ["decord", "pyav"])
def test_decode_threads_decode_with_more_threads_and_the_same_frames(videos, decoder):
    kw = dict(clip_len=8, frame_step=2, size=(64, 64), decoder=decoder)
    one, a = threads_while_reading(shmloader.VideoClips(videos[0][:1], **kw))
    four, b = threads_while_reading(shmloader.VideoClips(videos[0][:1], decode_threads=4, **kw))
    assert four >= one + 2, (one, four)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert (read_codes(b["video"])[1] == b["frames"]).all()


def test_a_worker_probes_a_video_once_while_the_file_is_unchanged(tmp_path):
    """Read here as a worker reads: the native size (here for ``scale=``) and the rest of the
    probe are read at the first sample of a video and kept; a file that changed is probed again."""
    from shmloader.video import probe as _probe

    path = write_video(tmp_path / "v.mp4", 3, frames=20)
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=3, scale=64, crop=(48, 48))
    source = clips.for_workers()
    source.worker_init()
    probes = 0

    def count(frame, event, arg):
        nonlocal probes
        probes += event == "call" and frame.f_code is _probe.probe.__code__

    def read(sample):
        out = {k: np.zeros(shape, dtype) for k, (shape, dtype) in clips.spec().items()}
        sys.setprofile(count)
        try:
            source.read(sample, np.random.default_rng(sample), out)
        finally:
            sys.setprofile(None)
        np.testing.assert_array_equal(out["video"], decord_frames(path, out["frames"], (64, 85))[:, 8:56, 18:66])

    for sample in (0, 1, 2, 0):
        read(sample)
    assert probes == 1
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    read(1)
    read(2)
    assert probes == 2


@pytest.mark.parametrize("kw, name", [
    (dict(clips_per_sample=0), "clips_per_sample"),
    (dict(scale=64, crop=(72, 48)), "S_min"),
    (dict(scale=(80, 64), crop=(48, 48)), "S_min <= S_max"),
    (dict(scale=64), "crop"),
    (dict(scale=64, crop=(48, 48), size=(64, 64)), "size"),
    (dict(fps=0), "fps"),
    (dict(fps=-2.5), "fps"),
    (dict(fps=5, frame_step=2), "frame_step"),
    (dict(short_video="pad"), "short_video"),
    (dict(crop_at="corner", crop=(32, 32)), "crop_at"),
    (dict(crop_at="three"), "crop"),
    (dict(crop=(0, 32)), "crop"),
    (dict(size=(32, 32), crop=(48, 48)), "crop"),
])
def test_bad_recipe_arguments(videos, kw, name):
    with pytest.raises(ValueError, match=name):
        shmloader.VideoClips(videos[0], **kw)


# Keras evaluates a dataset of unknown length (from_generator) until it ends, then says its input
# "ran out of data": the eval loader's one pass is the whole evaluation here, as the README's.
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_keras_averages_predictions_over_the_views_as_the_readme_shows(shapes):
    import keras
    import tensorflow as tf

    clips = shmloader.VideoClips(shapes, [0, 1], clip_len=2, frame_step=4, scale=(48, 64), crop=(48, 48),
                                 crop_at="random")
    test_clips = clips.with_options(clips_per_sample=2, crop_at="three")  # 6 views per video
    model = keras.Sequential([keras.Input((2, 48, 48, 3)), keras.layers.GlobalAveragePooling3D(),
                              keras.layers.Dense(2, activation="softmax")])
    views_model = keras.Sequential([
        keras.Input((6, 2, 48, 48, 3)),
        keras.layers.TimeDistributed(model),
        keras.layers.Lambda(lambda p: keras.ops.mean(p, axis=1)),
    ])
    views_model.compile(metrics=["accuracy"], loss="sparse_categorical_crossentropy")
    with shmloader.eval_loader(test_clips, batch_size=2) as test:
        ds = test.as_dataset().map(lambda b: (tf.cast(b["video"], tf.float32) / 255, b["label"]))
        loss, _ = views_model.evaluate(ds, verbose=0)
        (batch,) = list(test)
    x = batch["video"].astype(np.float32) / 255
    per_view = model.predict(x.reshape(-1, 2, 48, 48, 3), verbose=0).reshape(2, 6, 2)
    expected = -np.log(per_view.mean(axis=1)[[0, 1], [0, 1]]).mean()
    assert loss == pytest.approx(expected, rel=1e-4)
