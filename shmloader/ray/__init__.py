"""Beyond one node: decode a source (:class:`~shmloader.VideoClips`, ``shmloader.planned``'s
``PlannedVideos``, ``shmloader.lerobot``'s ``LeRobotSource``: a ``Source``) in Ray tasks on a
cluster's CPU nodes and feed the trainers through Ray Data (``dataset``); prepare a dataset's
training copies in Ray tasks (``prepare``). The public face of Ray in shmloader (``shmloader[ray]``).

What lives here, a module a line:

- this module: ``dataset``, ``plan_items``, ``skipped``, ``stats``: the epoch plan as Ray tasks;
  ``Source``, what they read of a source
- ``_tasks``: what runs inside the decode tasks, and the skip log
- ``_prepare``: ``prepare``, prepare's per-file work as Ray tasks (the runner's Ray backend)
- ``_nodes``: waiting for a node that can run the tasks; counting their slots

What it may import: the standard library, numpy, Ray (inside functions in ``_tasks``, ``_nodes``
and ``_prepare``), ``shmloader._errors``, ``shmloader._checks``, the engine, the reading path and the
dataset tools.

NOTE [ Epochs on Ray ]
The epoch plan is the loader's own (``engine.plan.EpochPlan``): epoch ``e`` holds the samples a
``Loader(clips, seed=, shuffle=)`` delivers in epoch ``e``, and sample ``i`` draws its clips from
``(seed, e, i)`` in the task that reads it (``ClipReader.read``), so each row holds exactly the
frames the local loader gives it, whichever node reads it and however often a task is re-run.
The plan is cut into task items in the driver (no file opened there): a run of
``samples_per_task`` samples, or for a grouped source (``group_clips=True``; a LeRobot dataset's
stretches of an episode) whole groups' samples of that epoch (one decode pass per group) up to
that many; the groups are the plan's, as the loader's (``group_ids`` where the source has them,
groups of several sizes); the default size is set by ``_SAMPLES_PER_TASK``,
``_PASSES_PER_TASK`` and ``_TASK_BYTES``.
Ray re-runs a task lost with its node or worker; an exception of ours is not retried and ends
the dataset, so the error policy lives in the task (``on_error``).

NOTE [ Tasks in flight ]
A dataset of ours caps its decode tasks in flight (``TaskPoolStrategy(size=)``) at twice the
decode slots the cluster has when the dataset is built, so each slot has its next task queued at
its node, and turns Ray Data's resource reservation off on its own ``DataContext``
(``ds.context``, shared by the datasets derived from it; the global one is left alone). Why: Ray
Data budgets an operator's CPUs from what its autoscaling coordinator has reserved for the
dataset so far, nothing at the start and then a share that follows the measured rates, and that
left decode slots idle between tasks (bench/ray_feed.py: bench/results/ray-feed-cpu2-run13.md,
the cap, against ray-feed-cpu2-run15.md, Ray Data's scheduling).
The cost: without the reservation no operator is held back by Ray's object store budget. The cap
holds tasks, not the finished clips waiting for a slow trainer, which may fill the object stores
(bench/ray_feed.py --run-ahead: bench/results/ray-feed-cpu2-run18.md); ``tasks_in_flight="ray"``
keeps Ray Data's scheduling for that case.
"""

from __future__ import annotations

import uuid
import weakref
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from ._nodes import task_slots, wait_for_a_node
from ._prepare import prepare
from ._tasks import decode_items, task_log
from ..engine.buckets import Bucketed
from ..engine.plan import EpochPlan
from .._checks import check_choice, check_int, check_seconds
from ..engine.skips import ON_ERROR
from ..engine.source import Family
from ..video.identity import digest
from ..video.planned import PlannedVideos

if TYPE_CHECKING:
    import ray.data

__all__ = ["dataset", "plan_items", "prepare", "skipped", "stats"]


class Source(Family, Protocol):
    """What ``dataset`` and ``plan_items`` read of a family's description (NOTE [ A family of
    samples ] in ``engine.source``): its samples and fields, what names a sample in an error, a
    reader for the tasks, and its groups (``group_size``, and ``group_ids`` where it has groups of
    several sizes, as the loader reads them). ``VideoClips``, ``PlannedVideos`` and
    ``shmloader.lerobot``'s ``LeRobotSource`` are; it travels to the tasks by value (pickled), and
    ``__getstate__`` names it (one reader per description a worker)."""

    @property
    def group_size(self) -> int: ...


# Default task size: Ray spends a fixed CPU cost on each task (the driver's executor, the raylets,
# the worker around our function), so a task carries far more decoding than that. Measured with
# 8, 32 and 64 samples a task, 8 and 16 videos grouped (bench/ray_feed.py at each size:
# bench/results/ray-feed-cpu2-run7.md, -run10.md, -run11.md), the largest was the fastest.
_SAMPLES_PER_TASK = 64
# With group_clips, at least this many whole videos a task (a decode pass each).
_PASSES_PER_TASK = 16
# And no more bytes of rows a task than Ray Data's own target block size: a task's rows are one
# block, every field of a sample counted (video, audio, labels...: ``_row_bytes``).
_TASK_BYTES = 128 * 1024**2
# The loader's default shuffle window of a grouped source is 4 batches' worth of samples
# (_loader._GROUP_WINDOW_BATCHES); here it is in videos.
_GROUP_WINDOW = 8
# The DataContext config key under which a dataset keeps its task log (skipped(), stats()).
_LOG_KEY = "shmloader.task_log"


def plan_items(clips: Source, *, epochs: int = 1, seed: int = 0, shuffle: bool = False,
               start_epoch: int = 0, samples_per_task: int | None = None,
               group_window: int | None = None) -> list[dict[str, Any]]:
    """The tasks of epochs ``start_epoch .. start_epoch + epochs - 1``: ``[{"epoch": e,
    "samples": [ids]}]`` in plan order (see NOTE [ Epochs on Ray ]); a group's samples of an
    epoch (a video's with ``group_clips``, a LeRobot dataset's stretch of an episode) are all in
    one item (with other whole groups, up to ``samples_per_task`` samples; by default 64 samples,
    or 16 groups' samples, up to 128 MB of rows, every field counted (video, audio, labels...),
    and at least one group). ``shuffle`` and ``seed`` as the ``Loader``'s."""
    check_int("epochs", epochs, 1)
    check_int("seed", seed, 0)
    check_int("start_epoch", start_epoch, 0)
    group = int(clips.group_size)
    if samples_per_task is None:
        fit = _TASK_BYTES // _row_bytes(clips)
        samples_per_task = max(group, min(max(_SAMPLES_PER_TASK, _PASSES_PER_TASK * group), fit))
    check_int("samples_per_task", samples_per_task, 1)
    window = group_window if group_window is not None else _GROUP_WINDOW
    plan = EpochPlan.for_source(clips, 1, shuffle=shuffle, seed=seed, window=window)
    items: list[dict[str, Any]] = []
    for epoch in range(start_epoch, start_epoch + epochs):
        order = plan.order(epoch)
        # The plan's groups, not group_size: a source with group_ids has groups even where they
        # average one sample (the plan counts them as groups then).
        if plan.group == 1:
            items += [{"epoch": epoch, "samples": order[i : i + samples_per_task].tolist()}
                      for i in range(0, len(order), samples_per_task)]
            continue
        videos: dict[int, list[int]] = {}
        for sample, g in zip(order.tolist(), np.asarray(plan.group_of(order)).tolist()):
            videos.setdefault(g, []).append(sample)
        item: list[int] = []
        for samples in videos.values():  # whole videos, up to samples_per_task samples a task
            if item and len(item) + len(samples) > samples_per_task:
                items.append({"epoch": epoch, "samples": item})
                item = []
            item = item + samples
        if item:
            items.append({"epoch": epoch, "samples": item})
    return items


def _row_bytes(clips: Source) -> int:
    """Bytes of one row of a task's block: every field of a sample (``clips.spec()``: video,
    audio and its length, labels, frame numbers...; a field of rows at its largest sample's) and
    the ``epoch`` and ``sample`` a task adds."""
    spec = {**clips.spec(), "epoch": ((), np.dtype(np.int64)), "sample": ((), np.dtype(np.int64))}
    # a field of rows at its largest sample's: planned videos' sizes, a bucketed source's largest bucket
    rows = clips.sizes().rows if isinstance(clips, PlannedVideos) else (
        clips.buckets().rows if isinstance(clips, Bucketed) else {})
    total = 0
    for name, (shape, dtype) in spec.items():
        count, shape = (int(rows[name].max(initial=0)), shape[1:]) if shape[:1] == (-1,) else (1, shape)
        total += count * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def dataset(clips: Source, *, epochs: int = 1, seed: int = 0, shuffle: bool = False,
            on_error: str = "raise", num_cpus: float = 1, resources: dict[str, float] | None = None,
            start_epoch: int = 0, samples_per_task: int | None = None,
            group_window: int | None = None, tasks_in_flight: int | str = "auto",
            node_timeout: float = 600.0, **ray_remote_args: Any) -> ray.data.Dataset:
    """A Ray Dataset of the samples of ``clips``, decoded in Ray tasks.

    One row per sample with the fields of a ``Loader`` batch (``video``, ``label``, ``index``,
    ``start``, ``frames``, ``mask`` with ``max_frames``; a LeRobot dataset's cameras, numeric
    features and ``<key>_is_pad``) plus ``epoch`` and ``sample`` (the sample id). Epoch ``e``
    holds the samples, clips and frames of epoch ``e`` of ``Loader(clips, seed=seed,
    shuffle=shuffle)`` (NOTE [ Epochs on Ray ]); rows come in the order tasks finish unless the
    ``DataContext`` preserves order. ``seed``, ``shuffle``, ``on_error`` and ``group_window`` mean
    what they mean to ``Loader``, with its defaults.

    :param clips: the dataset's description (``VideoClips``, ``PlannedVideos``,
        ``shmloader.lerobot.dataset(root)``: a ``Source``); it travels to the tasks by value
        (paths, options, a scan manifest's probe columns, a LeRobot dataset's tables: no file is
        probed twice, no table read again).
    :param epochs: epochs in the dataset, numbered from ``start_epoch``; iterating it again
        gives the same epochs (make one dataset per epoch with ``start_epoch=e``, or
        ``epochs=N`` for one stream).
    :param on_error: ``"raise"``: the first unreadable sample ends the iteration with a
        ``SampleError`` naming its sample and file (Ray's exception for it is an instance of
        ``SampleError``: ``except shmloader.SampleError`` catches it; its ``index``, ``where``
        and ``reason`` are the sample's); ``"skip"``: it is left out, and ``skipped(ds)`` lists
        it with its reason, as ``Loader.skipped`` does.
    :param num_cpus: CPUs each decode task takes.
    :param resources: custom resources each task needs, e.g. ``{"decode": 1}`` to keep decoding
        on the nodes started with that resource.
    :param samples_per_task: samples a task reads (with ``group_clips``: whole videos, up to
        this many samples, at least one video; a LeRobot dataset: whole stretches alike); by
        default 64, or with ``group_clips`` 16 videos' (stretches') samples, up to 128 MB of rows
        (every field: video, audio...; Ray's cost per task weighs less in larger tasks).
    :param group_window: videos (a LeRobot dataset's stretches) per shuffle window of a grouped
        source; ``None``: 8.
    :param tasks_in_flight: decode tasks submitted at once (running, or queued at a node for
        the next free slot): ``"auto"``, twice the slots the cluster has for them when the
        dataset is built (its ``num_cpus`` and ``resources``), counted once a node can run the
        tasks (see ``node_timeout``); a number, that many; ``"ray"``, Ray Data's own scheduling,
        which budgets the tasks by its resource reservation and left decode slots idle (NOTE
        [ Tasks in flight ]), but holds back a dataset that fills the object store. With a cap
        of ours the reservation is off on ``ds.context``, which the datasets derived from ``ds``
        share: their operators are not held back by Ray's object store budget either. With
        ``compute=`` or ``concurrency=``, ``"auto"`` leaves the strategy given; a number is an
        error.
    :param node_timeout: seconds to wait, here, for a node that can run a decode task (its
        ``num_cpus`` and ``resources`` on one node). Where no node has them and no autoscaler
        could add one, ``LoaderError`` at once, naming what is missing and what the nodes have;
        with an autoscaler, a warning says what is asked for (``ray.autoscaler.sdk.
        request_resources``, withdrawn once a node is up or the wait is over) and the wait ends
        in ``LoaderError`` after ``node_timeout``.
    :param ray_remote_args: passed to ``Dataset.map_batches``: its named remote parameters
        (``label_selector``, e.g. ``{"ray.io/node-id": id}`` to pin a node, ``memory``,
        ``concurrency``...); others, such as ``scheduling_strategy``, go through Ray's deprecated
        ``ray_remote_args`` (removed in Ray 2.64).
    """
    import ray

    check_choice("on_error", on_error, ON_ERROR)
    theirs = bool({"compute", "concurrency"} & ray_remote_args.keys())  # a compute strategy of the caller's
    size = _cap_given(tasks_in_flight, theirs)  # the cap of ours, if any; "auto" once Ray is up
    items = plan_items(clips, epochs=epochs, seed=seed, shuffle=shuffle, start_epoch=start_epoch,
                       samples_per_task=samples_per_task, group_window=group_window)
    check_seconds("node_timeout", node_timeout)
    if not ray.is_initialized():
        ray.init()
    wait_for_a_node({"CPU": num_cpus, **(resources or {})}, node_timeout, "decode tasks")
    log, token = task_log(), uuid.uuid4().hex
    # The same description gets the same reader in a task worker, dataset after dataset (an epoch
    # each): the probes it keeps (checked against each file's size and mtime) are not read again.
    reader_key = digest(clips)
    # clips by value: Ray Data stores the function's arguments once and hands them to each task as
    # its own (fetched by Ray, retried by Ray), never a reference the task must get itself.
    fn_kwargs = {"clips": clips, "token": token, "reader_key": reader_key, "seed": seed, "on_error": on_error,
                 "log": log}
    items_ds = ray.data.from_items(items, override_num_blocks=len(items))
    if tasks_in_flight == "auto" and not theirs:
        slots = task_slots(num_cpus, resources)
        size = 2 * slots if slots else None
    if size is not None:
        # no more than the tasks there are (Ray Data warns of a cap its inputs cannot reach)
        ray_remote_args["compute"] = ray.data.TaskPoolStrategy(size=max(1, min(size, len(items))))
    ds = items_ds.map_batches(cast(Any, decode_items), batch_size=1, batch_format="numpy",
                              fn_kwargs=fn_kwargs, num_cpus=num_cpus, resources=resources,
                              **ray_remote_args)
    _set_context(ds, size is not None, log, token)
    return ds


def _cap_given(tasks_in_flight: int | str, theirs: bool) -> int | None:
    """The cap of ours on decode tasks in flight (NOTE [ Tasks in flight ]) where ``dataset``'s
    ``tasks_in_flight`` gives a number, None for ``"auto"`` and ``"ray"``; ``theirs``: the caller
    passed a compute strategy (``compute=``, ``concurrency=``), which a number contradicts."""
    if tasks_in_flight in ("auto", "ray"):
        return None
    try:
        check_int("tasks_in_flight", tasks_in_flight, 1)
    except ValueError:
        raise ValueError("tasks_in_flight must be 'auto', an integer >= 1 or 'ray' (Ray Data's "
                         f"scheduling), got {tasks_in_flight!r}") from None
    if theirs:
        raise ValueError("tasks_in_flight sets the decode tasks' compute strategy: pass it or "
                         "compute=/concurrency=, not both")
    return cast(int, tasks_in_flight)


def _set_context(ds: ray.data.Dataset, capped: bool, log: Any, token: str) -> None:
    """What ``dataset`` sets on its dataset's own ``DataContext`` (``ds.context``, shared by the
    datasets derived from it; the global one is left alone): the reservation off under a cap of
    ours (``capped``), a task's exceptions as they are, and the task log (``log``, ``token``)
    that ``skipped`` and ``stats`` read."""
    if capped:  # NOTE [ Tasks in flight ]: on this dataset's own context, not the global one
        ds.context.op_resource_reservation_enabled = False
    # A task's SampleError reaches the consumer as itself (Ray's exception is an instance of it),
    # not wrapped in Ray Data's UserCodeException.
    ds.context.raise_original_map_exception = True
    # On the dataset's own context, which the datasets derived from it (ds.map, random_shuffle...)
    # share: skipped() and stats() read it from any of them. The entries go with the context.
    ds.context.set_config(_LOG_KEY, (log, token))
    weakref.finalize(ds.context, _forget, log, token).atexit = False  # at exit the whole log goes


def skipped(ds: ray.data.Dataset) -> list[tuple[int, int, str]]:
    """``(epoch, sample, reason)`` of the samples ``dataset(..., on_error="skip")`` left out so
    far, oldest first, as ``Loader.skipped``: the most recent 10,000 are kept, and a sample
    re-read by a re-run task counts once. Complete for the rows already delivered: read it after
    the epoch. ``ds`` is the dataset ``dataset()`` made or one derived from it."""
    import ray

    log, token = _log(ds)
    return [(int(e), int(s), str(r)) for e, s, r in ray.get(log.skipped.remote(token))]


def stats(ds: ray.data.Dataset) -> dict[str, dict[str, int]]:
    """Per node id (hex), what the decode tasks of ``ds`` did there so far: ``tasks``,
    ``samples`` delivered, ``skipped``, and the reader's counters (``decord``, ``pyav``,
    ``probes``, ``bytes``...: ``ClipReader.counters``). A task re-run after a failure counts
    again: this is work done, not rows delivered. ``ds`` as for ``skipped``."""
    import ray

    log, token = _log(ds)
    return {str(n): dict(c) for n, c in ray.get(log.stats.remote(token)).items()}


def _forget(log: Any, token: str) -> None:
    """A dataset is gone: its entries leave the log (nothing to do once Ray is shut down)."""
    import ray

    if ray.is_initialized():
        log.forget.remote(token)


def _log(ds: ray.data.Dataset) -> tuple[Any, str]:
    log = ds.context.get_config(_LOG_KEY)
    if log is None:
        raise ValueError("this reads a dataset made by shmloader.ray.dataset(), or one derived from it")
    return cast("tuple[Any, str]", log)
