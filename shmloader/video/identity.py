"""What identifies a description in any process: a hash of its whole content (its paths, labels,
options and columns), equal for equal descriptions wherever they are made (a Ray task worker keeps
one reader per digest)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from .storage import Storage

__all__ = ["digest"]


def digest(clips: Any) -> str:
    """A hash of the whole description (videos, labels, options, manifest columns; a
    ``VideoClips``, or any description with a ``__getstate__``, as ``video.planned``'s): equal
    descriptions give equal digests in any process (Ray's task workers keep a reader per digest)."""
    h = hashlib.sha256()
    _feed(h, clips.__getstate__())
    return h.hexdigest()[:16]


def _feed(h: Any, value: Any) -> None:
    """``value`` into the hash ``h`` by content (a pickle's bytes depend on shared references)."""
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"{k!r}:".encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        h.update("\0".join(value).encode("utf-8", "surrogateescape"))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _feed(h, v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # an option group
        h.update(type(value).__name__.encode())
        _feed(h, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    elif isinstance(value, Storage):
        _feed(h, value.__getstate__())
    else:
        h.update(repr(value).encode())
    h.update(b";")
