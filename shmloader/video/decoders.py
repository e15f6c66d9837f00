"""What the two decoders share: their interface, the limit one may meet, their scratch buffer.

Both take a video's :class:`~shmloader.video.probe.VideoInfo` (the frame truth), a decode size and
ascending frame indices, and write ``[n, h, w, 3]`` uint8 frames into ``out`` when it has that
shape. Both decode with ``threads`` threads per worker, scale in FFmpeg's scaler (bicubic,
then RGB) and seek to the keyframe before each stretch of wanted frames, decoding forward:

- :class:`~shmloader.video.decord.Decord` (``video.decord``): decord's ``get_batch`` over the
  whole set in one call, copied once into the slot.
- :class:`~shmloader.video.pyav.PyAV` (``video.pyav``): libavformat + libavcodec through PyAV,
  frames found by their timestamp in the probe's timeline (so edit lists, MPEG-TS and size
  changes come out as a player shows them), turned as the container's rotation asks.

``video.decoding`` holds the choice between them per file.
"""

from __future__ import annotations

import numpy as np


__all__ = ["DecoderLimit", "scratch"]


class DecoderLimit(Exception):
    """A decoder cannot produce this output here (not a fault of the file)."""


def scratch(holder, shape) -> np.ndarray:
    """``holder._buf`` as a ``shape`` uint8 array, grown when too small: where a decoder puts
    frames that are not decoded straight into a slot."""
    need = int(np.prod(shape))
    if holder._buf is None or holder._buf.size < need:
        holder._buf = np.empty(need, np.uint8)
    return holder._buf[:need].reshape(shape)
