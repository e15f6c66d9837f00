"""The loader's engine: the one event loop that owns the ring, the worker pool and the
scheduler, and turns worker replies into batches for the consumer.

``Loader`` (``_loader``) is the public face: arguments, iteration, state and adapters. It asks
the engine for the next batch; everything here runs in the consumer's thread, inside that
call: there is no background thread in the main process.

NOTE [ The engine loop ]
``Engine.next()`` repeats, under one lock, until a batch can be handed out:
  1. collect the slots whose leases died (NOTE [ Slot lease ] in ``engine.ring``);
  2. ``Scheduler.dispatch``: free slots go to the next batches of the plan, their positions
     become tasks (NOTE [ Tasks and replies ] in ``engine.schedule``);
  3. ``_feed``: queued tasks go to the least loaded live worker, as fixed-size messages;
  4. hand out the next ready batch (in plan order with ``ordered=True``), leased as views, or
     copied when the consumer holds every other slot (NOTE [ Slot lease ] in ``engine.ring``);
  5. else wait on the workers' reply pipes and the earliest deadline; while a worker idles
     for want of a slot and the consumer holds leases, at most ``_RELEASE_POLL_S``.
Invariants it keeps:
  * It never blocks without a deadline: a start-up deadline for a fresh worker, ``timeout``
    per sample of a worker's oldest task, and a liveness poll every ``_POLL_S``.
  * A worker's replies are acted on in order, one task each; a reply that does not match the
    worker's oldest task is a protocol error (the worker is killed, ``LoaderError``).
  * A dead or timed-out worker is removed before anything else happens to its tasks; with
    ``on_error="skip"`` its tasks are resent or retried and a fresh worker takes its place.
  * After an error, the engine refuses to go on (``LoaderError`` from the earlier one) and the
    workers are stopped; ``close()`` from another thread ends iteration quietly.
  * Shutdown (NOTE [ Shutdown ] in ``engine.pool``) runs once, on ``close()``, GC or exit.
"""

from __future__ import annotations

import json
import logging
import selectors
import subprocess
import threading
import time
import warnings
import weakref
from typing import Any, Callable, NoReturn

import numpy as np

from .._errors import LoaderError, RemoteTraceback, SampleError, WorkerDiedError
from .interrupts import Deferred
from .plan import EpochPlan
from .pool import REAP_S, Pool, Worker, stop_workers
from .protocol import COUNTS, ST_DONE, ST_READY, ProtocolError, pack_task, take_reply, write_all
from .buckets import place
from .ring import Layout, Ring
from .schedule import Batch, Scheduler, Task, holding
from .skips import SKIPS_KEPT, Skips
from .source import Sizes, Source
from .stats import Clock

__all__ = ["Engine", "Exhausted"]

log = logging.getLogger("shmloader")

# A fresh interpreter importing numpy, decord and PyAV takes ~0.3 s; a loaded machine may need more.
_START_TIMEOUT_S = 60.0
# How often a waiting loader checks worker liveness even when no pipe speaks (a dying worker
# closes its pipe, which wakes us at once; each idle wake-up costs ~0.2 ms of CPU on a VM).
_POLL_S = 1.0
# How often a waiting loader looks for returned slots when a worker idles for want of one. A
# lease's death wakes nobody (NOTE [ Slot lease ]): the loop finds it the next time round, and
# only a consumer holding nearly the whole ring makes it wait on one.
_RELEASE_POLL_S = 0.005


class Exhausted(Exception):
    """The plan is done (or the loader was closed): iteration ends."""


class Engine:
    """Ring + workers + scheduler for one loader (see the NOTE above)."""

    def __init__(self, source: Source, plan: EpochPlan, layout: Layout, *, slots: int, workers: int,
                 run: int, start: tuple[int, int], epochs: int | None, ordered: bool,
                 drop_remainder: bool, on_error: str, timeout: float, shm_dir: str | None,
                 cpus: list[int] | None, config: bytes, sizes: Sizes | None = None) -> None:
        self._source = source
        self._plan = plan
        self._on_error = on_error
        self._timeout = timeout
        self._nslots = slots
        self._lock = threading.RLock()
        self._closed = False
        self._error: BaseException | None = None
        self._ring = Ring(layout, slots, shm_dir)
        self._selector = selectors.DefaultSelector()
        self._pool = Pool(self._selector, self._ring.fd, config, source, cpus)
        self._workers = self._pool.workers  # the live ones, kept current by the pool
        acquire = getattr(source, "acquire", None)
        if acquire is not None:
            acquire()  # the source's shared tables stay until the shutdown below releases them
        self._clock = Clock()  # before the first close() below can stop it
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._ring, self._selector,
                                           getattr(source, "release", None))
        try:
            for wid in range(workers):
                self._pool.spawn(wid)
        except BaseException:
            self.close()
            raise
        self._warned_copy = False
        self._stats = dict(batches=0, samples=0, skipped=0, dropped=0, copied=0,
                           consumer_wait_s=0.0, worker_busy_s=0.0, worker_restarts=0, epoch=0,
                           decoded=0, tasks=0, **dict.fromkeys(COUNTS, 0))
        self.counters: dict[str, Any] = self._stats  # the loader's counts, read by state()
        self._last_liveness = time.monotonic()
        # (epoch, sample, reason) of the most recent skips; the count of all is in stats().
        self.skipped: Skips = Skips(maxlen=SKIPS_KEPT)
        self._sched = Scheduler(plan, slots, start=start, epochs=epochs, ordered=ordered,
                                drop_remainder=drop_remainder, describe=source.describe,
                                stats=self._stats, skipped=self.skipped, run=run)
        self._rows = [f for f in layout.fields if f.offsets]  # fields of rows
        if self._rows or plan.buckets is not None:  # a bucketed source's samples take their bucket here too
            self._sizes, self._sched.placed = sizes, self._place

    def close(self) -> None:
        """Stop the workers and free the ring (NOTE [ Shutdown ] in ``engine.pool``). Idempotent."""
        self._closed = True
        self._clock.stop(self._workers)  # stats() after close: the run's, not the time since
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def started(self) -> bool:
        """Has the plan handed out a batch yet?"""
        return bool(self._sched.seq)

    def start_at(self, start: tuple[int, int]) -> None:
        """Begin the stream at (epoch, batch) instead; before the first batch."""
        self._sched.start_at(start)

    @property
    def upcoming_epoch(self) -> int:  # the epoch being cut, or the next pass's first (Scheduler.upcoming)
        return self._sched.upcoming

    def set_plan(self, plan: EpochPlan) -> None:
        self._plan = self._sched.plan = plan

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w.alive()]

    @property
    def ring(self) -> Ring:
        return self._ring

    def stats(self, cpus: int) -> dict[str, Any]:
        """``Loader.stats``, then the source's ``report()``; ``cpus``: what the recommendation may ask for."""
        s = self._clock.report(self._stats, self._workers, cpus, slots=self._nslots, leased=self._ring.leased)
        return {**s, **getattr(self._source, "report", dict)()}

    # -------------------------------------------------------------- iteration
    def begin_pass(self) -> None:
        with self._lock:
            self._sched.begin_pass()

    def next(self) -> dict[str, np.ndarray]:
        """The next batch (see the NOTE); raises Exhausted at the end of a pass."""
        with self._lock, Deferred() as interrupts:  # NOTE [ Ctrl-C inside the engine ]
            if self._error is not None:
                raise LoaderError("the loader stopped after an earlier error") from self._error
            t0 = time.perf_counter()
            sched = self._sched
            try:
                while True:
                    interrupts.check()
                    if self._closed:
                        raise Exhausted
                    self._collect_releases()
                    sched.dispatch(idle=not any(w.outstanding for w in self._workers))
                    self._feed()
                    batch, n = sched.take_ready(self._compact)
                    if batch is not None:
                        return self._hand_out(batch, n)
                    if sched.exhausted:
                        raise Exhausted  # workers stay, idle, for another pass; close() ends them
                    self._wait(interrupts)
            except (LoaderError, OSError, ValueError) as e:
                if self._closed:  # closed from another thread while we waited: just the end
                    raise Exhausted from None
                if not isinstance(e, LoaderError):
                    raise
                self._error = e
                self.stop_workers()
                raise
            finally:
                self._stats["consumer_wait_s"] += time.perf_counter() - t0
                self._clock.waited(self._stats["consumer_wait_s"])

    def _collect_releases(self) -> None:
        self._sched.free.extend(self._ring.returned())

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
                write_all(w.task_w, pack_task([(b.slot, pos, s, b.epochs[pos]) for b, pos, s in task.items]))
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

    def _place(self, b: Batch) -> None:
        """Where each sample of ``b`` puts its rows, in the slot before any task (``buckets.place``)."""
        place(self._ring, b.slot, self._sched.plan, self._sizes, b.epoch, b.samples)

    def _compact(self, b: Batch, valid: list[int]) -> None:
        """Close the holes skipped samples left: kept positions move to the front."""
        self._ring.layout.compact(self._ring.slot_views[b.slot], valid, len(b.samples))

    def _hand_out(self, b: Batch, n: int) -> dict[str, np.ndarray]:
        self._clock.handed_out(n)
        self._stats["batches"] += 1
        self._stats["samples"] += n
        self._stats["epoch"] = b.epoch
        leased = self._ring.leased
        if leased + 1 >= self._nslots:
            # NOTE [ Slot lease ]: never lease the last slot, or a hoarding consumer deadlocks us.
            out = {k: v.copy() for k, v in self._ring.layout.views(self._ring.slot_bufs[b.slot], n).items()}
            self._sched.free.append(b.slot)
            self._stats["copied"] += 1
            if not self._warned_copy:
                self._warned_copy = True
                warnings.warn(f"the consumer holds {leased} of {self._nslots} ring slots; "
                              "further batches are copied until it releases some. Pass a larger "
                              "`slots=` to keep delivery zero-copy.", RuntimeWarning, stacklevel=4)
            return out
        return self._ring.lease(b.slot, n)

    # ---------------------------------------------------------------- waiting
    def _wait(self, interrupts: Deferred) -> None:
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
        sched = self._sched
        starved = bool(self._ring.leased and not sched.free and not sched.plan_done and
                       any(w.ready and not w.outstanding for w in self._workers))
        if starved:
            timeout = min(timeout, _RELEASE_POLL_S)
        events = interrupts.interruptible(self._selector.select, max(timeout, 0.0))
        for key, _ in events:
            if key.data in self._workers:
                self._read_worker(key.data)
        # A dying worker closes its result pipe, which wakes us with EOF; polling the processes
        # too catches one whose pipe a grandchild still holds open. Cheap, but not per message.
        now = time.monotonic()
        if (events or starved) and now - self._last_liveness < _POLL_S:
            return
        self._last_liveness = now
        for w in list(self._workers):
            if w.proc.poll() is not None:
                self._read_worker(w)
                if w in self._workers:
                    self._worker_lost(w, w.how_it_ended())

    def _read_worker(self, w: Worker) -> None:
        eof = self._pool.read(w)
        while True:
            try:
                reply = take_reply(w.buf)
            except ProtocolError as e:
                self._protocol_error(w, str(e))
            if reply is None:
                break
            self._on_message(w, *reply)
        if eof and w in self._workers:
            try:
                w.proc.wait(timeout=REAP_S)  # its reply pipe closed: it is ending, or in a state SIGKILL must end
                how = w.how_it_ended()
            except subprocess.TimeoutExpired:
                how = f"closed its reply pipe but had not ended {REAP_S:g} s later (killed)"
            self._worker_lost(w, how)

    def _on_message(self, w: Worker, status: int, count: int, failures: dict[int, bytes],
                    busy: float, counts: tuple[int, ...]) -> None:
        if status == ST_READY and not w.ready and not count:
            w.ready = True
            w.head_since = w.ready_at = time.monotonic()
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
        for name, n in zip(COUNTS, counts):
            self._stats[name] += n
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
            raise Exhausted  # close() from another thread ended it: no failure to report
        self._pool.remove(w)
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
        self._pool.spawn(w.wid)

    def _protocol_error(self, w: Worker, what: str) -> NoReturn:
        w.proc.kill()
        self._pool.remove(w)
        raise LoaderError(f"worker pid {w.pid} sent {what}; it was stopped")

    # ---------------------------------------------------------------- workers
    def stop_workers(self) -> None:
        self._pool.stop()


def _shutdown(workers: list[Worker], ring: Ring, selector: selectors.BaseSelector,
              release: Callable[[], None] | None) -> None:
    """Steps 1-5 of NOTE [ Shutdown ] in ``engine.pool``; runs on close(), GC or interpreter exit."""
    stop_workers(list(workers))
    workers.clear()
    selector.close()
    ring.close()
    if release is not None:
        release()  # the source's shared tables (the workers that mapped them are gone)
