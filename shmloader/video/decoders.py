"""What the two decoders share: their interface, the limit one may meet, their scratch buffer.

Both take a video's :class:`~shmloader.video.probe.VideoInfo` (the frame truth), a decode size and
ascending frame indices, and write ``[n, h, w, 3]`` uint8 frames into ``out`` when it has that
shape. Both decode with ``threads`` threads per worker, scale in FFmpeg's scaler (bicubic,
then RGB) and seek to the keyframe before each stretch of wanted frames, decoding forward:

- :class:`~shmloader.video.decord.Decord` (``video.decord``): decord's ``get_batch`` over the
  whole set in one call, copied once into the slot (a few frames a call for a ``FrameSink``).
- :class:`~shmloader.video.pyav.PyAV` (``video.pyav``): libavformat + libavcodec through PyAV,
  frames found by their timestamp in the probe's timeline (so edit lists, MPEG-TS and size
  changes come out as a player shows them), turned as the container's rotation asks.

``out`` may also be a :class:`FrameSink`, which takes the frames one at a time as they come out,
so that a read whose frames are made into something else (patch rows) never holds them all.

``video.decoding`` holds the choice between them per file.
"""

from __future__ import annotations

import numpy as np


__all__ = ["DecoderLimit", "FrameSink", "scratch"]


class DecoderLimit(Exception):
    """A decoder cannot produce this output here (not a fault of the file)."""


def scratch(holder, shape) -> np.ndarray:
    """``holder._buf`` as a ``shape`` uint8 array, grown when too small: where a decoder puts
    frames that are not decoded straight into a slot."""
    need = int(np.prod(shape))
    if holder._buf is None or holder._buf.size < need:
        holder._buf = np.empty(need, np.uint8)
    return holder._buf[:need].reshape(shape)


class FrameSink:
    """Where a decoder puts a read's frames one at a time instead of into one array: ``sink[j] =
    frame`` for frame ``j`` of the read (``[h, w, 3]`` uint8, valid only during the call), in the
    order they come out; a decoder that reads the file again (another decoder, or a second pass)
    gives every frame again from ``j = 0``. ``shape``: the array it stands for."""

    shape: tuple[int, ...]

    def __setitem__(self, j: int, frame: np.ndarray) -> None:
        raise NotImplementedError
