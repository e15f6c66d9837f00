"""Prepared copies against their sources: random clips one per sample, and what preparing costs.

The sources are Kinetics-style textured frame-code videos (``workloads.write_textured``: the codes
over a panning texture with noise), ``--video-frames`` frames at ``--video-size``, encoded as
downloads are (x264 preset medium, CRF 23, x264's own keyframe placement: one every 250 frames at
most, B-frames). ``shmloader.prepare`` copies them once per ``--gops`` x ``--short-sides``
combination (timed, in ``--prepare-workers`` processes); every set is then read the same way:
random ``clip_len``-frame clips, every ``frame_step``-th frame, scaled to ``side x side``, one clip
per sample, through ``Loader.as_dataset()`` at ``--workers`` workers.

Per set: clips/s at the consumer, CPU ms per delivered clip, the disk the set takes against the
sources, and for the copies the seconds of preparing per second of video per core and the PSNR
of their frames against the sources' scaled to the copy's size by the loader's own scaler (RGB,
the first ``--psnr-frames`` frames of every video). The summary
gives copies / sources clips/s per set.

    python bench/prepare.py                                   # ~5 minutes on 2 cores
    python bench/prepare.py --video-count 2 --duration 1 --reps 1 --no-plots   # a check that it runs

The sources are written once into ``.cache/prepare``, the copies into folders beside them (kept:
a second run reuses them through prepare's own rerun, and times what it did, nothing then).
Like the other benchmarks, this module imports neither TensorFlow nor torch at the top.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import harness
import report
from report import fmt, table
from workloads import ClipSet, Workload, write_textured, written

SOURCES = "sources"


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2, help="loader workers")
    p.add_argument("--prepare-workers", type=int, default=None, help="prepare's processes (default: one per CPU)")
    p.add_argument("--gops", type=harness.ints, default=[16], help="keyframe intervals of the copies")
    p.add_argument("--short-sides", type=harness.ints, default=[128], help="short sides of the copies")
    p.add_argument("--side", type=int, default=112, help="clips are scaled to side x side")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per run, at least")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "prepare"),
                   help="where the sources and the copies are written (reused when present)")
    p.add_argument("--video-count", type=int, default=8)
    p.add_argument("--video-frames", type=int, default=250, help="frames per source (10 s at 25 fps)")
    p.add_argument("--video-size", type=harness.size, default=(256, 340), help="HxW of the sources")
    p.add_argument("--psnr-frames", type=int, default=50, help="frames of each video the PSNR is measured on")


def psnr(sources, copies, frames: int) -> float:
    """PSNR (dB, RGB) of the copies' first ``frames`` frames against the sources' scaled to the
    copy's size, both read by the loader's PyAV reader."""
    import numpy as np

    from shmloader.video.probe import probe
    from shmloader.video.pyav import PyAV

    errors = []
    for source, copy in zip(sources, copies):
        c, s = probe(copy), probe(source)
        idx = np.arange(min(frames, c.frames))
        a = PyAV(1).decode(c, None, idx).astype(np.float64)
        b = PyAV(1).decode(s, (c.height, c.width), idx).astype(np.float64)
        errors.append(((a - b) ** 2).mean())
    return float(10 * np.log10(255.0**2 / np.mean(errors)))


def _disk(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def prepare(args, notes: list[str]) -> dict:
    from shmloader.video.prepare import prepare_files

    h, w = args.video_size
    src = os.path.join(args.cache, f"sources_{args.video_frames}f_{h}x{w}")
    os.makedirs(src, exist_ok=True)
    paths = []
    for i in range(args.video_count):
        p = os.path.join(src, f"textured_{i:03d}.mp4")
        paths.append(written(p, lambda tmp: write_textured(tmp, i, args.video_frames, (h, w), fps=25, gop=0,
                                                           options={"crf": "23", "preset": "medium"})))
    labels = tuple(i % 2 for i in range(len(paths)))
    sets = {SOURCES: {"clips": ClipSet(tuple(paths), labels), "disk": _disk(paths)}}
    seconds = len(paths) * args.video_frames / 25
    for gop in args.gops:
        for short in args.short_sides:
            name = f"G={gop} short side {short}"
            out = os.path.join(args.cache, f"copies_{args.video_frames}f_{h}x{w}_g{gop}_s{short}")
            t0 = time.perf_counter()
            summary = prepare_files([src], out, short_side=short, gop=gop,
                                                            workers=args.prepare_workers)
            took = time.perf_counter() - t0
            copies = [os.path.join(out, os.path.basename(p)) for p in paths]
            cores = min(args.prepare_workers or os.cpu_count() or 1, len(paths))
            sets[name] = {"clips": ClipSet(tuple(copies), labels), "disk": _disk(copies),
                          "prepared": summary["prepared"], "psnr_db": psnr(paths, copies, args.psnr_frames),
                          "prepare_s_per_video_s_per_core": took * cores / seconds if summary["prepared"] else None}
    notes.append(f"Sources: {len(paths)} textured frame-code videos, {args.video_frames} frames at {h}x{w}, 25 fps, "
                 f"x264 preset medium CRF 23 with its own keyframes ({sets[SOURCES]['disk'] / 1e6:.2f} MB).")
    wl = Workload("prepare", args.clip_len, (args.side, args.side), 0, "random clips", frame_step=args.frame_step)
    return {"sets": sets, "wl": wl}


def cells(args, ctx: dict) -> list[list]:
    return [list(ctx["sets"])]  # one block: the sources and every copy back to back


def run(cell, rep: int, args, ctx: dict) -> dict:
    import loaders
    from measure import Result, run_pipeline

    clips, wl = ctx["sets"][cell]["clips"], ctx["wl"]
    res = Result(cell, wl.name, str(args.workers), rep)
    try:
        run_pipeline(lambda: loaders.shm(clips, wl, args.workers, args.batch_size),
                     res, clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                     warmup=args.warmup)
    except Exception as e:  # noqa: BLE001  # one broken row must not lose the others' results
        res.error = f"{type(e).__name__}: {e}"
    out = dataclasses.asdict(res)
    out["set"] = cell
    return out


METRICS = ("clips_per_s", "cpu_ms_per_clip", "other_cpu_pct")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("set",), METRICS)
    sources = ctx["sets"][SOURCES]
    doc["sets"] = {name: {"disk_mb": s["disk"] / 1e6, "disk_ratio": s["disk"] / sources["disk"],
                          "psnr_db": s.get("psnr_db"),
                          "prepare_s_per_video_s_per_core": s.get("prepare_s_per_video_s_per_core"),
                          "vs_sources": report.ratio(runs, {"set": name}, {"set": SOURCES}, "clips_per_s")}
                   for name, s in ctx["sets"].items()}
    if any(s.get("prepared") == 0 for s in ctx["sets"].values()):
        doc["notes"].append("Some copies were made by an earlier run (prepare kept them): their preparing time "
                            "is not in this run.")


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Prepared copies against their sources, one clip per sample")
    c = doc["config"]
    lines += [(f"W={c['workers']}, random {c['clip_len']}-frame clips (frame_step {c['frame_step']}) at "
               f"{c['side']}x{c['side']}, batch {c['batch_size']}, through `Loader.as_dataset()`; medians "
               f"(min-max) over {c['reps']} interleaved repetitions."), ""]
    rows = []
    for name, s in doc["sets"].items():
        summary = doc["summary"].get(name, {})
        r = s["vs_sources"]
        prep = s["prepare_s_per_video_s_per_core"]
        ratio = "–" if not r else f"{r['ratio']:.2f}"
        per_core = "–" if prep is None else f"{prep:.3f}"
        db = "–" if s["psnr_db"] is None else f"{s['psnr_db']:.1f}"
        rows.append(f"| {name} | {fmt(summary.get('clips_per_s'), 1)} | {ratio} | "
                    f"{fmt(summary.get('cpu_ms_per_clip'), 1)} | {s['disk_mb']:.2f} ({s['disk_ratio']:.2f}x) | "
                    f"{per_core} | {db} |")
    lines += table("| set | clips/s | / sources | CPU ms/clip | disk MB (/ sources) | prepare s per video s per "
                   "core | PSNR dB |", rows)
    return "\n".join(lines + [""] + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    labels = [n for n in doc["sets"] if doc["summary"].get(n, {}).get("clips_per_s")]
    report.bars(ax, labels, [doc["summary"][n]["clips_per_s"] for n in labels],
                ["#9ecae1" if n == SOURCES else "#3182bd" for n in labels])
    ax.set_ylabel("clips/s")
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/prepare.py", name="prepare-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
