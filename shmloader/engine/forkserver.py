"""The fork server: one clean interpreter per training process that imports what workers need
once and forks each worker from there.

NOTE [ Fork server ]
A worker started as a fresh interpreter (fork+exec, ``engine.pool``) spends most of its start-up
importing numpy, cloudpickle, decord, PyAV and our reading path: ~0.25 s of CPU each, for every
worker of every loader and every replacement. The server is started that very way, by fork+exec
of ``python -P -m shmloader.engine.forkserver`` (never a fork of the training process, which may
hold TensorFlow's threads), imports numpy, cloudpickle and the worker's modules at once, and each
source's own (``Source.worker_imports``: ours only, never a user's module, which may import
TensorFlow) when a worker first needs them, with BLAS and OpenMP held to one thread. It stays
single-threaded, which it checks before each fork: a fork of it is as safe as an exec. It opens no
reader (decord's readers must be made in the process that uses them). A forked worker gets the
training process's thread variables in its environment, but the pools of the libraries the server
loaded were sized at one thread when they loaded, and a fork keeps them: a worker whose
environment asks one of them for another count (``OPENBLAS_NUM_THREADS=4``) is refused and started
by exec, which sizes them as the environment says.

Starting a worker: the loader sends one message (SOCK_SEQPACKET, atomic) carrying the worker's
descriptors, its stdout and stderr as they are now, and a memfd with its environment, working
folder and arguments. The server forks; the child closes every descriptor but the worker's, moves
them to the numbers the loader chose (``pass_fds`` keeps numbers, so sources that name their
descriptors work unchanged) and becomes ``engine.worker`` (``_Become`` unwinds the server's
frames); the server closes its copies, so the EOF rules of NOTE [ Shutdown ] in ``engine.pool``
hold as before. It answers on a socket of that worker's own with the pid and a pidfd, reaps the
worker when it ends and sends its exit status there: ``Forked`` reads it as ``Popen`` reads its
child's, and kills through the pidfd, so a pid reused after the reap is never signalled. The child
runs the worker only once the loader, having read the answer, sends a byte back on that socket: a
loader that gave up waiting (``_ANSWER_S``) and started the worker by exec closes it instead, and
a child forked that late leaves without touching the worker's pipes.

The server ends at EOF on its socket: the training process closed it (at exit) or died. Workers
it forked outlive it only until their lifelines end them. Whatever goes wrong with the server
(not installed as expected, killed, a refused fork) costs only speed: ``start`` returns None and
the worker is started by fork+exec. A server that leaves a start unanswered for ``_ANSWER_S`` is
killed (its queue holds that worker's descriptors) and none is asked again: every later worker of
the training process starts by fork+exec at once, so a stuck server costs one wait, not one per
worker. ``SHMLOADER_FORK_SERVER=0`` always starts them that way.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from .forked import _STATUS, STATUS_LOST, Forked, readable as _readable

__all__ = ["Forked", "STATUS_LOST", "server_pid", "start"]

ENV = "SHMLOADER_FORK_SERVER"

_PID = struct.Struct("<i")
# How long a start waits for the server's answer (the server's own start-up included) before the
# worker is started by fork+exec instead, and the server is given up (NOTE [ Fork server ]).
_ANSWER_S = 30.0
# Tests only: how long the server sleeps between a fork and its answer (a server slow to answer).
_ANSWER_DELAY_S = 0.0
# The byte that lets a forked child run the worker: the loader has its answer (Serving.become_worker).
_GO = b"G"
# Descriptors one start may carry (the kernel's SCM_MAX_FD is 253).
_MAX_FDS = 200
# Variables the server's imports read once: one BLAS or OpenMP thread, or the server would not
# be single-threaded. A worker gets the training process's values in its environment, but a forked
# one keeps the pools the server's libraries sized at load (_threads_differ).
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# The library files that size their pool from each variable when they load.
_SIZED_AT_LOAD = {"OPENBLAS_NUM_THREADS": ("openblas",), "MKL_NUM_THREADS": ("libmkl_",),
                  "OMP_NUM_THREADS": ("libgomp", "libomp", "libiomp")}


# ---------------------------------------------------------------- the training process's side


class _Server:
    def __init__(self, env: dict[str, str], safe_path: tuple[str, ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = _memfd(pickle.dumps((list(sys.path), _ANSWER_DELAY_S)))
        env = dict(env, **{k: "1" for k in _ONE_THREAD})
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *safe_path, "-m", "shmloader.engine.forkserver", str(theirs.fileno()), str(cfg)],
                pass_fds=(theirs.fileno(), cfg), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        finally:
            theirs.close()
            os.close(cfg)
        self.sock = ours
        self.owner = os.getpid()
        self.answered = False  # whether it has started a worker yet

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None and self.sock.fileno() >= 0

    def close(self, wait_s: float = 1.0) -> None:
        self.sock.close()  # EOF: the server leaves
        if self.owner == os.getpid():
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_lock = threading.Lock()
_server: _Server | None = None
# A server ended before its first answer (no pidfds here), or left one unanswered: fork+exec from now on.
_unusable = False


def _forget_in_child() -> None:
    """A fork of the training process (multiprocessing's, a user's) starts its own server: the
    parent's is not its child, and another thread may have held the lock at the fork."""
    global _lock, _server
    _lock = threading.Lock()
    if _server is not None:
        _server.sock.close()  # the child's copy; the parent keeps its own
    _server = None


os.register_at_fork(after_in_child=_forget_in_child)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "pidfd_open")


def server_pid() -> int | None:
    """The pid of this process's fork server, if one runs."""
    s = _server
    return s.proc.pid if s is not None and s.alive() else None


def start(child_fds: tuple[int, ...], extra_fds: tuple[int, ...], argv: list[str], env: dict[str, str],
          safe_path: tuple[str, ...], imports: tuple[str, ...] = ()) -> Forked | None:
    """A worker forked by the server with ``child_fds`` and ``extra_fds`` at their numbers, stdout
    and stderr as this process's now, ``env`` and this working folder, running
    ``engine.worker.main(argv)``, once the server has imported ``imports`` (the source's modules);
    None if the server could not (the caller starts it by exec)."""
    global _server, _unusable
    if _unusable or not enabled() or len(child_fds) + len(extra_fds) + 4 > _MAX_FDS:
        return None
    with _lock:
        if _server is not None and not _server.alive():
            if _server.owner == os.getpid():
                _server.close(wait_s=0.0)
            _server = None
        if _server is None:
            try:
                _server = _Server(env, safe_path)
            except OSError:
                return None
        server = _server
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = (*child_fds, *extra_fds)
    info = _memfd(pickle.dumps({"env": env, "cwd": os.getcwd(), "argv": argv, "at": [1, 2, *fds],
                                "imports": list(imports)}))
    try:
        socket.send_fds(server.sock, [b"S"], [theirs.fileno(), info, 1, 2, *fds])
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
        os.close(info)
    got: list[int] = []
    try:
        if not _readable(ours.fileno(), _ANSWER_S):
            with _lock:
                _unusable = True  # stuck, or too slow to be worth a wait per worker
                server.proc.kill()  # its queue holds this worker's descriptors (NOTE [ Shutdown ])
            raise OSError("no answer")
        data, got, _, _ = socket.recv_fds(ours, _PID.size, 1)
        if len(data) != _PID.size or len(got) != 1:
            raise OSError("refused")
        ours.send(_GO)
    except OSError:
        ours.close()  # a child forked for it sees EOF instead of _GO and leaves (Serving.become_worker)
        for fd in got:
            os.close(fd)
        with _lock:
            if server.proc.poll() is not None and not server.answered:
                _unusable = True  # it ended before its first answer: it cannot serve here
        return None
    server.answered = True
    return Forked(_PID.unpack(data)[0], got[0], ours)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("shmloader-start", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@atexit.register
def _close_at_exit() -> None:
    if _server is not None:
        _server.close()


# ---------------------------------------------------------------- the server


class _Become(BaseException):
    """Raised in a forked child: leave the server's frames and run the worker."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv


def _preload(names: list[str]) -> None:
    """Import the modules a worker needs (the engine's, then its source's) before forking it. One
    that fails to import here is imported, and fails with its own message, in the worker."""
    for name in ("cloudpickle", "numpy", "shmloader.engine.worker", *names):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass


def _one_thread() -> bool:
    return len(os.listdir("/proc/self/task")) == 1


def _threads_differ(env: dict[str, str]) -> bool:
    """Whether ``env`` asks a library this server loaded for other than the one thread its pool was
    sized with (``_ONE_THREAD``): a worker forked from here would keep one, where one started by
    exec sizes its own from ``env``."""
    asked = [files for var, files in _SIZED_AT_LOAD.items() if env.get(var) != "1"]
    if not asked:
        return False
    with open("/proc/self/maps") as f:
        loaded = {line.rsplit("/", 1)[-1] for line in f if "/" in line}
    return any(part in name for name in loaded for files in asked for part in files)


class _Serving:
    """The server's state: its socket to the training process, the SIGCHLD wake-up pipe, and each
    live child's answer socket."""

    def __init__(self, sock_fd: int, answer_delay_s: float = 0.0) -> None:
        self.sock = socket.socket(fileno=sock_fd)
        self.answer_delay_s = answer_delay_s
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.children: dict[int, socket.socket] = {}
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the poll through the pipe
        self.poll = select.poll()
        for fd in (self.sock.fileno(), self.wake_r):
            self.poll.register(fd, select.POLLIN)

    def run(self) -> None:
        while True:
            ready = {fd for fd, _ in self.poll.poll()}
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if self.sock.fileno() in ready:
                try:
                    msg, fds, _, _ = socket.recv_fds(self.sock, 16, _MAX_FDS)
                except OSError:
                    return
                if not msg:
                    return  # the training process closed its end, or died
                self.fork(fds)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            answer = self.children.pop(pid, None)
            if answer is not None:
                try:
                    answer.send(_STATUS.pack(os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                answer.close()

    def fork(self, fds: list[int]) -> None:
        answer = socket.socket(fileno=fds[0])
        theirs = fds[1:]
        try:
            with os.fdopen(os.dup(theirs[0]), "rb") as f:
                info: dict[str, Any] = pickle.load(f)
            if len(theirs) - 1 != len(info["at"]):
                raise OSError("descriptors lost on the way")
            _preload(info["imports"])
            if _threads_differ(info["env"]):
                raise OSError("the worker's environment sizes a loaded library's pool otherwise")
            if _readable(answer.fileno(), 0.0):  # EOF: the loader has given up waiting
                raise OSError("the loader left")
            if not _one_thread():  # an import started a thread: no fork from here on
                raise OSError("the server is no longer single-threaded")
            pid = os.fork()
        except Exception:
            answer.close()  # EOF without a pid: the loader starts this worker by exec
            for fd in theirs:
                os.close(fd)
            return
        if pid == 0:
            self.become_worker(info, theirs[1:], answer, theirs[0])
        for fd in theirs:
            os.close(fd)
        if self.answer_delay_s:
            time.sleep(self.answer_delay_s)
        try:
            pidfd = os.pidfd_open(pid)
            try:
                socket.send_fds(answer, [_PID.pack(pid)], [pidfd])
            finally:
                os.close(pidfd)
        except OSError:
            # No answer given: the loader starts this worker by exec (it may have already), and the
            # child never gets _GO. Killed so the loader sees EOF now; still our unreaped child, its
            # pid is its own.
            os.kill(pid, signal.SIGKILL)
            answer.close()
            return
        self.children[pid] = answer

    def become_worker(self, info: dict[str, Any], passed: list[int], answer: socket.socket, info_fd: int) -> None:
        """In the forked child: only the worker's descriptors, at the numbers the loader gave
        them, its environment and working folder; then ``_Become`` runs the worker. Nothing of
        the worker runs before the loader's _GO: without it the loader starts the worker by exec."""
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # detach(), not close(): a socket object closed later would close whatever reuses its number
            for s in (self.sock, *self.children.values()):
                os.close(s.detach())
            for fd in (self.wake_r, self.wake_w, info_fd):
                os.close(fd)
            go = answer.recv(len(_GO))  # EOF: the loader gave up waiting
            os.close(answer.detach())
            if go != _GO:
                os._exit(0)
            at: list[int] = info["at"]
            # out of the way first: a passed descriptor may sit on a number another one wants
            high = max([*at, *passed]) + 1
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in passed]
            for fd in passed:
                os.close(fd)
            for fd, want in zip(moved, at):
                os.dup2(fd, want, inheritable=want <= 2)
            keep = {0, *at}
            for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the listing's own descriptor, already closed
            os.chdir(info["cwd"])
            os.environ.clear()
            os.environ.update(info["env"])
            os.environ.pop("SHMLOADER_WORKER_STARTING", None)  # engine.pool.WORKER_ENV: read by the server's start
            import numpy as np

            np.random.seed()  # the server's global stream would be every worker's: each gets its own
            sys.argv = [sys.argv[0], *info["argv"]]
        except BaseException:
            os._exit(70)
        raise _Become(info["argv"])


def main(argv: list[str]) -> int:
    with os.fdopen(int(argv[1]), "rb") as f:
        path, answer_delay_s = pickle.load(f)
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return 3  # no pidfds (Linux < 5.3): the loader sees this server end unanswered and stops asking
    _preload([])
    try:
        _Serving(int(argv[0]), answer_delay_s).run()
    except _Become as b:
        from .worker import main as worker_main

        return worker_main(b.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
