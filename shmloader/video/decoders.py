"""The two decoders behind one small interface, and the per-worker choice between them.

Both take a video's :class:`~shmloader.video.probe.VideoInfo` (the frame truth), a decode size and
ascending frame indices, and write ``[n, h, w, 3]`` uint8 frames into ``out`` when it has that
shape. Both decode with ``threads`` threads per worker, scale in FFmpeg's scaler (bicubic,
then RGB) and seek to the keyframe before each stretch of wanted frames, decoding forward:

- :class:`Decord`: decord's ``get_batch`` over the whole set in one call, copied once into the
  slot. decord is imported here alone.
- :class:`~shmloader.video.pyav.PyAV` (``video.pyav``): libavformat + libavcodec through PyAV,
  frames found by their timestamp in the probe's timeline (so edit lists, MPEG-TS and size
  changes come out as a player shows them), turned as the container's rotation asks.

``video.decoding`` holds the choice between them per file.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .probe import VideoInfo

__all__ = ["Decord", "DecoderLimit", "scratch"]


class DecoderLimit(Exception):
    """A decoder cannot produce this output here (not a fault of the file)."""


def scratch(holder, shape) -> np.ndarray:
    """``holder._buf`` as a ``shape`` uint8 array, grown when too small: where a decoder puts
    frames that are not decoded straight into a slot."""
    need = int(np.prod(shape))
    if holder._buf is None or holder._buf.size < need:
        holder._buf = np.empty(need, np.uint8)
    return holder._buf[:need].reshape(shape)


class Decord:
    """decord's reader: one ``get_batch`` over the sorted frames, copied once into ``out``."""

    name = "decord"

    def __init__(self, threads: int) -> None:
        from ..engine.native_log import capturing
        from ._av import ffmpeg_logs_to_stderr
        from ._decord import import_decord

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

    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
        if size is None:
            reader = self._decord.VideoReader(info.path, num_threads=self._threads)
        else:
            reader = self._decord.VideoReader(info.path, width=size[1], height=size[0], num_threads=self._threads)
        try:
            nd = reader.get_batch(frames.tolist())
        except self._decord.DECORDError as e:
            if "size must exactly match" in str(e):  # decord cannot copy rows of this width out
                raise DecoderLimit(f"decord cannot produce {'the native' if size is None else size[1]} width") from e
            raise
        finally:
            del reader  # an idle reader keeps decoding ahead in its own thread
        shape = tuple(int(x) for x in nd.shape)
        dest = out if out is not None and out.shape == shape else scratch(self, shape)
        self._copy(nd, dest.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(dest.nbytes))
        return dest
