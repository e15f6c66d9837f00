"""The JAX adapter: ``shmloader.jax.batches(loader)``. The only module that imports JAX.

``jax.device_put`` keeps the numpy array it was given alive until the transfer is done, and on
the CPU backend the ``jax.Array`` simply wraps the array's memory (no copy) for as long as it
lives. Either way the slot's lease holds (NOTE [ Slot lease ] in ``engine.ring``): a slot is written
again only when the arrays made from it are gone.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Iterator

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
            prefetch: int | None = None) -> Iterator[dict[str, jax.Array]]:
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
    batches more than that have been delivered.
    """
    if shard is None and jax.process_count() > 1:
        shard = (jax.process_index(), jax.process_count())
    if shard is not None:
        loader.set_shard(int(shard[0]), int(shard[1]))
    if prefetch is None:
        prefetch = 0 if _platforms(sharding) == {"cpu"} else _PREFETCH
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    return _batches(loader, sharding, prefetch)


def _batches(loader: Batches, sharding: Any, prefetch: int) -> Iterator[dict[str, jax.Array]]:
    ahead: deque[dict[str, jax.Array]] = deque()
    for batch in loader:
        ahead.append(jax.device_put(batch, sharding))
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
