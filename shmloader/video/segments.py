"""What a family's worker source shares with one loader's workers: its tables in one shared segment
(``engine.shared``), made when the loader starts (or first sends the source to a worker) and closed
once its workers are gone, and the log of the decoders those workers measure (``measuring.Choices``),
which ``Loader.stats()`` reports. Every family's worker source (``SharedClips``, ``SharedPlanned``,
``SharedBucketVideos``,
``SharedEpisodes``) is one of these; each says only what its table holds."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..engine.shared import SharedStrings
from .measuring import Choices

__all__ = ["SharedDescription", "SharedSegments"]


class _Segment(Protocol):
    @property
    def fd(self) -> int: ...

    def close(self) -> None: ...


class SharedSegments:
    """The segments' life for a worker source: ``_make_table()`` (the subclass's) gives the table,
    ``_others()`` any further segments its workers inherit (closed by the subclass's ``release``).

    :param measured: whether the workers measure the decoder (``Reading.measures``).
    """

    def __init__(self, measured: bool) -> None:
        self._table: SharedStrings | None = None
        self._choices = Choices(measured)

    def _make_table(self) -> SharedStrings:
        raise NotImplementedError

    def _others(self) -> tuple[_Segment | None, ...]:
        return ()

    def _shared(self) -> SharedStrings:
        if self._table is None:
            self._table = self._make_table()
            self._choices.open()
        return self._table

    @property
    def fds(self) -> tuple[int, ...]:
        """Descriptors the workers must inherit: the table, the others, the log of measured choices."""
        table = self._shared()
        return (table.fd, *(s.fd for s in (*self._others(), self._choices.log) if s is not None))

    def acquire(self) -> None:
        """The engine starts: the segments stay until ``release``."""
        self._shared()

    def release(self) -> None:
        """The engine's workers are gone: close the segments' descriptors (the choices read first)."""
        if self._table is not None:
            self._table.close()
            self._table = None
        self._choices.close()

    def report(self) -> dict[str, Any]:
        """``Loader.stats()``'s ``decoder_shapes``: per shape of file, the decoder the workers
        measured faster; absent where the decoder is not measured."""
        return self._choices.report()


class SharedDescription(SharedSegments):
    """A worker source that is its family's description read through one shared table: the
    description's ``paths`` and per-video ``_COLUMNS`` travel in the segment, what the workers
    never read (``_MAIN_ONLY``) stays in the training process, the rest is pickled; the
    description reads (``worker_init``, ``read``, ``counters``). ``SharedPlanned`` and
    ``SharedBucketVideos`` are these; each names its columns."""

    _COLUMNS: tuple[str, ...] = ()
    _MAIN_ONLY: tuple[str, ...] = ()

    def __init__(self, described: Any, measured: bool) -> None:
        super().__init__(measured)
        self.videos = described

    @property
    def worker_imports(self) -> tuple[str, ...]:  # for the fork server (engine.forkserver)
        return tuple(self.videos.worker_imports)

    def __len__(self) -> int:
        return len(self.videos)

    def spec(self) -> Any:
        return self.videos.spec()

    def describe(self, index: int) -> str:
        return str(self.videos.describe(index))

    def _make_table(self) -> SharedStrings:
        v = self.videos
        columns = {k: getattr(v, k) for k in self._COLUMNS if getattr(v, k) is not None}
        return SharedStrings(SharedStrings.encode(list(v.paths)), columns)

    def __getstate__(self) -> dict[str, Any]:
        described = self.videos.__getstate__()
        present = [k for k in self._COLUMNS if described[k] is not None]
        for k in (*self._COLUMNS, *self._MAIN_ONLY):
            described[k] = None
        return {"kind": type(self.videos), "described": described, "present": present, "table": self._shared(),
                "choices": self._choices}

    def __setstate__(self, state: dict[str, Any]) -> None:
        table: SharedStrings = state["table"]
        videos = state["kind"].__new__(state["kind"])
        videos.__dict__.update(state["described"])
        videos.paths = table  # indexable like the list
        for k in state["present"]:
            setattr(videos, k, table.column(k))
        videos._choice_log = state["choices"].log
        self.videos, self._table, self._choices = videos, None, state["choices"]

    def worker_init(self) -> None:
        self.videos.worker_init()

    def counters(self) -> dict[str, int]:
        return dict(self.videos.counters())

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        self.videos.read(index, rng, out)
