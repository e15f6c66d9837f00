"""Worker processes and the pipes to them.

NOTE [ Shutdown ]
Each worker holds three pipe ends: tasks (read), results (write), lifeline (read). The
loader holds the other ends and nobody else does (descriptors are close-on-exec and passed
to one child only; the fork server that forks a worker holds its copies only until the fork,
NOTE [ Fork server ] in ``engine.forkserver``), so:
  * a worker waiting for a task sees EOF on its task pipe when the loader closes it or dies;
  * a worker busy in native code sees EOF on the lifeline from a watcher thread, which ends
    the process (decord releases the GIL while decoding, so the thread gets to run);
  * the loader sees EOF on a result pipe when its worker dies, however it died.
Closing runs in this order, and is safe to repeat:
  1. stop handing out tasks;
  2. close every task and lifeline pipe: idle and busy workers exit by themselves;
  3. wait a short grace period, then SIGKILL what is left (a worker spinning in native code
     while holding the GIL), and reap every child so no zombie remains; a child that SIGKILL
     cannot end at once (uninterruptible sleep: a read from a hung network file system) is
     not waited for past ``REAP_S`` but reaped by a later close or worker start;
  4. close the result pipes;
  5. close the ring's descriptor (``Ring.close``); its mapping goes with the last leased array.
A whole process group killed at once leaves nothing behind: the ring has no name.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Union

from . import forkserver
from .protocol import write_all

WORKER_ENV = "SHMLOADER_WORKER_STARTING"

# A worker forked by the fork server (NOTE [ Fork server ]), or started by fork+exec where it cannot.
Process = Union[forkserver.Forked, subprocess.Popen]

log = logging.getLogger("shmloader")

# How long closing waits for workers to leave by themselves before killing them.
_GRACE_S = 1.0

# How long closing waits for killed workers to end. SIGKILL ends a process only once it leaves
# uninterruptible sleep (a read from a hung NFS or FUSE mount, a frozen cgroup), which may be never:
# closing goes on without it. A killed process takes milliseconds to end otherwise.
REAP_S = 2.0

# Killed workers that had not ended within REAP_S, reaped (waited for without blocking) by
# every later stop_workers and start_worker, so that none stays a zombie once it ends.
_abandoned: list[Process] = []


def _reap_abandoned() -> None:
    _abandoned[:] = [p for p in _abandoned if p.poll() is None]


@dataclass(slots=True, eq=False)
class Worker:
    wid: int
    proc: Process
    task_w: int
    done_r: int
    life_w: int
    started: float
    ready: bool = False
    ready_at: float = 0.0  # when it said READY: its start-up (interpreter, imports) is not its work
    head_since: float = 0.0  # when the worker began its oldest outstanding task
    outstanding: deque = field(default_factory=deque)  # tasks sent, oldest first (``engine.schedule.Task``)
    load: int = 0  # items in those tasks
    buf: bytearray = field(default_factory=bytearray)
    busy_s: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def how_it_ended(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "is still running"
        if code == forkserver.STATUS_LOST:
            return "ended (how is unknown: the fork server that started it had died)"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with code {code}"


# `python -m` puts the working folder first on sys.path, before PYTHONPATH: run from a folder that
# holds another copy of shmloader (a source checkout of another version), a worker would import
# that one and speak another protocol. -P (Python 3.11+) leaves it out; the worker adds the
# training process's sys.path, working folder included, only once shmloader is imported.
_SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # `python -m shmloader.engine.worker` must find this very package, installed or not.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds shmloader/
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # Decoding threads are chosen per worker; BLAS/OpenMP pools inside workers would oversubscribe.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    # Read by shmloader/__init__ before its imports: a Ctrl-C while the worker still starts up
    # must not print a KeyboardInterrupt from it (see engine.worker.main).
    env[WORKER_ENV] = "1"
    return env


def start_worker(wid: int, ring_fd: int, config: bytes, extra_fds: tuple[int, ...] = (),
                 cpu: int | None = None, imports: tuple[str, ...] = ()) -> Worker:
    """Start one worker: forked by the fork server, else by fork+exec of a fresh interpreter
    (see ``engine.worker``)."""
    _reap_abandoned()
    task_r, task_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    life_r, life_w = os.pipe2(os.O_CLOEXEC)
    cfg_fd = os.memfd_create("shmloader-config", os.MFD_CLOEXEC)
    try:
        write_all(cfg_fd, config)
        os.lseek(cfg_fd, 0, os.SEEK_SET)
        child_fds = (task_r, done_w, life_r, ring_fd, cfg_fd)
        argv = [*map(str, child_fds), *([str(cpu)] if cpu is not None else [])]
        env = _env()
        proc: Process | None = forkserver.start(child_fds, tuple(extra_fds), argv, env, _SAFE_PATH, imports)
        if proc is None:
            proc = subprocess.Popen([sys.executable, *_SAFE_PATH, "-m", "shmloader.engine.worker", *argv],
                                    pass_fds=child_fds + tuple(extra_fds), stdin=subprocess.DEVNULL, env=env,
                                    close_fds=True)
    except BaseException:
        for fd in (task_w, done_r, life_w):
            os.close(fd)
        raise
    finally:
        for fd in (task_r, done_w, life_r, cfg_fd):
            os.close(fd)
    os.set_blocking(done_r, False)
    return Worker(wid, proc, task_w, done_r, life_w, started=time.monotonic())


def stop_workers(workers: list[Worker], grace: float = _GRACE_S) -> None:
    """Steps 2-4 of NOTE [ Shutdown ]. Safe to call again on the same workers."""
    _reap_abandoned()
    for w in workers:
        for name in ("task_w", "life_w"):
            fd = getattr(w, name)
            if fd >= 0:
                os.close(fd)
                setattr(w, name, -1)
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    killed = [w for w in workers if w.proc.poll() is None]
    for w in killed:
        w.proc.kill()
    deadline = time.monotonic() + REAP_S
    for w in killed:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if w.proc not in _abandoned:
                _abandoned.append(w.proc)
                log.warning("worker %d (pid %d) did not end within %g s of SIGKILL (uninterruptible sleep?); "
                            "closing goes on, it is reaped once it ends", w.wid, w.pid, REAP_S)
    for w in workers:
        if w.done_r >= 0:
            os.close(w.done_r)
            w.done_r = -1


# One read takes every reply a worker has queued (a reply is 32 bytes plus rare error text).
_READ_BYTES = 1 << 16


class Pool:
    """One loader's live workers, their reply pipes registered in ``selector`` (with the worker
    as the key's data), and how to start, read and remove them. The workers inherit ``source``'s
    descriptors (its ``fds``); the fork server imports its ``worker_imports`` ahead."""

    def __init__(self, selector: selectors.BaseSelector, ring_fd: int, config: bytes, source: object,
                 cpus: list[int] | None) -> None:
        self.selector = selector
        self.workers: list[Worker] = []
        self._start = (ring_fd, config, tuple(getattr(source, "fds", ())), tuple(getattr(source, "worker_imports", ())))
        self._cpus = cpus

    def __contains__(self, w: Worker) -> bool:
        return w in self.workers

    def spawn(self, wid: int) -> Worker:
        cpu = self._cpus[wid % len(self._cpus)] if self._cpus else None
        ring_fd, config, extra_fds, imports = self._start
        w = start_worker(wid, ring_fd, config, extra_fds, cpu, imports)
        self.workers.append(w)
        self.selector.register(w.done_r, selectors.EVENT_READ, w)
        return w

    def read(self, w: Worker) -> bool:
        """Move what ``w`` has written into ``w.buf``; True at end of file (it is gone)."""
        while w.done_r >= 0:
            try:
                chunk = os.read(w.done_r, _READ_BYTES)
            except BlockingIOError:
                return False
            if not chunk:
                return True
            w.buf += chunk
            if len(chunk) < _READ_BYTES:
                return False  # drained for now; epoll is level-triggered and wakes us for more
        return False

    def remove(self, w: Worker) -> None:
        """Take ``w`` out now (killed if still running): no grace, its tasks are someone else's."""
        if w in self.workers:
            self.workers.remove(w)
        if w.done_r >= 0:
            self.selector.unregister(w.done_r)
        stop_workers([w], grace=0.0)

    def stop(self) -> None:
        """Stop every worker (NOTE [ Shutdown ], steps 2-4), leaving them listed."""
        for w in self.workers:
            if w.done_r >= 0:
                self.selector.unregister(w.done_r)
        stop_workers(list(self.workers))
