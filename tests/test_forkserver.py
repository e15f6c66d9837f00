"""The fork server (NOTE [ Fork server ] in shmloader.engine.forkserver): workers forked from one
clean interpreter get what a fresh interpreter would (environment, working folder, stdout and
stderr, descriptors at their numbers, a random stream of their own) and leave nothing behind when
the server, a worker or the training process dies. How a worker ended (exit code, signal) reaches
the loader's error through the server in test_faults, which runs with it as every test does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

import shmloader
from shmloader.engine import forkserver

from ._needs import need


def _batches(src, **kw) -> list[dict]:
    with shmloader.Loader(src, batch_size=2, workers=2, **kw) as loader:
        return [{k: np.array(v) for k, v in b.items()} for b in loader]


def _probe(i, rng):
    """What the worker sees: its pid, an environment variable, a file in its working folder, and
    a digest of numpy's global random state (its first word is the same for every seed)."""
    with open("here.txt") as f:
        here = int(f.read())
    return {"pid": np.int64(os.getpid()), "env": np.int64(os.environ["SHMLOADER_TEST_VALUE"]),
            "here": np.int64(here), "state": np.int64(np.random.get_state()[1][1:5].astype(np.int64).sum())}


_PROBE_SPEC = {k: ((), np.int64) for k in ("pid", "env", "here", "state")}


def test_workers_get_the_environment_and_folder_of_their_loaders_start(tmp_path, monkeypatch):
    """Two loaders, one server: each loader's workers see the environment and working folder the
    training process had when that loader started, not the server's; each worker has its own
    numpy global random state."""
    servers = []
    for n, value in enumerate((11, 22)):
        folder = tmp_path / str(n)
        folder.mkdir()
        (folder / "here.txt").write_text(str(100 + n))
        monkeypatch.chdir(folder)
        monkeypatch.setenv("SHMLOADER_TEST_VALUE", str(value))
        rows = _batches(shmloader.FunctionSource(_probe, _PROBE_SPEC, 16))
        assert {int(v) for b in rows for v in b["env"]} == {value}
        assert {int(v) for b in rows for v in b["here"]} == {100 + n}
        pids = {int(v) for b in rows for v in b["pid"]}
        states = {int(s) for b in rows for p, s in zip(b["pid"], b["state"])}
        if len(pids) == 2:
            assert len(states) == 2, "two workers began with one global random state"
        servers.append(forkserver.server_pid())
    assert servers[0] is not None and servers[0] == servers[1]


def _shout(i, rng):
    os.write(2, f"sample {i} to stderr\n".encode())
    os.write(1, f"sample {i} to stdout\n".encode())
    return {"x": np.int64(i)}


def test_workers_write_where_the_training_process_writes_now(capfd, monkeypatch):
    """A worker's stdout and stderr are the training process's at the loader's start (here
    pytest's capture, set after the server started), as a fresh interpreter's would be."""
    monkeypatch.setenv("SHMLOADER_NATIVE_LOG", "stderr")  # descriptor 2 as it is (engine.native_log)
    _batches(shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 2))
    capfd.readouterr()
    _batches(shmloader.FunctionSource(_shout, {"x": ((), np.int64)}, 4))
    out, err = capfd.readouterr()
    assert {line for line in err.splitlines() if line.startswith("sample")} == {f"sample {i} to stderr" for i in range(4)}
    assert {line for line in out.splitlines() if line.startswith("sample")} == {f"sample {i} to stdout" for i in range(4)}


def _held(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def test_a_worker_holds_its_own_descriptors_only():
    """No worker holds the server's sockets or another worker's pipes, and an array source's
    descriptors reach it at the numbers the loader gave them (the rows are the arrays')."""
    data = np.arange(64, dtype=np.int64).reshape(16, 4)
    src = shmloader.ArraySource({"x": data})
    with shmloader.Loader(src, batch_size=4, workers=2, shuffle=False) as loader:
        got = np.concatenate([np.array(b["x"]) for b in loader])
        pids = loader.worker_pids()
        held = {pid: _held(pid) for pid in pids}
    assert np.array_equal(got, data)
    assert len(pids) == 2
    for pid, fds in held.items():
        assert not [t for t in fds if t.startswith("socket:")], (pid, fds)
    pipes = [{t for t in fds if t.startswith("pipe:")} for fds in held.values()]
    assert pipes[0] and pipes[1] and not pipes[0] & pipes[1]


def _slow(i, rng):
    time.sleep(0.05)
    return {"x": np.int64(i)}


def test_the_server_killed_mid_epoch_costs_nothing():
    """SIGKILL the server while its workers decode: the epoch completes, the loader closes
    leaving nothing, and the next loader starts another server."""
    src = shmloader.FunctionSource(_slow, {"x": ((), np.int64)}, 24)
    with shmloader.Loader(src, batch_size=2, workers=2, shuffle=False) as loader:
        it = iter(loader)
        first = [int(v) for v in next(it)["x"]]
        server = forkserver.server_pid()
        os.kill(server, signal.SIGKILL)
        psutil.Process(server).wait(10)
        rest = [int(v) for b in it for v in b["x"]]
    assert first + rest == list(range(24))
    assert forkserver.server_pid() is None
    assert [int(v) for b in _batches(src, shuffle=False) for v in b["x"]] == list(range(24))
    assert forkserver.server_pid() not in (None, server)


def test_a_worker_of_a_dead_server_that_dies_is_replaced():
    """A worker that dies after its server did: its exit status is lost with the server, and
    the loader says so and (on_error="skip") replaces it from a new server."""
    src = shmloader.FunctionSource(_slow, {"x": ((), np.int64)}, 24)
    with shmloader.Loader(src, batch_size=2, workers=1, shuffle=False, on_error="skip") as loader:
        it = iter(loader)
        got = [int(v) for v in next(it)["x"]]
        server = forkserver.server_pid()
        os.kill(server, signal.SIGKILL)
        psutil.Process(server).wait(10)
        os.kill(loader.worker_pids()[0], signal.SIGKILL)
        got += [int(v) for b in it for v in b["x"]]
        assert loader.stats()["worker_restarts"] == 1
    assert sorted(got) == list(range(24))


TRAINING = textwrap.dedent("""
    import time, numpy as np, shmloader
    from shmloader.engine import forkserver

    def slow(i, rng):
        time.sleep(0.05)
        return {"x": np.int64(i)}

    loader = shmloader.Loader(shmloader.FunctionSource(slow, {"x": ((), np.int64)}, 10**6), batch_size=2, workers=2)
    it = iter(loader)
    next(it)
    print(forkserver.server_pid(), *loader.worker_pids(), flush=True)
    for b in it:
        pass
""")


def test_the_training_process_killed_takes_the_server_and_workers_with_it(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", TRAINING], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3
        ours = [psutil.Process(p) for p in pids]
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
        proc.stdout.close()
    deadline = time.monotonic() + 15
    while (alive := [p for p in ours if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE  # a zombie has ended
    except psutil.NoSuchProcess:
        return False


def test_a_server_an_import_made_threaded_forks_no_more():
    """A source whose worker module starts a thread at import: the server, no longer
    single-threaded, refuses to fork, and the workers start as fresh interpreters (children of
    this process), delivering the same batches."""
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 8)
    src.worker_imports = ("tests._starts_a_thread",)
    try:
        with shmloader.Loader(src, batch_size=2, workers=2, shuffle=False) as loader:
            it = iter(loader)
            got = [int(v) for v in next(it)["x"]]
            parents = {psutil.Process(pid).ppid() for pid in loader.worker_pids()}
            got += [int(v) for b in it for v in b["x"]]
        server = forkserver.server_pid()
        assert server is not None and psutil.Process(server).num_threads() == 2  # alive, and threaded
        assert got == list(range(8)) and parents == {os.getpid()}
    finally:
        server = forkserver.server_pid()
        if server is not None:  # the next test gets a clean server
            os.kill(server, signal.SIGKILL)
            psutil.Process(server).wait(10)


def _kill_server() -> None:
    """End this process's server, if one runs: the next start starts one as the module says now."""
    server = forkserver.server_pid()
    if server is not None:
        os.kill(server, signal.SIGKILL)
        psutil.Process(server).wait(10)


def _whose(i, rng):
    time.sleep(0.05)
    return {"x": np.int64(i), "pid": np.int64(os.getpid())}


_WHOSE_SPEC = {"x": ((), np.int64), "pid": ((), np.int64)}


@pytest.mark.timeout(60)
def test_a_worker_forked_after_its_loader_gave_up_never_runs(monkeypatch):
    """A server that answers only after the loader gave up waiting (_ANSWER_S): the loader starts
    the worker by exec, and the child forked meanwhile, on the same pipes, leaves without running
    it: every sample comes once, all from the exec-started worker, and the child is gone."""
    monkeypatch.setattr(forkserver, "_unusable", False)  # set when the loader gives the server up
    monkeypatch.setattr(forkserver, "_ANSWER_DELAY_S", 2.0)
    _kill_server()
    src = shmloader.FunctionSource(_whose, _WHOSE_SPEC, 12)
    _batches(src, shuffle=False)  # a server up, its imports done: it forks at once, answers 2 s later
    server = forkserver.server_pid()
    assert server is not None
    monkeypatch.setattr(forkserver, "_ANSWER_S", 0.5)
    forked: set[int] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                forked.update(c.pid for c in psutil.Process(server).children())
            except psutil.Error:
                pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with shmloader.Loader(src, batch_size=2, workers=1, shuffle=False) as loader:
            rows = [{k: np.array(v) for k, v in b.items()} for b in loader]
            workers = loader.worker_pids()
            parents = {psutil.Process(pid).ppid() for pid in workers}
    finally:
        done.set()
        watcher.join()
        _kill_server()
    assert sorted(int(v) for b in rows for v in b["x"]) == list(range(12))
    assert {int(v) for b in rows for v in b["pid"]} == set(workers), (rows, workers)
    assert len(workers) == 1 and parents == {os.getpid()}
    assert len(forked) == 1, forked  # the late child was forked: the case this test is about
    late = psutil.Process(forked.pop())
    deadline = time.monotonic() + 10
    while _running(late) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(late)


@pytest.mark.timeout(60)
def test_a_server_that_stops_answering_costs_one_wait(monkeypatch):
    """A stopped server: the first start waits _ANSWER_S for it and gives it up (killed), and every
    later start, of that loader and of the next, is by exec at once: one wait, not one per worker."""
    monkeypatch.setattr(forkserver, "_unusable", False)  # set when the loader gives the server up
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 8)
    _batches(src)  # a server up
    server = forkserver.server_pid()
    assert server is not None
    answer_s = 1.0
    monkeypatch.setattr(forkserver, "_ANSWER_S", answer_s)
    waits: list[float] = []
    real_start = forkserver.start

    def timed_start(*args, **kwargs):
        t0 = time.monotonic()
        try:
            return real_start(*args, **kwargs)
        finally:
            waits.append(time.monotonic() - t0)

    monkeypatch.setattr(forkserver, "start", timed_start)
    os.kill(server, signal.SIGSTOP)
    try:
        for _ in range(2):
            with shmloader.Loader(src, batch_size=2, workers=2, shuffle=False) as loader:
                got = [int(v) for b in loader for v in b["x"]]
                parents = {psutil.Process(pid).ppid() for pid in loader.worker_pids()}
            assert got == list(range(8)) and parents == {os.getpid()}
        try:
            stopped = not _running(psutil.Process(server))
        except psutil.NoSuchProcess:  # killed and reaped already
            stopped = True
        given_up = stopped and forkserver.server_pid() is None
    finally:
        try:
            os.kill(server, signal.SIGKILL)
            os.kill(server, signal.SIGCONT)
            psutil.Process(server).wait(10)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    # one wait per start would be 4 x answer_s
    assert len(waits) == 4 and waits[0] >= 0.9 * answer_s and sum(waits) < 2 * answer_s, waits
    assert given_up


def _blas(i, rng):
    import threadpoolctl

    n = sum(lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas")
    return {"threads": np.int64(n), "parent": np.int64(os.getppid())}


@pytest.mark.timeout(60)
def test_a_worker_gets_the_blas_threads_its_environment_asks_for(monkeypatch):
    """The server's BLAS was sized at one thread, which a fork keeps: with the training process's
    OPENBLAS_NUM_THREADS=2 a worker has the BLAS threads a worker started by exec has; with the
    default (one), workers are still forked."""
    need("threadpoolctl", "threadpoolctl (a dependency of the test extra's packages) counts a worker's BLAS threads")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    src = shmloader.FunctionSource(_blas, {"threads": ((), np.int64), "parent": ((), np.int64)}, 4)

    def threads(**env) -> tuple[set[int], set[int]]:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rows = _batches(src)
        return {int(v) for b in rows for v in b["threads"]}, {int(v) for b in rows for v in b["parent"]}

    assert threads() == ({1}, {forkserver.server_pid()})
    asked, _ = threads(OPENBLAS_NUM_THREADS="2")
    by_exec, parents = threads(SHMLOADER_FORK_SERVER="0")
    assert parents == {os.getpid()}
    assert asked == by_exec, (asked, by_exec)
