"""The consumer stops early, or the training process dies: workers go, nothing is left behind."""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
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

    LEN = int(os.environ.get("SAMPLE_LEN", "1000"))

    def fn(i, rng):
        marks = os.environ.get("MARK_DIR")
        if marks:  # "this worker is inside sample i now", and later "it has finished sample i"
            open(os.path.join(marks, f"{os.getpid()}.{i}.start"), "w").close()
        time.sleep(float(os.environ.get("SAMPLE_S", "0.02")))
        if marks:
            open(os.path.join(marks, f"{os.getpid()}.{i}.end"), "w").close()
        return {"x": np.full((LEN,), i, np.int64)}

    loader = shmloader.Loader(shmloader.FunctionSource(fn, {"x": ((LEN,), np.int64)}, 1000, check=False),
                              batch_size=4, workers=2, epochs=None, shm_dir=os.environ.get("SHM_DIR") or None,
                              slots=int(os.environ["SLOTS"]) if os.environ.get("SLOTS") else None)
    print(" ".join(map(str, loader.worker_pids())), flush=True)
    it = iter(loader)
    next(it)
    print("first batch; slots", loader.stats()["slots"], flush=True)
    if os.environ.get("MODE") == "iterate":
        for b in it:
            pass
    else:
        time.sleep(600)
""")


def start(tmp_path, first_batch=True, **env):
    """The training script in its own process group: (process, worker pids, ring slots or None)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **env})
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2, proc.stderr.read()
    slots = None
    if first_batch:
        said, slots = proc.stdout.readline().rsplit(maxsplit=1)
        assert said == "first batch; slots"
        slots = int(slots)
    return proc, pids, slots


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


@pytest.mark.timeout(600)  # a hundred loaders' start-ups: past 120 s at load 14 on 2 cores
def test_hundred_early_breaks_leak_nothing():
    with small_loader() as loader:  # the process's fork server (its socket stays) started, if not yet
        next(iter(loader))
    fds_before = len(os.listdir("/proc/self/fd"))
    shm_before = shm_entries()
    # Children this test did not start (another module's fixture in the same test process: a
    # multiprocessing fork server) are not its leaks.
    kids_before = {p.pid for p in live_children()}
    for _ in range(100):
        with small_loader(epochs=None) as loader:
            for b in loader:
                break
    del b  # the last batch kept its mapping (and the mapping's descriptor) alive until now
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds_before

    def new_kids() -> list:
        return [p for p in live_children() if p.pid not in kids_before]

    deadline = time.monotonic() + 10  # a killed worker may take a moment to go on a loaded machine (REAP_S)
    while new_kids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shm_entries() == shm_before and our_fds() == [] and new_kids() == []


def test_ctrl_c_only_main_process_reports(tmp_path):
    proc, pids, _ = start(tmp_path, MODE="iterate")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert err.count("KeyboardInterrupt") == 1, err
    wait_gone(pids, 5)


INTERRUPTS = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    import numpy as np
    import shmloader

    N, TRIALS = 1000, 30
    loader = shmloader.Loader(shmloader.ArraySource({"x": np.repeat(np.arange(N), 4).reshape(N, 4)}),
                              batch_size=2, workers=1, epochs=None)
    rng, seen, after, caught, lost = random.Random(0), [], set(), 0, 0
    for trial in range(TRIALS):
        sent = threading.Event()
        def send():
            os.kill(os.getpid(), signal.SIGINT)
            sent.set()
        since = None  # when the signal was sent, as this loop first saw it
        try:
            # Inside the try: on a busy machine the signal can come before start() returns.
            threading.Timer(rng.uniform(0.002, 0.03), send).start()
            for b in loader:  # as fast as the ring turns: leases die and replies land all the time
                x = b["x"]
                assert (x == x[:, :1]).all() and list(x[:, 0]) == [x[0, 0], x[0, 0] + 1], x
                seen.append(int(x[0, 0]) // 2)
                if sent.is_set():
                    since = since or time.monotonic()
                    if time.monotonic() - since > 5:
                        lost += 1
                        break
        except KeyboardInterrupt:
            caught += 1
            after.add(len(seen))
            sent.wait()
    b = x = None
    s = loader.stats()
    loader.close()
    print(caught, lost, s["leased"], s["slots"], flush=True)
    print(" ".join(map(str, seen)))
    print(" ".join(map(str, sorted(after))))
""")


def test_ctrl_c_at_any_moment_is_raised_once_and_iteration_goes_on(tmp_path):
    """Ctrl-C while the loader hands out batches as fast as it can: every one raises
    KeyboardInterrupt in the loop (none is lost in a slot's release), and iterating again continues
    the same stream with exact batches and every slot back (NOTE [ Ctrl-C inside the engine ])."""
    script = tmp_path / "interrupts.py"
    script.write_text(INTERRUPTS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    counts, seen, after = proc.stdout.splitlines()
    caught, lost, leased, slots = map(int, counts.split())
    assert (caught, lost, leased) == (30, 0, 0), (counts, proc.stderr)
    seen = list(map(int, seen.split()))
    after = set(map(int, after.split()))
    per_epoch = 500
    for i in range(1, len(seen)):  # the next batch of the stream, or (at an interrupt) the one after
        step = (seen[i] - seen[i - 1]) % per_epoch
        assert step == 1 or (step == 2 and i in after), (i, seen[i - 1], seen[i])


def wait_for(condition, seconds=60.0, what="condition"):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.05)


def marked(marks, end):
    """{(worker pid, sample)} of the samples the workers began (or, with ``end``, finished)."""
    kind = "end" if end else "start"
    return {(int(pid), int(i)) for pid, i, k in (p.name.split(".") for p in marks.iterdir()) if k == kind}


@pytest.mark.parametrize("sample_s", ["0.02", "30"])  # workers idle / busy in a sample
def test_parent_killed_workers_exit(tmp_path, sample_s):
    marks = tmp_path / "marks"
    marks.mkdir()
    busy = sample_s == "30"
    proc, pids, slots = start(tmp_path, first_batch=not busy, SAMPLE_S=sample_s, MARK_DIR=str(marks))
    if busy:  # both workers are inside a 30 s sample
        wait_for(lambda: {pid for pid, _ in marked(marks, end=False)} == set(pids), what="sample started by both workers")
    else:
        # Idle: the first next() gave every slot of the ring a batch; the workers have finished
        # all of those samples and wait for a task that the sleeping consumer never sends.
        wait_for(lambda: {i for _, i in marked(marks, end=True)} == set(range(4 * slots)), what="ring filled")
        wait_for(lambda: all(psutil.Process(p).status() == psutil.STATUS_SLEEPING for p in pids),
                 what="workers waiting for a task")
        assert {pid for pid, _ in marked(marks, end=True)} == set(pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_gone(pids, 5) < 5


def segments(pid: int | str) -> dict[tuple[int, int], tuple[str, int, int]]:
    """The unnamed segments process ``pid`` holds open: {(device, inode): (link, size, bytes
    allocated)}: memfds and O_TMPFILEs, which /proc shows as "... (deleted)"."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target, st = os.readlink(path), os.stat(path)
        except OSError:
            continue
        if target.endswith(" (deleted)") and (target.startswith("/memfd:") or "/#" in target):
            out[st.st_dev, st.st_ino] = (target, st.st_size, st.st_blocks * 512)
    return out


def holders(dev: int, ino: int) -> list[str]:
    """Every process (of those this user may read) that holds the file (dev, ino) open or mapped."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (dev, ino):
                    found.append(f"pid {pid} fd {fd}")
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    if int(fields[4]) == ino and os.makedev(major, minor) == dev:
                        found.append(f"pid {pid} maps {fields[-1].strip()}")
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


@pytest.mark.parametrize("shm_dir", ["", "/dev/shm"])
def test_process_group_killed_leaves_nothing(tmp_path, shm_dir):
    """The ring has no name: once the training process and its workers are killed at once, no
    process holds or maps it and no name of it is left, so the kernel has freed it. The ring is
    found by what it is - the training process's unnamed segment of the ring's size -
    and followed by its inode, whatever else runs on the machine."""
    slots, sample_bytes = 2, 1 << 20  # 4 samples a batch: an 8 MiB ring
    ring = slots * 4 * sample_bytes
    room = psutil.virtual_memory().available
    if shm_dir:
        st = os.statvfs(shm_dir)
        room = min(room, st.f_bavail * st.f_frsize)
    if room < 4 * ring:
        pytest.skip(f"{room >> 20} MiB free: no room for a {ring >> 20} MiB ring here")
    names_before = set(os.listdir(shm_dir or "/dev/shm"))
    proc, pids, got_slots = start(tmp_path, SHM_DIR=shm_dir, MODE="iterate", SLOTS=str(slots),
                                  SAMPLE_LEN=str(sample_bytes // 8))
    try:
        assert got_slots == slots
        rings = {k: v for k, v in segments(proc.pid).items() if v[1] >= ring}
        assert len(rings) == 1, segments(proc.pid)
        (dev, ino), (target, _, _) = next(iter(rings.items()))
        if shm_dir:
            assert target.startswith(f"{shm_dir}/#"), target  # an O_TMPFILE there
        else:
            assert target.startswith("/memfd:shmloader"), target
        wait_for(lambda: all(any(h.startswith(f"pid {p} maps") for h in holders(dev, ino)) for p in pids),
                 what="ring mapped by both workers")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_gone(pids, 5)
    assert holders(dev, ino) == []
    # No name was ever made for it: no entry in the folder has its inode.
    for name in set(os.listdir(shm_dir or "/dev/shm")) - names_before:
        try:
            assert os.stat(os.path.join(shm_dir or "/dev/shm", name)).st_ino != ino, name
        except FileNotFoundError:
            pass


# cgroup v1's freezer: a frozen process stays, SIGKILL pending, until its group is thawed, as a
# process in uninterruptible sleep (a read from a hung NFS mount) stays until the read returns.
_FREEZER = "/sys/fs/cgroup/freezer"


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_close_does_not_wait_for_a_killed_worker_that_cannot_end(fork_server, tmp_path, caplog, monkeypatch):
    """A worker that SIGKILL cannot end at once: close() kills it after the grace period and
    returns within the reap's bound, saying so, not when the kernel lets the process go; once it
    ends, no zombie is left: the fork server reaps the workers it forked, and a worker started by
    fork+exec is reaped by the next close."""
    from shmloader.engine import pool
    from shmloader.engine.pool import _GRACE_S, REAP_S

    monkeypatch.setenv("SHMLOADER_FORK_SERVER", fork_server)
    if os.geteuid() != 0 or not os.path.isdir(_FREEZER):
        pytest.skip("needs root and the cgroup v1 freezer to make a process that SIGKILL cannot end at once")
    group = os.path.join(_FREEZER, f"shmloader-test-{os.getpid()}")
    os.mkdir(group)

    def freeze(state: str) -> None:
        with open(os.path.join(group, "freezer.state"), "w") as f:
            f.write(state)

    closed, closer = threading.Event(), None
    loader = small_loader()
    try:
        next(iter(loader))
        (pid,) = loader.worker_pids()
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        freeze("FROZEN")
        deadline = time.monotonic() + 10
        while open(os.path.join(group, "freezer.state")).read().strip() != "FROZEN":
            assert time.monotonic() < deadline, "the worker did not freeze"
            time.sleep(0.01)
        closer = threading.Thread(target=lambda: (loader.close(), closed.set()))
        t0 = time.monotonic()
        closer.start()
        assert closed.wait(_GRACE_S + REAP_S + 10), "close() waits for a process that SIGKILL cannot end"
        elapsed = time.monotonic() - t0
        assert psutil.Process(pid).status() == psutil.STATUS_DISK_SLEEP  # killed, not gone
        assert elapsed >= _GRACE_S + REAP_S * 0.9  # it did give the process the bound to end
        assert f"pid {pid}) did not end within {REAP_S:g} s of SIGKILL" in caplog.text
    finally:
        freeze("THAWED")
        if closer is not None:
            closer.join(30)
        loader.close()
        deadline = time.monotonic() + 10
        while os.path.exists(os.path.join(group, "tasks")) and open(os.path.join(group, "tasks")).read().strip():
            assert time.monotonic() < deadline, "the worker did not end once thawed"
            time.sleep(0.01)
        os.rmdir(group)
    if fork_server == "1":
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid):  # the server reaps it as it ends
            assert time.monotonic() < deadline, "the fork server left its worker a zombie"
            time.sleep(0.01)
    else:
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ended, not reaped yet
    assert [p.pid for p in pool._abandoned] == [pid]
    with small_loader() as other:
        next(iter(other))
    assert not psutil.pid_exists(pid)  # reaped by the next close
    assert pool._abandoned == []  # and no longer waited for


def open_in(folder: str) -> list[str]:
    """What this process's descriptors point to inside ``folder`` (an O_TMPFILE shows as "#inode (deleted)")."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + "/"):
            out.append(target)
    return out


# The loader's warning that the consumer holds most of a small ring (then copies) is what this
# test's tiny ring makes happen; the test checks the batches, the warning is expected here.
@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
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
        # Nothing named there, and no descriptor of the unnamed (O_TMPFILE) segment left open.
        assert os.listdir(mnt) == [] and open_in(str(mnt)) == []
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
    # The segment that could not be reserved has no name: only a descriptor could keep it.
    targets = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}")]
    print("left open:", [t for t in targets if t.startswith("/memfd:shmloader") or (shm_dir and t.startswith(shm_dir + "/"))])
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
    assert lines[1] == "left open: []"  # no descriptor of the segment after the failure
    if where == "fixture":
        assert os.listdir(shm_dir) == []  # nor anything with a name
    assert lines[2] == "delivered: 8"  # what fits works


@pytest.mark.parametrize("slots, needs", [(4, "1.00"), (None, "0.50")])
def test_ring_larger_than_memory_fails_before_allocating(monkeypatch, slots, needs):
    """The memory figure the loader reads is pinned at 400 MiB, so batches of 256 MiB cannot fit
    on any machine: 4 slots, or the 2 that slots=None falls back to, are refused up front."""
    monkeypatch.setattr(shmloader.engine.ring, "_available_memory", lambda: 400 << 20)
    spec = {"x": ((64 << 20,), np.uint8)}
    src = shmloader.FunctionSource(lambda i, rng: None, spec, 4, check=False)
    with pytest.raises(shmloader.LoaderError) as info:
        shmloader.Loader(src, batch_size=4, workers=1, slots=slots)
    assert str(info.value) == (f"the ring needs {needs} GiB but only 0.39 GiB of memory is available: "
                               "use fewer slots or a smaller batch or clip")


# The loader's warning that the consumer holds most of a small ring (then copies) is what this
# test's tiny ring makes happen; the test checks the batches, the warning is expected here.
@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
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
