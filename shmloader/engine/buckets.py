"""Batches of one bucket each: the epoch plan of a source whose samples change shape per epoch.

NOTE [ Buckets ]
A video-generation model trains on several shapes at once (resolutions, frame counts, aspect
ratios) and each batch holds one of them, a *bucket*, with that bucket's own batch size so that
every batch costs the accelerator about the same. Which bucket a sample falls in may change with
the epoch (a bucket kept with some probability, drawn per sample and epoch). A bucketed source
has ``buckets()``: a ``Buckets`` that says, for ``K`` buckets, each one's batch size, the rows one
sample of it holds of each field of rows and the shape those rows take, and ``assign(seed,
epoch)``: every sample's bucket that epoch (``-1``: none, left out of that epoch). Its spec holds
a field ``bucket`` (int64): the loader writes each sample's bucket there before a worker reads
it, so the worker reads the sample at the bucket's shape without drawing it again.

The plan of an epoch (``bucket_plan``): each bucket's samples in index order, their count made a
multiple of its batch size (padded with the bucket's first samples again, as often as it takes,
or the remainder dropped with ``drop_remainder``; Open-Sora's sampler pads once from the front,
so there a bucket of under half a batch gives no batch at all), shuffled; the batches of every bucket in one list, shuffled;
its length made a multiple of the shards (padded with its first batches, or cut); shard ``i``
takes every n-th batch from ``i``, so the shards of a step hold one batch each, as data-parallel
ranks need. The batches go out in that order, each of its bucket's size; the loader delivers a
field of rows shaped as the bucket says (``video`` ``[B, T, H, W, 3]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from .._checks import check_int
from .source import Sizes, checked_sizes, seeded

__all__ = ["BUCKET", "Bucketed", "Buckets", "batching", "bucket_plan", "place", "shaped", "shaped_spec"]

BUCKET = "bucket"  # the spec field each sample's bucket is written to, before it is read


@dataclass(frozen=True)
class Buckets:
    """A bucketed source's buckets (NOTE [ Buckets ]): ``batch_sizes`` ``[K]``; ``rows``: field of
    rows -> ``[K]`` rows a sample of each bucket holds; ``shapes``: field of rows -> ``[K, d]``, the
    shape those rows take in a delivered batch (before the row's own shape); ``names``: each
    bucket in words; ``assign(seed, epoch)``: each sample's bucket that epoch, ``-1`` for none."""

    batch_sizes: np.ndarray
    rows: dict[str, np.ndarray]
    shapes: dict[str, np.ndarray]
    names: tuple[str, ...]
    assign: Callable[[int, int], np.ndarray] = field(compare=False)
    pad: bool = True
    """Pad each bucket's last batch with repeats (training); False: leave it short (evaluation:
    every sample once)."""

    def __post_init__(self) -> None:
        k = len(self.batch_sizes)
        if k == 0 or int(np.min(self.batch_sizes)) < 1:
            raise ValueError("buckets need a batch size of at least 1 each")
        for name, rows in self.rows.items():
            shape = self.shapes.get(name)
            if np.shape(rows) != (k,) or shape is None or len(shape) != k:
                raise ValueError(f"buckets: field {name!r} needs rows and a shape for each of the {k} buckets")
            if not np.array_equal(np.prod(shape, axis=1), rows):
                raise ValueError(f"buckets: field {name!r}'s shapes do not hold its rows")

    def capacity(self) -> dict[str, int]:
        """The rows the largest batch of any bucket holds, per field of rows: a ring slot's room."""
        return {name: int(np.max(self.batch_sizes * rows)) for name, rows in self.rows.items()}


@runtime_checkable
class Bucketed(Protocol):
    """A source whose batches hold one bucket each (NOTE [ Buckets ])."""

    def buckets(self) -> Buckets: ...


def bucket_plan(ids: np.ndarray, batch_sizes: np.ndarray, *, seed: int, epoch: int, shuffle: bool,
                drop_remainder: bool, shard: tuple[int, int], pad: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's order of samples and where each batch starts in it (and the order's end), for
    samples in buckets ``ids`` (``-1``: none) of ``batch_sizes``, served to ``shard`` (index,
    count): NOTE [ Buckets ]. ``pad=False``: a bucket's last batch is left short instead."""
    rng = seeded((seed, epoch, 0, 1)) if shuffle else None  # apart from every sample's stream (seed, epoch, i)
    ids = np.asarray(ids, np.int64)
    members = np.argsort(ids, kind="stable")
    counts = np.bincount(ids[ids >= 0], minlength=len(batch_sizes))
    at = int(np.count_nonzero(ids < 0))  # the sort puts the samples of no bucket first
    batches: list[np.ndarray] = []
    for k, count in enumerate(counts.tolist()):
        mine, at = members[at : at + count], at + count
        size = int(batch_sizes[k])
        left = count % size
        if left and drop_remainder:
            mine = mine[: count - left]
        elif left and pad:
            mine = np.resize(mine, count + size - left)  # the bucket's first samples again
        if rng is not None:
            mine = rng.permutation(mine)
        batches.extend(np.split(mine, range(size, len(mine), size)) if len(mine) else [])
    access = rng.permutation(len(batches)) if rng is not None else np.arange(len(batches))
    index, shards = shard
    left = len(access) % shards
    if left and drop_remainder:
        access = access[: len(access) - left]
    elif left:
        access = np.resize(access, len(access) + shards - left)  # the first batches again
    mine_batches = [batches[j] for j in access[index::shards].tolist()]
    order = np.concatenate(mine_batches) if mine_batches else np.zeros(0, np.int64)
    cuts = np.concatenate([[0], np.cumsum([len(b) for b in mine_batches], dtype=np.int64)]).astype(np.int64)
    return order.astype(np.int64, copy=False), cuts


def shaped(batch: dict[str, np.ndarray], buckets: Buckets, layout: Any,
           extras: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """A bucketed source's batch with each field of rows in its bucket's shape (``video``
    ``[B, T, H, W, 3]``, a view of the slot), without the offsets, and what the source adds from
    the main process (``extras(index)``: captions, str in an object array)."""
    k = int(batch[BUCKET][0])
    n = len(batch[BUCKET])
    for f in layout.fields:
        if f.offsets:
            batch[f.name] = batch[f.name].reshape(n, *buckets.shapes[f.name][k].tolist(), *f.shape)
            del batch[f.offsets]
    if extras is not None:
        batch.update(extras(batch["index"]))
    return batch


def shaped_spec(layout: Any, buckets: Buckets, extras: Callable[[np.ndarray], dict[str, np.ndarray]] | None
                ) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
    """``Loader.element_spec`` of a bucketed source: every batch axis and bucket dimension None."""
    spec: dict[str, tuple[tuple[int | None, ...], np.dtype]] = {
        f.name: ((None, *(None,) * buckets.shapes[f.name].shape[1], *f.shape) if f.offsets else (None, *f.shape),
                 f.dtype) for f in layout.fields if not f.is_offsets}
    if extras is not None:
        spec.update({k: ((None, *v.shape[1:]), v.dtype) for k, v in extras(np.zeros(0, np.int64)).items()})
    return spec


def batching(source: Any, batch_size: int | None, batch_tokens: int | None
              ) -> tuple[Buckets | None, Sizes | None, int]:
    """A loader's batches as its arguments and source say: a bucketed source's buckets (NOTE [
    Buckets ] in ``engine.buckets``), the sizes of samples of several sizes, the most samples a
    batch holds."""
    buckets = source.buckets() if isinstance(source, Bucketed) else None
    if buckets is not None:
        if batch_size is not None or batch_tokens is not None:
            raise ValueError("a bucketed source gives each batch its bucket's batch size (the bucket "
                             "config's): pass neither batch_size= nor batch_tokens=")
        return buckets, None, int(np.max(buckets.batch_sizes))
    if batch_tokens is not None:
        check_int("batch_tokens", batch_tokens, 1)
    elif batch_size is None:
        raise TypeError("Loader() needs batch_size= (samples per batch) or batch_tokens= (a budget)")
    if batch_size is not None:
        check_int("batch_size", batch_size, 1)
    sizes = checked_sizes(source, batch_tokens)
    if batch_size is None:  # as many as the budget lets the cheapest samples fill
        assert sizes is not None and batch_tokens is not None
        batch_size = max(1, min(len(sizes.cost), batch_tokens // max(1, int(sizes.cost.min(initial=1)))))
    return None, sizes, batch_size



def place(ring: Any, slot: int, plan: Any, sizes: Sizes | None, epoch: int, samples: list[int]) -> None:
    """Write where each of a batch's ``samples`` puts its rows into ``ring``'s ``slot``
    (``Layout.place``), and reserve them (``Ring.fit``), before any of its tasks goes out; a
    bucketed source's samples, their bucket too (NOTE [ Buckets ])."""
    layout, views = ring.layout, ring.slot_views[slot]
    fields = [f.name for f in layout.fields if f.offsets]
    if plan.buckets is None:
        assert sizes is not None
        layout.place(views, {name: sizes.rows[name][samples] for name in fields})
    else:
        ids = plan.bucket_of(epoch, samples)
        views[BUCKET][: len(ids)] = ids
        layout.place(views, {name: plan.buckets.rows[name][ids] for name in fields})
    ring.fit(slot, len(samples))
