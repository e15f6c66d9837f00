"""The offline dataset tools: ``shmloader scan`` and ``shmloader prepare``, run once over a dataset
before training; the reading path (``shmloader.video``) never imports them.

What lives here, a module a line:

- ``scan``: ``shmloader scan``, every video probed once into a manifest
- ``rescan``: an earlier manifest's rows kept or done again (scan's and prepare's); a summary's counts
- ``evidence``: decord's seeking checked against PyAV before a manifest trusts it
- ``audioprobe``: a manifest's audio columns, a file's first audio stream described
- ``runner``: the one runner of per-file work (ordered, bounded, killable) and its retry policy
- ``filepool``: the process pool the runner's local backend runs the per-file work in
- ``prepare``: ``shmloader prepare``, training copies of a dataset and their manifest
- ``transcode``: one training copy, decoded as the loader reads, encoded with short GOPs

What it may import: the standard library, numpy, PyAV, tqdm, ``shmloader._errors``,
``shmloader._checks``, ``shmloader._lazy``, ``shmloader._cpus``, the reading path (``shmloader.video``) and the engine's
contract for sources (``shmloader.engine.source``) and its Ctrl-C deferral (``shmloader.engine.interrupts``:
a tool's run stops once, its cleanup never cut by a second Ctrl-C).
Users reach it through ``shmloader.prepare``, ``shmloader.ray.prepare`` and the command line.
"""

from typing import TYPE_CHECKING

from .._lazy import submodule

if not TYPE_CHECKING:
    def __getattr__(name: str):  # ``shmloader.tools.<module>`` without importing it first
        return submodule(__name__, name)
