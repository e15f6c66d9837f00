"""What the framework adapters need of a loader, as a protocol.

``Loader.as_torch()``, ``as_dataset()`` and ``as_keras()`` import their adapter (``torch``,
``_tf``, ``_keras``) when first called; the adapters type the loader they wrap with
:class:`Batches` instead of importing ``_loader`` back, so imports go one way and a third
framework's adapter needs nothing but these few methods.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import numpy as np

__all__ = ["Batches"]


class Batches(Protocol):
    """A loader as its adapters see it: batches of arrays and its position in the stream."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]: ...

    def __len__(self) -> int: ...

    @property
    def element_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def state(self, consumed: int | None = None) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def set_shard(self, index: int, count: int) -> None: ...

    def as_dataset(self, prefetch: int | None = -1, input_context: Any = None) -> Any: ...
