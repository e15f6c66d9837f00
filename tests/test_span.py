"""span_epochs=True: batches cut across epoch ends, as tf.data's repeat().batch() does."""

from __future__ import annotations


import numpy as np
import pytest

import shmloader
from shmloader import LoaderError


def ident(index, rng):
    return {"i": np.int64(index), "r": rng.integers(0, 2**62, dtype=np.int64)}


SPEC = {"i": ((), np.int64), "r": ((), np.int64)}


def source(n=8):
    return shmloader.FunctionSource(ident, SPEC, n)


def stream(loader, batches=None):
    """(sample, random draw) per delivered sample, and the batch sizes."""
    got, sizes = [], []
    for k, b in enumerate(loader):
        got += list(zip(b["i"].tolist(), b["r"].tolist()))
        sizes.append(len(b["i"]))
        if batches is not None and k + 1 == batches:
            break
    return got, sizes


def test_the_stream_is_the_epochs_back_to_back():
    """Same samples, same order, same per-sample randomness (seeded by each sample's own epoch)
    as the epochs one after another; every batch whole but the last of the run."""
    with shmloader.Loader(source(), batch_size=8, workers=2, shuffle=True, seed=3, epochs=5) as by_epoch:
        expected, _ = stream(by_epoch)
    with shmloader.Loader(source(), batch_size=12, workers=2, shuffle=True, seed=3, epochs=5,
                          span_epochs=True) as spanning:
        assert len(spanning) == 4
        got, sizes = stream(spanning)
    assert got == expected
    assert sizes == [12, 12, 12, 4]
    assert len({r for _, r in got}) == 40  # each epoch draws anew


def test_drop_remainder_drops_only_the_runs_last_batch():
    with shmloader.Loader(source(), batch_size=12, workers=2, epochs=5, span_epochs=True,
                          drop_remainder=True) as loader:
        assert len(loader) == 3
        got, sizes = stream(loader)
    assert sizes == [12, 12, 12] and [i for i, _ in got] == list(range(8)) * 4 + list(range(4))


def test_a_dataset_smaller_than_a_batch_gives_whole_batches_one_task_each():
    """8 samples at batch 32: each batch holds four epochs and is ONE task and one reply."""
    with shmloader.Loader(source(), batch_size=32, workers=2, shuffle=True, epochs=None,
                          span_epochs=True) as loader:
        assert loader.element_spec["i"][0] == (32,)  # an endless stream of whole batches
        with pytest.raises(TypeError, match="no length"):
            len(loader)
        got, sizes = stream(loader, batches=10)
        stats = loader.stats()
    assert sizes == [32] * 10
    for k in range(40):  # epoch k: each sample exactly once
        assert sorted(i for i, _ in got[8 * k : 8 * k + 8]) == list(range(8))
    assert stats["tasks"] >= 10 and stats["decoded"] == 32 * stats["tasks"]  # every task a whole batch


def test_resume_mid_epoch_continues_the_stream():
    kw = dict(batch_size=5, workers=2, shuffle=True, seed=7, epochs=None, span_epochs=True)
    with shmloader.Loader(source(), **kw) as loader:
        got, _ = stream(loader, batches=9)
        state = loader.state(consumed=4)
    assert state["span_epochs"] and (state["epoch"], state["sample"]) == (2, 4)
    with shmloader.Loader(source(), state=state, **kw) as resumed:
        again, _ = stream(resumed, batches=5)
    assert again == got[20:45]
    with pytest.raises(ValueError, match="span_epochs"):
        shmloader.Loader(source(), batch_size=5, state=state)
    plain = shmloader.Loader(source(), batch_size=4, workers=1)
    with pytest.raises(ValueError, match="span_epochs"):
        shmloader.Loader(source(), batch_size=4, workers=1, span_epochs=True, state=plain.state())
    plain.close()


def test_next_pass_starts_where_the_last_was_meant_to_end():
    with shmloader.Loader(source(), batch_size=12, workers=1, epochs=2, span_epochs=True,
                          drop_remainder=True) as loader:
        first, _ = stream(loader)
        second, _ = stream(loader)
    assert [i for i, _ in first] == list(range(8)) * 1 + list(range(4))
    assert [i for i, _ in second] == list(range(8)) + list(range(4))  # epochs 2 and 3, not the dropped 4


def fails_on_3(index, rng):
    if index == 3:
        raise ValueError("sample three is broken")
    return ident(index, rng)


def test_a_skipped_sample_is_refilled_from_the_stream():
    """For ever: every batch whole, and every sample delivered is one of the stream (with its own
    epoch's draw), once, never the failing one."""
    src = shmloader.FunctionSource(fails_on_3, SPEC, 8, check=False)
    with shmloader.Loader(src, batch_size=32, workers=2, epochs=None, span_epochs=True,
                          on_error="skip") as loader:
        got, sizes = stream(loader, batches=6)
    with shmloader.Loader(source(), batch_size=32, workers=2, epochs=None, span_epochs=True) as clean:
        expected, _ = stream(clean, batches=40)  # refills may come from far ahead (a full ring)
    assert sizes == [32] * 6
    assert len(set(got)) == len(got) and set(got) <= {x for x in expected if x[0] != 3}


def fails_in_some_epochs(index, rng):
    """Sample 3 fails in the epochs where its draw is even (about half, fixed by the seed)."""
    out = ident(index, rng)
    if index == 3 and out["r"] % 2 == 0:
        raise ValueError("sample three is broken this epoch")
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_skipped_samples_are_refilled_from_the_run_s_remainder(shuffle):
    """27 epochs of 8 samples, batch 32, drop_remainder: 6 batches, and the last 24 samples of the
    run form no batch but refill skipped positions. So what arrives is exactly the stream
    without the failing samples, cut after 192: whatever the order skips happen in."""
    kw = dict(batch_size=32, workers=2, shuffle=shuffle, seed=5, epochs=27, span_epochs=True,
              drop_remainder=True)
    with shmloader.Loader(source(), **{**kw, "drop_remainder": False}) as clean:
        expected, _ = stream(clean)
    assert len(expected) == 27 * 8
    kept = [x for x in expected if not (x[0] == 3 and x[1] % 2 == 0)]
    failing = len(expected) - len(kept)
    assert 0 < failing <= 24  # the remainder can refill them all
    src = shmloader.FunctionSource(fails_in_some_epochs, SPEC, 8, check=False)
    with shmloader.Loader(src, **kw, on_error="skip") as loader:
        got, sizes = stream(loader)
        skipped = loader.stats()["skipped"]
    assert sizes == [32] * 6
    assert sorted(got) == sorted(kept[:192])
    assert skipped == sum(1 for x in expected[: expected.index(kept[191]) + 1] if x not in kept)


def broken(index, rng):
    raise ValueError("nothing reads")


def test_every_sample_failing_raises_instead_of_spinning():
    src = shmloader.FunctionSource(broken, SPEC, 8, check=False)
    with shmloader.Loader(src, batch_size=32, workers=2, epochs=None, span_epochs=True,
                          on_error="skip") as loader:
        with pytest.raises(LoaderError, match="every sample failed: the last 8"):
            stream(loader, batches=3)


def test_arguments():
    with pytest.raises(ValueError, match="2 epochs of 8 samples"):
        shmloader.Loader(source(), batch_size=32, epochs=2, span_epochs=True, drop_remainder=True)
    with pytest.raises(ValueError, match="span_epochs=True to fill batches"):
        shmloader.Loader(source(), batch_size=32, drop_remainder=True)
    with pytest.raises(ValueError, match="span_epochs"):
        shmloader.eval_loader(source(), batch_size=4, span_epochs=True)


def test_video_clips_spanning_epochs_equal_the_epochs_back_to_back(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths[:3], labels[:3], clip_len=4, size=(32, 32))
    with shmloader.Loader(clips, batch_size=3, workers=2, shuffle=True, epochs=4) as by_epoch:
        expected = [(b["video"].copy(), b["label"].copy()) for b in by_epoch]
    with shmloader.Loader(clips, batch_size=8, workers=2, shuffle=True, epochs=4, span_epochs=True) as spanning:
        got = [(b["video"].copy(), b["label"].copy()) for b in spanning]
    assert [len(v) for v, _ in got] == [8, 4]
    np.testing.assert_array_equal(np.concatenate([v for v, _ in got]), np.concatenate([v for v, _ in expected]))
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), np.concatenate([y for _, y in expected]))


def test_shards_split_every_epoch_of_the_stream():
    """Two shards of a spanning run: each gets whole batches across its epochs' ends, the two are
    disjoint, and together they are the unsharded run (each sample with its epoch's draw)."""
    kw = dict(batch_size=6, workers=1, shuffle=True, seed=2, epochs=6, span_epochs=True)
    with shmloader.Loader(source(), **kw) as whole:
        expected, _ = stream(whole)
    shards = []
    for rank in range(2):
        with shmloader.Loader(source(), **kw, shard=(rank, 2)) as loader:
            got, sizes = stream(loader)
        assert sizes == [6, 6, 6, 6], sizes  # 6 epochs x 4 samples of this shard, cut across epochs
        shards.append(got)
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(expected)
    for got in shards:  # each shard's own part of epoch k, in the epoch's order
        for k in range(6):
            assert len({i for i, _ in got[4 * k : 4 * k + 4]}) == 4


def slow_on_0(index, rng):
    if index == 0:
        import time
        time.sleep(0.3)  # the batches holding it (the first three) are late
    return ident(index, rng)


def test_unordered_delivers_the_same_batches_as_they_come():
    """ordered=False with span_epochs: the same batches as the ordered stream, whole, each as
    planned, in the order they are ready (a batch held up by a slow sample comes later)."""
    kw = dict(batch_size=12, workers=2, seed=4, epochs=5, span_epochs=True)
    with shmloader.Loader(source(), **kw) as ordered:
        expected = [tuple(b["i"].tolist()) + tuple(b["r"].tolist()) for b in ordered]
    src = shmloader.FunctionSource(slow_on_0, SPEC, 8, check=False)
    with shmloader.Loader(src, **kw, ordered=False) as loader:
        got = [tuple(b["i"].tolist()) + tuple(b["r"].tolist()) for b in loader]
        with pytest.raises(LoaderError, match="ordered"):
            loader.state()
    assert sorted(got) == sorted(expected) and len(expected) == 4
    assert got != expected  # the short last batch, without sample 0, did not wait for the others
