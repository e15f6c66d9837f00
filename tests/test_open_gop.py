"""Open GOPs, read exactly with the default decoder choice.

An open GOP starts at a keyframe that is not an IDR/IRAP refresh: B-frames decoded after it are
shown before it (leading pictures) and reference the GOP before. x264's ``open-gop=1`` writes
them; x265 with fixed B-frames (``b-adapt=0``) puts RASL pictures before each CRA. decord2 3.4.0
counts a keyframe's place by packets in decode order, so at a keyframe with leading pictures its
seek lands one frame late in MP4 (frame 45 for 44) and at frame 0 in MKV (measured on these
files): the loader with ``decoder="auto"`` must still deliver, bit for bit, what a sequential
decode shows, for clips that start in a keyframe's leading pictures, at the keyframe and after.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import shmloader
from shmloader.video import probe as probe_module
from shmloader.video.probe import probe
from shmloader.video.pyav import PyAV

from .test_skipping import _X264, _X265, FRAMES, GOP, mismatches, sequential, write

pytestmark = pytest.mark.timeout(240)

CLIP = 4

# name: (extension, codec, options)
OPEN_GOPS = {
    "mkv_h264": ("mkv", "libx264", {**_X264, "x264-params": "open-gop=1"}),
    "mp4_h264": ("mp4", "libx264", {**_X264, "x264-params": "open-gop=1"}),
    "mkv_hevc": ("mkv", "libx265", {"x265-params": _X265 + ":b-adapt=0:open-gop=1"}),
    "mp4_hevc": ("mp4", "libx265", {"x265-params": _X265 + ":b-adapt=0:open-gop=1"}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("open_gop")
    made = {name: write(os.path.join(folder, f"{name}.{ext}"), codec, options)
            for name, (ext, codec, options) in OPEN_GOPS.items()}
    made["mkv_h264_closed"] = write(os.path.join(folder, "closed.mkv"), "libx264", _X264)
    return made


def leading(path: str) -> list[int]:
    """Keyframes with leading pictures: a frame shown before the keyframe, decoded after it."""
    info = probe(path)
    dp = info.decode_pos
    before = np.maximum.accumulate(dp)
    return [int(k) for k in info.keyframes if k > 0 and before[k - 1] > dp[k]]


@pytest.mark.parametrize("name", sorted(OPEN_GOPS))
def test_the_files_have_leading_pictures(files, name):
    assert leading(files[name]) == [GOP]
    assert leading(files["mkv_h264_closed"]) == []


@pytest.mark.parametrize("name", sorted(OPEN_GOPS))
def test_the_default_decoder_delivers_every_clip_start_exactly(files, name):
    """decoder="auto", a clip from every start (the leading pictures' and the keyframe's
    among them), through real workers: the sequential decode's frames, bit for bit."""
    path = files[name]
    starts = FRAMES - CLIP + 1
    clips = shmloader.VideoClips([path], clip_len=CLIP, sampling="uniform", clips_per_video=starts)
    assert clips.reading.decoder == "auto"
    ref, seen, wrong = sequential(path), set(), []
    # One clip a batch: a worker decodes a batch's clips of one video in one call over their union.
    with shmloader.Loader(clips, batch_size=1, workers=2, seed=1, timeout=60) as loader:
        for b in loader:
            for i in range(len(b["index"])):
                frames = np.asarray(b["frames"][i])
                seen.add(int(frames[0]))
                if not np.array_equal(b["video"][i], ref[frames]):
                    diff = np.abs(b["video"][i].astype(np.int16) - ref[frames]).mean(axis=(1, 2, 3))
                    wrong.append((frames.tolist(), diff.round(1).tolist()))
    assert {GOP - 1, GOP, GOP + 1} <= seen
    assert wrong == [], wrong


@pytest.mark.parametrize("name", sorted(OPEN_GOPS))
def test_pyav_seeks_exactly_into_an_open_gop(files, name):
    """PyAV decodes a clip that starts in a keyframe's leading pictures from the keyframe before."""
    assert mismatches(PyAV(1), files[name]) == []


def test_an_open_gop_is_read_by_pyav_and_a_closed_one_by_decord(files, monkeypatch):
    # The open GOP is the reason: not the speed rule that gives these H.264 files to PyAV anyway
    monkeypatch.setattr(probe_module, "_FASTER", frozenset())
    assert probe(files["mkv_h264"]).decoder == probe(files["mp4_h264"]).decoder == "pyav"
    assert probe(files["mkv_h264_closed"]).decoder == "decord"
