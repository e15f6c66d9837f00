"""Hostile input: protocol strings, forged worker messages, segment permissions, fork safety."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import shmloader
from shmloader.engine import forkserver

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("path", ["rtmp://example.com/live", "udp://127.0.0.1:9", "concat:a.mp4|b.mp4",
                                  "file:/etc/passwd", "pipe:0", "tcp://127.0.0.1:9/"])
def test_protocols_refused_without_opt_in(path):
    with pytest.raises(ValueError, match="allow_urls"):
        shmloader.VideoClips(["ok.mp4", path], size=(32, 32))


def test_local_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    clips = shmloader.VideoClips(["a.mp4", "sub/b.mp4"], size=(32, 32))
    assert clips.paths == [str(tmp_path / "a.mp4"), str(tmp_path / "sub/b.mp4")]
    # With the opt-in the string goes to FFmpeg as given; an fsspec URL needs none (test_remote).
    assert shmloader.VideoClips(["rtmp://h/live"], size=(32, 32), allow_urls=True).paths == ["rtmp://h/live"]
    assert shmloader.VideoClips(["http://h/v.mp4"], size=(32, 32)).paths == ["http://h/v.mp4"]


def forge(kind):
    def fn(i, rng):
        if i == 3:
            from shmloader.engine.protocol import DONE, FAILURE, NO_COUNTS, ST_DONE

            done_fd = int(sys.argv[2])  # the worker's result pipe
            if kind == "count":  # a reply for a task it was not given
                os.write(done_fd, DONE.pack(ST_DONE, 10**6, 0, 0.0, *NO_COUNTS))
            elif kind == "failures":  # more failures than items
                os.write(done_fd, DONE.pack(ST_DONE, 1, 5, 0.0, *NO_COUNTS))
            elif kind == "index":  # a failure of an item the task does not have
                os.write(done_fd, DONE.pack(ST_DONE, 1, 1, 0.0, *NO_COUNTS) + FAILURE.pack(7, 2) + b"{}")
            elif kind == "huge":
                os.write(done_fd, DONE.pack(ST_DONE, 1, 1, 0.0, *NO_COUNTS) + FAILURE.pack(0, 2**31))
            else:
                os.write(done_fd, os.urandom(64))
        return {"x": np.zeros(2)}
    return fn


@pytest.mark.parametrize("kind", ["count", "failures", "index", "huge", "garbage"])
def test_forged_worker_messages_are_rejected(kind):
    src = shmloader.FunctionSource(forge(kind), {"x": ((2,), np.float64)}, 8, check=False)
    with shmloader.Loader(src, batch_size=2, workers=1) as loader:
        with pytest.raises(shmloader.LoaderError, match="worker pid .* sent"):
            list(loader)


@pytest.mark.parametrize("shm_dir", [None, "/dev/shm"])
def test_segment_is_private(shm_dir):
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(2)}, {"x": ((2,), np.float64)}, 4)
    with shmloader.Loader(src, batch_size=2, workers=1, shm_dir=shm_dir) as loader:
        st = os.fstat(loader._ring.fd)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_nlink == 0  # no name anywhere: nothing to find, nothing to leak


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_workers_never_fork_the_training_process(fork_server, monkeypatch):
    """Fork safety after TF holds by construction: workers are forked by the fork server, a fresh
    interpreter running our module that this process started by fork+exec, single-threaded and
    without TensorFlow or torch; with ``SHMLOADER_FORK_SERVER=0`` each is a fresh interpreter."""
    monkeypatch.setenv("SHMLOADER_FORK_SERVER", fork_server)
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(2)}, {"x": ((2,), np.float64)}, 4)
    with shmloader.Loader(src, batch_size=2, workers=2) as loader:
        for pid in loader.worker_pids():
            parent = psutil.Process(pid).parent()
            if fork_server == "1":
                assert parent.pid == forkserver.server_pid() and parent.ppid() == os.getpid()
                cmd = parent.cmdline()
                assert cmd[cmd.index("-m") : cmd.index("-m") + 2] == ["-m", "shmloader.engine.forkserver"]
                assert parent.num_threads() == 1
                with open(f"/proc/{parent.pid}/maps") as f:
                    assert not [line for line in f if "tensorflow" in line or "libtorch" in line]
                continue
            # Popen returns once the child has begun its exec (vfork); its arguments show only
            # once the exec is through, which on a busy CPU may be a moment later.
            deadline = time.monotonic() + 30
            while not (cmd := psutil.Process(pid).cmdline()) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert cmd[cmd.index("-m") : cmd.index("-m") + 2] == ["-m", "shmloader.engine.worker"]
            assert parent.pid == os.getpid()


DECOY = textwrap.dedent("""
    import numpy as np
    import shmloader

    src = shmloader.FunctionSource(lambda i, rng: {"x": np.full(2, i)}, {"x": ((2,), np.int64)}, 4)
    with shmloader.Loader(src, batch_size=2, workers=2, timeout=20) as loader:
        print(sum(int(b["x"].sum()) for b in loader))
""")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P (no working folder on sys.path) is 3.11+")
def test_workers_import_the_training_process_shmloader_not_one_in_the_working_folder(tmp_path):
    """Run from a folder holding another copy of shmloader (a checkout of another version): the
    workers still run the package the training process imported."""
    decoy = tmp_path / "work" / "shmloader"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the copy in the working folder was imported')\n")
    (decoy / "engine").mkdir()
    (decoy / "engine" / "__init__.py").write_text("")
    (decoy / "engine" / "worker.py").write_text("raise SystemExit(3)\n")
    script = tmp_path / "train.py"
    script.write_text(DECOY)
    root = os.path.dirname(os.path.dirname(os.path.abspath(shmloader.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path / "work", env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12"]  # 2 * (0 + 1 + 2 + 3)


def test_pinned_workers_run_on_one_cpu_each(videos):
    """Worker i runs on the i-th CPU, every thread of it: its lifeline thread and the decoder's
    threads too (a mask set on the main thread alone after they started would not reach them)."""
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    cpus = sorted(os.sched_getaffinity(0))
    with shmloader.Loader(clips, batch_size=2, workers=2, pin_workers=True) as loader:
        it = iter(loader)
        assert len(next(it)["video"]) == 2  # both workers have opened and decoded videos
        assert sum(len(b["video"]) for b in it) == len(paths) - 2
        masks, threads = [], []
        for pid in loader.worker_pids():
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            masks.append({tuple(sorted(os.sched_getaffinity(t))) for t in tids})
            threads.append(len(tids))
    assert masks == [{(cpus[0],)}, {(cpus[1 % len(cpus)],)}]
    assert min(threads) >= 2  # the main thread and the lifeline thread at least
