"""The consumer stops early, or the training process dies: workers go, nothing is left behind."""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import shmloader

from .conftest import live_children, our_fds, shm_entries

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import shmloader

    def fn(i, rng):
        if os.environ.get("MARK_DIR"):  # say "this worker is inside a sample now"
            open(os.path.join(os.environ["MARK_DIR"], str(os.getpid())), "w").close()
        time.sleep(float(os.environ.get("SAMPLE_S", "0.02")))
        return {"x": np.full((1000,), i, np.int64)}

    loader = shmloader.Loader(shmloader.FunctionSource(fn, {"x": ((1000,), np.int64)}, 1000, check=False),
                              batch_size=4, workers=2, epochs=None, shm_dir=os.environ.get("SHM_DIR") or None)
    print(" ".join(map(str, loader.worker_pids())), flush=True)
    it = iter(loader)
    next(it)
    print("first batch", flush=True)
    if os.environ.get("MODE") == "iterate":
        for b in it:
            pass
    else:
        time.sleep(600)
""")


def start(tmp_path, first_batch=True, **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **env})
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2, proc.stderr.read()
    if first_batch:
        assert proc.stdout.readline().strip() == "first batch"
    return proc, pids


def wait_gone(pids, seconds=5.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"workers {pids} still alive after {seconds} s")


def ident(i, rng):
    return {"x": np.full((8,), i, np.int64)}


def small_loader(**kw):
    return shmloader.Loader(shmloader.FunctionSource(ident, {"x": ((8,), np.int64)}, 100), batch_size=4,
                            workers=1, **kw)


def test_exception_in_training_loop():
    with pytest.raises(ZeroDivisionError):
        with small_loader(epochs=None) as loader:
            pids = loader.worker_pids()
            for b in loader:
                1 / 0
    wait_gone(pids, 2)


def test_hundred_early_breaks_leak_nothing():
    fds_before = len(os.listdir("/proc/self/fd"))
    shm_before = shm_entries()
    for _ in range(100):
        with small_loader(epochs=None) as loader:
            for b in loader:
                break
    del b  # the last batch kept its mapping (and the mapping's descriptor) alive until now
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds_before
    assert shm_entries() == shm_before and our_fds() == [] and live_children() == []


def test_ctrl_c_only_main_process_reports(tmp_path):
    proc, pids = start(tmp_path, MODE="iterate")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert err.count("KeyboardInterrupt") == 1, err
    wait_gone(pids, 5)


def wait_for(condition, seconds=60.0, what="condition"):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.05)


@pytest.mark.parametrize("sample_s", ["0.02", "30"])  # workers idle / busy in a sample
def test_parent_killed_workers_exit(tmp_path, sample_s):
    marks = tmp_path / "marks"
    marks.mkdir()
    proc, pids = start(tmp_path, first_batch=sample_s != "30", SAMPLE_S=sample_s, MARK_DIR=str(marks))
    # Busy case: both workers are inside a 30 s sample. Idle case: they have filled the ring
    # (several samples each) and wait for a slot.
    wait_for(lambda: {int(p.name) for p in marks.iterdir()} == set(pids), what="sample started by both workers")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_gone(pids, 5) < 5


@pytest.mark.parametrize("shm_dir", ["", "/dev/shm"])
def test_process_group_killed_leaves_nothing(tmp_path, shm_dir):
    before = shm_entries()
    proc, pids = start(tmp_path, SHM_DIR=shm_dir, MODE="iterate")
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_gone(pids, 5)
    assert shm_entries() == before


def test_too_little_shared_memory_clear_error(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(1 << 20, np.uint8)},
                                       {"x": ((1 << 20,), np.uint8)}, 8)
        with pytest.raises(shmloader.LoaderError, match=r"needs 8\.0 MiB.*--shm-size"):
            shmloader.Loader(src, batch_size=2, workers=1, slots=4, shm_dir=str(mnt))
        assert os.listdir(mnt) == []
        with shmloader.Loader(src, batch_size=2, workers=1, slots=1 + 1, shm_dir=str(mnt)) as loader:
            assert sum(len(b["x"]) for b in loader) == 8  # what fits works
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


SMALL_LIMIT = textwrap.dedent("""
    import os, resource, sys
    import numpy as np
    import shmloader

    # The size limit applies to memfd and tmpfs files as to any other: a ring over 4 MiB cannot be
    # reserved, as on a small /dev/shm, and no root is needed to set it.
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    shm_dir = sys.argv[1] or None
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(1 << 20, np.uint8)},
                                   {"x": ((1 << 20,), np.uint8)}, 8)
    try:
        shmloader.Loader(src, batch_size=2, workers=1, slots=4, shm_dir=shm_dir)
        print("no error")
    except shmloader.LoaderError as e:
        print("error:", e)
    with shmloader.Loader(src, batch_size=2, workers=1, slots=2, shm_dir=shm_dir) as loader:
        print("delivered:", sum(len(b["x"]) for b in loader))
""")


@pytest.mark.parametrize("where", ["memfd", "/dev/shm", "fixture"])
def test_ring_that_cannot_be_reserved_clear_error(tmp_path, where, request):
    """Runs without root: RLIMIT_FSIZE makes reserving the ring fail as a small tmpfs would."""
    shm_dir = request.getfixturevalue("shm_dir") if where == "fixture" else "" if where == "memfd" else where
    script = tmp_path / "small.py"
    script.write_text(SMALL_LIMIT)
    out = subprocess.run([sys.executable, str(script), shm_dir], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("error: not enough "), out.stdout
    assert "needs 8.0 MiB" in lines[0] and "ulimit -f: 4.0 MiB" in lines[0] and "--shm-size" in lines[0]
    if shm_dir:
        assert f"space in {shm_dir}" in lines[0]
    if where == "fixture":
        assert os.listdir(shm_dir) == []  # nothing with a name, even after the failure
    assert lines[1] == "delivered: 8"  # what fits works


@pytest.mark.parametrize("slots", [4, None])
def test_ring_larger_than_memory_fails_before_allocating(slots):
    spec = {"x": ((1 << 30,), np.uint8)}
    src = shmloader.FunctionSource(lambda i, rng: None, spec, 4, check=False)
    with pytest.raises(shmloader.LoaderError, match="GiB of memory is available"):
        shmloader.Loader(src, batch_size=64, workers=1, slots=slots)


@pytest.mark.parametrize("memory_mib, slots", [(1024, 12), (16, 4), (1, 2)])
def test_default_ring_fits_the_memory(monkeypatch, caplog, memory_mib, slots):
    """slots=None: the usual 12 slots of 2 MiB here (2 batches queued per worker, 6 held by the
    consumer, one spare), or as many as fit in half the memory the
    ring may take (at least 2), said in a log line; an explicit slots= is taken as given."""
    caplog.set_level(logging.INFO, logger="shmloader")
    monkeypatch.setattr(shmloader._loader, "memory_for_ring", lambda shm_dir: memory_mib * 2**20)
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.full(1 << 20, i, np.uint8)},
                                   {"x": ((1 << 20,), np.uint8)}, 8, check=False)
    with shmloader.Loader(src, batch_size=2, workers=2) as loader:
        assert loader.stats()["slots"] == slots
        assert sorted(int(x[0]) for b in loader for x in b["x"]) == list(range(8))  # and it runs
    said = [r.getMessage() for r in caplog.records if "ring slots" in r.getMessage()]
    assert said == ([] if slots == 12 else [f"a batch takes 2.0 MiB: {slots} ring slots instead of the usual 12 "
                                             "fit in 50% of the memory available; pass slots= to choose"])
    with shmloader.Loader(src, batch_size=2, workers=2, slots=14) as loader:
        assert loader.stats()["slots"] == 14
