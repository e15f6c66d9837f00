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
* references: decord decoding each random clip with its own reader in W processes (no loader,
  like ``limit.py``), and the peers of ``loaders.py`` on the same clips: tf.data
  ``map(numpy_function, AUTOTUNE)`` and, when torch imports, torch's DataLoader;
* evaluation: 10 uniform clips x 3 crops of each video as one sample (``eval_loader``) against
  the 30 views decoded one ``get_batch`` each, straight with decord.

For every row: clips/s at the consumer (wall) and CPU ms per delivered clip, counting every
process of the run (main + its descendants, psutil ``cpu_times``). Writes
``<out>/<name>.json``, ``.md`` and ``.png``.

    python bench/recipes.py                            # the full run, ~10 minutes on 2 cores
    python bench/recipes.py --workers 4 --name recipes-cpu4
    python bench/recipes.py --quick                    # a smoke run of a few seconds per row

Two kinds of video, both written here with frame codes (``shmloader._samples``) and one keyframe
every ``--gop`` frames: ``codes``, the sample videos as ``make_videos`` writes them (flat cells:
~20 kbit/s, frames between keyframes cost almost nothing to decode), and ``textured``, the same
codes over a panning texture with sensor noise (~500 kbit/s at 320x240, the bit rate of web video
of that size), where each frame between a keyframe and a clip costs real decoding work.

Like ``cpu_vs_workers.py``, this module imports neither TensorFlow nor torch at the top: the
processes it spawns import it as their main module.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import multiprocessing as mp
import os
import random
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

import limit
from cpu_vs_workers import _ints, _names, _size, release_memory
from measure import Result, Sampler, machine_info, touch, window_result
from report import save, spread
from workloads import write_textured

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = 0

CONTENTS = ("codes", "textured")
# Targets of issue #10, each a ratio of medians (see `targets`).
K4_CPU_TARGET = 0.5  # CPU per clip, clips_per_sample=4 / separate: at most
GROUP_TARGET = 1.8  # clips/s, group_clips=True / False, clips_per_video=4, same W: at least
EVAL_TARGET = 8.0  # ms per video, 30 separate decodes / one pass: at least

# Evaluation protocol (SlowFast / X3D test time): short side 128 here (for 112 crops), 10 uniform
# clips, 3 crops along the long side.
EVAL_SCALE = 128
EVAL_CLIPS = 10
EVAL_VIEWS = 3 * EVAL_CLIPS
# Names per video in the evaluation list (see eval_names): more entries than one run visits.
_EVAL_NAMES = 50

# A spawned process that does not report back within this much of the planned duration has hung.
_SLACK_S = 60.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--name", default="recipes-cpu2", help="results are <out>/<name>.{json,md,png}")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", type=int, default=2, help="worker processes W of every row")
    p.add_argument("--ks", type=_ints, default=[2, 4, 10], help="clips_per_sample values K")
    p.add_argument("--group", type=_ints, default=[4, 10],
                   help="clips_per_video values run with group_clips=True and False")
    p.add_argument("--contents", type=_names(CONTENTS), default=list(CONTENTS),
                   help="kinds of video: codes (make_videos' flat frame codes), textured")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--duration", type=float, default=4.0, help="seconds measured per run, at least")
    p.add_argument("--warmup", type=int, default=1, help="batches consumed before measuring")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-batch-size", type=int, default=2, help="videos per evaluation batch")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--side", type=int, default=112, help="clips are side x side")
    p.add_argument("--video-count", type=int, default=12)
    p.add_argument("--video-frames", type=int, default=300)
    p.add_argument("--video-size", type=_size, default=(240, 320), help="HxW of the videos")
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--gop", type=int, default=250, help="one keyframe every this many frames")
    p.add_argument("--cache", default=os.path.join(ROOT, ".cache", "bench-recipes"),
                   help="where the videos are written (reused when present)")
    p.add_argument("--no-peers", action="store_true", help="leave out tf-map and torch")
    p.add_argument("--decoders", type=_names(("decord", "pyav")), default=["decord", "pyav"],
                   help="decoders of the loader rows: pyav adds the separate and grouped rows with decoder='pyav'")
    p.add_argument("--rows", type=lambda t: [x for x in t.split(",") if x], default=None,
                   help="run only these rows (keys as in the json: separate-4,sample-4,group-4,...)")
    p.add_argument("--max-other-load", type=float, default=50.0,
                   help="CPU %% used by other programs above which a run is repeated")
    p.add_argument("--retries", type=int, default=1,
                   help="repeats of a run spoilt by other load; the quietest attempt is kept")
    p.add_argument("--seed", type=int, default=0, help="seed of the run order shuffle")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 repetition of 0.5 s, 4 short videos, K=4 and group 4 only")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.duration, args.ks, args.group = 1, 0.5, [4], [4]
        args.video_count, args.video_frames = 4, 120
        args.gop = min(args.gop, 100)
    if args.reps < 1 or args.duration <= 0 or args.workers < 1 or min(args.ks + args.group, default=1) < 1:
        p.error("--reps >= 1, --duration > 0, --workers >= 1 and K >= 1")
    return args


# ---------------------------------------------------------------------------- videos
def make_recipe_videos(args, content: str) -> tuple[list[str], dict]:
    """The videos of one kind, written once into the cache; (paths, what they are)."""
    import decord

    h, w = args.video_size
    folder = Path(args.cache) / content
    if content == "codes":
        from shmloader._samples import make_videos

        paths, _ = make_videos(folder, count=args.video_count, frames=args.video_frames,
                               size=args.video_size, codec="libx264", fps=args.fps, gop=args.gop)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for i in range(args.video_count):
            p = folder / f"textured_{i:03d}_{args.video_frames}f_{h}x{w}_{args.fps}fps_gop{args.gop}.mp4"
            if not p.exists():
                tmp = p.with_suffix(".tmp.mp4")
                write_textured(tmp, i, args.video_frames, args.video_size, args.fps, args.gop)
                os.replace(tmp, p)
            paths.append(str(p))
    reader = decord.VideoReader(paths[0], num_threads=1)
    keys = [int(k) for k in reader.get_key_indices()]
    seconds = args.video_frames / args.fps
    kbps = statistics.median(os.path.getsize(p) for p in paths) * 8 / 1e3 / seconds
    about = {"folder": os.path.relpath(folder, ROOT), "count": len(paths), "frames": args.video_frames,
             "size": f"{h}x{w}", "fps": args.fps, "gop": args.gop, "codec": "libx264 crf 18 veryfast",
             "keyframes_of_first": keys, "median_kbit_per_s": round(kbps),
             "content": ("frame codes only (shmloader._samples.make_videos)" if content == "codes" else
                         "frame codes over a panning texture with noise (bench/workloads.py write_textured)")}
    if keys != list(range(0, args.video_frames, args.gop)):
        raise SystemExit(f"{paths[0]}: keyframes at {keys}, expected every {args.gop} frames")
    return paths, about


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


# ------------------------------------------------------- clips, as the loader picks them
@dataclasses.dataclass(frozen=True)
class Recipe:
    """What every row delivers: ``clip_len`` frames every ``frame_step``, ``side x side``."""

    paths: tuple[str, ...]
    clip_len: int
    frame_step: int
    side: int

    @property
    def span(self) -> int:
        return (self.clip_len - 1) * self.frame_step + 1

    @property
    def clip_bytes(self) -> int:
        return self.clip_len * self.side * self.side * 3

    def clip_options(self) -> dict:
        return dict(clip_len=self.clip_len, frame_step=self.frame_step, sampling="random")


def _reader(path: str, height: int, width: int):
    import decord

    return decord.VideoReader(path, width=width, height=height, num_threads=1)


def random_clip(recipe: Recipe, clips_per_video: int, epoch: int, sample: int) -> tuple[np.ndarray, int]:
    """Sample ``sample`` of ``VideoClips(clips_per_video=...)`` decoded on its own: its own
    reader, one ``get_batch``; the start drawn as shmloader draws it, from ``(SEED, epoch,
    sample)``. Returns (clip, label)."""
    video = sample // clips_per_video
    reader = _reader(recipe.paths[video], recipe.side, recipe.side)
    rng = np.random.default_rng((SEED, epoch, sample))
    start = int(rng.integers(0, len(reader) - recipe.span + 1))
    clip = reader.get_batch(list(range(start, start + recipe.span, recipe.frame_step))).asnumpy()
    return clip, video % 2


@functools.lru_cache(maxsize=None)
def _native_size(path: str) -> tuple[int, int]:
    """(height, width), learnt as shmloader's workers learn it (one frame) and kept, as they do."""
    shape = _reader(path, -1, -1).get_batch([0]).shape
    return int(shape[1]), int(shape[2])


def eval_views_apart(recipe: Recipe, video: int) -> None:
    """The evaluation views of one video, each decoded on its own: one ``get_batch`` per view
    (a clip is decoded again for each of its 3 crops, as 30 separate samples would be). One
    reader for the video, which is the cheaper way (a reader per view adds its opening).
    The views are the ones ``eval_loader`` delivers."""
    from shmloader._sampling import clip_frames, crop_windows, scaled_size

    path = recipe.paths[video % len(recipe.paths)]
    h, w = scaled_size(*_native_size(path), EVAL_SCALE)
    reader = _reader(path, h, w)
    rng = np.random.default_rng(0)  # unused by uniform clips and three crops
    frames = clip_frames(len(reader), None, clip_len=recipe.clip_len, frame_step=recipe.frame_step,
                         fps=None, sampling="uniform", clips=list(range(EVAL_CLIPS)),
                         total_clips=EVAL_CLIPS, short_video="error", rng=rng)
    corners = crop_windows(h, w, (recipe.side, recipe.side), "three", EVAL_CLIPS, rng)
    s = recipe.side
    for k in range(EVAL_CLIPS):
        for y, x in corners[k]:
            clip = reader.get_batch(frames[k].tolist()).asnumpy()
            np.ascontiguousarray(clip[:, y : y + s, x : x + s])


# ---------------------------------------------------- decoding alone, in W processes
def _decode_alone(kind: str, recipe: Recipe, clips_per_video: int, shard: int, shards: int,
                  ready, go, duration: float, out) -> None:
    """One process of a no-loader reference: decode units (a random clip, or the 30 views of a
    video) for ``duration`` s from a common start; report (shard, units, seconds)."""
    from workloads import sample_keys

    keys = sample_keys(len(recipe.paths) * clips_per_video, shard, shards)
    videos = iter(range(shard, 10**9, shards))

    def step() -> None:
        if kind == "clips":
            random_clip(recipe, clips_per_video, *next(keys))
        else:
            eval_views_apart(recipe, next(videos))

    step()  # imports and a first open outside the timed part
    ready.put(shard)
    go.wait()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < duration:
        step()
        n += 1
    out.put((shard, n, time.perf_counter() - t0))


def decode_alone(kind: str, recipe: Recipe, clips_per_video: int, workers: int, duration: float,
                 res: Result, clips_per_unit: int) -> Result:
    """``limit.physical_limit`` for these clips: W spawned processes, no loader, no consumer.
    ``kind``: "clips" (a unit is one random clip) or "eval" (the 30 views of a video);
    ``clips_per_unit`` converts units to clips."""
    return limit.run_timed(_decode_alone, lambda i: (kind, recipe, clips_per_video, i, workers), workers,
                           duration, res, clips_per_unit, recipe.clip_len, recipe.clip_bytes)


# ------------------------------------------------------------------------ pipelines
def shm_pipeline(recipe: Recipe, workers: int, batch_size: int, evaluation: bool = False, **options):
    """``Loader(VideoClips(...)).as_dataset()`` (``eval_loader`` for evaluation) as a
    ``loaders.Pipeline``; the loader's ``len()`` (batches per epoch) rides along."""
    import shmloader
    from loaders import Pipeline

    source = shmloader.VideoClips(list(recipe.paths), [i % 2 for i in range(len(recipe.paths))],
                                  **recipe.clip_options(), **options)
    if evaluation:
        loader = shmloader.eval_loader(source, batch_size=batch_size, workers=workers)
    else:
        loader = shmloader.Loader(source, batch_size=batch_size, workers=workers, shuffle=True,
                                  seed=SEED, epochs=None, drop_remainder=True)
    pipe = Pipeline(iter(loader.as_dataset()), threading.Event(), pids=loader.worker_pids,
                    teardown=[loader.close], stats=loader.stats)
    if not evaluation:  # measured over whole epochs (see run_batches)
        pipe.epoch_batches = len(loader)
    return pipe


def tf_map_pipeline(recipe: Recipe, clips_per_video: int, batch_size: int):
    """``loaders.tf_map`` on these clips: keys from ``from_generator``,
    ``map(tf.numpy_function(random_clip), AUTOTUNE)``, batch, prefetch."""
    import tensorflow as tf

    from loaders import Pipeline
    from workloads import sample_keys

    stop = threading.Event()
    n = len(recipe.paths) * clips_per_video
    shape = (recipe.clip_len, recipe.side, recipe.side, 3)

    def keys_gen():
        for key in sample_keys(n):
            if stop.is_set():
                return
            yield np.asarray(key, np.int64)

    def decode(key: np.ndarray):
        clip, label = random_clip(recipe, clips_per_video, int(key[0]), int(key[1]))
        return clip, np.int64(label)

    def tf_decode(key):
        clip, label = tf.numpy_function(decode, [key], [tf.uint8, tf.int64])
        clip.set_shape(shape)
        label.set_shape(())
        return {"video": clip, "label": label}

    ds = tf.data.Dataset.from_generator(keys_gen, output_signature=tf.TensorSpec((2,), tf.int64))
    ds = ds.map(tf_decode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return Pipeline(iter(ds), stop)


class TorchClips:
    """Map-style dataset for torch's DataLoader: key ``epoch * n + sample`` -> (clip, label)."""

    def __init__(self, recipe: Recipe, clips_per_video: int) -> None:
        self.recipe, self.clips_per_video = recipe, clips_per_video

    def __len__(self) -> int:
        return len(self.recipe.paths) * self.clips_per_video

    def __getitem__(self, key: int):
        import torch

        epoch, sample = divmod(int(key), len(self))
        clip, label = random_clip(self.recipe, self.clips_per_video, epoch, sample)
        return torch.from_numpy(clip), label


def torch_pipeline(recipe: Recipe, clips_per_video: int, workers: int, batch_size: int):
    """``loaders.torch_loader`` on these clips: ``DataLoader(num_workers=W)``, forkserver
    workers, the same sample order."""
    from torch.utils.data import DataLoader

    from loaders import Pipeline, _batched_dataset, _EndlessKeys

    stop = threading.Event()
    data = TorchClips(recipe, clips_per_video)
    dl = DataLoader(data, batch_size=batch_size, sampler=_EndlessKeys(len(data)), num_workers=workers,
                    multiprocessing_context=mp.get_context("forkserver"), drop_last=True,
                    prefetch_factor=2)
    dl_iter = iter(dl)

    def batches_gen():
        for video, label in dl_iter:
            if stop.is_set():
                return
            yield {"video": video.numpy(), "label": label.numpy().astype(np.int64)}

    class _Shape:  # what loaders._batch_signature reads
        shape = (recipe.clip_len, recipe.side, recipe.side, 3)

    pipe: Pipeline = _batched_dataset(batches_gen, _Shape, batch_size, stop)
    pipe.pids = lambda: [w.pid for w in getattr(dl_iter, "_workers", []) if w.is_alive()]
    pipe.teardown.append(dl_iter._shutdown_workers)
    return pipe


def run_batches(make, res: Result, *, clips_per_sample: int, recipe: Recipe, duration: float,
                warmup: int) -> Result:
    """``measure.run_pipeline``, counting ``clips_per_sample`` clips per sample, over whole
    epochs where the pipeline says how long one is.

    Grouped decode delivers in bursts (a shuffle window's batches complete together), so a
    window of arbitrary length could start or end inside a burst; whole epochs from the same
    phase measure the steady rate. An evaluation pipeline that runs out ends the window early.
    """
    with Sampler(children=True) as sampler:
        t0 = time.perf_counter()
        pipe = make()
        sampler.pids = pipe.pids
        period = max(1, getattr(pipe, "epoch_batches", 1))
        try:
            touch(next(pipe))
            res.first_batch_s = time.perf_counter() - t0
            for _ in range(warmup):
                touch(next(pipe))
            a = sampler.window_start()
            samples = batches = 0
            while batches < period or batches % period or time.perf_counter() - a.t < duration:
                try:
                    samples += touch(next(pipe))
                except StopIteration:
                    break
                batches += 1
            b = sampler.window_end()
            window_result(res, a, b, samples * clips_per_sample, recipe.clip_len, recipe.clip_bytes, sampler)
            res.extra.update(batches=batches, samples=samples, epoch_batches=period)
            if pipe.stats is not None:
                s = pipe.stats()
                res.extra.update(worker_replies=s.get("tasks"), decoded_samples=s.get("decoded"),
                                 copied_batches=s.get("copied", 0))
        finally:
            t1 = time.perf_counter()
            pipe.close()
            res.extra["close_s"] = round(time.perf_counter() - t1, 3)
    return res


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


def plan(args, have_torch: bool) -> list[Row]:
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
        if have_torch:
            rows.append(Row("torch", "torch DataLoader(num_workers=W), each clip on its own",
                            "torch", (), 4, 1, "reference"))
    rows.append(Row("eval-one-pass", f"eval: {EVAL_CLIPS} uniform clips x 3 crops as one sample "
                    "(eval_loader), one pass per video", "eval-loader",
                    (("clips_per_sample", EVAL_CLIPS), ("crop_at", "three"), ("scale", EVAL_SCALE)),
                    1, EVAL_VIEWS, "evaluation"))
    rows.append(Row("eval-apart", f"eval: the same {EVAL_VIEWS} views, one decord get_batch each, "
                    "W processes", "eval-alone", (), 1, EVAL_VIEWS, "evaluation"))
    if args.rows:
        rows = [r for r in rows if r.key in args.rows]
    return rows


def run_row(row: Row, rep: int, args, content: str, recipe: Recipe, eval_recipe: Recipe) -> dict:
    res = Result(row.key, content, str(args.workers), rep)
    res.extra.update(label=row.label, clips_per_sample=row.clips, clips_per_video=row.clips_per_video)
    w = args.workers
    try:
        if row.kind == "alone":
            decode_alone("clips", recipe, row.clips_per_video, w, args.duration, res, 1)
        elif row.kind == "eval-alone":
            decode_alone("eval", eval_recipe, 1, w, args.duration, res, EVAL_VIEWS)
        else:
            if row.kind == "loader":
                make = lambda: shm_pipeline(recipe, w, args.batch_size, **dict(row.options))  # noqa: E731
            elif row.kind == "eval-loader":
                side = (recipe.side, recipe.side)
                make = lambda: shm_pipeline(eval_recipe, w, args.eval_batch_size, evaluation=True,  # noqa: E731
                                            crop=side, **dict(row.options))
            elif row.kind == "tf-map":
                make = lambda: tf_map_pipeline(recipe, row.clips_per_video, args.batch_size)  # noqa: E731
            else:
                make = lambda: torch_pipeline(recipe, row.clips_per_video, w, args.batch_size)  # noqa: E731
            run_batches(make, res, clips_per_sample=row.clips, recipe=recipe, duration=args.duration,
                        warmup=args.warmup)
    except Exception as e:  # one broken row must not lose the others' results
        res.error = f"{type(e).__name__}: {e}"
    return dataclasses.asdict(res)


def run_quietly(row: Row, rep: int, args, content: str, recipe: Recipe, eval_recipe: Recipe) -> dict:
    """``run_row``, repeated up to ``--retries`` times while other programs load the machine."""
    best, attempts = None, 0
    for attempts in range(1, 2 + max(0, args.retries)):
        release_memory()
        t0 = time.perf_counter()
        r = run_row(row, rep, args, content, recipe, eval_recipe)
        r["wall_s"] = time.perf_counter() - t0
        if best is None or r.get("other_cpu_pct", 0) < best.get("other_cpu_pct", 0):
            best = r
        if r.get("error") or r.get("other_cpu_pct", 0) <= args.max_other_load:
            break
    best["attempts"] = attempts
    return best


# -------------------------------------------------------------------------- summary
METRICS = ("clips_per_s", "cpu_ms_per_clip", "main_cpu_pct", "workers_cpu_pct", "first_batch_s",
           "other_cpu_pct", "added_rss_mib")


def summarize(runs: list[dict], rows: list[Row]) -> dict:
    """content -> row key -> metric -> spread over repetitions (plus ms per video for eval)."""
    out: dict = {}
    for content in dict.fromkeys(r["workload"] for r in runs):
        for row in rows:
            rs = [r for r in runs if r["workload"] == content and r["loader"] == row.key and not r.get("error")]
            if not rs:
                continue
            s = {m: spread([r[m] for r in rs]) for m in METRICS}
            if row.group == "evaluation":
                s["ms_per_video"] = spread([1e3 * EVAL_VIEWS / r["clips_per_s"] for r in rs if r["clips_per_s"]])
                s["cpu_ms_per_video"] = spread([EVAL_VIEWS * r["cpu_ms_per_clip"] for r in rs])
            out.setdefault(content, {})[row.key] = s
    return out


def _paired(runs: list[dict], content: str, a: str, b: str, metric: str, invert: bool = False) -> dict | None:
    """median(a) / median(b) of ``metric`` (b / a with ``invert``), and the min-max of the
    ratio paired by repetition."""
    def by_rep(key):
        return {r["rep"]: r[metric] for r in runs if r["workload"] == content and r["loader"] == key
                and not r.get("error") and r[metric] and not math.isnan(r[metric])}

    ra, rb = by_rep(a), by_rep(b)
    if not ra or not rb:
        return None
    if invert:
        ra, rb = rb, ra
    paired = [ra[k] / rb[k] for k in ra if k in rb]
    return {"ratio": statistics.median(ra.values()) / statistics.median(rb.values()),
            "per_rep_min": min(paired, default=float("nan")), "per_rep_max": max(paired, default=float("nan"))}


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
        for what, a, b, metric, invert, goal, sense in checks:
            r = _paired(runs, content, a, b, metric, invert)
            if r is None:
                continue
            met = None if goal is None else (r["ratio"] <= goal if sense == "<=" else r["ratio"] >= goal)
            out.append({"content": content, "target": what, "goal": goal, "sense": sense, **r, "met": met})
    return out


# ------------------------------------------------------------------------- Markdown
def _fmt(s: dict | None, digits: int = 1) -> str:
    if not s or s["n"] == 0:
        return "–"
    f = f"{{:.{digits}f}}"
    if s["n"] == 1:
        return f.format(s["median"])
    return f"{f.format(s['median'])} ({f.format(s['min'])}–{f.format(s['max'])})"


def markdown(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    w = cfg["workers"]
    lines = [f"# Decoding less: several clips per pass on long-GOP videos ({doc['name']})", "",
             f"Machine: {m['cpu_model']}, {m['usable_cores']} usable cores, {m['memory_gib']} GiB; "
             f"Python {m['python']}, numpy {m['numpy']}, decord {m['decord']}, tensorflow {m['tensorflow']}, "
             f"torch {m['torch'] or 'not installed'}.", "",
             f"Command: `{doc['command']}`  ", f"Wall time: {doc['wall_s']:.0f} s.", "",
             f"Every row: W = {w} worker processes (tf-map: tf.data AUTOTUNE threads), clips of "
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
        lines += ["| row | clips/s | CPU ms/clip | main CPU % | workers CPU % | first batch s | other load % |",
                  "|---|---|---|---|---|---|---|"]
        for row in doc["rows"]:
            if row["key"] not in s or row["group"] == "evaluation":
                continue
            c = s[row["key"]]
            lines.append(f"| {row['label']} | {_fmt(c['clips_per_s'])} | {_fmt(c['cpu_ms_per_clip'], 2)} | "
                         f"{_fmt(c['main_cpu_pct'], 0)} | {_fmt(c['workers_cpu_pct'], 0)} | "
                         f"{_fmt(c['first_batch_s'], 2)} | {_fmt(c['other_cpu_pct'], 0)} |")
        ev = [r for r in doc["rows"] if r["group"] == "evaluation" and r["key"] in s]
        if ev:
            lines += ["", f"Evaluation, {EVAL_CLIPS} uniform clips x 3 crops (short side {EVAL_SCALE}, "
                      f"{cfg['side']}x{cfg['side']} crops) per video, W = {w}:", "",
                      "| row | ms per video (wall) | CPU ms per video | views/s | first batch s | other load % |",
                      "|---|---|---|---|---|---|"]
            for row in ev:
                c = s[row["key"]]
                lines.append(f"| {row['label']} | {_fmt(c['ms_per_video'], 0)} | {_fmt(c['cpu_ms_per_video'], 0)} "
                             f"| {_fmt(c['clips_per_s'])} | {_fmt(c['first_batch_s'], 2)} | "
                             f"{_fmt(c['other_cpu_pct'], 0)} |")
        lines.append("")
    if doc["targets"]:
        lines += ["## Targets (issue #10) and other ratios", "",
                  "Ratio of medians; per-repetition: the same ratio within each repetition, min–max. Rows "
                  "without a target are there for comparison.", "",
                  "| videos | ratio | target | measured | per-repetition | met |", "|---|---|---|---|---|---|"]
        for t in sorted(doc["targets"], key=lambda t: (t["content"], t["goal"] is None)):
            goal = "–" if t["goal"] is None else f"{t['sense']} {t['goal']:g}"
            met = "–" if t["met"] is None else "yes" if t["met"] else "**no**"
            lines.append(f"| {t['content']} | {t['target']} | {goal} | {t['ratio']:.2f} | "
                         f"{t['per_rep_min']:.2f}–{t['per_rep_max']:.2f} | {met} |")
        lines.append("")
        missed = [t for t in doc["targets"] if t["met"] is False]
        for t in missed:
            lines.append(f"- **Missed** on {t['content']} videos: {t['target']} is {t['ratio']:.2f}, "
                         f"the target is {t['sense']} {t['goal']:g}.")
        if missed:
            lines.append("")
    if doc["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    if doc.get("plots"):
        lines += ["## Plot", ""] + [f"![{p}]({p})" for p in doc["plots"]] + [""]
    return "\n".join(lines)


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
        if where.startswith(ROOT + os.sep) and ".venv" not in where:  # a side install, e.g. pip --target
            where = f"{os.path.relpath(where, ROOT)} (on PYTHONPATH)"
        notes.append(f"torch {torch.__version__} from {where}; "
                     "DataLoader(num_workers=W, prefetch_factor=2) with forkserver workers, as in loaders.py.")
    elif why_no_torch:
        notes.append(f"torch DataLoader row left out: {why_no_torch}.")
    return notes


def error_notes(runs: list[dict]) -> list[str]:
    """Runs that failed: they are in no median."""
    return [f"Run failed and left out ({r['workload']} {r['loader']}, repetition {r['rep'] + 1}): {r['error']}"
            for r in runs if r.get("error")]


def retry_notes(runs: list[dict], args) -> list[str]:
    retried = [r for r in runs if r.get("attempts", 1) > 1]
    if not retried:
        return []
    still = sum(r.get("other_cpu_pct", 0) > args.max_other_load for r in retried)
    return [f"{len(retried)} of {len(runs)} runs were repeated because other programs used more than "
            f"{args.max_other_load:g} % CPU during them; the quietest attempt is kept "
            f"({still} stayed above the threshold)."]


# ---------------------------------------------------------------------------- plots
_COLORS = {"separate": "tab:gray", "one sample of K clips": "tab:blue", "group_clips": "tab:green",
           "PyAV": "tab:orange",
           "reference": "black", "evaluation": "tab:purple"}


def plot(doc: dict, folder: str, name: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contents = [c for c in doc["videos"] if c in doc["summary"]]
    if not contents:
        return []
    fig, axes = plt.subplots(len(contents), 3, figsize=(16, 4.6 * len(contents)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 3, 1.4]})
    for i, content in enumerate(contents):
        s = doc["summary"][content]
        rows = [r for r in doc["rows"] if r["key"] in s and r["group"] != "evaluation"]
        names = [r["key"] for r in rows]
        colors = [_COLORS[r["group"]] for r in rows]
        for ax, metric, what in ((axes[i][0], "clips_per_s", "clips/s delivered (wall)"),
                                 (axes[i][1], "cpu_ms_per_clip", "CPU ms per delivered clip (all processes)")):
            med = [s[k][metric]["median"] for k in names]
            err = [[m - s[k][metric]["min"] for m, k in zip(med, names)],
                   [s[k][metric]["max"] - m for m, k in zip(med, names)]]
            ax.barh(names, med, xerr=err, color=colors, capsize=3)
            for y, (v, k) in enumerate(zip(med, names)):  # the median, right of the error bar
                ax.text(s[k][metric]["max"], y, f"  {v:.1f}", va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(what)
            ax.set_title(f"{content} videos: {what}", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            ax.set_xlim(right=max(s[k][metric]["max"] for k in names) * 1.2 if names else None)
        ev = [r["key"] for r in doc["rows"] if r["group"] == "evaluation" and r["key"] in s]
        ax = axes[i][2]
        if ev:
            med = [s[k]["ms_per_video"]["median"] for k in ev]
            err = [[m - s[k]["ms_per_video"]["min"] for m, k in zip(med, ev)],
                   [s[k]["ms_per_video"]["max"] - m for m, k in zip(med, ev)]]
            ax.bar(ev, med, yerr=err, color=["tab:purple", "tab:gray"][: len(ev)], capsize=3)
            for x, (v, k) in enumerate(zip(med, ev)):
                ax.text(x, s[k]["ms_per_video"]["max"], f"{v:.0f}\n", ha="center", va="bottom", fontsize=8)
            ax.set_ylim(top=max(s[k]["ms_per_video"]["max"] for k in ev) * 1.15)
            ax.set_ylabel("ms per video (wall)")
            ax.set_title(f"{content}: 10 clips x 3 crops", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    from matplotlib.patches import Patch

    axes[0][0].legend(handles=[Patch(color=c, label=g) for g, c in _COLORS.items() if g != "evaluation"],
                      fontsize=8, loc="lower right")
    m = doc["machine"]
    fig.suptitle(f"Several clips per decode pass, long-GOP videos, W = {doc['config']['workers']} "
                 f"({m['cpu_model']}, {m['usable_cores']} cores); median, bars min–max", fontsize=10)
    fig.tight_layout()
    path = os.path.join(folder, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [f"{name}.png"]


# --------------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from tqdm import tqdm

    from loaders import torch_missing

    os.makedirs(args.out, exist_ok=True)
    why_no_torch = None if args.no_peers else torch_missing()
    have_torch = not args.no_peers and why_no_torch is None
    if why_no_torch and not args.no_peers:
        print(f"note: no torch DataLoader row: {why_no_torch}", file=sys.stderr)
    videos, recipes, eval_recipes = {}, {}, {}
    for content in args.contents:
        paths, videos[content] = make_recipe_videos(args, content)
        recipes[content] = Recipe(tuple(paths), args.clip_len, args.frame_step, args.side)
        eval_recipes[content] = Recipe(tuple(eval_names(paths, _EVAL_NAMES)), args.clip_len, args.frame_step,
                                       args.side)
        videos[content]["anatomy"] = anatomy(paths, args.side, args.gop, args.clip_len, args.frame_step)
    rows = plan(args, have_torch)

    # Paid once, outside every measurement: TensorFlow's import and the forkserver's start.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401

    if have_torch:
        from cpu_vs_workers import start_forkserver

        start_forkserver()
    machine = machine_info()

    runs = []
    order = random.Random(args.seed)
    tasks = [(c, r) for c in args.contents for r in rows]
    with tqdm(total=len(tasks) * args.reps, unit="run", dynamic_ncols=True) as bar:
        for rep in range(args.reps):
            for content, row in order.sample(tasks, len(tasks)):
                bar.set_description(f"rep {rep + 1}/{args.reps} {content} {row.key}")
                r = run_quietly(row, rep, args, content, recipes[content], eval_recipes[content])
                if r.get("error"):
                    tqdm.write(f"{content} {row.key}: {r['error']}")
                runs.append(r)
                bar.update()

    config = {k: v for k, v in vars(args).items()}
    config["video_size"] = list(args.video_size)
    doc = {
        "name": args.name,
        "command": " ".join(shlex.quote(a) for a in ["python", "bench/recipes.py", *argv]),
        "machine": machine,
        "config": config,
        "videos": videos,
        "rows": [dataclasses.asdict(r) for r in rows],
        "summary": summarize(runs, rows),
        "targets": targets(runs, args.contents, args),
        "runs": runs,
        "notes": standing_notes(args, have_torch, why_no_torch) + retry_notes(runs, args) + error_notes(runs),
    }
    doc["wall_s"] = time.perf_counter() - t_start
    if not args.no_plots:
        doc["plots"] = plot(doc, args.out, args.name)
    save(doc, markdown(doc), args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
