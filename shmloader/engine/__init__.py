"""The engine: runs any source's samples in a pool of worker processes into a shared-memory ring.

What lives here, a module a line:

- ``core``: the loop that ties ring, pool and scheduler together
- ``source``: the contract a source meets (``Source``, ``Spec``, ``Described``, ``Sizes`` of samples of several sizes)
- ``skips``: what becomes of a sample that cannot be read (``on_error``), the skips kept
- ``shared``: read-only tables in one anonymous shared segment, shared with the workers
- ``ring``: the ring of whole batches, and the slot lease
- ``pool``: the worker processes, their pipes, their start-up and shutdown
- ``worker``: the worker's entry point and loop
- ``forkserver``: one clean interpreter that imports what workers need once and forks them
- ``forked``: a worker the fork server forked, as the training process sees it (Popen's face)
- ``protocol``: the fixed-format messages between them
- ``plan``: the epoch plan, which samples in which order
- ``buckets``: batches of one bucket each, of the bucket's own size (NOTE [ Buckets ])
- ``schedule``: slots, tasks, replies, retries
- ``stats``: the loader's counters and timings
- ``native_log``: what native code (decord, FFmpeg) prints, kept for the sample's error
- ``interrupts``: Ctrl-C deferred while the engine or a dataset tool keeps its books

What it may import: the standard library, numpy, psutil, cloudpickle, ``shmloader._errors``,
``shmloader._checks`` and ``shmloader._lazy``.
It knows nothing of video: a source is anything that meets ``source.Source``. Nothing here is
public API; users import from ``shmloader``.
"""

from typing import TYPE_CHECKING

from .._lazy import submodule

if not TYPE_CHECKING:
    def __getattr__(name: str):  # ``shmloader.engine.<module>`` without importing it first
        return submodule(__name__, name)
