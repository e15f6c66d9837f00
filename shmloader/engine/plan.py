"""The epoch plan: which sample indices an epoch visits, in which order.

Decided in the main process from ``(seed, epoch)`` alone, without opening any file, so a
source of 50 000 videos starts as fast as one of 5. Per-sample randomness (clip start,
augmentation) is seeded in the worker by ``(seed, epoch, sample)``, so neither depends on how
many workers there are or which one runs a sample.

Grouped sources (``group`` consecutive sample indices, e.g. the clips of one video, that one
worker can decode in one pass) are shuffled in two stages, like tf.data's shuffle buffer or
DALI's ``initial_fill``: the groups are shuffled, then cut into windows of ``window`` groups,
and the samples of each window are shuffled among themselves. A window's samples fill
consecutive batches, so the loader can decode each group once for all of them. Groups of
different sizes (``groups``: a group id per sample, e.g. the time-span rows of one video) go
the same way; a shard then takes every n-th group by id before the shuffle, so that it holds
the same number of samples every epoch.

With ``span_epochs`` the epochs' orders follow each other as one stream and batches are cut
from it across epoch ends, as tf.data's ``repeat().batch()`` does: a dataset smaller than a
batch still gives whole batches, and only the last batch of a run can be short. Each sample
keeps the epoch it was drawn in (its randomness, its place in ``state()``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import StateError
from .buckets import Buckets, bucket_plan
from .source import seeded

__all__ = ["EpochPlan", "EpochCursor", "StreamCursor", "plan_state", "check_state", "seeded"]


class EpochPlan:
    """Every host computes the same epoch order; shard ``i`` of ``n`` takes every n-th sample of
    it from position ``i``, so the shards of an epoch are disjoint and together hold all of it."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int,
                 drop_remainder: bool, shard: tuple[int, ...] = (0, 1), group: int = 1,
                 window: int = 1, span_epochs: bool = False, groups: np.ndarray | None = None,
                 costs: np.ndarray | None = None, budget: int | None = None,
                 buckets: Buckets | None = None) -> None:
        self.groups = None
        self.costs, self.budget = costs, budget
        self.buckets = buckets
        self._cuts: dict[int, np.ndarray] = {}
        self._counts: dict[int, int] = {}  # each epoch's batch count, once cut
        self._bucketed: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if buckets is not None:
            for what, bad in (("batch_tokens=", budget is not None), ("span_epochs=True", span_epochs),
                              ("grouped clips", group > 1 or groups is not None)):
                if bad:
                    raise ValueError(f"a bucketed source's batches hold one bucket each, of its own batch size: "
                                     f"{what} does not apply")
        if budget is not None:
            if costs is None or len(costs) != num_samples:
                raise ValueError(f"a budget needs the cost of each of the {num_samples} samples")
            for what, bad in (("drop_remainder=True", drop_remainder), ("span_epochs=True", span_epochs),
                              ("grouped clips", group > 1 or groups is not None)):
                if bad:
                    raise ValueError(f"batch_tokens= does not work with {what}: batches cut by a budget "
                                     "have no fixed size to fill")
        if groups is not None:  # groups of several sizes: members of each, in id order
            groups = np.asarray(groups, dtype=np.int64)
            if groups.shape != (num_samples,) or (num_samples and groups.min() < 0):
                raise ValueError(f"groups must give each of the {num_samples} samples a group id >= 0")
            self.groups = groups
            self._members = np.argsort(groups, kind="stable")
            self._bounds = np.concatenate([[0], np.cumsum(np.bincount(groups))]).astype(np.int64)
            group = max(group, 2)
        elif group < 1 or num_samples % group:
            raise ValueError(f"{num_samples} samples do not split into groups of {group}")
        if span_epochs and group > 1:
            raise ValueError("span_epochs=True does not work with grouped clips (group_clips=True): "
                             "a group's shuffle window lies inside one epoch")
        self.span_epochs = span_epochs
        self.num_samples = num_samples
        self.group = group
        self.window = max(1, window)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_remainder = drop_remainder
        index, count = shard
        if not (isinstance(count, int) and count >= 1 and isinstance(index, int) and 0 <= index < count):
            raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard!r}")
        self.shard = (index, count)

    @classmethod
    def for_source(cls, source: Any, batch_size: int, *, shuffle: bool, seed: int, drop_remainder: bool = False,
                   shard: tuple[int, ...] = (0, 1), window: int = 1, span_epochs: bool = False,
                   costs: np.ndarray | None = None, budget: int | None = None) -> EpochPlan:
        """The plan of ``source``'s samples, grouped as the source says (``group_size``, and
        ``group_ids`` for groups of several sizes) where it says so: the loader's, and Ray's."""
        groups = getattr(source, "group_ids", None)
        return cls(len(source), batch_size, shuffle=shuffle, seed=seed, drop_remainder=drop_remainder,
                   shard=shard, group=int(getattr(source, "group_size", 1)), window=window,
                   span_epochs=span_epochs, groups=None if groups is None else groups(), costs=costs,
                   budget=budget, buckets=source.buckets() if hasattr(source, "buckets") else None)

    def sharded(self, index: int, count: int) -> EpochPlan:
        """This plan, serving shard ``index`` of ``count``."""
        return EpochPlan(self.num_samples, self.batch_size, shuffle=self.shuffle, seed=self.seed,
                         drop_remainder=self.drop_remainder, shard=(index, count), group=self.group,
                         window=self.window, span_epochs=self.span_epochs, groups=self.groups,
                         costs=self.costs, budget=self.budget, buckets=self.buckets)

    def group_of(self, samples: Any) -> Any:
        """The group id of each of ``samples`` (an int or an array)."""
        return self.groups[samples] if self.groups is not None else samples // self.group

    def _sized_order(self, epoch: int) -> np.ndarray:
        """``order`` for groups of several sizes."""
        index, count = self.shard
        bounds = self._bounds
        groups = np.arange(len(bounds) - 1, dtype=np.int64)[index::count]
        if self.shuffle:
            groups = seeded((self.seed, epoch)).permutation(groups)
        sizes = bounds[groups + 1] - bounds[groups]
        ends = np.cumsum(sizes)
        within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - sizes, sizes)
        samples = self._members[np.repeat(bounds[groups], sizes) + within]
        if not self.shuffle:
            return samples
        cuts = [0, *ends[self.window - 1 :: self.window].tolist()]
        if cuts[-1] != len(samples):
            cuts.append(len(samples))
        for w, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            samples[lo:hi] = seeded((self.seed, epoch, w)).permutation(samples[lo:hi])
        return samples

    @property
    def cut(self) -> bool:
        """Whether each epoch has its own batches, cut by a budget or by buckets (no fixed size)."""
        return self.budget is not None or self.buckets is not None

    def _bucket_epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A bucketed source's epoch: (each sample's bucket, the order, the batches' starts)."""
        got = self._bucketed.get(epoch)
        if got is None:
            assert self.buckets is not None
            ids = np.asarray(self.buckets.assign(self.seed, epoch), np.int64)
            if ids.shape != (self.num_samples,):
                raise ValueError(f"the source's buckets assigned {ids.shape} samples, it has {self.num_samples}")
            order, cuts = bucket_plan(ids, self.buckets.batch_sizes, seed=self.seed, epoch=epoch,
                                      shuffle=self.shuffle, drop_remainder=self.drop_remainder, shard=self.shard,
                                      pad=self.buckets.pad)
            if len(self._bucketed) > 2:  # the epoch being cut, and one a late refill or state() may read
                del self._bucketed[min(self._bucketed)]
            got = self._bucketed[epoch] = (ids, order, cuts)
        return got

    def bucket_of(self, epoch: int, samples: np.ndarray | list[int]) -> np.ndarray:
        """Each of ``samples``' bucket in ``epoch`` (a bucketed source's)."""
        return self._bucket_epoch(epoch)[0][samples]

    def left_out(self, epoch: int) -> int:
        """A bucketed source's samples that fit no bucket in ``epoch`` (all shards')."""
        return int(np.count_nonzero(self._bucket_epoch(epoch)[0] < 0))

    def order(self, epoch: int) -> np.ndarray:
        index, count = self.shard
        if self.buckets is not None:
            return self._bucket_epoch(epoch)[1]
        if self.groups is not None:
            return self._sized_order(epoch)
        if self.group == 1:
            if not self.shuffle:
                full = np.arange(self.num_samples, dtype=np.int64)
            else:
                full = seeded((self.seed, epoch)).permutation(self.num_samples).astype(np.int64, copy=False)
            return full[index::count]
        # Whole groups go to one shard, so a group is never split between hosts.
        groups = np.arange(self.num_samples // self.group, dtype=np.int64)
        if self.shuffle:
            groups = seeded((self.seed, epoch)).permutation(groups)
        groups = groups[index::count]
        samples = (groups[:, None] * self.group + np.arange(self.group)).ravel()
        if not self.shuffle:
            return samples
        step = self.window * self.group
        for w, lo in enumerate(range(0, len(samples), step)):
            rng = seeded((self.seed, epoch, w))
            samples[lo : lo + step] = rng.permutation(samples[lo : lo + step])
        return samples

    def samples_per_epoch(self) -> int:
        index, count = self.shard
        if self.buckets is not None:
            return len(self.order(0))
        if self.groups is not None:
            b = self._bounds
            return int((b[1:] - b[:-1])[index::count].sum())
        if self.group == 1:
            return len(range(index, self.num_samples, count))
        return len(range(index, self.num_samples // self.group, count)) * self.group

    def cuts(self, epoch: int) -> np.ndarray:
        """With a budget: where each batch of ``epoch`` starts in its order, and the order's end."""
        if self.buckets is not None:
            return self._bucket_epoch(epoch)[2]
        cuts = self._cuts.get(epoch)
        if cuts is None:
            assert self.costs is not None and self.budget is not None
            total = np.cumsum(self.costs[self.order(epoch)])
            n, starts, s = len(total), [0], 0
            while s < n:  # a batch per step: the furthest end within the budget and batch_size
                end = int(np.searchsorted(total, (total[s - 1] if s else 0) + self.budget, side="right"))
                s = max(s + 1, min(end, s + self.batch_size))
                starts.append(s)
            if len(self._cuts) > 2:  # the epoch being cut, and one a late refill or state() may read
                del self._cuts[min(self._cuts)]
            cuts = self._cuts[epoch] = np.asarray(starts, dtype=np.int64)
        return cuts

    def batches_per_epoch(self, epoch: int = 0) -> int:
        """Batches an epoch holds (with a budget or buckets, ``epoch``'s own: orders differ; kept,
        so that ``state()`` counting through many epochs cuts none of them again)."""
        if self.cut:
            count = self._counts.get(epoch)
            if count is None:
                count = self._counts[epoch] = len(self.cuts(epoch)) - 1
            return count
        n, b = self.samples_per_epoch(), self.batch_size
        return n // b if self.drop_remainder else -(-n // b)

    def batches_per_pass(self, epochs: int) -> int:
        """``span_epochs``: the batches of ``epochs`` epochs back to back."""
        n, b = self.samples_per_epoch() * epochs, self.batch_size
        return n // b if self.drop_remainder else -(-n // b)


class EpochCursor:
    """Hands out one epoch's samples: whole batches first, then single samples to refill skips.

    With ``drop_remainder`` the last ``n % batch_size`` samples form no batch of their own but
    still refill batches whose samples were skipped, so a skip costs no other sample.
    """

    def __init__(self, plan: EpochPlan, epoch: int) -> None:
        self.epoch = epoch
        self.order = plan.order(epoch)
        self.batch_size = plan.batch_size
        n = len(self.order)
        self.limit = n - n % plan.batch_size if plan.drop_remainder and not plan.cut else n
        self.pos = 0  # next sample for a new batch
        self.tail = self.limit  # next sample of the dropped remainder
        self.cuts = plan.cuts(epoch) if plan.cut else None
        self.batch = 0  # with a budget: the next batch's number

    def seek(self, batch: int) -> None:
        """Start at batch ``batch`` of the epoch (resuming: the batches before were delivered)."""
        if self.cuts is not None:
            self.batch = min(batch, len(self.cuts) - 1)
            self.pos = int(self.cuts[self.batch])
        else:
            self.pos = min(batch * self.batch_size, self.limit)

    def has_batch(self) -> bool:
        return self.pos < self.limit

    def next_batch(self) -> tuple[list[int], list[int]]:
        """The samples of the next batch, and the epoch of each."""
        if self.cuts is not None:
            self.batch += 1
            end = int(self.cuts[self.batch])
        else:
            end = min(self.pos + self.batch_size, self.limit)
        samples = self.order[self.pos : end].tolist()
        self.pos = end
        return samples, [self.epoch] * len(samples)

    def refill(self) -> tuple[int, int] | None:
        """(sample, epoch) to take a skipped sample's place, or None when the epoch has no more (and
        always with a budget or buckets: another sample's size would not fit the skipped one's place)."""
        if self.cuts is not None:
            return None
        if self.pos < self.limit:
            self.pos += 1
            return int(self.order[self.pos - 1]), self.epoch
        if self.tail < len(self.order):
            self.tail += 1
            return int(self.order[self.tail - 1]), self.epoch
        return None

    def past(self, epoch: int) -> bool:
        """Has every batch of ``epoch`` been cut?"""
        return not self.has_batch()


class StreamCursor:
    """``span_epochs``: the orders of epochs ``pass_start .. pass_end - 1`` back to back
    (``pass_end=None``: for ever), cut into batches across epoch ends; an EpochCursor's interface.

    Positions count samples from the start of epoch 0. With ``drop_remainder`` the run's last
    ``total % batch_size`` samples form no batch, but refill skipped positions, as in an epoch.
    """

    def __init__(self, plan: EpochPlan, pos: int, pass_start: int, pass_end: int | None) -> None:
        self.plan = plan
        self.batch_size = plan.batch_size
        self.n = plan.samples_per_epoch()
        self.total: int | None = None if pass_end is None else pass_end * self.n  # None: endless
        self.limit = self.total
        if self.total is not None and plan.drop_remainder:
            self.limit = self.total - (self.total - pass_start * self.n) % self.batch_size
        self.pos = pos  # next sample for a new batch
        self.tail = self.limit  # next sample of the dropped remainder
        self._orders: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        """The epoch of the next sample."""
        return self.pos // self.n

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) > 2:  # the epoch being cut, and one a late refill may still read
                del self._orders[min(self._orders)]
            order = self._orders[epoch] = self.plan.order(epoch)
        return order

    def _at(self, pos: int) -> tuple[int, int]:
        epoch, i = divmod(pos, self.n)
        return int(self._order(epoch)[i]), epoch

    def has_batch(self) -> bool:
        return self.limit is None or self.pos < self.limit

    def next_batch(self) -> tuple[list[int], list[int]]:
        start, end = self.pos, self.pos + self.batch_size
        if self.limit is not None:
            end = min(end, self.limit)
        first, last = start // self.n, (end - 1) // self.n
        lo = start - first * self.n
        self.pos = end
        if first == last:
            return self._order(first)[lo : lo + end - start].tolist(), [first] * (end - start)
        orders = np.concatenate([self._order(e) for e in range(first, last + 1)])
        return orders[lo : lo + end - start].tolist(), (np.arange(start, end) // self.n).tolist()

    def refill(self) -> tuple[int, int] | None:
        if self.has_batch():
            self.pos += 1
            return self._at(self.pos - 1)
        if self.tail is not None and self.total is not None and self.tail < self.total:
            self.tail += 1
            return self._at(self.tail - 1)
        return None

    def past(self, epoch: int) -> bool:
        return self.pos >= (epoch + 1) * self.n or not self.has_batch()


def _settings(plan: EpochPlan) -> dict:
    mine = {"num_samples": plan.num_samples, "batch_size": plan.batch_size, "shuffle": plan.shuffle,
            "seed": plan.seed, "drop_remainder": plan.drop_remainder, "shard": list(plan.shard)}
    if plan.group > 1:
        mine.update(group=plan.group, group_window=plan.window)
    if plan.groups is not None:
        mine.update(groups=len(plan._bounds) - 1)
    if plan.span_epochs:
        mine.update(span_epochs=True)
    if plan.budget is not None:
        mine.update(batch_tokens=plan.budget)
    if plan.buckets is not None:
        mine.update(buckets=len(plan.buckets.batch_sizes))
    return mine


def plan_state(plan: EpochPlan, start: tuple[int, int], done: int, exact: bool) -> dict:
    """``Loader.state()``: the position ``done`` batches after ``start``, with the settings a
    resumed loader must share, as a small JSON-serialisable dict. ``start`` is (epoch, batch),
    or with ``span_epochs`` (epoch, sample position in it)."""
    if plan.span_epochs:
        n = plan.samples_per_epoch()
        epoch, offset = divmod(start[0] * n + start[1] + done * plan.batch_size, n)
        return {"version": 1, "epoch": epoch, "sample": offset, **_settings(plan), "exact": exact}
    if plan.cut:  # each epoch its own batch count
        epoch, batch = start[0], start[1] + done
        while batch and batch >= plan.batches_per_epoch(epoch):
            batch -= plan.batches_per_epoch(epoch)
            epoch += 1
        return {"version": 1, "epoch": epoch, "batch": batch, **_settings(plan), "exact": exact}
    per_epoch = plan.batches_per_epoch()
    position = start[1] + done
    return {"version": 1, "epoch": start[0] + (position // per_epoch if per_epoch else 0),
            "batch": position % per_epoch if per_epoch else 0, **_settings(plan), "exact": exact}


def _filled(plan: EpochPlan) -> bool:
    """Whether ``plan``'s batch_size is the one a loader given ``batch_tokens`` and no batch_size
    takes (``Loader.__init__``'s formula: as many as the budget lets the cheapest samples fill), for
    messages that should not name an option the user never set."""
    if plan.budget is None or plan.costs is None:
        return False
    return plan.batch_size == max(1, min(len(plan.costs), plan.budget // max(1, int(plan.costs.min(initial=1)))))


def check_state(plan: EpochPlan, state: dict) -> tuple[int, int]:
    """Where a loader resumed from ``state`` begins, as ``plan_state`` takes it; ValueError if the
    state was saved with other settings or is not a state at all (StateError, a ValueError)."""
    if not isinstance(state, dict) or state.get("version") != 1:
        raise StateError(f"state must be a dict returned by Loader.state(), got {type(state).__name__} "
                         f"{str(state)[:80]}")
    wrong = {k: (state.get(k), v) for k, v in _settings(plan).items() if state.get(k) != v}
    if state.get("span_epochs") and not plan.span_epochs:
        wrong["span_epochs"] = (True, False)
    if wrong:
        said = [f"{k}={a!r} (now {b!r})" for k, (a, b) in wrong.items() if k != "batch_size" or not _filled(plan)]
        if "batch_size" in wrong and _filled(plan):  # a batch_size the user did not give: the budget's
            a, b = wrong["batch_size"]
            said.append(f"the most samples a batch holds, as many as batch_tokens lets the cheapest samples fill: "
                        f"{a!r} (now {b!r})")
        raise StateError("state was saved by a loader with other settings, so its position means other "
                         "batches here: " + ", ".join(said))
    if plan.span_epochs:
        epoch, offset = int(state["epoch"]), int(state["sample"])
        if epoch < 0 or not 0 <= offset < plan.samples_per_epoch():
            raise StateError(f"state position epoch={epoch}, sample={offset} is outside an epoch of "
                             f"{plan.samples_per_epoch()} samples")
        return epoch, offset
    epoch, batch = int(state["epoch"]), int(state["batch"])
    if epoch < 0 or not 0 <= batch < max(1, plan.batches_per_epoch(max(epoch, 0))):
        raise StateError(f"state position epoch={epoch}, batch={batch} is outside an epoch of "
                         f"{plan.batches_per_epoch(max(epoch, 0))} batches")
    return epoch, batch
