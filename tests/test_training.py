"""Training features: resumable iteration, evaluation loaders, input-bound diagnostics."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time

import numpy as np
import pytest

import shmloader

pytestmark = pytest.mark.timeout(120)


def record(batches):
    return [{k: v.tolist() for k, v in b.items() if k != "video"} | {"video": np.asarray(b["video"]).tobytes()}
            for b in batches]


@pytest.mark.parametrize("stop_after", [2, 3, 7])  # mid-epoch, at an epoch boundary, a later epoch
def test_resume_delivers_exactly_what_an_uninterrupted_run_would(videos, stop_after):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, frame_step=2, size=(32, 40))  # random starts
    kw = dict(batch_size=3, workers=2, shuffle=True, seed=11, epochs=4)
    with shmloader.Loader(clips, **kw) as loader:
        full = record(loader)
    with shmloader.Loader(clips, **kw) as loader:
        it = iter(loader)
        head = record(next(it) for _ in range(stop_after + 2))  # two more sit "in a prefetch buffer"
        state = json.loads(json.dumps(loader.state(consumed=stop_after)))
        del it
    assert head[:stop_after] == full[:stop_after]
    with shmloader.Loader(clips, **kw, state=state) as loader:
        rest = record(loader)
    assert rest == full[stop_after:]


def test_state_from_other_settings_is_refused():
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 20)
    with shmloader.Loader(src, batch_size=4, workers=1, shuffle=True, seed=1) as loader:
        next(iter(loader))
        state = loader.state()
    with pytest.raises(ValueError, match="seed=1 \\(now 2\\)"):
        shmloader.Loader(src, batch_size=4, workers=1, shuffle=True, seed=2, state=state)
    with pytest.raises(shmloader.LoaderError, match="ordered"):
        with shmloader.Loader(src, batch_size=4, workers=1, ordered=False) as loader:
            loader.state()


def test_state_from_another_shard_batch_size_or_drop_remainder_is_refused():
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 20)
    kw = dict(batch_size=4, workers=1, shuffle=True, seed=1, shard=(0, 2))
    with shmloader.Loader(src, **kw) as loader:
        next(iter(loader))
        state = loader.state()
    for other, said in ((dict(shard=(1, 2)), r"shard=\[0, 2\] \(now \[1, 2\]\)"),
                        (dict(batch_size=5), r"batch_size=4 \(now 5\)"),
                        (dict(drop_remainder=True), r"drop_remainder=False \(now True\)")):
        with pytest.raises(ValueError, match=said):
            shmloader.Loader(src, **{**kw, **other}, state=state)
    with shmloader.Loader(src, **kw, state=state) as loader:  # the same settings resume
        assert loader.state()["batch"] == 1


def fails_on_5(i, rng):
    if i == 5:
        raise ValueError("row 5 is damaged")
    return {"x": np.int64(i)}


def test_state_is_exact_until_a_sample_is_skipped():
    """docs/guide/resuming.md: after skipped samples, ``state()["exact"]`` is false (a skip pulls a later sample
    forward, so a resumed run cannot repeat the stream to the sample)."""
    src = shmloader.FunctionSource(fails_on_5, {"x": ((), np.int64)}, 12, check=False)
    with shmloader.Loader(src, batch_size=4, workers=1, on_error="skip") as loader:
        assert loader.state()["exact"] is True
        it = iter(loader)
        assert next(it)["x"].tolist() == [0, 1, 2, 3]
        assert loader.stats()["skipped"] == 0 or loader.state()["exact"] is False
        rest = [b["x"].tolist() for b in it]
        assert loader.stats()["skipped"] == 1 and loader.state()["exact"] is False
    assert sorted(sum(rest, [])) == [4, 6, 7, 8, 9, 10, 11]
    ok = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 12)
    with shmloader.Loader(ok, batch_size=4, workers=1, on_error="skip") as loader:
        assert sum(len(b["x"]) for b in loader) == 12 and loader.state()["exact"] is True


def test_dropped_counts_the_samples_of_a_batch_a_skip_left_short():
    """drop_remainder=True keeps every batch whole: when a skip leaves a batch short and no
    sample of the epoch is left to refill it (the ring had planned the whole epoch), the batch
    is dropped and its samples counted in ``stats()["dropped"]``."""
    src = shmloader.FunctionSource(fails_on_5, {"x": ((), np.int64)}, 12, check=False)
    with shmloader.Loader(src, batch_size=4, workers=1, slots=4, drop_remainder=True, on_error="skip") as loader:
        got = [b["x"].tolist() for b in loader]
        s = loader.stats()
    assert got == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert (s["skipped"], s["dropped"], s["samples"]) == (1, 3, 8)
    with shmloader.Loader(src, batch_size=4, workers=1, slots=4, on_error="skip") as loader:
        got = [b["x"].tolist() for b in loader]  # without drop_remainder the short batch comes
        assert loader.stats()["dropped"] == 0
    assert got == [[0, 1, 2, 3], [4, 6, 7], [8, 9, 10, 11]]


def test_eval_loader_every_clip_once_in_order_beside_training(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_video=2, size=(32, 40))
    with shmloader.Loader(clips, batch_size=4, workers=1, shuffle=True, epochs=None) as train, \
            shmloader.eval_loader(clips, batch_size=3) as val:
        assert val.stats()["workers"] == 1
        t = iter(train)
        seen = []
        for b in val:
            next(t)  # training goes on at the same time, with its own ring and worker
            seen += [(int(i), int(s)) for i, s in zip(b["index"], b["start"])]
        assert len(val) == 6 and len(seen) == 16  # last partial batch kept
        last = 40 - 4
        assert seen == [(v, c * last) for v in range(8) for c in range(2)]  # uniform, in order
        del t
    with pytest.raises(ValueError, match="shuffle=False"):
        shmloader.eval_loader(clips, batch_size=3, shuffle=True)


SLOW_S = 0.03
CPUS = 4  # what the loader is told it may use, so the recommendation is the same on any machine


@pytest.fixture
def four_cpus(monkeypatch):
    monkeypatch.setattr(shmloader._loader, "usable_cpus", lambda: CPUS)


def slow_decode(i, rng):
    time.sleep(SLOW_S)
    return {"x": np.int64(i)}


def check_diagnosis(s):
    """The derived fields of ``stats()`` are what its docstring says, computed from the others."""
    # Delivered from the first batch on, that batch's 4 samples apart, as the shares count.
    window = s["elapsed_s"] - s["first_batch_s"]
    assert s["samples_per_s"] == pytest.approx((s["samples"] - 4) / window)
    assert s["samples_per_worker_s"] == pytest.approx(s["decoded"] / s["worker_busy_s"])
    assert s["input_bound"] == (s["consumer_wait_fraction"] > 0.1)
    # Workers to meet what the consumer took while not waiting, at that rate, 1 to CPUS.
    demand = s["samples"] / (window * (1 - s["consumer_wait_fraction"]))
    need = demand / s["samples_per_worker_s"]
    assert s["recommended_workers"] in {max(1, min(CPUS, math.ceil(need * f))) for f in (1 - 1e-6, 1 + 1e-6)}


def test_stats_says_input_bound_and_recommends_more_workers(caplog, four_cpus):
    src = shmloader.FunctionSource(slow_decode, {"x": ((), np.int64)}, 60, check=False)
    caplog.set_level(logging.INFO, logger="shmloader")
    with shmloader.Loader(src, batch_size=4, workers=1, log_every=0.1) as loader:
        for _ in loader:
            pass  # a consumer with nothing to do: waits on the single worker all the time
        s = loader.stats()
    check_diagnosis(s)
    assert s["input_bound"]
    # A consumer that does nothing wants more than one sleeping worker gives: as many as it may.
    assert s["recommended_workers"] == CPUS
    # A worker cannot beat its sleep.
    assert s["worker_busy_s"] >= 60 * SLOW_S and s["samples_per_worker_s"] <= 1 / SLOW_S
    # Its share counts from its READY, not from its process start (NOTE [ Start-up is not work ]).
    assert s["worker_busy_s"] / s["elapsed_s"] < s["worker_busy_fraction"][0] <= 1.0
    assert s["worker_busy_fraction"][0] > 0.8
    assert "input-bound" in caplog.text and f"recommended workers: {CPUS}" in caplog.text


def test_stats_says_compute_bound_with_slow_consumer(tmp_path, four_cpus):
    """Workers well ahead of a consumer that trains: no next() waits for a worker, so the wait
    share is the loader's bookkeeping alone and training is compute-bound."""
    log = str(tmp_path / "decoded")

    def decode(i, rng):  # one byte per sample a worker begins
        with open(log, "ab") as f:
            f.write(b"x")
        return {"x": np.int64(i)}

    src = shmloader.FunctionSource(decode, {"x": ((), np.int64)}, 40, check=False)
    # 12 slots: epoch 1's ten batches and the first two of epoch 2, one task each. Tasks alternate
    # between the two workers, and a worker sends a task's reply before it reads the next, so once
    # both epoch-2 tasks have begun (48 samples begun), every reply of epoch 1 is in its pipe.
    with shmloader.Loader(src, batch_size=4, workers=2, slots=12, epochs=2) as loader:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 60
        while os.path.getsize(log) < 48 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.getsize(log) >= 48
        for _ in range(9):
            time.sleep(0.1)  # a slow training step
            next(it)
        s = loader.stats()
    check_diagnosis(s)
    assert s["samples"] == 40 and not s["input_bound"]
    assert "compute-bound" in loader.stats_line()


def naps_first(i, rng):
    if i == 0:
        time.sleep(0.5)
    return {"x": np.int64(i)}


def test_first_batch_s_is_the_start_and_is_not_counted_as_waiting():
    src = shmloader.FunctionSource(naps_first, {"x": ((), np.int64)}, 12, check=False)
    with shmloader.Loader(src, batch_size=4, workers=1) as loader:
        s = loader.stats()
        assert s["first_batch_s"] is None and s["samples_per_s"] == 0 and s["consumer_wait_fraction"] == 0
        it = iter(loader)
        next(it)
        first = loader.stats()
        assert first["first_batch_s"] >= 0.5  # sample 0 naps half a second in the first batch
        assert first["consumer_wait_s"] >= 0.5  # the consumer waited for it inside next(), and yet
        assert first["consumer_wait_fraction"] == 0  # the start is not the pipeline waiting
        # the rate counts from the first batch, as the shares do (NOTE [ Start-up is not work ])
        assert first["samples"] == 4 and first["samples_per_s"] == 0
        rest = list(it)
        s = loader.stats()
    assert len(rest) == 2 and s["first_batch_s"] == first["first_batch_s"]  # said once
    assert s["samples_per_s"] == pytest.approx(8 / (s["elapsed_s"] - s["first_batch_s"]))


def test_workers_keep_decoding_while_the_consumer_trains(tmp_path):
    """During a long training step (no call into the loader) the workers fill every free slot."""
    done = tmp_path / "done"
    done.mkdir()

    def decode(i, rng):  # leaves a mark when sample i is decoded
        time.sleep(SLOW_S)
        (done / str(i)).touch()
        return {"x": np.int64(i)}

    src = shmloader.FunctionSource(decode, {"x": ((), np.int64)}, 64, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2, slots=5) as loader:
        it = iter(loader)
        next(it)
        # The consumer is "training": it does not call next(). The next 4 batches (every other
        # slot) must still be decoded; if decoding waited for the consumer this never happens.
        deadline = time.monotonic() + 60
        while len(list(done.iterdir())) < 5 * 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(int(p.name) for p in done.iterdir()) == list(range(40))
        assert [next(it)["x"].tolist() for _ in range(4)] == [list(range(8 * k, 8 * k + 8)) for k in range(1, 5)]
        del it


def ident(i, rng):
    return {"x": np.int64(i)}


def test_two_threads_iterating_one_loader_share_one_stream():
    """A lock serialises concurrent iterators: each batch goes to one of them, each sample once.
    (Many one-sample batches from three workers: without the lock, the two threads soon take
    each other's replies and the loader stops on a "protocol error".)"""
    src = shmloader.FunctionSource(ident, {"x": ((), np.int64)}, 2000, check=False)
    with shmloader.Loader(src, batch_size=1, workers=3) as loader:
        iterators = [iter(loader), iter(loader)]
        got = [[int(x) for x in next(it)["x"]] for it in iterators]  # both have begun this pass
        errors = []
        start = threading.Barrier(2)

        def consume(k):
            try:
                start.wait()
                for b in iterators[k]:
                    got[k] += [int(x) for x in b["x"]]
            except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads) and errors == []
    assert sorted(got[0] + got[1]) == list(range(2000)) and got[0] and got[1]


def test_close_from_another_thread_ends_iteration_quietly():
    src = shmloader.FunctionSource(slow_decode, {"x": ((), np.int64)}, 10**6, check=False)
    loader = shmloader.Loader(src, batch_size=4, workers=2, epochs=None)
    outcome = []

    first = threading.Event()

    def consume():
        try:
            n = 0
            for _ in loader:
                n += 1
                first.set()  # closing now interrupts a stream that is running
            outcome.append(n)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
            outcome.append(e)

    t = threading.Thread(target=consume)
    t.start()
    assert first.wait(60), "no batch within 60 s"
    loader.close()
    t.join(10)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], int) and outcome[0] > 0, outcome
