"""shmloader.ray.prepare on a real local Ray cluster (tests/_ray_cluster.py, started once for the
module): the local prepare's copies and manifest, a decode node's raylet killed mid-run, a file
that is no video, a task's process killed, a file over its time, Ctrl-C, and resources no node
has. Copies are checked by the codes the test videos carry in their pixels."""

import csv
import inspect
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from ._needs import need
from ._ray_cluster import NODE, advertise_node_type, alive, cluster, no_leaks, node_pids, tree  # noqa: F401 (fixtures)

ray = need("ray")  # after _ray_cluster, which sets Ray's environment for a cluster on 127.0.0.1

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import shmloader
import shmloader.ray as sray
from shmloader.samples import read_codes, write_video
from shmloader.video.probe import probe
from shmloader.video.pyav import PyAV

from ._examples import doc_example

pytestmark = pytest.mark.timeout(240)

SHORT, GOP = 64, 8  # copies of the 96x128 test videos: 64x86, a keyframe every 8 frames
DECODE = {"decode": 1}  # on the decode nodes only


def rows_of(manifest) -> list[dict]:
    with open(manifest, newline="") as f:
        return list(csv.DictReader(f))


def every_frame(path: str) -> np.ndarray:
    info = probe(path)
    return PyAV(1).decode(info, None, np.arange(info.frames))


def check_copy(path: str, video_id: int, frames: int) -> None:
    """The copy at ``path`` shows video ``video_id``'s frames 0..frames-1, in order."""
    ids, numbers = read_codes(every_frame(path))
    assert (ids == video_id).all() and list(numbers) == list(range(frames)), (path, ids, numbers)


def temporaries(folder) -> list[str]:
    return [f for _, _, files in os.walk(folder) for f in files if "preparing" in f or "writing" in f]


def test_the_arguments_shared_with_prepare_default_alike():
    """ray.prepare takes shmloader.prepare's arguments but ``workers`` (the cluster's slots are
    the workers), with the same defaults."""
    mine = inspect.signature(sray.prepare).parameters
    local = inspect.signature(shmloader.prepare).parameters
    assert set(local) - set(mine) == {"workers"}
    assert {k: mine[k].default for k in local if k in mine} == {k: local[k].default for k in local if k in mine}


def test_the_temporary_files_of_every_try_go_and_no_other_file(tmp_path):
    """What the driver removes once a run's tasks have answered (no cluster): each try's
    ``.NAME.TAG.preparing`` of the run's files; not a finished copy, not another file's."""
    from shmloader.tools.prepare import Listed, remove_temporaries, temporary

    (tmp_path / "a").mkdir()
    items = [Listed(f"/src/{n}", 0, None, str(tmp_path / "a" / n), "mp4") for n in ("v.mp4", "w.mp4")]
    tries = [temporary(items[0].copy, tag) for tag in ("0123456789ab", "ba9876543210")]
    kept = [items[0].copy, str(tmp_path / "a" / ".v.mp4.x.mp4.0123456789ab.preparing"),
            str(tmp_path / "a" / ".other.mp4.0123456789ab.preparing")]
    for f in tries + kept:
        open(f, "w").close()
    remove_temporaries(items, tagged=True)
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.path.basename(f) for f in kept)
    remove_temporaries([Listed("/src/v.mp4", 0, None, str(tmp_path / "gone" / "v.mp4"), "mp4")], tagged=True)  # no folder


def test_the_copies_and_manifest_are_the_local_prepares(cluster, tmp_path):
    """The same sources prepared locally (the command line) and on the cluster's decode nodes:
    the same rows (but the copies' modification times), copies with the same frames; a rerun on
    the cluster keeps every copy."""
    src = tmp_path / "src"
    for i, (folder, name) in enumerate([("a", "v0.mp4"), ("a", "v1.avi"), ("b", "v2.mp4"), ("b", "v3.mp4")]):
        (src / folder).mkdir(parents=True, exist_ok=True)
        write_video(src / folder / name, i, frames=20 + i, codec="mpeg4" if name.endswith(".avi") else "libx264")
    r = subprocess.run([sys.executable, "-m", "shmloader", "prepare", str(src), "--out", str(tmp_path / "local"),
                        "--short-side", str(SHORT), "--gop", str(GOP), "--workers", "1", "--quiet"],
                       capture_output=True, text=True, timeout=150, check=False)
    assert r.returncode == 0, r.stderr
    manifest = sray.prepare(src, tmp_path / "ray", short_side=SHORT, gop=GOP, resources=DECODE)
    assert manifest == str(tmp_path / "ray" / "manifest.csv")
    local, mine = rows_of(tmp_path / "local" / "manifest.csv"), rows_of(manifest)
    assert [r["path"] for r in mine] == ["a/v0.mp4", "a/v1.mp4", "b/v2.mp4", "b/v3.mp4"]
    for a, b in zip(mine, local, strict=True):  # the fields that differ, named
        assert {k: (a[k], b.get(k)) for k in a if k != "mtime_ns" and a[k] != b.get(k)} == {}, a["path"]
    for i, row in enumerate(mine):
        got = every_frame(str(tmp_path / "ray" / row["path"]))
        np.testing.assert_array_equal(got, every_frame(str(tmp_path / "local" / row["path"])))
        ids, numbers = read_codes(got)
        assert (ids == i).all() and list(numbers) == list(range(20 + i)) and got.shape[1:3] == (SHORT, 86)
    assert temporaries(tmp_path / "ray") == []
    before = {r["path"]: os.stat(tmp_path / "ray" / r["path"]).st_mtime_ns for r in mine}
    sray.prepare(src, tmp_path / "ray", short_side=SHORT, gop=GOP, resources=DECODE)
    assert {p: os.stat(tmp_path / "ray" / p).st_mtime_ns for p in before} == before
    assert rows_of(manifest) == mine


def test_a_file_that_cannot_be_prepared_is_a_row_and_fail_on_raises_after_the_manifest(cluster, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_video(src / "good.mp4", 3, frames=16)
    (src / "notes.mp4").write_text("not a video\n")
    with pytest.raises(ValueError, match=r"1 of 2 rows .* have a problem of fail_on \('unreadable',\); the first: "
                                         r".*notes\.mp4: unreadable: cannot prepare .*notes\.mp4: not a video"):
        sray.prepare(src, tmp_path / "dst", short_side=SHORT, gop=GOP, fail_on="unreadable", resources=DECODE)
    rows = {r["path"]: r for r in rows_of(tmp_path / "dst" / "manifest.csv")}
    assert rows["notes.mp4"]["problem"].startswith(f"unreadable: cannot prepare {src / 'notes.mp4'}: not a video")
    assert rows["good.mp4"]["problem"] == "" and rows["good.mp4"]["frames"] == "16"
    check_copy(str(tmp_path / "dst" / "good.mp4"), 3, 16)
    assert sorted(os.listdir(tmp_path / "dst")) == ["good.mp4", "manifest.csv"]


def test_a_file_over_the_timeout_is_cancelled_and_the_rest_prepared(cluster, tmp_path):
    """Its task is cancelled (its worker killed) 3 s after it is the oldest in flight, and its
    second try, a task of its own, 6 s after that; its row says so, its temporary files are
    gone, the short file is prepared."""
    src = tmp_path / "src"
    src.mkdir()
    # Copies at 1080x1920: 1500 frames are many seconds of encoding, 12 frames a fraction of the timeout.
    write_video(src / "a_long.mp4", 1, frames=1500, size=(240, 320), gop=1500)
    write_video(src / "b_short.mp4", 2, frames=12)
    t0 = time.monotonic()
    sray.prepare(src, tmp_path / "dst", size=(1080, 1920), timeout=3, resources=DECODE)
    rows = {r["path"]: r for r in rows_of(tmp_path / "dst" / "manifest.csv")}
    assert rows["a_long.mp4"]["problem"] == f"unreadable: cannot prepare {src / 'a_long.mp4'}: took over 6 s (timeout)"
    assert rows["b_short.mp4"]["frames"] == "12" and time.monotonic() - t0 < 60
    assert sorted(os.listdir(tmp_path / "dst")) == ["b_short.mp4", "manifest.csv"]


def writers(nodes, name: str = "") -> list[int]:
    """The processes of ``nodes`` (their task workers) that hold a temporary file open (of the
    copy ``name``, if given)."""
    found = []
    for pid in tree({pid for node in nodes for pid in node_pids(node)}):
        try:
            files = [os.path.basename(f.path) for f in psutil.Process(pid).open_files()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(f.startswith(f".{name}") and f.endswith(".preparing") for f in files):
            found.append(pid)
    return found


def test_a_file_whose_process_dies_on_every_try_is_a_row_and_the_rest_prepared(cluster, tmp_path):
    """A task's worker killed while it writes (a crash in the decoder), with no retry left
    (``max_retries=0``, passed to the tasks' options): that file's row says its process died,
    the others are prepared, no temporary file is left."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        write_video(src / f"v{i}.mp4", i, frames=300, size=(240, 320), gop=300)
    done: list = []
    run = threading.Thread(target=lambda: done.append(sray.prepare(
        src, tmp_path / "dst", short_side=SHORT, resources=DECODE, max_retries=0)))
    run.start()
    killed = []
    deadline = time.monotonic() + 90
    while not killed and run.is_alive() and time.monotonic() < deadline:
        for pid in writers([cluster.head_node, *cluster.worker_nodes], "v1.mp4."):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.005)
    run.join(timeout=120)
    assert killed, "v1.mp4 was never seen being written"
    assert not run.is_alive() and done
    rows = {r["path"]: r for r in rows_of(done[0])}
    assert rows["v1.mp4"]["problem"].startswith(
        f"unreadable: cannot prepare {src / 'v1.mp4'}: its process died, tried once (a crash in the decoder"), rows
    for i in (0, 2):
        assert rows[f"v{i}.mp4"]["problem"] == ""
        check_copy(str(tmp_path / "dst" / f"v{i}.mp4"), i, 300)
    assert sorted(os.listdir(tmp_path / "dst")) == ["manifest.csv", "v0.mp4", "v2.mp4"]


def test_resources_no_node_has_are_refused_in_words_before_anything_is_written(cluster, tmp_path):
    """Wrong arguments first, then: no node has the resource and no autoscaler can add one,
    LoaderError at once; an autoscaler could, but no node comes within ``node_timeout``,
    LoaderError once it is over. Nothing is written either way."""
    src = tmp_path / "src"
    src.mkdir()
    write_video(src / "v.mp4", 1, frames=12)
    dst = tmp_path / "dst"
    with pytest.raises(ValueError, match="gop must be an integer >= 1"):
        sray.prepare(src, dst, gop=0, resources={"gpu_decode": 1})
    t0 = time.monotonic()
    with pytest.raises(shmloader.LoaderError, match="the prepare tasks need CPU=1, gpu_decode=1 on one node, .*"
                                                    "no autoscaler can add one"):
        sray.prepare(src, dst, resources={"gpu_decode": 1})
    assert time.monotonic() - t0 < 10
    advertise_node_type({"CPU": 1, "gpu_decode": 1})
    try:
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match="no node has CPU=1, gpu_decode=1 for the prepare tasks yet"), \
                pytest.raises(shmloader.LoaderError, match="came up within 1 s"):
            sray.prepare(src, dst, resources={"gpu_decode": 1}, node_timeout=1)
        assert time.monotonic() - t0 < 10
    finally:
        advertise_node_type(None)
    assert not dst.exists()


def test_the_guides_example(cluster, tmp_path, monkeypatch):
    """docs/guide/preparing.md's Ray example as written, on this module's cluster."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(doc_example("ray-prepare"), ns)  # noqa: S102 - the docs page's own code
    assert [r["frames"] for r in rows_of(ns["manifest"])] == ["48"] * 4 and len(ns["clips"]) == 4


def prepare_in_a_process(cluster, src, dst) -> subprocess.Popen:
    """A driver of its own connected to the cluster, running ray.prepare of ``src`` into ``dst``."""
    code = (f"import ray, shmloader.ray; ray.init(address={cluster.address!r}); "
            f"shmloader.ray.prepare({str(src)!r}, {str(dst)!r}, short_side={SHORT}, resources={DECODE!r})")
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(shmloader.__file__))})


def test_ctrl_c_cancels_the_tasks_and_leaves_no_temporary_file(cluster, tmp_path):
    """A stop mid-run (SIGINT to the driver): its tasks are cancelled, no temporary file is left,
    the manifest lists what is finished, and a rerun prepares the rest."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    count, frames = 8, 300  # four files a decode slot: the stop comes before the last ones end
    for i in range(count):
        write_video(src / f"v{i}.mp4", i, frames=frames, size=(240, 320), gop=frames)
    p = prepare_in_a_process(cluster, src, dst)
    deadline = time.monotonic() + 90
    while not temporaries(dst) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.01)
    assert temporaries(dst), "no task started writing"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=90)
    assert p.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    assert temporaries(dst) == []
    # A task may finish as the driver stops: its copy is whole (renamed when whole), and the
    # rerun, which does not find it in the manifest, makes it again.
    done = [r["path"] for r in rows_of(dst / "manifest.csv")]
    copies = set(os.listdir(dst)) - {"manifest.csv"}
    assert len(done) < count and set(done) <= copies <= {f"v{i}.mp4" for i in range(count)}, (done, copies)
    sray.prepare(src, dst, short_side=SHORT, resources=DECODE)
    assert [r["path"] for r in rows_of(dst / "manifest.csv")] == [f"v{i}.mp4" for i in range(count)]
    for i in range(count):
        check_copy(str(dst / f"v{i}.mp4"), i, frames)


@ray.remote(num_cpus=1)
def _pid() -> int:
    return os.getpid()


def test_a_decode_nodes_raylet_killed_mid_run_loses_no_file_and_writes_none_twice(cluster, tmp_path):
    """A third decode node joins; its raylet is SIGKILLed while its task writes a copy: the task
    runs again on another node, and the manifest lists every file once, each copy whole, no
    temporary file left."""
    src = tmp_path / "src"
    src.mkdir()
    count, frames = 6, 300
    for i in range(count):
        write_video(src / f"v{i}.mp4", i, frames=frames, size=(240, 320), gop=frames)
    extra = cluster.add_node(**NODE, resources=DECODE)
    raylet = extra.all_processes["raylet"][0].process.pid
    # Its first task worker takes seconds to start on this box: started before the run.
    here = NodeAffinitySchedulingStrategy(extra.node_id, soft=False)
    assert ray.get(_pid.options(scheduling_strategy=here).remote(), timeout=120) not in node_pids(extra)
    done: list = []
    run = threading.Thread(target=lambda: done.append(sray.prepare(
        src, tmp_path / "dst", short_side=SHORT, gop=GOP, resources=DECODE, scheduling_strategy="SPREAD")))
    run.start()
    killed = False
    deadline = time.monotonic() + 120
    while not killed and run.is_alive() and time.monotonic() < deadline:
        if writers([extra]):  # the new node's task worker writes a copy: its raylet goes
            victims = tree(node_pids(extra)) - {raylet}
            os.kill(raylet, signal.SIGKILL)
            # Reaped as its parent would be on a real node: the workers it started watch its
            # PID to leave, and a zombie still answers to that PID.
            extra.all_processes["raylet"][0].process.wait(timeout=30)
            killed = True
        time.sleep(0.005)
    run.join(timeout=200)
    assert killed, "the new node wrote no copy before the run ended"
    assert not run.is_alive() and done == [str(tmp_path / "dst" / "manifest.csv")]

    def left() -> list[int]:
        return [p for p in victims if alive(p) and p not in node_pids(extra)]

    deadline = time.monotonic() + 30  # the dead node's task workers leave on their own
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left()
    rows = rows_of(done[0])
    assert sorted(r["path"] for r in rows) == [f"v{i}.mp4" for i in range(count)]  # each once
    assert all(r["problem"] == "" and r["frames"] == str(frames) for r in rows), rows
    for i in range(count):
        check_copy(str(tmp_path / "dst" / f"v{i}.mp4"), i, frames)
    assert sorted(os.listdir(tmp_path / "dst")) == ["manifest.csv"] + [f"v{i}.mp4" for i in range(count)]
