"""What grouped decode does to batches (issue #36): ``VideoClips(clips_per_video=K,
group_clips=True)`` over real loaders, read from the batches' own ``index`` field.

For K = 1 (one clip per sample, shuffled: the reference), 2, 4 and 8, one loader per K runs
``--epochs`` epochs over ``--videos`` videos and this script records which video every
delivered sample came from. Per K it reports:

* distinct videos per batch (median, min, max over the batches);
* over how many batches a video's K clips of one epoch spread (median, max), and how far apart
  its first and last batch lie (median, max);
* frames decoded per delivered frame (``Loader.stats()``, counted from the keyframes), and
  clips/s (wall, one run: a shared machine makes it indicative only).

The spread follows the shuffle window (``Loader(group_window=)``: by default 4 batches' worth of
samples): a window's videos fill consecutive batches. Writes ``<out>/<name>.json`` and ``.md``.

    python bench/grouping.py                         # 64 videos, batch 16, K = 1, 2, 4, 8
    python bench/grouping.py --videos 16 --batch 8 --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np

import shmloader
from shmloader.samples import make_videos


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
            clip_len: int = 8, frame_step: int = 2, size: tuple[int, int] = (64, 64)) -> dict:
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
             f"Command: `{doc['command']}`  ", f"Machine: {doc['machine']}  ",
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
    return "\n".join(lines) + "\n"


# report.py writes a committed result again from its json: it asks the script for BENCH.markdown.
BENCH = types.SimpleNamespace(markdown=markdown, plot=lambda doc, folder, name: [])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=int, default=64)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--gop", type=int, default=250)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "shmloader-grouping"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="grouping-cpu2")
    p.add_argument("--quick", action="store_true", help="8 videos of 60 frames, K = 1, 4: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.videos, args.frames, args.gop, args.ks, args.batch = min(args.videos, 8), 60, 30, "1,4", 4
    paths, labels = make_videos(args.folder, count=args.videos, frames=args.frames, size=(96, 128), gop=args.gop)
    rows = [measure(paths, labels, int(k), batch_size=args.batch, epochs=args.epochs, workers=args.workers)
            for k in args.ks.split(",")]
    import platform

    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
    doc = {"command": "python bench/grouping.py " + " ".join(argv), "rows": rows,
           "machine": f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, "
                      f"Python {platform.python_version()}",
           "config": {"videos": args.videos, "frames": args.frames, "gop": args.gop, "batch": args.batch,
                      "workers": args.workers, "epochs": args.epochs, "clip_len": 8, "frame_step": 2}}
    sys.path.insert(0, HERE)
    import report

    os.makedirs(args.out, exist_ok=True)
    report.save(doc, markdown(doc), args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
