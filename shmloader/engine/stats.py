"""What ``Loader.stats()`` derives from the engine's counters: rates, shares of time and the
diagnosis (input-bound or not, workers needed, frames decoded per delivered frame).

NOTE [ Start-up is not work ]
A worker's interpreter start and its imports (decord and PyAV take ~0.4 s) are start-up, not
decoding: a worker's busy share counts from its READY message, and the source loads its decoders
before it sends READY (``worker_init``), so the first task's busy time is decoding alone. The
consumer's share likewise counts from the first batch (``first_batch_s`` reports the start-up).
Counted from the process start instead, a short run reads "input-bound" with workers "30 % busy"
while they never idled: the README's quickstart did (issue 36).
"""

from __future__ import annotations

import math
import time
from typing import Any

from .pool import Worker

__all__ = ["Clock", "cpu_seconds"]


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds of the processes ``pids`` (one already gone counts nothing more)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class Clock:
    """When the loader started and handed out its first batch, and what the consumer waited
    until then: the start-up is reported apart (``first_batch_s``), not against the pipeline."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.t_first: float | None = None
        self.first_wait_s: float | None = None

    def handed_out(self) -> None:
        if self.t_first is None:
            self.t_first = time.monotonic()

    def waited(self, total_wait_s: float) -> None:
        if self.first_wait_s is None and self.t_first is not None:
            self.first_wait_s = total_wait_s

    def report(self, counters: dict, workers: list[Worker], cpus: int, slots: int, leased: int) -> dict[str, Any]:
        now = time.monotonic()
        s = dict(counters)
        s["elapsed_s"] = elapsed = now - self.t0
        s["workers"], s["slots"], s["leased"] = len(workers), slots, leased
        s["samples_per_s"] = s["samples"] / elapsed if elapsed > 0 else 0.0
        s["first_batch_s"] = None if self.t_first is None else self.t_first - self.t0
        window = now - self.t_first if self.t_first is not None else 0.0
        steady_wait = s["consumer_wait_s"] - (self.first_wait_s or 0.0)
        s["consumer_wait_fraction"] = min(1.0, max(0.0, steady_wait / window)) if window > 0 else 0.0
        # NOTE [ Start-up is not work ]
        s["worker_busy_fraction"] = [min(1.0, w.busy_s / max(now - w.ready_at, 1e-9)) if w.ready else 0.0
                                     for w in workers]
        rate = s["decoded"] / s["worker_busy_s"] if s["worker_busy_s"] > 0 else 0.0
        s["samples_per_worker_s"] = rate
        s["bytes_per_sample"] = s["bytes_read"] / s["decoded"] if s["decoded"] else 0.0
        demand = s["samples"] / max(window - steady_wait, 1e-9)
        s["recommended_workers"] = max(1, min(cpus, math.ceil(demand / rate))) if rate and s["samples"] else None
        s["cpus"] = cpus
        s["input_bound"] = s["consumer_wait_fraction"] > 0.1
        delivered = s["frames_delivered"]
        s["decoded_per_frame"] = s["frames_decoded"] / delivered if delivered else None
        return s
