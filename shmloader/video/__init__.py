"""Video: the house's reading path, everything that turns a path into frames (and their sound),
for every family of samples (``shmloader.clips``, ``shmloader.qwen``, ``shmloader.lerobot``...).

What lives here, a module a line:

- ``reading``: ``Reading``, how every family's files are read (storage, fetch, decoder, threads)
- ``arguments``: the argument checks every family shares (paths, labels, spans, columns)
- ``identity``: a description's digest, equal for equal descriptions in any process
- ``manifest``: class folders, CSV/JSON manifests, the probe columns of a scan manifest
- ``shards``: tar shard patterns and the samples their members make
- ``probing``: many videos' frames, rates and sizes before the first batch: a scan manifest's rows,
  probes kept by an earlier run, or probes in processes with a progress bar
- ``planned``: ``PlannedVideos``, the house of planned families: whole videos each planned by a
  family's recipe (frames, size, rows), decoded at that size
- ``whole``: what every source of whole videos shares (planned videos, Open-Sora's buckets): paths
  read, the videos that cannot be read left out or named, a worker's decoding, a reader's batch
- ``decoding``: a reader's probes (cached), its choice of decoder per file, its counters
- ``segments``: a family's worker source's shared table and log of measured decoders, their life
- ``measuring``: the faster decoder per shape of file, measured in each worker (``decoder="auto"``)
- ``stamps``: frames found by their times on a file's own timeline, decoded in one pass per file
- ``probe``: what a file holds (``VideoInfo``) and which decoder reads it
- ``packets``: one read of a file's packets: timeline, keyframes, byte spans
- ``mp4index``: a long MP4's timeline (and its audio packets' places) from its own index
- ``probestore``: remote files' probes shared by a loader's workers
- ``decoders``: what the two decoders share; ``decord`` and ``pyav``: the two decoders
- ``_av``: PyAV across its versions, decided once; its one-thread filter graph
- ``audio``: a span's sound, resampled, mixed and placed; ``audiobytes``: its remote bytes
- ``media``: what a path names, a file's place resolved once
- ``storage``: local, remote and tar reads (stat, retries); ``blocks``: the block cache
- ``refusals``: a remote read refused for good (a missing object, missing credentials), not retried
- ``samples``: the synthetic sample videos whose frames say who they are
- ``preload``: what a video worker imports, imported once by the fork server

The offline dataset tools (scan, prepare) live in ``shmloader.tools``; nothing here imports them.

What it may import: the standard library, numpy, decord, PyAV, fsspec, ``shmloader._errors``,
``shmloader._checks``, ``shmloader._lazy`` and the engine's contract for sources (``shmloader.engine.source``,
``.shared``, ``.native_log``, ``.skips``: ``on_error``'s choices), never the rest of the engine and
never a family (the families import the house). Nothing here is public API; users import from
``shmloader``, ``shmloader.samples`` and ``shmloader.planned``.
"""

from typing import TYPE_CHECKING

from .._lazy import submodule

if not TYPE_CHECKING:
    def __getattr__(name: str):  # ``shmloader.video.<module>`` without importing it first
        return submodule(__name__, name)
