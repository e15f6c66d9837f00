"""FunctionSource: run a user's ``fn(index, rng) -> dict of arrays`` in the workers."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .engine.source import Spec, check_sample, normalize_spec

__all__ = ["FunctionSource"]


class FunctionSource:
    """Wrap ``fn(index, rng) -> {name: array}`` so the workers run it, ``length`` samples an epoch.

    ``spec = {name: (shape, dtype)}`` fixes what ``fn`` returns. ``fn`` is sent to the workers
    by value, so it may be defined in a notebook cell or a script's ``__main__``. With
    ``check=True`` (default) ``fn(0, rng)`` runs once here so a spec mismatch fails now.
    """

    def __init__(self, fn: Callable[[int, np.random.Generator], dict[str, Any]], spec: Mapping[str, Any], length: int, *,
                 check: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if int(length) != length or length < 0:
            raise ValueError(f"length must be a non-negative integer, got {length!r}")
        self.fn = fn
        self._spec = normalize_spec(spec)
        self.length = int(length)
        if check and self.length:
            check_sample(fn(0, np.random.default_rng(0)), self._spec, f"fn(0, rng) of {_name(fn)}")

    def __len__(self) -> int:
        return self.length

    def spec(self) -> Spec:
        return dict(self._spec)

    def describe(self, index: int) -> str:
        return f"index {index} of {_name(self.fn)}"

    def worker_init(self) -> None:
        pass

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        sample = self.fn(index, rng)
        check_sample(sample, self._spec, f"fn({index}, rng)")
        for name, dst in out.items():
            np.copyto(dst, sample[name], casting="same_kind")


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
