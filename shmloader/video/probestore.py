"""Probes of remote files shared by a loader's workers: each file probed once per loader.

A remote probe costs a HEAD, the container's head and tail blocks and the first GOP (~470 KB and
3-4 round trips); without it a file's clips, spread over W workers, were probed up to W times.
The probe is too large to travel in a task message (fixed size, a few hundred bytes; a probe of
a long video holds every frame's timestamp), so it travels through a shared segment instead:

- a ``memfd`` the workers inherit, starting with a table of ``(offset, length)`` per file
  (zeros: not probed yet), followed by the pickled probes, appended;
- the worker that probes file ``v`` holds a POSIX record lock on byte ``v`` of the table while
  it probes, so another worker that wants ``v`` waits for the result instead of probing too. The
  wait is bounded (``wait_s``: past it the worker probes on its own) and a worker that dies
  releases its locks with it: nothing can hang on a lock;
- appends take a lock on one byte far past the table, held for two ``pwrite``s.

A probe's entry is written after its bytes, under the file's lock; a reader checks the header
the bytes start with (the file's number and length), so an entry read while it is written is
taken for "not probed yet". The segment stops growing at ``limit`` bytes: past it, workers keep
their probes to themselves, as before. Only remote files use it: a local probe costs ~5-10 ms,
less than sharing it would.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import struct
import time
import weakref
from contextlib import contextmanager
from typing import Iterator

from .probe import VideoInfo

__all__ = ["ProbeStore"]

_ENTRY = struct.Struct("<QQ")  # offset, length of a file's probe (0, 0: none yet)
_HEADER = struct.Struct("<QQ")  # before a probe's bytes: the file's number, the bytes' length
_APPEND = 1 << 60  # the byte whose lock serialises appends (far past any table)
LIMIT = 256 << 20  # bytes of probes a loader shares at most (pages are used only when written)


class ProbeStore:
    """Probes of ``count`` files shared through one segment (see the module's docstring)."""

    def __init__(self, count: int, limit: int = LIMIT) -> None:
        self.count, self.limit = count, limit
        self.fd = os.memfd_create("shmloader-probes", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, _ENTRY.size * count)
        except BaseException:
            os.close(self.fd)
            raise
        self._finalizer: weakref.finalize[[int], ProbeStore] | None = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        if self._finalizer is not None:  # the loader's process made it; a worker's exit closes its copy
            self._finalizer()

    def __getstate__(self) -> dict[str, int]:  # the workers inherit the descriptor
        return {"fd": self.fd, "count": self.count, "limit": self.limit}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.fd, self.count, self.limit = state["fd"], state["count"], state["limit"]
        self._finalizer = None

    def get(self, v: int) -> VideoInfo | None:
        """File ``v``'s probe, if a worker of this loader has published it."""
        offset, length = _ENTRY.unpack(os.pread(self.fd, _ENTRY.size, _ENTRY.size * v))
        if length <= _HEADER.size:
            return None
        data = os.pread(self.fd, length, offset)
        if len(data) != length or _HEADER.unpack_from(data) != (v, length):
            return None  # the entry was being written as it was read
        info: VideoInfo = pickle.loads(memoryview(data)[_HEADER.size:])
        return info

    def put(self, v: int, info: VideoInfo) -> bool:
        """Publish file ``v``'s probe; False where the segment is full (kept by this worker only)."""
        body = pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)
        data = _HEADER.pack(v, _HEADER.size + len(body)) + body
        with _locked(self.fd, _APPEND):
            end = os.fstat(self.fd).st_size  # the table was sized at creation: appends go after it
            if end + len(data) > self.limit:
                return False
            os.pwrite(self.fd, data, end)
            os.pwrite(self.fd, _ENTRY.pack(end, len(data)), _ENTRY.size * v)
        return True

    @contextmanager
    def probing(self, v: int, wait_s: float) -> Iterator[bool]:
        """Hold file ``v``'s lock while this worker probes it; yields whether it got the lock
        (False: another worker held it for ``wait_s``; probe anyway, and publish nothing)."""
        deadline = time.monotonic() + wait_s
        pause = 0.001
        while not self.try_probing(v):
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        try:
            yield True
        finally:
            self.release(v)

    def try_probing(self, v: int) -> bool:
        """Take file ``v``'s lock if no worker holds it (``release`` gives it back)."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, v)
        except OSError:
            return False
        return True

    def release(self, v: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, v)


@contextmanager
def _locked(fd: int, byte: int) -> Iterator[None]:
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, byte)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, byte)
