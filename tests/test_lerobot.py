"""LeRobot v3 datasets (``shmloader.lerobot``): every timestep once an epoch, each camera's frame
at its time in the episode's stretch of the shared file, windows and pads at the episodes' edges,
and the same items ``LeRobotDataset[i]`` gives, checked against LeRobot itself where a Python with
lerobot installed is found (``lerobot_python``)."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import shmloader
from shmloader import LoaderError
from shmloader import lerobot
from shmloader.samples import read_codes

from . import _lerobot_reference as reference
from . import _lerobot_v3 as v3

ROOT = Path(__file__).resolve().parent.parent


def lerobot_python() -> str | None:
    """A Python that imports lerobot: this one (the lerobot lane), the lane's venv
    (``.venv-lerobot-<python>``, tests/lanes.py), or ``$SHMLOADER_LEROBOT_PYTHON``."""
    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    found = sorted(glob.glob(str(ROOT / ".venv-lerobot-*" / "bin" / "python")))
    given = os.environ.get("SHMLOADER_LEROBOT_PYTHON")
    for exe in ([given] if given else []) + found:
        if exe and os.path.exists(exe):
            return exe
    return None


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return v3.write(str(tmp_path_factory.mktemp("lerobot") / "ds"))


def epoch(source, stats: dict | None = None, **kw) -> dict[str, np.ndarray]:
    """One shuffled epoch through the loader (2 workers), the samples put back in order (of their
    ``index``, the order of the data's rows here); ``stats``: filled with the loader's."""
    with shmloader.Loader(source, batch_size=4, workers=2, shuffle=True, seed=5, **kw) as loader:
        batches = [{k: v.copy() for k, v in b.items()} for b in loader]
        if stats is not None:
            stats.update(loader.stats())
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    order = np.argsort(got["index"])
    assert len(order) == len(source) and (np.diff(got["index"][order]) > 0).all()  # every sample once
    return {k: v[order] for k, v in got.items()}


def expected_frames(camera: str, rows: np.ndarray) -> np.ndarray:
    """The frame of ``camera``'s file each of ``rows`` (timestep rows) shows."""
    first = v3.first_frames(camera)
    starts = np.concatenate([[0], np.cumsum(v3.LENGTHS)])
    episode = np.searchsorted(starts, rows, side="right") - 1
    return np.array([first[e] for e in episode]) + rows - starts[episode]


def test_every_timestep_once_an_epoch_each_camera_at_its_time(written):
    ds = lerobot.dataset(written)
    assert len(ds) == sum(v3.LENGTHS) and ds.cameras == list(v3.CAMERAS) and ds.tasks == list(v3.TASKS)
    got = epoch(ds)
    rows = np.arange(len(ds))
    for camera, vid in v3.CAMERAS.items():
        assert got[camera].shape == (len(ds), *v3.SIZE, 3) and got[camera].dtype == np.uint8
        ids, frames = read_codes(got[camera])
        assert (ids == vid).all()
        assert np.array_equal(frames, expected_frames(camera, rows)), camera
    assert np.array_equal(got["observation.state"][:, 0], rows.astype(np.float32))
    assert np.array_equal(got["task_index"], got["episode_index"] % 2)
    assert got["timestamp"].dtype == np.float32 and got["timestamp"].shape == (len(ds),)


def test_windows_repeat_the_edge_and_mark_it_pad(written):
    """A history of frames and a chunk of actions that pass both edges of every episode."""
    fps = v3.FPS
    ds = lerobot.dataset(written, delta_timestamps={v3.FRONT: [-2 / fps, -1 / fps, 0.0],
                                                    "action": [0.0, 1 / fps, 2 / fps, 3 / fps]})
    spec = ds.spec()
    assert spec[v3.FRONT][0] == (3, *v3.SIZE, 3) and spec["action"][0] == (4, 3)
    assert spec[f"{v3.FRONT}_is_pad"][0] == (3,) and v3.WRIST + "_is_pad" not in spec
    got = epoch(ds)
    starts = np.concatenate([[0], np.cumsum(v3.LENGTHS)])
    rows = np.arange(len(ds))
    episode = np.searchsorted(starts, rows, side="right") - 1
    lo, hi = starts[episode][:, None], starts[episode + 1][:, None] - 1
    for key, offsets in ((v3.FRONT, np.array([-2, -1, 0])), ("action", np.arange(4))):
        want = rows[:, None] + offsets
        assert np.array_equal(got[f"{key}_is_pad"], (want < lo) | (want > hi)), key
        clamped = np.clip(want, lo, hi)
        if key == "action":
            assert np.array_equal(got["action"][..., 0], -clamped.astype(np.float32))
        else:
            _, frames = read_codes(got[key])
            assert np.array_equal(frames, expected_frames(key, clamped.ravel()).reshape(clamped.shape))
    _, frames = read_codes(got[v3.WRIST])  # no window: one frame
    assert np.array_equal(frames, expected_frames(v3.WRIST, rows))


def test_chosen_episodes_alone(written):
    ds = lerobot.dataset(written, episodes=[3, 1])
    assert ds.episodes == [1, 3] and len(ds) == v3.LENGTHS[1] + v3.LENGTHS[3]
    batch = ds.read(range(len(ds)))
    assert sorted(set(batch["episode_index"].tolist())) == [1, 3]
    _, frames = read_codes(batch[v3.FRONT])
    assert np.array_equal(frames, expected_frames(v3.FRONT, batch["index"]))


def test_an_episodes_stretch_is_one_group_per_run_of_timesteps(written):
    ds = lerobot.dataset(written, stretch=4)
    ids = ds.group_ids()
    starts = np.concatenate([[0], np.cumsum(v3.LENGTHS)])
    want = np.concatenate([np.arange(n) // 4 for n in v3.LENGTHS])
    offsets = np.cumsum([0] + [-(-n // 4) for n in v3.LENGTHS[:-1]])
    assert np.array_equal(ids, want + np.repeat(offsets, v3.LENGTHS))
    assert all(len(set(np.searchsorted(starts, np.flatnonzero(ids == g), side="right"))) == 1 for g in set(ids))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_group_is_decoded_in_one_pass_per_file(written, seed):
    """Each episode one group (``stretch`` >= its length): one decode per episode and camera over the
    shuffled epoch, whatever the window asks of it, and each of its frames decoded once."""
    fps = v3.FPS
    ds = lerobot.dataset(written, stretch=max(v3.LENGTHS), delta_timestamps={v3.FRONT: [-2 / fps, -1 / fps, 0.0]})
    with shmloader.Loader(ds, batch_size=4, workers=2, shuffle=True, seed=seed) as loader:
        assert sum(len(b["index"]) for b in loader) == len(ds)
        stats = loader.stats()
    assert stats["pyav"] + stats["decord"] == len(v3.LENGTHS) * len(v3.CAMERAS)
    assert stats["frames_delivered"] == 4 * len(ds)
    assert stats["frames_decoded"] - stats["frames_lead"] == 2 * len(ds)


def test_the_order_is_the_seeds_for_any_worker_count_and_a_resume_goes_on_exactly(written):
    """The shuffled order of an epoch is the seed's, whatever the workers; a loader resumed from
    ``state()`` mid-epoch delivers the batches the uninterrupted run delivered after that point."""
    ds = lerobot.dataset(written, delta_timestamps={"action": [0.0, 0.04]}, stretch=4)

    def batches(workers, state=None, take=None):
        with shmloader.Loader(ds, batch_size=3, workers=workers, shuffle=True, seed=9, epochs=2,
                              state=state) as loader:
            out = []
            for b in loader:
                out.append({k: v.copy() for k, v in b.items()})
                if take is not None and len(out) == take:
                    return out, loader.state()
            return out, None

    one, _ = batches(1)
    two, _ = batches(2)
    assert len(one) == len(two) == 2 * -(-len(ds) // 3)
    for a, b in zip(one, two):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(np.concatenate([b["index"] for b in one[: len(one) // 2]]).tolist()) == list(range(len(ds)))
    head, state = batches(2, take=7)
    rest, _ = batches(2, state=state)
    for a, b in zip(head + rest, two):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert len(head) + len(rest) == len(two)


def test_a_frame_outside_tolerance_is_refused_naming_file_episode_and_time(tmp_path):
    root = v3.write(str(tmp_path / "ds"), shift={2: 0.4 / v3.FPS})
    ds = lerobot.dataset(root)
    with pytest.raises(LoaderError) as caught:
        epoch(ds)
    message = str(caught.value)
    assert "file-001.mp4" in message and "episode 2" in message and "tolerance_s=0.0001" in message
    assert "0.016000" in message  # where it was asked: from_timestamp 0.016 + timestamp 0
    with shmloader.Loader(ds, batch_size=4, workers=2, on_error="skip") as loader:
        kept = np.concatenate([b["episode_index"].copy() for b in loader])
    assert sorted(set(kept.tolist())) == [0, 1, 3] and len(kept) == len(ds) - v3.LENGTHS[2]
    assert len(lerobot.dataset(root, tolerance_s=0.5 / v3.FPS).read(range(len(ds)))["index"]) == len(ds)


def test_bad_arguments_are_named(written):
    with pytest.raises(ValueError, match="not multiples of 1/25"):
        lerobot.dataset(written, delta_timestamps={"action": [0.01]})
    with pytest.raises(ValueError, match="'observation.missing'"):
        lerobot.dataset(written, delta_timestamps={"observation.missing": [0.0]})
    with pytest.raises(ValueError, match="no episode 9"):
        lerobot.dataset(written, episodes=[9])
    with pytest.raises(FileNotFoundError, match="meta/info.json"):
        lerobot.dataset(os.path.dirname(written))
    with pytest.raises(ValueError, match="on_error must be one of 'raise', 'skip'"):
        lerobot.dataset(written, on_error="ignore")


def test_a_missing_video_file_is_named_when_the_dataset_is_built_or_its_episodes_left_out(tmp_path):
    """Not at the first sample, in the workers (one warning per sample with Loader(on_error="skip")):
    the file, the episodes that use it and what they hold, at once; on_error="skip" leaves those
    episodes out with one warning and lists them in ``skipped``."""
    root = v3.write(str(tmp_path / "ds"))
    gone = f"videos/{v3.FRONT}/chunk-000/file-001.mp4"
    os.remove(os.path.join(root, gone))
    with pytest.raises(FileNotFoundError) as caught:
        lerobot.dataset(root)
    message = str(caught.value)
    assert f"{root!r}: 1 of the 3 video files the episodes name is missing: {gone} (episodes 2-3)" in message
    assert "2 of 4 (15 of 30 timesteps)" in message and "on_error='skip'" in message and "\n" not in message
    assert lerobot.dataset(root, episodes=[0, 1]).skipped == []  # the chosen episodes do not use it
    with pytest.raises(FileNotFoundError, match=r"\(episode 2\); the episodes that use it: 1 of 2 \(11 of 17 timesteps\)"):
        lerobot.dataset(root, episodes=[1, 2])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = lerobot.dataset(root, on_error="skip")
    assert len(said) == 1 and said[0].filename == __file__, [str(w.message) for w in said]
    assert gone in str(said[0].message) and "2 of 4 (15 of 30 timesteps); left out" in str(said[0].message)
    assert ds.episodes == [0, 1] and len(ds) == sum(v3.LENGTHS[:2])
    assert ds.skipped == [(2, os.path.join(root, gone)), (3, os.path.join(root, gone))]
    stats: dict = {}
    got = epoch(ds, stats)
    assert stats["skipped"] == 0 and np.array_equal(got["index"], np.arange(len(ds)))
    _, frames = read_codes(got[v3.FRONT])
    assert np.array_equal(frames, expected_frames(v3.FRONT, got["index"]))
    os.remove(os.path.join(root, "videos", v3.WRIST, "chunk-000", "file-000.mp4"))  # every episode uses it
    with pytest.raises(FileNotFoundError, match="4 of 4 .30 of 30 timesteps., every one: nothing is left"):
        lerobot.dataset(root, on_error="skip")


def test_many_missing_video_files_are_named_at_once_the_first_few_and_the_rest_counted(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = v3.write(str(tmp_path / "ds"))
    path = os.path.join(root, "meta", "episodes", "chunk-000", "file-000.parquet")
    table = pq.read_table(path)
    for camera, first in ((v3.FRONT, 0), (v3.WRIST, 4)):  # a file per episode and camera
        column = f"videos/{camera}/file_index"
        table = table.set_column(table.column_names.index(column), column, pa.array(range(first, first + 4), pa.int64()))
    pq.write_table(table, path)
    shutil.rmtree(os.path.join(root, "videos"))
    with pytest.raises(FileNotFoundError) as caught:
        lerobot.dataset(root, on_error="skip")
    message = str(caught.value)
    assert "8 of the 8 video files the episodes name are missing: " in message
    assert f"{v3.FRONT}/chunk-000/file-000.mp4 (episode 0), " in message and f"{v3.FRONT}/chunk-000/file-003.mp4" in message
    assert ", and 4 more; the episodes that use them: 4 of 4 (30 of 30 timesteps)" in message
    assert v3.WRIST not in message


@pytest.fixture(scope="module")
def by_lerobot(tmp_path_factory):
    """Datasets LeRobot's writer made (H.264 and its default AV1) and its items, saved by a
    Python with lerobot (``_lerobot_reference``)."""
    exe = lerobot_python()
    if exe is None:
        pytest.skip("no Python with lerobot: make test-lerobot builds .venv-lerobot-3.12 (tests/lanes.py), or set "
                    "SHMLOADER_LEROBOT_PYTHON")
    folder = tmp_path_factory.mktemp("by-lerobot")
    done = subprocess.run([exe, str(Path(reference.__file__)), str(folder), "h264", "libsvtav1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.parametrize("codec", ["h264", "libsvtav1"])
@pytest.mark.parametrize("case", sorted(reference.CASES))
def test_items_equal_lerobots_own(by_lerobot, codec, case):
    """Every key LeRobotDataset[i] has (``task`` as ``tasks[task_index]``), tabular values and pads
    equal; frames equal to the pixel, and as LeRobot's float form (``x / 255``, channels first)."""
    windows, episodes = reference.CASES[case]
    theirs = np.load(by_lerobot / f"{codec}.npz")
    ds = lerobot.dataset(by_lerobot / codec, delta_timestamps=windows or None, episodes=episodes)
    ours = epoch(ds)
    keys = {k.split("|", 1)[1] for k in theirs.files if k.startswith(case + "|")}
    assert keys == set(ours) | {"task"}
    assert [ds.tasks[t] for t in ours["task_index"]] == theirs[f"{case}|task"].tolist()
    for key, value in ours.items():
        ref = theirs[f"{case}|{key}"]
        if key in reference.CAMERAS:
            as_lerobot = np.moveaxis(value, -1, -3).astype(np.float32) / np.float32(255)
            assert np.array_equal(as_lerobot, ref), f"{key}: mean |diff| {np.abs(as_lerobot - ref).mean() * 255}"
        else:
            assert value.dtype == ref.dtype and np.array_equal(value, ref), key
