"""Two classic experiments on simulated work, run through shmloader's FunctionSource.

* Producers: each item costs a producer ``producer_s`` of sleep and the consumer ``consumer_s``
  (5:1). Throughput should be ``min(W / producer_s, 1 / consumer_s)``: linear in W until the
  consumer bounds it at ``W = producer_s / consumer_s``; sleeping costs no CPU.
* T_iter: a training step of ``T_gpu`` (sleep in the consumer) fed by items costing ``T_cpu``
  in a worker (busy CPU work, or sleep). A pipelined loader gives
  ``T_iter = max(T_cpu / W, T_gpu)``; loading in the training loop gives ``T_cpu + T_gpu``.
  Busy work only makes sense for W up to the number of cores.

Both consume ``Loader.as_dataset()`` in Python, as the loader benchmarks do. Rates come from
item arrival times at the consumer, not from counting items in a window, so a run of a few
items still measures the period exactly. W workers that start together deliver in bursts of
up to W items, so the number of intervals measured is a multiple of W: whole cycles only.
"""

from __future__ import annotations

import time
import numpy as np

from measure import Sampler, cpu_shares

_SPEC = {"x": ((1,), np.float32)}


def _sleep_item(seconds: float):
    def fn(index: int, rng) -> dict:
        time.sleep(seconds)
        return {"x": np.zeros(1, np.float32)}

    return fn


def _busy_item(seconds: float):
    """``seconds`` of CPU time (not wall time): preemption by other load makes it longer."""

    def fn(index: int, rng) -> dict:
        end = time.process_time() + seconds
        acc = 0
        while time.process_time() < end:
            for i in range(200):
                acc += i
        return {"x": np.full(1, acc % 7, np.float32)}

    return fn


def _row(experiment: str, config: str, workers: int, rep: int, expected_s: float, serial_s: float,
         **extra) -> dict:
    """A run's row: ``period_s`` is the mean time between items at the consumer (T_iter)."""
    return {"experiment": experiment, "config": config, "workers": workers, "rep": rep,
            "expected_period_s": expected_s, "serial_period_s": serial_s, "extra": extra}


def _rates(res: dict, stamps: list[float], a, b) -> dict:
    """Items, period and rate from the arrival times; CPU shares over the window a..b."""
    res["items"] = len(stamps) - 1  # intervals
    res["period_s"] = (stamps[-1] - stamps[0]) / res["items"]
    res["items_per_s"] = 1 / res["period_s"]
    res["main_cpu_pct"], res["workers_cpu_pct"], res["other_cpu_pct"] = cpu_shares(a, b)
    return res


def _consume(fn, workers: int, consumer_s: float, items: int, warmup: int, res: dict) -> dict:
    import shmloader

    items = -(-items // workers) * workers + 1  # stamps: a whole number of W-item cycles

    # Endless epochs of a short plan (a plan materialises its epoch's order).
    source = shmloader.FunctionSource(fn, _SPEC, length=1024, check=False)
    with Sampler(children=True) as sampler:
        t0 = time.perf_counter()
        loader = shmloader.Loader(source, batch_size=1, workers=workers, epochs=None)
        sampler.pids = loader.worker_pids
        it = iter(loader.as_dataset())
        try:
            stamps = []
            for i in range(warmup + items):
                next(it)
                now = time.perf_counter()
                if i == 0:
                    res["first_item_s"] = now - t0
                if i == warmup:
                    a = sampler.window_start()
                if i >= warmup:
                    stamps.append(now)
                time.sleep(consumer_s)  # the training step
            b = sampler.window_end()
        finally:
            it = None  # NOTE [ Closing a from_generator pipeline ] in loaders
            loader.close()
    return _rates(res, stamps, a, b)


def producers(workers: int, producer_s: float, consumer_s: float, items: int, rep: int) -> dict:
    res = _row("producers", f"sleep {producer_s:g} s / item, consumer {consumer_s:g} s", workers, rep,
               max(producer_s / workers, consumer_s), producer_s + consumer_s)
    # Warm up long enough for every worker to have delivered once: the pipeline is full.
    return _consume(_sleep_item(producer_s), workers, consumer_s, items, warmup=workers + 1, res=res)


def t_iter(kind: str, workers: int, t_cpu: float, t_gpu: float, items: int, rep: int) -> dict:
    fn = _busy_item(t_cpu) if kind == "busy" else _sleep_item(t_cpu)
    res = _row("t_iter", f"{kind} T_cpu={t_cpu:g} s, T_gpu={t_gpu:g} s", workers, rep,
               max(t_cpu / workers, t_gpu), t_cpu + t_gpu, kind=kind, t_cpu=t_cpu, t_gpu=t_gpu)
    return _consume(fn, workers, t_gpu, items, warmup=workers + 1, res=res)


def serial(kind: str, t_cpu: float, t_gpu: float, items: int, rep: int) -> dict:
    """The contrast: the item made in the training loop itself, then the step."""
    fn = _busy_item(t_cpu) if kind == "busy" else _sleep_item(t_cpu)
    res = _row("t_iter", f"{kind} T_cpu={t_cpu:g} s, T_gpu={t_gpu:g} s", 0, rep, t_cpu + t_gpu, t_cpu + t_gpu,
               kind=kind, t_cpu=t_cpu, t_gpu=t_gpu, serial=True)
    rng = np.random.default_rng(0)
    with Sampler() as sampler:  # no worker processes: workers CPU is 0
        stamps = []
        fn(0, rng)
        a = sampler.window_start()
        for i in range(items + 1):
            fn(i, rng)
            stamps.append(time.perf_counter())
            time.sleep(t_gpu)
        b = sampler.window_end()
    return _rates(res, stamps, a, b)
