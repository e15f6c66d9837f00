"""Decoding less: several clips of a video per decode pass, on long-GOP videos (issue #10).

A random clip must be decoded from the keyframe before it; on videos with one keyframe every
250 frames (phone and web video) that is most of the work. This benchmark measures, in one
run with the repetitions interleaved, what the three ways shmloader decodes several clips in
one pass buy over decoding each clip on its own, at the same number of worker processes W:

* ``separate``: one clip per sample, ``VideoClips(clips_per_video=K)`` — every clip pays its
  own random access (this is also ``group_clips=False``);
* ``clips_per_sample=K``: one sample holds K clips of a video, decoded in ONE ``get_batch``
  over the sorted union of their frames;
* ``group_clips=True``: one clip per sample, the ``clips_per_video`` samples of a video decoded
  together by one worker and spread over the batches of a shuffle window;
* references: decord decoding each random clip with its own reader in W processes (no loader:
  ``limit.py``'s physical limit), and the peers of ``loaders.py`` on the same clips: tf.data
  ``map(numpy_function, AUTOTUNE)`` and, when torch imports, torch's DataLoader;
* evaluation: 10 uniform clips x 3 crops of each video as one sample (``eval_loader``) against
  the 30 views decoded one ``get_batch`` each, straight with decord;
* TSN segments (issue #26): ``VideoClips(clip_len=N, sampling="segments")``, N frames spread
  over the whole video decoded in one pass per sample, against the same N frames decoded with
  decord alone in one ``get_batch`` and in N separate ``get_batch`` calls (N seeks, as a
  hand-written Dataset that reads frame by frame does). A sample's cost is what counts here: the
  segment rows' "clips" are samples of N frames.

For every row: clips/s at the consumer (wall) and CPU ms per delivered clip, counting every
process of the run (main + its descendants, psutil ``cpu_times``). Every row delivers the same
clips: ``clip_len`` frames every ``frame_step``, ``side x side``. Writes ``<out>/<name>.json``,
``.md`` and ``.png`` (``harness``, ``report``).

    python bench/recipes.py                            # the full run, ~10 minutes on 2 cores
    python bench/recipes.py --workers 4 --name recipes-cpu4
    python bench/recipes.py --quick                    # a smoke run of a few seconds per row
    python bench/recipes.py --rows segments-8,segments-8-pyav,segments-8-alone,segments-8-seeks --name segments-cpu2

Two kinds of video, both written here with frame codes (``shmloader.samples``) and one keyframe
every ``--gop`` frames: ``codes``, the sample videos as ``make_videos`` writes them (flat cells:
~20 kbit/s, frames between keyframes cost almost nothing to decode), and ``textured``, the same
codes over a panning texture with sensor noise (~500 kbit/s at 320x240, the bit rate of web video
of that size), where each frame between a keyframe and a clip costs real decoding work.

Like ``cpu_vs_workers.py``, this module imports neither TensorFlow nor torch at the top: the
processes it spawns import it as their main module.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time

import numpy as np

import harness
import report
from report import fmt, table
from workloads import ClipSet, Workload

CONTENTS = ("codes", "textured")
# Targets of issue #10, each a ratio of medians (see `targets`).
K4_CPU_TARGET = 0.5  # CPU per clip, clips_per_sample=4 / separate: at most
GROUP_TARGET = 1.8  # clips/s, group_clips=True / False, clips_per_video=4, same W: at least
EVAL_TARGET = 8.0  # ms per video, 30 separate decodes / one pass: at least
SEGMENTS_TARGET = 1.0  # CPU per sample, segments in one pass / N separate seeks: at most (issue #26)

# Evaluation protocol (SlowFast / X3D test time): short side 128 here (for 112 crops), 10 uniform
# clips, 3 crops along the long side.
EVAL_SCALE = 128
EVAL_CLIPS = 10
EVAL_VIEWS = 3 * EVAL_CLIPS
# Names per video in the evaluation list (see eval_names): more entries than one run visits.
_EVAL_NAMES = 50



def options(p) -> None:
    p.add_argument("--workers", type=int, default=2, help="worker processes W of every row")
    p.add_argument("--ks", type=harness.ints, default=[2, 4, 10], help="clips_per_sample values K")
    p.add_argument("--group", type=harness.ints, default=[4, 10],
                   help="clips_per_video values run with group_clips=True and False")
    p.add_argument("--segments", type=harness.ints, default=[8],
                   help="segment counts N of the TSN rows (sampling='segments', N frames per sample)")
    p.add_argument("--contents", type=harness.names(CONTENTS), default=list(CONTENTS),
                   help="kinds of video: codes (make_videos' flat frame codes), textured")
    p.add_argument("--duration", type=float, default=4.0, help="seconds measured per run, at least")
    p.add_argument("--warmup", type=int, default=1, help="batches consumed before measuring")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-batch-size", type=int, default=2, help="videos per evaluation batch")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--side", type=int, default=112, help="clips are side x side")
    harness.video_options(p, "bench-recipes", count=12, frames=300, codec=False)
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--gop", type=int, default=250, help="one keyframe every this many frames")
    p.add_argument("--no-peers", action="store_true", help="leave out tf-map and torch")
    p.add_argument("--decoders", type=harness.names(("decord", "pyav")), default=["decord", "pyav"],
                   help="decoders of the loader rows: pyav adds the separate and grouped rows with decoder='pyav'")
    p.add_argument("--rows", type=lambda t: [x for x in t.split(",") if x], default=None,
                   help="run only these rows (keys as in the json: separate-4,sample-4,group-4,...)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 repetition of 0.5 s, 4 short videos, K=4, group 4 and 8 segments only")


# ---------------------------------------------------------------------------- videos
def make_recipe_videos(args, content: str) -> tuple[ClipSet, dict]:
    """The videos of one kind, written once into the cache; (clips, what they are)."""
    import decord

    from workloads import make_clipset

    clips = make_clipset(args.cache, args.video_count, args.video_frames, args.video_size, "libx264", content,
                         fps=args.fps, gop=args.gop)
    paths = clips.paths
    keys = [int(k) for k in decord.VideoReader(paths[0], num_threads=1).get_key_indices()]
    kbps = statistics.median(os.path.getsize(p) for p in paths) * 8 / 1e3 / (args.video_frames / args.fps)
    h, w = args.video_size
    about = {"folder": os.path.relpath(os.path.dirname(paths[0]), harness.ROOT), "count": len(paths),
             "frames": args.video_frames, "size": f"{h}x{w}", "fps": args.fps, "gop": args.gop,
             "codec": "libx264 crf 18 veryfast", "keyframes_of_first": keys, "median_kbit_per_s": round(kbps),
             "content": ("frame codes only (shmloader.samples.make_videos)" if content == "codes" else
                         "frame codes over a panning texture with noise (bench/workloads.py write_textured)")}
    if keys != list(range(0, args.video_frames, args.gop)):
        raise SystemExit(f"{paths[0]}: keyframes at {keys}, expected every {args.gop} frames")
    return clips, about


def anatomy(paths: list[str], side: int, gop: int, clip_len: int, frame_step: int) -> dict:
    """What decord's work is made of on these videos, in CPU ms of one process (median over a
    few videos): opening a reader, decoding a frame that is not delivered (reaching frame
    ``gop - 1`` from the keyframe), and delivering a frame (scaled to ``side x side``, copied
    out). A random clip costs about open + (frames skipped) x skip + clip_len x deliver; one
    pass over K clips shares the open and the skipping."""

    def cpu_ms(fn) -> float:
        t = time.process_time()
        fn()
        return 1e3 * (time.process_time() - t)

    def reader(p):
        return _reader(p, side, side)

    n = len(reader(paths[0]))
    last = min(gop, n) - 1
    rows: dict[str, list[float]] = {"open": [], "first": [], "reach": [], "all": []}
    for p in paths[: min(len(paths), 4)]:
        rows["open"].append(cpu_ms(lambda: reader(p)))
        rows["first"].append(cpu_ms(lambda: reader(p).get_batch([0]).asnumpy()))
        rows["reach"].append(cpu_ms(lambda: reader(p).get_batch([last]).asnumpy()))
        rows["all"].append(cpu_ms(lambda: reader(p).get_batch(list(range(last + 1))).asnumpy()))
    med = {k: statistics.median(v) for k, v in rows.items()}
    skip = max(0.0, (med["reach"] - med["first"]) / last)
    deliver = max(0.0, (med["all"] - med["reach"]) / last)
    span = (clip_len - 1) * frame_step + 1
    # Frames decoded but not delivered for a random clip, on average over its starts: from the
    # keyframe to the start, and those between the clip's frames (frame_step > 1).
    between = span - clip_len
    skipped = float(np.mean(np.arange(n - span + 1) % gop)) + between
    return {"open_ms": round(med["open"], 2), "skip_ms_per_frame": round(skip, 3),
            "deliver_ms_per_frame": round(deliver, 3), "mean_frames_skipped_per_random_clip": round(skipped, 1),
            "random_clip_model_ms": round(med["open"] + skipped * skip + clip_len * deliver, 1),
            "clip_at_keyframe_model_ms": round(med["open"] + between * skip + clip_len * deliver, 1)}


def eval_names(paths: list[str], copies: int) -> list[str]:
    """Each video under ``copies`` names (symbolic links beside it, made once): an evaluation
    list as long as a measurement needs in which every entry is a file not seen before, as in
    an evaluation pass over distinct videos (per-path caches, such as the native size a worker
    keeps for ``scale=``, never hit)."""
    out = []
    for c in range(copies):
        for p in paths:
            folder = os.path.join(os.path.dirname(p), "eval-names")
            os.makedirs(folder, exist_ok=True)
            link = os.path.join(folder, f"{c:03d}-{os.path.basename(p)}")
            if not os.path.lexists(link):
                os.symlink(os.path.join("..", os.path.basename(p)), link)
            out.append(link)
    return out


def prepare(args, notes: list[str]) -> dict:
    """The videos of each kind, under their own names and under many for evaluation; torch or not."""
    from loaders import torch_missing

    if args.quick:
        args.reps, args.duration, args.ks, args.group, args.segments = 1, 0.5, [4], [4], [8]
        args.video_count, args.video_frames = 4, 120
        args.gop = min(args.gop, 100)
    why_no_torch = None if args.no_peers else torch_missing()
    if why_no_torch:
        print(f"note: no torch DataLoader row: {why_no_torch}", file=sys.stderr)
    ctx = {"have_torch": not args.no_peers and why_no_torch is None, "why_no_torch": why_no_torch,
           "videos": {}, "clips": {}, "eval": {}}
    for content in args.contents:
        clips, ctx["videos"][content] = make_recipe_videos(args, content)
        ctx["videos"][content]["anatomy"] = anatomy(list(clips.paths), args.side, args.gop, args.clip_len,
                                                    args.frame_step)
        ctx["clips"][content] = clips
        named = eval_names(list(clips.paths), _EVAL_NAMES)
        ctx["eval"][content] = ClipSet(tuple(named), tuple(i % 2 for i in range(len(named))))
    ctx["wl"] = Workload("recipes", args.clip_len, (args.side, args.side), 0, "", args.frame_step)
    ctx["wl_segments"] = {n: Workload(f"segments-{n}", n, (args.side, args.side), 0, "", 1) for n in args.segments}
    return ctx


# ------------------------------------------------------------- evaluation views apart
def _reader(path: str, height: int, width: int):
    import decord

    return decord.VideoReader(path, width=width, height=height, num_threads=1)


@functools.lru_cache(maxsize=None)
def _native_size(path: str) -> tuple[int, int]:
    """(height, width), learnt as shmloader's workers learn it (one frame) and kept, as they do."""
    shape = _reader(path, -1, -1).get_batch([0]).shape
    return int(shape[1]), int(shape[2])


def eval_views_apart(clips: ClipSet, wl: Workload, video: int) -> None:
    """The evaluation views of one video, each decoded on its own: one ``get_batch`` per view
    (a clip is decoded again for each of its 3 crops, as 30 separate samples would be). One
    reader for the video, which is the cheaper way (a reader per view adds its opening).
    The views are the ones ``eval_loader`` delivers."""
    from shmloader.sampling import clip_frames, crop_windows, scaled_size

    path = clips.paths[video % len(clips.paths)]
    h, w = scaled_size(*_native_size(path), EVAL_SCALE)
    reader = _reader(path, h, w)
    rng = np.random.default_rng(0)  # unused by uniform clips and three crops
    frames = clip_frames(len(reader), None, clip_len=wl.clip_len, frame_step=wl.frame_step,
                         fps=None, sampling="uniform", clips=list(range(EVAL_CLIPS)),
                         total_clips=EVAL_CLIPS, short_video="error", rng=rng)
    corners = crop_windows(h, w, wl.size, "three", EVAL_CLIPS, rng)
    s = wl.size[0]
    for k in range(EVAL_CLIPS):
        for y, x in corners[k]:
            clip = reader.get_batch(frames[k].tolist()).asnumpy()
            np.ascontiguousarray(clip[:, y : y + s, x : x + s])


def eval_steps(clips: ClipSet, wl: Workload, shard: int, shards: int):
    """One step of the evaluation reference: the views of this process's next video."""
    videos = iter(range(shard, 10**9, shards))
    return lambda: eval_views_apart(clips, wl, next(videos))


# ------------------------------------------------------------- segments apart (issue #26)
@functools.lru_cache(maxsize=None)
def _times(path: str) -> np.ndarray:
    """The frame times shmloader's workers sample segments by (its probe), kept per file as they keep it."""
    from shmloader.video.probe import probe

    return probe(path).times()


def decode_segments(clips: ClipSet, wl: Workload, seeks: bool, epoch: int, sample: int) -> np.ndarray:
    """The N frames the loader's ``sampling="segments"`` draws for (epoch, sample), with decord
    alone: one ``get_batch`` over them, or with ``seeks`` one ``get_batch`` per frame (decord
    seeks to the keyframe before each)."""
    from workloads import SEED

    from shmloader.sampling import clip_frames

    path, _ = clips.video(sample)
    reader = _reader(path, *wl.size)
    rng = np.random.default_rng((SEED, epoch, sample))
    frames = clip_frames(len(reader), _times(path), clip_len=wl.clip_len, frame_step=1, fps=None,
                         sampling="segments", clips=[0], total_clips=1, short_video="repeat_last", rng=rng)[0]
    if seeks:
        return np.stack([reader.get_batch([int(f)]).asnumpy()[0] for f in frames])
    return reader.get_batch(frames.tolist()).asnumpy()


def segment_steps(clips: ClipSet, wl: Workload, seeks: bool, shard: int, shards: int):
    """One step: the next sample of this process's shard of the sample stream, decoded apart."""
    from workloads import sample_keys

    keys = sample_keys(len(clips), shard, shards)
    return lambda: decode_segments(clips, wl, seeks, *next(keys))


# ------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration. ``clips``: clips delivered per sample (views, for evaluation)."""

    key: str  # short, stable: used to pair repetitions and compute ratios
    label: str
    kind: str  # "loader", "tf-map", "torch", "alone", "eval-loader", "eval-alone"
    options: tuple = ()  # VideoClips keyword arguments
    clips_per_video: int = 1
    clips: int = 1
    group: str = ""


def plan(args, ctx: dict) -> list[list[tuple[str, Row]]]:
    """One block: every row on every kind of video."""
    rows = []
    for cpv in sorted(set(args.group) | {4}):
        rows.append(Row(f"separate-{cpv}", f"separate: 1 clip/sample, clips_per_video={cpv} "
                        "(group_clips=False)", "loader", (("clips_per_video", cpv),), cpv, 1, "separate"))
    # Enough samples per epoch for one batch (the quick run has few videos).
    per_video = -(-args.batch_size // args.video_count)
    for k in args.ks:
        rows.append(Row(f"sample-{k}", f"clips_per_sample={k}: one sample of {k} clips, one pass",
                        "loader", (("clips_per_video", per_video), ("clips_per_sample", k)), per_video, k,
                        "one sample of K clips"))
    for cpv in args.group:
        rows.append(Row(f"group-{cpv}", f"group_clips=True, clips_per_video={cpv}: 1 clip/sample, "
                        "a video's clips in one pass", "loader",
                        (("clips_per_video", cpv), ("group_clips", True)), cpv, 1, "group_clips"))
    if "pyav" in args.decoders:  # the same rows with PyAV, the loader's second decoder, on every file
        for cpv in sorted({4} | set(args.group)):
            rows.append(Row(f"separate-{cpv}-pyav", f"separate, decoder='pyav': 1 clip/sample, clips_per_video={cpv}",
                            "loader", (("clips_per_video", cpv), ("decoder", "pyav")), cpv, 1, "PyAV"))
        for cpv in args.group:
            rows.append(Row(f"group-{cpv}-pyav", f"group_clips=True, decoder='pyav', clips_per_video={cpv}",
                            "loader", (("clips_per_video", cpv), ("group_clips", True), ("decoder", "pyav")),
                            cpv, 1, "PyAV"))
    rows.append(Row("decord-alone", "decord alone: each random clip its own reader, W processes, "
                    "no loader", "alone", (), 4, 1, "reference"))
    if not args.no_peers:
        rows.append(Row("tf-map", "tf.data map(numpy_function, AUTOTUNE), each clip on its own",
                        "tf-map", (), 4, 1, "reference"))
        if ctx["have_torch"]:
            rows.append(Row("torch", "torch DataLoader(num_workers=W), each clip on its own",
                            "torch", (), 4, 1, "reference"))
    for n in args.segments:
        seg = (("sampling", "segments"),)
        rows.append(Row(f"segments-{n}", f"segments: {n} frames over the whole video (sampling='segments'), "
                        "one pass per sample", "segments-loader", seg, 4, 1, "segments"))
        if "pyav" in args.decoders:
            rows.append(Row(f"segments-{n}-pyav", f"segments, decoder='pyav': {n} frames, one pass per sample",
                            "segments-loader", seg + (("decoder", "pyav"),), 4, 1, "segments"))
        rows.append(Row(f"segments-{n}-alone", f"segments, decord alone: the same {n} frames in one get_batch, "
                        "W processes, no loader", "segments-alone", (("seeks", False),), 4, 1, "segments"))
        rows.append(Row(f"segments-{n}-seeks", f"segments, decord alone: the same {n} frames, one get_batch "
                        f"(a seek) per frame, W processes", "segments-alone", (("seeks", True),), 4, 1, "segments"))
    rows.append(Row("eval-one-pass", f"eval: {EVAL_CLIPS} uniform clips x 3 crops as one sample "
                    "(eval_loader), one pass per video", "eval-loader",
                    (("clips_per_video", 1), ("clips_per_sample", EVAL_CLIPS), ("crop_at", "three"),
                     ("scale", EVAL_SCALE), ("crop", (args.side, args.side)), ("size", None)),
                    1, EVAL_VIEWS, "evaluation"))
    rows.append(Row("eval-apart", f"eval: the same {EVAL_VIEWS} views, one decord get_batch each, "
                    "W processes", "eval-alone", (), 1, EVAL_VIEWS, "evaluation"))
    if args.rows:
        rows = [r for r in rows if r.key in args.rows]
    ctx["rows"] = rows
    return [[(content, row) for content in args.contents for row in rows]]


def run_row(cell: tuple[str, Row], rep: int, args, ctx: dict) -> dict:
    import limit
    import loaders
    from measure import Result, run_pipeline

    content, row = cell
    clips, evals, wl, w = ctx["clips"][content], ctx["eval"][content], ctx["wl"], args.workers
    res = Result(row.key, content, str(w), rep)
    res.extra.update(label=row.label, clips_per_sample=row.clips, clips_per_video=row.clips_per_video)
    try:
        if row.key.startswith("segments-"):
            wl = ctx["wl_segments"][int(row.key.split("-")[1])]
        if row.kind == "alone":
            limit.physical_limit(clips, wl, w, args.duration, res)
        elif row.kind == "segments-alone":
            seeks = dict(row.options)["seeks"]
            limit.run_timed(segment_steps, lambda i: (clips, wl, seeks, i, w), w, args.duration, res, 1,
                            wl.clip_len, wl.clip_bytes)
        elif row.kind == "eval-alone":
            limit.run_timed(eval_steps, lambda i: (evals, wl, i, w), w, args.duration, res, EVAL_VIEWS,
                            wl.clip_len, wl.clip_bytes)
        else:
            make = {"loader": lambda: loaders.shm(clips, wl, w, args.batch_size, whole_epochs=True, **dict(row.options)),
                    "segments-loader": lambda: loaders.shm(clips, wl, w, args.batch_size, whole_epochs=True,
                                                           **dict(row.options)),
                    "eval-loader": lambda: loaders.shm(evals, wl, w, args.eval_batch_size, evaluation=True,
                                                       **dict(row.options)),
                    "tf-map": lambda: loaders.tf_map(clips, wl, w, args.batch_size),
                    "torch": lambda: loaders.torch_loader(clips, wl, w, args.batch_size)}[row.kind]
            run_pipeline(make, res, clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                         warmup=args.warmup, clips_per_sample=row.clips)
    except Exception as e:  # one broken row must not lose the others' results
        res.error = f"{type(e).__name__}: {e}"
    out = dataclasses.asdict(res)
    if row.group == "evaluation":
        out["ms_per_video"] = 1e3 * EVAL_VIEWS / res.clips_per_s if res.clips_per_s else float("nan")
        out["cpu_ms_per_video"] = EVAL_VIEWS * res.cpu_ms_per_clip
    return out


# -------------------------------------------------------------------------- summary
METRICS = ("clips_per_s", "cpu_ms_per_clip", "main_cpu_pct", "workers_cpu_pct", "first_batch_s",
           "other_cpu_pct", "added_rss_mib")




def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    keys = [r.key for r in ctx["rows"]]
    first = {c: i for i, c in reversed(list(enumerate(r["workload"] for r in runs)))}
    summary = report.summarize(runs, ("workload", "loader"), METRICS + ("ms_per_video", "cpu_ms_per_video"),
                               sort=lambda r: (first[r["workload"]], keys.index(r["loader"])))
    doc["config"]["video_size"] = list(args.video_size)
    doc.update(videos=ctx["videos"], rows=[dataclasses.asdict(r) for r in ctx["rows"]], summary=summary,
               targets=targets(runs, args.contents, args))
    doc["notes"] += standing_notes(args, ctx["have_torch"], ctx["why_no_torch"]) + error_notes(runs)


def targets(runs: list[dict], contents: list[str], args) -> list[dict]:
    out = []
    for content in contents:
        checks = [
            ("CPU per clip, clips_per_sample=4 / separate (clips_per_video=4)", "sample-4", "separate-4",
             "cpu_ms_per_clip", False, K4_CPU_TARGET, "<="),
            (f"clips/s, group_clips=True / False, clips_per_video=4, W={args.workers}", "group-4", "separate-4",
             "clips_per_s", False, GROUP_TARGET, ">="),
            (f"ms per video, {EVAL_VIEWS} separate decodes / one pass (10 clips x 3 crops), W={args.workers}",
             "eval-apart", "eval-one-pass", "clips_per_s", True, EVAL_TARGET, ">="),
        ]
        # For comparison, not targets.
        for k in args.ks:
            if k != 4:
                checks.append((f"CPU per clip, clips_per_sample={k} / separate (clips_per_video=4)",
                               f"sample-{k}", "separate-4", "cpu_ms_per_clip", False, None, "<="))
        for k in args.ks:
            checks.append((f"clips/s, clips_per_sample={k} / separate (clips_per_video=4), W={args.workers}",
                           f"sample-{k}", "separate-4", "clips_per_s", False, None, ">="))
        for cpv in args.group:
            if cpv != 4:
                checks.append((f"clips/s, group_clips=True / False, clips_per_video={cpv}, W={args.workers}",
                               f"group-{cpv}", f"separate-{cpv}", "clips_per_s", False, None, ">="))
        for cpv in args.group:
            checks.append((f"CPU per clip, group_clips=True / False, clips_per_video={cpv}",
                           f"group-{cpv}", f"separate-{cpv}", "cpu_ms_per_clip", False, None, "<="))
        for cpv in sorted({4} | set(args.group)):
            for kind in ("separate", "group"):
                checks.append((f"clips/s, decoder='pyav' / decord, {kind} clips_per_video={cpv}, W={args.workers}",
                               f"{kind}-{cpv}-pyav", f"{kind}-{cpv}", "clips_per_s", False, None, ">="))
                checks.append((f"CPU per clip, decoder='pyav' / decord, {kind} clips_per_video={cpv}",
                               f"{kind}-{cpv}-pyav", f"{kind}-{cpv}", "cpu_ms_per_clip", False, None, "<="))
        for n in args.segments:
            checks.append((f"CPU per sample, {n} segments: one pass (loader) / {n} separate seeks (decord alone)",
                           f"segments-{n}", f"segments-{n}-seeks", "cpu_ms_per_clip", False, SEGMENTS_TARGET, "<="))
            checks.append((f"samples/s, {n} segments: one pass (loader) / {n} separate seeks (decord alone), "
                           f"W={args.workers}", f"segments-{n}", f"segments-{n}-seeks", "clips_per_s", False,
                           None, ">="))
            checks.append((f"CPU per sample, {n} segments: one get_batch / {n} separate seeks (both decord alone)",
                           f"segments-{n}-alone", f"segments-{n}-seeks", "cpu_ms_per_clip", False, None, "<="))
            checks.append((f"CPU per sample, {n} segments: decoder='pyav' / decord (loader)",
                           f"segments-{n}-pyav", f"segments-{n}", "cpu_ms_per_clip", False, None, "<="))
        for what, a, b, metric, invert, goal, sense in checks:
            a, b = (b, a) if invert else (a, b)
            r = report.ratio(runs, {"workload": content, "loader": a}, {"workload": content, "loader": b}, metric)
            if r is None:
                continue
            met = None if goal is None else (r["ratio"] <= goal if sense == "<=" else r["ratio"] >= goal)
            out.append({"content": content, "target": what, "goal": goal, "sense": sense, **r, "met": met})
    return out


# ------------------------------------------------------------------------- Markdown
def markdown(doc: dict) -> str:
    cfg = doc["config"]
    w = cfg["workers"]
    lines = report.header(doc, f"Decoding less: several clips per pass on long-GOP videos ({doc['name']})", ("torch",))
    lines += [f"Every row: W = {w} worker processes (tf-map: tf.data AUTOTUNE threads), clips of "
             f"{cfg['clip_len']} frames every {cfg['frame_step']} frames, "
             f"{cfg['side']}x{cfg['side']}, random starts; loader rows consume `as_dataset()` in batches of "
             f"{cfg['batch_size']} samples ({cfg['eval_batch_size']} videos for evaluation). {cfg['reps']} "
             f"interleaved repetitions of at least {cfg['duration']:g} s each (loader rows: whole epochs), "
             f"after {cfg['warmup']} warm-up batch(es). Cells: median (min–max).", "",
             "Columns: clips/s delivered (wall; evaluation rows count views); CPU ms per delivered clip "
             "= CPU time of every process of the run (main + workers, psutil) / clips; CPU % as `top` shows "
             "it (100 = one core), main process and workers apart; time to the first batch; other load = "
             "busy CPU of everything else on the machine during the run.", ""]
    for content, v in doc["videos"].items():
        if content not in doc["summary"]:
            continue
        s = doc["summary"][content]
        lines += [f"## {content} videos", "",
                  f"{v['count']} videos, {v['frames']} frames {v['size']} at {v['fps']} fps, {v['codec']}, "
                  f"one keyframe every {v['gop']} frames (keyframes of the first: {v['keyframes_of_first']}), "
                  f"{v['median_kbit_per_s']} kbit/s median: {v['content']}.", ""]
        a = v.get("anatomy")
        if a:
            lines += [f"Where decord's time goes on them (one process, CPU): opening a reader {a['open_ms']:.1f} ms, "
                      f"decoding a frame that is not delivered {a['skip_ms_per_frame']:.2f} ms, delivering a "
                      f"frame ({cfg['side']}x{cfg['side']}) {a['deliver_ms_per_frame']:.2f} ms. A random clip "
                      f"decodes {a['mean_frames_skipped_per_random_clip']:.0f} frames it does not deliver on "
                      f"average: about {a['random_clip_model_ms']:.0f} ms, against "
                      f"{a['clip_at_keyframe_model_ms']:.0f} ms for a clip at a keyframe. One pass over several "
                      "clips of a video shares the opening and the skipping; the delivering it cannot share.", ""]
        lines += table("| row | clips/s | CPU ms/clip | main CPU % | workers CPU % | first batch s | other load % |",
                       [f"| {row['label']} | {fmt(c['clips_per_s'], 1)} | {fmt(c['cpu_ms_per_clip'], 2)} | "
                        f"{fmt(c['main_cpu_pct'])} | {fmt(c['workers_cpu_pct'])} | {fmt(c['first_batch_s'], 2)} | "
                        f"{fmt(c['other_cpu_pct'])} |"
                        for row in doc["rows"] if row["group"] != "evaluation" and (c := s.get(row["key"]))])
        ev = [r for r in doc["rows"] if r["group"] == "evaluation" and r["key"] in s]
        if ev:
            lines += ["", f"Evaluation, {EVAL_CLIPS} uniform clips x 3 crops (short side {EVAL_SCALE}, "
                      f"{cfg['side']}x{cfg['side']} crops) per video, W = {w}:", ""]
            lines += table("| row | ms per video (wall) | CPU ms per video | views/s | first batch s | other load % |",
                           [f"| {row['label']} | {fmt(c['ms_per_video'])} | {fmt(c['cpu_ms_per_video'])} "
                            f"| {fmt(c['clips_per_s'], 1)} | {fmt(c['first_batch_s'], 2)} | {fmt(c['other_cpu_pct'])} |"
                            for row in ev if (c := s[row["key"]])])
        lines.append("")
    if doc["targets"]:
        lines += ["## Targets (issue #10) and other ratios", "",
                  "Ratio of medians; per-repetition: the same ratio within each repetition, min–max. Rows "
                  "without a target are there for comparison.", ""]
        rows = []
        for t in sorted(doc["targets"], key=lambda t: (t["content"], t["goal"] is None)):
            goal = "–" if t["goal"] is None else f"{t['sense']} {t['goal']:g}"
            met = "–" if t["met"] is None else "yes" if t["met"] else "**no**"
            rows.append(f"| {t['content']} | {t['target']} | {goal} | {t['ratio']:.2f} | "
                        f"{t['per_rep_min']:.2f}–{t['per_rep_max']:.2f} | {met} |")
        lines += table("| videos | ratio | target | measured | per-repetition | met |", rows) + [""]
        missed = [t for t in doc["targets"] if t["met"] is False]
        for t in missed:
            lines.append(f"- **Missed** on {t['content']} videos: {t['target']} is {t['ratio']:.2f}, "
                         f"the target is {t['sense']} {t['goal']:g}.")
        if missed:
            lines.append("")
    return "\n".join(lines + report.tail(doc, "## Plot"))


def standing_notes(args, have_torch: bool, why_no_torch: str | None) -> list[str]:
    notes = [
        "separate, decord alone, tf-map and torch decode every clip with its own "
        "decord.VideoReader(num_threads=1) and one get_batch: from the keyframe before the clip. "
        "Clip starts follow shmloader's rule (seeded by (seed, epoch, sample)), so separate, decord "
        "alone, tf-map and torch decode the same clips.",
        "clips_per_sample=K: VideoClips(clips_per_sample=K), one sample per video and epoch; a batch of "
        f"{args.batch_size} samples holds {args.batch_size}K clips, and clips/s counts all of them.",
        "group_clips=True: the loader's default shuffle window (4 batches' worth of samples, rounded "
        "up to whole videos); the clips of a window's videos are shuffled among its batches.",
        "Segments (sampling='segments'): the rows' clips/s and CPU per clip count samples of N frames "
        "spread over the whole video (no frame_step); decord alone draws the same frames (the same rule "
        "and seeds, shmloader.sampling.clip_frames over the probe's frame times) and decodes them in one "
        "get_batch, or in N get_batch calls of one frame each on one reader (decord seeks to the keyframe "
        "before every call).",
        "decord alone: W spawned processes decode their share of the sample stream for the same "
        "duration, no loader and no consumer (bench/limit.py's physical limit, for these clips).",
        "Evaluation, one pass: eval_loader(VideoClips(clips_per_sample=10, crop_at='three', scale="
        f"{EVAL_SCALE}, crop=({args.side}, {args.side}), sampling='uniform'), workers=W): one sample "
        f"[30, T, H, W, 3] per video. The evaluation list holds each video under {_EVAL_NAMES} names "
        "(symbolic links), so that a pass lasts the measured time and every entry is a first visit, as "
        "in an evaluation over distinct files (per-path caches never hit, for both rows). "
        "Apart: the same 30 views in W spawned processes, one get_batch per view (each clip decoded "
        "once per crop, as 30 separate samples would be) on one reader per video (cheaper than a "
        "reader per view).",
    ]
    if have_torch:
        import torch

        where = os.path.dirname(os.path.dirname(torch.__file__))
        if where.startswith(harness.ROOT + os.sep) and ".venv" not in where:  # a side install, e.g. pip --target
            where = f"{os.path.relpath(where, harness.ROOT)} (on PYTHONPATH)"
        notes.append(f"torch {torch.__version__} from {where}; "
                     "DataLoader(num_workers=W, prefetch_factor=2) with forkserver workers, as in loaders.py.")
    elif why_no_torch:
        notes.append(f"torch DataLoader row left out: {why_no_torch}.")
    return notes


def error_notes(runs: list[dict]) -> list[str]:
    """Runs that failed: they are in no median."""
    return [f"Run failed and left out ({r['workload']} {r['loader']}, repetition {r['rep'] + 1}): {r['error']}"
            for r in runs if r.get("error")]


# ---------------------------------------------------------------------------- plots
_COLORS = {"separate": "tab:gray", "one sample of K clips": "tab:blue", "group_clips": "tab:green",
           "PyAV": "tab:orange", "segments": "tab:cyan",
           "reference": "black", "evaluation": "tab:purple"}


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    contents = [c for c in doc["videos"] if c in doc["summary"]]
    if not contents:
        return []
    # The third column (10 clips x 3 crops per video) only where a run measured evaluation rows.
    evaluated = any(r["group"] == "evaluation" and r["key"] in doc["summary"][c] for c in contents for r in doc["rows"])
    fig, axes = plt.subplots(len(contents), 3 if evaluated else 2, figsize=(16 if evaluated else 13, 4.6 * len(contents)),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 3, 1.4] if evaluated else [3, 3]})
    for i, content in enumerate(contents):
        s = doc["summary"][content]
        rows = [r for r in doc["rows"] if r["key"] in s and r["group"] != "evaluation"]
        names = [r["key"] for r in rows]
        colors = [_COLORS[r["group"]] for r in rows]
        for ax, metric, what in ((axes[i][0], "clips_per_s", "clips/s delivered (wall)"),
                                 (axes[i][1], "cpu_ms_per_clip", "CPU ms per delivered clip (all processes)")):
            report.bars(ax, names, [s[k][metric] for k in names], colors, horizontal=True)
            for y, k in enumerate(names):  # the median, right of the error bar
                ax.text(s[k][metric]["max"], y, f"  {s[k][metric]['median']:.1f}", va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(what)
            ax.set_title(f"{content} videos: {what}", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            ax.set_xlim(right=max(s[k][metric]["max"] for k in names) * 1.2 if names else None)
        ev = [r["key"] for r in doc["rows"] if r["group"] == "evaluation" and r["key"] in s]
        if ev:
            ax = axes[i][2]
            report.bars(ax, ev, [s[k]["ms_per_video"] for k in ev], ["tab:purple", "tab:gray"][: len(ev)])
            for x, k in enumerate(ev):
                ax.text(x, s[k]["ms_per_video"]["max"], f"{s[k]['ms_per_video']['median']:.0f}\n", ha="center",
                        va="bottom", fontsize=8)
            ax.set_ylim(top=max(s[k]["ms_per_video"]["max"] for k in ev) * 1.15)
            ax.set_ylabel("ms per video (wall)")
            ax.set_title(f"{content}: 10 clips x 3 crops", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        elif evaluated:
            axes[i][2].axis("off")
    from matplotlib.patches import Patch

    shown = {r["group"] for r in doc["rows"]} - {"evaluation"}
    # Below the axes, not over them: a legend inside hid the label of the longest bar.
    fig.legend(handles=[Patch(color=c, label=g) for g, c in _COLORS.items() if g in shown],
               fontsize=8, loc="lower center", ncol=len(shown), frameon=False)
    m = doc["machine"]
    fig.suptitle(f"Several clips per decode pass, long-GOP videos, W = {doc['config']['workers']} "
                 f"({m['cpu_model']}, {m['usable_cores']} cores); median, bars min–max", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 / len(contents), 1, 1))
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(
    script="bench/recipes.py", name="recipes-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=plan, run=run_row, report=finish, markdown=markdown, plot=plot,
    label=lambda cell: f"{cell[0]} {cell[1].key}", forkserver=True,
    brief=lambda cell, row: row.get("error") and f"{cell[0]} {cell[1].key}: {row['error']}")

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
