"""ArraySource and HDF5Source: rows of arrays, read in the workers."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from .engine.shared import SharedArrays
from .engine.source import Spec

__all__ = ["ArraySource", "HDF5Source"]


def _rows(arrays: dict[str, Any]) -> int:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"all arrays need the same number of rows, got {lengths}")
    return next(iter(lengths.values()))


class ArraySource:
    """Samples are rows of in-memory arrays: ``{name: array[N, ...]}`` gives N samples.

    The arrays are copied once into an anonymous shared segment that every worker maps, so
    memory does not grow with the number of workers.
    """

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        if not isinstance(arrays, dict) or not arrays:
            raise TypeError("arrays must be a non-empty dict {name: array}")
        arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        for k, a in arrays.items():
            if a.ndim < 1 or a.dtype.hasobject:
                raise ValueError(f"array {k!r} must have a leading sample axis and a numeric dtype")
        self.length = _rows(arrays)
        self._spec = {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}
        self._shared = SharedArrays(arrays)
        self._views: dict[str, np.ndarray] = {}  # mapped in each worker (worker_init)

    def __len__(self) -> int:
        return self.length

    @property
    def fd(self) -> int:
        return self._shared.fd

    @property
    def fds(self) -> tuple[int, ...]:
        """Descriptors the workers must inherit."""
        return (self._shared.fd,)

    def spec(self) -> Spec:
        return dict(self._spec)

    def describe(self, index: int) -> str:
        return f"row {index}"

    def __getstate__(self) -> dict[str, Any]:
        return {"length": self.length, "_spec": self._spec, "_shared": self._shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views = {}

    def worker_init(self) -> None:
        self._views = self._shared.views()

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        for k, dst in out.items():
            dst[...] = self._views[k][index]

    def read_many(self, indices: list[int], rngs: Sequence[np.random.Generator], outs: Sequence[dict[str, np.ndarray]],
                  epoch_key: Any = None) -> None:
        """All rows in one gather per array, straight into the slot when ``outs.block`` is a run."""
        idx = np.asarray(indices, dtype=np.intp)
        block = getattr(outs, "block", None)
        for k, src in self._views.items():
            if block is not None:
                np.take(src, idx, axis=0, out=block[k])
            else:
                rows = src[idx]
                for i in range(len(idx)):
                    outs[i][k][...] = rows[i]


class HDF5Source:
    """Samples are rows of datasets in an HDF5 file, read (partially) in the workers.

    Only metadata (shapes, dtypes) is read here; each worker opens the file itself and reads
    row ``index`` of every dataset. Needs ``h5py``.
    """

    def __init__(self, path: str | os.PathLike[str], datasets: list[str] | tuple[str, ...]) -> None:
        import h5py

        self.path = os.path.abspath(os.fspath(path))
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets is empty")
        self._spec: Spec = {}
        lengths: dict[str, int] = {}
        with h5py.File(self.path, "r") as f:
            for name in self.datasets:
                if name not in f:
                    raise KeyError(f"{self.path!r} has no dataset {name!r}")
                d = f[name]
                if d.ndim < 1 or d.dtype.kind not in "biuf":
                    raise ValueError(f"dataset {name!r} must have a sample axis and a numeric dtype")
                self._spec[name.strip("/").replace("/", "_")] = (tuple(d.shape[1:]), np.dtype(d.dtype))
                lengths[name] = d.shape[0]
        if len(set(lengths.values())) != 1:
            raise ValueError(f"datasets need the same number of rows, got {lengths}")
        self.length: int = next(iter(lengths.values()))
        self._file: Any = None  # h5py.File, opened in each worker
        self._dsets: list[tuple[str, Any]] = []

    def __len__(self) -> int:
        return self.length

    def spec(self) -> Spec:
        return dict(self._spec)

    def describe(self, index: int) -> str:
        return f"{self.path!r}, row {index}"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"] = None
        return state

    def worker_init(self) -> None:
        import h5py

        self._file = h5py.File(self.path, "r")
        self._dsets = [(key, self._file[name]) for key, name in zip(self._spec, self.datasets)]

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        for key, d in self._dsets:
            d.read_direct(out[key], source_sel=np.s_[index])

    def read_many(self, indices: list[int], rngs: Sequence[np.random.Generator], outs: Sequence[dict[str, np.ndarray]],
                  epoch_key: Any = None) -> None:
        """All rows of each dataset in one HDF5 read (a point selection, in file order)."""
        wanted, back = np.unique(np.asarray(indices, dtype=np.int64), return_inverse=True)
        block = getattr(outs, "block", None)
        for key, d in self._dsets:
            rows = d[wanted.tolist()] if len(wanted) > 1 else d[int(wanted[0])][None]
            if block is not None:
                np.take(rows, back, axis=0, out=block[key])
            else:
                for i, j in enumerate(back):
                    outs[i][key][...] = rows[j]
