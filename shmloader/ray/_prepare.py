"""``shmloader.ray.prepare``: ``shmloader.prepare``'s per-file work in Ray tasks on a cluster's nodes.

Ray is imported inside the functions only: ``shmloader.ray`` imports this module, and nothing
here may run at ``import shmloader``.

NOTE [ Preparing on Ray ]
The driver lists the sources, keeps what an earlier run finished and writes the manifest, as
``shmloader.prepare`` does (``tools.prepare.prepare_files``); only the per-file work moves: the same
function (``tools.prepare.prepare_one``), one Ray task a file, twice as many in flight as the
cluster has slots for them, through the local run's runner (``tools.runner``, with ``RayBackend``:
NOTE [ Running per-file work ]). Ray runs a task lost with its node or worker again elsewhere (up to
``_RETRIES`` times). Each try writes its copy under a temporary name of its own (a random tag) and
renames it when whole, so a try that runs on after Ray gave its task up for lost (its raylet gone,
its worker not yet) never writes into the file of the try that replaced it; the manifest has one row
a file, the answer the driver got. The temporary files of tries that died are removed at the end of
the run, or of a stop, once every task has answered. Plain tasks rather than Ray Data's ``map``: the
driver cancels one task (its worker killed) whose file is over ``timeout`` from when it is the
oldest in flight (and tries it once more, with twice the time, as a task of its own), and a file
whose worker dies on every try is a row that says so; Ray Data stops neither one task, and its
failed task ends the dataset. A cancel waits a moment for tasks that are answering
(``RayBackend.stop``: Ray aborts the driver when a cancel meets one). ``out`` must be a folder every
node writes at the same path (a shared file system).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from ._nodes import task_slots, wait_for_a_node
from .._checks import check_seconds
from ..tools.prepare import FILE_TIMEOUT, check_spec, prepare_files, raise_for_fail_on
from ..tools.rescan import check_fail_on
from ..tools.runner import Crashed, Work

__all__ = ["prepare"]

# Tries of a file's task after the first when its worker or node is lost (Ray's own default
# for tasks): a lost node costs one; a file that crashes its decoder every time is given up.
_RETRIES = 3
# How often the driver counts the cluster's slots again (a node that joins gets work).
_SLOTS_EVERY_S = 10.0
# How long the driver waits for a cancelled task's worker to be gone before it removes the
# task's temporary file (a force-cancel kills the worker; the answer comes once it has).
_SETTLE_S = 30.0
# How long tasks about to be cancelled may still answer first (see ``RayBackend.stop``): a
# task's answer comes within milliseconds of its end.
_GRACE_S = 0.2


def prepare(sources: Iterable[str | os.PathLike[str]] | str | os.PathLike[str], out: str | os.PathLike[str], *,
            short_side: int | None = None, size: tuple[int, int] | None = None, gop: int = 16, crf: int = 23,
            timeout: float | None = FILE_TIMEOUT, fail_on: Iterable[str] | str = (), progress: bool = False,
            storage_options: dict[str, Any] | None = None, num_cpus: float = 1,
            resources: dict[str, float] | None = None, node_timeout: float = 600.0,
            **ray_remote_args: Any) -> str:
    """``shmloader.prepare`` with the files prepared in Ray tasks on the cluster's nodes (NOTE
    [ Preparing on Ray ]): the same copies and the same ``out/manifest.csv``, whose path it
    returns. ``out`` must be a folder every node writes at the same path (a shared file system;
    on one machine, any folder); the sources as every node reads them (the same paths, or URLs
    and tar shards through ``storage_options``, as ``shmloader.prepare`` reads them).

    ``sources``, ``short_side``, ``size``, ``gop``, ``crf``, ``fail_on``, ``progress`` and
    ``storage_options`` as ``shmloader.prepare``'s; a rerun into ``out`` keeps the copies it
    finished, as there. ``timeout``: seconds a file may take from when it is the oldest in
    flight (None: no limit); its task is cancelled and tried once more as a task of its own with
    twice the time, and then its row says so.

    :param num_cpus: CPUs each task takes (a task encodes on one core).
    :param resources: custom resources each task needs, e.g. ``{"decode": 1}`` to keep the work
        on the nodes started with that resource.
    :param node_timeout: seconds to wait for a node that can run a task, as
        ``shmloader.ray.dataset``'s: ``LoaderError`` at once where no node has what a task asks
        for and no autoscaler could add one, after ``node_timeout`` where one could.
    :param ray_remote_args: passed to the task's ``options()`` (``scheduling_strategy``,
        ``memory``, ``max_retries``...).
    """
    import ray

    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    check_spec(short_side, size, gop, crf)  # wrong arguments are told before any wait
    check_fail_on(fail_on)
    if timeout is not None:
        check_seconds("timeout", timeout)
    check_seconds("node_timeout", node_timeout)
    if not ray.is_initialized():
        ray.init()
    need = {"CPU": num_cpus, **(resources or {})}
    wait_for_a_node(need, node_timeout, "prepare tasks")
    options = {"num_cpus": num_cpus, "resources": resources, "max_retries": _RETRIES, **ray_remote_args}
    summary = prepare_files(sources, out, short_side=short_side, size=size, gop=gop, crf=crf,
                            timeout=timeout, fail_on=fail_on, progress=progress,
                            storage_options=storage_options, backend=RayBackend(options), tagged=True)
    return raise_for_fail_on(summary, fail_on)


def _call(work: Work) -> Any:
    """A try, in a Ray task."""
    return work.fn(*work.args)


class RayBackend:
    """``tools.runner``'s tries as Ray tasks with ``options`` (NOTE [ Preparing on Ray ]): twice
    as many in flight as the cluster has slots for them; a try fails or is cancelled alone."""

    shared = False

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._task: Any = None
        self._slots, self._counted = 0, -_SLOTS_EVERY_S
        self._flying: set[Any] = set()

    def window(self) -> int:
        if time.monotonic() - self._counted >= _SLOTS_EVERY_S:
            self._slots = task_slots(self._options["num_cpus"], self._options["resources"])
            self._counted = time.monotonic()
        return 2 * max(1, self._slots)

    def submit(self, work: Work) -> Any:
        import ray

        if self._task is None:
            self._task = ray.remote(_call).options(**self._options)
        ref = self._task.remote(work)
        self._flying.add(ref)
        return ref

    def wait(self, handles: list[Any], timeout: float | None) -> list[Any]:
        import ray

        if not handles:
            return []
        return list(ray.wait(handles, num_returns=1, timeout=timeout)[0])

    def result(self, handle: Any) -> Any:
        import ray

        self._flying.discard(handle)
        try:
            return dict(ray.get(handle))
        except ray.exceptions.RayError as e:
            raise Crashed(_why(e, self._options["max_retries"])) from None

    def stop(self, handles: list[Any]) -> list[Any]:
        """The tasks of ``handles`` that answer within ``_GRACE_S``; the others are cancelled
        (their workers killed), and waited for, up to ``_SETTLE_S``, until Ray has answered for
        each: their workers write no more. Why not cancel them all: Ray (2.60) aborts the driver
        ("Tried to complete task that was not pending") when a cancel meets a task that is
        answering, whose answer ``ray.wait`` already sees; a stop raised as ``ray.wait`` returns
        meets one."""
        import ray

        if not handles:
            return []
        ready, rest = ray.wait(handles, num_returns=len(handles), timeout=_GRACE_S)
        for ref in rest:
            ray.cancel(ref, force=True)
            self._flying.discard(ref)
        if rest:
            ray.wait(rest, num_returns=len(rest), timeout=_SETTLE_S)
        return list(ready)

    def close(self) -> None:
        flying, self._flying = list(self._flying), set()
        self.stop(flying)  # a file finished as the run stops: the next run finds its copy unlisted, makes it again


def _why(e: Exception, retries: int) -> str:
    """A row's reason for a task that did not answer (Ray's exception, its first line)."""
    import ray

    first = (str(e).strip().splitlines() or [""])[0][:200]
    if isinstance(e, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        tries = "once" if retries == 0 else f"{retries + 1} times" if retries > 0 else "again and again"
        return f"its process died, tried {tries} (a crash in the decoder or encoder?): {first}"
    return f"its task failed: {type(e).__name__}: {first}"
