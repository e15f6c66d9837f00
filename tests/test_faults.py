"""Worker faults: a raise, a crash, a hang. Each ends in a clear error or a counted skip, fast."""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import sys
import time

import numpy as np
import pytest

import shmloader
from shmloader.engine.core import _POLL_S
from shmloader.engine.pool import _GRACE_S
from shmloader.video.samples import read_codes

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


def gated(fault, gate):
    """``fault`` on sample 7 once the file ``gate`` exists: the test opens the gate after its first
    batch, so that its clock starts with the workers up and the fault not yet happened. Samples
    4-6 share sample 7's task (one task per batch for 2 workers) and go through at once."""

    def fn(i, rng):
        if i == 7:
            while not os.path.exists(gate):
                time.sleep(0.01)
            fault(i, rng)
        return {"i": np.int64(i)}
    return fn


def first_batch_then_open(loader, gate):
    """Take batch 0 (samples 0-3, the other worker's task), open the gate; returns (iterator, t)."""
    it = iter(loader)
    assert next(it)["i"].tolist() == [0, 1, 2, 3]
    open(gate, "w").close()
    return it, time.monotonic()


def test_worker_raises_sampleerror_fast(tmp_path):
    """The worker reports the failure in its reply, which wakes the loader at once: the error is
    in the consumer long before even one sample's ``timeout`` (a lost report would surface, if at
    all, as a timeout after 4 x timeout for the 4-sample task). At once: within the liveness
    poll's period, twice over for a busy machine."""
    gate = str(tmp_path / "gate")
    timeout = 30.0
    with shmloader.Loader(source(gated(raises_on_7, gate)), batch_size=4, workers=2, timeout=timeout) as loader:
        it, t0 = first_batch_then_open(loader, gate)
        with pytest.raises(shmloader.SampleError, match=r"sample 7 .*ValueError: cannot read row 7") as info:
            next(it)
        elapsed = time.monotonic() - t0
        assert loader.worker_pids() == []  # the workers were stopped
    assert elapsed < 2 * _POLL_S
    assert info.value.exc_type == "ValueError" and "raises_on_7" in info.value.__cause__.tb


def test_worker_raises_skip_refills_without_duplicates(caplog):
    with shmloader.Loader(source(raises_on_7), batch_size=4, workers=2, shuffle=True, epochs=2,
                          on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert sorted(got) == sorted([i for i in range(24) if i != 7] * 2)
    assert stats["skipped"] == 2
    assert [s for _, s, _ in loader.skipped] == [7, 7]
    assert "skipped sample 7" in caplog.text and "cannot read row 7" in caplog.text


def raises_on_odd(i, rng):
    if i % 2:
        raise ValueError(f"cannot read row {i}")
    return {"i": np.int64(i)}


def test_many_skips_are_counted_not_each_logged(caplog):
    """Half of 60 samples fail in each of 2 epochs: a few are logged one line each, the rest
    counted, each epoch summed in one line; every skip is still in ``skipped`` and ``stats()``."""
    with shmloader.Loader(source(raises_on_odd, 60), batch_size=6, workers=2, epochs=2, on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert sorted(got) == sorted(list(range(0, 60, 2)) * 2) and stats["skipped"] == 60
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("shmloader")]
    assert len([m for m in lines if m.startswith("skipped sample")]) == 2 * 5
    assert len([m for m in lines if "the rest of this epoch's are counted" in m]) == 2
    assert len([m for m in lines if re.match(r"epoch \d: 30 of 60 samples \(50%\) were skipped", m)]) == 2
    assert len(lines) <= 14


def test_skipped_position_refilled_from_later_in_the_same_epoch():
    """Sample 7 fails in batch 1 ([4, 5, 6, 7]); its position takes the epoch's next sample not
    yet in a batch, so batch 1 stays full and only the epoch's last batch is short. (A small ring
    keeps later batches unplanned when the skip happens.)"""
    with shmloader.Loader(source(raises_on_7), batch_size=4, workers=2, slots=3, epochs=2,
                          on_error="skip") as loader:
        got = [b["i"].tolist() for b in loader]
    assert [len(b) for b in got] == [4, 4, 4, 4, 4, 3] * 2
    for epoch in (got[:6], got[6:]):
        assert epoch[1][:3] == [4, 5, 6] and epoch[1][3] > 7  # refilled in place, from later on
        flat = [i for b in epoch for i in b]
        assert sorted(flat) == [i for i in range(24) if i != 7]  # the refill is delivered once


@pytest.mark.parametrize("fn, how", [(segfaults_on_7, "SIGSEGV"), (aborts_on_7, "SIGABRT"),
                                     (oom_killed_on_7, "SIGKILL")])
def test_worker_dies_raises_worker_died(fn, how, tmp_path):
    """A death is seen when the worker's reply pipe closes, at the latest at the next liveness
    poll (``_POLL_S``); the other worker is then given ``_GRACE_S`` to leave before it is killed.
    The clock starts once the workers are up (the first batch) and the gate lets sample 7 die."""
    gate = str(tmp_path / "gate")
    with shmloader.Loader(source(gated(fn, gate)), batch_size=4, workers=2, timeout=30) as loader:
        pids = loader.worker_pids()
        it, t0 = first_batch_then_open(loader, gate)
        with pytest.raises(shmloader.WorkerDiedError, match=how) as info:
            for _ in it:
                pass
        elapsed = time.monotonic() - t0
        assert loader.worker_pids() == []  # the others were stopped too
    assert elapsed < _POLL_S + _GRACE_S + _POLL_S  # the last term: slack for a busy machine
    assert info.value.pid in pids and "sample 7" in info.value.holding


def closes_its_reply_pipe_on_7(i, rng):
    if i == 7:
        os.close(int(sys.argv[2]))  # the worker's reply pipe (python -m shmloader.engine.worker TASK DONE ...)
        time.sleep(3600)
    return {"i": np.int64(i)}


@pytest.mark.timeout(60)
def test_worker_that_closes_its_reply_pipe_but_stays_is_killed():
    """A reply pipe at its end while its worker goes on (what a worker ending in uninterruptible
    sleep shows): the loader waits ``REAP_S`` for it to end, not for ever, then kills it and
    raises WorkerDiedError saying so."""
    from shmloader.engine.pool import REAP_S

    with shmloader.Loader(source(closes_its_reply_pipe_on_7), batch_size=4, workers=2, timeout=600) as loader:
        pids = loader.worker_pids()
        with pytest.raises(shmloader.WorkerDiedError, match=f"closed its reply pipe but had not ended {REAP_S:g} s "
                           r"later \(killed\); it was working on .*sample 7") as info:
            delivered(loader)
        assert loader.worker_pids() == []
    assert info.value.pid in pids
    wait_for_exit = time.monotonic() + 10
    while psutil_alive(info.value.pid) and time.monotonic() < wait_for_exit:
        time.sleep(0.05)
    assert not psutil_alive(info.value.pid)


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exits_3_on_7(i, rng):
    if i == 7:
        os._exit(3)
    return {"i": np.int64(i)}


def sys_exit_4_on_7(i, rng):
    if i == 7:
        sys.exit(4)  # SystemExit is no Exception: it ends the worker, as in a plain script
    return {"i": np.int64(i)}


@pytest.mark.parametrize("fn, code", [(exits_3_on_7, 3), (sys_exit_4_on_7, 4)])
def test_worker_exits_raises_worker_died_with_exit_code(fn, code):
    with shmloader.Loader(source(fn), batch_size=4, workers=2) as loader:
        with pytest.raises(shmloader.WorkerDiedError, match=f"exited with code {code}") as info:
            delivered(loader)
    assert "sample 7" in info.value.holding


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
    """One worker: its second task, samples 4-7, begins when it answers the first, before the
    first batch is handed out. A run of n samples gets n x timeout, so the kill comes 4 x 1.5 s
    after that: no sooner than 3 timeouts after the first batch (one timeout per task would fire
    after 1.5 s), no later than 4 timeouts and a liveness poll."""
    timeout, n = 1.5, 4
    with shmloader.Loader(source(hangs_holding_gil_on_7), batch_size=4, workers=1, timeout=timeout) as loader:
        it = iter(loader)
        assert next(it)["i"].tolist() == [0, 1, 2, 3]
        t0 = time.monotonic()
        with pytest.raises(shmloader.WorkerDiedError, match=r"timeout=1.5 s per sample on a task of 4") as info:
            next(it)
        elapsed = time.monotonic() - t0
    assert (n - 1) * timeout < elapsed < n * timeout + _POLL_S
    assert "sample 7" in info.value.holding


def test_worker_hang_skip_mode_kills_replaces_and_goes_on():
    with shmloader.Loader(source(hangs_holding_gil_on_7), batch_size=4, workers=2, timeout=1.0,
                          on_error="skip") as loader:
        first = set(loader.worker_pids())
        got = delivered(loader)
        stats = loader.stats()
        now = set(loader.worker_pids())
    # Sample 7 shares a task with samples 4-6 (a whole batch per task for 2 workers): the task
    # times out, its samples go again one by one, and sample 7 alone times out and is skipped.
    assert stats["skipped"] == 1 and stats["worker_restarts"] == 2
    assert len(now) == 2 and now != first  # hung workers were killed and replaced
    assert sorted(got) == [i for i in range(24) if i != 7]
    assert "timeout=1 s" in loader.skipped[0][2]


def poisons_slot_then_dies(marks):
    """A transform that half-writes sample 7's row with -1, then is killed (once, or always)."""

    def transform(sample, rng):
        if int(sample["i"]) == 7 and (marks is None or not os.path.exists(marks)):
            if marks is not None:
                open(marks, "w").close()
            sample["i"][...] = -1  # in place: this is the ring slot
            os.kill(os.getpid(), signal.SIGKILL)
    return transform


@pytest.mark.parametrize("dies", ["once", "always"])
def test_partly_written_slot_is_never_delivered(tmp_path, dies):
    """A worker killed after writing into the slot: the sample is decoded again (its position
    rewritten), or skipped (its position refilled or dropped); the half-written row never shows."""
    marks = str(tmp_path / "died") if dies == "once" else None
    with shmloader.Loader(source(lambda i, rng: {"i": np.int64(i)}), batch_size=4, workers=2,
                          transform=poisons_slot_then_dies(marks), on_error="skip") as loader:
        got = delivered(loader)
        stats = loader.stats()
    assert -1 not in got
    if dies == "once":  # the second attempt on a fresh worker wrote it again, whole
        assert sorted(got) == list(range(24)) and stats["skipped"] == 0 and stats["worker_restarts"] == 1
    else:
        assert sorted(got) == [i for i in range(24) if i != 7] and stats["skipped"] == 1


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
