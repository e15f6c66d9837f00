"""``shmloader.calibrate``: how much of a model's step rate this node's CPUs can feed.

Three measurements, each a few seconds, none of them a training run:
  1. the ceiling: ``step(batch)`` on one synthetic batch of the clips' shape (zeros, already on
     ``device``), as often as fits: the samples/s the model takes when input costs nothing;
  2. the loader alone, with a consumer that takes nothing: the samples/s ``workers`` decode
     one clip per sample (the clips as given) and grouped (``clips_per_video=K,
     group_clips=True``, K = 4 and 8), and the rate of one busy worker (``Loader.stats``);
  3. the prediction: loader and step overlap (the workers fill the ring while the step runs), so
     a run delivers ``min(decode rate, ceiling)``; the fed fraction is that over the ceiling,
     the workers needed are the ceiling over one worker's rate.
The training process's own share of a core (handing out batches, the step's Python) is not
counted: on a node where it matters, keep a core for it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ._loader import Loader

__all__ = ["calibrate"]

# Share of ``seconds`` each of the four measurements gets (ceiling, one clip, K = 4, K = 8).
_PHASES = 4
# Steps run before the ceiling's clock starts: the first calls compile, allocate, autotune.
_WARMUP_STEPS = 3
# Loader start-up left out of its rate: the batches delivered before the clock starts, per worker.
_WARMUP_BATCHES_PER_WORKER = 2
_GROUPINGS = (4, 8)


def calibrate(clips: Any, step: Callable[[Any], Any], *, batch_size: int, workers: int | None = None,
              device: Any = None, seconds: float = 20.0, verbose: bool = True) -> dict[str, Any]:
    """Measure ``step``'s ceiling and what the loader feeds it, one clip per sample and grouped.

    ``step(batch)`` is one training step on a batch as the loader delivers it: a dict of numpy
    arrays, or, with ``device`` (e.g. ``"cuda"``), of ``torch.Tensor`` on that device
    (``loader.as_torch(device=device)``; torch is imported only then). Runs the step on a
    synthetic batch of the clips' shape (the model's ceiling, samples/s), then a ``Loader``
    over ``clips`` alone for a few seconds each: as given, and with ``clips_per_video=K,
    group_clips=True`` for K = 4 and 8. Prints a table (``verbose``) and returns::

        {"ceiling": samples/s,
         "one_clip" | "grouped_4" | "grouped_8": {"samples_per_s", "fed_fraction",
                                                  "samples_per_worker_s", "workers_needed",
                                                  "more_cores", "decoded_per_frame"},
         "workers": workers used, "cpus": CPUs this process may use}

    ``fed_fraction``: the share of the ceiling a run with those settings gets, ``min(1, decode
    rate / ceiling)``; ``workers_needed``: workers to reach the ceiling at one worker's rate;
    ``more_cores``: how many more than this node's CPUs that takes (0 where they suffice);
    ``decoded_per_frame``: frames the workers decoded per delivered frame (``Loader.stats``).
    A grouped row is None for a source without ``with_options`` (not ``VideoClips``).

    :param clips: a ``VideoClips`` (or any loader source, then without the grouped rows).
    :param step: the training step, any callable taking a batch.
    :param batch_size: samples per batch.
    :param workers: worker processes; None: one per CPU this process may use.
    :param device: a torch device to put batches on; None: numpy batches.
    :param seconds: the whole measurement's length, start-ups aside.
    :param verbose: print the table.
    """
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    cpus = len(os.sched_getaffinity(0)) or 1
    nworkers = workers or cpus
    phase = float(seconds) / _PHASES
    result: dict[str, Any] = {"ceiling": _ceiling(clips, step, batch_size, device, phase),
                              "workers": nworkers, "cpus": cpus}
    settings: list[tuple[str, Any]] = [("one_clip", clips)]
    with_options = getattr(clips, "with_options", None)
    for k in _GROUPINGS:
        settings.append((f"grouped_{k}", None if with_options is None else
                         with_options(clips_per_video=k, group_clips=True)))
    for name, source in settings:
        if source is None:
            result[name] = None
            continue
        rate, stats = loader_rate(source, batch_size, nworkers, phase)
        result[name] = _row(rate, stats, result["ceiling"], cpus)
    if verbose:
        print(calibration_table(result))
    return result


def _synthetic(clips: Any, batch_size: int, device: Any) -> Any:
    batch = {k: np.zeros((batch_size, *shape), dtype) for k, (shape, dtype) in clips.spec().items()}
    if device is None:
        return batch
    import torch

    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


def _sync(device: Any) -> None:
    """Wait for the device's queued work: a CUDA step returns before it has run."""
    if device is None:
        return
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _ceiling(clips: Any, step: Callable[[Any], Any], batch_size: int, device: Any, seconds: float) -> float:
    batch = _synthetic(clips, batch_size, device)
    for _ in range(_WARMUP_STEPS):
        step(batch)
    _sync(device)
    steps, t0 = 0, time.perf_counter()
    while True:
        step(batch)
        steps += 1
        if steps % 4 == 0 or time.perf_counter() - t0 >= seconds:
            _sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return steps * batch_size / elapsed


def loader_rate(source: Any, batch_size: int, workers: int, seconds: float,
                step: Callable[[Any], Any] | None = None, device: Any = None) -> tuple[float, dict[str, Any]]:
    """Samples/s a shuffled, endless ``Loader`` over ``source`` delivers for ``seconds`` once
    started (its first batches left out), with ``step`` run on each batch (None: a consumer that
    takes nothing), and the loader's ``stats()`` at the end."""
    warm = _WARMUP_BATCHES_PER_WORKER * workers
    with Loader(source, batch_size=batch_size, workers=workers, shuffle=True, epochs=None) as loader:
        batches: Iterable[dict[str, Any]] = loader if device is None else loader.as_torch(device=device)
        n, t0 = 0, 0.0
        for i, batch in enumerate(batches):
            if step is not None:
                step(batch)
            if i == warm:
                _sync(device)
                t0 = time.perf_counter()
            elif i > warm:
                n += len(next(iter(batch.values())))
                if time.perf_counter() - t0 >= seconds:
                    _sync(device)
                    break
            del batch
        elapsed = time.perf_counter() - t0
        stats = loader.stats()
    return n / elapsed, stats


def _row(rate: float, stats: dict[str, Any], ceiling: float, cpus: int) -> dict[str, Any]:
    per_worker = float(stats["samples_per_worker_s"])
    needed = max(1, math.ceil(ceiling / per_worker)) if per_worker > 0 else None
    return {"samples_per_s": rate, "fed_fraction": min(1.0, rate / ceiling) if ceiling > 0 else 0.0,
            "samples_per_worker_s": per_worker, "workers_needed": needed,
            "more_cores": None if needed is None else max(0, needed - cpus),
            "decoded_per_frame": stats.get("decoded_per_frame")}


def calibration_table(result: dict[str, Any]) -> str:
    """``calibrate``'s result as the table it prints."""
    names = {"one_clip": "loader, one clip per sample", "grouped_4": "loader, clips_per_video=4, group_clips=True",
             "grouped_8": "loader, clips_per_video=8, group_clips=True"}
    rows = [("input", "samples/s", "fed", "workers needed", "cores short"),
            ("synthetic (the model's ceiling)", f"{result['ceiling']:.1f}", "1.00", "-", "-")]
    for key, label in names.items():
        r = result.get(key)
        if r is not None:
            short = r["more_cores"]
            rows.append((label, f"{r['samples_per_s']:.1f}", f"{r['fed_fraction']:.2f}", str(r["workers_needed"]),
                         "-" if short is None else (f"+{short}" if short else "0")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines) + f"\n({result['workers']} workers on {result['cpus']} CPUs)"
