"""The tf.data adapter. The only module that imports TensorFlow."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from ._errors import install_hint

try:
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - exercised in a child interpreter by the tests
    raise ImportError(f"loader.as_dataset() and shmloader.tfdata need TensorFlow: {install_hint('tf')} "
                      "(tensorflow-cpu>=2.16), or TensorFlow's GPU build: pip install tensorflow") from e

from ._batches import Batches

# A loader as the caller's make_loader builds it: the list handed back holds that type.
L = TypeVar("L", bound=Batches)

AUTOTUNE = tf.data.AUTOTUNE


def output_signature(loader: Batches) -> dict[str, tf.TensorSpec]:
    # An object field (a bucketed source's captions) holds str: a string tensor.
    return {name: tf.TensorSpec(shape, tf.string if dtype == object else tf.as_dtype(dtype), name=name)
            for name, (shape, dtype) in loader.element_spec.items()}


def as_dataset(loader: Batches, prefetch: int | None = AUTOTUNE) -> tf.data.Dataset:
    """``from_generator`` over the loader: TF aliases the yielded slots (no copy), and each
    slot returns to the ring when TF lets go of its tensors (NOTE [ Slot lease ])."""
    ds = tf.data.Dataset.from_generator(loader.__iter__, output_signature=output_signature(loader))
    if prefetch is not None and prefetch != 0:
        ds = ds.prefetch(prefetch)
    return ds


def distributed_dataset(strategy: tf.distribute.Strategy, make_loader: Callable[[int], L], global_batch_size: int
                        ) -> tuple[tf.distribute.DistributedDataset, list[L]]:
    """``strategy.distribute_datasets_from_function`` over one loader per input pipeline (host).

    ``make_loader(batch_size)`` builds the loader with the per-replica batch size; each pipeline
    serves its own shard of every epoch, so the hosts together see each sample once per epoch.
    Returns the distributed dataset and the list of loaders built here (close them when done).
    """
    loaders: list[L] = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        loader = make_loader(ctx.get_per_replica_batch_size(global_batch_size))
        loaders.append(loader)
        return loader.as_dataset(input_context=ctx)

    return strategy.distribute_datasets_from_function(dataset_fn), loaders


class LoaderCheckpoint(tf.keras.callbacks.Callback):  # type: ignore[misc]  # TensorFlow ships no types
    """Write ``loader.state()`` as JSON to ``path`` at the end of every Keras epoch.

    tf.data cannot checkpoint a ``from_generator`` pipeline, so save the loader's position next
    to the model checkpoint: the count is of batches Keras really trained on, not of batches
    sitting in the prefetch buffer. Resume with ``Loader(..., state=json.load(open(path)))`` and
    ``model.fit(..., initial_epoch=...)``.
    """

    def __init__(self, loader: Batches, path: str) -> None:
        super().__init__()
        self.loader = loader
        self.path = path
        self.steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.steps += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        import json
        import os

        state = self.loader.state(consumed=self.steps)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.path)
