"""Clips defined by time spans: manifest rows of (video, start, end, label), each a sample whose
clips lie inside its span, in every sampling mode; several rows of one video; spans past the
end or shorter than a clip follow ``short_video``. Checked against a sequential libavformat
decode's frame times and the frame codes, with both decoders."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

import shmloader

from ._variants import codes, frame_times
from .conftest import state_after

pytestmark = pytest.mark.timeout(180)


def samples_of(clips, workers=2, batch_size=2, **kw):
    with shmloader.Loader(clips, batch_size=batch_size, workers=workers, timeout=60, **kw) as loader:
        out = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        return out, loader.stats()


def write_csv(path, rows, fields=("path", "label", "start", "end")):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    return str(path)


def in_span(times, a, b):
    """First and last frame on screen during [a, b) (seconds from the first frame's start)."""
    inside = np.flatnonzero((times[:, 1] > a + 1e-6) & (times[:, 0] < b - 1e-6))
    return int(inside[0]), int(inside[-1])


# (video in timed_videos, start, end): two spans of the 25 fps video, one of the 50 fps video,
# two of the variable-rate one (one of them open at the end).
SPANS = [(0, 0.5, 1.3), (0, 1.7, 2.4), (1, 0.05, 0.7), (3, 0.3, 1.1), (3, 1.0, "")]


@pytest.fixture
def manifest(timed_videos, tmp_path):
    rows = [{"path": os.path.relpath(timed_videos[v][0], tmp_path), "label": n, "start": a, "end": b}
            for n, (v, a, b) in enumerate(SPANS)]
    return write_csv(tmp_path / "spans.csv", rows)


def span_of(timed_videos, row):
    v, a, b = SPANS[row]
    path, vid = timed_videos[v]
    times = frame_times(path)
    return path, vid, times, a, (times[-1, 1] if b == "" else b)


MODES = {
    "random": dict(clip_len=4, frame_step=2, clips_per_sample=2),
    "uniform": dict(clip_len=4, sampling="uniform", clips_per_video=3),
    "center": dict(clip_len=3, frame_step=2, sampling="center"),
    "segments": dict(clip_len=5, sampling="segments", clips_per_sample=2),
    "segments_uniform": dict(clip_len=5, sampling="segments_uniform"),
    "fps": dict(clip_len=3, fps=5, clips_per_sample=2),
    "max_frames": dict(fps=5, max_frames=6, sampling="uniform"),
}


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_clip_lies_inside_its_rows_span(timed_videos, manifest, mode, decoder):
    clips = shmloader.VideoClips.from_csv(manifest, size=(48, 64), decoder=decoder, **MODES[mode])
    assert len(clips) == len(SPANS) * clips.sampling.clips_per_video
    got, _ = samples_of(clips, batch_size=3, shuffle=True, seed=1, epochs=2)
    assert len(got) == 2 * len(clips)
    for s in got:
        row = int(s["index"])
        assert int(s["label"]) == row
        path, vid, times, a, b = span_of(timed_videos, row)
        first, last = in_span(times, a, b)
        frames = s["frames"].reshape(-1, s["frames"].shape[-1])
        video = s["video"].reshape(-1, *s["video"].shape[-4:])
        for k, f in enumerate(frames):
            f = f[f >= 0]
            assert first <= f.min() and f.max() <= last, (mode, row, f, first, last)
            ids, numbers = codes(video[k][: len(f)])
            assert (ids == vid).all() and list(numbers) == list(f), (mode, row)
            if mode == "uniform":
                c = int(s["start"]) if np.ndim(s["start"]) == 0 else None
                assert c in {first + round(j * (last - first + 1 - 4) / 2) for j in range(3)}
            if mode == "segments_uniform":
                edges = max(a, 0) + (np.arange(5) + 0.5) * (min(b, times[-1, 1]) - a) / 5
                want = np.searchsorted(times[:, 0], edges + 1e-6, side="right") - 1
                np.testing.assert_array_equal(f, want)
            if mode == "max_frames":
                end = min(b, times[-1, 1])
                count = int(np.ceil((end - a) * 5 - 1e-9))
                want = np.searchsorted(times[:, 0], a + np.arange(count) / 5 + 1e-6, side="right") - 1
                if count > 6:
                    want = want[np.round(np.linspace(0, count - 1, 6)).astype(int)]
                np.testing.assert_array_equal(f, want)
            if mode == "fps":  # each frame on screen at its instant, from the clip's start
                t0 = max(times[f[0], 0], a)
                instants = t0 + np.arange(3) / 5 + 1e-6
                assert ((times[f, 0] <= instants) & (instants < times[f, 1])).all()


def test_rows_of_one_video_are_separate_samples_with_their_own_labels(timed_videos, tmp_path):
    """A JSON manifest, an open start: three rows of one video, each its own sample."""
    path = timed_videos[0][0]
    rows = [{"path": path, "label": 7, "start": None, "end": 0.4},
            {"path": path, "label": 8, "start": 1.0, "end": 1.4},
            {"path": path, "label": 9, "start": 2.0}]
    m = tmp_path / "rows.json"
    m.write_text(json.dumps(rows))
    clips = shmloader.VideoClips.from_csv(str(m), clip_len=10, sampling="center", size=(48, 64))
    got, stats = samples_of(clips, batch_size=3, workers=1)
    assert [int(s["label"]) for s in got] == [7, 8, 9] and [int(s["index"]) for s in got] == [0, 1, 2]
    # One batch, one task: the three rows of the file decoded in one pass.
    assert stats["tasks"] == 1 and stats.get("decord", 0) + stats.get("pyav", 0) == 1, stats
    # 25 fps: frames 0-9, 25-34, 50-59: each span holds exactly ten frames
    assert [list(s["frames"]) for s in got] == [list(range(0, 10)), list(range(25, 35)), list(range(50, 60))]
    for s in got:
        assert list(codes(s["video"])[1]) == list(s["frames"])


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_spans_count_from_the_first_frame_shown(tmp_path, decoder):
    """An MPEG-TS stream starts at a timestamp above 0 (0.08 s here): a span counts from its first frame."""
    from shmloader.video.samples import write_video

    path = write_video(tmp_path / "stream.ts", 60, frames=40, gop=12)
    clips = shmloader.VideoClips([path], clip_len=10, sampling="center", spans=[(0.4, 0.8)], size=(48, 64),
                                 decoder=decoder)
    (s,), _ = samples_of(clips, workers=1, batch_size=1)
    assert list(s["frames"]) == list(range(10, 20)) == list(codes(s["video"])[1])


def test_a_span_past_the_end_or_shorter_than_a_clip_follows_short_video(timed_videos, tmp_path):
    path, vid = timed_videos[2]  # 13 frames at 10 fps: 1.3 s
    rows = [{"path": path, "label": 0, "start": 1.1, "end": 2.0},  # frames 11, 12 only
            {"path": path, "label": 1, "start": 5.0, "end": 6.0},  # after the end
            {"path": path, "label": 2, "start": 0.0, "end": 1.0}]  # frames 0-9
    m = write_csv(tmp_path / "short.csv", rows)
    clips = shmloader.VideoClips.from_csv(m, clip_len=4, sampling="center", size=(48, 64))
    with shmloader.Loader(clips, batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="1.1-2 s: video has 2 frames, shorter than one clip"):
            list(loader)
    with shmloader.Loader(clips, batch_size=1, workers=1, on_error="skip") as loader:
        assert [list(b["frames"][0]) for b in loader] == [[3, 4, 5, 6]] and loader.stats()["skipped"] == 2
    with shmloader.Loader(shmloader.VideoClips([path], clip_len=4, spans=[(5.0, 6.0)], size=(48, 64)),
                          batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="5-6 s holds no frame of the video"):
            list(loader)
    got, _ = samples_of(clips.with_options(short_video="repeat_last"), workers=1, batch_size=1)
    assert [list(s["frames"]) for s in got] == [[11, 12, 12, 12], [12, 12, 12, 12], [3, 4, 5, 6]]
    got, _ = samples_of(clips.with_options(short_video="wrap"), workers=1, batch_size=1)
    assert [list(s["frames"]) for s in got] == [[11, 12, 11, 12], [12, 12, 12, 12], [3, 4, 5, 6]]
    for s in got:
        assert list(codes(s["video"])[1]) == list(s["frames"])


def test_a_scan_manifest_with_spans_is_read_without_probing(timed_videos, tmp_path):
    """``shmloader scan``'s columns plus start/end: the rows' frame counts and rates time the
    spans (a constant-rate row needs no probe), the variable-rate row reads its timestamps."""
    import subprocess
    import sys

    from shmloader.tools.scan import COLUMNS

    paths = [timed_videos[0][0], timed_videos[3][0]]
    out = tmp_path / "scan.csv"
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", *paths, "--out", str(out), "--workers", "1",
                        "--quiet"], capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    with open(out, newline="") as f:
        scanned = list(csv.DictReader(f))
    rows = [dict(scanned[0], start=0.5, end=1.3), dict(scanned[1], start=0.3, end=1.1),
            dict(scanned[0], start=1.7, end=2.4)]
    m = write_csv(tmp_path / "m.csv", rows, fields=(*COLUMNS, "start", "end"))
    clips = shmloader.VideoClips.from_csv(m, label_column=None, clip_len=4, sampling="uniform", clips_per_video=2,
                                          size=(48, 64))
    assert clips.manifest is not None and clips.spans is not None
    got, _ = samples_of(clips, batch_size=3)
    for s in got:
        row = rows[int(s["index"])]
        times = frame_times(row["path"])
        first, last = in_span(times, row["start"], row["end"])
        assert int(s["start"]) in (first, last - 3)
        assert list(codes(s["video"])[1]) == list(s["frames"])


def test_spans_are_seeded_resumable_and_independent_of_the_worker_count(timed_videos, manifest):
    clips = shmloader.VideoClips.from_csv(manifest, clip_len=5, sampling="segments", size=(48, 64))
    kw = dict(batch_size=2, shuffle=True, seed=6, epochs=2)
    one, _ = samples_of(clips, workers=1, **kw)
    three, _ = samples_of(clips, workers=3, **kw)
    for a, b in zip(one, three):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    _, state = state_after(clips, 2, workers=2, **kw)
    rest, _ = samples_of(clips, workers=2, state=state, **kw)
    assert len(rest) == len(one) - 4
    for a, b in zip(one[4:], rest):
        np.testing.assert_array_equal(a["frames"], b["frames"])


@pytest.mark.parametrize("cell, match", [("abc", "row 2: a start or end must be seconds"),
                                         ("-1", r"spans\[0\]"), ("9", r"spans\[0\]")])
def test_bad_spans(timed_videos, tmp_path, cell, match):
    m = write_csv(tmp_path / "bad.csv", [{"path": timed_videos[0][0], "label": 0, "start": cell, "end": 2}])
    with pytest.raises(ValueError, match=match):
        shmloader.VideoClips.from_csv(m, clip_len=4, size=(48, 64))


def test_grouped_decode_takes_every_row_of_a_video_in_one_pass(timed_videos, tmp_path):
    """``group_clips=True``: the samples of all the rows of one video form one group (groups of
    several sizes), decoded by one worker in one pass; the same draws as ungrouped, every
    (row, clip) once per epoch, the same batches for 1 and 3 workers, resumable."""
    from collections import Counter

    rows = [{"path": timed_videos[v][0], "label": v, "start": a, "end": b}
            for v, a, b in [(0, 0.0, 1.0), (1, 0.0, 0.4), (0, 1.2, 2.4), (3, 0.0, 1.0), (0, 0.6, 1.6),
                            (2, 0.2, None), (3, 1.2, None)]]
    m = write_csv(tmp_path / "g.csv", rows)
    clips = shmloader.VideoClips.from_csv(m, clip_len=3, sampling="segments", clips_per_video=2, size=(48, 64),
                                          group_clips=True)
    assert list(clips.group_ids()) == [0, 0, 1, 1, 0, 0, 2, 2, 0, 0, 3, 3, 2, 2]
    kw = dict(batch_size=3, shuffle=True, seed=2, epochs=2)
    grouped, stats = samples_of(clips, workers=2, **kw)
    assert stats["tasks"] == 2 * 4 and stats["decoded"] == 2 * 14  # one task per video and epoch
    three, _ = samples_of(clips, workers=3, **kw)
    for a, b in zip(grouped, three):
        np.testing.assert_array_equal(a["frames"], b["frames"])
    separate, _ = samples_of(clips.with_options(group_clips=False), workers=2, **kw)
    key = lambda s: (int(s["index"]), tuple(s["frames"]))  # noqa: E731
    for e in range(2):
        a, b = grouped[e * 14 : (e + 1) * 14], separate[e * 14 : (e + 1) * 14]
        assert Counter(map(key, a)) == Counter(map(key, b)) and Counter(int(s["index"]) for s in a) == {r: 2 for r in range(7)}
    for s in grouped:
        path, a, b = rows[int(s["index"])]["path"], rows[int(s["index"])]["start"], rows[int(s["index"])]["end"]
        times = frame_times(path)
        first, last = in_span(times, a, times[-1, 1] if b is None else b)
        assert first <= s["frames"].min() and s["frames"].max() <= last
        assert list(codes(s["video"])[1]) == list(s["frames"])
    _, state = state_after(clips, 3, workers=2, **kw)
    assert state["groups"] == 4
    rest, _ = samples_of(clips, workers=2, state=state, **kw)
    assert [key(s) for s in rest] == [key(s) for s in grouped[9:]]


def test_the_docs_span_recipe(timed_videos, tmp_path, monkeypatch):
    from ._examples import doc_example

    rows = [{"path": os.path.relpath(timed_videos[v][0], tmp_path), "label": v, "start": a, "end": b}
            for v, a, b in [(0, 0.2, 1.0), (0, 1.2, 1.5), (2, 0.5, 0.9)]]
    write_csv(tmp_path / "train.csv", rows)
    monkeypatch.chdir(tmp_path)
    namespace = {"shmloader": shmloader}
    exec(doc_example("spans"), namespace)
    got, stats = samples_of(namespace["clips"], batch_size=3, workers=1)
    assert stats["tasks"] == 2  # the two rows of the 25 fps video in one pass
    for s in got:
        row = rows[int(s["index"])]
        times = frame_times(timed_videos[row["label"]][0])
        first, last = in_span(times, row["start"], row["end"])
        # 0.8 s spans at 25 fps hold 21 frames; 0.3 s at 25 fps and 0.4 s at 10 fps are shorter
        # than 16 frames every 2nd: repeat_last from the span's first frame
        if last - first + 1 >= 31:
            assert first <= s["frames"].min() and s["frames"].max() <= last
        else:
            assert s["frames"][0] == first and s["frames"][-1] == first + 2 * ((last - first) // 2)
        assert list(codes(s["video"])[1]) == list(s["frames"])


def test_an_avi_with_b_frames_is_timed_by_its_frame_rate(tmp_path):
    """AVI stores no presentation times: with H.264 B-frames its stamps name packets in decode
    order. A player shows frame ``i`` at ``i / rate``; ``fps=``, segments and spans take the frames
    shown so, from the paths and from a scan manifest (they were refused: no usable timestamps)."""
    from ._variants import reference
    from .test_scan import scan
    from .test_shapes import write

    path = write(tmp_path / "bframes.avi", "libx264", bframes=2, frames=72)
    assert list(codes(reference(path))[1]) == list(range(72))
    scan([path], tmp_path / "scan.csv", workers=1)
    grid = np.arange(73) / 25.0  # frame i on screen during [i / 25, (i + 1) / 25)
    shown = lambda instants: np.searchsorted(grid, np.asarray(instants) + 1e-6, side="right") - 1  # noqa: E731
    for clips in (shmloader.VideoClips([path], clip_len=6, fps=10, clips_per_video=3, sampling="uniform"),
                  shmloader.VideoClips.from_csv(str(tmp_path / "scan.csv"), clip_len=6, fps=10, clips_per_video=3,
                                                sampling="uniform")):
        got, _ = samples_of(clips, workers=1, batch_size=3)
        for s in got:
            f = s["frames"]
            np.testing.assert_array_equal(f, shown(grid[f[0]] + np.arange(6) / 10))
            assert list(codes(s["video"])[1]) == list(f)
        assert sorted(int(s["start"]) for s in got)[0] == 0
        segments = clips.with_options(fps=None, clip_len=8, sampling="segments_uniform", clips_per_video=1)
        (s,), _ = samples_of(segments, workers=1, batch_size=1)
        np.testing.assert_array_equal(s["frames"], shown((np.arange(8) + 0.5) * 72 / 25 / 8))
        assert list(codes(s["video"])[1]) == list(s["frames"])
    spans = write_csv(tmp_path / "spans.csv", [{"path": path, "label": 0, "start": 0.5, "end": 1.5}])
    clips = shmloader.VideoClips.from_csv(spans, clip_len=4, fps=5, sampling="random")
    got, _ = samples_of(clips, workers=1, batch_size=1, epochs=4, shuffle=True)
    for s in got:
        f = s["frames"]
        assert 12 <= f[0] and f[-1] <= 37, f  # frames 12 .. 37 are on screen during [0.5, 1.5) s
        np.testing.assert_array_equal(f, shown(grid[f[0]] + np.arange(4) / 5))
        assert list(codes(s["video"])[1]) == list(f)
