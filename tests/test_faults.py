"""Worker faults: a raise, a crash, a hang. Each ends in a clear error or a counted skip, fast."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import time

import numpy as np
import pytest

import shmloader
from shmloader._samples import read_codes

pytestmark = pytest.mark.timeout(60)

SPEC = {"i": ((), np.int64)}


def source(fn, n=24):
    return shmloader.FunctionSource(fn, SPEC, n, check=False)


def delivered(loader):
    return [int(i) for b in loader for i in b["i"]]


def raises_on_7(i, rng):
    if i == 7:
        raise ValueError(f"cannot read row {i}")
    return {"i": np.int64(i)}


def segfaults_on_7(i, rng):
    if i == 7:
        ctypes.string_at(0)
    return {"i": np.int64(i)}


def aborts_on_7(i, rng):
    if i == 7:
        os.abort()
    return {"i": np.int64(i)}


def oom_killed_on_7(i, rng):
    if i == 7:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    return {"i": np.int64(i)}


def hangs_holding_gil_on_7(i, rng):
    if i == 7:
        ctypes.PyDLL(None).sleep(3600)  # native call that keeps the GIL
    return {"i": np.int64(i)}


def test_worker_raises_sampleerror_fast():
    t0 = time.monotonic()
    with shmloader.Loader(source(raises_on_7), batch_size=4, workers=2) as loader:
        with pytest.raises(shmloader.SampleError, match=r"sample 7 .*ValueError: cannot read row 7") as info:
            delivered(loader)
    assert time.monotonic() - t0 < 10
    assert info.value.exc_type == "ValueError" and "raises_on_7" in info.value.__cause__.tb


def test_worker_raises_skip_refills_without_duplicates(caplog):
    with shmloader.Loader(source(raises_on_7), batch_size=4, workers=2, shuffle=True, epochs=2,
                          on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert sorted(got) == sorted([i for i in range(24) if i != 7] * 2)
    assert stats["skipped"] == 2 and stats["batches"] == 12
    assert [s for _, s, _ in loader.skipped] == [7, 7]
    assert "skipped sample 7" in caplog.text and "cannot read row 7" in caplog.text


@pytest.mark.parametrize("fn, how", [(segfaults_on_7, "SIGSEGV"), (aborts_on_7, "SIGABRT"),
                                     (oom_killed_on_7, "SIGKILL")])
def test_worker_dies_raises_worker_died(fn, how):
    t0 = time.monotonic()
    with shmloader.Loader(source(fn), batch_size=4, workers=2) as loader:
        pids = loader.worker_pids()
        with pytest.raises(shmloader.WorkerDiedError, match=how) as info:
            delivered(loader)
        assert loader.worker_pids() == []  # the others were stopped too
    assert time.monotonic() - t0 < 10
    assert info.value.pid in pids and "sample 7" in info.value.holding


def test_worker_dies_skip_retries_then_skips_exactly_once():
    with shmloader.Loader(source(segfaults_on_7), batch_size=4, workers=2, shuffle=True, epochs=2,
                          on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert sorted(got) == sorted([i for i in range(24) if i != 7] * 2)
    assert stats["skipped"] == 2
    assert stats["worker_restarts"] == 4  # each epoch: one retry, then the skip


def test_worker_killed_from_outside_skip_mode_loses_nothing():
    def slow(i, rng):
        time.sleep(0.05)
        return {"i": np.int64(i)}

    with shmloader.Loader(source(slow, 40), batch_size=4, workers=2, on_error="skip") as loader:
        it = iter(loader)
        got = [int(i) for i in next(it)["i"]]
        os.kill(loader.worker_pids()[0], signal.SIGKILL)
        got += [int(i) for b in it for i in b["i"]]
        stats = loader.stats()
    assert sorted(got) == list(range(40))  # the sample it held was decoded again elsewhere
    assert stats["skipped"] == 0 and stats["worker_restarts"] == 1


def test_worker_hang_holding_gil_times_out():
    t0 = time.monotonic()
    with shmloader.Loader(source(hangs_holding_gil_on_7), batch_size=4, workers=2, timeout=1.5) as loader:
        with pytest.raises(shmloader.WorkerDiedError, match=r"timeout=1.5 s") as info:
            delivered(loader)
    assert time.monotonic() - t0 < 10
    assert "sample 7" in info.value.holding


def test_worker_hang_skip_mode_skips_and_goes_on():
    with shmloader.Loader(source(hangs_holding_gil_on_7), batch_size=4, workers=2, timeout=1.0,
                          on_error="skip") as loader:
        got = delivered(loader)
        assert loader.stats()["skipped"] == 1
    assert sorted(got) == [i for i in range(24) if i != 7]


def test_exactly_once_with_faults_in_videos(videos, tmp_path):
    """Frame codes say which clip arrived: good videos exactly once per epoch, bad ones reported."""
    paths, _ = videos
    corrupt = tmp_path / "corrupt.mp4"
    data = bytearray(open(paths[2], "rb").read())
    corrupt.write_bytes(bytes(data[: len(data) // 3]))
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(os.urandom(5000))
    mixed = paths[:2] + [str(corrupt)] + paths[3:] + [str(garbage)]
    clips = shmloader.VideoClips(mixed, clip_len=4, clips_per_video=2, sampling="uniform", size=(32, 40))
    with shmloader.Loader(clips, batch_size=3, workers=2, shuffle=True, epochs=3, on_error="skip") as loader:
        seen = []
        for b in loader:
            ids, frames = read_codes(b["video"])
            for k in range(len(ids)):
                assert (ids[k] == ids[k][0]).all()
                seen.append((int(ids[k][0]), int(frames[k][0])))
        skipped = loader.skipped
    good_ids = [i for i, p in enumerate(mixed) if p not in (str(corrupt), str(garbage))]
    counts = collections.Counter(seen)
    assert {v for v, _ in counts} == set(good_ids)
    assert len(counts) == 2 * len(good_ids) and set(counts.values()) == {3}
    assert sorted(s for _, s, _ in skipped) == sorted([2 * 2, 2 * 2 + 1, 2 * 8, 2 * 8 + 1] * 3)
