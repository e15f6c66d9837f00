"""The JAX adapter: ``shmloader.jax.batches(loader)``. The only module that imports JAX.

``jax.device_put`` keeps the numpy array it was given alive until the transfer is done, and on
the CPU backend the ``jax.Array`` simply wraps the array's memory (no copy) for as long as it
lives. Either way the slot's lease holds (NOTE [ Slot lease ] in ``engine.ring``): a slot is written
again only when the arrays made from it are gone.

A bucketed source's batch (``shmloader.opensora``) has its bucket's static shape: a jitted step
compiles once per bucket; its captions stay numpy arrays of str.

A batch of samples of several sizes (``Loader(batch_tokens=N)``, NOTE [ Samples of several sizes ]
in ``engine.source``) changes shape from batch to batch, and a jitted step would compile once per
shape. ``batches`` pads it instead: each field of rows to the smallest of a few static sizes that
holds it (the room a slot has for it, halved ``levels - 1`` times), the batch axis to
``loader.batch_size`` (padding samples hold no rows: their offsets repeat the last), with
``sample_mask`` saying which samples are real: a step compiles at most ``levels`` times.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ._errors import install_hint

try:
    import jax
except ImportError as e:  # pragma: no cover - exercised in a child interpreter by the tests
    raise ImportError(f"shmloader.jax needs JAX: {install_hint('jax')} (CPU), or JAX for your "
                      "accelerator") from e

if TYPE_CHECKING:
    from ._batches import Batches

__all__ = ["batches"]

# Batches put on an accelerator ahead of the one handed out (flax's prefetch_to_device uses 2):
# the transfers are asynchronous, so the next batch travels while the current step runs. On the
# CPU backend device_put copies nothing, and batches held ahead would only hold ring slots.
_PREFETCH = 2


def batches(loader: Batches, sharding: Any = None, *, shard: tuple[int, int] | None = None,
            prefetch: int | None = None, levels: int = 4) -> Iterator[dict[str, jax.Array]]:
    """Yield the loader's batches as dicts of ``jax.Array``, through ``jax.device_put``.

    ``sharding``: where the arrays go: ``None`` (the default device), a device, or a
    ``jax.sharding.Sharding`` over this process's devices (e.g. a ``NamedSharding`` that splits
    the batch axis; the batch must then divide evenly: ``drop_remainder=True``).
    ``shard``: ``(index, count)`` of the loader's shards to serve; by default
    ``(jax.process_index(), jax.process_count())`` when there are several processes, so that
    each host reads its own part of every epoch. ``prefetch``: batches put ahead; by default 2
    on an accelerator and 0 on the CPU backend (where the arrays are the slots themselves).

    One call runs one pass of the loader (``epochs`` epochs), as iterating it does. For resuming,
    save ``loader.state(consumed=steps)`` with the number of steps really trained: ``prefetch``
    batches more than that have been delivered. ``levels``: the static sizes a field of rows is
    padded to, for samples of several sizes (see the module's docstring).
    """
    if shard is None and jax.process_count() > 1:
        shard = (jax.process_index(), jax.process_count())
    if shard is not None:
        loader.set_shard(int(shard[0]), int(shard[1]))
    if prefetch is None:
        prefetch = 0 if _platforms(sharding) == {"cpu"} else _PREFETCH
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    layout = getattr(loader, "layout", None)
    pad = None
    if layout is not None and layout.has_rows and getattr(loader, "buckets", None) is None:
        # (a bucketed source's batches have their bucket's static shape already: one compile each)
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        pad = _Padding(layout, levels)
    return _batches(loader, sharding, prefetch, pad)


class _Padding:
    """Pads a batch of samples of several sizes to static shapes (see the module's docstring)."""

    def __init__(self, layout: Any, levels: int) -> None:
        self.batch = layout.batch_size
        self.rows = {f.name: f.offsets for f in layout.fields if f.offsets}
        self.offsets = set(self.rows.values())
        self.sizes = {name: sorted({max(1, -(-layout.capacity(name) // 2**k)) for k in range(levels)})
                      for name in self.rows}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch[next(iter(self.offsets))]) - 1
        out = {}
        for name, a in batch.items():
            if name in self.offsets:
                out[name] = np.concatenate([a, np.full(self.batch - n, a[-1], a.dtype)])
            else:
                size = next(s for s in self.sizes[name] if s >= len(a)) if name in self.rows else self.batch
                out[name] = np.zeros((size, *a.shape[1:]), a.dtype)
                out[name][: len(a)] = a
        out["sample_mask"] = np.arange(self.batch) < n
        return out


def _batches(loader: Batches, sharding: Any, prefetch: int, pad: _Padding | None
             ) -> Iterator[dict[str, Any]]:
    ahead: deque[dict[str, Any]] = deque()  # jax.Array, and a bucketed source's captions (str)
    for batch in loader:
        batch = batch if pad is None else pad(batch)
        host = {k: v for k, v in batch.items() if v.dtype == object}  # str (captions) stay on the host
        ahead.append({**jax.device_put({k: v for k, v in batch.items() if k not in host}, sharding), **host})
        del batch  # jax holds the views it needs; the slot comes back with the arrays
        if len(ahead) > prefetch:
            yield ahead.popleft()
    while ahead:
        yield ahead.popleft()


def _platforms(sharding: Any) -> set[str]:
    """The platforms ``device_put(x, sharding)`` puts arrays on."""
    if sharding is None:
        return {jax.devices()[0].platform}
    if isinstance(sharding, jax.sharding.Sharding):
        return {d.platform for d in sharding.device_set}  # type: ignore[attr-defined]
    return {getattr(sharding, "platform", "")}
