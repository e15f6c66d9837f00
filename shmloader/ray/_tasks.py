"""What runs inside Ray's tasks for ``shmloader.ray``: the decode function and the skip log.

Ray is imported inside the functions only: ``shmloader.ray`` imports this module, and nothing
here may run at ``import shmloader``.
"""

from __future__ import annotations

import os
import traceback
from collections import OrderedDict
from typing import Any

import numpy as np

from .._errors import SampleError
from ..engine.skips import SKIPS_KEPT

__all__ = ["TaskLog", "decode_items", "task_log"]

# Readers kept per task worker (Ray reuses a worker for the next task, of this dataset or the
# next), by the clips' description: a reader caches its files' probes, so a later task over the
# same clips does not open them again.
_READERS_KEPT = 2
_readers: OrderedDict[str, Any] = OrderedDict()
# The log is one small actor call per task; far longer means the cluster is gone from here.
_LOG_TIMEOUT_S = 120


class TaskLog:
    """What the tasks of each dataset (its token) report: the samples left out by
    ``on_error="skip"`` (``(epoch, sample) -> reason`` in the order reported, each once however
    often a task is re-run; the most recent ``SKIPS_KEPT``, as a loader keeps) and, per node, the
    tasks and samples read and the reader's counters (``ClipReader.counters``)."""

    def __init__(self) -> None:
        self.skips: dict[str, OrderedDict[tuple[int, int], str]] = {}
        self.nodes: dict[str, dict[str, dict[str, int]]] = {}

    def add(self, token: str, node: str, skips: list[tuple[int, int, str]], counts: dict[str, int]) -> None:
        mine = self.skips.setdefault(token, OrderedDict())
        for epoch, sample, reason in skips:
            mine.setdefault((epoch, sample), reason)
        while len(mine) > SKIPS_KEPT:
            mine.popitem(last=False)
        done = self.nodes.setdefault(token, {}).setdefault(node, {})
        for k, n in counts.items():
            done[k] = done.get(k, 0) + n

    def skipped(self, token: str) -> list[tuple[int, int, str]]:
        return [(e, s, r) for (e, s), r in self.skips.get(token, {}).items()]

    def stats(self, token: str) -> dict[str, dict[str, int]]:
        return self.nodes.get(token, {})

    def forget(self, token: str) -> None:
        self.skips.pop(token, None)
        self.nodes.pop(token, None)


# One log per driver and Ray session: an actor is a process of its own, too dear to start for each
# dataset (an epoch each).
_log: tuple[str, Any] | None = None


def task_log() -> Any:
    """The driver's ``TaskLog`` actor, on the driver's node (it outlives any decode node), no CPU.
    The affinity is hard: a soft one lets Ray place it on a decode node, whose loss would take
    every task's report with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    global _log
    context = ray.get_runtime_context()
    session = f"{context.get_job_id()}:{ray.get_runtime_context().gcs_address}"
    if _log is None or _log[0] != session:
        here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
        _log = (session, ray.remote(num_cpus=0)(TaskLog).options(scheduling_strategy=here).remote())
    return _log[1]


def _reader(clips: Any, key: str) -> Any:
    reader = _readers.get(key)
    if reader is None:
        reader = _readers[key] = clips.reader()
        while len(_readers) > _READERS_KEPT:
            _readers.popitem(last=False)
    _readers.move_to_end(key)
    return reader


def _report(log: Any, token: str, skips: list[tuple[int, int, str]], counts: dict[str, int]) -> None:
    """The task's skips and counts to the log, before its rows count as delivered (so
    ``skipped(ds)`` is complete once they are). Ray Data turns any exception of this function into
    a user error, which ends the dataset and is never retried: a worker that lost the cluster (its
    node's raylet died mid-task) exits as a dead worker does instead, and Ray runs the task again
    elsewhere."""
    import ray

    try:
        node = ray.get_runtime_context().get_node_id()
        ray.get(log.add.remote(token, node, skips, counts), timeout=_LOG_TIMEOUT_S)
    except ray.exceptions.RayError:
        os._exit(1)


def decode_items(batch: dict[str, np.ndarray], *, clips: Any, token: str, reader_key: str, seed: int,
                 on_error: str, log: Any) -> dict[str, np.ndarray]:
    """``map_batches`` function: the rows of the task items in ``batch`` (``epoch``,
    ``samples``), as the reader of ``clips`` gives them (``clips.reader().read``: ``ClipReader``,
    ``PlannedReader``, ``EpisodeReader``) plus ``epoch`` and ``sample``; ``reader_key`` names the
    description ``clips`` (equal keys, equal descriptions: one reader serves them)."""
    reader = _reader(clips, reader_key)
    before = reader.counters()
    parts: list[dict[str, np.ndarray]] = []
    skips: list[tuple[int, int, str]] = []
    for epoch, samples in zip(batch["epoch"].tolist(), batch["samples"]):
        ids = [int(s) for s in samples]
        try:
            parts.append(_rows(reader.read(ids, seed=seed, epoch=epoch), epoch, ids))
            continue
        except Exception:  # noqa: BLE001, S110 - one cannot be read: each alone below says which
            pass
        for s in ids:  # which of them fails: the others are still delivered
            try:
                parts.append(_rows(reader.read([s], seed=seed, epoch=epoch), epoch, [s]))
            except Exception as e:
                if on_error == "raise":
                    err = SampleError(s, clips.describe(s), type(e).__qualname__, str(e))
                    raise err from e
                skips.append((epoch, s, f"{type(e).__qualname__}: {e}"))
                traceback.clear_frames(e.__traceback__)
    counts = {k: n - before.get(k, 0) for k, n in reader.counters().items()}
    counts.update(tasks=1, samples=sum(len(p["sample"]) for p in parts), skipped=len(skips))
    _report(log, token, skips, counts)
    if not parts:  # every sample skipped: no rows, of the fields the reader gives (a field of rows too)
        return _rows(reader.read([], seed=seed, epoch=0), 0, [])
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _rows(arrays: dict[str, np.ndarray], epoch: int, ids: list[int]) -> dict[str, np.ndarray]:
    arrays["epoch"] = np.full(len(ids), epoch, np.int64)
    arrays["sample"] = np.asarray(ids, np.int64)
    return arrays
