"""shmloader.ray on a real local Ray cluster: a head with the ``trainer`` resource and two CPU
nodes with ``decode``, started once for the module (20-30 s) and shut down with every process it
started gone. Frames are checked by the codes the test videos carry in their pixels."""

import json
import os
import pickle
import signal
import subprocess
import sys
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
from shmloader.samples import read_codes

from ._examples import doc_example
from ._sound import FPS, RATE, write_av

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def clips(videos):
    paths, labels = videos
    return shmloader.VideoClips(paths, labels, clip_len=4, frame_step=2, clips_per_video=2)


def rows_of(ds) -> list[dict]:
    return [dict(r) for r in ds.iter_rows()]


def check_codes(row) -> None:
    """The pixels are the frames the row names, of the video it names."""
    ids, frames = read_codes(np.asarray(row["video"]))
    assert (ids == row["index"]).all() and (frames == np.asarray(row["frames"])).all(), (ids, frames, row["frames"])


def loader_epochs(clips, epochs: int, seed: int) -> list[set]:
    """(index, start, frames) of each epoch of the local Loader with that seed."""
    out: list[list] = [[] for _ in range(epochs)]
    with shmloader.Loader(clips, batch_size=4, workers=1, shuffle=True, seed=seed, epochs=epochs) as loader:
        per = len(loader)
        for b, batch in enumerate(loader):
            out[b // per] += [(int(i), int(s), tuple(f)) for i, s, f in
                              zip(batch["index"], batch["start"], batch["frames"].tolist())]
    return [sorted(e) for e in out]


def test_import_shmloader_does_not_import_ray():
    code = "import sys, shmloader, shmloader.clips.reader; print('ray' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.strip() == "False", r.stderr


def test_clips_pickle_by_value_with_the_manifest_columns(videos, tmp_path):
    """A pickled VideoClips holds no descriptor: read in a fresh process it gives the same arrays,
    and a scan manifest's columns come along (decord's files are not probed again)."""
    manifest = str(tmp_path / "m.csv")
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", os.path.dirname(videos[0][0]), "--out", manifest,
                        "--workers", "1"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    clips = shmloader.VideoClips.from_csv(manifest, clip_len=4)
    blob = pickle.dumps(clips)
    assert b"memfd" not in blob and len(blob) < 20_000
    code = ("import json, pickle, sys; r = pickle.loads(sys.stdin.buffer.read()).reader(); "
            "b = r.read([0, 3], seed=3, epoch=1); print(json.dumps([b['start'].tolist(), r.counters()]))")
    r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    starts, counters = json.loads(r.stdout)
    assert starts == clips.reader().read([0, 3], seed=3, epoch=1)["start"].tolist()
    assert counters["probes"] == 0 and counters["decord"] == 2, counters


def test_epochs_are_the_local_loaders_by_frame_codes(cluster, clips):
    seed = 7
    ds = sray.dataset(clips, epochs=2, seed=seed, shuffle=True, resources={"decode": 1}, samples_per_task=3)
    rows = rows_of(ds)
    assert {"video", "label", "index", "start", "frames", "epoch", "sample"} <= set(rows[0])
    for r in rows:
        check_codes(r)
        assert r["label"] == r["index"] % 3 and r["sample"] // 2 == r["index"]
    local = loader_epochs(clips, 2, seed)
    for e in range(2):
        mine = [r for r in rows if r["epoch"] == e]
        assert sorted(int(r["sample"]) for r in mine) == list(range(len(clips)))
        assert sorted((int(r["index"]), int(r["start"]), tuple(r["frames"].tolist())) for r in mine) == local[e]
    assert local[0] != local[1]  # random starts: the epochs differ, and each matched its own
    # Placement: only the nodes with the decode resource read anything.
    decode = {n.node_id for n in cluster.decode_nodes}
    done = sray.stats(ds)
    assert set(done) <= decode and sum(s["samples"] for s in done.values()) == 2 * len(clips), done


def test_the_tasks_import_this_checkout(cluster):
    @ray.remote(resources={"decode": 1})
    def where():
        import shmloader

        return shmloader.__file__

    assert ray.get(where.remote(), timeout=60) == shmloader.__file__


def test_the_arguments_shared_with_loader_default_alike():
    """dataset() and Loader share these arguments, and with them the defaults: a dataset built
    with the defaults holds the epochs of ``Loader(clips)`` built with its own."""
    import inspect

    mine = inspect.signature(sray.dataset).parameters
    loaders = inspect.signature(shmloader.Loader).parameters
    shared = mine.keys() & loaders.keys()
    assert shared == {"epochs", "seed", "shuffle", "on_error", "group_window"}, shared
    assert {k: mine[k].default for k in shared} == {k: loaders[k].default for k in shared}
    assert inspect.signature(sray.plan_items).parameters["shuffle"].default is False


def test_task_items_by_size_and_by_video(videos):
    """The driver's cut of the plan into tasks (no cluster): by default 16 whole videos a task
    grouped, 64 samples one clip per sample, either way no more than 128 MB of rows a task and at
    least one video; ``samples_per_task`` whole videos up to that many samples."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_video=4, group_clips=True)
    assert [len(i["samples"]) for i in sray.plan_items(clips, epochs=1, seed=1)] == [4 * min(16, len(paths))]
    for size, per_task in (((96, 128), 64), ((480, 640), 128 * 1024**2 // (4 * 480 * 640 * 3))):
        one = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_video=12, size=size)
        sizes = [len(i["samples"]) for i in sray.plan_items(one, epochs=2, seed=1)]
        per_epoch = [per_task] * (len(one) // per_task) + ([len(one) % per_task] if len(one) % per_task else [])
        assert len(one) > per_task and sizes == per_epoch * 2, (size, sizes)
    big = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_video=4, group_clips=True, size=(2160, 3840))
    assert [len(i["samples"]) for i in sray.plan_items(big, epochs=1, seed=1)] == [4] * len(paths)  # one video
    items = sray.plan_items(clips, epochs=2, seed=1, shuffle=True, samples_per_task=8)  # two videos a task
    assert len(items) == len(paths) and all(len(i["samples"]) == 8 for i in items)
    for e in range(2):
        videos = [sorted({s // 4 for s in i["samples"]}) for i in items if i["epoch"] == e]
        assert sorted(v for vs in videos for v in vs) == list(range(len(paths)))  # each video in one task
    assert [i["samples"] for i in items[: len(paths) // 2]] != [i["samples"] for i in items[len(paths) // 2 :]]


def test_task_size_counts_every_field_of_a_row(videos):
    """The 128 MB a task's rows may take count the audio and every other field of the spec (and
    the ``epoch`` and ``sample`` a task adds), not the video alone: a minute of 48 kHz stereo a
    clip holds 64 clips' video in about 1 MB but their sound in 1.4 GB."""
    paths, labels = videos
    kw = dict(clip_len=4, clips_per_video=12, size=(96, 128))
    loud = shmloader.VideoClips(paths, labels, audio_rate=48000, audio_channels=2, audio_seconds=60, **kw)
    spec = loud.spec()
    assert spec["audio"] == ((60 * 48000, 2), np.dtype(np.float32))
    row = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in spec.values()) + 2 * 8
    per_task = 128 * 1024**2 // row
    assert 1 < per_task < 64  # the audio alone is 23 MB a row; the video 147 kB
    sizes = [len(i["samples"]) for i in sray.plan_items(loud, epochs=1, seed=1)]
    assert sizes == [per_task] * (len(loud) // per_task) + [len(loud) % per_task] * bool(len(loud) % per_task)
    quiet = shmloader.VideoClips(paths, labels, **kw)  # the same clips without sound: 64 a task
    assert [len(i["samples"]) for i in sray.plan_items(quiet, epochs=1, seed=1)][0] == min(64, len(quiet))
    grouped = shmloader.VideoClips(paths, labels, audio_rate=48000, audio_channels=2, audio_seconds=60,
                                   group_clips=True, **kw)  # whole videos: at least one a task
    assert [len(i["samples"]) for i in sray.plan_items(grouped, epochs=1, seed=1)] == [12] * len(paths)


def test_grouped_clips_a_task_per_video(cluster, videos):
    """Grouped clips through Ray: each video read in one task, in one decode pass, with the local
    loader's clips."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_video=4, group_clips=True)
    ds = sray.dataset(clips, seed=1, shuffle=True, resources={"decode": 1}, samples_per_task=8)
    rows = rows_of(ds)
    assert sorted(int(r["sample"]) for r in rows) == list(range(len(clips)))
    for r in rows:
        check_codes(r)
    assert sorted((int(r["index"]), int(r["start"])) for r in rows) == \
        sorted((i, s) for i, s, _ in loader_epochs(clips, 1, 1)[0])
    done = sray.stats(ds)
    assert sum(s["tasks"] for s in done.values()) == len(paths) // 2
    assert sum(s["decord"] + s["pyav"] for s in done.values()) == len(paths)  # one decode pass per video


def test_rows_carry_each_clips_audio(cluster, tmp_path):
    """``audio_rate=``: every row has its clip's ``audio`` and ``audio_len``, the samples the
    reader gives for that sample and epoch in this process."""
    paths = [write_av(tmp_path / "a.mp4", "aac"), write_av(tmp_path / "b.mov", "pcm_s16le")]
    clips = shmloader.VideoClips(paths, clip_len=4, clips_per_video=2, audio_rate=RATE)
    ds = sray.dataset(clips, seed=3, shuffle=True, resources={"decode": 1}, samples_per_task=2)
    rows = rows_of(ds)
    assert sorted(int(r["sample"]) for r in rows) == list(range(4))
    n = round(4 / FPS * RATE)
    reader = clips.reader()
    for r in rows:
        want = reader.read([int(r["sample"])], seed=3, epoch=int(r["epoch"]))
        assert r["audio"].dtype == np.float32 and r["audio"].shape == (n, 1) and int(r["audio_len"]) == n
        assert int(r["start"]) == int(want["start"][0])
        np.testing.assert_allclose(r["audio"], want["audio"][0], atol=1e-4)
        assert np.abs(r["audio"]).max() > 0.02


@pytest.fixture
def strategies(monkeypatch):
    """The ``compute=`` strategy each ``dataset()`` asks of Ray Data's public ``map_batches``
    (None: none, Ray Data's own scheduling), in order."""
    asked: list = []
    map_batches = ray.data.Dataset.map_batches

    def spy(self, fn, *args, **kwargs):
        asked.append(kwargs.get("compute"))
        return map_batches(self, fn, *args, **kwargs)

    monkeypatch.setattr(ray.data.Dataset, "map_batches", spy)
    return asked


def test_tasks_in_flight_caps_the_decode_tasks_on_the_datasets_own_context(cluster, clips, strategies):
    """By default twice the decode slots are in flight (a slot per ``decode`` resource), Ray
    Data's resource reservation off on the dataset's own context only; ``"ray"`` leaves Ray Data's
    scheduling as it is. Each way delivers the local loader's epoch."""
    from ray.data import DataContext

    reserve = DataContext.get_current().op_resource_reservation_enabled
    slots = int(ray.cluster_resources()["decode"])
    local = loader_epochs(clips, 1, 5)[0]
    for tasks, size, reserving in (("auto", 2 * slots, False), (1, 1, False), ("ray", None, reserve)):
        ds = sray.dataset(clips, seed=5, shuffle=True, resources={"decode": 1}, samples_per_task=3,
                          tasks_in_flight=tasks)
        assert (getattr(strategies[-1], "size", None), ds.context.op_resource_reservation_enabled) \
            == (size, reserving), tasks
        rows = rows_of(ds)
        assert sorted((int(r["index"]), int(r["start"]), tuple(r["frames"].tolist())) for r in rows) == local
        assert DataContext.get_current().op_resource_reservation_enabled == reserve  # the global one is left alone
    # The caller's own compute strategy: passed on as given, the reservation as it was.
    theirs = ray.data.TaskPoolStrategy(size=3)
    ds = sray.dataset(clips, resources={"decode": 1}, compute=theirs)
    assert strategies[-1] is theirs and ds.context.op_resource_reservation_enabled == reserve
    for wrong in (0, None, "none", 2.5):
        with pytest.raises(ValueError, match="tasks_in_flight must be 'auto', an integer >= 1 or 'ray'"):
            sray.dataset(clips, tasks_in_flight=wrong)
    with pytest.raises(ValueError, match="not both"):
        sray.dataset(clips, tasks_in_flight=2, compute=ray.data.TaskPoolStrategy(size=2))


def test_a_task_worker_keeps_its_probes_for_the_next_dataset(cluster, clips):
    """Datasets over the same clips (an epoch each) share a reader in each task worker: on one
    node, the second dataset opens no file to probe it again."""
    # Pinned by the node's own label: map_batches' named remote parameters have no scheduling
    # strategy (ray_remote_args is deprecated, to go in Ray 2.64).
    pin = {"ray.io/node-id": cluster.decode_nodes[0].node_id}
    for seed in (11, 12):
        ds = sray.dataset(clips, seed=seed, resources={"decode": 1}, label_selector=pin)
        assert sorted(int(r["sample"]) for r in rows_of(ds)) == list(range(len(clips)))
        done = sray.stats(ds)
        assert set(done) == {cluster.decode_nodes[0].node_id}, done
    assert sum(s["probes"] for s in done.values()) == 0, done


def test_skip_counts_and_names_the_bad_samples(cluster, videos, tmp_path):
    paths, _ = videos
    bad = tmp_path / "not_a_video.mp4"
    bad.write_bytes(b"\0" * 4096)
    clips = shmloader.VideoClips([*paths[:3], str(bad)], [0, 1, 2, 0], clip_len=4, size=(96, 128))
    ds = sray.dataset(clips, epochs=2, seed=2, on_error="skip", resources={"decode": 1}, samples_per_task=2)
    rows = rows_of(ds)
    assert sorted((int(r["epoch"]), int(r["sample"])) for r in rows) == [(e, s) for e in range(2) for s in range(3)]
    skips = sray.skipped(ds)
    assert sorted((e, s) for e, s, _ in skips) == [(0, 3), (1, 3)]
    # The datasets derived from it answer too (a map, a shuffle): the log is on their shared context.
    derived = ds.map(lambda row: row).random_shuffle(seed=1)
    assert sray.skipped(derived) == skips and sray.stats(derived) == sray.stats(ds)
    assert all(reason for _, _, reason in skips)
    assert sum(s["skipped"] for s in sray.stats(ds).values()) == 2


def test_the_task_log_keeps_the_most_recent_skips_once_each():
    """The log's own bookkeeping (no cluster): as a loader's ``skipped``, the most recent skips in
    the order reported, as many as a loader keeps; a sample a re-run task skips again counts once
    there; the counts add up per node."""
    from shmloader.ray._tasks import TaskLog
    from shmloader.engine.skips import SKIPS_KEPT as KEPT

    log = TaskLog()
    for s in range(KEPT + 5):
        log.add("ds", "n1", [(1, s, "bad")], {"tasks": 1, "skipped": 1})
    log.add("ds", "n2", [(1, KEPT + 4, "bad again")], {"tasks": 1, "skipped": 1})  # a re-run task
    got = log.skipped("ds")
    assert len(got) == KEPT and got[0] == (1, 5, "bad") and got[-1] == (1, KEPT + 4, "bad")
    assert log.stats("ds") == {"n1": {"tasks": KEPT + 5, "skipped": KEPT + 5}, "n2": {"tasks": 1, "skipped": 1}}
    log.forget("ds")
    assert log.skipped("ds") == [] and log.stats("ds") == {}


def test_raise_names_the_file_and_sample(cluster, videos):
    paths, _ = videos
    missing = os.path.join(os.path.dirname(paths[0]), "gone.mp4")
    clips = shmloader.VideoClips([paths[0], missing], [0, 1], clip_len=4, size=(96, 128))
    ds = sray.dataset(clips, shuffle=False, resources={"decode": 1}, samples_per_task=2)
    with pytest.raises(shmloader.SampleError) as info:
        rows_of(ds)
    assert info.value.index == 1 and info.value.where.endswith("gone.mp4'"), info.value.where
    text = str(info.value)
    assert "sample 1" in text and "gone.mp4" in text, text[-3000:]


def test_a_resource_no_node_has_is_refused_at_once_in_words(cluster, clips):
    """No node has the resource (or that much of it) and no autoscaler can add one: LoaderError
    from dataset() itself, naming what is asked and what the nodes have; nothing waits."""
    for resources, asked in (({"gpu_decode": 1}, "gpu_decode=1"), ({"decode": 2}, "decode=2")):
        with pytest.raises(shmloader.LoaderError, match=f"need CPU=1, {asked} on one node") as info:
            sray.dataset(clips, resources=resources)
        text = str(info.value)
        assert "no autoscaler can add one" in text and text.count(f"{asked.split('=')[0]}=") == 1 + 3, text
    with pytest.raises(shmloader.LoaderError, match="need CPU=64 on one node"):
        sray.dataset(clips, num_cpus=64)
    with pytest.raises(ValueError, match="node_timeout must be a positive number"):
        sray.dataset(clips, resources={"decode": 1}, node_timeout=0)


def test_a_node_an_autoscaler_could_add_is_asked_for_and_waited_for_in_bounds(cluster, clips):
    """A node type with the resource is advertised (an autoscaling cluster): dataset() warns and
    asks for it; no node comes within ``node_timeout``: LoaderError saying so. Then a node with it
    joins during the wait (as the autoscaler would start it): dataset() returns, and the rows
    are decoded there."""
    import threading

    advertise_node_type({"CPU": 1, "gpu_decode": 1})
    added = []
    try:
        with pytest.warns(RuntimeWarning, match="no node has CPU=1, gpu_decode=1 .* waiting up to 1 s"):
            with pytest.raises(shmloader.LoaderError, match="came up within 1 s"):
                sray.dataset(clips, resources={"gpu_decode": 1}, node_timeout=1)
        built: list = []  # dataset() waits in a thread; the node joins from here (Ray's own
        # node start needs the main thread)
        waiting = threading.Thread(target=lambda: built.append(
            sray.dataset(clips, seed=1, resources={"gpu_decode": 1}, node_timeout=120)))
        with pytest.warns(RuntimeWarning, match="asking the autoscaler"):
            waiting.start()
            time.sleep(1.0)
            assert waiting.is_alive() and not built, "dataset() did not wait for the node"
            added.append(cluster.add_node(**NODE, resources={"gpu_decode": 1}))
            waiting.join(timeout=150)
        (ds,) = built
        rows = rows_of(ds)
        assert sorted(int(r["sample"]) for r in rows) == list(range(len(clips)))
        (node,) = sray.stats(ds)  # every task ran on the node that joined
        assert node == added[0].node_id
    finally:
        advertise_node_type(None)
        for n in added:
            cluster.remove_node(n)


def test_streaming_split_gives_two_ranks_disjoint_shards(cluster, clips):
    ds = sray.dataset(clips, seed=5, resources={"decode": 1}, samples_per_task=4)  # blocks for both

    @ray.remote(num_cpus=0, resources={"trainer": 0.5})
    class Rank:
        def samples(self, it):
            return [int(s) for b in it.iter_batches(batch_size=4, batch_format="numpy") for s in b["sample"]]

    ranks = [Rank.remote() for _ in range(2)]
    shards = ray.get([r.samples.remote(it) for r, it in zip(ranks, ds.streaming_split(2))], timeout=180)
    assert all(shards) and not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(len(clips)))
    for r in ranks:
        ray.kill(r)


def test_iter_torch_batches(cluster, clips):
    import torch

    ds = sray.dataset(clips, seed=3, resources={"decode": 1})
    seen = []
    for b in ds.iter_torch_batches(batch_size=4):
        assert isinstance(b["video"], torch.Tensor) and b["video"].dtype == torch.uint8
        assert tuple(b["video"].shape[1:]) == (4, 96, 128, 3)
        ids, frames = read_codes(b["video"].numpy())
        assert (ids == b["index"].numpy()[:, None]).all() and (frames == b["frames"].numpy()).all()
        seen += b["sample"].tolist()
    assert sorted(seen) == list(range(len(clips)))


def test_to_tf_delivers_the_epoch(cluster, clips):
    import tensorflow as tf

    ds = sray.dataset(clips, seed=4, resources={"decode": 1})
    tfds = ds.to_tf(feature_columns=["video", "sample"], label_columns="label", batch_size=4)
    assert isinstance(tfds, tf.data.Dataset)
    seen = []
    for features, label in tfds:
        ids, _ = read_codes(features["video"].numpy())
        assert (ids[:, 0] % 3 == label.numpy()).all()
        seen += features["sample"].numpy().tolist()
    assert sorted(seen) == list(range(len(clips)))


def test_the_guides_example(cluster, tmp_path, monkeypatch):
    """docs/guide/beyond-one-node.md's example as written, on this module's cluster."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(doc_example("ray-trainer"), ns)  # noqa: S102 - the docs page's own code
    assert tuple(ns["video"].shape) == (4, 4, 96, 128, 3) and len(ns["shards"]) == 2
    assert ns["shmloader"].ray.skipped(ns["ds"]) == []


@ray.remote(num_cpus=1)
def _pid() -> int:
    return os.getpid()


def test_a_decode_nodes_raylet_killed_mid_epoch(cluster, clips):
    """A third decode node joins; its raylet is SIGKILLed once rows flow: its tasks run again on
    the others and every sample of the three epochs arrives exactly once, with the right frames."""
    extra = cluster.add_node(**NODE, resources={"decode": 1})
    raylet = extra.all_processes["raylet"][0].process.pid
    # Its first task worker takes seconds to start on this box: started before the epoch.
    here = NodeAffinitySchedulingStrategy(extra.node_id, soft=False)
    assert ray.get(_pid.options(scheduling_strategy=here).remote(), timeout=120) not in node_pids(extra)
    # One task in flight per slot: with the default two, the warm workers of the first nodes take
    # these one-sample tasks back to back (Ray hands a queued task to a worker it already holds)
    # and the new node may get none before the epochs end.
    ds = sray.dataset(clips, epochs=3, seed=9, resources={"decode": 1}, samples_per_task=1, tasks_in_flight=3)
    rows, killed_at = [], None
    for r in ds.iter_rows():
        rows.append(dict(r))
        if killed_at is None and len(rows) >= 3:
            if extra.node_id in sray.stats(ds):  # it has decoded: kill it with work in hand
                victims = tree(node_pids(extra))  # its raylet, log monitor and task workers
                os.kill(raylet, signal.SIGKILL)
                # Reaped as its parent would be on a real node: the workers it started watch its
                # PID to leave, and a zombie still answers to that PID.
                extra.all_processes["raylet"][0].process.wait(timeout=30)
                killed_at = len(rows)
            assert len(rows) < 2 * len(clips), "the third node decoded nothing in two epochs"
    assert killed_at is not None and not alive(raylet)
    # The dead node's task workers notice and leave on their own (the others stay for next time).
    def left() -> list[int]:
        return [p for p in victims if p != raylet and alive(p) and p not in node_pids(extra)]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), [(p, psutil.Process(p).cmdline()[:2]) for p in left()]
    assert sorted((int(r["epoch"]), int(r["sample"])) for r in rows) == \
        [(e, s) for e in range(3) for s in range(len(clips))]
    for r in rows:
        check_codes(r)


def test_planned_videos_give_rows_of_their_own_sizes(cluster, tmp_path):
    """A source of samples of several sizes (shmloader.planned): each Ray row holds its sample's
    own rows, the same as the loader's sample of that id."""
    from dataclasses import dataclass

    from shmloader.planned import Planned, PlannedVideos
    from shmloader.samples import write_video

    @dataclass(frozen=True)
    class Even:
        def spec(self):
            return {"video": ((-1, 32, 48, 3), np.dtype(np.uint8))}

        def plan(self, video):
            n = min(5, video.frames)
            return Planned(indices=np.linspace(0, video.frames - 1, n).round().astype(np.int64), size=(32, 48),
                           rows={"video": n}, cost=n)

        def fill(self, frames, planned, video, out):
            out["video"][:] = frames

    paths = [write_video(tmp_path / f"v{i}.mp4", i, frames=n, size=(64, 96)) for i, n in enumerate([3, 12, 30])]
    src = PlannedVideos(paths, [1, 2, 3], Even())
    rows = rows_of(sray.dataset(src, epochs=1, seed=4, shuffle=True, samples_per_task=2))
    assert sorted(int(r["index"]) for r in rows) == [0, 1, 2]
    with shmloader.Loader(src, batch_size=3, workers=1) as loader:
        (batch,) = list(loader)
    for r in rows:
        i = int(r["index"])
        video = np.asarray(r["video"])
        o = batch["video_offsets"]
        k = int(np.flatnonzero(batch["index"] == i)[0])
        assert video.shape == (min(5, [3, 12, 30][i]), 32, 48, 3) and int(r["label"]) == i + 1
        np.testing.assert_array_equal(video, batch["video"][o[k] : o[k + 1]])
        ids, _ = read_codes(video)
        assert (ids == i).all()


def test_a_task_of_skipped_samples_alone_gives_no_rows(cluster, tmp_path):
    """``on_error="skip"``: a task whose samples are all unreadable delivers no rows, whatever its
    source's fields (here a field of rows of several sizes, ``shmloader.planned``), and the
    dataset goes on with the other tasks."""
    from dataclasses import dataclass

    from shmloader.planned import Planned, PlannedVideos
    from shmloader.samples import write_video

    @dataclass(frozen=True)
    class Three:
        def spec(self):
            return {"video": ((-1, 32, 48, 3), np.dtype(np.uint8))}

        def plan(self, video):
            return Planned(indices=np.arange(3), size=(32, 48), rows={"video": 3}, cost=3)

        def fill(self, frames, planned, video, out):
            out["video"][:] = frames

    paths = [write_video(tmp_path / f"v{i}.mp4", i, frames=6, size=(64, 96)) for i in range(3)]
    src = PlannedVideos(paths, None, Three())
    with open(paths[1], "r+b") as f:  # planned, then damaged: its task fails whole
        f.write(b"\0" * 4096)
    ds = sray.dataset(src, seed=1, on_error="skip", samples_per_task=1)
    rows = rows_of(ds)
    assert sorted(int(r["sample"]) for r in rows) == [0, 2]
    assert [(e, s) for e, s, _ in sray.skipped(ds)] == [(0, 1)]


def test_a_bucketed_family_gives_each_sample_in_its_bucket(cluster, tmp_path):
    """Open-Sora's buckets on Ray: epoch e's rows are the samples of the loader's epoch e (padding
    repeats included), each in its bucket's shape, the same video as the loader's for the same seed."""
    from shmloader import opensora
    from shmloader.samples import write_video

    paths = [write_video(tmp_path / f"v{i}.mp4", i, frames=40, size=size, fps=25)
             for i, size in enumerate([(96, 128), (96, 128), (128, 96)])]
    src = opensora.clips(paths, ["a", "b", "c"], bucket_config={"64px": {17: (1.0, 2), 9: ((1.0, 0.5), 2)}})
    rows = rows_of(sray.dataset(src, epochs=1, seed=4, shuffle=True))
    with shmloader.Loader(src, seed=4, shuffle=True, workers=1) as loader:
        batches = list(loader)
    assert sorted(int(r["index"]) for r in rows) == sorted(i for b in batches for i in b["index"].tolist())
    for r in rows:
        batch = next(b for b in batches if int(r["index"]) in b["index"].tolist())
        k = batch["index"].tolist().index(int(r["index"]))
        t, h, w = batch["thw"][k].tolist()
        assert np.asarray(r["video"]).shape == (t, h, w, 3) and r["caption"] == "abc"[int(r["index"])]
        np.testing.assert_array_equal(np.asarray(r["video"]), batch["video"][k])
