"""Sources beyond video files: arrays, HDF5, a user's reader function, folders and manifests."""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import psutil
import pytest

import shmloader
from shmloader.video.samples import read_codes

pytestmark = pytest.mark.timeout(60)


def test_array_source_rows_shared_not_copied_per_worker():
    x = np.random.default_rng(0).normal(size=(50, 3, 4)).astype(np.float32)
    y = np.arange(50)
    src = shmloader.ArraySource({"x": x, "y": y})
    assert src.spec() == {"x": ((3, 4), np.dtype(np.float32)), "y": ((), y.dtype)}
    with shmloader.Loader(src, batch_size=8, workers=2, shuffle=True) as loader:
        got = {int(i): b["x"][k].copy() for b in loader for k, i in enumerate(b["y"])}
    assert sorted(got) == list(range(50))
    for i, row in got.items():
        np.testing.assert_array_equal(row, x[i])


def segment_memory(pid: int, name: str) -> dict[str, int]:
    """Bytes of /proc/<pid>/smaps fields (Rss, Private_Dirty, ...) summed over the mappings of ``name``."""
    out: dict[str, int] = {}
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):  # a mapping's header line
                inside = name in line
            elif inside and len(parts) >= 3 and parts[2] == "kB":
                out[parts[0][:-1]] = out.get(parts[0][:-1], 0) + int(parts[1]) * 1024
    return out


def arrays_loader(rows: np.ndarray):
    return shmloader.Loader(shmloader.ArraySource({"row": rows}), batch_size=8, workers=2, epochs=2)


def own_memory(loader) -> list[int]:
    """Each worker's private memory outside the shared array segment: USS counts the segment's
    pages that only this worker has mapped (the rows of its batches), and those are no copy."""
    out = []
    for pid in loader.worker_pids():
        seg = segment_memory(pid, "memfd:shmloader-arrays")
        out.append(psutil.Process(pid).memory_full_info().uss - seg.get("Private_Clean", 0) - seg.get("Private_Dirty", 0))
    return out


# What a worker may hold of its own beyond a worker of an 8-row array: a batch in flight (2 MiB)
# and allocator noise (measured: 19 MiB against 19). A copy of an eighth of the 128 MiB array
# (16 MiB) would not fit.
_OWN_MARGIN = 8 << 20


def test_array_source_workers_map_one_shared_copy():
    """The workers read the rows of a 128 MiB array from the one shared segment, mapped by all:
    together they map the whole of it, and none holds more of its own than a worker of an
    8-row array does (a private copy of an eighth would show)."""
    rows = np.arange(128 * 2**20 // 8, dtype=np.int64).reshape(512, -1)  # 512 rows of 256 KiB
    with arrays_loader(rows[:8].copy()) as small:
        assert sum(len(b["row"]) for b in small) == 16
        baseline = max(own_memory(small))
    src = shmloader.ArraySource({"row": rows})
    segment = os.fstat(src.fd).st_ino

    def first_of(batch):
        return batch["row"][:, 0].tolist()

    with shmloader.Loader(src, batch_size=8, workers=2, epochs=2) as loader:
        firsts = [v for b in loader for v in first_of(b)]
        assert firsts == [int(r[0]) for r in rows] * 2
        mapped = 0
        for pid in loader.worker_pids():
            maps = [line.split() for line in open(f"/proc/{pid}/maps") if "memfd:shmloader-arrays" in line]
            assert maps and {int(m[4]) for m in maps} == {segment}  # the main process's segment
            mib = sum(int(m[1], 16) - int(m[0], 16) for m in (m[0].split("-") for m in maps)) / 2**20
            assert mib >= 128
            mapped += segment_memory(pid, "memfd:shmloader-arrays")["Rss"]
        assert mapped >= rows.nbytes  # every row was read through the mapping, by one worker or both
        for pid, own in zip(loader.worker_pids(), own_memory(loader)):
            assert own < baseline + _OWN_MARGIN, \
                f"worker {pid} holds {own / 2**20:.0f} MiB of its own, a worker of 8 rows {baseline / 2**20:.0f} MiB"


def test_array_source_rejects_ragged():
    with pytest.raises(ValueError, match="same number of rows"):
        shmloader.ArraySource({"a": np.zeros(3), "b": np.zeros(4)})


@pytest.fixture
def h5file(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["clips"] = np.arange(40 * 2 * 3, dtype=np.int16).reshape(40, 2, 3)
        f["meta/label"] = np.arange(40) % 5
    return path


def test_hdf5_source_reads_rows_in_workers(h5file):
    src = shmloader.HDF5Source(h5file, ["clips", "meta/label"])
    assert len(src) == 40 and src.spec()["clips"] == ((2, 3), np.dtype(np.int16))
    with shmloader.Loader(src, batch_size=6, workers=2, shuffle=True) as loader:
        rows = [(b["clips"][k].copy(), int(b["meta_label"][k])) for b in loader for k in range(len(b["clips"]))]
    assert len(rows) == 40
    for clip, label in rows:
        i = int(clip[0, 0]) // 6
        assert label == i % 5 and clip[1, 2] == i * 6 + 5


def test_function_source_runs_existing_reader_on_all_cores(h5file):
    """An existing partial-read function, unchanged, runs in both workers."""

    def read_row(index, rng):  # what a user already has: open, read one row, close
        with h5py.File(h5file, "r") as f:
            return {"clip": f["clips"][index], "pid": np.int64(os.getpid())}

    src = shmloader.FunctionSource(read_row, {"clip": ((2, 3), np.int16), "pid": ((), np.int64)}, 40)
    with shmloader.Loader(src, batch_size=4, workers=2) as loader:
        workers = set(loader.worker_pids())
        out = [(b["clip"][k, 0, 0], int(b["pid"][k])) for b in loader for k in range(len(b["pid"]))]
    assert [int(c) for c, _ in out] == [6 * i for i in range(40)]
    assert {p for _, p in out} == workers  # both processes did part of the work


def test_from_folder_labels_by_class(videos, tmp_path):
    paths, _ = videos
    for cls, idx in (("cats", [0, 1, 2]), ("dogs", [3, 4])):
        (tmp_path / cls).mkdir()
        for i in idx:
            shutil.copy(paths[i], tmp_path / cls / f"v{i}.mp4")
    (tmp_path / "dogs" / "notes.txt").write_text("not a video")
    clips = shmloader.VideoClips.from_folder(tmp_path, clip_len=4, size=(32, 40))
    assert clips.classes == ["cats", "dogs"] and len(clips) == 5
    with shmloader.Loader(clips, batch_size=5, workers=2) as loader:
        b = next(iter(loader))
        ids, _ = read_codes(b["video"])
        assert ids[:, 0].tolist() == [0, 1, 2, 3, 4] and b["label"].tolist() == [0, 0, 0, 1, 1]
        del b


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_from_manifest_resolves_relative_paths(videos, tmp_path, fmt, monkeypatch):
    paths, _ = videos
    (tmp_path / "clips").mkdir()
    rows = []
    for i in (4, 1, 6):
        shutil.copy(paths[i], tmp_path / "clips" / f"{i}.mp4")
        rows.append({"path": f"clips/{i}.mp4", "label": 10 + i})
    manifest = tmp_path / f"train.{fmt}"
    if fmt == "csv":
        manifest.write_text("path,label\n" + "".join(f"{r['path']},{r['label']}\n" for r in rows))
    else:
        manifest.write_text(json.dumps(rows))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the manifest, not to the working directory
    clips = shmloader.VideoClips.from_csv(manifest, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=3, workers=2) as loader:
        b = next(iter(loader))
        assert read_codes(b["video"])[0][:, 0].tolist() == [4, 1, 6]
        assert b["label"].tolist() == [14, 11, 16]
        del b


def test_manifest_bad_label_names_row(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\na.mp4,1\nb.mp4,cat\n")
    with pytest.raises(ValueError, match="row 3.*'cat'"):
        shmloader.VideoClips.from_csv(manifest, size=(32, 32))
