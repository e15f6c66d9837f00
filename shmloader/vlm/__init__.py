"""Video-LLM inputs: frames at a rate, a size per video from a pixel budget, patches.

The general parts a model family's recipe (``shmloader.qwen``) is written over; pure numpy
arithmetic on a video's frame count, rate and size, decided before anything is decoded.

What lives here, a module a line:

- ``frames``: how many frames a rate gives within bounds and a multiple, which ones, the rate they show
- ``sizes``: a frame size from a pixel budget, sides multiples of a factor (``smart_resize``)
- ``patches``: frames as patch rows, their grid and tokens, their normalisation

What it may import: the standard library, numpy, ``shmloader._errors``, ``shmloader._checks`` and ``shmloader._lazy``.
Never torch at a module's top (``patches.normalize`` takes torch tensors through their own
methods). Nothing here is public API; users import from ``shmloader.qwen``.
"""

from typing import TYPE_CHECKING

from .._lazy import submodule

if not TYPE_CHECKING:
    def __getattr__(name: str):  # ``shmloader.vlm.<module>`` without importing it first
        return submodule(__name__, name)
