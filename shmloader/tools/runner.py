"""One runner for per-file work (scan's probes, prepare's copies, locally or on Ray): ordered,
bounded, killable.

    items (Work | Ready) --> run() --> Outcome, in input order
                               |  submit / wait / result / stop, through a Backend
                       ProcessBackend (tools.filepool) | ray._prepare's Ray backend

NOTE [ Running per-file work ]
``run`` takes the items lazily and keeps at most ``backend.window()`` of them waiting, in input
order: each answer is given back in its item's place, so every row is written once, in order,
as soon as the rows before it are. An item may be ``Ready`` (an earlier run's row): it waits its
turn without work. Items of one ``key`` (a video listed once a span) share one try, and so its
answer or failure, while that key is among the last ``reuse`` ones.
Deadline: a try may run ``timeout`` seconds from when it is the oldest unanswered one (a file
waiting behind others for a worker is not charged for their time).
Retries, the one policy: a try that crashed or passed its deadline is tried once more, on its
own, with twice the deadline; the outcome then says why (``Failure``). On its own: a process
pool cannot stop one try, and one process's death breaks every try in flight with it, so the
pool is killed, the file is tried alone in a fresh pool (nothing else runs meanwhile: a crash
there is the file's), and the tries lost with the pool go back in flight as they were, not
counted as tries. Why a second try at all: a try shares the machine (and a new pool's start)
with the others, and a busy machine or a slow disk can push a good file over a deadline; twice
the time alone is a margin no good file needs. The cost: a file that hangs holds the run for
three deadlines. Ray's tasks fail one by one: a timed-out task is cancelled and its file tried
again as a task of its own (the others run on); Ray itself tries a task again when its worker
or node is lost (``max_retries``), so a crash that comes back from Ray is the file's at once.
A stop (Ctrl-C, an error, a caller that stops reading) ends every try in flight through
``backend.close`` before the exception goes on; the caller removes what its tries left (a
temporary file) after that, once no worker writes.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import signal
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .filepool import file_pool, kill
from ..engine.interrupts import held

__all__ = ["Backend", "Crashed", "Failure", "Outcome", "ProcessBackend", "Ready", "Work", "run"]

# The longest the runner waits in a backend's call at a time: a Ctrl-C is raised within it
# (Ray's waits hold it until they return).
_POLL_S = 0.5

# A retry's deadline, in deadlines (NOTE [ Running per-file work ]).
_RETRY_TIMES = 2


@dataclass(frozen=True, slots=True)
class Work:
    """One file's work: ``fn(*args)`` in a worker (``fn`` at module scope, so that it pickles).
    ``key`` names the file: items of one key share a try (None: never shared). ``meta`` is the
    caller's, given back with the outcome, never sent."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    key: str | None = None
    meta: Any = None


@dataclass(frozen=True, slots=True)
class Ready:
    """An answer known without work (an earlier run's row), given back in its item's place."""

    value: Any
    meta: Any = None


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a file's work gave no answer: ``"timeout"`` (its last try ran over ``seconds``) or
    ``"crash"`` (its process died; ``detail``: the backend's words), after ``tries`` tries."""

    kind: str
    seconds: float | None = None
    detail: str = ""
    tries: int = 1


@dataclass(frozen=True, slots=True)
class Outcome:
    """An item's answer (``value``) or why there is none (``failure``), with its ``meta``."""

    meta: Any
    value: Any = None
    failure: Failure | None = None


class Crashed(Exception):
    """A try's process died (a backend's ``result``); its message says how, in words."""


class Backend(Protocol):
    """Where tries run. ``shared``: one try's death or stop ends every try in flight (a process
    pool); ``stop`` then loses them all."""

    shared: bool

    def window(self) -> int:
        """Items the runner may keep waiting (tries in flight included)."""

    def submit(self, work: Work) -> Any:
        """A handle of ``work``'s try, started."""

    def wait(self, handles: list[Any], timeout: float | None) -> list[Any]:
        """The handles of ``handles`` answered within ``timeout`` seconds (at least one, unless none is)."""

    def result(self, handle: Any) -> Any:
        """The answer of an answered try; ``Crashed`` where its process died."""

    def stop(self, handles: list[Any]) -> list[Any]:
        """End the tries of ``handles`` (their workers killed); those that answered first, which
        ``result`` still gives. A shared backend ends every try in flight and answers none."""

    def close(self) -> None:
        """End every try in flight; safe to repeat."""


class _Try:
    """One file's work in flight (shared by the items of its key): the handle, then its answer."""

    __slots__ = ("work", "handle", "done", "value", "failure", "tries", "deadline")

    def __init__(self, work: Work, deadline: float | None) -> None:
        self.work, self.deadline = work, deadline
        self.handle: Any = None
        self.done, self.tries = False, 1
        self.value: Any = None
        self.failure: Failure | None = None


def run(items: Iterable[Work | Ready], backend: Backend, timeout: float | None,
        reuse: int = 0, answered: list[Outcome] | None = None) -> Generator[Outcome, None, None]:
    """Each item's outcome, in input order (NOTE [ Running per-file work ]): a Work's answer,
    or a Failure after its retry; a Ready's value. ``timeout``: seconds a try may run from when
    it is the oldest unanswered one (None: no limit). Closing the iterator early, or a stop
    while it waits, ends the tries in flight (``backend.close``); ``answered`` then gets the
    outcomes of the tries that had answered but were not given back yet (a copy finished just
    as the stop came, whose row the caller still writes)."""
    source = iter(items)
    waiting: collections.deque[tuple[Work | Ready, _Try | None]] = collections.deque()
    recent: collections.OrderedDict[str, _Try] = collections.OrderedDict()
    flying: dict[Any, _Try] = {}  # handle -> its try
    oldest: _Try | None = None
    since = 0.0

    def start(t: _Try) -> None:
        t.handle = backend.submit(t.work)
        flying[t.handle] = t

    def settle(handle: Any) -> None:
        t = flying.pop(handle)
        try:
            t.value = backend.result(handle)
        except Crashed as e:
            t.failure = Failure("crash", detail=str(e), tries=t.tries)
        t.done = True

    try:
        while True:
            while len(waiting) < max(1, backend.window()):
                item = next(source, None)
                if item is None:
                    break
                waiting.append((item, _try_of(item, recent, reuse, timeout, start)))
            if not waiting:
                return
            item, t = waiting[0]
            if t is None or (t.done and _stands(t, backend)):
                waiting.popleft()
                yield _outcome(item, t)
                continue
            if not t.done:
                if t is not oldest:
                    oldest, since = t, time.monotonic()
                left = None if t.deadline is None else since + t.deadline - time.monotonic()
                for handle in backend.wait(list(flying), _POLL_S if left is None else max(0.0, min(left, _POLL_S))):
                    settle(handle)
                if t.done or t.deadline is None or time.monotonic() < since + t.deadline:
                    continue  # back here within _POLL_S: a Ctrl-C is raised at the latest then
            others = list({id(x): x for _, x in waiting if x is not None and x is not t}.values())
            _retry(t, others, backend, flying, settle, start)
            oldest = None
    finally:
        with held():  # NOTE [ A stop that leaves every output whole ]: no worker left writing
            if answered is not None:
                for handle in backend.wait(list(flying), 0):  # answered already, not waited for
                    settle(handle)
                answered += [_outcome(item, t) for item, t in waiting if t is None or (t.done and _stands(t, backend))]
            backend.close()


def _stands(t: _Try, backend: Backend) -> bool:
    """Whether an answered try is its item's outcome: an answer, a failure after its retry, or a
    crash on a backend whose tries fail alone (its retry is the backend's own)."""
    return t.failure is None or t.tries > 1 or not backend.shared


def _try_of(item: Work | Ready, recent: collections.OrderedDict, reuse: int, timeout: float | None,
            start: Callable[[_Try], None]) -> _Try | None:
    """The try ``item`` waits for: a recent one of its key, or a new one, started."""
    if isinstance(item, Ready):
        return None
    t = recent.get(item.key) if item.key is not None else None
    if t is None:
        t = _Try(item, timeout)
        start(t)
        if item.key is not None and reuse:
            recent[item.key] = t
            if len(recent) > reuse:
                recent.popitem(last=False)
    return t


def _retry(t: _Try, others: list[_Try], backend: Backend, flying: dict, settle: Callable,
           start: Callable) -> None:
    """``t`` crashed or passed its deadline: its one retry, on its own, with twice the deadline,
    or after that its failure (NOTE [ Running per-file work ]). ``others``: the tries waiting
    behind it, which a shared backend's stop loses and which go back in flight as they were."""
    if not t.done:  # over its deadline
        for handle in backend.stop([t.handle]):
            settle(handle)  # answered as it was stopped
        flying.pop(t.handle, None)
        if t.done:
            return
        if t.tries > 1:
            t.done, t.failure = True, Failure("timeout", t.deadline, tries=t.tries)
            return
    t.done, t.failure, t.tries = False, None, t.tries + 1
    t.deadline = None if t.deadline is None else t.deadline * _RETRY_TIMES
    if not backend.shared:
        start(t)  # a task of its own; the runner's loop waits for it as for any
        return
    backend.stop([])  # a fresh pool (one process's death broke the old one, or it holds a stuck try)
    lost = [x for x in others if not x.done or (x.failure is not None and x.failure.kind == "crash"
                                                and x.tries == 1)]
    for x in lost:
        flying.pop(x.handle, None)
        x.done, x.failure = False, None
    start(t)  # alone in the pool: waited for here, nothing else runs
    if not backend.wait([t.handle], t.deadline):
        backend.stop([t.handle])
        flying.pop(t.handle)
        t.done, t.failure = True, Failure("timeout", t.deadline, tries=t.tries)
    else:
        settle(t.handle)
        if t.failure is not None:
            backend.stop([])  # the pool broke with it: the next submit starts a fresh one
    for x in lost:
        start(x)


def _outcome(item: Work | Ready, t: _Try | None) -> Outcome:
    if isinstance(item, Ready) or t is None:
        return Outcome(item.meta, item.value if isinstance(item, Ready) else None)
    return Outcome(item.meta, t.value, t.failure)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the main process, which stops them (NOTE [ Running per-file work ])."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessBackend:
    """Tries in ``workers`` local processes (``tools.filepool``), ``in_flight`` per worker in
    the window; a stop kills the pool (it cannot end one try) and starts a fresh one."""

    shared = True

    def __init__(self, workers: int, in_flight: int) -> None:
        self._workers, self._in_flight = workers, in_flight
        self._pool: cf.ProcessPoolExecutor | None = None

    def window(self) -> int:
        return self._workers * self._in_flight

    def submit(self, work: Work) -> cf.Future:
        if self._pool is None:
            self._pool = file_pool(self._workers, _ignore_sigint)
        try:
            return self._pool.submit(work.fn, *work.args)
        except (cf.process.BrokenProcessPool, OSError) as e:  # broken by a try in flight: lost with it
            # A pool that breaks while submit starts a process closes its queues under it (OSError:
            # "handle is closed"); it marks itself broken first, so any other OSError is a real one.
            if isinstance(e, OSError) and not getattr(self._pool, "_broken", False):
                raise
            lost: cf.Future = cf.Future()
            lost.set_exception(cf.process.BrokenProcessPool(str(e)))
            return lost

    def wait(self, handles: list[cf.Future], timeout: float | None) -> list[cf.Future]:
        if not handles:
            return []
        return list(cf.wait(handles, timeout, return_when=cf.FIRST_COMPLETED).done)

    def result(self, handle: cf.Future) -> Any:
        try:
            return handle.result()
        except cf.process.BrokenProcessPool:
            raise Crashed("its process died") from None

    def stop(self, handles: list[cf.Future]) -> list[cf.Future]:
        self.close()
        return []

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            kill(pool)
