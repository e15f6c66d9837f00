"""Audio of whole-video samples (``sampling="segments"``, ``fps=F, max_frames=N``): one span from a
sample's first delivered frame to the end of its latest, ``audio_seconds`` of room, longer spans
cut there, shorter ones zero-padded; checked against a decode of the whole track.

The test videos (``tests/_sound.py``) carry a 441 Hz tone whose amplitude changes at every video
frame, so that audio placed one frame off shows in the levels."""

from __future__ import annotations

import numpy as np
import pytest

import shmloader

from ._sound import FPS, RATE, assert_levels_follow_frames, expected, reference, write_av

pytestmark = pytest.mark.timeout(180)

# Two seconds of video (50 frames at 25 fps), AAC in MP4 and PCM in MOV: placed to the sample.
_SHAPES = [("aac", "mp4"), ("pcm_s16le", "mov")]
_RECIPES = {"segments": dict(clip_len=8, sampling="segments"),
            "segments_uniform": dict(clip_len=8, sampling="segments_uniform"),
            "max_frames": dict(fps=5.0, max_frames=6),  # 10 instants thinned to 6
            "max_frames_padded": dict(fps=5.0, max_frames=16, sampling="uniform")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    made = {shape: write_av(folder / f"{shape[0]}.{shape[1]}", shape[0]) for shape in _SHAPES}
    made["short"] = write_av(folder / "short.mp4", "aac", frames=15)  # 0.6 s
    return made


def _check(audio, length, frames, ref, room, t0=None):
    """A sample's audio: the whole-track decode from its first frame's time (or ``t0``) to the end
    of its latest frame, cut at ``room`` samples; zeros after."""
    frames = frames[frames >= 0]  # max_frames pads with -1
    start = frames[0] / FPS if t0 is None else t0
    n = min(room, round(((frames.max() + 1) / FPS - start) * RATE))
    assert length == n, (frames, length, n)
    np.testing.assert_allclose(audio[:n], expected(ref, start, n), atol=0.02)
    assert not audio[n:].any()
    return n


@pytest.mark.parametrize("codec,ext", _SHAPES)
@pytest.mark.parametrize("recipe", list(_RECIPES))
def test_a_samples_audio_is_the_whole_track_sliced_at_its_first_frame(files, recipe, codec, ext):
    """Room for 3 s, videos of 2 s: each sample's span whole, zeros after it."""
    path = files[(codec, ext)]
    clips = shmloader.VideoClips([path], clips_per_video=3, audio_rate=RATE, audio_seconds=3.0,
                                 **_RECIPES[recipe])
    room = 3 * RATE
    assert clips.spec()["audio"] == ((room, 1), np.dtype(np.float32))
    assert clips.spec()["audio_len"] == ((), np.dtype(np.int32))
    got = clips.reader().read(range(3), seed=1)
    ref = reference(path)
    for audio, length, frames in zip(got["audio"], got["audio_len"], got["frames"]):
        n = _check(audio, length, frames, ref, room)
        real = frames[frames >= 0]
        assert n >= round((real.max() - real[0]) / FPS * RATE) > RATE  # spread over the video
        assert_levels_follow_frames(audio, np.arange(real[0], real.max() + 1), real[0])


@pytest.mark.parametrize("recipe", ["segments", "max_frames"])
def test_a_video_longer_than_audio_seconds_is_cut_there(files, recipe):
    """Half a second of room for two-second videos: the span's first half second, ``audio_len``
    S, never an error (a clip's longer span is one)."""
    path = files[("pcm_s16le", "mov")]
    clips = shmloader.VideoClips([path], clips_per_video=2, audio_rate=RATE, audio_seconds=0.5,
                                 **_RECIPES[recipe])
    room = RATE // 2
    assert clips.audio_samples == room
    got = clips.reader().read([0, 1])
    ref = reference(path)
    for audio, length, frames in zip(got["audio"], got["audio_len"], got["frames"]):
        assert _check(audio, length, frames, ref, room) == room
        f0 = frames[0]
        assert_levels_follow_frames(audio, np.arange(f0, f0 + round(0.5 * FPS)), f0)


@pytest.mark.parametrize("recipe", ["segments", "max_frames_padded"])
def test_videos_of_several_lengths_share_the_room_shorter_ones_padded(files, recipe):
    """A 0.6-s and a 2-s video in one batch of 1.2 s of room: the short one's sound whole and
    zeros after, the long one's cut at 1.2 s."""
    paths = [files["short"], files[("aac", "mp4")]]
    kw = dict(_RECIPES[recipe], clip_len=4) if recipe == "segments" else _RECIPES[recipe]
    clips = shmloader.VideoClips(paths, audio_rate=RATE, audio_seconds=1.2, **kw)
    got = clips.reader().read([0, 1])
    room = round(1.2 * RATE)
    short, long = (_check(a, n, f, reference(p), room)
                   for a, n, f, p in zip(got["audio"], got["audio_len"], got["frames"], paths))
    assert short < round(0.6 * RATE) + 1 and not got["audio"][0][short:].any()
    assert long == room


def test_a_samples_span_lies_inside_its_spans_row(files):
    """``spans=[(0.5, 1.5)]``: the frame on screen at 0.5 s started at 0.48 s; the sample's sound
    starts at 0.5 s, as sampling cuts that frame to the row, and ends by 1.5 s."""
    path = files[("pcm_s16le", "mov")]
    clips = shmloader.VideoClips([path], fps=25.0, max_frames=8, sampling="uniform", spans=[(0.5, 1.5)],
                                 audio_rate=RATE, audio_seconds=2.0)
    got = clips.reader().read([0])
    frames, audio, length = got["frames"][0], got["audio"][0], int(got["audio_len"][0])
    assert frames[0] == 12 and frames.max() <= 37  # frame 12 is on screen from 0.48 s
    end = min(1.5, (frames.max() + 1) / FPS)
    assert length == round((end - 0.5) * RATE)
    np.testing.assert_allclose(audio[:length], expected(reference(path), 0.5, length), atol=0.02)
    assert not audio[length:].any()


@pytest.mark.parametrize("kwargs", [dict(clip_len=8, sampling="segments"),
                                    dict(clip_len=8, sampling="segments_uniform"),
                                    dict(fps=5.0, max_frames=6)])
def test_whole_video_audio_without_audio_seconds_is_refused_naming_it(files, kwargs):
    recipe = "max_frames" if "max_frames" in kwargs else kwargs["sampling"]
    with pytest.raises(ValueError, match=rf"{recipe}.* needs audio_seconds=.*sets S, the fixed room"):
        shmloader.VideoClips([files[("aac", "mp4")]], audio_rate=RATE, **kwargs)


def test_the_loaders_workers_fill_the_ring_with_each_draws_audio(files):
    """Segments, two draws a sample (``[K, S, C]``), two workers: the ring's slots hold the
    reader's audio, each draw its own span; the batch's fields are views of the slot."""
    paths = [files[("aac", "mp4")], files[("pcm_s16le", "mov")], files["short"]]
    clips = shmloader.VideoClips(paths, clip_len=4, sampling="segments", clips_per_video=2, clips_per_sample=2,
                                 audio_rate=RATE, audio_channels=2, audio_seconds=1.5)
    room = round(1.5 * RATE)
    assert clips.spec()["audio"] == ((2, room, 2), np.dtype(np.float32))
    assert clips.spec()["audio_len"] == ((2,), np.dtype(np.int32))
    rows = []
    with shmloader.Loader(clips, batch_size=2, workers=2, seed=7, timeout=60) as loader:
        for batch in loader:
            for name in ("audio", "audio_len"):
                assert loader._ring.contains(batch[name].ctypes.data), name
            rows += [{k: np.array(v[i]) for k, v in batch.items()} for i in range(len(batch["index"]))]
    assert len(rows) == len(clips)
    alone = clips.reader().read(range(len(clips)), seed=7)
    for i, row in enumerate(rows):  # no shuffle: in order
        np.testing.assert_array_equal(row["frames"], alone["frames"][i])
        np.testing.assert_array_equal(row["audio_len"], alone["audio_len"][i])
        np.testing.assert_allclose(row["audio"], alone["audio"][i], atol=1e-4)
        ref = reference(paths[int(row["index"])], channels=2)
        for k in range(2):
            _check(row["audio"][k], row["audio_len"][k], row["frames"][k], ref, room)
    assert {int(n) for r in rows for n in r["audio_len"]} & {room}  # the 2-s videos are cut


def test_the_guides_example_runs(files):
    from ._examples import doc_example

    namespace = {"shmloader": shmloader, "paths": [files[("aac", "mp4")], files["short"]] * 2}
    exec(doc_example("audio-whole"), namespace)
    assert namespace["audio"].shape == (4, 30 * RATE, 1) and namespace["mask"].shape == (4, 16)
    lengths = [int(n) for n in namespace["audio_len"]]
    assert all(0 < n < 2 * RATE for n in lengths) and lengths[0] > lengths[1]
