"""What every source of whole videos, one sample a video, shares (``PlannedVideos``, Open-Sora's
``VideoBuckets``): the paths checked and read as a ``Reading`` says; the videos that cannot be
read or planned named together (``on_error="raise"``) or left out and listed in ``skipped``
(``"skip"``), ``index`` staying a video's position in the paths given; the decoding a worker
makes, measured for the family's cut; its counters; the fingerprint a saved state carries; and a
reader's batch of new arrays in any process. A family says what a video becomes."""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar, Sequence

import numpy as np

from .._checks import check_choice
from ..engine.skips import ON_ERROR
from ..engine.source import Spec
from .arguments import checked_paths, path_list
from .decoding import Decoding
from .measuring import ChoiceLog, Cut, Measuring, measures
from .reading import Reading
from .storage import Storage

__all__ = ["WholeVideos", "left_out", "stacked"]

# Files named in a warning or an error about the videos left out; the rest are counted (all of
# them are in ``skipped``).
_NAMED = 5


class WholeVideos:
    """The base of a source of whole videos: ``_open`` and ``_keep`` in the family's constructor,
    the rest as the engine's source protocol asks. ``_cut``: what the decoders are measured for
    (NOTE [ Measuring the decoder ]); ``_digest``: the family's fingerprint, set by it."""

    _cut: ClassVar[Cut]
    group_size = 1  # one sample a video (the plan of a loader, or of Ray's tasks)
    reading: Reading
    storage: Storage
    remote: bool
    paths: list[str]
    positions: np.ndarray
    skipped: list[tuple[int, str, str]]
    _digest: str

    def _open(self, paths: Sequence[str | os.PathLike[str]], on_error: str) -> list[str]:
        """The paths given, as a list of strings; ``on_error`` checked."""
        given = path_list(paths)
        if not given:
            raise ValueError("no videos given")
        check_choice("on_error", on_error, ON_ERROR)
        return given

    def _read(self, given: list[str], reading: Reading) -> list[str]:
        """``given`` resolved, and how they are read: storage, remote or local."""
        self.reading = reading
        resolved, self.remote = checked_paths(given, reading.allow_urls)
        if self.remote and reading.decoder == "decord":
            raise ValueError("decoder='decord' reads local files only; remote paths are read by PyAV "
                             "(decoder='auto' or 'pyav')")
        self.storage = reading.storage()
        self._decoding: Decoding | None = None
        self._choice_log: ChoiceLog | None = None  # in a loader's worker: where its measured decoders go
        return resolved

    def _keep(self, resolved: list[str], reasons: dict[int, str], on_error: str, what: str) -> np.ndarray:
        """Leave out the videos ``reasons`` names (position -> why), or raise naming them all
        (``on_error="raise"``, or none left); sets ``skipped``, ``positions`` and ``paths``, and
        returns the positions kept. ``what``: what those videos cannot be ("read or planned")."""
        bad = [(i, self.storage.name(resolved[i]), reasons[i]) for i in sorted(reasons)]
        if bad and (on_error == "raise" or len(bad) == len(resolved)):
            hint = "" if on_error == "skip" else " (on_error='skip' leaves such videos out)"
            raise ValueError(left_out(bad, len(resolved), f"cannot be {what}") + hint)
        self.skipped = bad  # (position in the paths given, path, reason) of each video left out
        if bad:
            # stacklevel: the line that called the family's constructor's caller (clips(), from_table())
            warnings.warn(left_out(bad, len(resolved), f"left out (on_error='skip'): they cannot be {what}; "
                                   "every one is in .skipped"), stacklevel=4)
        kept = np.ones(len(resolved), bool)
        kept[list(reasons)] = False
        self.positions = np.flatnonzero(kept).astype(np.int64)  # each sample's ``index``
        self.paths = resolved if not reasons else [resolved[i] for i in self.positions.tolist()]
        return self.positions

    @property
    def decoder(self) -> str:
        return self.reading.decoder

    @property
    def decode_threads(self) -> int:
        return self.reading.decode_threads

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoding": None, "_choice_log": None}

    def fingerprint(self) -> str:
        """A hash of the videos kept and what the family makes of them, which a loader's saved
        state carries: a state saved over other videos, or the same ones made otherwise, is refused."""
        return self._digest

    def describe(self, index: int) -> str:
        return self.storage.name(self.paths[index])

    def worker_init(self) -> None:
        measured = measures(self.decoder, self.remote)  # NOTE [ Measuring the decoder ]
        self._decoding = self.reading.decoding(self.storage, Measuring(self._cut, self._choice_log) if measured else None)

    def _worker_decoding(self) -> Decoding:
        """This worker's decoding, made on its first read."""
        if self._decoding is None:
            self.worker_init()
        assert self._decoding is not None
        return self._decoding

    def counters(self) -> dict[str, int]:
        """Decodes by decord and by PyAV, decodes decord handed to PyAV, probes, bytes and requests
        fetched from remote storage so far (``engine.protocol.COUNTS``)."""
        return self.storage.counters() if self._decoding is None else self._decoding.counters()


def left_out(bad: list[tuple[int, str, str]], total: int, what: str) -> str:
    """One message for the videos of ``bad`` ((position, name, reason)): the first few named."""
    named = "; ".join(f"{name}: {reason}" for _, name, reason in bad[:_NAMED])
    more = f"; and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
    return f"{len(bad)} of {total} videos {what}: {named}{more}"


def stacked(outs: list[dict[str, np.ndarray]], spec: Spec) -> dict[str, np.ndarray]:
    """Samples read one by one into a batch of new arrays: a field of rows as an object array of
    each sample's own (Ray Data's variable-shaped tensors), the others stacked."""
    batch: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in spec.items():
        if shape[:1] == (-1,):
            column = np.empty(len(outs), dtype=object)
            column[:] = [o[name] for o in outs] if outs else []
            batch[name] = column
        else:
            batch[name] = np.stack([o[name] for o in outs]) if outs else np.zeros((0, *shape), dtype)
    return batch
