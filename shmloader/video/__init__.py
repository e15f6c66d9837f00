"""Video: everything that turns a path into frames.

What lives here: ``VideoClips``, the description of a video dataset (``clips``), and what a loader
runs for it (``tables``) and reads it with (``reader``); reading a file's frame truth (``probe``);
the two decoders, decord and PyAV (``decord``, ``pyav``, sharing ``decoders``); where clips go in a video
(``sampling``); manifests and ``shmloader scan`` (``manifest``, ``scan``); local, remote and tar
reads (``storage``); the synthetic sample videos (``samples``).

What it may import: the standard library, numpy, decord, PyAV, fsspec, ``shmloader._errors`` and
the engine's contract for sources (``shmloader.engine.source``, ``.shared``, ``.native_log``),
never the rest of the engine. Nothing here is public API; users import from ``shmloader``,
``shmloader.samples`` and ``shmloader.sampling``.
"""
