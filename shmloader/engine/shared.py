"""Read-only arrays in one anonymous shared segment that every worker maps.

The main process writes the arrays once into a ``memfd`` (no name: nothing to leak, whatever
kills the job); workers inherit the descriptor and map it read-only, so per-dataset tables —
array rows, a million video paths and their labels — take memory once, not once per worker
(the trap torch DataLoader users hit with Python lists in forked workers).
"""

from __future__ import annotations

import math
import mmap
import os
import weakref

import numpy as np

__all__ = ["SharedArrays", "SharedStrings"]

class SharedArrays:
    """``{name: array}`` copied into a shared segment; pickles as its descriptor and layout."""

    def __init__(self, arrays: dict[str, np.ndarray], name: str = "shmloader-arrays") -> None:
        self.meta, offset = {}, 0
        for k, a in arrays.items():
            self.meta[k] = (offset, a.shape, a.dtype.str)
            offset += -(-a.nbytes // 64) * 64
        self.nbytes = max(offset, 1)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.fchmod(self.fd, 0o600)
            os.ftruncate(self.fd, self.nbytes)
            os.posix_fallocate(self.fd, 0, self.nbytes)
            mm = mmap.mmap(self.fd, self.nbytes)
            for k, a in arrays.items():
                a = np.ascontiguousarray(a)
                np.frombuffer(mm, np.uint8, a.nbytes, self.meta[k][0])[:] = a.reshape(-1).view(np.uint8)
            mm.close()
        except BaseException:
            os.close(self.fd)
            raise
        self._finalizer = weakref.finalize(self, os.close, self.fd)
        self._views: dict[str, np.ndarray] | None = None

    def close(self) -> None:
        """Close the descriptor (workers keep their own copies and mappings)."""
        self._finalizer()

    def __getstate__(self):
        return {"fd": self.fd, "meta": self.meta, "nbytes": self.nbytes}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._views = None

    def views(self) -> dict[str, np.ndarray]:
        """Read-only arrays over the segment (in a worker: the inherited descriptor)."""
        if self._views is None:
            mm = mmap.mmap(self.fd, self.nbytes, prot=mmap.PROT_READ)
            self._views = {k: np.frombuffer(mm, np.dtype(dt), math.prod(shape), off).reshape(shape)
                           for k, (off, shape, dt) in self.meta.items()}
        return self._views


class SharedStrings:
    """A list of strings as UTF-8 bytes and offsets in a shared segment; indexable like a list."""

    def __init__(self, encoded: tuple[np.ndarray, np.ndarray], extra: dict[str, np.ndarray] | None = None) -> None:
        blob, ends = encoded
        self.shared = SharedArrays({"blob": blob, "ends": ends, **(extra or {})}, "shmloader-table")
        self._len = len(ends)

    @staticmethod
    def encode(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(UTF-8 bytes, end offsets) of ``strings``: the part of building a table that takes time."""
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
        ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))
        return np.frombuffer(b"".join(encoded) or b"\0", np.uint8), ends

    @property
    def fd(self) -> int:
        return self.shared.fd

    def close(self) -> None:
        self.shared.close()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> str:
        v = self.shared.views()
        ends = v["ends"]
        start = int(ends[i - 1]) if i > 0 else 0
        return v["blob"][start : int(ends[i])].tobytes().decode("utf-8", "surrogateescape")

    def column(self, name: str) -> np.ndarray:
        return self.shared.views()[name]
