"""TensorFlow helpers (importing this module imports TensorFlow).

``as_dataset(loader)`` is ``loader.as_dataset()``; ``distributed_dataset`` builds one loader per
input pipeline under a ``tf.distribute`` strategy; ``LoaderCheckpoint`` saves the loader's
position with each Keras epoch.
"""

from ._tf import LoaderCheckpoint, as_dataset, distributed_dataset

__all__ = ["LoaderCheckpoint", "as_dataset", "distributed_dataset"]
