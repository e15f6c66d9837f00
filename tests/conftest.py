"""Shared fixtures: real videos written with PyAV, and a leak check after every test."""

from __future__ import annotations

import gc
import os
import time

import psutil
import pytest

from shmloader._samples import make_videos

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


def shm_entries() -> set[str]:
    # shmloader uses no multiprocessing, so multiprocessing's semaphores (sem.mp-*) in /dev/shm
    # belong to other programs on a shared machine; everything else counts.
    return {e for e in os.listdir("/dev/shm") if not e.startswith("sem.mp-")}


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
        if "shmloader" in target:
            out.append(target)
    return out


def our_mappings() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "memfd:shmloader" in line]


def live_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no worker process, no /dev/shm entry and no descriptor of ours."""
    before_shm = shm_entries()
    before_kids = {p.pid for p in live_children()}
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = [p for p in live_children() if p.pid not in before_kids]
        if not kids:
            break
        time.sleep(0.05)
    assert not kids, f"processes left behind: {[(p.pid, p.cmdline()) for p in kids]}"
    assert shm_entries() - before_shm == set(), "entries left in /dev/shm"
    assert our_fds() == [], "shmloader descriptors left open"
