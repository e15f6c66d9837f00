"""A LeRobot v3 dataset (``shmloader.lerobot``) through ``shmloader.ray`` on a real local Ray cluster
(``_ray_cluster``: a head and two ``decode`` nodes on 127.0.0.1, once for the module): each Ray epoch
holds the local loader's samples of that epoch, every field equal, windows and pads included; the
plan's stretches of an episode stay whole in one task; a missing video is skipped and named."""

import os
import re

import numpy as np
import pytest

from ._needs import need
from ._ray_cluster import cluster, no_leaks  # noqa: F401 (fixtures)

ray = need("ray")  # after _ray_cluster, which sets Ray's environment for a cluster on 127.0.0.1
need("pyarrow")  # tests/_lerobot_v3.py writes the parquet files

import shmloader
import shmloader.ray as sray
from shmloader import lerobot
from shmloader.samples import read_codes

from . import _lerobot_v3 as v3

pytestmark = pytest.mark.timeout(240)

FPS = v3.FPS
WINDOWS = {v3.FRONT: [-2 / FPS, -1 / FPS, 0.0], "action": [0.0, 1 / FPS, 2 / FPS]}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return v3.write(str(tmp_path_factory.mktemp("lerobot") / "ds"))


def loader_epochs(source, epochs: int, seed: int, **kw) -> tuple[list[dict[int, dict]], list]:
    """Each epoch of the local ``Loader(source, seed=seed, shuffle=True)``: sample id (the row's
    ``index``: every episode is chosen) -> its fields; and the loader's ``skipped``."""
    out: list[dict[int, dict]] = [{} for _ in range(epochs)]
    with shmloader.Loader(source, batch_size=4, workers=1, shuffle=True, seed=seed, epochs=epochs, **kw) as loader:
        per = len(loader)  # batches an epoch (no batch spans two)
        for b, batch in enumerate(loader):
            for i in range(len(batch["index"])):
                out[b // per][int(batch["index"][i])] = {k: np.array(v[i]) for k, v in batch.items()}
        skipped = list(loader.skipped)
    return out, skipped


def rows_of(rds) -> list[dict]:
    """The dataset's rows as numpy arrays of the dtypes the tasks made (``iter_rows`` gives a
    scalar field as a Python number)."""
    return [{k: v[i] for k, v in b.items()} for b in rds.iter_batches(batch_size=None, batch_format="numpy")
            for i in range(len(b["sample"]))]


def check_rows_equal_the_loaders(rows: list[dict], local: list[dict[int, dict]]) -> None:
    """Each row is its epoch's local sample of its id, field by field (pixels, numbers, pads)."""
    for r in rows:
        want = local[int(r["epoch"])][int(r["sample"])]
        assert set(r) == set(want) | {"epoch", "sample"}
        for k, v in want.items():
            got = np.asarray(r[k])
            assert got.dtype == v.dtype and np.array_equal(got, v), (int(r["sample"]), k)


def test_each_stretch_is_in_one_task_of_its_epoch(written):
    """The driver's cut (no cluster): every stretch of an episode (``group_ids``) whole in one task
    of each epoch, every sample once an epoch, as many samples a task as asked at most (but one
    stretch), and the epoch's samples the plan's."""
    ds = lerobot.dataset(written, stretch=4)
    groups = ds.group_ids()
    items = sray.plan_items(ds, epochs=2, seed=1, shuffle=True, samples_per_task=6)
    for e in range(2):
        mine = [i["samples"] for i in items if i["epoch"] == e]
        assert sorted(s for m in mine for s in m) == list(range(len(ds)))
        owner = {}
        for t, samples in enumerate(mine):
            assert len(samples) <= 6
            for g in groups[samples].tolist():
                assert owner.setdefault(g, t) == t, f"stretch {g} split between tasks"
        assert len(owner) == int(groups.max()) + 1
    default = sray.plan_items(ds, epochs=1, seed=1)  # a small dataset: one task, 16 stretches a task
    assert [sorted(i["samples"]) for i in default] == [list(range(len(ds)))]


def test_epochs_are_the_local_loaders_with_windows(cluster, written):
    """Two shuffled epochs with a history of frames and a chunk of actions that pass the
    episodes' edges: each epoch holds every sample once, each row equal to the local loader's
    sample of that epoch in every field; only the decode nodes read; a task decodes each camera's
    file once per pass over its stretches."""
    ds = lerobot.dataset(written, delta_timestamps=WINDOWS, stretch=4)
    seed = 3
    rds = sray.dataset(ds, epochs=2, seed=seed, shuffle=True, resources={"decode": 1}, samples_per_task=8)
    rows = rows_of(rds)
    local, _ = loader_epochs(ds, 2, seed)
    for e in range(2):
        assert sorted(int(r["sample"]) for r in rows if r["epoch"] == e) == list(range(len(ds)))
    assert len(rows) == 2 * len(ds)
    check_rows_equal_the_loaders(rows, local)
    for r in rows:  # the pixels are frames of the right camera, and pads where the windows pass an edge
        assert int(r["sample"]) == int(r["index"])
        for camera, vid in v3.CAMERAS.items():
            ids, _ = read_codes(np.asarray(r[camera]))
            assert (ids == vid).all()
    assert any(r[f"{v3.FRONT}_is_pad"].any() for r in rows) and any(r["action_is_pad"].any() for r in rows)
    done = sray.stats(rds)
    assert set(done) <= {n.node_id for n in cluster.decode_nodes}, done
    assert sum(s["samples"] for s in done.values()) == 2 * len(ds)
    items = sray.plan_items(ds, epochs=2, seed=seed, shuffle=True, samples_per_task=8)
    assert sum(s["tasks"] for s in done.values()) == len(items)
    assert sum(s["frames_delivered"] for s in done.values()) == 2 * len(ds) * (3 + 1)  # front's 3, wrist's 1
    assert sray.skipped(rds) == []


def test_a_missing_video_is_skipped_and_named(cluster, tmp_path):
    """The front camera's second file (episodes 2 and 3) is gone: with ``on_error="skip"`` the
    other episodes' samples arrive, each equal to the local loader's, and ``skipped(ds)`` lists the
    loader's own skips, naming the file; with ``"raise"`` the first ends the dataset as a
    ``SampleError`` naming the sample's episode."""
    root = v3.write(str(tmp_path / "ds"))
    ds = lerobot.dataset(root, delta_timestamps={"action": WINDOWS["action"]}, stretch=4)
    gone = os.path.join(root, "videos", v3.FRONT, "chunk-000", "file-001.mp4")
    os.remove(gone)
    bad = set(range(v3.LENGTHS[0] + v3.LENGTHS[1], len(ds)))  # episodes 2 and 3
    rds = sray.dataset(ds, seed=2, shuffle=True, on_error="skip", resources={"decode": 1}, samples_per_task=4)
    rows = rows_of(rds)
    assert sorted(int(r["sample"]) for r in rows) == sorted(set(range(len(ds))) - bad)
    (local,), local_skips = loader_epochs(ds, 1, 2, on_error="skip")
    check_rows_equal_the_loaders(rows, [local])
    skips = sray.skipped(rds)
    assert sorted((e, s) for e, s, _ in skips) == [(0, s) for s in sorted(bad)]
    assert sorted((e, s) for e, s, _ in skips) == sorted((e, s) for e, s, _ in local_skips)
    assert all("file-001.mp4" in reason for _, _, reason in skips), skips[:2]
    done = sray.stats(rds)
    assert sum(s["skipped"] for s in done.values()) == len(bad)
    assert sum(s["samples"] for s in done.values()) == len(ds) - len(bad)
    # Some task held bad samples alone (stretches of 4, tasks of 4): it delivered no rows and
    # the dataset went on.
    items = sray.plan_items(ds, seed=2, shuffle=True, samples_per_task=4)
    assert any(set(i["samples"]) <= bad for i in items)
    with pytest.raises(shmloader.SampleError) as info:
        rows_of(sray.dataset(ds, resources={"decode": 1}, samples_per_task=4))
    assert info.value.index in bad and re.search(r", episode [23], frame \d+$", info.value.where), info.value.where
