"""Worker process entry point: ``python -m shmloader._worker FD...``.

Workers are started by ``subprocess`` (fork+exec of a fresh interpreter), never by forking
the training process (which may hold TensorFlow's threads) and never by multiprocessing's
spawn, which re-imports the user's ``__main__`` — and with it TensorFlow — in every worker.
This module imports numpy and shmloader's own modules only; decord comes in with the video
source. The user's source and transform arrive pickled by value (cloudpickle), so callables
defined in a notebook or a script's ``__main__`` work.

Each worker: reads a task (slot, position, sample, epoch), builds the sample's generator from
``(seed, epoch, sample)`` — the same whatever worker runs it — decodes straight into the slot,
runs the transform in place, and reports a DONE message. A lifeline pipe, whose write end only
the loader holds, ends the worker if the loader dies (see NOTE [ Shutdown ] in ``_pool``).
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
    t = type(exc)
    info = {
        "type": t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    from ._protocol import MAX_ERROR_BYTES

    data = json.dumps(info).encode()
    if len(data) > MAX_ERROR_BYTES:
        info["traceback"] = info["traceback"][-MAX_ERROR_BYTES // 2 :]
        info["message"] = info["message"][: MAX_ERROR_BYTES // 4]
        data = json.dumps(info).encode()[:MAX_ERROR_BYTES]
    return data


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

    from ._protocol import DONE, OP_READ, ST_ERROR, ST_OK, ST_READY, TASK, write_all
    from ._ring import attach_views

    cfg = pickle.loads(payload)
    slots = attach_views(ring_fd, cfg["layout"], cfg["slots"])
    os.close(ring_fd)
    source, transform, seed = cfg["source"], cfg["transform"], cfg["seed"]
    scratch = cfg["scratch"]  # decode layout when the transform changes shapes, else None
    if scratch is not None:
        scratch = {k: np.empty(shape, dtype) for k, (shape, dtype) in scratch.items()}
    source.worker_init()
    write_all(done_fd, DONE.pack(ST_READY, 0, 0, -1, 0.0, 0))

    while True:
        msg = _read_exact(task_fd, TASK.size)
        if not msg:
            return 0
        op, slot, pos, sample, epoch = TASK.unpack(msg)
        if op != OP_READ:
            return 0
        t0 = time.perf_counter()
        try:
            out = {k: v[pos, ...] for k, v in slots[slot].items()}  # 0-d views too
            rng = np.random.default_rng((seed, epoch, sample))
            decoded = out if scratch is None else scratch  # scratch only comes with a transform
            source.read(sample, rng, decoded)
            if transform is not None:
                mine = dict(decoded)  # the transform may replace entries instead of writing in place
                result = transform(mine, rng)
                _store(mine if result is None else result, out)
            status, err = ST_OK, b""
        except Exception as exc:  # reported to the loader, which raises or skips
            status, err = ST_ERROR, _error_payload(exc)
        busy = time.perf_counter() - t0
        write_all(done_fd, DONE.pack(status, slot, pos, sample, busy, len(err)) + err)


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
