"""What ``Loader.stats()`` derives from the engine's counters: rates, shares of time and the
diagnosis (input-bound or not, workers needed, frames decoded per delivered frame).

NOTE [ Start-up is not work ]
A worker's interpreter start and its imports (decord and PyAV take ~0.4 s) are start-up, not
decoding: a worker's busy share counts from its READY message, and the source loads its decoders
before it sends READY (``worker_init``), so the first task's busy time is decoding alone. The
consumer's share likewise counts from the first batch (``first_batch_s`` reports the start-up).
Counted from the process start instead, a short run reads "input-bound" with workers "30 % busy"
while they never idled: the README's quickstart did (issue 36). The delivered rate
(``samples_per_s``) counts from the first batch too, the first batch's samples apart, so that it
and the shares speak of the same time. ``close()`` stops the clock: the figures after it are those
of the run, not of the time since, nor of a pool already emptied.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .pool import Worker

__all__ = ["JUDGE_BATCHES", "Clock", "cpu_seconds"]

# A run of this many batches or fewer is too short to judge (``judged``): it is mostly the ring
# filling (its first waits, its workers' first tasks), whatever the training does next.
JUDGE_BATCHES = 8


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
    until then: the start-up is reported apart (``first_batch_s``), not against the pipeline.
    ``stop()`` (the loader's close) freezes the figures at that instant."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.t_first: float | None = None
        self.first_wait_s: float | None = None
        self.first_samples = 0
        self.t_stop: float | None = None
        self.final: list[tuple[float, float, bool]] = []  # the workers' (busy_s, ready_at, ready) at stop

    def handed_out(self, samples: int) -> None:
        """A batch of ``samples`` goes out."""
        if self.t_first is None:
            self.t_first = time.monotonic()
            self.first_samples = samples

    def waited(self, total_wait_s: float) -> None:
        if self.first_wait_s is None and self.t_first is not None:
            self.first_wait_s = total_wait_s

    def stop(self, workers: list[Worker]) -> None:
        if self.t_stop is None:
            self.t_stop = time.monotonic()
            self.final = [(w.busy_s, w.ready_at, w.ready) for w in workers]

    def report(self, counters: dict, workers: list[Worker], cpus: int, slots: int, leased: int) -> dict[str, Any]:
        stopped = self.t_stop is not None
        now = self.t_stop if self.t_stop is not None else time.monotonic()
        pool = self.final if stopped else [(w.busy_s, w.ready_at, w.ready) for w in workers]
        s = dict(counters)
        s["elapsed_s"] = now - self.t0
        s["workers"], s["slots"], s["leased"] = len(pool), slots, leased
        s["first_batch_s"] = None if self.t_first is None else self.t_first - self.t0
        window = now - self.t_first if self.t_first is not None else 0.0
        # NOTE [ Start-up is not work ]
        s["samples_per_s"] = (s["samples"] - self.first_samples) / window if window > 0 else 0.0
        s["judged"] = s["batches"] > JUDGE_BATCHES
        steady_wait = s["consumer_wait_s"] - (self.first_wait_s or 0.0)
        s["consumer_wait_fraction"] = min(1.0, max(0.0, steady_wait / window)) if window > 0 else 0.0
        s["worker_busy_fraction"] = [min(1.0, busy / max(now - ready_at, 1e-9)) if ready else 0.0
                                     for busy, ready_at, ready in pool]
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
