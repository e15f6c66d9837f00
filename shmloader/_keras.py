"""The Keras 3 adapter: ``loader.as_keras()``. The only module that imports Keras.

A ``keras.utils.PyDataset`` is what ``model.fit`` takes on every backend (tensorflow, jax,
torch). Its batches are the loader's numpy views, handed over without a copy: each backend
turns them into its own tensors (tf.data's ``from_generator``, ``jax.device_put``,
``torch.as_tensor``), all of which keep the array alive while their tensor lives, so the slot
lease holds (NOTE [ Slot lease ] in ``engine.ring``).

NOTE [ Keras probes ]
The loader is a stream: ``dataset[i]`` is the next batch whatever ``i`` (Keras shuffles the
indices of a PyDataset, and the loader already shuffled the clips). But Keras asks for batches
it does not train on before the first epoch: on the tensorflow backend two per dataset, outside
any epoch, to learn the tensor specs; on jax and torch one, between ``on_epoch_begin`` and
``on_epoch_end``, to build the model. Served and forgotten, they would shift every epoch and
never be trained on. So the first ``_PROBE_BATCHES`` batches served outside an epoch, or inside
an epoch that ends after fewer batches than ``len(dataset)`` and at most ``_PROBE_BATCHES``, are
served again first. (A ``steps_per_epoch`` of 1 or 2 below ``len(dataset)`` would look like a
probe: leave ``steps_per_epoch`` unset.)
Keras before 3.5 calls no ``on_epoch_begin`` of a PyDataset, so no window can be told from
another: the adapter needs 3.5 (``_KERAS``). Before Keras 3.15 the jax backend builds the model
on two batches inside an epoch, which in a dataset of two batches looks like a whole epoch: on
that backend ``as_keras`` needs Keras 3.15 (``_JAX_KERAS``). The oldest lane tests 3.5.0.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ._errors import LoaderError, install_hint

try:
    import keras
except ImportError as e:  # pragma: no cover - exercised in a child interpreter by the tests
    raise ImportError(f"loader.as_keras() needs Keras 3: {install_hint('keras')}") from e

# NOTE [ Keras probes ]: the first Keras whose PyDataset hears of its epochs, and the first whose
# jax backend builds the model on one batch.
_KERAS, _JAX_KERAS = (3, 5), (3, 15)
_KERAS_VERSION = tuple(int(p) for p in keras.__version__.split(".")[:2])
if _KERAS_VERSION < _KERAS:
    raise ImportError(f"loader.as_keras() needs Keras 3.5 or newer, found keras {keras.__version__}: "
                      f"{install_hint('keras')}")


if TYPE_CHECKING:
    from ._batches import Batches

__all__ = ["KerasDataset", "as_keras"]

# Batches Keras may take before training: the tensorflow backend's tensor-spec probe takes
# keras' NUM_BATCHES_FOR_TENSOR_SPEC (2); the jax and torch backends' model build takes 1.
_PROBE_BATCHES = 2

Names = str | Sequence[str] | None


def as_keras(loader: Batches, x: Names = "video", y: Names = "label") -> KerasDataset:
    """A ``keras.utils.PyDataset`` of ``(batch[x], batch[y])`` (see ``KerasDataset``)."""
    return KerasDataset(loader, x=x, y=y)


class KerasDataset(keras.utils.PyDataset):  # type: ignore[misc]  # Keras ships no types
    """The loader's batches as ``(inputs, targets)`` for ``model.fit`` / ``evaluate`` / ``predict``.

    ``x`` and ``y`` name the fields: a name gives that array, a list of names a dict of arrays
    (for models with named inputs or outputs), ``y=None`` inputs only. ``len(dataset)`` is the
    loader's batches per epoch; each Keras epoch takes the next ``len`` batches of the stream,
    running the loader's next pass when one ends, so ``Loader(epochs=1)`` with
    ``fit(epochs=10)`` trains ten different epochs. Keras' parallelism is off
    (``workers=1``): the loader's worker processes decode.
    """

    def __init__(self, loader: Batches, x: Names = "video", y: Names = "label") -> None:
        if keras.backend.backend() == "jax" and _KERAS_VERSION < _JAX_KERAS:
            raise ImportError(f"loader.as_keras() on the jax backend needs Keras {'.'.join(map(str, _JAX_KERAS))} or "
                              f"newer, found keras {keras.__version__}: earlier Keras builds the model on two "
                              "batches that the loader cannot tell from an epoch. pip install -U keras (3.15 "
                              "needs Python 3.11+), or the tensorflow or torch backend")
        super().__init__(workers=1, use_multiprocessing=False)
        fields = set(loader.element_spec)
        for names in (x, y):
            for name in _as_list(names):
                if name not in fields:
                    raise ValueError(f"no field {name!r} in the loader's batches; they have {sorted(fields)}")
        if x is None:
            raise ValueError("x must name at least one field")
        self._loader = loader
        self._x: str | Sequence[str] = x
        self._y = y
        self._stream: Iterator[dict[str, np.ndarray]] | None = None
        self._in_epoch = False
        self._served = 0  # batches served since the current epoch (or probe) began
        self._kept: list[tuple[Any, ...]] = []  # the first of them, in case they were a probe
        self._replay: deque[tuple[Any, ...]] = deque()  # probed batches, served again first

    @property
    def loader(self) -> Batches:
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        batch = self._replay.popleft() if self._replay else self._pack(self._next())
        self._served += 1
        if self._served <= _PROBE_BATCHES:
            self._kept.append(batch)
        else:
            self._kept.clear()  # a real epoch: nothing to serve again
        return batch

    def on_epoch_begin(self) -> None:
        self._end_window()
        self._in_epoch = True

    def on_epoch_end(self) -> None:
        self._end_window()
        self._in_epoch = False

    # ---------------------------------------------------------------- internals
    def _end_window(self) -> None:
        """NOTE [ Keras probes ]: batches Keras took outside an epoch, or in an epoch it cut
        short after at most ``_PROBE_BATCHES``, are served again."""
        probe = self._served and self._served <= _PROBE_BATCHES and (
            not self._in_epoch or self._served < len(self))
        if probe:
            self._replay.extendleft(reversed(self._kept))
        self._kept = []
        self._served = 0

    def _next(self) -> dict[str, np.ndarray]:
        for _ in range(2):
            if self._stream is None:
                self._stream = iter(self._loader)
            batch = next(self._stream, None)
            if batch is not None:
                return batch
            self._stream = None  # the pass is over: the next one starts
        raise LoaderError("the loader delivered no batch in a whole pass")

    def _pack(self, batch: dict[str, np.ndarray]) -> tuple[Any, ...]:
        x = _select(batch, self._x)
        return (x,) if self._y is None else (x, _select(batch, self._y))


def _as_list(names: Names) -> list[str]:
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def _select(batch: dict[str, np.ndarray], names: str | Sequence[str]) -> np.ndarray | dict[str, np.ndarray]:
    return batch[names] if isinstance(names, str) else {name: batch[name] for name in names}
