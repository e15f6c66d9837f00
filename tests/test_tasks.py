"""Per-batch tasks: a worker fills a run of positions and answers once, so the main process
wakes a few times per batch, not once per sample; failures, deaths, order and resume stay
exact per sample. Scale: many workers, and worker memory independent of the dataset's size."""

from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import psutil
import pytest

import shmloader

from .conftest import state_after

pytestmark = pytest.mark.timeout(120)

SPEC = {"i": ((), np.int64), "row": ((16,), np.float32)}


def plain(i, rng):
    return {"i": np.int64(i), "row": np.full(16, i, np.float32) + rng.random(16, dtype=np.float32)}


def delivered(loader):
    return [int(i) for b in loader for i in b["i"]]


def test_a_batch_is_a_few_tasks_and_delivers_the_same_as_one_worker():
    src = shmloader.FunctionSource(plain, SPEC, 64, check=False)
    runs = {}
    for workers in (1, 2, 3):
        with shmloader.Loader(src, batch_size=8, workers=workers, shuffle=True, seed=2, epochs=2) as loader:
            runs[workers] = [{k: np.array(v) for k, v in b.items()} for b in loader]
            stats = loader.stats()
        # a whole batch per task with up to 8 workers, not one task per sample
        assert stats["tasks"] == 16 and stats["decoded"] == 128
    for workers in (2, 3):
        assert len(runs[workers]) == len(runs[1]) == 16
        for a, b in zip(runs[1], runs[workers]):
            np.testing.assert_array_equal(a["i"], b["i"])
            np.testing.assert_array_equal(a["row"], b["row"])  # the same generator per sample


class SaysHowItWasRead(shmloader.ArraySource):
    """An ArraySource whose column ``call`` says, for every row, how many rows the ``read_many``
    call that read it had: positive when the worker gave it the run as one block, negative when
    it had to write row by row."""

    def read_many(self, indices, rngs, outs, epoch_key=None):
        super().read_many(indices, rngs, outs, epoch_key)
        if outs.block is not None:
            outs.block["call"][...] = len(indices)
        else:
            for i in range(len(indices)):
                outs[i]["call"][...] = -len(indices)


def test_rows_of_an_array_source_come_in_one_gather_per_run():
    rows = np.arange(1000 * 256, dtype=np.uint8).reshape(1000, 256)
    src = SaysHowItWasRead({"x": rows, "y": np.arange(1000), "call": np.zeros(1000, np.int64)})
    with shmloader.Loader(src, batch_size=100, workers=2, shuffle=True, seed=0) as loader:
        got = [(np.array(b["x"]), np.array(b["y"]), np.array(b["call"])) for b in loader]
        assert loader.stats()["tasks"] == 10
    order = np.concatenate([y for _, y, _ in got])
    assert sorted(order) == list(range(1000))
    for x, y, call in got:
        np.testing.assert_array_equal(x, rows[y])
        assert (call == 100).all()  # the whole batch in one call, given as one block


def fails_on_5(i, rng):
    if i == 5:
        raise ValueError("row 5 is damaged")
    return plain(i, rng)


def test_failure_in_the_middle_of_a_task_raises_naming_the_sample():
    src = shmloader.FunctionSource(fails_on_5, SPEC, 16, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2) as loader:  # tasks 0-7, 8-15
        with pytest.raises(shmloader.SampleError, match="sample 5 .*row 5 is damaged"):
            delivered(loader)


def test_failure_in_the_middle_of_a_task_skips_only_that_sample():
    # Three slots: batches 0-2 go out first, and sample 5's place in batch 0 is refilled with the
    # next sample of the epoch that no batch holds yet (24), which batch 3 then goes without.
    src = shmloader.FunctionSource(fails_on_5, SPEC, 32, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2, slots=3, on_error="skip") as loader:
        got = [[int(i) for i in b["i"]] for b in loader]
        assert loader.stats()["skipped"] == 1
    assert got == [[0, 1, 2, 3, 4, 24, 6, 7], list(range(8, 16)), list(range(16, 24)), list(range(25, 32))]


def killed_on_5(marks):
    def fn(i, rng):
        if i == 5 and (marks is None or not os.path.exists(marks)):
            if marks is not None:
                open(marks, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return plain(i, rng)
    return fn


def test_worker_killed_in_the_middle_of_a_task_once_loses_nothing(tmp_path):
    src = shmloader.FunctionSource(killed_on_5(str(tmp_path / "once")), SPEC, 16, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2, on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert got == list(range(16)) and stats["skipped"] == 0 and stats["worker_restarts"] == 1


def test_worker_killed_in_the_middle_of_a_task_always_skips_only_that_sample():
    src = shmloader.FunctionSource(killed_on_5(None), SPEC, 16, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2, on_error="skip", epochs=2) as loader:
        got = delivered(loader)
        stats = loader.stats()
    for e in range(2):
        assert sorted(got[e * 15 : (e + 1) * 15]) == [i for i in range(16) if i != 5]  # exactly once
    # each epoch: the task dies, its samples go again one by one, sample 5 dies alone and is skipped
    assert stats["skipped"] == 2 and stats["worker_restarts"] == 4


def test_worker_killed_in_a_task_raises_naming_the_samples_it_held():
    src = shmloader.FunctionSource(killed_on_5(None), SPEC, 16, check=False)
    with shmloader.Loader(src, batch_size=8, workers=2) as loader:
        with pytest.raises(shmloader.WorkerDiedError, match="SIGKILL") as info:
            delivered(loader)
    assert "sample 5" in info.value.holding and "sample 4" in info.value.holding


def test_resume_with_per_batch_tasks_is_exact():
    src = shmloader.FunctionSource(plain, SPEC, 40, check=False)
    kw = dict(batch_size=8, workers=2, shuffle=True, seed=6, epochs=2)
    with shmloader.Loader(src, **kw) as loader:
        full = [np.array(b["row"]) for b in loader]
    _, state = state_after(src, 7, **kw)
    with shmloader.Loader(src, state=state, **dict(kw, workers=3)) as loader:
        rest = [np.array(b["row"]) for b in loader]
    assert len(rest) == len(full) - 7
    for a, b in zip(full[7:], rest):
        np.testing.assert_array_equal(a, b)


def test_load_state_resumes_like_the_constructor():
    """Loader.load_state(state) before the first batch is Loader(..., state=); after it, refused."""
    src = shmloader.FunctionSource(plain, SPEC, 40, check=False)
    kw = dict(batch_size=8, workers=2, shuffle=True, seed=6, epochs=2)
    with shmloader.Loader(src, **kw) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state()
        with pytest.raises(shmloader.LoaderError, match="before the first batch"):
            loader.load_state(state)
    with shmloader.Loader(src, state=state, **kw) as loader:
        expected = [np.array(b["row"]) for b in loader]
    with shmloader.Loader(src, **kw) as loader:
        with pytest.raises(ValueError, match="other settings"):
            loader.load_state(dict(state, seed=7))
        loader.load_state(state)
        got = [np.array(b["row"]) for b in loader]
        assert loader.state()["epoch"] == 2
    assert len(got) == len(expected) == 10 - 3
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def naps(i, rng):
    time.sleep(0.01)
    return {"i": np.int64(i), "row": np.zeros(16, np.float32)}


def more_than_cpus_said(caplog):
    return [r.getMessage() for r in caplog.records if "is more than" in r.getMessage()]


@pytest.fixture
def two_cpus(monkeypatch):
    """The loader sees 2 usable CPUs on any machine, and has said nothing yet in this process
    ("more workers than CPUs" is said once per process: an earlier test may have said it)."""
    monkeypatch.setattr(shmloader._loader, "usable_cpus", lambda: 2)
    monkeypatch.setattr(shmloader._loader, "_logged", set())


def test_64_workers_start_run_and_close_leaving_nothing(caplog, two_cpus):
    src = shmloader.FunctionSource(naps, SPEC, 256, check=False)
    with caplog.at_level(logging.INFO, logger="shmloader"):
        with shmloader.Loader(src, batch_size=32, workers=64) as loader:
            pids = loader.worker_pids()
            assert len(pids) == 64
            assert sorted(delivered(loader)) == list(range(256))
            assert loader.stats()["tasks"] == 8 * 4  # 64 workers: each batch in 4 runs of 8
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert more_than_cpus_said(caplog) == ["workers=64 is more than the 2 CPUs this process may use: they will share them"]


def test_more_workers_than_cpus_is_said_once_per_process(caplog, two_cpus):
    src = shmloader.FunctionSource(plain, SPEC, 8, check=False)
    with caplog.at_level(logging.INFO, logger="shmloader"):
        for _ in range(2):
            with shmloader.Loader(src, batch_size=4, workers=3) as loader:
                assert sorted(delivered(loader)) == list(range(8))
    assert more_than_cpus_said(caplog) == ["workers=3 is more than the 2 CPUs this process may use: they will share them"]


def test_workers_none_is_one_per_cpu_this_process_may_use():
    """workers=None follows the CPUs this process may run on (taskset, cpusets), not the machine's."""
    allowed = os.sched_getaffinity(0)
    src = shmloader.FunctionSource(plain, SPEC, 8, check=False)
    try:
        for cpus in ({min(allowed)}, allowed):
            os.sched_setaffinity(0, cpus)  # this thread, and the workers it starts
            with shmloader.Loader(src, batch_size=4) as loader:
                assert len(loader.worker_pids()) == len(cpus)
                assert sorted(delivered(loader)) == list(range(8))
    finally:
        os.sched_setaffinity(0, allowed)


def uss_of_worker(paths, video):
    clips = shmloader.VideoClips(paths, np.arange(len(paths)) % 7, clip_len=2, size=(32, 32))
    with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
        batch = next(iter(loader))  # the worker has started, read its config and decoded
        assert int(batch["index"][0]) == 0
        (pid,) = loader.worker_pids()
        uss = psutil.Process(pid).memory_full_info().uss
        del batch
    return uss


def test_worker_memory_does_not_grow_with_the_number_of_videos(videos):
    real = videos[0][:8]
    small = uss_of_worker(real, videos)
    many = real + [f"/data/kinetics/train/class_{i % 400:03d}/video_{i:07d}.mp4" for i in range(1_000_000)]
    large = uss_of_worker(many, videos)
    assert large - small < 10 * 2**20, f"worker USS {small / 2**20:.0f} MiB -> {large / 2**20:.0f} MiB"
