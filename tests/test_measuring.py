"""decoder="auto" measures which decoder reads a shape of file faster, in each worker, where both
read it exactly (NOTE [ Measuring the decoder ] in shmloader/video/measuring.py): the first reads
of a shape alternate the decoders, the choice comes after the said number and then sticks, the
frames delivered are the same whichever decoder read them, a file only PyAV may read is never
given to decord, and ``stats()`` reports each shape's choice and figures."""

from __future__ import annotations

import csv
import logging

import numpy as np
import pytest

import shmloader
from shmloader.video.measuring import TIMED, WARM, Cut, Measuring, shape_of
from shmloader.video.probe import probe
from shmloader.video.samples import write_video

from ._variants import _remux, codes, cut_start

pytestmark = pytest.mark.timeout(120)

PER_SHAPE = 2 * (WARM + TIMED)  # reads of a shape before its choice


def epochs_of(clips, epochs: int, **kw) -> tuple[list[dict[str, np.ndarray]], dict]:
    with shmloader.Loader(clips, batch_size=3, seed=4, epochs=epochs, timeout=60, **kw) as loader:
        got = [{k: np.array(v) for k, v in b.items()} for b in loader]
        return got, loader.stats()


def test_a_shape_is_chosen_after_the_said_reads_and_then_sticks(videos, caplog, capfd):
    """One worker, one shape (the six H.264 files, written alike), one clip a read: the first
    ``PER_SHAPE`` reads alternate the decoders (the rule's first), the rest go to the one chosen."""
    paths = videos[0][:6]
    info = probe(paths[0])
    assert len({shape_of(probe(p)) for p in paths}) == 1 and (info.decoder == "decord" or info.pyav_faster)
    caplog.set_level(logging.DEBUG, logger="shmloader")
    clips = shmloader.VideoClips(paths, clip_len=5, frame_step=2, size=(64, 64))
    _, stats = epochs_of(clips, 4, workers=1, shuffle=True)
    reads = 4 * len(paths)
    assert stats["decord"] + stats["pyav"] == reads and stats["measured_reads"] == 2 * TIMED, stats
    (shape, row), = stats["decoder_shapes"].items()
    chosen = next(iter(row["decoder"]))
    other = {"decord": "pyav", "pyav": "decord"}[chosen]
    assert shape == str(shape_of(info)) and row["decoder"] == {chosen: 1} and row["rule"] == info.decoder
    assert row["cut"] == "64x64, 5 frames every 2" and row["decord_ms"] > 0 and row["pyav_ms"] > 0
    assert (row[f"{chosen}_ms"] <= row[f"{other}_ms"]) and stats[f"chose_{chosen}"] == 1 and not stats[f"chose_{other}"]
    # The other decoder read its warm-up and timed reads alone: every later read is the chosen one's.
    assert stats[other] == WARM + TIMED and stats[chosen] == reads - (WARM + TIMED), stats
    assert f"decoder for {shape}" in capfd.readouterr().err  # the worker's DEBUG line


@pytest.mark.parametrize("kw", [dict(size=(64, 80), frame_step=2), dict(clips_per_video=3, group_clips=True)],
                         ids=["stretched", "native-grouped"])
def test_the_epochs_are_the_same_whichever_decoder_reads(videos, kw):
    """H.264 (the rule's PyAV) and MPEG-4 (the rule's decord) files, two workers choosing
    mid-run, one clip a read or three of a video: every field of every batch equals forced
    PyAV's and forced decord's, pixel for pixel."""
    paths, labels = videos
    runs = {}
    for decoder in ("auto", "pyav", "decord"):
        clips = shmloader.VideoClips(paths, labels, clip_len=6, decoder=decoder, **kw)
        runs[decoder], stats = epochs_of(clips, 4, workers=2, shuffle=True)
        if decoder == "auto":
            assert stats["decord"] and stats["pyav"] and stats["chose_decord"] + stats["chose_pyav"], stats
    for name in ("pyav", "decord"):
        assert len(runs[name]) == len(runs["auto"])
        for a, b in zip(runs["auto"], runs[name]):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name} {k}")


def test_a_file_decord_may_not_read_is_never_measured(tmp_path):
    """An edit list and a rotation tag: the probe's evidence sends them to PyAV, and measuring
    never hands them to decord."""
    src = write_video(tmp_path / "src.mp4", 1, frames=48, size=(96, 128), gop=12)
    cut = cut_start(src, str(tmp_path / "cut.mp4"), 13)
    turned = _remux(write_video(tmp_path / "src2.mp4", 2, frames=48, size=(96, 128), gop=12),
                    str(tmp_path / "turned.mp4"), rotation=90)
    for path in (cut, turned):
        info = probe(path)
        assert info.decoder == "pyav" and not info.pyav_faster, info.problem
    clips = shmloader.VideoClips([cut, turned], clip_len=4, clips_per_video=4, size=(64, 64))
    got, stats = epochs_of(clips, 3, workers=1)
    assert stats["pyav"] >= 6 and not stats["decord"] and not stats["measured_reads"], stats
    assert stats["decoder_shapes"] == {}
    turns, skipped = {0: 0, 1: probe(turned).rotation}, {0: 13, 1: 0}
    for b in got:
        for i in range(len(b["index"])):
            v = int(b["index"][i])
            assert list(codes(b["video"][i], turns[v])[1]) == list(b["frames"][i] + skipped[v])


def test_a_far_clip_does_not_count_against_its_decoder(videos):
    """Each read's CPU is weighed by the frames a seeking decoder goes through: a decoder that
    drew clips far from their keyframe, at the same CPU per frame, is not found slower."""
    info = probe(videos[0][0])
    m = Measuring(Cut("64x64", 4, 1, 1))
    order = []
    key = None
    for i in range(PER_SHAPE):
        name, key = m.pick(info)
        assert key is not None
        order.append(name)
        far = name != info.decoder  # the rule's decoder draws clips at the keyframe, the other far from it
        frames = np.arange(30, 34) if far else np.arange(0, 4)
        cost = 34 if far else 4
        m.done(key, name, cost * 0.001 * (0.9 if far else 1.0), frames, np.array([0]))
    other = {"decord": "pyav", "pyav": "decord"}[info.decoder]
    assert order == [info.decoder, other] * (WARM + TIMED)
    assert m.pick(info) == (other, None) and m.chosen == {other: 1} and m.reads == 2 * TIMED
    report = m.report()[str(key)]
    assert report["decoder"] == other and report[f"{other}_ms"] < report[f"{info.decoder}_ms"]


def test_scan_measures_a_cut_and_the_loader_trusts_its_rows(videos, tmp_path):
    """``shmloader scan --measure-cut``: each file both decoders read exactly gets both figures and
    the faster in its decoder column, an edit-list cut neither; the loader reads every row with its
    row's decoder and measures nothing; a scan again for another cut measures again."""
    from .test_scan import rows_of, scan

    cut = cut_start(write_video(tmp_path / "src.mp4", 9, frames=48, size=(96, 128), gop=12),
                    str(tmp_path / "cut.mp4"), 13)
    paths = [videos[0][0], videos[0][6], cut]  # H.264, MPEG-4, an edit list
    out = tmp_path / "m.csv"
    r = scan(paths, out, workers=1, extra=["--measure-cut", "5,2,64x64"])
    rows = rows_of(out)
    assert list(rows[0])[-3:] == ["cut", "decord_ms", "pyav_ms"] and r.returncode == 0
    for row in rows[:2]:
        ms = {n: float(row[f"{n}_ms"]) for n in ("decord", "pyav")}
        assert row["cut"] == "64x64, 5 frames every 2" and min(ms.values()) > 0
        assert row["decoder"] == min(ms, key=ms.__getitem__), row
    assert (rows[2]["decoder"], rows[2]["decord_ms"], rows[2]["pyav_ms"]) == ("pyav", "", "")
    clips = shmloader.VideoClips.from_csv(str(out), clip_len=5, frame_step=2, size=(64, 64), clips_per_video=2)
    _, stats = epochs_of(clips, 3, workers=1)
    assert not stats["measured_reads"] and stats["decoder_shapes"] == {}
    by = [row["decoder"] for row in rows]
    assert stats["decord"] + stats["pyav"] >= 9 and all(stats[n] == 0 for n in ("decord", "pyav") if n not in by), stats
    scan(paths, out, workers=1, extra=["--measure-cut", "8,1"])
    assert [row["cut"] for row in rows_of(out)] == ["native, 8 frames every 1"] * 3
    bad = scan(paths, tmp_path / "bad.csv", workers=1, expect_ok=False, extra=["--measure-cut", "8"])
    assert "LEN,STEP[,HxW[,K]]" in bad.stderr


def test_a_pyav_row_stays_pyav_after_the_worker_probed_the_file(videos, tmp_path):
    """A scan row may say pyav where a worker's own probe says decord (the scan's seek evidence
    caught decord misreading the file, or PyAV measured faster): every read of it is PyAV's, the
    second and later too (the worker probes the file for PyAV's timestamps at the first)."""
    from .test_scan import rows_of, scan

    path = videos[0][6]  # MPEG-4: decord by the probe
    assert probe(path).decoder == "decord"
    out = tmp_path / "m.csv"
    scan([path], out, workers=1)
    rows = rows_of(out)
    rows[0]["decoder"] = "pyav"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    clips = shmloader.VideoClips.from_csv(str(out), clip_len=4, size=(64, 64), decoder="auto")
    _, stats = epochs_of(clips, 4, workers=1)
    assert stats["pyav"] == 4 and not stats["decord"] and stats["probes"] == 1, stats


def test_planned_videos_measure_the_decoder_as_clips_do(videos):
    """Whole videos planned by a family's recipe (``PlannedVideos``): the same measurement per shape
    of file in each worker, reported in ``stats()``, and the same frames whichever decoder read them."""
    from .families import thumbnails

    paths = videos[0][:6]
    info = probe(paths[0])
    runs = {}
    for decoder in ("auto", "pyav"):
        src = thumbnails.clips(paths, count=5, side=64, decoder=decoder)
        with shmloader.Loader(src, batch_tokens=5 * 49, workers=1, shuffle=True, seed=2, epochs=3) as loader:
            runs[decoder] = [{k: np.array(v) for k, v in b.items()} for b in loader]
            stats = loader.stats()
        if decoder == "auto":
            assert stats["decord"] + stats["pyav"] == 3 * len(paths) and stats["measured_reads"] == 2 * TIMED, stats
            (shape, row), = stats["decoder_shapes"].items()
            assert shape == str(shape_of(info)) and row["cut"] == "each video's planned frames and size"
            assert sum(row["decoder"].values()) == 1 and row["decord_ms"] > 0 and row["pyav_ms"] > 0
        else:
            assert "decoder_shapes" not in stats and stats["decord"] == 0
    for a, b in zip(runs["auto"], runs["pyav"], strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_lerobot_timesteps_measure_the_decoder_as_clips_do(tmp_path):
    """A LeRobot dataset (frames found by their times, several cameras): the same measurement per
    shape of file in each worker, reported in ``stats()``, and the same samples whichever decoder
    read them."""
    from shmloader import lerobot

    from . import _lerobot_v3 as v3

    root = v3.write(str(tmp_path / "ds"))
    runs = {}
    for decoder in ("auto", "pyav"):
        ds = lerobot.dataset(root, delta_timestamps={v3.FRONT: [-1 / v3.FPS, 0.0]}, decoder=decoder)
        with shmloader.Loader(ds, batch_size=4, workers=1, shuffle=True, seed=3, epochs=4) as loader:
            runs[decoder] = [{k: np.array(v) for k, v in b.items()} for b in loader]
            stats = loader.stats()
        if decoder == "auto":
            assert stats["measured_reads"] > 0 and stats["decoder_shapes"], stats
            assert {row["cut"] for row in stats["decoder_shapes"].values()} == {"a stretch of an episode's frames by their times"}
        else:
            assert "decoder_shapes" not in stats and stats["decord"] == 0
    for a, b in zip(runs["auto"], runs["pyav"], strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
