"""Exceptions raised by shmloader.

::

    LoaderError                 base of everything the loader raises on its own behalf
    ├── SampleError             one sample could not be read (names path or index, keeps the cause)
    ├── WorkerDiedError         a worker process exited, was killed, or missed its deadline
    └── StateError              a saved state this loader cannot serve (also a ValueError)

Invalid arguments raise ``ValueError`` / ``TypeError`` when the object is built.
"""

from __future__ import annotations

__all__ = ["LoaderError", "SampleError", "StateError", "WorkerDiedError", "RemoteTraceback", "install_hint"]


def install_hint(extra: str) -> str:
    """How to install an extra while shmloader is not on PyPI: from the source, or its wheel."""
    return (f"pip install './shmloader[{extra}]' from the folder that holds the shmloader source, or "
            f"'dist/shmloader-*.whl[{extra}]' after make dist")


class LoaderError(RuntimeError):
    """Base class for errors raised while loading."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of a :class:`SampleError`."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


class SampleError(LoaderError):
    """A sample could not be read or transformed.

    Attributes: ``index`` (sample index in the source), ``where`` (path or description),
    ``exc_type`` (qualified name of the worker's exception), ``reason`` (its message).
    """

    def __init__(self, index: int, where: str, exc_type: str, reason: str) -> None:
        super().__init__(f"sample {index} ({where}): {exc_type}: {reason}")
        self.index = index
        self.where = where
        self.exc_type = exc_type
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[int, str, str, str]]:
        return (type(self), (self.index, self.where, self.exc_type, self.reason))


class WorkerDiedError(LoaderError):
    """A worker process died (exit code or signal) or was killed after missing its deadline."""

    def __init__(self, pid: int, how: str, holding: str) -> None:
        super().__init__(f"worker pid {pid} {how}; it was working on {holding}")
        self.pid = pid
        self.how = how
        self.holding = holding

    def __reduce__(self) -> tuple[type, tuple[int, str, str]]:
        return (type(self), (self.pid, self.how, self.holding))


class StateError(LoaderError, ValueError):
    """A ``state()`` dict this loader cannot serve: saved with another dataset, batch size, seed,
    shuffle or shard, a position outside the epoch, or not a state at all. The message says which."""
