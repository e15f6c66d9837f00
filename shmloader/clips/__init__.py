"""The clips family: fixed clips of ``clip_len`` frames (``VideoClips``), what video classifiers and
most video models read — which frames (random, uniform, segments, at a rate), at what size and crop,
with their sound — decoded in the workers.

What lives here, the family's folder, a module a line:

- ``description``: ``VideoClips``, the description of a clip dataset (paths, labels, options, groups)
- ``options``: its options in groups, each field stated once (``Sampling``, ``Pixels``, ``Audio``,
  and the house's ``Reading``)
- ``arguments``: what it is given besides them (the first video's size and rate, a class folder)
- ``listing``: the rows of a CSV/JSON manifest or of tar shards
- ``sampling``: which frames, scale and crop windows (pure numpy, before decoding)
- ``reader``: ``ClipReader``, sample ids in, arrays out, in any process
- ``tables``: ``SharedClips``, what one loader's workers run (shared columns, shared probes)

What it may import: the standard library, numpy, ``shmloader._errors``, ``shmloader._checks``,
``shmloader._lazy``, the engine's contract for sources and its shared tables, and the house's
reading path (``shmloader.video``), never another family. Nothing here is public API; users import
``shmloader.VideoClips``, its option groups and ``shmloader.sampling``.
"""

from typing import TYPE_CHECKING

from .._lazy import submodule

if not TYPE_CHECKING:
    def __getattr__(name: str):  # ``shmloader.clips.<module>`` without importing it first
        return submodule(__name__, name)
