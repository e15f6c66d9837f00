"""stats() and stats_line() on real video: the verdict matches what the workers did, and the
frames the workers decode per delivered frame are counted from the keyframes (issue #36)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import shmloader
import shmloader._loader
from shmloader._diagnosis import grouped_decode_estimate
from shmloader.samples import make_videos
from shmloader.video.measuring import decode_cost

pytestmark = pytest.mark.timeout(180)

GOP = 24


@pytest.fixture(scope="module")
def gop_videos(tmp_path_factory):
    """8 videos of 96 frames, a keyframe every GOP frames exactly (0, 24, 48, 72)."""
    return make_videos(tmp_path_factory.mktemp("gop"), count=8, frames=96, size=(64, 64), gop=GOP)


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(shmloader._loader, "usable_cpus", lambda: 2)


def test_decode_cost_seeks_to_the_keyframe_before_each_jump():
    keyframes = np.array([0, 50, 100])
    assert decode_cost(np.arange(60, 76, 2), keyframes) == (25, 10)  # 50..74
    # Two clips in one pass: 0..12, then a seek to 100 (past what was decoded), 100..112.
    assert decode_cost(np.array([10, 12, 110, 112]), keyframes) == (13 + 13, 10)
    # Within one GOP the decoder goes on rather than seek back.
    assert decode_cost(np.array([55, 58, 70]), keyframes) == (21, 5)


def test_quickstart_verdict_counts_start_up_apart(two_cpus, tmp_path):
    """The README's quickstart with a consumer that does nothing: input-bound, and the workers
    were busy all along (their start-up and imports are not idle time, nor decoding); with
    every CPU decoding, the advice is to decode less, not the worker count already in use."""
    paths, labels = make_videos(tmp_path / "videos")
    clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=6) as loader:
        for batch in loader:
            pass
        s = loader.stats()
        line = loader.stats_line()
    assert s["input_bound"], line
    # Counted from each worker's start, its ~0.5-1 s of start-up made both workers look 30-50 %
    # busy in a run this short. Each worker gets its share of the tasks up front: the one that
    # finishes first idles until the other is done, but the last one is busy to the end.
    assert max(s["worker_busy_fraction"]) > 0.75, line
    assert "recommended workers" not in line, line
    assert "all 2 CPUs decode already" in line and "group_clips=True" in line, line
    assert s["frames_delivered"] == 8 * 6 * 8 and s["decoded_per_frame"] > 1


def test_frames_decoded_follow_the_keyframes_of_each_clip(gop_videos, two_cpus):
    paths, labels = gop_videos
    clip_len = 6
    clips = shmloader.VideoClips(paths, labels, clip_len=clip_len, frame_step=1, size=(64, 64))
    expected = 0
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=3) as loader:
        for batch in loader:
            for start in batch["start"].tolist():  # one clip per video in a batch: a pass each
                expected += start % GOP + clip_len  # from its keyframe on, across the next one too
        s = loader.stats()
    assert s["frames_delivered"] == 3 * 8 * clip_len
    assert s["frames_decoded"] == expected
    assert s["frames_lead"] == expected - s["frames_delivered"] == s["frames_head"]


def test_grouping_decodes_fewer_frames_per_delivered_frame_as_estimated(gop_videos, two_cpus):
    paths, labels = gop_videos
    per = {}
    for k in (1, 4):
        clips = shmloader.VideoClips(paths, labels, clip_len=4, frame_step=2, size=(64, 64),
                                     clips_per_video=k, group_clips=k > 1)
        with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=2) as loader:
            for _ in loader:
                pass
            per[k] = loader.stats()
    one, grouped = per[1], per[4]
    estimate = grouped_decode_estimate(one, 4)
    assert grouped["decoded_per_frame"] < one["decoded_per_frame"]
    assert estimate is not None and estimate < one["decoded_per_frame"]


def test_one_clip_per_sample_over_long_gops_is_told_to_prepare(two_cpus, tmp_path):
    """Every CPU decoding and one keyframe in 96 frames: a clip of 8 every 2nd frame decodes from
    frame 0 (~7 frames per delivered frame), and the line names `shmloader prepare` beside grouped
    decode. Short GOPs get grouped decode alone: a keyframe every 4 frames, ~2 per delivered
    frame; every 16 (a prepared copy's), ~4 for clips of 16 every 4th frame: the frames between a
    clip's own, which a copy decodes too, not those before its first."""
    cases = {"long": (96, 8, 2), "short": (4, 8, 2), "sparse": (16, 16, 4)}  # gop, clip_len, frame_step
    lines, per = {}, {}
    for name, (gop, clip_len, step) in cases.items():
        paths, labels = make_videos(tmp_path / f"gop{gop}", count=4, frames=96, size=(64, 64), gop=gop)
        clips = shmloader.VideoClips(paths, labels, clip_len=clip_len, frame_step=step, size=(64, 64))
        with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=12) as loader:
            for _ in loader:
                pass
            s, lines[name] = loader.stats(), loader.stats_line()
        assert s["input_bound"], lines[name]
        assert "all 2 CPUs decode already" in lines[name] and "group_clips=True" in lines[name], lines[name]
        per[name] = s["decoded_per_frame"]
    assert per["long"] >= 3 > per["short"] and per["sparse"] >= 3, per
    assert "shmloader prepare SRC... --out DST --short-side 128 --gop 16" in lines["long"], lines["long"]
    assert "keyframe every 16 frames" in lines["long"]
    assert "prepare" not in lines["short"] and "prepare" not in lines["sparse"], lines


def test_grouped_decode_is_not_told_to_prepare(gop_videos, two_cpus):
    """Grouped decode shares each keyframe's lead-in: the line leaves prepare out (see 'When not to
    prepare' in the guide), however many frames it decodes."""
    paths, labels = gop_videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, frame_step=8, size=(64, 64), clips_per_video=4,
                                 group_clips=True)
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=2) as loader:
        for _ in loader:
            pass
        s, line = loader.stats(), loader.stats_line()
    assert s["decoded_per_frame"] >= 3 and "all 2 CPUs decode already" in line, line
    assert "prepare" not in line, line


def test_a_short_run_says_it_is_too_short_to_judge(two_cpus, tmp_path):
    """getting-started's first loader: 2 batches. Inside the block its line read "input-bound 40%",
    after it "compute-bound: consumer waited 1% ... recommended workers: 2" (the clock ran on, the
    pool was emptied): a run that short is the ring filling, and the line says so, the same after
    close as inside the block."""
    paths, labels = make_videos(tmp_path / "videos")
    clips = shmloader.VideoClips(paths, labels, clip_len=16, frame_step=2, size=(112, 112))
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, seed=0) as loader:
        for _ in loader:
            pass
        inside = loader.stats_line()
    after = loader.stats_line()
    for line in (inside, after):
        assert line.startswith("too short to judge: 2 batches (8 samples) in "), line
        assert "bound" not in line and "recommended" not in line, line
    seconds = re.compile(r"in [0-9.]+ s")  # inside was asked a moment before close
    assert seconds.sub("", after) == seconds.sub("", inside), (inside, after)


def test_stats_after_close_are_the_runs(two_cpus, tmp_path):
    """close() stops the clock: the line and the shares after it are the run's, whenever asked,
    with its workers (the pool is empty by then: the line had read "workers busy -")."""
    import time

    paths, labels = make_videos(tmp_path / "videos")
    clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=6) as loader:
        for _ in loader:
            pass
        inside = loader.stats()
    after = loader.stats_line()
    time.sleep(0.3)
    s = loader.stats()
    assert loader.stats_line() == after and s["workers"] == 2 and len(s["worker_busy_fraction"]) == 2, after
    assert s["input_bound"] == inside["input_bound"] and "workers busy -" not in after, after
    assert s["elapsed_s"] - inside["elapsed_s"] < 0.25  # the close, not the sleep after it


def test_a_scan_manifest_run_counts_frames_and_is_told_to_prepare(two_cpus, tmp_path):
    """A loader over `shmloader scan`'s manifest (the route scan recommends) had no keyframes to
    count from: `decoded_per_frame` None, and the line never named prepare. Its passes decode
    from the keyframes decord's index gives, or from frame 0 where PyAV reads without any."""
    import subprocess
    import sys

    make_videos(tmp_path / "long", count=4, frames=96, size=(64, 64), gop=96)
    subprocess.run([sys.executable, "-m", "shmloader", "scan", str(tmp_path / "long"), "--out",
                    str(tmp_path / "m.csv"), "--quiet", "--workers", "1"], check=True, timeout=120)
    for decoder in ("auto", "decord"):
        clips = shmloader.VideoClips.from_csv(str(tmp_path / "m.csv"), clip_len=8, frame_step=2, size=(64, 64),
                                              decoder=decoder)
        with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=12) as loader:
            for _ in loader:
                pass
            s, line = loader.stats(), loader.stats_line()
        assert s["decoded_per_frame"] is not None and s["decoded_per_frame"] >= 3, (decoder, line)
        assert "shmloader prepare SRC... --out DST" in line, (decoder, line)
