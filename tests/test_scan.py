"""`shmloader scan`: one manifest row per file with the right numbers and problem, read back by
VideoClips.from_csv without probing again, resumed where a stopped scan left off."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

import shmloader
from shmloader.tools.scan import COLUMNS

from ._variants import codes, cut_slice, reference

pytestmark = pytest.mark.timeout(180)

# name: (decoder, problem column) for the variants of tests/_variants.py and a copy of plain.mp4
# whose keyframe 36 lost half its slice (what `--check keyframes`, the default, decodes).
WANT = {"plain.mp4": ("decord", ""), "edit_list.mp4": ("pyav", "edit list drops 13 frames"),
        "stream.ts": ("pyav", ""), "rotated.mp4": ("pyav", ""),
        "gap.mkv": ("decord", "timestamp gap at frame 30 (0.44 s)"),  # 10 frames late: 11 steps
        "two_sizes.mkv": ("pyav", "size change at frame 30 (96x128 to 72x160)"),
        "damaged.mp4": ("pyav", "damaged at frame 36")}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The variants in two class folders, a damaged copy and a file that is no video."""
    from ._variants import write_variants

    root = tmp_path_factory.mktemp("dataset")
    variants = write_variants(root / "_src")
    for i, (name, (path, _)) in enumerate(sorted(variants.items())):
        folder = root / ("a_class" if i % 2 else "b_class")
        folder.mkdir(exist_ok=True)
        shutil.copy(path, folder / os.path.basename(path))
    cut_slice(variants["plain"][0], str(root / "b_class" / "damaged.mp4"), 36)
    (root / "a_class" / "notes.mp4").write_text("not a video\n")
    shutil.rmtree(root / "_src")
    return root


def scan(inputs, out, workers=2, expect_ok=True, extra=()):
    """The command line, in its own process (its probing pool and multiprocessing's helpers go with it)."""
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", *map(str, inputs), "--out", str(out),
                        "--workers", str(workers), "--quiet", *extra], capture_output=True, text=True, timeout=150)
    assert (r.returncode == 0) == expect_ok, r.stderr
    return r


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_scan_lists_every_file_with_its_numbers_and_problem(dataset, tmp_path):
    out = tmp_path / "manifest.csv"
    r = scan([dataset], out)
    rows = {os.path.basename(row["path"]): row for row in rows_of(out)}
    assert set(rows) == set(WANT) | {"notes.mp4"}
    # Input order: class folders in sorted order, each one's files sorted.
    order = [str(dataset / c / f) for c in sorted(os.listdir(dataset)) for f in sorted(os.listdir(dataset / c))]
    assert [row["path"] for row in rows_of(out)] == order
    assert list(rows_of(out)[0]) == list(COLUMNS)
    for name, (decoder, problem) in WANT.items():
        row = rows[name]
        shape = (60, 96, 128) if name == "damaged.mp4" else reference(row["path"]).shape[:3]
        assert int(row["frames"]) == shape[0], name
        assert (int(row["height"]), int(row["width"])) == shape[1:], name  # as shown
        assert row["decoder"] == decoder, (name, row["decoder"])
        assert row["problem"] == problem, (name, row["problem"])
        assert float(row["fps"]) == 25 and row["codec"] == "h264" and row["pix_fmt"] == "yuv420p"
        assert int(row["bytes"]) == os.path.getsize(row["path"])
        assert int(row["label"]) == (0 if os.path.basename(os.path.dirname(row["path"])) == "a_class" else 1)
    assert rows["rotated.mp4"]["rotation"] == "90" and rows["plain.mp4"]["rotation"] == "0"
    assert float(rows["gap.mkv"]["duration"]) == pytest.approx(2.8, abs=0.05)  # 60 frames + a 10-frame gap
    notes = rows["notes.mp4"]
    assert notes["problem"] == (f"unreadable: not a video FFmpeg can read, or cut short: no format recognised "
                                f"(FFmpeg: Invalid data found when processing input): '{notes['path']}'"), notes["problem"]
    assert all(notes[c] == "" for c in COLUMNS if c not in ("path", "label", "problem", "bytes", "mtime_ns", "check"))
    assert {row["check"] for row in rows.values()} == {"keyframes"}  # the check that made each row
    lines = r.stderr.splitlines()  # the problem kinds by count; equal counts in row order
    assert lines[0] == f"8 files in {out}: 7 readable (2 by decord, 5 by pyav), 1 unreadable", r.stderr
    kinds = sorted(line.split(":")[0] for line in lines[2:7])
    assert kinds == ["  damaged at frame N", "  edit list drops N frames", "  size change at frame N",
                     "  timestamp gap at frame N", "  unreadable"], r.stderr
    assert f"  edit list drops N frames: 1 file, {rows['edit_list.mp4']['path']}: edit list drops 13 frames" in lines


def cut_after_index(path, frames=64, keep=0.8):
    """An MP4 with its index first ('faststart') cut after ``keep`` of its bytes: the index
    still lists every frame, the file holds fewer (a download that stopped)."""
    import av

    from shmloader.video.samples import frame_image

    full = f"{path}.full.mp4"
    with av.open(full, "w", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 128, 96, "yuv420p"
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_image(3, i, 96, 128), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    data = open(full, "rb").read()
    os.remove(full)
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    return str(path)


@pytest.fixture(scope="module")
def loose(tmp_path_factory):
    """A folder without class sub-folders: two good videos, one cut short, one text file named
    .mp4 and a readme (no video extension)."""
    from shmloader.video.samples import make_videos

    root = tmp_path_factory.mktemp("loose")
    make_videos(root, count=2, frames=24, size=(48, 64), classes=1)
    cut_after_index(root / "cut.mp4")
    (root / "notes.mp4").write_text("not a video\n")
    (root / "README.txt").write_text("about these videos\n")
    return root


def test_scan_summary_says_what_each_problem_is_and_where(loose, tmp_path):
    """The summary as a user reads it: counts with their nouns, each problem kind with a first
    file and its own words, unlabelled rows explained, what to do next; the manifest in LF lines."""
    out = tmp_path / "m.csv"
    r = scan([loose], out, workers=1)
    rows = {os.path.basename(row["path"]): row for row in rows_of(out)}
    truncated = rows["cut.mp4"]["problem"]
    assert truncated.startswith("truncated at frame ") and " of 64" in truncated, truncated
    lines = r.stderr.splitlines()
    assert lines[0] == f"4 files in {out}: 3 readable (2 by decord, 1 by pyav), 1 unreadable", r.stderr
    assert f"  truncated at frame N of N: 1 file, {loose / 'cut.mp4'}: {truncated}" in lines, r.stderr
    assert any(line.startswith(f"  unreadable: 1 file, {loose / 'notes.mp4'}: not a video") for line in lines), \
        r.stderr
    assert "4 files have no label (-1): they are not in class sub-folders of a folder given" in r.stderr
    one = tmp_path / "one.csv"
    r1 = scan([loose / "cut.mp4"], one, workers=1)
    assert "1 file has no label (-1)" in r1.stderr and "1 file in" in r1.stderr, r1.stderr
    assert "passed over 1 file without a video extension (.txt 1)" in r.stderr
    assert "VideoClips.from_csv" in lines[-1] and "left out" in lines[-1], r.stderr
    assert b"\r\n" not in out.read_bytes()


@pytest.mark.parametrize("fail_on, code", [(None, 0), ("unreadable", 1), ("truncated", 1), ("damaged", 0),
                                           ("any", 1), ("size change,unreadable", 1)])
def test_scan_fail_on_sets_the_exit_code(loose, tmp_path, fail_on, code):
    """``--fail-on KINDS`` makes a scan a check for CI: exit 1 when a row has one of the kinds,
    and a last line saying so; without it a scan with problems exits 0."""
    out = tmp_path / "m.csv"
    extra = () if fail_on is None else ("--fail-on", fail_on)
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", str(loose), "--out", str(out), "--workers", "1",
                        "--quiet", *extra], capture_output=True, text=True, timeout=150)
    assert r.returncode == code, r.stderr
    if code:
        assert r.stderr.splitlines()[-1].startswith("shmloader scan: exit 1:") and f"--fail-on {fail_on}" in r.stderr


def test_scan_fail_on_refuses_an_unknown_kind(loose, tmp_path):
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", str(loose), "--out", str(tmp_path / "m.csv"),
                        "--fail-on", "broken"], capture_output=True, text=True, timeout=150)
    assert r.returncode == 2 and "--fail-on" in r.stderr and "unreadable" in r.stderr, r.stderr
    assert not (tmp_path / "m.csv").exists()


def test_scan_refuses_an_input_that_does_not_exist(loose, tmp_path):
    """A mistyped folder on the command line is an error (exit 2, naming it, no manifest), not a
    manifest of one unreadable row."""
    missing = tmp_path / "vidoes"
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", str(loose), str(missing), "--out",
                        str(tmp_path / "m.csv")], capture_output=True, text=True, timeout=150)
    assert r.returncode == 2 and f"no such file or folder: {str(missing)!r}" in r.stderr, r.stderr
    assert not (tmp_path / "m.csv").exists()


def test_scan_progress_bar_counts_towards_the_total(loose, tmp_path):
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", str(loose), "--out", str(tmp_path / "m.csv"),
                        "--workers", "1"], capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    bar = r.stderr.replace("\r", "\n")
    assert "scan: 100%" in bar and "4/4" in bar and " files/s" in bar, bar


def test_from_csv_loads_the_manifest(dataset, tmp_path):
    out = str(tmp_path / "manifest.csv")
    scan([dataset], out)
    # The damaged file stays: its 3 clips (starts 0, 27, 54) keep clear of keyframe 36's GOP.
    good = [r for r in rows_of(out) if not r["problem"].startswith("unreadable")]
    write_rows(out, *good)
    clips = shmloader.VideoClips.from_csv(out, clip_len=6, clips_per_video=3, sampling="uniform", size=(48, 64))
    with shmloader.Loader(clips, batch_size=3, workers=1, timeout=60) as loader:
        got = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        stats = loader.stats()
    assert len(got) == 3 * len(good)
    damaged = next(i for i, r in enumerate(good) if r["problem"] == "damaged at frame 36")
    assert sorted(int(s["start"]) for s in got if int(s["index"]) == damaged) == [0, 27, 54]
    # The rows' decoders read them; only the files PyAV reads are probed (for their timestamps),
    # and those decord reads whose rate is not constant (for each frame's time: gap.mkv).
    by = {d: sum(r["decoder"] == d for r in good) for d in ("decord", "pyav")}
    untimed = sum(r["decoder"] == "decord" and r["problem"] not in ("", "timestamps in decode order") for r in good)
    assert by == {"decord": 2, "pyav": 5} and untimed == 1 and stats["probes"] == by["pyav"] + untimed, stats
    assert stats["decord"] == by["decord"] and stats["pyav"] == by["pyav"], stats
    for s in got:
        row = good[int(s["index"])]
        shown = reference(row["path"], (48, 64))
        assert int(s["label"]) == int(row["label"])
        assert int(s["frames"][-1]) <= int(row["frames"]) - 1
        _, numbers = codes(shown, int(row["rotation"]))
        _, got_numbers = codes(s["video"], int(row["rotation"]))
        np.testing.assert_array_equal(got_numbers, numbers[s["frames"]])


def test_from_csv_leaves_out_the_rows_a_scan_found_unreadable(dataset, tmp_path):
    """A scan's manifest loads as it is: its unreadable rows are left out with one warning that
    names the manifest, counts them and names the first, instead of a SampleError mid-epoch."""
    out = tmp_path / "manifest.csv"
    scan([dataset], out)
    rows = rows_of(out)
    notes = next(r for r in rows if r["problem"].startswith("unreadable"))
    with pytest.warns(UserWarning) as caught:
        clips = shmloader.VideoClips.from_csv(out, clip_len=4, size=(48, 64))
    (w,) = caught
    message = str(w.message)
    assert str(out) in message and "1 of 8 rows" in message and notes["path"] in message, message
    assert "scan again" in message, message
    assert len(clips) == 7
    kept = [r["path"] for r in rows if not r["problem"].startswith("unreadable")]
    damaged = next(i for i, p in enumerate(kept) if p.endswith("damaged.mp4"))
    with shmloader.Loader(clips, batch_size=4, workers=1, timeout=60, on_error="skip") as loader:
        seen = sorted(int(i) for b in loader for i in b["index"])
    # Every readable row once; the damaged copy's clip is skipped where it lands on the damage.
    assert seen in (list(range(7)), [i for i in range(7) if i != damaged]), seen
    # A manifest of unreadable rows only is refused, with the same words.
    write_rows(out, notes)
    with pytest.raises(ValueError, match="no readable video: 1 of 1 rows .* unreadable"):
        shmloader.VideoClips.from_csv(out, clip_len=4, size=(48, 64))


def plain_manifest(dataset, tmp_path):
    """A copy of plain.mp4 (60 frames, 96x128, 25 fps) and its one-row manifest."""
    src = next(dataset.glob("*/plain.mp4"))
    path = tmp_path / "plain.mp4"
    shutil.copy(src, path)
    out = str(tmp_path / "m.csv")
    scan([path], out, workers=1)
    (row,) = rows_of(out)
    assert (row["frames"], row["height"], row["width"], row["fps"], row["rotation"], row["decoder"]) == \
        ("60", "96", "128", "25", "0", "decord")
    return path, out, row


def write_rows(out, *rows):
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)


def load(out, workers=1, **kw):
    """(samples, stats) of a loader over the manifest ``out``: clips of 4 frames, uniform."""
    kw = {"clip_len": 4, "clips_per_video": 2, "sampling": "uniform", "size": (48, 64), **kw}
    clips = shmloader.VideoClips.from_csv(out, label_column=None, **kw)
    with shmloader.Loader(clips, batch_size=2, workers=workers, timeout=60) as loader:
        got = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        return got, loader.stats()


def test_times_follow_the_files_timestamps_from_a_manifest_row(dataset, tmp_path):
    """Each frame's time in a batch: by the rate for a constant-rate row (no probe), by the file's
    own timestamps for a row whose timestamps jump (gap.mkv: 0.44 s missing at frame 30, read by
    decord, probed for its times alone), as a probe of the file times them."""
    from shmloader.video.probe import probe

    out = str(tmp_path / "manifest.csv")
    scan([dataset], out)
    rows = [r for r in rows_of(out) if os.path.basename(r["path"]) in ("gap.mkv", "plain.mp4")]
    write_rows(out, *rows)
    got, stats = load(out, clip_len=8, clips_per_video=6, frame_step=6)
    assert stats["probes"] == 1, stats  # gap.mkv's, for its times; plain.mp4 timed by its rate
    for s in got:
        times = probe(rows[int(s["index"])]["path"]).times()
        np.testing.assert_allclose(s["times"], times[s["frames"], 0] - times[0, 0], atol=1e-6)
    gap = [s for s in got if rows[int(s["index"])]["path"].endswith("gap.mkv") and s["frames"].max() >= 30]
    assert gap and all(np.diff(s["times"]).max() > 6 / 25 + 0.3 for s in gap)  # the jump is in them


def test_from_csv_trusts_a_row_until_its_file_changes(dataset, tmp_path):
    """The workers take a row's numbers instead of probing (``stats()["probes"]`` 0): a row that
    says 20 frames bounds the clips to them; once the file's mtime moves, or its size at the
    same mtime, it is probed again, once per worker."""
    path, out, row = plain_manifest(dataset, tmp_path)
    got, stats = load(out)
    assert max(int(s["start"]) for s in got) == 60 - 4 and stats.get("probes", 0) == 0 and stats["decord"] >= 1
    write_rows(out, {**row, "frames": "20"})
    got, stats = load(out, workers=2)
    assert max(int(s["start"]) for s in got) == 20 - 4 and stats.get("probes", 0) == 0
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    got, stats = load(out)
    assert max(int(s["start"]) for s in got) == 60 - 4 and stats["probes"] == 1
    # Another file of another length (and byte size) in its place, the row's mtime put back.
    from shmloader.samples import write_video

    write_video(path, 1, frames=40, size=(96, 128), gop=12)
    assert os.path.getsize(path) != int(row["bytes"])
    os.utime(path, ns=(st.st_atime_ns, int(row["mtime_ns"])))
    got, stats = load(out)
    assert max(int(s["start"]) for s in got) == 40 - 4 and stats["probes"] == 1


def test_from_csv_uses_the_decoder_size_and_fps_columns(dataset, tmp_path):
    """Each probe column of a row steers the workers (the file itself is plain.mp4): the
    decoder column picks the decoder, a size other than the file's is refused at native size,
    fps times the frames of ``fps=`` clips. (The rotation column does not: decord turns frames
    itself, and PyAV reads a file's own probe for the timestamps it seeks by.)"""
    path, out, row = plain_manifest(dataset, tmp_path)
    _, numbers = codes(reference(str(path)))

    write_rows(out, {**row, "decoder": "pyav"})
    got, stats = load(out)
    assert stats["pyav"] >= 1 and not stats.get("decord"), stats
    assert stats["probes"] == 1  # PyAV seeks by timestamps, which a row does not hold

    write_rows(out, {**row, "width": "256"})
    clips = shmloader.VideoClips.from_csv(out, label_column=None, clip_len=4)  # native size, from the file
    with shmloader.Loader(clips, batch_size=1, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError, match="video is 96x256 but the loader's clips are 96x128"):
            list(loader)

    for fps, step in (("25", 5), ("50", 10)):  # 5 fps clips: every 5th frame, or every 10th by the row
        write_rows(out, {**row, "fps": fps})
        got, stats = load(out, fps=5, clip_len=4)
        assert stats.get("probes", 0) == 0
        for s in got:
            assert (np.diff(s["frames"]) == step).all(), (fps, s["frames"])
            np.testing.assert_array_equal(codes(s["video"])[1], numbers[s["frames"]])


def test_from_csv_fps_on_timed_and_gap_rows(dataset, tmp_path):
    """``fps=`` over a manifest: a constant-rate row is timed from its fps column, a row with a
    timestamp gap from the file's own timestamps (probed once by the worker); each delivered
    frame is the one a sequential decode shows at its instant, and a clip spans the gap."""
    import av

    out = str(tmp_path / "m.csv")
    scan([next(dataset.glob("*/plain.mp4")), next(dataset.glob("*/gap.mkv"))], out, workers=1)
    rows = rows_of(out)
    assert [r["problem"] for r in rows] == ["", "timestamp gap at frame 30 (0.44 s)"]
    got, stats = load(out, fps=5, clip_len=6, clips_per_video=4)
    assert stats["probes"] == 1  # the gap row alone
    crossed = False
    for s in got:
        path = rows[int(s["index"])]["path"]
        with av.open(path) as c:
            starts = np.array([f.time for f in c.decode(video=0)])
        instants = starts[s["frames"][0]] + np.arange(6) / 5 + 1e-6
        np.testing.assert_array_equal(s["frames"], np.searchsorted(starts, instants, side="right") - 1)
        np.testing.assert_array_equal(codes(s["video"])[1], s["frames"])
        crossed |= path.endswith("gap.mkv") and bool((s["frames"] < 30).any() and (s["frames"] >= 30).any())
    assert crossed


def test_scan_resumes_where_it_stopped(dataset, tmp_path):
    full = str(tmp_path / "full.csv")
    scan([dataset], full)
    part = str(tmp_path / "part.csv")
    with open(full) as f:
        lines = f.readlines()
    # Header and three rows, as a scan stopped there leaves it; one kept row marked, to show that
    # kept rows are kept, not probed again.
    kept = lines[:4]
    i = next(i for i in (1, 2, 3) if ",decord," in kept[i] or ",pyav," in kept[i])
    swap = (",decord,", ",pyav,") if ",decord," in kept[i] else (",pyav,", ",decord,")
    kept[i] = kept[i].replace(*swap, 1)
    with open(part, "w") as f:
        f.writelines(kept)
    before = os.path.getmtime(part)
    time.sleep(0.01)
    r = scan([dataset], part)
    assert f"{len(lines) - 1} files in" in r.stderr and "; 3 rows from an earlier run" in r.stderr
    assert open(part).read() == "".join(kept + lines[4:])
    assert os.path.getmtime(part) > before
    # A manifest of other inputs is not silently extended.
    r = scan([dataset / "a_class"], part, workers=1, expect_ok=False)
    assert "not a scan of these inputs" in r.stderr and open(part).read() == "".join(kept + lines[4:])


def test_scan_keeps_the_spans_of_its_input_manifest(dataset, tmp_path):
    """An input manifest with start/end columns (several rows of one video): one output row per
    input row with its span and label, resumable, and from_csv reads the spans."""
    plain = next(dataset.glob("*/plain.mp4"))
    gap = next(dataset.glob("*/gap.mkv"))
    src = tmp_path / "spans.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "start", "end"])
        w.writerows([[plain, 0, 0.0, 1.0], [plain, 1, 1.2, ""], [gap, 2, 0.5, 2.0], [plain, 3, "", 0.4]])
    out = tmp_path / "manifest.csv"
    scan([src], out, workers=1)
    rows = rows_of(out)
    assert list(rows[0]) == [*COLUMNS, "start", "end"]
    assert [(r["label"], r["start"], r["end"]) for r in rows] == [("0", "0.0", "1.0"), ("1", "1.2", ""),
                                                                   ("2", "0.5", "2.0"), ("3", "", "0.4")]
    assert [r["frames"] for r in rows] == ["60", "60", "60", "60"] and rows[2]["problem"].startswith("timestamp gap")
    # A scan stopped after two rows resumes with the span columns.
    with open(out) as f:
        lines = f.readlines()
    with open(tmp_path / "part.csv", "w") as f:
        f.writelines(lines[:3])
    scan([src], tmp_path / "part.csv", workers=1)
    assert open(tmp_path / "part.csv").read() == "".join(lines)
    clips = shmloader.VideoClips.from_csv(str(out), clip_len=5, sampling="center", size=(48, 64))
    assert clips.manifest is not None and clips.spans.tolist() == [[0, 1], [1.2, np.inf], [0.5, 2], [0, 0.4]]
    with shmloader.Loader(clips, batch_size=4, workers=1, timeout=60) as loader:
        (b,) = list(loader)
    # 25 fps: the centre 5 frames of frames 0-24, 30-59, 0-9; gap.mkv: frames 12-49 by its stored times
    for i, want in ((0, [10, 11, 12, 13, 14]), (1, [42, 43, 44, 45, 46]), (3, [2, 3, 4, 5, 6])):
        assert list(b["frames"][i]) == want
        assert list(codes(b["video"][i])[1]) == want


def test_csv_json_and_txt_inputs_give_the_folders_rows(dataset, tmp_path):
    """The same files named by a CSV and a JSON manifest and a list, with paths relative to
    each: the folder scan's rows three times over, in input order (a list has no labels)."""
    folder = tmp_path / "folder.csv"
    scan([dataset], folder)
    rows = rows_of(folder)
    lists = tmp_path / "lists"
    lists.mkdir()
    rel = [os.path.relpath(row["path"], lists) for row in rows]
    with open(lists / "a.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "path"])
        w.writerows([row["label"], p] for row, p in zip(rows, rel))
    with open(lists / "b.json", "w") as f:
        json.dump([{"path": p, "label": int(row["label"])} for row, p in zip(rows, rel)], f)
    with open(lists / "c.txt", "w") as f:
        f.write("# one path a line\n\n" + "\n".join(rel) + "\n")
    out = tmp_path / "lists.csv"
    r = scan([lists / "a.csv", lists / "b.json", lists / "c.txt"], out)
    unlabelled = [{**row, "label": "-1"} for row in rows]
    assert rows_of(out) == rows + rows + unlabelled
    assert f"{3 * len(rows)} files in" in r.stderr


def test_overwrite_scans_again(dataset, tmp_path):
    """Without ``--overwrite`` a manifest of other inputs is refused and one of the same inputs
    resumed (an altered row kept); with it, every file is probed again."""
    out = tmp_path / "m.csv"
    scan([dataset / "b_class"], out)
    first = rows_of(out)
    altered = [dict(row) for row in first]
    altered[0]["frames"] = "7"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(altered)
    scan([dataset / "b_class"], out)
    assert rows_of(out) == altered  # resumed: nothing left to probe
    scan([dataset / "b_class"], out, extra=["--overwrite"])
    assert rows_of(out) == first
    r = scan([dataset], out, expect_ok=False)  # its rows start with a_class's
    assert "not a scan of these inputs" in r.stderr and rows_of(out) == first
    scan([dataset], out, extra=["--overwrite"])
    assert [row["path"] for row in rows_of(out)] == [row["path"] for row in rows_of(scan_of(dataset, tmp_path))]


def scan_of(folder, tmp_path):
    out = tmp_path / "fresh.csv"
    scan([folder], out)
    return out


@pytest.mark.parametrize("check", ["headers", "keyframes", "frames"])
def test_check_decides_what_damage_is_found(tmp_path, check):
    """``--check headers`` reads packets only: no damage found; ``keyframes`` (the default)
    finds a damaged keyframe; ``frames`` also a damaged frame between keyframes. A file found
    damaged goes to PyAV."""
    from shmloader.samples import write_video

    plain = write_video(tmp_path / "plain.mp4", 1, frames=60, size=(96, 128), gop=12)
    key = cut_slice(plain, str(tmp_path / "key36.mp4"), 36)
    inter = cut_slice(plain, str(tmp_path / "inter38.mp4"), 38)
    out = tmp_path / "m.csv"
    scan([plain, key, inter], out, extra=["--check", check])
    found = {"headers": ("", ""), "keyframes": ("damaged at frame 36", ""),
             "frames": ("damaged at frame 36", "damaged at frame 38")}[check]
    want = [("", "decord")] + [(p, "pyav" if p else "decord") for p in found]
    assert [(row["problem"], row["decoder"]) for row in rows_of(out)] == want
    assert [row["path"] for row in rows_of(out)] == [str(plain), key, inter]


def never_ending(path) -> str:
    """A 1 TiB sparse DV file of zeros (no disk used): FFmpeg's DV demuxer reads on for ever
    looking for a frame header, its memory flat."""
    with open(path, "wb") as f:
        f.truncate(1 << 40)
    return str(path)


def test_a_probe_that_hangs_gets_its_row_and_the_rest_go_on(dataset, tmp_path):
    """A file whose probe never ends among files: after ``--timeout`` seconds, and twice that in a
    probe of its own, its row says so, and the files after it get their own rows, in input order."""
    names = ["plain.mp4", "rotated.mp4", "gap.mkv"]
    files = {os.path.basename(p): str(p) for p in dataset.glob("*/*")}
    stuck = never_ending(tmp_path / "stuck.dv")
    listed = [files[names[0]], stuck, files[names[1]], files[names[2]]]
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    out = tmp_path / "m.csv"
    r = scan([tmp_path / "list.txt"], out, extra=["--timeout", "5"])
    rows = rows_of(out)
    assert [row["path"] for row in rows] == listed
    assert rows[1]["problem"] == "unreadable: probe took over 10 s" and rows[1]["frames"] == ""  # alone, twice the time
    for row in rows[:1] + rows[2:]:
        name = os.path.basename(row["path"])
        assert (row["decoder"], row["problem"]) == WANT[name], row
        assert int(row["frames"]) == 60
    assert "4 files in" in r.stderr and "unreadable: 1" in r.stderr


def test_a_probe_that_times_out_once_is_tried_again_alone(dataset, tmp_path):
    """A good file whose first probe passes ``--timeout`` (a busy machine, a slow disk) is probed
    once more, alone, with a longer deadline before its row calls it unreadable. Here the first
    probe meets a file that never ends, which becomes plain.mp4 as soon as a probe has it open:
    its retry reads plain.mp4, whatever the host's speed."""
    files = {os.path.basename(p): str(p) for p in dataset.glob("*/*")}
    slow = never_ending(tmp_path / "slow.dv")
    listed = [files["plain.mp4"], slow, files["rotated.mp4"]]
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    out = tmp_path / "m.csv"
    opened: list = []
    proc, err = scan_watched(tmp_path / "list.txt", out,
                             lambda pid, stop: replace_once_opened(pid, slow, files["plain.mp4"], stop, opened))
    assert proc.returncode == 0, err
    assert opened, "no probe opened the slow file"
    rows = rows_of(out)
    assert [row["path"] for row in rows] == listed
    assert (rows[1]["decoder"], rows[1]["problem"], rows[1]["frames"]) == ("decord", "", "60"), rows[1]
    assert int(rows[1]["bytes"]) == os.path.getsize(files["plain.mp4"])
    for row in rows[:1] + rows[2:]:
        assert (row["decoder"], row["problem"]) == WANT[os.path.basename(row["path"])], row
    assert ", 0 unreadable" in err, err  # the summary's count


def scan_watched(listing, out, watch) -> tuple[subprocess.Popen, str]:
    """``shmloader scan`` of ``listing`` (2 workers, 5-s probe timeout) in a child process while
    a thread runs ``watch(scan's pid, stop)`` on it; the finished process and its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "shmloader", "scan", str(listing), "--out", str(out),
                             "--workers", "2", "--quiet", "--timeout", "5"], stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(proc.pid, stop))
    watcher.start()
    try:
        _, err = proc.communicate(timeout=150)
    finally:
        stop.set()
        watcher.join()
        proc.kill()
    return proc, err


def replace_once_opened(root: int, path: str, by: str, stop: threading.Event, opened: list) -> None:
    """Put a copy of ``by`` in ``path``'s place once a process below ``root`` has ``path`` open
    (that process keeps reading the old file)."""
    while not stop.is_set():
        try:
            kids = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for kid in kids:
            try:
                if any(f.path == path for f in kid.open_files()):
                    shutil.copy(by, path + ".new")
                    os.replace(path + ".new", path)
                    opened.append(kid.pid)
                    return
            except psutil.Error:
                pass
        stop.wait(0.02)


def kill_whoever_opens(root: int, path: str, stop: threading.Event, killed: list) -> None:
    """SIGKILL every process below ``root`` that has ``path`` open, as a decoder's segfault or
    the kernel's OOM killer ends a probe: the file crashes whatever probes it."""
    while not stop.is_set():
        try:
            kids = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for kid in kids:
            try:
                if any(f.path == path for f in kid.open_files()):
                    kid.kill()
                    killed.append(kid.pid)
            except psutil.Error:
                pass
        stop.wait(0.02)


def test_a_probe_that_crashes_gets_its_row_and_the_rest_go_on(dataset, tmp_path):
    """A file whose every probe dies (its process SIGKILLed as soon as it opens the file) gets
    'probe crashed'. A dying process breaks the whole probing pool, so the probe running beside
    it (a file that never ends) fails with it: that file is probed again alone and gets its own
    answer, 'probe took over 10 s' (twice --timeout, alone), not the crash. The files after them
    get their rows, in input order."""
    files = {os.path.basename(p): str(p) for p in dataset.glob("*/*")}
    hangs, crashes = never_ending(tmp_path / "hangs.dv"), never_ending(tmp_path / "crashes.dv")
    listed = [files["plain.mp4"], hangs, crashes, files["rotated.mp4"], files["gap.mkv"]]
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    out = tmp_path / "m.csv"
    killed: list = []
    proc, err = scan_watched(tmp_path / "list.txt", out, lambda pid, stop: kill_whoever_opens(pid, crashes, stop, killed))
    assert proc.returncode == 0, err
    rows = rows_of(out)
    assert [row["path"] for row in rows] == listed
    assert rows[1]["problem"] == "unreadable: probe took over 10 s", rows[1]
    assert rows[2]["problem"] == "unreadable: probe crashed", rows[2]
    assert all(rows[i][c] == "" for i in (1, 2) for c in ("frames", "decoder", "width"))
    for row in rows[:1] + rows[3:]:
        assert (row["decoder"], row["problem"]) == WANT[os.path.basename(row["path"])], row
        assert int(row["frames"]) == 60
    # Probed in a pool and then alone (and, where it met the never-ending file in the first pool,
    # once more in the pool after that file's timeout). A dying process still shows the file
    # open for a moment, so it may be killed more than once.
    assert len(set(killed)) >= 2, killed
    assert "5 files in" in err and "unreadable: 2" in err


def test_ctrl_c_stops_a_scan_in_one_line_and_keeps_its_rows(dataset, tmp_path):
    """Ctrl-C to the process group (a terminal's) while a probe hangs: exit 130 and one line, no
    traceback, no process left, and the manifest keeps the rows written before it; the same
    command again goes on from there."""
    import signal

    files = {os.path.basename(p): str(p) for p in dataset.glob("*/*")}
    listed = [files["plain.mp4"], never_ending(tmp_path / "stuck.dv"), files["rotated.mp4"]]
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    out = tmp_path / "m.csv"
    p = subprocess.Popen([sys.executable, "-m", "shmloader", "scan", str(tmp_path / "list.txt"), "--out", str(out),
                          "--workers", "1", "--quiet", "--timeout", "60"], stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while (not out.exists() or len(out.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    kids = psutil.Process(p.pid).children(recursive=True)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip().splitlines() == [
        f"shmloader scan: stopped; {out} lists the files probed, and the same command again probes the rest"], err
    assert not psutil.wait_procs(kids, timeout=10)[1]
    assert [row["path"] for row in rows_of(out)] == listed[:1]
    assert sorted(os.listdir(tmp_path)) == ["list.txt", "m.csv", "stuck.dv"]


# The scan process's own peak memory may differ by this much between 10 000 and 50 000 files
# (measured: under 1 MiB; below some thousands of files the peak is still rising). Keeping what it has written would not fit: the 40 000 more paths of
# ~190 characters are ~7 MiB as strings alone, their rows ~55 MiB.
_FLAT_MIB = 4

PEAK = textwrap.dedent("""
    import json, sys
    from shmloader.tools.scan import scan

    summary = scan([sys.argv[1]], sys.argv[2], workers=2, progress=False)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))  # kB
    print(json.dumps({"rows": summary["rows"], "unreadable": summary["unreadable"], "peak_kib": peak}))
""")


@pytest.mark.timeout(600)
def test_memory_stays_flat_in_the_number_of_files(tmp_path):
    """README: "memory stays flat in the number of files". Lists of 10 000 and of 50 000 paths
    (files that are not there: each probe is quick, and every path gets its 'unreadable' row):
    the scan process's peak resident memory is the same within a few MiB."""
    from ._examples import run_child

    peaks = {}
    for n in (10_000, 50_000):
        listed = tmp_path / f"{n}.txt"
        with open(listed, "w") as f:
            f.writelines(f"{tmp_path}/missing/{'d' * 150}/{i:07d}.mp4\n" for i in range(n))
        r = run_child(PEAK, str(listed), str(tmp_path / f"{n}.csv"), timeout=280)
        assert r["rows"] == r["unreadable"] == n
        with open(tmp_path / f"{n}.csv") as f:
            assert sum(1 for _ in f) == n + 1
        peaks[n] = r["peak_kib"] / 1024
    assert peaks[50_000] - peaks[10_000] < _FLAT_MIB, peaks


def test_a_file_decord_refuses_goes_to_pyav(tmp_path):
    """A row that sends a raw H.264 stream (no container: decord cannot count its frames) to
    decord: decord's error sends it to PyAV, once per worker (then PyAV straight away), every
    clip exact. When neither reads it (the same byte count and mtime, other bytes), the error
    gives both reasons."""
    from shmloader.samples import write_video

    path = tmp_path / "raw.h264"
    write_video(path, 2, frames=40, size=(96, 128), gop=12)
    out = str(tmp_path / "m.csv")
    scan([path], out, workers=1)
    (row,) = rows_of(out)
    assert (row["decoder"], row["problem"]) == ("pyav", "no usable timestamps")
    write_rows(out, {**row, "decoder": "decord"})
    got, stats = load(out, clips_per_video=4)
    assert len(got) == 4 and stats["decoder_fallbacks"] == 1 and not stats.get("decord"), stats
    assert stats["pyav"] == 2  # two batches of two clips, the first one after decord's refusal
    for s in got:
        ids, numbers = codes(s["video"])
        assert (ids == 2).all()
        np.testing.assert_array_equal(numbers, s["frames"])
    st = os.stat(path)
    path.write_bytes(os.urandom(st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    clips = shmloader.VideoClips.from_csv(out, label_column=None, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=1, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError) as e:
            list(loader)
    assert str(path) in str(e.value) and "; decord: " in str(e.value), str(e.value)


def test_a_scan_run_again_counts_every_row_and_probes_what_changed(tmp_path):
    """A second run over the same inputs: the summary, --fail-on and the exit status cover the
    earlier rows too; a file fixed since is probed again (its size and modification time
    changed), a deeper --check probes every row again, and a row whose probe timed out or that
    predates the check column is not kept as a fact."""
    from shmloader.video.samples import write_video

    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(3):
        write_video(str(bad / f"v{i}.mp4"), i, frames=8)
    (bad / "text.mp4").write_text("not a video\n")
    (bad / "zero.mp4").write_bytes(b"")
    out = tmp_path / "m.csv"
    first = scan([bad], out)
    assert "5 files in" in first.stderr and "3 readable" in first.stderr and "2 unreadable" in first.stderr
    again = scan([bad], out, expect_ok=False, extra=["--fail-on", "unreadable"])
    assert again.returncode == 1, again.stderr
    assert (f"5 files in {out}: 3 readable (3 by decord), 2 unreadable; 5 rows from an earlier run: 5 kept, "
            "0 probed again") in again.stderr, again.stderr
    assert "exit 1: 2 files with a problem of --fail-on unreadable" in again.stderr

    write_video(str(bad / "text.mp4"), 7, frames=8)  # fixed since: another size and time
    fixed = scan([bad], out, expect_ok=False, extra=["--fail-on", "unreadable"])
    assert "4 readable" in fixed.stderr and "1 unreadable" in fixed.stderr, fixed.stderr
    assert "5 rows from an earlier run: 4 kept, 1 probed again (changed since: 1)" in fixed.stderr
    rows = {os.path.basename(r["path"]): r for r in rows_of(out)}
    assert rows["text.mp4"]["problem"] == "" and rows["text.mp4"]["frames"] == "8"
    assert rows["zero.mp4"]["problem"].startswith("unreadable")
    with pytest.warns(UserWarning, match="1 of 5 rows"):  # only the empty file is left out now
        clips = shmloader.VideoClips.from_csv(str(out), clip_len=4)
    assert len(clips) == 4 and any(p.endswith("text.mp4") for p in clips.paths)

    deeper = scan([bad], out, expect_ok=False, extra=["--fail-on", "unreadable", "--check", "frames"])
    assert "5 probed again (deeper --check frames: 5)" in deeper.stderr, deeper.stderr
    assert {r["check"] for r in rows_of(out)} == {"frames"}
    shallower = scan([bad], out, expect_ok=False, extra=["--fail-on", "unreadable", "--check", "headers"])
    assert "5 kept, 0 probed again" in shallower.stderr and {r["check"] for r in rows_of(out)} == {"frames"}

    # A timed-out row and the rows of a manifest from before the check column are probed again.
    old = [{k: v for k, v in r.items() if k != "check"} for r in rows_of(out)]
    old[0]["problem"], old[0]["frames"] = "unreadable: probe took over 0.2 s", ""
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, [c for c in COLUMNS if c != "check"])
        w.writeheader()
        w.writerows(old)
    redo = scan([bad], out, expect_ok=False, extra=["--fail-on", "unreadable"])
    assert "5 probed again (no check recorded: 4, earlier probe timed out or crashed: 1)" in redo.stderr
    assert list(rows_of(out)[0]) == list(COLUMNS) and rows_of(out)[0]["problem"] == ""
    assert not os.path.exists(f"{out}.scanning")


def test_a_script_that_scans_at_its_top_level_runs_once(tmp_path):
    """scan's probing workers never run the caller's script (multiprocessing would, in every
    child): a script without ``if __name__ == "__main__"`` gets its rows, and runs once."""
    from shmloader.samples import write_video

    for i in range(3):
        write_video(tmp_path / f"v{i}.mp4", i, frames=12)
    script = tmp_path / "scan_here.py"
    script.write_text(f"""import os
from shmloader.tools.scan import scan
with open({str(tmp_path / "runs.txt")!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
scan([{str(tmp_path)!r}], {str(tmp_path / "manifest.csv")!r}, workers=2)
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, check=False,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(shmloader.__file__))})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert len((tmp_path / "runs.txt").read_text().split()) == 1
    with open(tmp_path / "manifest.csv", newline="") as f:
        assert [row["frames"] for row in csv.DictReader(f)] == ["12"] * 3


def _track(path) -> tuple[float, float]:
    """(first sample's time after the video's first frame, seconds to the end of the last frame)
    of ``path``'s audio, from a decode of the whole track (the loader's timeline: the video's
    first timestamp is 0)."""
    import av
    from fractions import Fraction

    with av.open(os.fspath(path)) as c:
        v = c.streams.video[0]
        zero = min(float(p.pts * Fraction(v.time_base)) for p in c.demux(v) if p.pts is not None)
    with av.open(os.fspath(path)) as c:
        s = c.streams.audio[0]
        frames = [(float(f.pts * Fraction(s.time_base)), f.samples / f.sample_rate) for f in c.decode(s)]
    return frames[0][0] - zero, frames[-1][0] + frames[-1][1] - frames[0][0]


def test_scan_reports_each_files_audio_stream(tmp_path, monkeypatch):
    """AAC in MP4 (44.1 kHz stereo), PCM in MOV (48 kHz mono), no audio, and audio that starts
    0.4 s after the first frame: codec, rate, channels, where the sound starts after the first
    frame and how long it lasts, as a decode of the whole track says; and the loader, reading
    the manifest, hears silence up to that start."""
    from shmloader.samples import write_video

    from .test_audio import write_av

    write_av(tmp_path / "a_aac.mp4", "aac", 44100, 2)
    write_av(tmp_path / "b_pcm.mov", "pcm_s16le", 48000, 1)
    write_video(tmp_path / "c_silent.mp4", 3, frames=20)
    write_av(tmp_path / "d_late.mp4", "aac", 44100, 2, audio_from=0.4)
    write_av(tmp_path / "e_late.mov", "pcm_s16le", 44100, 2, audio_from=0.4)
    out = tmp_path / "manifest.csv"
    scan([tmp_path], out)
    rows = {os.path.basename(r["path"]): r for r in rows_of(out)}
    assert list(rows_of(out)[0]) == list(COLUMNS) and COLUMNS[-5:] == (
        "audio_codec", "audio_rate", "audio_channels", "audio_start", "audio_seconds")
    audio = {name: tuple(row[c] for c in COLUMNS[-5:-2]) for name, row in rows.items()}
    assert audio == {"a_aac.mp4": ("aac", "44100", "2"), "b_pcm.mov": ("pcm_s16le", "48000", "1"),
                     "c_silent.mp4": ("", "", ""), "d_late.mp4": ("aac", "44100", "2"),
                     "e_late.mov": ("pcm_s16le", "44100", "2")}
    assert rows["c_silent.mp4"]["audio_start"] == rows["c_silent.mp4"]["audio_seconds"] == ""
    assert (rows["b_pcm.mov"]["audio_start"], rows["b_pcm.mov"]["audio_seconds"]) == ("0", "2")  # 50 frames
    assert (rows["e_late.mov"]["audio_start"], rows["e_late.mov"]["audio_seconds"]) == ("0.4", "1.6")
    for name in ("a_aac.mp4", "d_late.mp4"):
        start, seconds = _track(tmp_path / name)
        assert float(rows[name]["audio_start"]) == pytest.approx(start, abs=1e-6), name
        assert float(rows[name]["audio_seconds"]) == pytest.approx(seconds, abs=1e-6), name
    # The AAC track that starts late begins with the encoder's priming, kept a little before 0.4 s.
    assert 0.37 < float(rows["d_late.mp4"]["audio_start"]) < 0.4
    assert all(r["problem"] == "" for r in rows.values())
    from ._examples import doc_example

    namespace: dict = {}
    monkeypatch.chdir(tmp_path)  # the guide's example reads manifest.csv here
    exec(doc_example("scan-audio"), namespace)
    assert [os.path.basename(p) for p in namespace["silent"]] == ["c_silent.mp4"]
    assert [os.path.basename(p) for p in namespace["late"]] == ["d_late.mp4", "e_late.mov"]

    # The loader, from the manifest, places the late sound where the row says it starts.
    clips = shmloader.VideoClips.from_csv(str(out), clip_len=20, clips_per_video=3, sampling="uniform",
                                          audio_rate=16000)
    v = clips.paths.index(str(tmp_path / "e_late.mov"))
    got = clips.reader().read([3 * v])
    assert got["frames"][0][0] == 0 and got["audio_len"][0] == round(20 / 25 * 16000)
    sound = np.flatnonzero(np.abs(got["audio"][0, :, 0]) > 1e-3)
    assert abs(int(sound[0]) - 0.4 * 16000) <= 2, sound[0]


def test_a_rerun_over_a_manifest_from_before_the_audio_columns_fills_them(tmp_path):
    """An earlier manifest without the audio columns is a scan of these inputs: its rows are
    kept (not probed again: a changed cell stays) and get their audio cells; one without the
    check column either is probed again whole."""
    from .test_audio import write_av

    write_av(tmp_path / "a.mp4", "aac", 44100, 2)
    write_av(tmp_path / "b.mov", "pcm_s16le", 48000, 1, audio_from=0.4)
    (tmp_path / "c.mp4").write_text("not a video\n")
    out = tmp_path / "m.csv"
    scan([tmp_path], out)
    fresh = rows_of(out)
    assert fresh[1]["audio_start"] == "0.4" and fresh[2]["problem"].startswith("unreadable")
    old = [{k: v for k, v in r.items() if not k.startswith("audio_")} for r in fresh]
    old[0]["pix_fmt"] = "kept"  # a kept row keeps it; a probe would write yuv420p
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, [c for c in COLUMNS if not c.startswith("audio_")])
        w.writeheader()
        w.writerows(old)
    r = scan([tmp_path], out)
    assert "3 rows from an earlier run: 3 kept, 0 probed again" in r.stderr, r.stderr
    assert list(rows_of(out)[0]) == list(COLUMNS)
    assert rows_of(out) == [dict(fresh[0], pix_fmt="kept"), *fresh[1:]]

    oldest = [{k: v for k, v in r.items() if k != "check"} for r in old]
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, [c for c in COLUMNS if c != "check" and not c.startswith("audio_")])
        w.writeheader()
        w.writerows(oldest)
    r = scan([tmp_path], out)
    assert "3 probed again (no check recorded: 3)" in r.stderr, r.stderr
    assert rows_of(out) == fresh


@pytest.mark.parametrize("check", ["headers", "keyframes"])
def test_damaged_audio_is_a_problem_named_by_its_time(tmp_path, check):
    """Audio packets the decoder refuses (0.8-1.0 s): ``damaged audio at T s`` where the scan
    decodes the whole track (deeper than ``--check headers``, which reads its ends only), a
    problem of the kind ``--fail-on damaged`` counts; the video's decoder and numbers stay."""
    from .test_audio import _damage_audio, write_av

    path = write_av(tmp_path / "a.mp4", "aac")
    _damage_audio(path, 0.8, 1.0)
    out = tmp_path / "m.csv"
    r = scan([path], out, expect_ok=check == "headers", extra=["--check", check, "--fail-on", "damaged"])
    (row,) = rows_of(out)
    assert (row["frames"], row["decoder"], row["audio_codec"]) == ("50", "decord", "aac")
    if check == "headers":
        assert row["problem"] == ""
    else:
        assert re.fullmatch(r"damaged audio at 0\.8\d\d s", row["problem"]), row["problem"]
        assert "exit 1: 1 file with a problem of --fail-on damaged" in r.stderr, r.stderr
