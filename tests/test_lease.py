"""The lease rule: a batch the consumer holds never changes, however far the loader goes on."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.video.samples import read_codes

from .conftest import our_mappings


def check_batch(b, frame_step=1):
    ids, frames = read_codes(np.asarray(b["video"]))
    assert (ids == np.asarray(b["index"])[:, None]).all()
    starts = np.asarray(b["start"])[:, None]
    assert (frames == starts + frame_step * np.arange(frames.shape[1])).all()


def test_held_batch_unchanged_over_epochs(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=4, shuffle=True, epochs=6) as loader:
        it = iter(loader)
        held = next(it)
        snapshot = {k: v.copy() for k, v in held.items()}
        rest = 0
        for b in it:
            check_batch(b)
            rest += 1
        assert rest == 6 * 4 - 1
        for k in held:
            np.testing.assert_array_equal(held[k], snapshot[k])
        stats = loader.stats()
        assert stats["leased"] == 2  # `held` and the loop's last `b`
        assert stats["copied"] == 0  # the loop variable plus `held` fit in 4 slots with one to spare
        del b


def test_hoarding_consumer_small_ring_no_deadlock(videos):
    """Keeping every batch with a 3-slot ring: all arrive, none overwritten, memory bounded by what is kept."""
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a second warning would show, not be deduplicated
        with shmloader.Loader(clips, batch_size=2, workers=2, slots=3, shuffle=True, epochs=5) as loader:
            kept = list(loader)
            stats = loader.stats()
    copy_warnings = [w for w in caught if "copied" in str(w.message)]
    assert len(copy_warnings) == 1 and copy_warnings[0].category is RuntimeWarning  # once, for 18 copies
    assert len(kept) == 20
    for b in kept:
        check_batch(b)
    seen = sorted(int(i) for b in kept for i in b["index"])
    assert seen == sorted(list(range(len(paths))) * 5)
    assert stats["copied"] == 20 - 2  # two leased, the rest copied: the ring never grew
    assert len(our_mappings()) == 1


def test_released_slots_are_reused_ring_allocated_once(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=4, epochs=10) as loader:
        maps, addresses = set(), set()
        for b in loader:
            maps.add(len(our_mappings()))
            addresses.add(b["video"].ctypes.data)
            assert loader._ring.contains(b["video"].ctypes.data)
        assert loader.stats()["copied"] == 0
    assert maps == {1}
    assert len(addresses) <= 4  # 40 batches through 4 slots


def test_mapping_outlives_close_while_batch_held(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    loader = shmloader.Loader(clips, batch_size=2, workers=1)
    held = next(iter(loader))
    snapshot = held["video"].copy()
    loader.close()
    np.testing.assert_array_equal(held["video"], snapshot)  # still mapped: no crash, same data
    assert len(our_mappings()) == 1
    del held
    gc.collect()
    assert our_mappings() == []


@pytest.mark.parametrize("ordered", [True, False])
def test_the_books_stay_the_rings_size_however_long_the_run(ordered):
    """A long run keeps no record per batch delivered: after 1 500 batches the main process holds
    no more batch records than the ring has slots (a record kept per batch grew memory and the
    garbage collector's passes with the run)."""
    from shmloader.engine.schedule import Batch

    def records() -> int:
        # type(), not isinstance(): isinstance on a weakref.proxy whose object is gone raises
        # ReferenceError, and other tests' libraries leave such proxies among gc's objects
        return sum(type(o) is Batch for o in gc.get_objects())

    before = records()  # another loader of this process may hold its own
    src = shmloader.ArraySource({"x": np.arange(4000).reshape(1000, 4)})
    with shmloader.Loader(src, batch_size=2, workers=1, epochs=3, ordered=ordered, slots=4) as loader:
        delivered = sum(1 for _ in loader)
        alive = records() - before
    assert delivered == 1500
    assert alive <= 4, alive
