"""TSN segments (``sampling="segments"``): N frames spread over the whole video, one in each of N
equal stretches of presentation time, a seeded frame of each in training (N distinct ones) and at the
centre in evaluation. Checked against the frame times of a sequential libavformat decode (not
the probe the loader uses), on videos of several lengths and frame rates and a variable-rate
one, with both decoders."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import shmloader
from shmloader.video.samples import read_codes

from ._variants import frame_times, reference
from .conftest import state_after

pytestmark = pytest.mark.timeout(180)

N = 8


def samples_of(clips, workers=2, batch_size=2, **kw):
    with shmloader.Loader(clips, batch_size=batch_size, workers=workers, timeout=60, **kw) as loader:
        out = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        return out, loader.stats()


def on_screen(times, instants):
    """The frame shown at each instant (seconds from the first frame's start)."""
    return np.searchsorted(times[:, 0], np.asarray(instants) + 1e-6, side="right") - 1


def check_codes(s, vid, frames):
    ids, numbers = read_codes(s)
    assert (ids == vid).all() and list(numbers) == list(frames)


@pytest.mark.parametrize("decoder", ["auto", "pyav", "decord"])
def test_training_takes_one_frame_in_each_segment_of_time(timed_videos, decoder):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, clip_len=N, sampling="segments", clips_per_sample=2, size=(48, 64),
                                 decoder=decoder)
    got, stats = samples_of(clips, shuffle=True, seed=2, epochs=3)
    assert len(got) == 3 * len(paths)
    if decoder != "auto":
        assert stats.get(decoder, 0) >= 1 and not stats.get({"decord": "pyav", "pyav": "decord"}[decoder]), stats
    seen = {}
    for n, s in enumerate(got):
        v = int(s["index"])
        path, vid = timed_videos[v]
        times = frame_times(path)
        bounds = times[-1, 1] * np.arange(N + 1) / N  # segment edges, seconds
        assert s["video"].shape == (2, N, 48, 64, 3) and s["frames"].shape == (2, N)
        for k in range(2):
            f = s["frames"][k]
            # Frame j is on screen during part of segment j: it starts before the segment ends
            # and ends after it begins.
            assert (times[f, 0] < bounds[1:] - 1e-6).all() and (times[f, 1] > bounds[:-1] + 1e-6).all(), (path, f)
            check_codes(s["video"][k], vid, f)
            seen.setdefault(v, []).append(tuple(f))
        assert int(s["start"][0]) == s["frames"][0, 0]
    for v, draws in seen.items():
        assert len(set(draws)) > 1, (v, draws)  # random within the segments, new each draw
    # Pixels: the libavformat decode of those frames.
    s = got[0]
    ref = reference(timed_videos[int(s["index"])][0], (48, 64))[s["frames"][1]]
    assert np.abs(s["video"][1].astype(np.int16) - ref).mean() < 1.0


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_eval_takes_the_centre_of_each_segment(timed_videos, decoder):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, clip_len=N, sampling="segments", size=(48, 64), decoder=decoder)
    assert clips.for_eval().sampling.mode == "segments_uniform"
    with shmloader.eval_loader(clips, batch_size=3) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    assert sum(len(b["index"]) for b in batches) == len(paths)
    for b in batches:
        for i, v in enumerate(b["index"]):
            path, vid = timed_videos[v]
            times = frame_times(path)
            centres = (np.arange(N) + 0.5) * times[-1, 1] / N
            np.testing.assert_array_equal(b["frames"][i], on_screen(times, centres), err_msg=path)
            check_codes(b["video"][i], vid, b["frames"][i])


def test_k_eval_draws_spread_over_each_segment(timed_videos):
    """``C`` draws per video in evaluation: draw ``c`` at ``(c + 1/2) / C`` of each segment,
    across ``clips_per_video`` samples and their ``clips_per_sample`` clips."""
    path, vid = timed_videos[3]  # variable rate
    times = frame_times(path)
    length = times[-1, 1] / N
    clips = shmloader.VideoClips([path], clip_len=N, sampling="segments_uniform", clips_per_video=2,
                                 clips_per_sample=2, size=(48, 64))
    got, _ = samples_of(clips, batch_size=2)  # in order: sample 0 holds draws 0 and 1, sample 1 draws 2 and 3
    assert len(got) == 2
    for sample, s in enumerate(got):
        for k in range(2):
            c = 2 * sample + k
            want = on_screen(times, (np.arange(N) + (c + 0.5) / 4) * length)
            np.testing.assert_array_equal(s["frames"][k], want)
            check_codes(s["video"][k], vid, want)


def test_segments_are_seeded_and_independent_of_the_worker_count(timed_videos):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, clip_len=N, sampling="segments", clips_per_sample=2, scale=(48, 64),
                                 crop=(40, 40), crop_at="random")
    one, _ = samples_of(clips, workers=1, batch_size=3, shuffle=True, seed=9, epochs=2)
    three, _ = samples_of(clips, workers=3, batch_size=3, shuffle=True, seed=9, epochs=2)
    other, _ = samples_of(clips, workers=2, batch_size=3, shuffle=True, seed=10, epochs=2)
    for a, b in zip(one, three):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(not np.array_equal(a["frames"], b["frames"]) for a, b in zip(one, other))
    for s in one:
        assert s["video"].shape == (2, N, 40, 40, 3)


def test_grouped_segments_decode_each_video_in_one_pass(timed_videos):
    """``group_clips=True``: the ``clips_per_video`` samples of a video in one task, never
    seeking backwards (one pass over the sorted union), and the same draws as ungrouped."""
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, clip_len=N, sampling="segments", clips_per_video=3, size=(48, 64),
                                 group_clips=True)
    grouped, stats = samples_of(clips, batch_size=4, shuffle=True, seed=1)
    assert stats["tasks"] == len(paths) and stats["decoded"] == 3 * len(paths)
    separate, _ = samples_of(clips.with_options(group_clips=False), batch_size=4, shuffle=True, seed=1)
    key = lambda s: (int(s["index"]), tuple(s["frames"]))  # noqa: E731
    assert Counter(map(key, grouped)) == Counter(map(key, separate))
    for s in grouped:
        check_codes(s["video"], timed_videos[int(s["index"])][1], s["frames"])


def test_resume_gives_the_same_segments(timed_videos):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, clip_len=N, sampling="segments", size=(48, 64))
    kw = dict(batch_size=1, workers=2, shuffle=True, seed=4, epochs=2)
    with shmloader.Loader(clips, **kw) as loader:
        full = [np.array(b["frames"]) for b in loader]
    _, state = state_after(clips, 5, **kw)
    with shmloader.Loader(clips, state=state, **kw) as loader:
        rest = [np.array(b["frames"]) for b in loader]
    assert len(rest) == len(full) - 5
    for a, b in zip(full[5:], rest):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy, frames", [("repeat_last", list(range(13)) + [12] * 3),
                                            ("wrap", list(range(13)) + [0, 1, 2])])
def test_a_video_of_fewer_frames_than_segments_follows_short_video(timed_videos, policy, frames):
    path, vid = timed_videos[2]  # 13 frames
    clips = shmloader.VideoClips([path], clip_len=16, sampling="segments", size=(48, 64), short_video=policy)
    (s,), _ = samples_of(clips, workers=1, batch_size=1)
    assert list(s["frames"]) == frames
    check_codes(s["video"], vid, frames)
    with shmloader.Loader(clips.with_options(short_video="error"), batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="13 frames, shorter than one clip"):
            next(iter(loader))


@pytest.mark.parametrize("kw, name", [(dict(fps=5), "fps"), (dict(frame_step=2), "frame_step"),
                                      (dict(max_frames=8, fps=2, clip_len=None), "clip_len")])
def test_bad_segment_arguments(timed_videos, kw, name):
    with pytest.raises(ValueError, match=name):
        shmloader.VideoClips([timed_videos[0][0]], **{"clip_len": N, "sampling": "segments", **kw})


def test_the_docs_tsn_recipe(timed_videos):
    from ._examples import doc_example

    paths = [p for p, _ in timed_videos]
    namespace = {"shmloader": shmloader, "paths": paths, "labels": [0, 1, 0, 1]}
    exec(doc_example("tsn"), namespace)
    with namespace["train"] as train, namespace["test"] as test:
        b = next(iter(train))
        assert b["video"].shape == (4, 8, 224, 224, 3)  # 4 videos, batches of 8
        (t,) = list(test)
        for i, v in enumerate(t["index"]):
            times = frame_times(paths[v])
            np.testing.assert_array_equal(t["frames"][i], on_screen(times, (np.arange(N) + 0.5) * times[-1, 1] / N))
    assert namespace["test_clips"].sampling.mode == "segments_uniform"
    with shmloader.Loader(namespace["grouped"], batch_size=4, shuffle=True) as loader:
        assert sum(len(b["index"]) for b in loader) == 16 and loader.stats()["tasks"] == 4


@pytest.fixture(scope="module")
def frames_97(tmp_path_factory):
    from shmloader.video.samples import write_video

    return write_video(tmp_path_factory.mktemp("seg97") / "97.mp4", 54, frames=97, fps=25, gop=12)


def test_training_draws_n_distinct_frames_one_in_each_segment(frames_97):
    """A 97-frame video in 8 segments: every draw takes 8 distinct frames, frame ``k`` in
    ``[floor(k·97/8), floor((k+1)·97/8))``. Random instants once took the frame that straddles a
    segment boundary twice ([..., 84, 84])."""
    clips = shmloader.VideoClips([frames_97] * 4, clip_len=N, sampling="segments", clips_per_sample=2,
                                 size=(32, 32))
    got, _ = samples_of(clips, workers=2, batch_size=4, shuffle=True, seed=0, epochs=12)
    lo, hi = np.arange(N) * 97 // N, (np.arange(N) + 1) * 97 // N
    draws = set()
    for s in got:
        for f, video in zip(s["frames"], s["video"]):
            assert len(set(f)) == N and ((lo <= f) & (f < hi)).all(), f
            check_codes(video, 54, f)
            draws.add(tuple(f))
    assert len(draws) > 40  # still random within the segments
