"""The Loader: plans batches, feeds the workers, hands filled slots to the consumer.

Everything here runs in the consumer's thread, inside ``next()``: there is no background
thread in the main process. Workers report through pipes; the loader waits on those pipes,
on a wake-up pipe poked by lease finalizers, and on a deadline, never on anything else.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import selectors
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Iterator

import cloudpickle
import numpy as np

from ._errors import LoaderError, RemoteTraceback, SampleError, WorkerDiedError
from ._plan import EpochPlan
from ._pool import Worker, start_worker, stop_workers
from ._protocol import ST_DONE, ST_READY, ProtocolError, pack_task, take_reply, write_all
from ._ring import Layout, Ring, memory_for_ring
from ._schedule import Batch, Scheduler, Task, holding
from ._source import Source, check_int

__all__ = ["Loader", "eval_loader"]

log = logging.getLogger("shmloader")

# Tasks per worker that keep it busy between two visits of the consumer: sizes the ring. Every
# task of every batch that has a slot is sent to a worker at once (the least loaded), so the
# workers go on decoding while the consumer is busy in a training step and not calling us.
_DEPTH = 2
# Batches the consumer typically holds at once: the one in hand plus tf.data's prefetch buffer,
# which AUTOTUNE grows to a handful (5 were seen held in Keras fit).
_CONSUMER_HELD = 6
# A fresh interpreter importing numpy and decord takes ~0.3 s; a loaded machine may need more.
_START_TIMEOUT_S = 60.0
# How often a waiting loader checks worker liveness even when no pipe speaks (a dying worker
# closes its pipe, which wakes us at once; each idle wake-up costs ~0.2 ms of CPU on a VM).
_POLL_S = 1.0
# Skipped samples remembered with their reason (a long run over a damaged dataset must not grow).
_SKIPS_KEPT = 10_000
# One read takes every reply a worker has queued (a reply is 32 bytes plus rare error text).
_READ_BYTES = 1 << 16
# Share of the memory (or of shm_dir's free space) a default ring may take: the rest is for the
# training process, TensorFlow's buffers and the batches a consumer copies or keeps.
_RING_MEMORY_SHARE = 0.5
# Grouped sources: batches' worth of samples in one shuffle window by default (see _plan).
_GROUP_WINDOW_BATCHES = 4
# A batch goes out as runs of positions, one task and one reply each (NOTE [ Tasks and replies ]
# in _schedule): one run per this many workers, at most _TASKS_PER_BATCH. Each reply wakes the
# main process, and a wake-up alone costs ~0.1 ms of CPU on a VM: with up to 8 workers a whole
# batch is one task (the workers fill different batches side by side); with more, splitting a
# batch keeps the ring needed to keep them all busy (and its memory) 4x smaller.
_WORKERS_PER_RUN = 8
_TASKS_PER_BATCH = 4


class _Exhausted(Exception):
    """The plan is done (or the loader was closed): iteration ends."""


class Loader:
    """Decode ``source`` in ``workers`` processes into a ring of ``slots`` shared-memory batches.

    Iterating yields dicts of numpy arrays with a leading batch axis: views into shared
    memory, valid for as long as you hold them (see NOTE [ Slot lease ] in ``_ring``).
    ``len(loader)`` is the number of batches per epoch; ``epochs=None`` repeats forever.
    """

    def __init__(self, source: Source, *, batch_size: int, workers: int | None = None,
                 slots: int | None = None, shuffle: bool = False, seed: int = 0,
                 epochs: int | None = 1, drop_remainder: bool = False, ordered: bool = True,
                 on_error: str = "raise", timeout: float = 60.0,
                 transform: Callable[[dict, np.random.Generator], Any] | None = None,
                 shm_dir: str | None = None, shard: tuple[int, int] = (0, 1),
                 state: dict | None = None, log_every: float | None = None,
                 pin_workers: bool = False, group_window: int | None = None) -> None:
        check_int("batch_size", batch_size, 1)
        if workers is not None:
            check_int("workers", workers, 1)
        if slots is not None:
            check_int("slots", slots, 2)
        if epochs is not None:
            check_int("epochs", epochs, 1)
        check_int("seed", seed, 0)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self._source = source
        self._cpus = sorted(os.sched_getaffinity(0)) if pin_workers else None
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._ordered = ordered
        self._on_error = on_error
        self._timeout = float(timeout)
        group = int(getattr(source, "group_size", 1))
        if group_window is not None:
            check_int("group_window", group_window, 1)
        elif group > 1:
            group_window = max(1, -(-_GROUP_WINDOW_BATCHES * batch_size // group))
        self._plan = EpochPlan(len(source), batch_size, shuffle=shuffle, seed=seed,
                               drop_remainder=drop_remainder, shard=tuple(shard), group=group,
                               window=group_window or 1)
        _check_has_batches(self._plan)
        self._start = (0, 0)  # (epoch, batch) where this loader's stream begins
        if state is not None:
            self._start = self._check_state(state)
        out_spec, scratch = _probe_transform(source, transform, seed)
        self._layout = Layout.build(out_spec, batch_size)
        nworkers = workers or _usable_cpus()
        if nworkers > _usable_cpus():
            _log_once(f"workers={nworkers} is more than the {_usable_cpus()} CPUs this process may use: "
                      "they will share them")
        runs = min(batch_size, _TASKS_PER_BATCH, -(-nworkers // _WORKERS_PER_RUN))
        self._run = -(-batch_size // runs)
        if slots is None:
            # A grouped source's shuffle window must fit in the ring besides the usual slots.
            window = -(-self._plan.window * group // batch_size) + 1 if group > 1 else 0
            slots = _default_slots(nworkers, batch_size, self._layout.slot_bytes, shm_dir, extra=window,
                                   run=self._run if group == 1 else 1)
        self._nslots = slots

        self._lock = threading.RLock()
        self._closed = False
        self._error: BaseException | None = None
        self._workers: list[Worker] = []
        self._ring = Ring(self._layout, slots, shm_dir)
        self._selector = selectors.DefaultSelector()
        acquire = getattr(source, "acquire", None)
        if acquire is not None:
            acquire()  # the source's shared tables stay until the shutdown below releases them
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._ring, self._selector,
                                           getattr(source, "release", None))
        self._config = pickle.dumps((list(sys.path), cloudpickle.dumps({
            "layout": self._layout, "slots": slots, "source": source, "transform": transform,
            "seed": seed, "scratch": scratch,
        })))
        self._selector.register(self._ring.wake_fd, selectors.EVENT_READ, None)
        try:
            for wid in range(nworkers):
                self._spawn(wid)
        except BaseException:
            self.close()
            raise

        self._leased = 0
        self._warned_copy = False
        self._t0 = time.monotonic()
        self._stats = dict(batches=0, samples=0, skipped=0, dropped=0, copied=0,
                           consumer_wait_s=0.0, worker_busy_s=0.0, worker_restarts=0, epoch=0,
                           decoded=0, tasks=0)
        self._log_every = log_every
        self._last_liveness = time.monotonic()
        self._t_first: float | None = None  # when the first batch was handed out
        self._first_batch_s: float | None = None
        self._first_wait_s: float | None = None
        self._last_log = time.monotonic()
        # (epoch, sample, reason) of the most recent skips; the count of all is in stats().
        self.skipped: deque[tuple[int, int, str]] = deque(maxlen=_SKIPS_KEPT)
        self._sched = Scheduler(self._plan, slots, start=self._start, epochs=epochs, ordered=ordered,
                                drop_remainder=drop_remainder, describe=source.describe,
                                stats=self._stats, skipped=self.skipped, run=self._run)

    # ----------------------------------------------------------------- public
    def __len__(self) -> int:
        return self._plan.batches_per_epoch()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Yield batches. Iterating again after a finished pass starts the next pass of
        ``epochs`` epochs (epoch numbers, and so shuffles and clip starts, go on), which is what
        Keras does with a validation set each epoch; an unfinished stream is continued."""
        self._begin_pass()
        try:
            while True:
                # No local holds the batch while the generator is suspended: its slot can come
                # back as soon as the consumer drops it.
                yield self._next()
        except _Exhausted:
            return

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers and free the ring (see NOTE [ Shutdown ] in ``_pool``). Idempotent."""
        self._closed = True
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def element_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
        """Field -> (batch shape with ``None`` for the batch axis unless ``drop_remainder``, dtype)."""
        b = self._batch_size if self._drop_remainder else None
        return {f.name: ((b, *f.shape), f.dtype) for f in self._layout.fields}

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w.alive()]

    def stats(self) -> dict[str, Any]:
        """Counters since the loader started, and whether training is input-bound.

        ``consumer_wait_fraction``: share of the time the consumer spent waiting inside
        ``next()``; above ~0.1 the model is starved (input-bound). ``worker_busy_fraction``:
        per worker, share of its life spent on samples. ``samples_per_worker_s``: decode rate of
        one busy worker. ``recommended_workers``: workers needed to meet the consumer's demand
        (what it consumed while not waiting) at that rate, at most one per CPU.
        """
        now = time.monotonic()
        s = dict(self._stats)
        s["elapsed_s"] = elapsed = now - self._t0
        s["workers"] = len(self._workers)
        s["slots"] = self._nslots
        s["leased"] = self._leased - self._ring.released.qsize()  # releases not yet collected
        s["samples_per_s"] = s["samples"] / elapsed if elapsed > 0 else 0.0
        # Steady state only: the wait for the workers to start and fill the first batch is
        # reported as first_batch_s, not counted against the pipeline.
        s["first_batch_s"] = self._first_batch_s
        window = now - self._t_first if self._t_first is not None else 0.0
        steady_wait = s["consumer_wait_s"] - (self._first_wait_s or 0.0)
        s["consumer_wait_fraction"] = min(1.0, max(0.0, steady_wait / window)) if window > 0 else 0.0
        s["worker_busy_fraction"] = [min(1.0, w.busy_s / max(now - w.started, 1e-9)) for w in self._workers]
        done = s["decoded"]
        rate = done / s["worker_busy_s"] if s["worker_busy_s"] > 0 else 0.0
        s["samples_per_worker_s"] = rate
        demand = s["samples"] / max(window - steady_wait, 1e-9)
        cpus = _usable_cpus()
        s["recommended_workers"] = max(1, min(cpus, math.ceil(demand / rate))) if rate and s["samples"] else None
        s["input_bound"] = s["consumer_wait_fraction"] > 0.1
        return s

    def stats_line(self) -> str:
        """One line for a log or a progress bar: is training input-bound, and what to do about it."""
        s = self.stats()
        busy = ", ".join(f"{100 * b:.0f}%" for b in s["worker_busy_fraction"]) or "-"
        verdict = "input-bound" if s["input_bound"] else "compute-bound"
        rec = s["recommended_workers"]
        return (f"{verdict}: consumer waited {100 * s['consumer_wait_fraction']:.0f}% of the time; "
                f"{s['samples_per_s']:.1f} samples/s; workers busy {busy}; "
                f"{s['samples_per_worker_s']:.1f} samples/s per busy worker"
                + (f"; recommended workers: {rec}" if rec else ""))

    def as_dataset(self, prefetch: int | None = -1, input_context=None):
        """A ``tf.data.Dataset`` over this loader (``prefetch=-1`` is ``tf.data.AUTOTUNE``).

        With a ``tf.distribute.InputContext`` the loader serves shard
        ``input_pipeline_id`` of ``num_input_pipelines``, and ``batch_size`` is per replica.
        """
        from ._tf import as_dataset

        if input_context is not None:
            self.set_shard(input_context.input_pipeline_id, input_context.num_input_pipelines)
        return as_dataset(self, prefetch)

    def set_shard(self, index: int, count: int) -> None:
        """Serve only shard ``index`` of ``count`` of every epoch (one per host); before iterating."""
        if self._sched.seq:
            raise LoaderError("set_shard() must come before the first batch")
        p = self._plan
        plan = EpochPlan(p.num_samples, p.batch_size, shuffle=p.shuffle, seed=p.seed,
                         drop_remainder=p.drop_remainder, shard=(index, count), group=p.group,
                         window=p.window)
        _check_has_batches(plan)
        self._plan = self._sched.plan = plan

    def state(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the stream stands, as a small JSON-serialisable dict for ``Loader(..., state=)``.

        ``consumed``: batches the consumer has really used since this loader started (with
        ``prefetch`` some delivered batches still wait in TF's buffer); default: all delivered.
        The resumed loader delivers exactly the batches an uninterrupted run would have
        delivered next: same seed, same order (``ordered=True``), same clip starts.
        """
        if not self._ordered:
            raise LoaderError("state() needs ordered=True: unordered delivery has no resumable position")
        done = self._stats["batches"] if consumed is None else int(consumed)
        if not 0 <= done <= self._stats["batches"]:
            raise ValueError(f"consumed={consumed} but only {self._stats['batches']} batches were delivered")
        per_epoch = len(self)
        position = self._start[1] + done
        p = self._plan
        return {"version": 1, "epoch": self._start[0] + (position // per_epoch if per_epoch else 0),
                "batch": position % per_epoch if per_epoch else 0, "seed": p.seed,
                "num_samples": p.num_samples, "batch_size": p.batch_size, "shuffle": p.shuffle,
                "drop_remainder": p.drop_remainder, "shard": list(p.shard),
                **({"group": p.group, "group_window": p.window} if p.group > 1 else {}),
                "exact": self._stats["skipped"] == 0}

    def _check_state(self, state: dict) -> tuple[int, int]:
        p = self._plan
        mine = {"num_samples": p.num_samples, "batch_size": p.batch_size, "shuffle": p.shuffle,
                "seed": p.seed, "drop_remainder": p.drop_remainder, "shard": list(p.shard)}
        if p.group > 1:
            mine.update(group=p.group, group_window=p.window)
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError("state must be a dict returned by Loader.state()")
        wrong = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if wrong:
            raise ValueError("state was saved by a loader with other settings: " +
                             ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in wrong.items()))
        if not self._ordered:
            raise ValueError("resuming needs ordered=True")
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch < max(1, self._plan.batches_per_epoch()):
            raise ValueError(f"state position epoch={epoch}, batch={batch} is out of range")
        return epoch, batch

    # -------------------------------------------------------------- iteration
    def _begin_pass(self) -> None:
        with self._lock:
            self._sched.begin_pass()

    def _next(self) -> dict[str, np.ndarray]:
        with self._lock:
            if self._error is not None:
                raise LoaderError("the loader stopped after an earlier error") from self._error
            t0 = time.perf_counter()
            sched = self._sched
            try:
                while True:
                    if self._closed:
                        raise _Exhausted
                    self._collect_releases()
                    sched.dispatch(idle=not any(w.outstanding for w in self._workers))
                    self._feed()
                    batch, n = sched.take_ready(self._compact)
                    if batch is not None:
                        return self._hand_out(batch, n)
                    if sched.exhausted:
                        raise _Exhausted  # workers stay, idle, for another pass; close() ends them
                    self._wait()
            except (LoaderError, OSError, ValueError) as e:
                if self._closed:  # closed from another thread while we waited: just the end
                    raise _Exhausted from None
                if not isinstance(e, LoaderError):
                    raise
                self._error = e
                self._stop_workers()
                raise
            finally:
                self._stats["consumer_wait_s"] += time.perf_counter() - t0
                if self._first_wait_s is None and self._t_first is not None:
                    self._first_wait_s = self._stats["consumer_wait_s"]

    def _collect_releases(self) -> None:
        released = self._ring.released
        if released.empty():
            return
        # The finalizers that queued these also poked the wake-up pipe: empty it first (a release
        # after this pokes it again), so the next wait does not return at once for nothing.
        self._ring.drain_wake()
        while not released.empty():
            self._sched.free.append(released.get())
            self._leased -= 1

    def _feed(self) -> None:
        """Send queued tasks, each to the worker with the fewest items outstanding."""
        queue = self._sched.queue
        while queue:
            candidates = [w for w in self._workers if w.task_w >= 0]
            if not candidates:
                return
            w = min(candidates, key=lambda w: w.load)
            task = queue.popleft()
            try:
                write_all(w.task_w, pack_task(task.epoch, [(b.slot, pos, s) for b, pos, s in task.items]))
            except OSError:
                queue.appendleft(task)
                self._read_worker(w)  # it died: its pipe tells how
                if w in self._workers:
                    self._worker_lost(w, f"{w.how_it_ended()}")
                continue
            if not w.outstanding:
                w.head_since = time.monotonic()
            w.outstanding.append(task)
            w.load += len(task)

    def _compact(self, b: Batch, valid: list[int]) -> None:
        """Close the holes skipped samples left: kept positions move to the front."""
        views = self._ring.slot_views[b.slot]
        for dst, src in enumerate(valid):
            if dst != src:
                for arr in views.values():
                    arr[dst] = arr[src]

    def _hand_out(self, b: Batch, n: int) -> dict[str, np.ndarray]:
        if self._log_every is not None and time.monotonic() - self._last_log >= self._log_every:
            self._last_log = time.monotonic()
            log.info("%s", self.stats_line())
        if self._t_first is None:
            self._t_first = time.monotonic()
            self._first_batch_s = self._t_first - self._t0
        self._stats["batches"] += 1
        self._stats["samples"] += n
        self._stats["epoch"] = b.epoch
        if self._leased + 1 >= self._nslots:
            # NOTE [ Slot lease ]: never lease the last slot, or a hoarding consumer deadlocks us.
            out = {k: v[:n].copy() for k, v in self._ring.slot_views[b.slot].items()}
            self._sched.free.append(b.slot)
            self._stats["copied"] += 1
            if not self._warned_copy:
                self._warned_copy = True
                warnings.warn(f"the consumer holds {self._leased} of {self._nslots} ring slots; "
                              "further batches are copied until it releases some. Pass a larger "
                              "`slots=` to keep delivery zero-copy.", RuntimeWarning, stacklevel=4)
            return out
        self._leased += 1
        return self._ring.lease(b.slot, n)

    # ---------------------------------------------------------------- waiting
    def _wait(self) -> None:
        now = time.monotonic()
        timeout = _POLL_S
        for w in list(self._workers):
            if not w.ready:
                deadline = w.started + max(self._timeout, _START_TIMEOUT_S)
            elif w.outstanding:
                deadline = w.head_since + self._timeout * len(w.outstanding[0])
            else:
                continue
            if now >= deadline:
                self._timed_out(w)
                return
            timeout = min(timeout, deadline - now)
        events = self._selector.select(max(timeout, 0.0))
        for key, _ in events:
            if key.data is None:
                self._ring.drain_wake()
            elif key.data in self._workers:
                self._read_worker(key.data)
        # A dying worker closes its result pipe, which wakes us with EOF; polling the processes
        # too catches one whose pipe a grandchild still holds open. Cheap, but not per message.
        now = time.monotonic()
        if events and now - self._last_liveness < _POLL_S:
            return
        self._last_liveness = now
        for w in list(self._workers):
            if w.proc.poll() is not None:
                self._read_worker(w)
                if w in self._workers:
                    self._worker_lost(w, w.how_it_ended())

    def _read_worker(self, w: Worker) -> None:
        eof = False
        while w.done_r >= 0:
            try:
                chunk = os.read(w.done_r, _READ_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            w.buf += chunk
            if len(chunk) < _READ_BYTES:
                break  # drained for now; epoll is level-triggered and wakes us for more
        while True:
            try:
                reply = take_reply(w.buf)
            except ProtocolError as e:
                self._protocol_error(w, str(e))
            if reply is None:
                break
            self._on_message(w, *reply)
        if eof and w in self._workers:
            w.proc.wait()
            self._worker_lost(w, w.how_it_ended())

    def _on_message(self, w: Worker, status: int, count: int, failures: dict[int, bytes],
                    busy: float) -> None:
        if status == ST_READY and not w.ready and not count:
            w.ready = True
            w.head_since = time.monotonic()
            return
        task = w.outstanding[0] if w.outstanding else None
        if status != ST_DONE or task is None or count != len(task):
            self._protocol_error(w, f"an unexpected message (status {status}, {count} items)")
        w.outstanding.popleft()
        w.load -= count
        w.head_since = time.monotonic()
        w.busy_s += busy
        self._stats["worker_busy_s"] += busy
        self._stats["decoded"] += count
        self._stats["tasks"] += 1
        for task, i in self._sched.task_done(task, failures):
            self._sample_failed(task, i, failures[i])
        self._feed()

    def _sample_failed(self, task: Task, i: int, payload: bytes) -> None:
        try:
            info = json.loads(payload.decode("utf-8", "replace"))
            exc_type, message, tb = str(info["type"]), str(info["message"]), str(info["traceback"])
        except (ValueError, KeyError, TypeError):
            exc_type, message, tb = "Exception", "(unreadable error report)", ""
        sample = task.items[i][2]
        err = SampleError(sample, self._source.describe(sample), exc_type, message)
        err.__cause__ = RemoteTraceback(tb)
        if self._on_error == "raise":
            raise err
        self._sched.skip(task, i, f"{exc_type}: {message}")

    def _timed_out(self, w: Worker) -> None:
        w.proc.kill()  # it may be spinning in native code with the GIL held: nothing softer works
        if not w.ready:
            self._worker_lost(w, f"did not start within {max(self._timeout, _START_TIMEOUT_S):.0f} s and was killed")
            return
        n = len(w.outstanding[0])
        per = "on one sample" if n == 1 else f"per sample on a task of {n} samples"
        self._worker_lost(w, f"spent more than timeout={self._timeout:g} s {per} and was killed", timed_out=True)

    def _worker_lost(self, w: Worker, how: str, timed_out: bool = False) -> None:
        """A worker is gone: raise, or (``on_error="skip"``) retry or skip its task and start another."""
        if self._closed:
            raise _Exhausted  # close() from another thread ended it: no failure to report
        self._remove(w)
        head = w.outstanding[0] if w.outstanding else None
        held = holding(head, self._source.describe) if head is not None else "no sample"
        if self._on_error == "raise" or head is None or not w.ready:
            raise WorkerDiedError(w.pid, how, held)
        # Its other tasks never started: they go again first, in the same order.
        self._sched.resend(list(w.outstanding)[1:])
        if len(head) == 1 and (timed_out or head.retried):
            self._sched.skip(head, 0, f"worker pid {w.pid} {how}")
        else:
            # A worker can die of something else (the OOM killer, a stray signal): try the
            # samples once more, one by one, before calling one of them bad.
            self._sched.retry(head)
        self._stats["worker_restarts"] += 1
        self._spawn(w.wid)

    def _protocol_error(self, w: Worker, what: str) -> None:
        w.proc.kill()
        self._remove(w)
        raise LoaderError(f"worker pid {w.pid} sent {what}; it was stopped")

    # ---------------------------------------------------------------- workers
    def _spawn(self, wid: int) -> None:
        cpu = self._cpus[wid % len(self._cpus)] if self._cpus else None
        w = start_worker(wid, self._ring.fd, self._config, tuple(getattr(self._source, "fds", ())), cpu)
        self._workers.append(w)
        self._selector.register(w.done_r, selectors.EVENT_READ, w)

    def _remove(self, w: Worker) -> None:
        if w in self._workers:
            self._workers.remove(w)
        if w.done_r >= 0:
            self._selector.unregister(w.done_r)
        stop_workers([w], grace=0.0)

    def _stop_workers(self) -> None:
        workers = list(self._workers)
        for w in workers:
            if w.done_r >= 0:
                self._selector.unregister(w.done_r)
        stop_workers(workers)


def eval_loader(source: Source, *, batch_size: int, workers: int | None = 1, **kwargs) -> Loader:
    """A loader for validation or test: every clip exactly once, in order, the last partial batch
    kept; ``VideoClips`` become deterministic (``VideoClips.for_eval``: uniform starts, the
    smallest scale, center crops). One worker by default, so that an evaluation pass beside a training loader takes one core rather than all of them.
    """
    if hasattr(source, "for_eval"):
        source = source.for_eval()
    for key, value in (("shuffle", False), ("epochs", 1), ("drop_remainder", False), ("ordered", True)):
        if kwargs.setdefault(key, value) != value:
            raise ValueError(f"an evaluation loader needs {key}={value!r}")
    return Loader(source, batch_size=batch_size, workers=workers, **kwargs)


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.info("%s", message)


def _usable_cpus() -> int:
    """CPUs this process may run on (taskset, cgroup cpusets), not all the machine has."""
    return len(os.sched_getaffinity(0)) or 1


def _check_has_batches(plan: EpochPlan) -> None:
    """An epoch with no batch would make ``epochs=None`` end at once, silently: refuse it."""
    if plan.batches_per_epoch():
        return
    n = plan.samples_per_epoch()
    index, count = plan.shard
    where = f" in shard {index} of {count}" if count > 1 else ""
    if not n:
        raise ValueError(f"no samples{where}: the loader would deliver no batch")
    raise ValueError(f"an epoch has {n} samples{where}, fewer than batch_size={plan.batch_size}, and "
                     "drop_remainder=True drops them: the loader would deliver no batch. Use a smaller "
                     "batch_size or drop_remainder=False")


def _default_slots(workers: int, batch_size: int, slot_bytes: int, shm_dir: str | None,
                   extra: int = 0, run: int = 1) -> int:
    """Enough slots to keep every worker busy and cover what a consumer holds, as long as they
    take at most ``_RING_MEMORY_SHARE`` of the memory the ring would live in; never fewer than 2."""
    filling = -(-workers * _DEPTH * run // batch_size) + 1  # _DEPTH tasks of `run` samples each
    usual = filling + _CONSUMER_HELD + 1 + extra
    fit = int(memory_for_ring(shm_dir) * _RING_MEMORY_SHARE // slot_bytes)
    if fit >= usual:
        return usual
    slots = max(2, fit)
    log.info("a batch takes %.1f MiB: %d ring slots instead of the usual %d fit in %d%% of the "
             "memory available%s; pass slots= to choose", slot_bytes / 2**20, slots, usual,
             100 * _RING_MEMORY_SHARE, f" in {shm_dir}" if shm_dir else "")
    return slots


def _shutdown(workers: list[Worker], ring: Ring, selector: selectors.BaseSelector,
              release: Callable[[], None] | None) -> None:
    """Steps 1-5 of NOTE [ Shutdown ] in ``_pool``; runs on close(), GC or interpreter exit."""
    stop_workers(list(workers))
    workers.clear()
    selector.close()
    ring.close()
    if release is not None:
        release()  # the source's shared tables (the workers that mapped them are gone)


def _probe_transform(source: Source, transform, seed: int):
    """Run ``transform`` once on a zero sample to learn what it produces.

    Returns (output spec, decode spec or None). The decode spec is set when the transform
    changes a shape or dtype: workers then decode into a private buffer and copy the result.
    """
    spec = source.spec()
    if transform is None:
        return spec, None
    sample = {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
    try:
        result = transform(dict(sample), np.random.default_rng((seed, 0, 0)))
    except Exception as e:
        raise ValueError(f"transform failed on a zero-filled sample: {type(e).__name__}: {e}") from e
    if result is None:
        return spec, None
    if not isinstance(result, dict):
        raise TypeError(f"transform must modify the sample in place and return None, or return a "
                        f"dict of arrays; it returned {type(result).__name__}")
    out = {}
    for k, v in result.items():
        a = np.asarray(v)
        if a.dtype.hasobject:
            raise TypeError(f"transform output {k!r} has dtype object")
        out[k] = (a.shape, a.dtype)
    return out, (None if out == spec else spec)
