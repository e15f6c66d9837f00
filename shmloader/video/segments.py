"""What a family's worker source shares with one loader's workers: its tables in one shared segment
(``engine.shared``), made when the loader starts (or first sends the source to a worker) and closed
once its workers are gone, and the log of the decoders those workers measure (``measuring.Choices``),
which ``Loader.stats()`` reports. Every family's worker source (``SharedClips``, ``SharedPlanned``,
``SharedEpisodes``) is one of these; each says only what its table holds."""

from __future__ import annotations

from typing import Any, Protocol

from ..engine.shared import SharedStrings
from .measuring import Choices

__all__ = ["SharedSegments"]


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
