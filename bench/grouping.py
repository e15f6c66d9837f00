"""What grouped decode does to batches (issue #36): ``VideoClips(clips_per_video=K,
group_clips=True)`` over real loaders, read from the batches' own ``index`` field.

For K = 1 (one clip per sample, shuffled: the reference), 2, 4 and 8, one loader per K runs
``--epochs`` epochs over ``--videos`` videos and this script records which video every
delivered sample came from. Per K it reports:

* distinct videos per batch (median, min, max over the batches);
* over how many batches a video's K clips of one epoch spread (median, max), and how far apart
  its first and last batch lie (median, max);
* frames decoded per delivered frame (``Loader.stats()``, counted from the keyframes), and
  clips/s (wall, one run by default (``--reps``): a shared machine makes it indicative only).

The spread follows the shuffle window (``Loader(group_window=)``: by default 4 batches' worth of
samples): a window's videos fill consecutive batches. Runs on ``harness.Benchmark`` (its options:
``--reps``, ``--out``, ``--name``...); writes ``<out>/<name>.json`` and ``.md``.

    python bench/grouping.py                         # 64 videos, batch 16, K = 1, 2, 4, 8
    python bench/grouping.py --videos 16 --batch 8 --quick
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness
import numpy as np
import report

import shmloader
from shmloader.samples import make_videos

CLIP_LEN, FRAME_STEP = 8, 2


def batch_structure(indices: list[np.ndarray], epochs_of: list[int]) -> dict:
    """From the ``index`` field of each delivered batch (and the epoch each batch began in):
    distinct videos per batch, and per (epoch, video) the batches its clips went to."""
    distinct = [len(set(ix.tolist())) for ix in indices]
    where: dict[tuple[int, int], list[int]] = {}
    for b, (ix, e) in enumerate(zip(indices, epochs_of)):
        for v in ix.tolist():
            where.setdefault((e, v), []).append(b)
    spread = [len(set(bs)) for bs in where.values()]
    span = [max(bs) - min(bs) + 1 for bs in where.values()]
    return {"batches": len(indices), "distinct_median": statistics.median(distinct), "distinct_min": min(distinct),
            "distinct_max": max(distinct), "spread_median": statistics.median(spread), "spread_max": max(spread),
            "span_median": statistics.median(span), "span_max": max(span),
            "clips_per_video_epoch": statistics.median(len(bs) for bs in where.values())}


def measure(paths: list[str], labels: list[int], k: int, *, batch_size: int, epochs: int, workers: int,
            clip_len: int = CLIP_LEN, frame_step: int = FRAME_STEP, size: tuple[int, int] = (64, 64)) -> dict:
    """One loader with ``clips_per_video=k`` (grouped when k > 1): its batches' structure and stats."""
    clips = shmloader.VideoClips(paths, labels, clip_len=clip_len, frame_step=frame_step, size=size,
                                 clips_per_video=k, group_clips=k > 1)
    indices = []
    with shmloader.Loader(clips, batch_size=batch_size, workers=workers, shuffle=True, epochs=epochs,
                          drop_remainder=True) as loader:
        t0 = None
        for batch in loader:
            t0 = t0 or time.perf_counter()
            indices.append(batch["index"].copy())
        wall = time.perf_counter() - (t0 or time.perf_counter())
        s = loader.stats()
    epochs_of = [b // len(loader) for b in range(len(indices))]  # whole batches: none spans two epochs
    return {"k": k, **batch_structure(indices, epochs_of), "decoded_per_frame": s["decoded_per_frame"],
           "clips_per_s": (len(indices) - 1) * batch_size / wall if wall > 0 else None}


def markdown(doc: dict) -> str:
    c = doc["config"]
    lines = ["# What grouped decode does to batches", "",
             f"Command: `{doc['command']}`  ", f"Machine: {report.machine_line(doc['machine'])}  ",
             (f"{c['videos']} videos ({c['frames']} frames, a keyframe every {c['gop']}), batch {c['batch']}, "
             f"{c['workers']} workers, {c['epochs']} epochs, shuffled, clips of {c['clip_len']} frames every "
             f"{c['frame_step']}nd; default shuffle window (4 batches of samples)."), "",
             ("| clips per video K | distinct videos per batch, median (min-max) | batches a video's clips spread over, "
             "median (max) | first to last batch, median (max) | frames decoded per delivered frame | clips/s (one run) |"),
             "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        name = "1 (one clip per sample)" if r["k"] == 1 else f"{r['k']}, `group_clips=True`"
        rate = "-" if r["clips_per_s"] is None else f"{r['clips_per_s']:.0f}"
        lines.append(f"| {name} | {r['distinct_median']:g} ({r['distinct_min']}-{r['distinct_max']}) | "
                     f"{r['spread_median']:g} ({r['spread_max']}) | {r['span_median']:g} ({r['span_max']}) | "
                     f"{r['decoded_per_frame']:.2f} | {rate} |")
    return "\n".join(lines + [""] + report.tail(doc)).rstrip("\n") + "\n"


def options(p) -> None:
    p.add_argument("--videos", type=int, default=64)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--gop", type=int, default=250)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "shmloader-grouping"))
    p.add_argument("--quick", action="store_true", help="8 videos of 60 frames, K = 1, 4: a smoke run")


def prepare(args, notes: list[str]) -> dict:
    if args.quick:
        args.videos, args.frames, args.gop, args.ks, args.batch = min(args.videos, 8), 60, 30, "1,4", 4
    paths, labels = make_videos(args.folder, count=args.videos, frames=args.frames, size=(96, 128), gop=args.gop)
    return {"paths": paths, "labels": labels}


def run(k: int, rep: int, args, ctx: dict) -> dict:
    row = measure(ctx["paths"], ctx["labels"], k, batch_size=args.batch, epochs=args.epochs, workers=args.workers,
                  clip_len=CLIP_LEN, frame_step=FRAME_STEP)
    return {**row, "rep": rep}


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["config"].update(clip_len=CLIP_LEN, frame_step=FRAME_STEP)
    doc["rows"] = sorted(runs, key=lambda r: (r["k"], r["rep"]))


# report.py writes a committed result again from its json: it asks the script for BENCH.markdown.
BENCH = harness.Benchmark(
    script="bench/grouping.py", name="grouping-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=lambda args, ctx: [harness.ints(args.ks)], run=run, report=summarize, markdown=markdown,
    plot=lambda doc, folder, name: [], label=lambda k: f"K={k}", retry=False, reps=1, preload=())


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
