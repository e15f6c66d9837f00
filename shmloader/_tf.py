"""The tf.data adapter. The only module that imports TensorFlow."""

from __future__ import annotations

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def output_signature(loader) -> dict[str, tf.TensorSpec]:
    return {name: tf.TensorSpec(shape, tf.as_dtype(dtype), name=name)
            for name, (shape, dtype) in loader.element_spec.items()}


def as_dataset(loader, prefetch: int | None = AUTOTUNE) -> tf.data.Dataset:
    """``from_generator`` over the loader: TF aliases the yielded slots (no copy), and each
    slot returns to the ring when TF lets go of its tensors (NOTE [ Slot lease ])."""
    ds = tf.data.Dataset.from_generator(loader.__iter__, output_signature=output_signature(loader))
    if prefetch is not None and prefetch != 0:
        ds = ds.prefetch(prefetch)
    return ds
