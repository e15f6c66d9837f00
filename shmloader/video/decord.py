"""decord, one of the two decoders (``video.decoders``), imported without the CUDA stack it does
not need here.

decord2 3.4's import (``decord/_ffi/base.py``, ``_preload_cuda_libs``) dlopens every shared
library under ``site-packages/nvidia/*/lib`` with RTLD_GLOBAL whenever the ``nvidia`` namespace
package is found, i.e. wherever PyTorch's CUDA build is installed: cuBLASLt, cuFFT, cuDNN, NCCL...
~370 MiB private memory in every worker that imports it, where the CPU decoder, all shmloader
uses, needs none of them (15 MiB). decord looks the package up with
``importlib.util.find_spec("nvidia")`` and, where it finds nothing, loads nothing: so while decord
imports, ``sys.modules["nvidia"]`` is None, which makes ``find_spec`` answer None (and ``import
nvidia`` fail) in this process, and nothing else. A CUDA build of decord2 (``+cuXXX`` wheels),
whose library does need those runtimes, fails to load without them; it is then imported again
the way decord means it to be.
"""

from __future__ import annotations

import collections
import ctypes
import sys
from types import ModuleType
from typing import overload

import numpy as np

from .decoders import DecoderLimit, FrameSink, scratch
from .probe import VideoInfo

__all__ = ["Decord", "import_decord"]

# Files whose keyframes decord's index gave (a scan manifest's rows hold none) kept per worker.
_KEYFRAMES_KEPT = 1024
# Frames one get_batch call decodes for a FrameSink: the reader goes on from where it stopped, so
# reading in parts decodes no frame twice and holds a few frames rather than the whole read.
_SINK_FRAMES = 8


def import_decord() -> ModuleType:
    """``import decord``, without preloading the pip-installed CUDA libraries where they are
    not needed (see the module docstring)."""
    if "decord" in sys.modules:
        return sys.modules["decord"]
    hide = "nvidia" not in sys.modules
    if hide:
        sys.modules["nvidia"] = None  # type: ignore[assignment]
    try:
        import decord
    except OSError:  # a CUDA build of decord: its library needs the runtimes it preloads
        if not hide:
            raise
        for name in [n for n in sys.modules if n == "decord" or n.startswith("decord.")]:
            del sys.modules[name]
        del sys.modules["nvidia"]
        hide = False
        import decord
    finally:
        if hide and "nvidia" in sys.modules and sys.modules["nvidia"] is None:
            del sys.modules["nvidia"]
    return decord


class Decord:
    """decord's reader: one ``get_batch`` over the sorted frames, copied once into ``out``."""

    name = "decord"

    def __init__(self, threads: int) -> None:
        from ..engine.native_log import capturing
        from ._av import ffmpeg_logs_to_stderr

        decord = import_decord()  # first: decord's own import, without the CUDA stack
        if capturing():  # a loader's worker: decord's FFmpeg lines reach native_log with every av
            ffmpeg_logs_to_stderr()
        from decord._ffi.base import _LIB, check_call

        self._decord = decord
        # decord's refusals: its C++ errors, and the RuntimeError its VideoReader raises when it
        # cannot open a file at all ("Error reading <path>..."), whichever the bytes give.
        self.Error: tuple[type[Exception], ...] = (decord.DECORDError, RuntimeError)
        self._copy = lambda nd, ptr, n: check_call(_LIB.DECORDArrayCopyToBytes(nd.handle, ptr, n))
        self._threads = threads
        self._buf: np.ndarray | None = None
        # path -> keyframe indices, from the reader's index, where the probe knew none: what
        # ``Loader.stats()`` counts frames decoded per delivered frame from
        self.keyframes: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    @overload
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray: ...
    @overload
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: FrameSink) -> FrameSink: ...
    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | FrameSink | None = None) -> np.ndarray | FrameSink:
        if size is None:
            reader = self._decord.VideoReader(info.path, num_threads=self._threads)
        else:
            reader = self._decord.VideoReader(info.path, width=size[1], height=size[0], num_threads=self._threads)
        try:
            if info.keyframes is None and info.path not in self.keyframes:
                self.keyframes[info.path] = np.asarray(reader.get_key_indices(), np.int64)
                if len(self.keyframes) > _KEYFRAMES_KEPT:
                    self.keyframes.popitem(last=False)
            if isinstance(out, FrameSink):
                for at in range(0, len(frames), _SINK_FRAMES):
                    part = self._copied(reader.get_batch(frames[at : at + _SINK_FRAMES].tolist()), None)
                    for i, frame in enumerate(part):
                        out[at + i] = frame
                return out
            nd = reader.get_batch(frames.tolist())
        except self._decord.DECORDError as e:
            if "size must exactly match" in str(e):  # decord cannot copy rows of this width out
                raise DecoderLimit(f"decord cannot produce {'the native' if size is None else size[1]} width") from e
            raise
        finally:
            del reader  # an idle reader keeps decoding ahead in its own thread
        assert not isinstance(out, FrameSink)
        return self._copied(nd, out)

    def _copied(self, nd, out: np.ndarray | None) -> np.ndarray:
        """decord's frames in ``out`` where it has their shape, else in the scratch buffer."""
        shape = tuple(int(x) for x in nd.shape)
        dest = out if out is not None and out.shape == shape else scratch(self, shape)
        self._copy(nd, dest.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(dest.nbytes))
        return dest
