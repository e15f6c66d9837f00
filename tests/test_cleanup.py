"""Nothing of ours survives: after close(), an early break, garbage collection, or the last batch."""

from __future__ import annotations

import gc
import os

import numpy as np
import psutil

import shmloader

from .conftest import our_fds, our_mappings


def ident(index, rng):
    return {"x": np.full((16,), index, np.int32)}


def make(**kw):
    return shmloader.Loader(shmloader.FunctionSource(ident, {"x": ((16,), np.int32)}, 40), batch_size=4,
                            workers=2, **kw)


def gone(pids) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_close_is_idempotent_and_frees_everything():
    loader = make()
    pids = loader.worker_pids()
    assert len(pids) == 2 and our_fds()
    next(iter(loader))
    loader.close()
    loader.close()
    assert gone(pids) and loader.worker_pids() == []
    gc.collect()
    assert our_fds() == [] and our_mappings() == []
    assert list(loader) == []  # a closed loader yields nothing more


def test_early_break_inside_with():
    with make(epochs=None) as loader:
        pids = loader.worker_pids()
        for i, _ in enumerate(loader):
            if i == 3:
                break
    assert gone(pids)


def test_garbage_collection_closes():
    loader = make(epochs=None)
    pids = loader.worker_pids()
    for i, b in enumerate(loader):
        if i == 2:
            break
    del loader, b
    gc.collect()
    assert gone(pids)
    assert our_fds() == [] and our_mappings() == []


def test_finished_pass_keeps_workers_for_the_next_until_close():
    loader = make()
    pids = loader.worker_pids()
    assert sum(len(b["x"]) for b in loader) == 40
    assert loader.worker_pids() == pids  # idle, ready for another pass
    assert sorted(int(x[0]) for b in loader for x in b["x"]) == list(range(40))  # the next pass...
    assert loader.worker_pids() == pids and loader.stats()["worker_restarts"] == 0  # ...by the same workers
    loader.close()
    assert gone(pids)


def test_repeated_loaders_leak_no_descriptors():
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        with make(epochs=None) as loader:
            next(iter(loader))
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before
