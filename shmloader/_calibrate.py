"""``shmloader.calibrate``: how much of a model's step rate this node's CPUs can feed.

Three measurements, each a few seconds, none of them a training run:
  1. the ceiling: ``step(batch)`` on one synthetic batch of the clips' shape (zeros, already on
     ``device``), as often as fits: the samples/s ``S`` the model takes when input costs nothing,
     and the CPU time the step itself takes per sample (its Python, its CPU kernels);
  2. the loader alone, with a consumer that takes nothing: the samples/s ``workers`` deliver one
     clip per sample (the clips as given) and grouped (``clips_per_video=K, group_clips=True``
     for each K of ``groupings``),
     the samples one worker decodes per CPU second ``r``, and the training process's CPU time
     per sample for handing out batches;
  3. the prediction (NOTE [ What calibrate predicts ]).

NOTE [ What calibrate predicts ]
Loader and step overlap: the workers fill the ring while the step runs. A run delivers ``x``
samples/s where the training loop allows it (``x <= T``: it takes each batch, ``h`` CPU seconds
per sample handing it out, then steps, so ``1 / T = 1 / S + h``), the workers can decode it (``x
<= r * W``: ``r`` is what one worker delivers, the samples it decodes per CPU second of its own,
or less where the loader alone delivered less than that times ``W``) and the cores suffice for
both: the training process takes ``c`` CPU seconds per sample (the step's own, plus ``h``), so
``x * c`` cores, and the workers ``x / r``; together at most the ``P`` CPUs this process may
use, ``x <= r * P / (1 + r * c)``. ``x`` is the least of the three; the fed fraction is ``x /
S``, at most ``T / S`` (``most_fed``). To reach ``T`` a run needs ``ceil(T / r)`` workers and
``T / r + T * c`` cores: the row's ``workers_needed`` and ``more_cores`` (``ceil`` of what is
missing), so that a row is fed ``most_fed`` exactly when its workers suffice and no core is short.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._cpus import usable_cpus
from ._diagnosis import head_per_frame, prepare_hint, prepare_pays
from ._loader import Loader
from .engine.stats import cpu_seconds

__all__ = ["Calibration", "CalibrationRow", "calibrate"]

# Steps run before the ceiling's clock starts: the first calls compile, allocate, autotune.
_WARMUP_STEPS = 3
# Loader start-up left out of its rate: the batches delivered before the clock starts, per worker.
_WARMUP_BATCHES_PER_WORKER = 2


@dataclass(frozen=True)
class CalibrationRow:
    """What the loader feeds the step with one way of cutting clips (NOTE [ What calibrate
    predicts ]). It is fed ``most_fed`` exactly when ``workers_needed <= workers`` and
    ``more_cores == 0``."""

    samples_per_s: float  #: the loader alone, measured
    predicted_per_s: float  #: what a run with the step gets
    fed_fraction: float  #: ``predicted_per_s`` over the ceiling, at most 1
    most_fed: float  #: the most any input gets, the batches' hand-off taking its time in the loop
    #: samples one worker delivers: per CPU second of its own, or the loader alone's rate over its
    #: workers where less
    samples_per_worker_s: float
    workers_needed: int | None  #: workers to reach the ceiling (None: the workers delivered nothing)
    #: CPUs beyond this node's that the workers and the step's own CPU time need for it (0: they
    #: suffice; None: the workers delivered nothing)
    more_cores: int | None
    decoded_per_frame: float | None  #: frames the workers decoded per delivered frame (``Loader.stats``)
    #: of those, the frames before each clip's first (from its keyframe) per delivered frame
    head_per_frame: float | None = None


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` measured and predicts."""

    ceiling: float  #: the step's samples/s on a synthetic batch: the model's ceiling
    step_cpu_s: float  #: CPU seconds the step takes per sample (its Python, its CPU kernels)
    workers: int  #: worker processes the loader ran
    cpus: int  #: CPUs this process may use
    one_clip: CalibrationRow  #: the clips as given
    #: ``clips_per_video=K, group_clips=True`` for each K of ``groupings``; empty for a source
    #: without ``with_options`` (not a ``VideoClips``)
    grouped: dict[int, CalibrationRow] = field(default_factory=dict)


def calibrate(clips: Any, step: Callable[[Any], Any], *, batch_size: int, workers: int | None = None,
              device: Any = None, seconds: float = 20.0, groupings: Sequence[int] = (4, 8),
              verbose: bool = True) -> Calibration:
    """Measure ``step``'s ceiling and predict what the loader feeds it, one clip per sample and
    grouped (NOTE [ What calibrate predicts ]).

    ``step(batch)`` is one training step on a batch as the loader delivers it: a dict of numpy
    arrays, or, with ``device`` (e.g. ``"cuda"``), of ``torch.Tensor`` on that device
    (``loader.as_torch(device=device)``; torch is imported only then). Runs the step on a
    synthetic batch of the clips' shape (the model's ceiling, samples/s), then a ``Loader``
    over ``clips`` alone for a few seconds each: as given, and with ``clips_per_video=K,
    group_clips=True`` for each K of ``groupings``. Prints a table (``verbose``) and returns a
    ``Calibration``: the ceiling, and a ``CalibrationRow`` for the clips as given
    (``one_clip``) and for each K (``grouped[K]``; none for a source without ``with_options``).

    :param clips: a ``VideoClips`` (or any loader source, then without the grouped rows).
    :param step: the training step, any callable taking a batch.
    :param batch_size: samples per batch.
    :param workers: worker processes; None: one per CPU this process may use.
    :param device: a torch device to put batches on; None: numpy batches.
    :param seconds: the whole measurement's length, start-ups aside, shared equally by the
        ceiling and each loader run.
    :param groupings: the clips per video K of the grouped rows.
    :param verbose: print the table.
    """
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    ks = tuple(groupings)
    if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks) or len(set(ks)) < len(ks):
        raise ValueError(f"groupings must be distinct whole numbers >= 1, got {groupings!r}")
    cpus = usable_cpus()
    nworkers = workers or cpus
    with_options = getattr(clips, "with_options", None)
    sources = {k: with_options(clips_per_video=k, group_clips=True) for k in ks} if with_options else {}
    phase = float(seconds) / (2 + len(sources))  # the ceiling, the clips as given, each grouping
    ceiling, step_cpu = measure_ceiling(clips, step, batch_size, device, phase)

    def row(source: Any) -> CalibrationRow:
        return predict(measure_loader(source, batch_size, nworkers, phase), ceiling, step_cpu, nworkers, cpus)

    result = Calibration(ceiling=ceiling, step_cpu_s=step_cpu, workers=nworkers, cpus=cpus, one_clip=row(clips),
                         grouped={k: row(source) for k, source in sources.items()})
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


def measure_ceiling(clips: Any, step: Callable[[Any], Any], batch_size: int, device: Any,
                    seconds: float) -> tuple[float, float]:
    """(samples/s, CPU seconds per sample) of ``step`` on a synthetic batch of the clips' shape:
    the CPU time is the whole process's (the step's threads included) over the timed steps."""
    batch = _synthetic(clips, batch_size, device)
    for _ in range(_WARMUP_STEPS):
        step(batch)
    _sync(device)
    steps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        step(batch)
        steps += 1
        # Synchronized every 4 steps, so that the clock sees the device's work, not its queue.
        if steps % 4 == 0 or time.perf_counter() - t0 >= seconds:
            _sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                samples = steps * batch_size
                return samples / elapsed, (time.process_time() - c0) / samples


def measure_steps(batches: Iterable[Any], step: Callable[[Any], Any] | None, seconds: float, warm: int,
                  device: Any = None, pids: Callable[[], list[int]] = list) -> dict[str, Any]:
    """``step`` on each of ``batches`` (dicts of arrays; None: a consumer that takes nothing)
    for ``seconds`` after the first ``warm`` batches: ``{"samples_per_s", "samples",
    "main_cpu_s", "worker_cpu_s"}``, the CPU seconds per sample of this process and of the
    processes ``pids()`` names when the clock starts (the workers)."""
    n, t0, w0, c0, workers = 0, 0.0, 0.0, 0.0, []
    for i, batch in enumerate(batches):
        if step is not None:
            step(batch)
        if i == warm:
            _sync(device)
            workers = pids()
            t0, w0, c0 = time.perf_counter(), cpu_seconds(workers), time.process_time()
        elif i > warm:
            n += len(next(iter(batch.values())))
            if time.perf_counter() - t0 >= seconds:
                _sync(device)
                break
        del batch
    elapsed = time.perf_counter() - t0
    worker_cpu, main_cpu = cpu_seconds(workers) - w0, time.process_time() - c0
    return {"samples_per_s": n / elapsed, "samples": n, "main_cpu_s": main_cpu / max(n, 1),
            "worker_cpu_s": worker_cpu / max(n, 1)}


def measure_loader(source: Any, batch_size: int, workers: int, seconds: float,
                   step: Callable[[Any], Any] | None = None, device: Any = None,
                   pin_memory: bool = False, warm: int | None = None) -> dict[str, Any]:
    """A shuffled, endless ``Loader`` over ``source`` through ``measure_steps`` for ``seconds``
    once started (its first ``warm`` batches left out; None: 2 a worker), batches on ``device``
    where given: its figures and the loader's ``stats()`` (``"stats"``)."""
    with Loader(source, batch_size=batch_size, workers=workers, shuffle=True, epochs=None) as loader:
        batches: Iterable[dict[str, Any]] = (
            loader if device is None else loader.as_torch(pin_memory=pin_memory, device=device))
        start = _WARMUP_BATCHES_PER_WORKER * workers if warm is None else warm
        m = measure_steps(batches, step, seconds, start, device, loader.worker_pids)
        return {**m, "stats": loader.stats()}


def predict(m: dict[str, Any], ceiling: float, step_cpu: float, workers: int, cpus: int) -> CalibrationRow:
    """A row of ``calibrate``: ``measure_loader``'s figures ``m`` (``samples_per_s``,
    ``worker_cpu_s``, ``main_cpu_s``, ``stats``) and the step's ceiling and CPU per sample, as
    NOTE [ What calibrate predicts ] combines them."""
    # One worker's rate: samples per CPU second of its own, or less where the loader alone did not
    # reach W times that (workers waiting on the ring or the hand-off, cores busy with other work).
    per_cpu = 1.0 / m["worker_cpu_s"] if m["worker_cpu_s"] > 0 else 0.0
    per_worker = min(per_cpu, m["samples_per_s"] / workers)
    c = step_cpu + m["main_cpu_s"]  # the training process's CPU seconds per sample
    # The training loop takes each batch, then steps: the hand-off's time adds to the step's.
    top = 1.0 / (1.0 / ceiling + m["main_cpu_s"]) if ceiling > 0 else 0.0
    if per_worker > 0:
        x = min(top, per_worker * workers, per_worker * cpus / (1 + per_worker * c))
        needed: int | None = max(1, math.ceil(top / per_worker - 1e-9))
        cores = top / per_worker + top * c
        short: int | None = max(0, math.ceil(cores - cpus - 1e-9))
    else:
        x, needed, short = 0.0, None, None
    return CalibrationRow(samples_per_s=m["samples_per_s"], predicted_per_s=x,
                          fed_fraction=min(1.0, x / ceiling) if ceiling > 0 else 0.0,
                          most_fed=top / ceiling if ceiling > 0 else 0.0, samples_per_worker_s=per_worker,
                          workers_needed=needed, more_cores=short,
                          decoded_per_frame=m["stats"].get("decoded_per_frame"),
                          head_per_frame=head_per_frame(m["stats"]))


def calibration_table(result: Calibration) -> str:
    """``calibrate``'s result as the table it prints."""
    rows = [("input", "alone/s", "with step/s", "fed", "workers needed", "cores short"),
            ("synthetic (the model's ceiling)", "-", f"{result.ceiling:.1f}", "1.00", "-", "-")]
    named = [("loader, one clip per sample", result.one_clip)]
    named += [(f"loader, clips_per_video={k}, group_clips=True", r) for k, r in result.grouped.items()]
    for label, r in named:
        short = r.more_cores
        rows.append((label, f"{r.samples_per_s:.1f}", f"{r.predicted_per_s:.1f}", f"{r.fed_fraction:.2f}",
                     str(r.workers_needed), "-" if short is None else (f"+{short}" if short else "0")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    text = "\n".join(lines) + (f"\n({result.workers} workers on {result.cpus} CPUs; the step takes "
                               f"{1e3 * result.step_cpu_s:.2f} ms of CPU per sample, counted in 'with step')")
    one = result.one_clip
    if prepare_pays(one.decoded_per_frame, one.head_per_frame):
        text += f"\none clip per sample decodes {one.decoded_per_frame:.1f} frames per delivered frame; {prepare_hint()}"
    return text
