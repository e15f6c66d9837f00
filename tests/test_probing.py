"""Planning many videos (``video.probing``): from a ``shmloader scan`` manifest without opening a
video, probes in processes, probes kept by one run and reused by the next while a file is
unchanged; a file that cannot be probed is a row under ``on_error``, never a stop."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

import shmloader
from shmloader import qwen
from shmloader.samples import write_video
from shmloader.video.probing import probe_rows
from shmloader.video.storage import Storage

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probing")
    for i, (frames, size) in enumerate([(30, (96, 128)), (45, (128, 96)), (60, (72, 128))]):
        write_video(folder / f"v{i}.mp4", i, frames=frames, size=size)
    cut = folder / "cut.mp4"
    cut.write_bytes((folder / "v1.mp4").read_bytes()[:2000])
    return folder


def _paths(folder) -> list[str]:
    return [str(folder / f"v{i}.mp4") for i in range(3)]


def _plans(src) -> list[tuple]:
    return [(p.size, p.indices.tolist(), p.cost) for p in src.plans()]


def test_a_scan_manifest_plans_every_video_without_opening_one(folder, tmp_path):
    manifest = tmp_path / "scan.csv"
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", str(folder), "--out", str(manifest), "--workers", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    probed = qwen.clips(_paths(folder))
    with pytest.raises(ValueError, match=r"cut\.mp4: the manifest has no probe of it"):
        qwen.from_manifest(manifest)
    with pytest.warns(UserWarning, match="1 of 4 videos left out"):
        planned = qwen.from_manifest(manifest, on_error="skip")
    assert sorted(planned.paths) == sorted(probed.paths)
    mine = dict(zip(planned.paths, _plans(planned)))
    assert [mine[p] for p in probed.paths] == _plans(probed)  # the same frames, sizes and tokens
    # planned from the rows alone: a file gone since the scan does not stop the plan...
    gone = tmp_path / "gone"
    gone.mkdir()
    moved = gone / "v0.mp4"
    os.link(folder / "v0.mp4", moved)
    rows = list(csv.DictReader(open(manifest)))
    rows = [{**row, "path": str(moved)} if row["path"].endswith("v0.mp4") else row for row in rows
            if not row["path"].endswith("cut.mp4")]
    with open(tmp_path / "moved.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    moved.unlink()
    src = qwen.from_manifest(tmp_path / "moved.csv")
    assert len(src) == 3
    # ...the worker that reads it names it, and skips it where asked
    with shmloader.Loader(src, batch_size=1, workers=1, on_error="skip") as loader:
        got = [int(b["index"][0]) for b in loader]
        assert sorted(got) == [1, 2] and "v0.mp4" in str(loader.skipped[0])


def test_kept_probes_are_reused_while_their_file_is_unchanged(folder, tmp_path):
    paths = [*_paths(folder), str(folder / "cut.mp4")]
    kept = tmp_path / "probes.csv"
    with pytest.warns(UserWarning, match="1 of 4 videos left out"):
        first = qwen.clips(paths, on_error="skip", probes=kept)
    rows = {row["path"]: row for row in csv.DictReader(open(kept))}
    assert sorted(rows) == sorted(paths[:3])  # a file that could not be probed is tried again next time
    assert [int(rows[p]["frames"]) for p in paths[:3]] == [30, 45, 60]
    # a kept row is used as it is: one saying 12 frames plans 12 (no probe read the file again)
    rows[paths[0]]["frames"] = "12"
    with open(kept, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(next(iter(rows.values()))))
        w.writeheader()
        w.writerows(rows.values())
    with pytest.warns(UserWarning, match="1 of 4 videos left out"):
        again = qwen.clips(paths, on_error="skip", probes=kept)
    assert again.plans()[0].indices.max() <= 11 < first.plans()[0].indices.max()
    # a file changed since is probed again
    copy = tmp_path / "v.mp4"
    write_video(copy, 7, frames=30, size=(96, 128))
    qwen.clips([str(copy)], probes=kept)
    write_video(copy, 7, frames=90, size=(96, 128))
    assert qwen.clips([str(copy)], probes=kept).plans()[0].indices.max() > 30
    assert "90" in {row["frames"] for row in csv.DictReader(open(kept)) if row["path"] == str(copy)}


def test_many_local_files_are_probed_in_processes_as_in_threads(folder, tmp_path):
    paths = []
    for i in range(40):  # links: as many files to probe, written once
        p = tmp_path / f"l{i}.mp4"
        os.link(folder / f"v{i % 3}.mp4", p)
        paths.append(str(p))
    paths.append(str(folder / "cut.mp4"))
    storage = Storage()
    in_processes = probe_rows(paths, storage, processes=2)
    in_threads = probe_rows(paths, storage, processes=1)
    assert in_processes == in_threads
    assert [r[0] for r in in_processes[:3]] == [30, 45, 60] and isinstance(in_processes[-1], str)
    assert np.all([not isinstance(r, str) for r in in_processes[:-1]])
