"""The loader's scheduling state: which batch holds which slot, which tasks wait for a worker,
what a reply or a worker's death does to them, and which batch is ready to hand out.

The ``Loader`` owns the workers, the pipes and the ring; this module only keeps the books.
Nothing here blocks or touches a process: every method runs inside the consumer's ``next()``.

NOTE [ Tasks and replies ]
A task is one message to one worker: a list of items ``(slot, position, sample, epoch)``; the
worker fills every item and answers with ONE reply (the item count, and a
failure record for each item that failed). Items of one task may lie in several batches: that
is how the clips of one video, placed all over a shuffle window, are decoded in one pass
(grouped decode), and how a run of positions of one batch costs the main process one wake-up
(per-batch tasks). The rules that keep this exact:
  * A batch takes a slot before any of its positions is in a task, and is handed out only
    when every position is done: a slot a worker may still write is never delivered.
  * Every position is in exactly one task at a time. A task's reply settles all its items:
    done, or failed (raise, or skip and refill the position with the next sample of the same
    epoch - of the stream with ``span_epochs`` - which goes out as a task of its own).
  * A worker that dies takes its tasks with it. Its oldest task was being worked on: its
    samples are sent again, one task each, on a fresh worker (a death can come from outside:
    the OOM killer); a one-sample task that kills a worker again, or that timed out, is skipped.
    So a bad sample costs two deaths and only itself. The other tasks never started and are
    sent again first, unchanged. A task's items are written by at most one live worker at any
    time: the dead one's writes are overwritten by the retry before the batch is delivered.
  * Grouped sources: a group's items wait until every item of the group that this epoch's
    plan holds has a slot, then go out as one task. If the ring cannot hold a whole window
    (a small ``slots=``, a consumer keeping batches), waiting could stall: whenever no task is
    queued or running, the waiting items go out as they are (smaller groups, decoded once
    more each), so a batch with a slot always completes.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Callable

import numpy as np

from .._errors import LoaderError
from .plan import EpochCursor, EpochPlan, StreamCursor

__all__ = ["Batch", "Scheduler", "Task", "holding"]

log = logging.getLogger("shmloader")

# Skip reasons quoted when a whole epoch was skipped.
_REASONS_QUOTED = 3
# Skips of one epoch logged one line each; the rest are counted (one line says so, and the epoch's
# close sums them): a dataset with one bad file of 141 timesteps is not 141 warnings.
_SKIPS_LOGGED = 5
# Samples named in the error for a worker that died on a task of several.
_SAMPLES_NAMED = 8
# Epochs in a row without a batch after which a bucketed plan is refused (each epoch draws its
# samples' buckets anew: one may hold none where another holds some).
_EMPTY_EPOCHS = 100


Cursor = EpochCursor | StreamCursor


class Batch:
    __slots__ = ("seq", "epoch", "last_epoch", "cursor", "slot", "samples", "epochs", "pending")

    def __init__(self, seq: int, cursor: Cursor, slot: int, samples: list[int], epochs: list[int]) -> None:
        self.seq = seq
        self.cursor = cursor
        self.slot = slot
        self.samples = samples  # sample index per position; -1 where a skip left a hole
        self.epochs = epochs  # the epoch each position's sample was drawn in
        self.epoch, self.last_epoch = epochs[0], epochs[-1]  # as cut (refills may come later)
        self.pending = len(samples)


class Task:
    """Items ``(batch, position, sample)`` for one worker, answered by one reply; an item's
    epoch is ``batch.epochs[position]``."""

    __slots__ = ("items", "retried")

    def __init__(self, items: list[tuple[Batch, int, int]], retried: bool = False) -> None:
        self.items = items
        self.retried = retried  # already sent again after its worker died

    def __len__(self) -> int:
        return len(self.items)


class _Tally:
    """One epoch's outcome so far (``on_error="skip"`` bookkeeping)."""

    __slots__ = ("open", "kept", "skipped", "reasons")

    def __init__(self) -> None:
        self.open = 0  # batches of the epoch not yet handed out or dropped
        self.kept = 0  # samples read without error
        self.skipped = 0
        self.reasons: list[str] = []


class _Groups:
    """The items of one epoch's groups that wait for the rest of their group to get a slot."""

    def __init__(self, cursor: EpochCursor, plan: EpochPlan) -> None:
        self.group_of = plan.group_of
        kept = plan.group_of(cursor.order[: cursor.limit])
        # last[g]: the position in the epoch's order of group g's last sample with a batch
        groups, first_from_end = np.unique(kept[::-1], return_index=True)
        self.last: dict[int, int] = dict(zip(groups.tolist(), (len(kept) - 1 - first_from_end).tolist()))
        self.waiting: dict[int, list[tuple[Batch, int, int]]] = {}


def _pass_end(epoch: int, epochs: int | None) -> int | None:
    """The first epoch after the pass that holds ``epoch``: passes of ``epochs`` epochs are
    [k * epochs, (k + 1) * epochs), so a loader resumed from a state in any epoch delivers the
    rest of that pass first, then whole passes, as the uninterrupted loader iterated again does
    (a trainer that iterates ``Loader(epochs=1)`` once per epoch resumes mid-epoch)."""
    return None if epochs is None else (epoch // epochs + 1) * epochs


class Scheduler:
    """Slots to batches, positions to tasks, replies to delivered batches (NOTE [ Tasks and replies ])."""

    def __init__(self, plan: EpochPlan, slots: int, *, start: tuple[int, int], epochs: int | None,
                 ordered: bool, drop_remainder: bool, describe: Callable[[int], str], stats: dict,
                 skipped: deque, run: int = 1) -> None:
        self.plan = plan
        self._run = max(1, run)  # positions per task for ungrouped sources
        self.free = list(range(slots - 1, -1, -1))
        self.queue: deque[Task] = deque()  # tasks not yet sent to a worker
        self.inflight: dict[int, Batch] = {}  # by seq: insertion order is plan order
        # Completed batches in completion order, kept only when not ordered (ordered hands out
        # the oldest in flight): a record kept per batch would grow with the run.
        self._done: deque[Batch] = deque()
        self._start = start
        self._epochs = epochs
        self._ordered = ordered
        self._drop_remainder = drop_remainder
        self._describe = describe
        self._stats = stats
        self._skipped = skipped
        self._cursor: Cursor | None = None
        self._groups: dict[int, _Groups] = {}  # by epoch, grouped sources only
        self._pass_end = _pass_end(start[0], epochs)  # first epoch not in the current pass
        self.plan_done = False
        self.seq = 0
        self._tallies: dict[int, _Tally] = {}
        self._failed_in_a_row = 0  # span_epochs: refills never run out, so count failures instead
        # Called with each batch as it takes its slot, before any of its tasks is queued (the
        # engine writes where each sample's rows go: NOTE [ Samples of several sizes ]).
        self.placed: Callable[[Batch], None] | None = None

    # ------------------------------------------------------------------ plan
    @property
    def exhausted(self) -> bool:
        return self.plan_done and not self.inflight

    @property
    def epoch(self) -> int | None:
        return None if self._cursor is None else self._cursor.epoch

    @property
    def upcoming(self) -> int:
        """The epoch being cut, or after a finished pass the one the next pass begins with."""
        if self._cursor is None:
            return self._start[0]
        return self._cursor.epoch + 1 if self.plan_done and not self.inflight else self._cursor.epoch

    def start_at(self, start: tuple[int, int]) -> None:
        """Where the stream begins (epoch, batch); only before the first batch is planned."""
        assert not self.seq, "the plan has begun"
        self._start = start
        self._pass_end = _pass_end(start[0], self._epochs)

    def begin_pass(self) -> None:
        """After a finished pass, the next ``epochs`` epochs (iterating the loader again)."""
        if self.plan_done and not self.inflight and self._epochs is not None and self.seq:
            assert self._pass_end is not None  # a pass of ``epochs`` epochs has an end
            if self.plan.span_epochs:  # the next pass begins where this one was meant to end
                self._start, self._cursor = (self._pass_end, 0), None
                next_epoch = self._pass_end
            else:
                next_epoch = self._cursor.epoch + 1 if self._cursor is not None else self._start[0]
            self._pass_end = next_epoch + self._epochs
            self.plan_done = False

    def _next_cursor(self) -> Cursor | None:
        """The cursor to cut the next batch from, or None when the pass has no more batches."""
        cur = self._cursor
        if self.plan.span_epochs:
            if cur is None:
                start = self._start[0] * self.plan.samples_per_epoch() + self._start[1]
                first = 0 if self._epochs is None or self._pass_end is None else self._pass_end - self._epochs
                cur = self._cursor = StreamCursor(self.plan, start, first, self._pass_end)
            return cur if cur.has_batch() else None
        empty = 0  # epochs in a row without a batch (a bucketed plan's: each epoch draws its own)
        while cur is None or not cur.has_batch():
            epoch = self._start[0] if cur is None else cur.epoch + 1
            if (self._pass_end is not None and epoch >= self._pass_end) or (
                    cur is not None and cur.limit == 0 and not self.plan.cut):
                return None
            fresh = self._cursor = EpochCursor(self.plan, epoch)
            if cur is None:  # resuming mid-epoch: the batches before were delivered already
                fresh.seek(self._start[1])
            if fresh.limit == 0 and not self.plan.cut:  # fewer samples than one batch, none kept
                return None
            if fresh.limit == 0:
                empty += 1
                if empty >= _EMPTY_EPOCHS:
                    raise LoaderError(f"{empty} epochs in a row from epoch {epoch - empty + 1} hold no batch: no "
                                      "sample fits its bucket's batch (too few samples, chances too low, or "
                                      "drop_remainder=True dropping them all)")
            if self.plan.group > 1:
                self._groups[epoch] = _Groups(fresh, self.plan)
            cur = fresh
        return cur

    def dispatch(self, idle: bool) -> None:
        """Give free slots to the next batches of the plan and turn their positions into tasks.
        ``idle``: no worker holds a task; then, if nothing else can complete a batch, waiting
        groups go out as they are (see the NOTE)."""
        while self.free and not self.plan_done:
            cur = self._next_cursor()
            if cur is None:
                self.plan_done = True
                break
            b = Batch(self.seq, cur, self.free.pop(), *cur.next_batch())
            self.seq += 1
            if self.placed is not None:
                self.placed(b)
            for epoch in range(b.epoch, b.last_epoch + 1):  # one epoch, or a few with span_epochs
                self._tally(epoch).open += 1
            self.inflight[b.seq] = b
            items = [(b, pos, s) for pos, s in enumerate(b.samples)]
            if self.plan.group == 1:  # runs of positions: a few replies per batch, not one per sample
                self.queue.extend(Task(items[lo : lo + self._run]) for lo in range(0, len(items), self._run))
            else:
                self._gather(cur, items)
        if idle and not self.queue and not self._ready():
            for groups in self._groups.values():
                for g, items in groups.waiting.items():
                    self.queue.append(Task(items))
                groups.waiting.clear()

    def _ready(self) -> bool:
        """Is a batch ready to hand out?"""
        if not self._ordered:
            return bool(self._done)
        b = next(iter(self.inflight.values()), None)
        return b is not None and not b.pending

    def _gather(self, cur: Cursor, items: list[tuple[Batch, int, int]]) -> None:
        groups = self._groups[cur.epoch]
        for item in items:
            _, _, sample = item  # (batch, position, sample)
            groups.waiting.setdefault(int(groups.group_of(sample)), []).append(item)
        self._release_groups(cur)

    def _release_groups(self, cur: Cursor) -> None:
        """Send every waiting group whose items all have slots now."""
        groups = self._groups.get(cur.epoch)
        if groups is None:
            return
        ready = [g for g in groups.waiting if groups.last.get(g, -1) < cur.pos]
        for g in ready:
            self.queue.append(Task(groups.waiting.pop(g)))
        if not cur.has_batch() and not groups.waiting:
            del self._groups[cur.epoch]

    # --------------------------------------------------------------- replies
    def task_done(self, task: Task, failed: dict[int, bytes]) -> list[tuple[Task, int]]:
        """A worker answered ``task``; ``failed``: item index -> reason. Returns the failed
        items for the loader to raise on or skip (it knows the ``on_error`` policy)."""
        if len(failed) < len(task):
            self._failed_in_a_row = 0
        if not failed:  # the usual case, once per reply: a count per batch, not a step per sample
            items = task.items
            b = items[0][0]
            if items[-1][0] is b:  # a run of one batch
                self._position_done(b, len(items))
                return []
        bad = []
        for i, (b, pos, sample) in enumerate(task.items):
            if i in failed:
                bad.append((task, i))
            else:
                self._position_done(b)
        return bad

    def _position_done(self, b: Batch, n: int = 1) -> None:
        b.pending -= n
        if not b.pending and not self._ordered:
            self._done.append(b)

    def skip(self, task: Task, i: int, reason: str) -> None:
        """Drop item ``i`` of ``task`` and refill its position from the same epoch."""
        b, pos, sample = task.items[i]
        epoch = b.epochs[pos]
        where = self._describe(sample)
        t = self._tally(epoch)
        if t.skipped < _SKIPS_LOGGED:
            log.warning("skipped sample %d (%s): %s", sample, where, reason)
        elif t.skipped == _SKIPS_LOGGED:
            log.warning("epoch %d: more samples skipped; the rest of this epoch's are counted, not logged "
                        "(loader.skipped and stats() hold them)", epoch)
        self._stats["skipped"] += 1
        self._skipped.append((epoch, sample, reason))
        t.skipped += 1
        if len(t.reasons) < _REASONS_QUOTED:
            t.reasons.append(f"sample {sample} ({where}): {reason}")
        self._failed_in_a_row += 1
        if self.plan.span_epochs and self._failed_in_a_row >= self.plan.samples_per_epoch():
            raise LoaderError(
                f"every sample failed: the last {self._failed_in_a_row}, an epoch's worth, were skipped "
                f"(on_error='skip'), nothing to deliver. First reasons: " + "; ".join(t.reasons))
        refill = b.cursor.refill()
        if refill is None:
            b.samples[pos] = -1
            self._position_done(b)
        else:
            b.samples[pos], b.epochs[pos] = refill
            self.queue.appendleft(Task([(b, pos, refill[0])]))
            self._release_groups(b.cursor)  # the refill may have been a group's last sample

    def resend(self, tasks: list[Task]) -> None:
        """Tasks a dead worker never started: first in line again, in their order."""
        for task in reversed(tasks):
            self.queue.appendleft(task)

    def retry(self, task: Task) -> None:
        """Send a dead worker's task again, first in line: one sample as it was; several one by
        one, so that a sample that kills a worker again costs only itself."""
        for item in reversed(task.items):
            self.queue.appendleft(Task([item], retried=True))

    # --------------------------------------------------------------- handing out
    def take_ready(self, compact: Callable[[Batch, list[int]], None]) -> tuple[Batch | None, int]:
        """The next batch to hand out and how many samples it keeps (holes closed by
        ``compact(batch, kept positions)``), or (None, 0). Empty batches give their slot back."""
        while True:
            if self._ordered:
                b = next(iter(self.inflight.values()), None)
                if b is None or b.pending:
                    return None, 0
            else:
                if not self._done:
                    return None, 0
                b = self._done.popleft()
            del self.inflight[b.seq]
            valid = [p for p, s in enumerate(b.samples) if s >= 0]
            n = len(valid)
            if n and n < len(b.samples):
                compact(b, valid)
            whole = len(b.samples) if self.plan.cut else self.plan.batch_size  # a bucket's batch: its own size
            if n and self._drop_remainder and n < whole:
                self._stats["dropped"] += n
                n = 0
            self._batch_closed(b, valid)
            if n:
                return b, n
            self.free.append(b.slot)

    def _tally(self, epoch: int) -> _Tally:
        t = self._tallies.get(epoch)
        if t is None:
            t = self._tallies[epoch] = _Tally()
        return t

    def _batch_closed(self, b: Batch, valid: list[int]) -> None:
        """Count a finished batch (``valid``: its kept positions); at the end of an epoch, fail if
        the epoch delivered nothing because every sample was skipped (else ``epochs=None`` would
        spin on it for ever), and warn if most of it was skipped."""
        if b.epoch == b.last_epoch and not self.plan.span_epochs:
            self._tally(b.epoch).kept += len(valid)
        else:  # positions' epochs, refills' included
            kept = b.epochs if len(valid) == len(b.epochs) else [b.epochs[p] for p in valid]
            for epoch, n in Counter(kept).items():
                self._tally(epoch).kept += n
        for epoch in range(b.epoch, b.last_epoch + 1):
            t = self._tally(epoch)
            t.open -= 1
            if not t.open and b.cursor.past(epoch):
                del self._tallies[epoch]
                self._epoch_closed(epoch, t)

    def _epoch_closed(self, epoch: int, t: _Tally) -> None:
        if not t.skipped:
            return
        tried = t.kept + t.skipped
        if not t.kept:
            raise LoaderError(
                f"every sample of epoch {epoch} failed: {tried} tried, {t.skipped} skipped "
                f"(on_error='skip'), nothing to deliver. First reasons: " + "; ".join(t.reasons))
        if t.skipped * 2 > tried or t.skipped > _SKIPS_LOGGED:
            log.warning("epoch %d: %d of %d samples (%.0f%%) were skipped; first reasons: %s",
                        epoch, t.skipped, tried, 100 * t.skipped / tried, "; ".join(t.reasons))


def holding(task: Task, describe: Callable[[int], str]) -> str:
    """What a task held, for an error message."""
    samples = [s for _, _, s in task.items]
    named = ", ".join(f"sample {s} ({describe(s)})" for s in samples[:_SAMPLES_NAMED])
    if len(samples) == 1:
        return named
    more = f" and {len(samples) - _SAMPLES_NAMED} more" if len(samples) > _SAMPLES_NAMED else ""
    return f"one of {len(samples)} samples: {named}{more}"

