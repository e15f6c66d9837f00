"""The process pool of per-file work (scan's probes, prepare's copies): worker processes that
start clean and never run the caller's script, and a kill that ends a pool whose work is stuck."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import sys
import types
from typing import Any, Callable

__all__ = ["FilePool", "file_pool", "kill"]


class FilePool(cf.ProcessPoolExecutor):
    """Worker processes that never run the caller's script: a submit may start one, and
    multiprocessing's spawn and forkserver run ``__main__`` again in every child, so a script that
    calls ``scan`` or ``prepare`` at its top level (no ``if __name__ == "__main__"``) would call
    it again in each, and its imports (TensorFlow...) would be paid per worker. While a submit
    runs, ``__main__`` is a placeholder: what a worker runs is named by module."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            sys.modules["__main__"] = main


def file_pool(workers: int, initializer: Callable[[], None] | None = None) -> cf.ProcessPoolExecutor:
    # forkserver: probes run in clean processes whatever the caller has imported (TensorFlow...)
    return FilePool(workers, mp_context=multiprocessing.get_context("forkserver"), initializer=initializer)


def kill(pool: cf.ProcessPoolExecutor) -> None:
    """Ends ``pool`` now: its processes killed (a stuck probe or copy does not end by itself), its
    futures cancelled."""
    for p in list((pool._processes or {}).values()):
        p.kill()
    pool.shutdown(wait=True, cancel_futures=True)
