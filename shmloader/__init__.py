"""shmloader: decode video clips in a process pool into a shared-memory ring, zero-copy into tf.data,
PyTorch (``loader.as_torch()``, ``shmloader.torch``), JAX (``shmloader.jax``) or Keras 3
(``loader.as_keras()``). Each framework is imported by its adapter alone, on first use."""

from ._arrays import ArraySource, HDF5Source
from ._errors import LoaderError, SampleError, WorkerDiedError
from ._function import FunctionSource
from ._loader import Loader, eval_loader
from ._video import VideoClips

__all__ = ["ArraySource", "FunctionSource", "HDF5Source", "Loader", "LoaderError", "SampleError", "VideoClips", "WorkerDiedError", "eval_loader"]
__version__ = "0.1.0"
