"""The Loader: the public face of a pipeline that decodes a source in worker processes into a
ring of shared-memory batches. Arguments, iteration, statistics, resumable state, shards and
the framework adapters live here; the event loop that owns the ring, the workers and the
scheduler is ``engine.core.Engine`` (see NOTE [ The engine loop ] there).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import cloudpickle
import numpy as np

from ._checks import check_choice, check_int, check_seconds
from ._cpus import usable_cpus
from ._errors import LoaderError, StateError
from .engine.buckets import Buckets, batching, shaped, shaped_spec
from .engine.core import Engine, Exhausted
from .engine.plan import EpochPlan, check_state, plan_state
from .engine.ring import Layout, memory_for_ring, rows_capacity
from .engine.skips import ON_ERROR
from .engine.source import Described, Source, probe_transform

if TYPE_CHECKING:
    import tensorflow as tf

    from ._keras import KerasDataset
    from .torch import TorchLoader

__all__ = ["Loader", "eval_loader"]

log = logging.getLogger("shmloader")

# Tasks per worker that keep it busy between two visits of the consumer: sizes the ring. Every
# task of every batch that has a slot is sent to a worker at once (the least loaded), so the
# workers go on decoding while the consumer is busy in a training step and not calling us.
_DEPTH = 2
# Batches the consumer typically holds at once: the one in hand plus tf.data's prefetch buffer,
# which AUTOTUNE grows to a handful (5 were seen held in Keras fit).
_CONSUMER_HELD = 6
# Samples of several sizes (a whole video's frames): a slot can take hundreds of MB, and their
# consumers (a torch training step) hold the batch in hand and one ahead; more is slots= away.
# Such a sample takes a worker tens of ms to minutes, so one task a worker keeps it busy (a
# reply's round trip is well under a ms): no second task queued behind it (bench/results/qwen-slots{4,5,6}-cpu2).
_HELD_ROWS = 2
_DEPTH_ROWS = 1
# Share of the memory (or of shm_dir's free space) a default ring may take: the rest is for the
# training process, TensorFlow's buffers and the batches a consumer copies or keeps.
_RING_MEMORY_SHARE = 0.5
# Grouped sources: batches' worth of samples in one shuffle window by default (see engine.plan).
_GROUP_WINDOW_BATCHES = 4
# A batch goes out as runs of positions, one task and one reply each (NOTE [ Tasks and replies ]
# in engine.schedule): one run per this many workers, at most _TASKS_PER_BATCH. Each reply wakes the
# main process, and a wake-up alone costs ~0.1 ms of CPU on a VM: with up to 8 workers a whole
# batch is one task (the workers fill different batches side by side); with more, splitting a
# batch keeps the ring needed to keep them all busy (and its memory) 4x smaller.
_WORKERS_PER_RUN = 8
_TASKS_PER_BATCH = 4
# A bucketed source is refused when none of its first epochs holds a batch.
_CHECKED_EPOCHS = 4


class Loader:
    """Decode ``source`` in ``workers`` processes into a ring of ``slots`` shared-memory batches.

    Iterating yields dicts of numpy arrays with a leading batch axis: views into shared
    memory, valid for as long as you hold them (see NOTE [ Slot lease ] in ``engine.ring``).
    ``len(loader)`` is the number of batches per epoch (with ``batch_tokens`` or buckets, of the epoch
    being read, or after a pass the next one: each epoch cuts its own); ``epochs=None`` repeats forever.
    ``span_epochs=True`` cuts batches across epoch ends (``repeat().batch()``): every batch is
    whole but the last of a run, and ``len(loader)`` is the batches of ``epochs`` epochs.

    :param source: what to load: ``VideoClips``, ``ArraySource``, ``HDF5Source``,
        ``FunctionSource`` or any object with ``__len__``, ``spec()``, ``describe(i)``,
        ``worker_init()`` and ``read(i, rng, out)`` (``engine.source.Source``).
    :param batch_size: samples per batch (with ``batch_tokens``: at most; None: as many as fit).
    :param batch_tokens: cut batches by a budget instead, for a source whose samples have sizes
        (NOTE [ Samples of several sizes ] in ``engine.source``: ``shmloader.qwen.clips``): each
        batch holds the next samples of the epoch's order whose summed cost (a video-LLM's
        tokens) fits ``batch_tokens``, their rows packed end to end; a sample that alone costs
        more is refused when the loader is built, naming it. No refill: a skipped sample leaves
        its batch one sample shorter.
    :param workers: worker processes; None: one per CPU this process may run on.
    :param slots: batches in the ring; None: enough to keep every worker busy plus what a consumer
        and its prefetch hold, within half the available memory.
    :param shuffle: shuffle each epoch from ``(seed, epoch)``.
    :param seed: seeds the shuffle, clip starts and every sample's ``rng``: a run is the same for
        the same seed whatever the worker count.
    :param epochs: epochs per pass (one iteration); None: for ever.
    :param drop_remainder: drop each epoch's last short batch.
    :param ordered: deliver batches in plan order (False: as they complete; no ``state()``).
    :param on_error: ``"raise"`` a ``SampleError`` naming the sample, or ``"skip"`` it and refill
        its place from the same epoch.
    :param timeout: seconds one sample may take before its worker is killed and replaced.
    :param transform: ``transform(sample, rng)`` run in the workers on each sample: change the
        arrays in place and return None, or return a new dict (its shapes become the batch's).
    :param shm_dir: a tmpfs folder for the ring (an unnamed file) instead of an anonymous memfd.
    :param shard: ``(index, count)``: serve every ``count``-th sample of each epoch from ``index``
        (one shard per host); of a bucketed source (``shmloader.opensora``), every ``count``-th
        batch, the batches made a multiple of ``count`` first, so every rank takes as many steps.
    :param state: a ``state()`` dict to resume from: the same batches an uninterrupted run gives.
    :param log_every: seconds between ``stats_line()`` logs on the ``shmloader`` logger.
    :param pin_workers: pin worker ``i`` and its threads to the ``i``-th usable CPU.
    :param group_window: videos per shuffle window of a grouped source (``group_clips=True``).
    :param span_epochs: cut batches across epoch ends.
    :raises ValueError: a bad argument; ``StateError`` (a ValueError) for a ``state`` saved with other
        settings or for another dataset.
    """

    def __init__(self, source: Source | Described, *, batch_size: int | None = None,
                 batch_tokens: int | None = None, workers: int | None = None,
                 slots: int | None = None, shuffle: bool = False, seed: int = 0,
                 epochs: int | None = 1, drop_remainder: bool = False, ordered: bool = True,
                 on_error: str = "raise", timeout: float = 60.0,
                 transform: Callable[[dict[str, np.ndarray], np.random.Generator], Any] | None = None,
                 shm_dir: str | None = None, shard: tuple[int, int] = (0, 1),
                 state: dict[str, Any] | None = None, log_every: float | None = None,
                 pin_workers: bool = False, group_window: int | None = None,
                 span_epochs: bool = False) -> None:
        buckets, sizes, batch_size = batching(source, batch_size, batch_tokens)
        if workers is not None:
            check_int("workers", workers, 1)
        if slots is not None:
            check_int("slots", slots, 2)
        if epochs is not None:
            check_int("epochs", epochs, 1)
        check_int("seed", seed, 0)
        check_choice("on_error", on_error, ON_ERROR)
        check_seconds("timeout", timeout)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self._batch_size = batch_size
        self._epochs = epochs
        self._drop_remainder = drop_remainder
        self._ordered = ordered
        group = int(getattr(source, "group_size", 1))
        if group_window is not None:
            check_int("group_window", group_window, 1)
        elif group > 1:
            group_window = max(1, -(-_GROUP_WINDOW_BATCHES * batch_size // group))
        self._plan = EpochPlan.for_source(source, batch_size, shuffle=shuffle, seed=seed,
                                          drop_remainder=drop_remainder, shard=tuple(shard),
                                          window=group_window or 1, span_epochs=bool(span_epochs),
                                          costs=None if sizes is None else sizes.cost, budget=batch_tokens)
        _check_has_batches(self._plan, epochs)
        self._start = (0, 0)  # (epoch, batch) where this loader's stream begins
        fingerprint = getattr(source, "fingerprint", None)
        self._fingerprint: Callable[[], str] | None = fingerprint if callable(fingerprint) else None
        if state is not None:
            if not ordered:
                raise ValueError("resuming needs ordered=True")
            self._start = self._check_state(state)
        out_spec, scratch = probe_transform(source, transform, seed)
        capacity = buckets.capacity() if buckets is not None else (
            None if sizes is None else rows_capacity(sizes, batch_size, batch_tokens))
        self._layout = Layout.build(out_spec, batch_size, capacity)
        self._packed = capacity is not None
        self._buckets = buckets
        self._extras: Callable[[np.ndarray], dict[str, np.ndarray]] | None = getattr(source, "extras", None)
        cpus = usable_cpus()
        nworkers = workers or cpus
        if nworkers > cpus:
            _log_once(f"workers={nworkers} is more than the {cpus} CPUs this process may use: "
                     "they will share them")
        runs = min(batch_size, _TASKS_PER_BATCH, -(-nworkers // _WORKERS_PER_RUN))
        run = -(-batch_size // runs)
        if slots is None:
            # A grouped source's shuffle window must fit in the ring besides the usual slots.
            window = -(-self._plan.window * group // batch_size) + 1 if group > 1 else 0
            rows = capacity is not None
            slots = _default_slots(nworkers, batch_size, self._layout.slot_bytes, shm_dir, extra=window,
                                   run=run if group == 1 else 1, held=_HELD_ROWS if rows else _CONSUMER_HELD,
                                   depth=_DEPTH_ROWS if rows else _DEPTH)
        self._nslots = slots
        self._log_every = log_every
        self._last_log = time.monotonic()
        # A description (VideoClips) makes what this loader's workers run, and the loader owns it.
        running = source.for_workers() if isinstance(source, Described) else source
        config = pickle.dumps((list(sys.path), cloudpickle.dumps({
            "layout": self._layout, "slots": slots, "source": running, "transform": transform,
            "seed": seed, "scratch": scratch, "log_level": log.getEffectiveLevel(),
        })))
        self._engine = Engine(running, self._plan, self._layout, slots=slots, workers=nworkers, run=run,
                              start=self._start, epochs=epochs, ordered=ordered,
                              drop_remainder=drop_remainder, on_error=on_error, timeout=float(timeout),
                              shm_dir=shm_dir, cpus=sorted(os.sched_getaffinity(0)) if pin_workers else None,
                              config=config, sizes=sizes)
        # (epoch, sample, reason) of the most recent skips; the count of all is in stats().
        self.skipped = self._engine.skipped
        self._ring = self._engine.ring

    # ----------------------------------------------------------------- public
    def __len__(self) -> int:
        if not self._plan.span_epochs:  # with a budget or buckets, the coming epoch's own count
            return self._plan.batches_per_epoch(self._engine.upcoming_epoch)
        if self._epochs is None:
            raise TypeError("a loader with span_epochs=True and epochs=None has no length: its batches "
                            "run on across epochs for ever")
        return self._plan.batches_per_pass(self._epochs)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Yield batches. Iterating again after a finished pass starts the next pass of
        ``epochs`` epochs (epoch numbers, and so shuffles and clip starts, go on), which is what
        Keras does with a validation set each epoch; an unfinished stream is continued."""
        engine = self._engine
        engine.begin_pass()
        try:
            while True:
                if self._log_every is not None and time.monotonic() - self._last_log >= self._log_every:
                    self._last_log = time.monotonic()
                    log.info("%s", self.stats_line())
                # No local holds the batch while the generator is suspended: its slot can come
                # back as soon as the consumer drops it.
                yield engine.next() if self._buckets is None else shaped(engine.next(), self._buckets,
                                                                          self._layout, self._extras)
        except Exhausted:
            return

    @property
    def buckets(self) -> Buckets | None:
        """A bucketed source's buckets (each batch's size and shapes), else None."""
        return self._buckets

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers and free the ring (see NOTE [ Shutdown ] in ``engine.pool``). Idempotent."""
        self._engine.close()

    @property
    def closed(self) -> bool:
        return self._engine.closed

    @property
    def element_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
        """Field -> (batch shape, dtype); the batch axis is ``None`` where a batch may be short: at an
        epoch's end without ``drop_remainder``, at a run's end with ``span_epochs``, always with
        ``batch_tokens``; a field of rows has ``None`` rows, its offsets ``batch + 1`` entries."""
        whole = self._drop_remainder or (self._plan.span_epochs and self._epochs is None)
        b = self._batch_size if whole and not self._plan.cut else None
        if self._buckets is not None:  # each batch its bucket's size and shape
            return shaped_spec(self._layout, self._buckets, self._extras)
        return {f.name: (((None if b is None else b + 1),) if f.is_offsets else
                         (None, *f.shape) if f.offsets else (b, *f.shape), f.dtype)
                for f in self._layout.fields}

    @property
    def batch_size(self) -> int:
        """Samples per batch (with ``batch_tokens``: at most)."""
        return self._batch_size

    @property
    def layout(self) -> Layout:
        """Where each field of a batch lives in a ring slot (``engine.ring.Layout``)."""
        return self._layout

    def worker_pids(self) -> list[int]:
        return self._engine.worker_pids()

    def stats(self) -> dict[str, Any]:
        """Counters since the loader started, and whether training is input-bound.

        ``consumer_wait_fraction``: share of the time the consumer spent waiting inside
        ``next()``; above ~0.1 the model is starved (input-bound). ``worker_busy_fraction``:
        per worker, share of its life spent on samples. ``samples_per_s``: delivered since the
        first batch. ``samples_per_worker_s``: decode rate of one busy worker. ``judged``: more
        than 8 batches handed out (fewer, and ``stats_line()`` says the run is too short to
        judge). ``recommended_workers``: workers needed to meet the consumer's demand (what it
        consumed while not waiting) at that rate, at most one per CPU. ``decoder_shapes`` (videos,
        ``decoder="auto"``): per shape of file, the decoder each worker measured faster and the CPU
        ms a read of each. ``left_out`` (a bucketed source): the samples no bucket held in the
        epoch under way. After ``close()`` the figures are the run's, frozen at close.
        """
        stats = self._engine.stats(usable_cpus())
        if self._buckets is not None:  # samples no bucket held in the epoch under way (all shards')
            stats["left_out"] = self._plan.left_out(int(stats.get("epoch", self._start[0])))
        return stats

    def stats_line(self) -> str:
        """One line for a log or a progress bar: is training input-bound (or is the run, 8 batches
        or fewer, too short to judge), and what to do about it:
        the workers to use, or, when every CPU decodes already, how many frames the workers decode
        per delivered frame and what grouped decode (``clips_per_video=K, group_clips=True``)
        would decode instead (an estimate from the workers' own counters); one clip per sample
        from 3 frames per delivered frame (one or more of them before the clip's first), the
        ``shmloader prepare`` command too."""
        from ._diagnosis import stats_line

        return stats_line(self.stats(), self._plan.group)

    def as_dataset(self, prefetch: int | None = -1, input_context: tf.distribute.InputContext | None = None
                   ) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` over this loader (``prefetch=-1`` is ``tf.data.AUTOTUNE``).

        With a ``tf.distribute.InputContext`` the loader serves shard
        ``input_pipeline_id`` of ``num_input_pipelines``, and ``batch_size`` is per replica.
        """
        from ._tf import as_dataset

        if input_context is not None:
            self.set_shard(input_context.input_pipeline_id, input_context.num_input_pipelines)
        return as_dataset(self, prefetch)

    def as_torch(self, pin_memory: bool = False, device: Any = None, shard: tuple[int, int] | None = None
                 ) -> TorchLoader:
        """Batches as dicts of ``torch.Tensor``, zero-copy (``shmloader.torch.TorchLoader``)."""
        from .torch import as_torch

        return as_torch(self, pin_memory=pin_memory, device=device, shard=shard)

    def as_keras(self, x: str | Sequence[str] = "video", y: str | Sequence[str] | None = "label") -> KerasDataset:
        """A ``keras.utils.PyDataset`` of ``(batch[x], batch[y])`` for ``model.fit`` on any
        Keras 3 backend (``shmloader._keras.KerasDataset``)."""
        from ._keras import as_keras

        return as_keras(self, x=x, y=y)

    def set_shard(self, index: int, count: int) -> None:
        """Serve only shard ``index`` of ``count`` of every epoch (one per host); before iterating."""
        if self._engine.started:
            raise LoaderError("set_shard() must come before the first batch")
        plan = self._plan.sharded(index, count)
        _check_has_batches(plan, self._epochs)
        self._plan = plan
        self._engine.set_plan(plan)

    def load_state(self, state: dict[str, Any]) -> None:
        """Start from ``state`` (a ``state()`` dict), as ``Loader(..., state=)`` does; before the
        first batch. ValueError when it was saved with other settings."""
        if self._engine.started:
            raise LoaderError("load_state() must come before the first batch")
        if not self._ordered:
            raise ValueError("resuming needs ordered=True")
        self._start = self._check_state(state)
        self._engine.start_at(self._start)

    def state(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the stream stands, as a small JSON-serialisable dict for ``Loader(..., state=)``.

        ``consumed``: batches the consumer has really used since this loader started (with
        ``prefetch`` some delivered batches still wait in TF's buffer); default: all delivered.
        The resumed loader delivers exactly the batches an uninterrupted run would have
        delivered next: same seed, same order (``ordered=True``), same clip starts.
        """
        if not self._ordered:
            raise LoaderError("state() needs ordered=True: unordered delivery has no resumable position")
        delivered = int(self._engine.counters["batches"])
        done = delivered if consumed is None else int(consumed)
        if not 0 <= done <= delivered:
            raise ValueError(f"consumed={consumed} but only {delivered} batches were delivered")
        state = plan_state(self._plan, self._start, done, exact=self._engine.counters["skipped"] == 0)
        if self._fingerprint is not None:
            state["dataset"] = self._fingerprint()
        return state

    def _check_state(self, state: dict[str, Any]) -> tuple[int, int]:
        return _checked_start(self._plan, state, self._fingerprint)

def eval_loader(source: Source | Described, *, batch_size: int | None = None, workers: int | None = 1,
                **kwargs: Any) -> Loader:
    """A loader for validation or test: every clip exactly once, in order, the last partial batch
    kept; ``VideoClips`` become deterministic (``VideoClips.for_eval``: uniform starts, the
    smallest scale, center crops). One worker by default, so that an evaluation pass beside a training loader takes one core rather than all of them.
    ``batch_size`` or ``batch_tokens``, as ``Loader`` takes them.
    """
    if hasattr(source, "for_eval"):
        source = source.for_eval()
    for key, value in (("shuffle", False), ("epochs", 1), ("drop_remainder", False), ("ordered", True),
                       ("span_epochs", False)):
        if kwargs.setdefault(key, value) != value:
            raise ValueError(f"an evaluation loader needs {key}={value!r}")
    return Loader(source, batch_size=batch_size, workers=workers, **kwargs)


def _checked_start(plan: EpochPlan, state: dict[str, Any], fingerprint: Callable[[], str] | None) -> tuple[int, int]:
    """Where a loader resumed from ``state`` begins; StateError (a LoaderError and a ValueError)
    saying why where this loader cannot serve it."""
    start = check_state(plan, state)
    saved = state.get("dataset")
    if saved is not None and fingerprint is not None and saved != fingerprint():
        raise StateError(f"state was saved for another dataset (fingerprint {saved}, this one is "
                         f"{fingerprint()}: other videos, order or labels), so its position means other samples here")
    return start


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.info("%s", message)


def _check_has_batches(plan: EpochPlan, epochs: int | None) -> None:
    """An epoch with no batch would make ``epochs=None`` end at once, silently: refuse it."""
    n = plan.samples_per_epoch()
    if plan.span_epochs:
        has_batches = n and (epochs is None or plan.batches_per_pass(epochs))
    else:  # a bucketed plan's epochs each hold their own batches: one of the first few will do
        has_batches = any(plan.batches_per_epoch(e) for e in range(_CHECKED_EPOCHS if plan.buckets is not None else 1))
    if has_batches:
        return
    index, count = plan.shard
    where = f" in shard {index} of {count}" if count > 1 else ""
    if plan.buckets is not None:
        raise ValueError(f"no batch{where} in the first {_CHECKED_EPOCHS} epochs: no video fits a bucket often enough "
                         "to fill its batch (too few pixels or frames for every bucket, or chances too low; "
                         "drop_remainder=True drops a bucket's short batch)")
    if not n:
        raise ValueError(f"no samples{where}: the loader would deliver no batch")
    if plan.span_epochs:
        raise ValueError(f"{epochs} epochs of {n} samples{where} are fewer than batch_size={plan.batch_size}, "
                         "and drop_remainder=True drops them: the loader would deliver no batch")
    raise ValueError(f"an epoch has {n} samples{where}, fewer than batch_size={plan.batch_size}, and "
                     "drop_remainder=True drops them: the loader would deliver no batch. Use a smaller "
                     "batch_size, drop_remainder=False, or span_epochs=True to fill batches across epochs")


def _default_slots(workers: int, batch_size: int, slot_bytes: int, shm_dir: str | None,
                   extra: int = 0, run: int = 1, held: int = _CONSUMER_HELD, depth: int = _DEPTH) -> int:
    """Enough slots to keep every worker busy and cover what a consumer holds, as long as they
    take at most ``_RING_MEMORY_SHARE`` of the memory the ring would live in; never fewer than 2."""
    filling = -(-workers * depth * run // batch_size)  # `depth` tasks of `run` samples each
    if depth > 1:
        filling += 1  # a batch the queued tasks have begun besides
    usual = filling + held + 1 + extra
    fit = int(memory_for_ring(shm_dir) * _RING_MEMORY_SHARE // slot_bytes)
    if fit >= usual:
        return usual
    slots = max(2, fit)
    log.info("a batch takes %.1f MiB: %d ring slots instead of the usual %d fit in %d%% of the "
             "memory available%s; pass slots= to choose", slot_bytes / 2**20, slots, usual,
             100 * _RING_MEMORY_SHARE, f" in {shm_dir}" if shm_dir else "")
    return slots
