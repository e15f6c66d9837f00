"""shmloader: decode video clips in a process pool into a shared-memory ring, zero-copy into tf.data,
PyTorch (``loader.as_torch()``, ``shmloader.torch``), JAX (``shmloader.jax``) or Keras 3
(``loader.as_keras()``). Each framework is imported by its adapter alone, on first use."""

import os as _os

if _os.environ.pop("SHMLOADER_WORKER_STARTING", None):  # engine.pool.WORKER_ENV: this is a worker starting
    import signal as _signal

    # Ctrl-C reaches the whole process group; only the training process reports it. Ignored
    # here, before the imports below, not only once the worker's main() runs.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)

from ._arrays import ArraySource, HDF5Source
from ._calibrate import Calibration, CalibrationRow, calibrate
from ._errors import LoaderError, SampleError, StateError, WorkerDiedError
from ._function import FunctionSource
from ._loader import Loader, eval_loader
from .video.clips import VideoClips
from .video.options import Audio, Pixels, Reading, Sampling
from .tools.prepare import prepare

__all__ = ["ArraySource", "Audio", "Calibration", "CalibrationRow", "FunctionSource", "HDF5Source", "Loader",
           "LoaderError", "Pixels", "Reading", "SampleError", "Sampling", "StateError", "VideoClips", "WorkerDiedError",
           "calibrate", "eval_loader", "prepare"]
__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic), CHANGELOG.md names it
