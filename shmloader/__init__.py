"""shmloader: decode video clips in a process pool into a shared-memory ring, zero-copy into tf.data."""

from ._errors import LoaderError, SampleError, WorkerDiedError
from ._function import FunctionSource
from ._loader import Loader
from ._video import VideoClips

__all__ = ["FunctionSource", "Loader", "LoaderError", "SampleError", "VideoClips", "WorkerDiedError"]
__version__ = "0.1.0"
