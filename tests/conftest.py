"""Shared fixtures: real videos written with PyAV, and a leak check after every test."""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import signal
import time

import psutil
import pytest

from shmloader.video.samples import make_videos

# The suite runs decord, TensorFlow and torch in one process; where PyTorch's CUDA build is
# installed (the newest lane), two orders crash it:
# - TensorFlow (2.21) imported before triton: a segfault when triton is imported (tensorflow#124205),
#   and torch.optim imports triton. Triton comes first.
# - a plain `import decord` (decord2 3.4) loads every library of site-packages/nvidia with
#   RTLD_GLOBAL, after which torch's CPU convolutions and matmuls segfault. The tests that import
#   decord get the module shmloader's workers use, imported without them (video/decord.py).
if importlib.util.find_spec("triton") is not None:
    import triton  # noqa: F401

from shmloader.video.decord import import_decord  # noqa: E402

import_decord()

# The tests' sources and transforms reach the workers by value, as a notebook's or a script's do
# (cloudpickle): by reference, every worker would import the test module, and with it pytest and
# this file (decord, triton), a quarter of a second of each worker's start-up. shmloader's own
# classes still go by reference.
import cloudpickle  # noqa: E402

if __package__:  # tests/ as a package (a copy of this file elsewhere, test_leak_check's, is none)
    cloudpickle.register_pickle_by_value(importlib.import_module(__package__))

# A shell's background job (`make test &`, nohup) starts with Ctrl-C ignored, and an ignored signal
# stays ignored in every process started from it: the tests' training scripts would not see the
# Ctrl-C they are sent. Each test process takes Python's own handler back, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config):
    """``make test``'s ``-n auto``: a test process per usable CPU, at most 4. Each test runs worker
    processes of its own (two, mostly), so more test processes than CPUs only queue (one more on 2
    CPUs: 18 min 9 s against 18 min 39 s, and tests that wait on a deadline failed under the load);
    past 4 the modules that start a cluster or a notebook kernel dominate and memory grows with
    each process."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


# The modules that take longest, longest first (pytest --durations on make test's run). In a
# parallel run each test process takes the next module when it ends one, so these go first:
# one of them taken last would run alone at the end while the other processes sit idle.
_LONGEST = ("test_docs", "test_scan", "test_prepare", "test_ray_prepare", "test_shapes", "test_ray", "test_bench",
            "test_trainers", "test_realworld", "test_notebooks", "test_typing", "test_remote", "test_runner",
            "test_shutdown", "test_faults", "test_keras", "test_cli", "test_torch", "test_qwen_omni", "test_skipping",
            "test_leak_check", "test_calibrate", "test_time_spans", "test_wheel")


def pytest_collection_modifyitems(config, items):
    if "PYTEST_XDIST_WORKER" not in os.environ:  # a run in one process keeps the files' order
        return
    rank = {name: i for i, name in enumerate(_LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module's own order kept


FRAMES = 40  # per test video
SIZE = (96, 128)  # native height, width of the test videos


@pytest.fixture(scope="session")
def videos(tmp_path_factory):
    """Six H.264 and two MPEG-4 videos; video i encodes id i, labels i % 3."""
    folder = tmp_path_factory.mktemp("videos")
    h264, _ = make_videos(folder, count=6, frames=FRAMES, size=SIZE, codec="libx264")
    mpeg4, _ = make_videos(folder / "mpeg4", count=8, frames=FRAMES, size=SIZE, codec="mpeg4")
    paths = h264 + mpeg4[6:]  # ids 0..7, two codecs
    return paths, [i % 3 for i in range(len(paths))]


def state_after(source, batches: int, **kw) -> tuple[list[dict], dict]:
    """The first ``batches`` batches (copied out of the ring) of ``Loader(source, **kw)`` and
    ``state()`` after them, the loader closed: what a resume test starts from."""
    import numpy as np

    import shmloader

    with shmloader.Loader(source, **kw) as loader:
        it = iter(loader)
        taken = [{k: np.array(v) for k, v in next(it).items()} for _ in range(batches)]
        return taken, loader.state()


# shmloader names nothing in /dev/shm (its segments are memfds and O_TMPFILEs). A name of ours could
# only come from Python's shared_memory (psm_*) or carry our name; anything else there belongs to
# other programs on a shared machine (torch_*, multiprocessing's sem.mp-*) and comes and goes.
_OUR_SHM_NAMES = ("psm_", "shmloader")


def shm_entries() -> set[str]:
    """Entries in /dev/shm that shmloader could have made, but for those another test process of
    this run (``make test`` runs several) makes on purpose: test_leak_check's, named after its pid."""
    others = _sibling_pids()
    return {e for e in os.listdir("/dev/shm")
            if e.startswith(_OUR_SHM_NAMES) and not (e.rpartition("_")[2].isdigit() and int(e.rpartition("_")[2]) in others)}


def _sibling_pids() -> set[int]:
    """The other test processes of a parallel run (pytest-xdist's workers: this one's siblings)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return set()
    try:
        return {c.pid for c in psutil.Process().parent().children()} - {os.getpid()}
    except (psutil.Error, AttributeError):
        return set()


# What our segments are, whatever folder the project or its virtual environment lives in: the
# ring, config and array segments are memfds named "shmloader...", and a ring in a shm_dir is an
# O_TMPFILE inode there, which the kernel shows as "<shm_dir>/#<inode> (deleted)". A path that
# merely contains "shmloader" (a clone named shmloader/, fonts under its .venv) is not a segment,
# nor is an O_TMPFILE elsewhere (pytest's own capture files are O_TMPFILEs in /tmp).
_MEMFD = re.compile(r"^/memfd:shmloader.* \(deleted\)$")
_TMPFILE = re.compile(r"^(?P<dir>/.*)/#\d+ \(deleted\)$")
# Directories the tests pass as shm_dir; the `shm_dir` fixture adds its own.
SHM_DIRS = {"/dev/shm"}


def is_our_segment(target: str) -> bool:
    m = _TMPFILE.match(target)
    return bool(_MEMFD.match(target) or (m and m["dir"] in SHM_DIRS))


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory to pass as ``shm_dir``; O_TMPFILEs in it count as our segments."""
    d = os.path.realpath(tmp_path / "shm")
    os.mkdir(d)
    SHM_DIRS.add(d)
    yield d
    SHM_DIRS.discard(d)


def our_fds(pid: int | str = "self") -> list[str]:
    """Descriptors of shmloader's shared segments that process ``pid`` holds."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if is_our_segment(target):
            out.append(target)
    return out


def our_mappings() -> list[str]:
    """Lines of /proc/self/maps that map one of our segments."""
    with open("/proc/self/maps") as f:
        return [line for line in f if is_our_segment(line.split(maxsplit=5)[-1].strip())]


def live_children() -> list[psutil.Process]:
    """Live processes below this one, but for the fork server (engine.forkserver), which stays
    for the process's life by design; the workers it forked are counted."""
    from shmloader.engine.forkserver import server_pid

    server = server_pid()
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid != server and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def leaks(before_shm: set[str], before_kids: set[int], wait_s: float = 5.0) -> list[str]:
    """What a test left behind: worker processes, /dev/shm entries, descriptors of our segments."""
    gc.collect()
    deadline = time.monotonic() + wait_s
    while True:
        kids = [p for p in live_children() if p.pid not in before_kids]
        if not kids or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    found = []
    if kids:
        found.append(f"processes left behind: {[(p.pid, p.cmdline()) for p in kids]}")
    if shm_entries() - before_shm:
        found.append(f"entries left in /dev/shm: {sorted(shm_entries() - before_shm)}")
    if our_fds():
        found.append(f"shmloader descriptors left open: {our_fds()}")
    return found


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no worker process, no /dev/shm entry and no descriptor of ours, and
    the test process scheduled as before (a library that leaves it real-time, as SVT-AV1 does
    when run as root, makes every worker started after it real-time too)."""
    before_shm = shm_entries()
    before_kids = {p.pid for p in live_children()}
    yield
    found = leaks(before_shm, before_kids)
    if scheduling() != _SCHEDULING:  # compared with the start: a module fixture may have changed it
        found.append(f"the test process's scheduling was {_SCHEDULING}, is {scheduling()}")
    assert not found, "; ".join(found)


def scheduling() -> tuple[int, int]:
    """This thread's scheduling policy and priority."""
    return os.sched_getscheduler(0), os.sched_getparam(0).sched_priority


_SCHEDULING = scheduling()


@pytest.fixture(scope="session")
def timed_videos(tmp_path_factory):
    """Frame-code videos of other lengths and frame rates, for sampling by time: 60 frames at
    25 fps, 37 at 50 fps, 13 at 10 fps, and 60 at a variable rate (40, 20, 80 and 33 ms
    frames), as ``[(path, video id)]``."""
    from shmloader.video.samples import write_video

    from ._variants import variable_rate

    d = tmp_path_factory.mktemp("timed")
    return [(write_video(d / "fps25.mp4", 50, frames=60, fps=25, gop=12), 50),
            (write_video(d / "fps50.mp4", 51, frames=37, fps=50, gop=12), 51),
            (write_video(d / "fps10.mp4", 52, frames=13, fps=10, gop=12), 52),
            (variable_rate(str(d / "vfr.mp4"), 53, [40] * 20 + [20] * 20 + [80] * 10 + [33] * 10), 53)]
