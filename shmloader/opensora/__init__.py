"""Video-generation training data in buckets of resolution, length and aspect ratio, by Open-Sora
2.0's rules: each batch one bucket, at that bucket's own batch size, each video decoded at the
bucket's size from the frames it needs alone.

What lives here, the family's folder, a module a line:

- ``buckets``: the config, each resolution's aspect-ratio table, a video's bucket per epoch
- ``draws``: the first draws of ``numpy.random.default_rng(seed)`` for many seeds at once, bit
  for bit (a table's buckets for an epoch in one pass)
- ``source``: ``VideoBuckets`` (the description, a bucketed source: NOTE [ Buckets ] in
  ``engine.buckets``), ``SharedBucketVideos`` (what one loader's workers run), ``BucketReader``
- ``table``: Open-Sora's data files, CSV or parquet of ``path, text, num_frames, height, width,
  fps``, read without opening a video

What it may import: the standard library, numpy, pyarrow (the tables), ``shmloader._checks``,
``shmloader._errors``, ``shmloader._lazy``, the engine's contract (``engine.source``,
``.shared``, ``.buckets``, ``.skips``) and the house's reading path (``shmloader.video``), never
another family.

    from shmloader import Loader, opensora

    videos = opensora.from_table("train.csv", bucket_config={
        "256px": {33: (1.0, 8), 1: (1.0, 64)}, "360p": {33: (0.5, 4)}})
    for batch in Loader(videos, shuffle=True, seed=0, epochs=None).as_torch():
        x = opensora.normalize(batch["video"])  # [B, T, H, W, 3] in [-1, 1], one bucket's shape
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from .buckets import ASPECTS, BucketTable, aspect_sizes, pixels_of
from .source import BucketReader, VideoBuckets, reading_of
from .table import from_table

__all__ = ["ASPECTS", "BucketReader", "BucketTable", "VideoBuckets", "aspect_sizes", "clips", "from_table",
           "normalize", "pixels_of"]


def clips(paths: Sequence[str | os.PathLike[str]], captions: Sequence[str] | None = None, *,
          bucket_config: Mapping[str, Mapping[int, Any]], fps_max: float = 16, metas: Any = None,
          decoder: str = "auto", decode_threads: int = 1, storage_options: Mapping[str, Any] | None = None,
          fetch: Mapping[str, Any] | None = None, allow_urls: bool = False, on_error: str = "raise",
          probes: str | os.PathLike[str] | None = None) -> VideoBuckets:
    """A bucketed source for ``shmloader.Loader`` (which takes no ``batch_size``: each batch is one
    bucket's, of the config's batch size): sample ``i`` of epoch ``e`` is ``paths[i]`` as
    Open-Sora's sampler and dataset give it under the loader's ``seed`` — its bucket for the epoch
    by the config's rules (``shmloader.opensora.buckets``; a video no bucket holds is left out of
    that epoch and counted in ``stats()["left_out"]``), ``T`` frames by ``linspace`` over a seeded
    window of ``T × interval`` frames (``interval``: the rate brought under ``fps_max``), decoded at
    the size that fills the bucket (bilinear) and centre-cropped: ``video`` ``[B, T, H, W, 3]``
    uint8 (``normalize`` gives Open-Sora's ``[-1, 1]``), ``caption``, ``frames``, ``times``,
    ``thw``, ``fps``, ``bucket``, ``index``.

    ``bucket_config``: ``{resolution: {num_frames: (probability, batch_size)}}`` as Open-Sora's
    configs write it (a probability may be a pair: keep, skip to a shorter length); a length of 1
    takes images and one-frame videos. ``metas``: each video's ``(num_frames, height, width, fps)``
    from a table (``from_table`` reads Open-Sora's); without it every video is probed here, once
    (in processes where there are many local files; ``probes="probes.csv"`` keeps the probes for
    the next run, which probes only the files changed since).
    Where the files live and how they are read, as for every family (:class:`shmloader.Reading`):
    ``decoder``, ``decode_threads``, ``storage_options``, ``fetch``, ``allow_urls``.
    ``on_error="skip"``: a video that cannot be read is left out with a warning and listed in
    ``.skipped``; ``"raise"`` names every such video in one ValueError.
    """
    table = BucketTable(bucket_config)  # a config it cannot read is refused before any probe
    return VideoBuckets(paths, captions, table, fps_max=fps_max, on_error=on_error, metas=metas, probes=probes,
                        reading=reading_of(decoder, decode_threads, storage_options, fetch, allow_urls))


def normalize(video: Any) -> Any:
    """uint8 frames as Open-Sora's model takes them: ``x / 127.5 - 1``, float32 in ``[-1, 1]``; a
    torch tensor, a JAX array or a TensorFlow tensor stays one (on its device)."""
    if hasattr(video, "float") and hasattr(video, "device"):  # torch
        return video.float() / 127.5 - 1.0
    if type(video).__module__.startswith("tensorflow"):
        import tensorflow as tf

        return tf.cast(video, tf.float32) / 127.5 - 1.0
    if hasattr(video, "astype") and not isinstance(video, np.ndarray):  # a JAX array
        return video.astype("float32") / 127.5 - 1.0
    return np.asarray(video, np.float32) / np.float32(127.5) - np.float32(1.0)
