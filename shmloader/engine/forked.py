"""A worker the fork server forked, as the training process sees it: read as ``subprocess.Popen``
reads its child, its exit status sent by the server that reaps it (NOTE [ Fork server ] in
``engine.forkserver``)."""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time

__all__ = ["Forked", "STATUS_LOST", "readable"]

# The exit status of a worker whose server died before reaping it: no real status is this.
STATUS_LOST = -(1 << 16)
_STATUS = struct.Struct("<i")


class Forked:
    """A worker forked by the server, read as ``subprocess.Popen`` reads its child: ``pid``,
    ``poll()``, ``wait(timeout)``, ``kill()``, ``returncode`` (``STATUS_LOST`` if the server died
    before it could tell)."""

    def __init__(self, pid: int, pidfd: int, status: socket.socket) -> None:
        self.pid = pid
        self.args = ["shmloader.engine.worker", str(pid)]  # what TimeoutExpired names
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._status = status
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._take(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._take(left)
        return self.returncode

    def kill(self) -> None:
        with self._lock:
            if self.returncode is None and self._pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _take(self, timeout: float | None) -> None:
        """Read the exit status if it comes within ``timeout``; from a server that died, learn
        from the pidfd whether the worker ended. Waits without the lock: ``kill`` may come from
        another thread meanwhile."""
        with self._lock:
            if self.returncode is not None:
                return
            watch = self._status.fileno() if self._status.fileno() >= 0 else self._pidfd
        try:
            if not readable(watch, timeout):
                return
        except (OSError, ValueError):  # closed by another thread, which took the status
            return
        with self._lock:
            if self.returncode is not None:
                return
            if self._status.fileno() >= 0:
                try:
                    data = self._status.recv(_STATUS.size, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                if len(data) == _STATUS.size:
                    self._ended(_STATUS.unpack(data)[0])
                    return
                self._status.close()  # EOF without a status: the server is gone
                if not readable(self._pidfd, 0.0):
                    return  # the worker lives on; its pidfd tells when it ends
            self._ended(STATUS_LOST)

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._status.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def __del__(self) -> None:
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` is readable (or at EOF) within ``timeout`` seconds (None: no limit); poll,
    not select, which fails on descriptors past 1023."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))
