"""A video source's columns in one shared segment for the ring's workers: paths (and labels,
spans, a scan manifest's columns, tar members' places) mapped by each worker instead of
unpickled into each, so a worker's memory does not grow with the number of videos.

That is how a source pickles for the ring (``engine.shared.sharing``). Pickled anywhere else —
a Ray task, another machine, a user's own pickle — it carries its columns by value (paths,
labels, spans, a scan manifest's probe columns, tar members' places): no descriptor, nothing
probed again."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engine.shared import SharedStrings, is_sharing
from .probestore import ProbeStore

__all__ = ["SharedColumns"]


class SharedColumns:
    """What ``VideoClips`` shares with the workers of the loaders using it (``acquire`` /
    ``release``), and how it pickles: ``paths`` becomes the shared table, the columns its names."""

    paths: Any
    labels: np.ndarray | None
    spans: np.ndarray | None
    files: np.ndarray | None
    _known: dict[str, np.ndarray] | None
    _members: dict[str, np.ndarray] | None
    _encoded: tuple[np.ndarray, np.ndarray] | None  # None once pickled
    _table: SharedStrings | None
    _users: int
    remote: bool
    _probe_store: ProbeStore | None = None  # remote files' probes, shared by the workers

    def _shared_table(self) -> SharedStrings:
        """Paths and labels in one shared segment, made when a loader first sends this source to
        its workers: each worker maps it instead of unpickling its own copy, so a worker's
        memory does not grow with the number of videos."""
        if self._table is None:
            if self._encoded is None:  # pickled by value: encoded again where a loader uses it
                self._encoded = SharedStrings.encode(list(self.paths))
            columns: dict[str, np.ndarray] = {} if self.labels is None else {"labels": self.labels}
            if self.spans is not None and self.files is not None:
                columns.update(spans=self.spans, files=self.files)
            columns.update({f"known_{k}": a for k, a in (self._known or {}).items()})
            columns.update({f"member_{k}": a for k, a in (self._members or {}).items()})
            self._table = SharedStrings(self._encoded, columns)
            if self.remote:
                self._probe_store = ProbeStore(len(self._table))
        return self._table

    @property
    def fds(self) -> tuple[int, ...]:
        """Descriptors the workers must inherit (the shared path table, the shared probes)."""
        table = self._shared_table()
        return (table.fd,) if self._probe_store is None else (table.fd, self._probe_store.fd)

    def acquire(self) -> None:
        """A loader starts using this source: keep the shared table until it calls release()."""
        self._users += 1
        self._shared_table()

    def release(self) -> None:
        """A loader is done: the last one closes the table's descriptor (workers are gone)."""
        self._users -= 1
        if self._users <= 0 and self._table is not None:
            self._table.close()
            self._table = None
            if self._probe_store is not None:
                self._probe_store.close()
                self._probe_store = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # a worker makes its own (worker_init)
        if not is_sharing():  # by value: usable in any process, on any machine
            state["_table"], state["_users"], state["_encoded"] = None, 0, None
            state["_probe_store"] = None  # the loader's workers' probes: a descriptor here only
            return state
        state["paths"] = self._shared_table()  # indexable like the list, a few bytes to pickle
        state["_probe_store"] = self._probe_store
        state["_table"], state["_users"], state["_encoded"] = None, 0, None
        state["_has_labels"], state["labels"] = self.labels is not None, None
        state["_has_spans"], state["spans"], state["files"] = self.spans is not None, None, None
        state["_known"] = None if self._known is None else list(self._known)
        state["_members"] = None if self._members is None else list(self._members)
        return state

    def _restore_columns(self) -> None:
        """In a worker: the columns back from the shared table (see ``__getstate__``)."""
        if not isinstance(self.paths, SharedStrings):  # pickled by value: the columns came along
            return
        table = self.paths
        if self.__dict__.pop("_has_labels", False):
            self.labels = table.column("labels")
        if self.__dict__.pop("_has_spans", False):
            self.spans, self.files = table.column("spans"), table.column("files")
        if self._known is not None:
            self._known = {k: table.column(f"known_{k}") for k in self._known}
        if self._members is not None:
            self._members = {k: table.column(f"member_{k}") for k in self._members}
