"""Training features: resumable iteration, evaluation loaders, input-bound diagnostics."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

import shmloader

pytestmark = pytest.mark.timeout(120)


def record(batches):
    return [{k: v.tolist() for k, v in b.items() if k != "video"} | {"video": int(np.asarray(b["video"]).sum())}
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


def slow_decode(i, rng):
    time.sleep(0.03)
    return {"x": np.int64(i)}


def test_stats_says_input_bound_and_recommends_more_workers(caplog):
    src = shmloader.FunctionSource(slow_decode, {"x": ((), np.int64)}, 60, check=False)
    caplog.set_level(logging.INFO, logger="shmloader")
    with shmloader.Loader(src, batch_size=4, workers=1, log_every=0.1) as loader:
        for _ in loader:
            pass  # a consumer with nothing to do: waits on the single worker all the time
        s = loader.stats()
    assert s["input_bound"] and s["consumer_wait_fraction"] > 0.5
    assert s["recommended_workers"] == 2  # more than one, capped at the 2 CPUs here
    assert 20 < s["samples_per_worker_s"] < 40
    assert s["worker_busy_fraction"][0] > 0.5
    assert "input-bound" in caplog.text and "recommended workers" in caplog.text


def test_stats_says_compute_bound_with_slow_consumer():
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 40)
    with shmloader.Loader(src, batch_size=4, workers=2) as loader:
        it = iter(loader)
        next(it)
        for _ in it:
            time.sleep(0.05)  # a slow training step
        s = loader.stats()
    assert not s["input_bound"] and s["consumer_wait_fraction"] < 0.1
    assert s["recommended_workers"] == 1
    assert "compute-bound" in loader.stats_line()


def test_workers_keep_decoding_while_the_consumer_trains():
    """During a long training step the workers fill every free slot, so the next batches are ready."""
    src = shmloader.FunctionSource(slow_decode, {"x": ((), np.int64)}, 64, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2) as loader:  # ~0.12 s of decoding per batch
        it = iter(loader)
        next(it)
        time.sleep(1.5)  # a long step: enough time to decode the next 3 batches and more
        waits = []
        for _ in range(3):
            t0 = time.perf_counter()
            next(it)
            waits.append(time.perf_counter() - t0)
        del it
    assert max(waits) < 0.05, waits


def test_close_from_another_thread_ends_iteration_quietly():
    import threading

    src = shmloader.FunctionSource(slow_decode, {"x": ((), np.int64)}, 10**6, check=False)
    loader = shmloader.Loader(src, batch_size=4, workers=2, epochs=None)
    outcome = []

    def consume():
        try:
            n = sum(1 for _ in loader)
            outcome.append(n)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
            outcome.append(e)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.8)
    loader.close()
    t.join(10)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], int) and outcome[0] > 0, outcome
