"""A dataset's reader (``VideoClips.reader()``): sample ids in, the batch's arrays out, in any
process, without a loader, its ring or its shared tables; the same clips the loader delivers."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmloader
from shmloader.video.identity import digest
from shmloader.video.samples import read_codes

pytestmark = pytest.mark.timeout(180)


def test_read_gives_the_batch_fields_with_the_frames_they_name(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, frame_step=2, clips_per_video=2, size=(32, 48))
    got = clips.reader().read([0, 3, 15])
    assert {k: (v.shape, v.dtype) for k, v in got.items()} == \
        {k: ((3, *shape), dtype) for k, (shape, dtype) in clips.spec().items()}
    assert list(got["index"]) == [0, 1, 7] and list(got["label"]) == [labels[0], labels[1], labels[7]]
    for video, index, frames, start in zip(got["video"], got["index"], got["frames"], got["start"]):
        ids, numbers = read_codes(video)
        assert (ids == index).all() and list(numbers) == list(frames) and start == frames[0]
        assert list(np.diff(frames)) == [2, 2, 2]


def test_read_draws_what_the_loader_delivers(videos):
    """Sample ``i`` of epoch ``e`` draws from ``(seed, e, i)`` in a reader as in a ring worker:
    the same clips, scales and crop windows."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, clips_per_sample=2, scale=(40, 56), crop=(32, 32),
                                 crop_at="random")
    with shmloader.Loader(clips, batch_size=3, workers=2, seed=7, epochs=2, shuffle=True, timeout=60) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    reader = clips.reader()
    seen = 0
    for epoch in range(2):
        rows = [(b, j) for b in batches[epoch * 3 : epoch * 3 + 3] for j in range(len(b["index"]))]
        assert len(rows) == len(clips)
        again = reader.read([int(b["index"][j]) for b, j in rows], seed=7, epoch=epoch)
        for n, (b, j) in enumerate(rows):
            for key in b:
                np.testing.assert_array_equal(again[key][n], b[key][j], err_msg=key)
            seen += 1
    assert seen == 2 * len(clips)


READ_ELSEWHERE = textwrap.dedent("""
    import json, sys
    import shmloader

    paths = json.loads(sys.argv[1])
    clips = shmloader.VideoClips(paths, clip_len=3, clips_per_video=2, sampling="uniform", size=(32, 32))
    got = clips.reader().read([1, 2, 5], seed=1)
    print(json.dumps({"frames": got["frames"].tolist(), "sum": int(got["video"].sum())}))
""")


def test_another_process_reads_the_same_samples(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=3, clips_per_video=2, sampling="uniform", size=(32, 32))
    here = clips.reader().read([1, 2, 5], seed=1)
    r = subprocess.run([sys.executable, "-c", READ_ELSEWHERE, json.dumps(paths)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    there = json.loads(r.stdout.splitlines()[-1])
    assert there == {"frames": here["frames"].tolist(), "sum": int(here["video"].sum())}


def test_read_refuses_a_sample_out_of_range(videos):
    clips = shmloader.VideoClips(videos[0], clip_len=4, size=(32, 32))
    with pytest.raises(IndexError, match="sample 8 is not among the 8 samples"):
        clips.reader().read([8])


def test_a_description_does_not_change_and_each_loader_runs_its_own(videos):
    """``VideoClips`` describes; what a loader runs (shared columns, shared probes) is the loader's
    own: two loaders over one description, one closed while the other still reads."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths[:4], labels[:4], clip_len=4, size=(32, 48))
    with pytest.raises(AttributeError, match="with_options"):
        clips.clip_len = 8
    with pytest.raises(ValueError, match="read-only"):
        clips.labels[0] = 5
    copy = pickle.loads(pickle.dumps(clips))  # by value, as a Ray task gets it
    assert copy.paths == clips.paths and copy.labels.tolist() == labels[:4]
    assert copy.fingerprint() == clips.fingerprint() and copy.with_options(clip_len=2).sampling.clip_len == 2
    # equal descriptions, equal digests, in any process (Ray's task workers key readers by it)
    assert digest(copy) == digest(clips) != digest(clips.with_options(clip_len=2))
    with pytest.raises(AttributeError):
        copy.sampling = "uniform"
    a = shmloader.Loader(clips, batch_size=2, workers=1)
    b = shmloader.Loader(copy, batch_size=2, workers=1)
    with a, b:
        first = [batch["label"].tolist() for batch in a]
        a.close()
        second = [batch["label"].tolist() for batch in b]
    assert first == second == [labels[:2], labels[2:4]]
