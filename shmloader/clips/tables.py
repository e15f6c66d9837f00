"""What one loader's workers run for a ``VideoClips``: the description's columns in one shared
segment, the probes of its remote files shared by the workers, and the decoders they measured
per shape of file (``video.measuring``), which ``Loader.stats()`` reports.

The columns (paths, and labels, spans, a scan manifest's probe columns, tar members' places) go
to the workers as one ``memfd`` each maps, instead of unpickled into each, so a worker's memory
does not grow with the number of videos. The loader that asked for a ``SharedClips``
(``VideoClips.for_workers``) owns it: the engine opens the segments when it starts and closes
them once its workers are gone. The description itself pickles by value (a Ray task, another
machine, a user's own pickle): no descriptor, nothing probed again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engine.shared import SharedStrings
from ..engine.source import Spec
from ..video.measuring import measures
from ..video.probestore import ProbeStore
from ..video.segments import SharedSegments
from .reader import ClipReader, Clips

__all__ = ["SharedClips"]

# The description's fields that travel in the shared segment, not in the pickle.
_COLUMNS = ("labels", "spans", "files", "manifest", "members")


class SharedClips(SharedSegments):
    """The engine's source for ``clips`` (``engine.source.Source``): sample ``i`` is read by a
    ``ClipReader`` of the description in each worker, with the loader's shared probes.

    :param clips: the description.
    :param encoded: its paths as ``SharedStrings.encode`` gives them, where already encoded.
    """

    worker_imports = ("shmloader.video.preload", "shmloader.clips.reader")  # for the fork server (engine.forkserver)

    def __init__(self, clips: Clips, encoded: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(measures(clips.reading.decoder, clips.remote))
        self.clips = clips
        self._encoded = encoded
        self._probes: ProbeStore | None = None
        self._reader: ClipReader | None = None  # in a worker (worker_init)

    def __len__(self) -> int:
        return len(self.clips)

    def spec(self) -> Spec:
        return self.clips.spec()

    def describe(self, index: int) -> str:
        return self.clips.describe(index)

    # ------------------------------------------------------------ the loader's process
    def _make_table(self) -> SharedStrings:
        """The paths and columns in one segment, made when the loader first sends this to its
        workers (the paths were encoded when the description was made); for remote files, the
        probes the workers share beside it."""
        vc = self.clips
        encoded = self._encoded if self._encoded is not None else SharedStrings.encode(list(vc.paths))
        columns: dict[str, np.ndarray] = {} if vc.labels is None else {"labels": vc.labels}
        if vc.spans is not None and vc.files is not None:
            columns.update(spans=vc.spans, files=vc.files)
        columns.update({f"manifest_{k}": a for k, a in (vc.manifest or {}).items()})
        columns.update({f"members_{k}": a for k, a in (vc.members or {}).items()})
        table = SharedStrings(encoded, columns)
        if vc.remote:
            self._probes = ProbeStore(len(table))
        return table

    def _others(self) -> tuple[ProbeStore | None, ...]:
        return (self._probes,)

    def release(self) -> None:
        """The engine's workers are gone: close the segments' descriptors."""
        super().release()
        if self._probes is not None:
            self._probes.close()
            self._probes = None

    def __getstate__(self) -> dict[str, Any]:
        """For the loader's workers, which inherit the segments: the description without its
        columns, and the segments as descriptors."""
        described = self.clips.__getstate__()  # type: ignore[attr-defined]
        present = [k for k in _COLUMNS if described[k] is not None]
        for k in (*_COLUMNS, "paths"):
            described[k] = None
        for k in ("manifest", "members"):  # their names: the arrays are in the table
            if k in present:
                described[k] = list(getattr(self.clips, k))
        return {"kind": type(self.clips), "described": described, "present": present,
                "table": self._shared(), "probes": self._probes, "choices": self._choices}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """In a worker: the description back, its columns views of the shared segment."""
        table: SharedStrings = state["table"]
        described = state["described"]
        present = state["present"]
        described["paths"] = table  # indexable like the list
        if "labels" in present:
            described["labels"] = table.column("labels")
        if "spans" in present:
            described["spans"], described["files"] = table.column("spans"), table.column("files")
        for k in ("manifest", "members"):
            if k in present:
                described[k] = {name: table.column(f"{k}_{name}") for name in described[k]}
        kind = state["kind"]
        clips = kind.__new__(kind)
        clips.__dict__.update(described)
        self.clips, self._encoded, self._table = clips, None, None
        self._probes, self._reader = state["probes"], None
        self._choices = state["choices"]

    # ------------------------------------------------------------ a worker
    def worker_init(self) -> None:
        self._reader = ClipReader(self.clips, probes=self._probes, choices=self._choices.log).load_decoders()

    def counters(self) -> dict[str, int]:
        """What this worker's reader counted (``ClipReader.counters``); the loader's ``stats()``
        sums them over its workers (``engine.protocol.COUNTS``)."""
        return {} if self._reader is None else self._reader.counters()

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        self.read_many([index], [rng], [out])

    def read_many(self, indices: list[int], rngs: list[np.random.Generator],
                  outs: list[dict[str, np.ndarray]], epoch_key: tuple[int, int] | None = None) -> None:
        """Samples ``indices`` written into ``outs`` (``ClipReader.read_into``)."""
        assert self._reader is not None, "the reader is made in the workers (worker_init)"
        self._reader.read_into(indices, rngs, outs, epoch_key)
