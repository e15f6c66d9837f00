"""Worker process entry point: ``python -m shmloader.engine.worker FD...``.

Workers are started by ``subprocess`` (fork+exec of a fresh interpreter), never by forking
the training process (which may hold TensorFlow's threads) and never by multiprocessing's
spawn, which re-imports the user's ``__main__`` — and with it TensorFlow — in every worker.
This module imports numpy and shmloader's own modules only; decord comes in with the video
source. The user's source and transform arrive pickled by value (cloudpickle), so callables
defined in a notebook or a script's ``__main__`` work.

Each worker: reads a task (items (slot, position, sample, epoch)), builds each sample's
generator from ``(seed, epoch, sample)`` — the same whatever worker runs it — decodes straight
into the slots (the samples of one video in one pass, when the source can), runs the transform
in place, and answers with one DONE message (see NOTE [ Tasks and replies ] in ``engine.schedule``).
A lifeline pipe, whose write end only the loader holds, ends the worker if the loader dies (see
NOTE [ Shutdown ] in ``engine.pool``). What decord and FFmpeg print goes into the error of the sample
that made them print (``engine.native_log``).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback


def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def _watch_lifeline(fd: int) -> None:
    try:
        os.read(fd, 1)  # returns only at EOF: the loader closed it or died
    finally:
        os._exit(0)


def _error_payload(exc: BaseException) -> bytes:
    from .native_log import with_native_lines

    t = type(exc)
    info = {
        "type": t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}",
        "message": with_native_lines(str(exc)),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    from .protocol import MAX_ERROR_BYTES

    data = json.dumps(info).encode()
    if len(data) > MAX_ERROR_BYTES:
        info["traceback"] = info["traceback"][-MAX_ERROR_BYTES // 2 :]
        info["message"] = info["message"][: MAX_ERROR_BYTES // 4]
        data = json.dumps(info).encode()[:MAX_ERROR_BYTES]
    return data


def _log_like_the_loader(level: int | None) -> None:
    """The ``shmloader`` logger's lines below WARNING (a source's DEBUG lines: which decoder it
    chose) to stderr, where the loader's own ``shmloader`` logger lets them through."""
    import logging

    if level is not None and level < logging.WARNING:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"shmloader worker {os.getpid()}: %(message)s"))
        logger = logging.getLogger("shmloader")
        logger.setLevel(level)
        logger.addHandler(handler)


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group: only the training process reports it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    task_fd, done_fd, life_fd, ring_fd, cfg_fd = (int(a) for a in argv[:5])
    if len(argv) > 5:
        # Before any thread exists: decord's decoding threads inherit the mask.
        os.sched_setaffinity(0, {int(argv[5])})
    threading.Thread(target=_watch_lifeline, args=(life_fd,), daemon=True).start()

    with os.fdopen(cfg_fd, "rb") as f:
        sys_path, payload = pickle.load(f)  # builtins only: safe before sys.path is set
    sys.path[:0] = [p for p in sys_path if p not in sys.path]

    import cloudpickle  # noqa: F401  (registers what payload needs)
    import numpy as np

    from . import native_log
    from .protocol import (COUNTS, DONE, FAILURE, ITEMS, MAX_TASK_ITEMS, NO_COUNTS, OP_READ, ST_DONE,
                            ST_READY, TASK, TASK_ITEM, write_all)
    from .ring import attach_views

    cfg = pickle.loads(payload)
    _log_like_the_loader(cfg.get("log_level"))
    nslots = cfg["slots"]
    slots = attach_views(ring_fd, cfg["layout"], nslots)
    batch_size = cfg["layout"].batch_size
    rows = {f.name: f.offsets for f in cfg["layout"].fields if f.offsets}  # fields of rows, their offsets
    os.close(ring_fd)
    source, transform, seed = cfg["source"], cfg["transform"], cfg["seed"]
    decode_spec = cfg["scratch"]  # decode layout when the transform changes shapes, else None
    scratch: list[dict] = []  # one decode buffer per item of the largest task so far
    native_log.capture()
    source.worker_init()
    write_all(done_fd, DONE.pack(ST_READY, 0, 0, 0.0, *NO_COUNTS))
    counters = getattr(source, "counters", None)  # cumulative, by name; each reply carries the task's share
    counted = NO_COUNTS

    while True:
        head = _read_exact(task_fd, TASK.size)
        if not head:
            return 0
        op, count = TASK.unpack(head)
        if op != OP_READ or not 0 < count <= MAX_TASK_ITEMS:
            return 0
        body = _read_exact(task_fd, count * TASK_ITEM.size)
        if not body:
            return 0
        items = list(TASK_ITEM.iter_unpack(body))
        if any(it[0] >= nslots or it[1] >= batch_size for it in items):
            return 0  # not from our loader; it sees this worker exit
        t0 = time.perf_counter()
        native_log.take()  # forget what earlier samples printed
        if decode_spec is not None:
            while len(scratch) < count:
                scratch.append({k: np.empty(shape, dtype) for k, (shape, dtype) in decode_spec.items()})
        failed = {}
        # Items drawn in one epoch are read together; a batch that spans epochs has a few runs.
        epochs = np.frombuffer(body, ITEMS)["epoch"]
        cuts = [0, *(np.flatnonzero(epochs[1:] != epochs[:-1]) + 1).tolist(), count]
        for lo, hi in zip(cuts, cuts[1:]):
            part = items if hi - lo == count else items[lo:hi]
            outs = Outs(slots, part, rows)
            decoded = outs if decode_spec is None else scratch[lo:hi]
            for i, err in _run(source, transform, part, seed, int(epochs[lo]), outs, decoded).items():
                failed[lo + i] = err
        busy = time.perf_counter() - t0
        now = counted if counters is None else tuple(counters().get(name, 0) for name in COUNTS)
        delta = [max(0, a - b) for a, b in zip(now, counted)]
        counted = now
        reply = [DONE.pack(ST_DONE, count, len(failed), busy, *delta)]
        for i, err in failed.items():
            reply.append(FAILURE.pack(i, len(err)) + err)
        write_all(done_fd, b"".join(reply))


class Rngs:
    """Each item's generator, seeded by ``(seed, epoch, sample)``, made when first asked for (a
    source of array rows never asks, and a generator costs more than reading a row)."""

    __slots__ = ("_key", "_samples", "_made")

    def __init__(self, seed: int, epoch: int, samples: list[int]) -> None:
        self._key = (seed, epoch)
        self._samples = samples
        self._made: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, i: int):
        g = self._made.get(i)
        if g is None:
            from .plan import seeded

            g = self._made[i] = seeded((*self._key, self._samples[i]))
        return g

    def fresh(self) -> "Rngs":
        return Rngs(*self._key, self._samples)


class Outs:
    """Each item's place in its slot, ``{field: array}``, made when first asked for. ``block``:
    ``{field: array[n, ...]}`` over all the items at once when they are consecutive positions of
    one slot (a run of a batch), for sources that fill many rows in one go; else None. ``rows``:
    the fields of rows and their offsets fields: an item's rows lie where the loader wrote
    (NOTE [ Samples of several sizes ] in ``engine.source``), and offsets are not the source's."""

    __slots__ = ("_slots", "_items", "_made", "block", "_rows")

    def __init__(self, slots: list[dict], items: list[tuple[int, int, int, int]],
                 rows: dict[str, str] | None = None) -> None:
        self._slots = slots
        self._items = items
        self._made: dict[int, dict] = {}
        self._rows = rows or {}
        slot, first = items[0][0], items[0][1]
        run = not self._rows and all(it[0] == slot and it[1] == first + i for i, it in enumerate(items))
        self.block = {k: v[first : first + len(items)] for k, v in slots[slot].items()} if run else None

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict:
        d = self._made.get(i)
        if d is None:
            slot, pos = self._items[i][:2]
            views, rows = self._slots[slot], self._rows
            if not rows:
                d = {k: v[pos, ...] for k, v in views.items()}  # 0-d views too
            else:
                offsets = set(rows.values())
                d = {k: v[views[rows[k]][pos] : views[rows[k]][pos + 1]] if k in rows else v[pos, ...]
                     for k, v in views.items() if k not in offsets}
            self._made[i] = d
        return d


def _run(source, transform, items, seed, epoch, outs, decoded) -> dict[int, bytes]:
    """Read (and transform) every item; return the error report of each that failed.

    All items in one call to the source's ``read_many`` when it has one (the clips of a video in
    one decode pass, rows in one gather); if that raises, each item is read on its own, from a
    fresh generator, to find which failed. Items are independent: one failure costs no other.
    """
    count = len(items)
    samples = [it[2] for it in items]
    rngs, epoch_key = Rngs(seed, epoch, samples), (seed, epoch)
    read_many = getattr(source, "read_many", None)
    failed: dict[int, bytes] = {}
    whole = read_many is not None or count == 1
    if whole:
        try:
            if read_many is not None:
                read_many(samples, rngs, decoded, epoch_key)
            else:
                source.read(samples[0], rngs[0], decoded[0])
        except Exception as exc:
            if count == 1:
                failed[0] = _error_payload(exc)
            else:
                whole = False
                rngs = rngs.fresh()
    if not whole:
        for i in range(count):
            try:
                if read_many is not None:
                    read_many([samples[i]], [rngs[i]], [decoded[i]], epoch_key)
                else:
                    source.read(samples[i], rngs[i], decoded[i])
            except Exception as exc:
                failed[i] = _error_payload(exc)
    if transform is not None:
        for i in range(count):  # each transform continues its sample's generator
            if i in failed:
                continue
            try:
                mine = dict(decoded[i])  # it may replace entries instead of writing in place
                result = transform(mine, rngs[i])
                _store(mine if result is None else result, outs[i])
            except Exception as exc:  # reported to the loader, which raises or skips
                failed[i] = _error_payload(exc)
    return failed


def _store(result, out) -> None:
    import numpy as np

    if not isinstance(result, dict) or set(result) != set(out):
        got = sorted(result) if isinstance(result, dict) else type(result).__name__
        raise TypeError(f"transform must return a dict with keys {sorted(out)}, got {got}")
    for k, dst in out.items():
        src = result[k]
        if src is dst:
            continue  # modified in place, already in the slot
        src = np.asarray(src)
        if src.shape != dst.shape:
            raise ValueError(f"transform output {k!r} has shape {src.shape}, expected {dst.shape}")
        np.copyto(dst, src, casting="same_kind")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
