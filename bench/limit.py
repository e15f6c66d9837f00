"""The physical limit: ``decode_clip`` alone in W processes, no loader and no consumer.

Each process decodes its own shard of the sample stream (and runs the workload's transform,
which is part of the work) from a common start signal for ``duration`` seconds, then reports
how many clips it finished and in how long. The sum of their rates is the most clips per
second that W processes of this machine can produce; a loader can at best deliver that.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from measure import Result, Sampler, window_result
from workloads import ClipSet, Workload, decode_clip, sample_keys

# A process that does not report back within this much of the planned duration has hung.
_SLACK_S = 60.0


def clip_steps(clips: ClipSet, wl: Workload, shard: int, shards: int):
    """One step decodes the next clip of this process's shard of the sample stream."""
    keys = sample_keys(len(clips), shard, shards)
    return lambda: decode_clip(clips, wl, *next(keys))


def _decode_for(steps, args: tuple, shard: int, pin: bool, ready, go, duration: float, out) -> None:
    """Steps of ``steps(*args)`` for ``duration`` s from the common start; report (shard, steps, s)."""
    if pin:  # before decord starts any thread: they all inherit this core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[shard % len(cores)]})
    step = steps(*args)
    step()  # imports and first open outside the timed part
    ready.put(shard)
    go.wait()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < duration:
        step()
        n += 1
    out.put((shard, n, time.perf_counter() - t0))


def run_timed(steps, args_of, workers: int, duration: float, res: Result, units_to_clips: int,
              clip_len: int, clip_bytes: int, pin: bool = False) -> Result:
    """Run ``steps(*args_of(i))`` (a module-level function that returns the step of process i)
    in W spawned processes, release them together once all are ready, and fill ``res`` from
    their reports ``(shard, steps, seconds)``.

    spawn, not the forkserver that torch's workers share: that one preloads torch, which would
    inflate these processes' memory for nothing. Each step is ``units_to_clips`` clips.
    """
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    with Sampler(children=True) as sampler:
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_decode_for, daemon=True,
                             args=(steps, args_of(i), i, pin, ready, go, duration, out))
                 for i in range(workers)]
        for p in procs:
            p.start()
        try:
            for _ in procs:
                ready.get(timeout=_SLACK_S)
            res.first_batch_s = time.perf_counter() - t0  # start-up: imports and first clip
            a = sampler.window_start()
            go.set()
            reports = [out.get(timeout=duration + _SLACK_S) for _ in procs]
            b = sampler.window_end()
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
            for q in (ready, out):
                q.close()
                q.join_thread()
    units = sum(n for _, n, _ in reports)
    window_result(res, a, b, units * units_to_clips, clip_len, clip_bytes, sampler)
    # Rates from each process's own clock: the window above also holds the wait for the last report.
    rate = units_to_clips * sum(n / dt for _, n, dt in reports)
    res.clips_per_s, res.frames_per_s = rate, rate * clip_len
    res.gb_per_s = rate * clip_bytes / 1e9
    return res


def physical_limit(clips: ClipSet, wl: Workload, workers: int, duration: float, res: Result,
                   pin: bool = False) -> Result:
    return run_timed(clip_steps, lambda i: (clips, wl, i, workers), workers, duration, res, 1,
                     wl.clip_len, wl.clip_bytes, pin)
