"""Frames are exact: every clip equals decord's own decode of the frames it claims to be."""

from __future__ import annotations

import decord
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import read_codes

from ._variants import reference as libav_reference
from .conftest import FRAMES, SIZE


def collect(loader):
    out = []
    for b in loader:
        out.extend({k: np.array(v[i]) for k, v in b.items()} for i in range(len(b["index"])))
    return out


def reference(path, frames, size):
    if size is None:
        vr = decord.VideoReader(path)
    else:
        vr = decord.VideoReader(path, height=size[0], width=size[1])
    return vr.get_batch(frames).asnumpy()


@pytest.mark.parametrize("decoder", ["auto", "pyav", "decord"])
@pytest.mark.parametrize("size, frame_step", [((112, 112), 1), ((112, 112), 3), (None, 1), (None, 2), ((30, 40), 2)])
def test_frames_equal_decord(videos, size, frame_step, decoder):
    """Both decoders give decord's own pixels where decord reads a file right (auto gives the
    H.264 files to PyAV, the MPEG-4 ones to decord)."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=5, frame_step=frame_step, size=size, decoder=decoder)
    with shmloader.Loader(clips, batch_size=3, workers=2, shuffle=True, seed=1) as loader:
        samples = collect(loader)
    assert len(samples) == len(paths)
    for s in samples:
        v = int(s["index"])
        frames = [int(s["start"]) + k * frame_step for k in range(5)]
        assert frames[-1] < FRAMES
        np.testing.assert_array_equal(s["video"], reference(paths[v], frames, size))
        assert s["label"] == labels[v]
        ids, numbers = read_codes(s["video"])
        assert (ids == v).all() and list(numbers) == frames
    h, w = size or SIZE
    assert samples[0]["video"].shape == (5, h, w, 3)


def decord_can_produce(path, size) -> bool:
    """Whether decord copies frames of ``size`` out on this CPU (it depends on its SIMD)."""
    try:
        decord.VideoReader(path, height=size[0], width=size[1]).get_batch([0])
        return True
    except decord.DECORDError:
        return False


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
@pytest.mark.parametrize("width", [32, 96])
def test_any_width_is_delivered(videos, width, decoder):
    """Widths decord cannot copy out on some CPUs (32 and 96 on AVX-512 ones): the loader
    delivers them; equal to decord's own frames where decord produces them, else to the
    libavformat reference. decoder="pyav" runs the path decord's refusal leads to, everywhere."""
    paths, _ = videos
    size = (32, width)
    clips = shmloader.VideoClips(paths, clip_len=4, frame_step=2, size=size, sampling="center", decoder=decoder)
    with shmloader.Loader(clips, batch_size=4, workers=2) as loader:
        samples = collect(loader)
    assert len(samples) == len(paths)
    for s in samples:
        path = paths[int(s["index"])]
        assert s["video"].shape == (4, *size, 3) and s["video"].dtype == np.uint8
        ids, numbers = read_codes(s["video"])
        assert (ids == s["index"]).all()
        assert list(numbers) == [int(s["start"]) + 2 * k for k in range(4)] == list(s["frames"])
        if decord_can_produce(path, size):
            np.testing.assert_array_equal(s["video"], reference(path, list(numbers), size))
        else:
            ref = libav_reference(path, size)[list(numbers)]
            assert np.abs(s["video"].astype(np.int16) - ref).max() <= 4


def test_sampling_positions(videos):
    paths, _ = videos
    span = (8 - 1) * 2 + 1
    last = FRAMES - span
    clips = shmloader.VideoClips(paths[:2], clip_len=8, frame_step=2, clips_per_video=3, sampling="uniform",
                                 size=(64, 64))
    with shmloader.Loader(clips, batch_size=6, workers=2) as loader:
        starts = [(int(s["index"]), int(s["start"])) for s in collect(loader)]
    assert sorted(starts) == sorted((v, round(c * last / 2)) for v in range(2) for c in range(3))
    center = shmloader.VideoClips(paths[:2], clip_len=8, frame_step=2, sampling="center", size=(64, 64))
    with shmloader.Loader(center, batch_size=2, workers=1) as loader:
        assert {int(s["start"]) for s in collect(loader)} == {last // 2}


def test_random_starts_change_across_epochs_and_repeat_with_seed(videos):
    paths, _ = videos

    def starts(seed):
        clips = shmloader.VideoClips(paths, clip_len=4, size=(64, 64))
        with shmloader.Loader(clips, batch_size=4, workers=2, seed=seed, epochs=2) as loader:
            s = collect(loader)
        return [(int(x["index"]), int(x["start"])) for x in s]

    a, b = starts(5), starts(5)
    assert a == b
    first, second = a[: len(paths)], a[len(paths):]
    assert first != second  # reseeded each epoch
    assert starts(6) != a
