"""The epoch plan: exactly once per epoch, seeded order, ordered delivery, partial batches."""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import pytest

import shmloader


def ident(index, rng):
    return {"i": np.int64(index), "r": rng.integers(0, 2**31, dtype=np.int64)}


SPEC = {"i": ((), np.int64), "r": ((), np.int64)}


def batches(n, **kw):
    src = shmloader.FunctionSource(ident, SPEC, n)
    with shmloader.Loader(src, **kw) as loader:
        return [b["i"].tolist() for b in loader], len(loader)


def test_every_sample_once_per_epoch():
    got, per_epoch = batches(23, batch_size=4, workers=2, shuffle=True, epochs=3)
    assert per_epoch == 6
    assert len(got) == 18
    for e in range(3):
        epoch = [i for b in got[6 * e : 6 * e + 6] for i in b]
        assert sorted(epoch) == list(range(23))
    assert [len(b) for b in got[:6]] == [4, 4, 4, 4, 4, 3]  # partial last batch kept


def test_every_clip_once_per_epoch(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, clips_per_video=2, sampling="uniform", size=(40, 40))
    with shmloader.Loader(clips, batch_size=5, workers=2, shuffle=True, epochs=2) as loader:
        seen = [(int(v), int(s)) for b in loader for v, s in zip(b["index"], b["start"])]
    counts = collections.Counter(seen)
    assert len(counts) == 2 * len(paths) and set(counts.values()) == {2}


def test_seeded_shuffle_reproducible_and_new_each_epoch():
    a, _ = batches(32, batch_size=8, workers=2, shuffle=True, seed=3, epochs=2)
    b, _ = batches(32, batch_size=8, workers=2, shuffle=True, seed=3, epochs=2)
    c, _ = batches(32, batch_size=8, workers=2, shuffle=True, seed=4, epochs=1)
    assert a == b
    assert a[:4] != a[4:]
    assert a[:4] != c
    flat = [i for x in a[:4] for i in x]
    assert flat != sorted(flat)


def test_no_shuffle_is_in_order():
    got, _ = batches(10, batch_size=4, workers=2)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_ordered_same_sequence_with_1_and_3_workers():
    src = shmloader.FunctionSource(ident, SPEC, 30)
    runs = []
    for w in (1, 3):
        with shmloader.Loader(src, batch_size=4, workers=w, shuffle=True, seed=9, epochs=2) as loader:
            runs.append([(b["i"].tolist(), b["r"].tolist()) for b in loader])
    assert runs[0] == runs[1]


def test_unordered_delivers_the_same_multiset():
    src = shmloader.FunctionSource(ident, SPEC, 30)
    with shmloader.Loader(src, batch_size=4, workers=3, shuffle=True, ordered=False, epochs=2) as loader:
        got = [i for b in loader for i in b["i"].tolist()]
    assert sorted(got) == sorted(list(range(30)) * 2)


def waits_for_release_on_0(release):
    def fn(index, rng):
        deadline = time.monotonic() + 10
        while index == 0 and not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return ident(index, rng)
    return fn


@pytest.mark.timeout(60)
def test_unordered_does_not_wait_for_a_slow_sample(tmp_path):
    """Sample 0 is held until the consumer has seen 4 other batches (or 10 s pass): unordered
    delivery goes on around it (ordered delivery would wait for it first)."""
    release = str(tmp_path / "release")
    src = shmloader.FunctionSource(waits_for_release_on_0(release), SPEC, 12, check=False)
    with shmloader.Loader(src, batch_size=1, workers=2, ordered=False) as loader:
        got = []
        for b in loader:
            got.append(int(b["i"][0]))
            if len(got) == 4:
                open(release, "w").close()
    assert sorted(got) == list(range(12))
    assert got.index(0) >= 4  # four later batches came before it


def test_drop_remainder():
    got, per_epoch = batches(23, batch_size=4, workers=2, shuffle=True, epochs=2, drop_remainder=True)
    assert per_epoch == 5 and len(got) == 10
    assert all(len(b) == 4 for b in got)
    assert len(set(i for b in got[:5] for i in b)) == 20


def test_fewer_samples_than_a_batch():
    assert batches(3, batch_size=8, workers=1, epochs=2)[0] == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ValueError, match=r"an epoch has 3 samples, fewer than batch_size=8"):
        batches(3, batch_size=8, workers=1, drop_remainder=True, epochs=None)


def test_a_shard_with_no_batch_is_refused():
    src = shmloader.FunctionSource(ident, SPEC, 6)
    with shmloader.Loader(src, batch_size=2, workers=1, drop_remainder=True) as loader:
        with pytest.raises(ValueError, match=r"an epoch has 1 samples in shard 3 of 4, fewer than batch_size=2"):
            loader.set_shard(3, 4)
        assert len(loader) == 3  # unchanged
    with pytest.raises(ValueError, match="no samples"):
        shmloader.Loader(shmloader.FunctionSource(ident, SPEC, 0), batch_size=2)


def test_epochs_none_repeats():
    src = shmloader.FunctionSource(ident, SPEC, 5)
    with shmloader.Loader(src, batch_size=2, workers=1, epochs=None) as loader:
        it = iter(loader)
        got = [next(it)["i"].tolist() for _ in range(9)]
    assert got[:3] == [[0, 1], [2, 3], [4]] and got[3:6] == got[:3]


@pytest.mark.parametrize("kw, msg", [
    (dict(batch_size=0), "batch_size"), (dict(batch_size=2, workers=0), "workers"),
    (dict(batch_size=2, slots=1), "slots"), (dict(batch_size=2, epochs=0), "epochs"),
    (dict(batch_size=2, on_error="ignore"), "on_error"), (dict(batch_size=2, timeout=0), "timeout"),
])
def test_bad_loader_arguments(kw, msg):
    src = shmloader.FunctionSource(ident, SPEC, 5)
    with pytest.raises(ValueError, match=msg):
        shmloader.Loader(src, **kw)


def test_iterating_again_runs_the_next_pass():
    """Each new iteration after a finished pass is the next epoch(s): what Keras does with validation data."""
    src = shmloader.FunctionSource(ident, SPEC, 10)
    with shmloader.Loader(src, batch_size=4, workers=2, shuffle=True, seed=2, epochs=1) as one_pass, \
            shmloader.Loader(src, batch_size=4, workers=2, shuffle=True, seed=2, epochs=3) as three:
        passes = [[b["i"].tolist() for b in one_pass] for _ in range(3)]
        assert [x for p in passes for x in p] == [b["i"].tolist() for b in three]
        assert passes[0] != passes[1]  # a new epoch, a new order
        it = iter(one_pass)
        first = next(it)["i"].tolist()
        assert [b["i"].tolist() for b in one_pass][0] != first  # an unfinished pass is continued
        del it


def test_groups_of_several_sizes_stay_whole_in_windows_and_shards():
    """Groups of several sizes (e.g. the span rows of one video): each epoch holds every sample
    once, a window of groups holds whole groups, and the shards of an epoch are disjoint, whole
    groups each, the same size every epoch."""
    from shmloader.engine.plan import EpochPlan

    sizes = [3, 1, 4, 1, 5, 2, 6, 2]
    groups = np.repeat(np.arange(len(sizes)), sizes)[np.random.default_rng(0).permutation(sum(sizes))]
    plan = EpochPlan(len(groups), 4, shuffle=True, seed=1, drop_remainder=False, window=3, groups=groups)
    orders = [plan.order(e) for e in range(3)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(len(groups)))
        g = groups[order]
        seen = set()
        ends = np.cumsum([sizes[x] for x in dict.fromkeys(g.tolist())])
        # every window of 3 groups, in order, holds exactly those groups' samples
        starts = [0, *ends[2::3].tolist()]
        for lo, hi in zip(starts, [*starts[1:], len(g)]):
            window = set(g[lo:hi].tolist())
            assert len(window) <= 3 and not window & seen and all((g[lo:hi] == x).sum() == sizes[x] for x in window)
            seen |= window
    assert not np.array_equal(orders[0], orders[1])
    for e in range(3):
        shards = [EpochPlan(len(groups), 4, shuffle=True, seed=1, drop_remainder=False, window=3, groups=groups,
                            shard=(i, 2)) for i in range(2)]
        parts = [s.order(e) for s in shards]
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(groups)))
        assert not set(groups[parts[0]].tolist()) & set(groups[parts[1]].tolist())
        assert [len(p) for p in parts] == [s.samples_per_epoch() for s in shards]
