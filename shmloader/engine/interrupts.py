"""Ctrl-C while the loader's engine or a dataset tool keeps its books: one deferral (``Deferred``)
for both, and the tools' policy over it (``stoppable``, ``held``).

NOTE [ Ctrl-C inside the engine ]
A signal handler runs between any two Python instructions of the main thread. Ctrl-C in the
middle of ``Engine.next()`` would raise KeyboardInterrupt between writing a task to a worker
and noting it as outstanding, or between taking a reply off a pipe and acting on it: the next
call would then match replies to the wrong tasks and could hand out a slot a worker is still
writing. So while the engine runs on the main thread, ``Deferred`` stands in for the SIGINT
handler: inside a wait (``interruptible()``) the original handler runs at once, as usual;
anywhere else the signal is noted and the original handler runs at the next point where the
books are whole (``check()``), or on the way out of ``next()``. Nothing is lost and nothing is
raised twice; iterating again after the KeyboardInterrupt continues the stream (the batch
being handed out at that instant, if any, is dropped with the interrupted call).

Only a Python-callable handler is stood in for (``signal.default_int_handler``, or the user's
own); ``SIG_IGN`` and ``SIG_DFL`` are left alone, and so is every thread but the main one,
where Python never runs signal handlers.

NOTE [ A stop that leaves every output whole ]
The first Ctrl-C during a tool's run (``shmloader scan``, ``prepare``) raises KeyboardInterrupt
where the run is; the stop that follows (workers killed, temporary files removed, the manifest
written) runs to its end whatever comes after: a second Ctrl-C meanwhile is noted, not raised
(``stoppable``). A write that must be whole (a manifest renamed into place, a temporary file
removed) defers even the first one until it is done (``held``: a ``Deferred`` over the stop's
handler, which then raises it). The command line reports the stop in one line and exits 130.
Workers ignore SIGINT and are stopped by the main process (``tools.runner``). Outside the main
thread (a run in a thread of the caller's) signals are not ours: both are no-ops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, Callable

__all__ = ["Deferred", "held", "stoppable"]


class Deferred:
    """``with Deferred() as d:``: SIGINT waits for ``d.check()`` or a ``d.interruptible()`` wait."""

    __slots__ = ("_old", "_pending", "_safe")

    def __init__(self) -> None:
        self._old: Callable[[int, FrameType | None], Any] | None = None
        self._pending: tuple[FrameType | None] | None = None  # (frame,) of a signal not yet acted on
        self._safe = False

    def __enter__(self) -> "Deferred":
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if callable(old):
                self._old = old
                signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        old, self._old = self._old, None
        if old is None:
            return
        signal.signal(signal.SIGINT, old)
        pending, self._pending = self._pending, None
        if pending is not None:
            old(signal.SIGINT, *pending)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._safe and self._old is not None:
            self._old(signum, frame)
        elif self._pending is None:
            self._pending = (frame,)

    def check(self) -> None:
        """A point where the books are whole: run the handler of a signal that came meanwhile."""
        pending = self._pending
        if pending is not None and self._old is not None:
            self._pending = None
            self._old(signal.SIGINT, *pending)

    def interruptible(self, wait, *args):
        """``wait(*args)``, during which the original handler runs as soon as a signal comes."""
        self.check()
        self._safe = True
        try:
            return wait(*args)
        finally:
            self._safe = False


class _Stop:
    """Whether the stop of a ``stoppable`` run was raised already."""

    raised = False


def _stop_handler(signum: int, frame: FrameType | None) -> None:
    if _Stop.raised:
        return  # the stop is under way: a second Ctrl-C must not cut its cleanup short
    _Stop.raised = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """A run that the first Ctrl-C stops and later ones do not interrupt (NOTE [ A stop that
    leaves every output whole ]); the handler before it is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, _stop_handler)
    _Stop.raised = False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A write that a Ctrl-C must not cut, inside a ``stoppable`` run: one that comes meanwhile is
    raised after it (nested writes: after the outermost)."""
    handler = signal.getsignal(signal.SIGINT)
    ours = handler is _stop_handler or isinstance(getattr(handler, "__self__", None), Deferred)  # or a held's
    if threading.current_thread() is not threading.main_thread() or _Stop.raised or not ours:
        yield
        return
    with Deferred():
        yield
