"""shmloader: decode video clips in a process pool into a shared-memory ring, zero-copy into tf.data,
PyTorch (``loader.as_torch()``, ``shmloader.torch``), JAX (``shmloader.jax``) or Keras 3
(``loader.as_keras()``). Each framework is imported by its adapter alone, on first use."""

import os as _os

if _os.environ.pop("SHMLOADER_WORKER_STARTING", None):  # engine.pool.WORKER_ENV: this is a worker starting
    import signal as _signal

    # Ctrl-C reaches the whole process group; only the training process reports it. Ignored
    # here, before the imports below, not only once the worker's main() runs.
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)

from typing import TYPE_CHECKING

# Where each public name lives. Imported on first use (PEP 562): ``import shmloader`` and every
# worker process's start-up import only what they touch (a worker imports this package first,
# then what its source needs).
_WHERE = {"ArraySource": "._arrays", "HDF5Source": "._arrays", "Calibration": "._calibrate",
          "CalibrationRow": "._calibrate", "calibrate": "._calibrate", "LoaderError": "._errors",
          "SampleError": "._errors", "StateError": "._errors", "WorkerDiedError": "._errors",
          "FunctionSource": "._function", "Loader": "._loader", "eval_loader": "._loader",
          "VideoClips": ".clips.description", "Audio": ".clips.options", "Pixels": ".clips.options",
          "Reading": ".video.reading", "Sampling": ".clips.options", "prepare": ".tools.prepare"}

if TYPE_CHECKING:
    from ._arrays import ArraySource, HDF5Source
    from ._calibrate import Calibration, CalibrationRow, calibrate
    from ._errors import LoaderError, SampleError, StateError, WorkerDiedError
    from ._function import FunctionSource
    from ._loader import Loader, eval_loader
    from .clips.description import VideoClips
    from .clips.options import Audio, Pixels, Sampling
    from .video.reading import Reading
    from .tools.prepare import prepare


if not TYPE_CHECKING:  # type checkers see the names above, and nothing else
    def __getattr__(name: str):
        """A public name, or a subpackage or module (``shmloader.qwen``, ``shmloader.samples``),
        imported on first use."""
        import importlib

        from ._lazy import submodule

        where = _WHERE.get(name)
        value = getattr(importlib.import_module(where, __name__), name) if where else submodule(__name__, name)
        globals()[name] = value  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


__all__ = ["ArraySource", "Audio", "Calibration", "CalibrationRow", "FunctionSource", "HDF5Source", "Loader",
           "LoaderError", "Pixels", "Reading", "SampleError", "Sampling", "StateError", "VideoClips", "WorkerDiedError",
           "calibrate", "eval_loader", "prepare"]
__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic), CHANGELOG.md names it
