"""Ctrl-C during a tool's run: one stop, and what it writes last left whole.

NOTE [ A stop that leaves every output whole ]
The first Ctrl-C raises KeyboardInterrupt where the run is; the stop that follows (workers
killed, temporary files removed, the manifest written) runs to its end whatever comes after:
a second Ctrl-C meanwhile is noted, not raised (``stoppable``). A write that must be whole (a
manifest renamed into place, a temporary file removed) holds even the first one until it is
done (``held``), which then raises it. The command line reports the stop in one line and exits
130. Workers ignore SIGINT and are stopped by the main process (``tools.runner``).
Outside the main thread (a run in a thread of the caller's) signals are not ours: both are no-ops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["held", "stoppable"]


class _State:
    """The handler's state: whether a stop was raised, writes holding Ctrl-C, one held."""

    raised = False
    holding = 0
    pending = False


def _handler(signum, frame) -> None:
    if _State.raised:
        return  # the stop is under way: a second Ctrl-C must not cut its cleanup short
    if _State.holding:
        _State.pending = True
        return
    _State.raised = True
    raise KeyboardInterrupt


def _ours() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """A run that the first Ctrl-C stops and later ones do not interrupt (NOTE [ A stop that
    leaves every output whole ]); the handler before it is restored after."""
    if not _ours():
        yield
        return
    old = signal.signal(signal.SIGINT, _handler)
    _State.raised, _State.holding, _State.pending = False, 0, False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A write that a Ctrl-C must not cut: one that comes meanwhile is raised after it."""
    if not _ours() or signal.getsignal(signal.SIGINT) is not _handler:
        yield
        return
    _State.holding += 1
    try:
        yield
    finally:
        _State.holding -= 1
        if not _State.holding and _State.pending and not _State.raised:
            _State.pending = False
            _State.raised = True
            raise KeyboardInterrupt
