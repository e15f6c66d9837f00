"""Grouped decode: the clips of one video decoded in one pass by one worker and placed at
several positions of the coming batches (``VideoClips(group_clips=True)``), exact and
resumable like any other plan; failures and deaths still settle exactly the samples held."""

from __future__ import annotations

import os
from collections import Counter

import decord
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import read_codes

from ._variants import reference as libav_reference
from .conftest import state_after

K = 4  # clips per video


def batches_of(loader):
    return [{k: np.array(v) for k, v in b.items()} for b in loader]


def clips_of(batches):
    """(video, frames) of every delivered sample, in delivery order."""
    return [(int(b["index"][i]), tuple(b["frames"][i])) for b in batches for i in range(len(b["index"]))]


def grouped(paths, **kw):
    return shmloader.VideoClips(paths, clip_len=3, frame_step=3, clips_per_video=K, size=(64, 64),
                                group_clips=True, **kw)


def test_grouping_changes_the_order_not_the_clips(videos):
    """Per-sample randomness is (seed, epoch, sample): a grouped epoch holds exactly the clips
    an ungrouped one does, every (video, clip) once, only in another order."""
    paths = videos[0][:6]
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=4, epochs=2) as loader:
        together = clips_of(batches_of(loader))
        assert loader.stats()["decoded"] == 2 * 6 * K
    separate_clips = grouped(paths).with_options(group_clips=False)
    with shmloader.Loader(separate_clips, batch_size=4, workers=2, shuffle=True, seed=4, epochs=2) as loader:
        separate = clips_of(batches_of(loader))
    per_epoch = 6 * K
    for e in range(2):
        a, b = together[e * per_epoch : (e + 1) * per_epoch], separate[e * per_epoch : (e + 1) * per_epoch]
        assert Counter(a) == Counter(b)
        assert Counter(v for v, _ in a) == {v: K for v in range(6)}
    assert together != separate  # the order differs: windows of videos


def test_one_task_per_video_and_frames_exact(videos):
    paths = videos[0][:6]
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=1) as loader:
        batches = batches_of(loader)
        stats = loader.stats()
    assert stats["tasks"] == 6 and stats["decoded"] == 6 * K  # one pass per video
    for b in batches:
        for i, v in enumerate(b["index"]):
            ids, numbers = read_codes(b["video"][i])
            assert (ids == v).all() and (numbers == b["frames"][i]).all()
            ref = decord.VideoReader(paths[v], height=64, width=64).get_batch(list(b["frames"][i])).asnumpy()
            np.testing.assert_array_equal(b["video"][i], ref)


def test_same_batches_for_1_and_3_workers(videos):
    paths = videos[0]
    runs = []
    for workers in (1, 3):
        with shmloader.Loader(grouped(paths), batch_size=5, workers=workers, shuffle=True, seed=7,
                              epochs=2) as loader:
            runs.append(batches_of(loader))
    assert len(runs[0]) == len(runs[1]) == 2 * -(-len(paths) * K // 5)
    for a, b in zip(*runs):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_window_of_videos_fills_consecutive_batches(videos):
    paths = videos[0][:8]
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=2,
                          group_window=2) as loader:
        order = [v for v, _ in clips_of(batches_of(loader))]
    # windows of 2 videos = 8 clips = 2 batches, each window all of its two videos' clips
    windows = [order[i : i + 2 * K] for i in range(0, len(order), 2 * K)]
    assert all(len(set(w)) == 2 and Counter(w) == {v: K for v in set(w)} for w in windows)
    assert any(w[:K] != sorted(w[:K]) or len(set(w[:K])) > 1 for w in windows)  # shuffled within


def test_resume_mid_epoch_gives_the_same_batches(videos):
    paths = videos[0][:6]
    kw = dict(batch_size=4, workers=2, shuffle=True, seed=3, epochs=2)
    with shmloader.Loader(grouped(paths), **kw) as loader:
        full = batches_of(loader)
    _, state = state_after(grouped(paths), 5, **kw)
    # The default window: 4 batches' worth of clips, 4 x 4 = 16 clips = 4 videos of K clips.
    assert state["group"] == K and state["group_window"] == 4
    with shmloader.Loader(grouped(paths), state=state, **kw) as loader:
        rest = batches_of(loader)
    assert len(rest) == len(full) - 5
    for a, b in zip(full[5:], rest):
        np.testing.assert_array_equal(a["frames"], b["frames"])
        np.testing.assert_array_equal(a["video"], b["video"])
    with pytest.raises(ValueError, match="group_window"):
        shmloader.Loader(grouped(paths), state=state, group_window=1, **kw)


# The loader's warning that the consumer holds most of a small ring (then copies) is what this
# test's tiny ring makes happen; the test checks the batches, the warning is expected here.
@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_ring_smaller_than_a_window_still_delivers_everything(videos):
    """Two slots cannot hold a window of 8 videos: groups go out split rather than stall, and
    every clip is still the one its sample draws (the clips an ungrouped epoch holds)."""
    paths = videos[0][:8]
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=5, slots=2,
                          group_window=8) as loader:
        kept = batches_of(loader)  # the consumer keeps every batch: copies once the ring is held
        stats = loader.stats()
    assert stats["tasks"] > 8  # some groups had to be split
    with shmloader.Loader(grouped(paths).with_options(group_clips=False), batch_size=4, workers=2,
                          shuffle=True, seed=5) as loader:
        separate = clips_of(batches_of(loader))
    assert Counter(clips_of(kept)) == Counter(separate) and len(separate) == 8 * K
    for b in kept:
        for i, v in enumerate(b["index"]):
            ids, numbers = read_codes(b["video"][i])
            assert (ids == v).all() and (numbers == b["frames"][i]).all()


def test_a_bad_video_in_a_window_is_skipped_clip_by_clip(videos, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(os.urandom(4096))
    paths = videos[0][:4] + [str(bad)]
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=0,
                          on_error="skip") as loader:
        got = clips_of(batches_of(loader))
        stats = loader.stats()
    assert stats["skipped"] == K
    assert Counter(v for v, _ in got) == {v: K for v in range(4)}
    assert {s for _, s, _ in loader.skipped} == {4 * K + c for c in range(K)}
    with shmloader.Loader(grouped(paths), batch_size=4, workers=2, shuffle=True, seed=0) as loader:
        with pytest.raises(shmloader.SampleError, match="bad.mp4"):
            batches_of(loader)


class _Fragile:
    """A grouped source of 12 numbers in groups of 3 whose sample 7 fails and sample 4 kills
    its worker the first time it is read (a marker file remembers)."""

    group_size = 3

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.calls = 0

    def __len__(self):
        return 12

    def spec(self):
        return {"x": ((), np.dtype(np.int64)), "pass": ((), np.dtype(np.int64))}

    def describe(self, index):
        return f"number {index}"

    def worker_init(self):
        pass

    def read(self, index, rng, out):
        self.read_many([index], [rng], [out])

    def read_many(self, indices, rngs, outs, epoch_key=None):
        self.calls += 1
        if 7 in indices:
            raise ValueError("seven is bad")
        if 4 in indices and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)
        for i, out in zip(indices, outs):
            out["x"][...] = i
            out["pass"][...] = len(indices)


def test_failed_item_of_a_group_is_found_and_skipped_alone(tmp_path):
    src = _Fragile(str(tmp_path / "died"))
    with shmloader.Loader(src, batch_size=3, workers=1, on_error="skip") as loader:
        batches = batches_of(loader)
        stats = loader.stats()
    xs = [int(x) for b in batches for x in b["x"]]
    assert sorted(xs) == [i for i in range(12) if i != 7]
    assert stats["skipped"] == 1 and [s for _, s, _ in loader.skipped] == [7]
    assert stats["worker_restarts"] == 1  # sample 4's death was not held against it
    passes = {int(x): int(p) for b in batches for x, p in zip(b["x"], b["pass"])}
    assert passes[0] == passes[1] == passes[2] == 3  # a group in one pass
    assert passes[3] == passes[4] == passes[5] == 1  # after the death, tried again one by one
    assert passes[6] == passes[8] == 1  # read one by one to find the bad one


def test_failed_item_raises_naming_it(tmp_path):
    open(tmp_path / "died", "w").close()  # no death this time
    with shmloader.Loader(_Fragile(str(tmp_path / "died")), batch_size=3, workers=2) as loader:
        with pytest.raises(shmloader.SampleError, match="number 7") as info:
            batches_of(loader)
    assert "seven is bad" in str(info.value)


def decode(path, frames, h, w):
    """The frames at h x w as decord gives them, or, at a width decord cannot produce on this
    CPU, as a sequential libavformat decode gives them (``tests/_variants.reference``). Returns
    (frames, how many levels a pixel of the loader's may differ by)."""
    try:
        return decord.VideoReader(path, height=h, width=w).get_batch(list(frames)).asnumpy(), 0
    except decord.DECORDError:
        return libav_reference(path, (h, w))[list(frames)], 4


def center(full):
    y, x = (full.shape[1] - 48) // 2, (full.shape[2] - 48) // 2
    return full[:, y : y + 48, x : x + 48]


def matches(path, frames, clip, side, native=(96, 128)) -> bool:
    """Is ``clip`` the center 48x48 window of the frames scaled to short side ``side``?"""
    full, tolerance = decode(path, frames, side, round(native[1] * side / native[0]))
    return np.abs(center(full).astype(np.int16) - clip).max() <= tolerance


def scale_of(path, frames, clip):
    """The one short side at which ``clip`` is the center 48x48 window, or None."""
    sides = [side for side in range(48, 97) if matches(path, frames, clip, side)]
    return sides[0] if len(sides) == 1 else None


def test_scale_range_is_shared_by_the_clips_of_a_video_in_an_epoch(videos):
    paths = videos[0][:2]
    clips = shmloader.VideoClips(paths, clip_len=2, frame_step=5, clips_per_video=K, scale=(48, 96),
                                 crop=(48, 48), group_clips=True)
    # Seed 74 draws the short side 72 (width 96) for one video: on a CPU where decord cannot
    # produce that width, its clips are checked against libavformat's frames.
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, seed=74, epochs=2) as loader:
        batches = batches_of(loader)
    per_epoch = len(batches) // 2
    scales = {}
    for e, b in enumerate(batches):
        for i, v in enumerate(b["index"]):
            key = (e // per_epoch, int(v))
            if key not in scales:
                scales[key] = scale_of(paths[v], b["frames"][i], b["video"][i])
                assert scales[key] is not None
            else:  # the same scale for every clip of the video in this epoch
                assert matches(paths[v], b["frames"][i], b["video"][i], scales[key])
    assert len(scales) == 4 and len(set(scales.values())) > 1  # drawn anew per video and epoch
