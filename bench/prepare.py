"""Prepared copies against their sources and the TFRecord routes: random clips one per sample, and
what preparing costs.

The sources are Kinetics-style textured frame-code videos (``workloads.write_textured``: the codes
over a panning texture with noise), ``--video-frames`` frames at ``--video-size``, encoded as
downloads are (x264 preset medium, CRF 23, x264's own keyframe placement: one every 250 frames at
most, B-frames). ``shmloader.prepare`` copies them once per ``--gops`` x ``--short-sides``
combination at the first of ``--crfs``, and at the smallest short side with each other CRF
(timed, in ``--prepare-workers`` processes). ``--routes``: the TFRecord routes of
``bench/tfrecord.py`` beside them (the epoch-0 clips cut once at the clip size, as JPEG frames or
raw; ``tfrecord.convert``, one process, is their preparing). Every set is then read the same way:
random ``clip_len``-frame clips, every ``frame_step``-th frame, scaled to ``side x side``, one clip
per sample, through ``Loader.as_dataset()`` at ``--workers`` workers (the TFRecord routes: their
tf.data pipeline, AUTOTUNE), and by its decode alone: one process, the loader's reader
(``VideoClips.reader().read``) or the route's pipeline on one thread, for ``--alone-duration``.

Per set: clips/s at the consumer, CPU ms per delivered clip, frames decoded per delivered frame
(``Loader.stats()``), clips/s of the decode alone, the disk the set takes against the sources,
and for the copies the seconds of preparing per second of video per core and the PSNR (RGB, the
first ``--psnr-frames`` frames of every video) of their frames against the sources' scaled to the
copy's size by the loader's own scaler, and at the training size (both scaled to ``side x
side``). The summary gives each set's clips/s / the sources'.

    python bench/prepare.py                                   # ~5 minutes on 2 cores
    python bench/prepare.py --gops 8,16,32 --short-sides 128,256 --crfs 23,18   # ~15 minutes
    python bench/prepare.py --video-count 2 --duration 1 --alone-duration 1 --reps 1 --no-plots
                                                              # a check that it runs

The sources are written once into ``.cache/prepare``, the copies and the records into folders
beside them (kept: a second run reuses them through prepare's own rerun, and times what it did,
nothing then; the records keep their first conversion's time).
Like the other benchmarks, this module imports neither TensorFlow nor torch at the top.
"""

from __future__ import annotations

import math
import os
import sys
import time

import harness
import report
from report import fmt, table
from workloads import CLIPS_PER_VIDEO, ClipSet, Workload, write_textured, written

SOURCES = "sources"
ROUTES = ("tfrecord-jpeg", "tfrecord-raw")
MODES = ("loader", "alone")
DEFAULT_CRF = 23  # shmloader prepare's: a set at another CRF names it


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2, help="loader workers")
    p.add_argument("--prepare-workers", type=int, default=None, help="prepare's processes (default: one per CPU)")
    p.add_argument("--gops", type=harness.ints, default=[16], help="keyframe intervals of the copies")
    p.add_argument("--short-sides", type=harness.ints, default=[128], help="short sides of the copies")
    p.add_argument("--side", type=int, default=112, help="clips are scaled to side x side")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--crfs", type=harness.ints, default=[DEFAULT_CRF],
                   help="x264 CRFs of the copies: the first at every GOP and short side, the others at the "
                        "smallest short side")
    p.add_argument("--routes", type=harness.names(ROUTES), default=list(ROUTES),
                   help="TFRecord routes beside the copies ('' for none)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per loader run, at least")
    p.add_argument("--alone-duration", type=float, default=5.0, help="seconds measured per decode-alone run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "prepare"),
                   help="where the sources and the copies are written (reused when present)")
    p.add_argument("--video-count", type=int, default=8)
    p.add_argument("--video-frames", type=int, default=250, help="frames per source (10 s at 25 fps)")
    p.add_argument("--video-size", type=harness.size, default=(256, 340), help="HxW of the sources")
    p.add_argument("--psnr-frames", type=int, default=50, help="frames of each video the PSNR is measured on")


def _db(errors: list[float]) -> float:
    import numpy as np

    mse = float(np.mean(errors))
    return math.inf if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def psnr(sources, copies, frames: int, size: tuple[int, int] | None = None) -> float:
    """PSNR (dB, RGB) of the copies' first ``frames`` frames against the sources', both read by
    the loader's PyAV reader: the sources scaled to the copy's size, or both to ``size``."""
    import numpy as np

    from shmloader.video.probe import probe
    from shmloader.video.pyav import PyAV

    errors = []
    for source, copy in zip(sources, copies):
        c, s = probe(copy), probe(source)
        idx = np.arange(min(frames, c.frames))
        a = PyAV(1).decode(c, size, idx).astype(np.float64)
        b = PyAV(1).decode(s, size or (c.height, c.width), idx).astype(np.float64)
        errors.append(((a - b) ** 2).mean())
    return _db(errors)


def psnr_records(info: dict, sources: ClipSet, wl: Workload) -> float:
    """PSNR (dB, RGB) of every clip a TFRecord route stored against decord's decode of the same
    frames at the same size (what ``tfrecord.convert`` stored before encoding)."""
    import numpy as np

    import tfrecord
    from workloads import decode_clip

    errors = [((clip.astype(np.float64) - decode_clip(sources, wl, 0, sample)[0]) ** 2).mean()
              for sample, clip in tfrecord.stored_clips(info, wl)]
    return _db(errors)


def _disk(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def _copies(args) -> list[tuple[int, int, int]]:
    """(GOP, short side, CRF) of every set of copies: the first CRF everywhere, the others at
    the smallest short side."""
    first, *others = args.crfs
    return ([(g, s, first) for g in args.gops for s in args.short_sides]
            + [(g, min(args.short_sides), crf) for crf in others for g in args.gops])


def prepare(args, notes: list[str]) -> dict:
    from shmloader.tools.prepare import prepare_files

    h, w = args.video_size
    src = os.path.join(args.cache, f"sources_{args.video_frames}f_{h}x{w}")
    os.makedirs(src, exist_ok=True)
    paths = []
    for i in range(args.video_count):
        p = os.path.join(src, f"textured_{i:03d}.mp4")
        paths.append(written(p, lambda tmp: write_textured(tmp, i, args.video_frames, (h, w), fps=25, gop=0,
                                                           options={"crf": "23", "preset": "medium"})))
    labels = tuple(i % 2 for i in range(len(paths)))
    sources = ClipSet(tuple(paths), labels)
    sets = {SOURCES: {"clips": sources, "disk": _disk(paths)}}
    seconds = len(paths) * args.video_frames / 25
    train = (args.side, args.side)
    for gop, short, crf in _copies(args):
        name = f"G={gop} short side {short}" + (f" CRF {crf}" if crf != DEFAULT_CRF else "")
        out = os.path.join(args.cache, f"copies_{args.video_frames}f_{h}x{w}_g{gop}_s{short}"
                           + (f"_c{crf}" if crf != DEFAULT_CRF else ""))
        t0 = time.perf_counter()
        summary = prepare_files([src], out, short_side=short, gop=gop, crf=crf, workers=args.prepare_workers)
        took = time.perf_counter() - t0
        copies = [os.path.join(out, os.path.basename(p)) for p in paths]
        done = summary["prepared"]  # a rerun copies only what is missing or changed
        cores = min(args.prepare_workers or os.cpu_count() or 1, max(done, 1))
        sets[name] = {"clips": ClipSet(tuple(copies), labels), "disk": _disk(copies),
                      "prepared": done, "psnr_db": psnr(paths, copies, args.psnr_frames),
                      "psnr_train_db": psnr(paths, copies, args.psnr_frames, train),
                      "prepare_s_per_video_s_per_core": took * cores / (seconds * done / len(paths)) if done else None}
    notes.append(f"Sources: {len(paths)} textured frame-code videos, {args.video_frames} frames at {h}x{w}, 25 fps, "
                 f"x264 preset medium CRF 23 with its own keyframes ({sets[SOURCES]['disk'] / 1e6:.2f} MB).")
    wl = Workload("prepare", args.clip_len, train, 0, "random clips", frame_step=args.frame_step)
    import tfrecord

    for route in args.routes:
        info = tfrecord.convert(sources, wl, route.split("-")[1], root=os.path.join(args.cache, "tfrecord"))
        sets[route] = {"clips": sources, "disk": info["bytes"], "route": route, "decoded_per_frame": 0.0,
                       "psnr_train_db": psnr_records(info, sources, wl),
                       "prepare_s_per_video_s_per_core": info["conversion_s"] / seconds}
    if args.routes:
        stored = CLIPS_PER_VIDEO * args.clip_len
        notes.append(f"TFRecord routes (bench/tfrecord.py): the {CLIPS_PER_VIDEO} epoch-0 clips of every video cut "
                     f"once at {args.side}x{args.side} ({stored} of its {args.video_frames} frames), read by "
                     "tf.data (TFRecordDataset + map(parse and decode), AUTOTUNE: its own threads, not "
                     f"--workers); every epoch reads those clips again. Holding every frame at that size "
                     f"would take {args.video_frames / stored:.1f}x their disk. Their preparing time is "
                     "tfrecord.convert's, one process (decord decode, JPEG encode or not, write), from the "
                     "run that wrote them; they decode no video frame (JPEG: one image per frame), and their "
                     "PSNR is against decord's decode of the same frames at that size (raw: lossless).")
    notes.append("Decode alone: one process, no loader: the copies and sources through VideoClips(...).reader()"
                 ".read([sample]) in the loader's sample order (a warm-up read of every video first), the "
                 "TFRecord routes through their pipeline on one thread (no parallel reads, no prefetch).")
    notes.append(f"PSNR at {args.side}x{args.side}: the copy and the source both scaled to the training size by "
                 "the loader's PyAV reader (what a model sees); the other PSNR column is at the copy's size.")
    return {"sets": sets, "wl": wl}


def cells(args, ctx: dict) -> list[list]:
    return [[(name, mode) for name in ctx["sets"] for mode in MODES]]  # one block: every set, both ways


def _alone(s: dict, args, wl: Workload, res) -> float | None:
    """The set's decode alone into ``res``; returns frames decoded per delivered frame."""
    from measure import reader_step, run_timed

    if "route" in s:
        import peers

        pipe = peers.tfrecord_alone(s["clips"], wl, args.batch_size, s["route"].split("-")[1])
        try:
            next(pipe)
            run_timed(lambda: int(next(pipe)["video"].shape[0]), args.alone_duration, res)
        finally:
            pipe.close()
        return s["decoded_per_frame"]
    import shmloader

    clips = s["clips"]
    reader = shmloader.VideoClips(list(clips.paths), list(clips.labels), clip_len=wl.clip_len,
                                  frame_step=wl.frame_step, clips_per_video=CLIPS_PER_VIDEO, size=wl.size,
                                  sampling="random").reader()
    step = reader_step(reader, len(clips.paths), CLIPS_PER_VIDEO)
    warm = reader.counters()
    run_timed(step, args.alone_duration, res)
    now = reader.counters()
    delivered = now["frames_delivered"] - warm["frames_delivered"]
    return (now["frames_decoded"] - warm["frames_decoded"]) / delivered if delivered else None


def run(cell, rep: int, args, ctx: dict) -> dict:
    import loaders
    import peers
    from measure import Result, row_of, run_pipeline

    name, mode = cell
    s, wl = ctx["sets"][name], ctx["wl"]
    res = Result(name, wl.name, "1" if mode == "alone" else str(args.workers), rep)
    measured = dict(clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration, warmup=args.warmup)

    def measure() -> dict | None:
        if mode == "alone":
            return {"decoded_per_frame": _alone(s, args, wl, res)}
        if "route" in s:
            run_pipeline(lambda: peers.PEERS[s["route"]](s["clips"], wl, args.workers, args.batch_size), res,
                         **measured)
            return None
        run_pipeline(lambda: loaders.shm(s["clips"], wl, args.workers, args.batch_size), res, **measured)
        return {"decoded_per_frame": res.extra.get("decoded_per_frame")}

    return row_of(res, measure, set=name, mode=mode, decoded_per_frame=s.get("decoded_per_frame"))


METRICS = ("clips_per_s", "cpu_ms_per_clip", "other_cpu_pct", "decoded_per_frame")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    by_mode = {m: [r for r in runs if r.get("mode", "loader") == m] for m in MODES}
    doc["summary"] = report.summarize(by_mode["loader"], ("set",), METRICS)
    doc["alone"] = report.summarize(by_mode["alone"], ("set",), METRICS)
    sources = ctx["sets"][SOURCES]
    doc["sets"] = {name: {"disk_mb": s["disk"] / 1e6, "disk_ratio": s["disk"] / sources["disk"],
                          "psnr_db": s.get("psnr_db"), "psnr_train_db": s.get("psnr_train_db"),
                          "prepare_s_per_video_s_per_core": s.get("prepare_s_per_video_s_per_core"),
                          "vs_sources": report.ratio(by_mode["loader"], {"set": name}, {"set": SOURCES},
                                                     "clips_per_s")}
                   for name, s in ctx["sets"].items()}
    if any(s.get("prepared", len(paths := s["clips"].paths)) < len(paths) for s in ctx["sets"].values()):
        doc["notes"].append("Some copies were made by an earlier run (prepare kept them): their preparing time "
                            "is not in this run (a set's time is over the videos this run copied).")


def _db_cell(value: float | None) -> str:
    return "–" if value is None else "lossless" if math.isinf(value) else f"{value:.1f}"


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Prepared copies against their sources, one clip per sample")
    c = doc["config"]
    lines += [(f"W={c['workers']}, random {c['clip_len']}-frame clips (frame_step {c['frame_step']}) at "
               f"{c['side']}x{c['side']}, batch {c['batch_size']}, through `Loader.as_dataset()`; medians "
               f"(min-max) over {c['reps']} interleaved repetitions."), ""]
    alone = "alone" in doc  # results from before the decode-alone, decoded-per-frame and TFRecord columns
    rows = []
    for name, s in doc["sets"].items():
        summary = doc["summary"].get(name, {})
        r = s["vs_sources"]
        prep = s["prepare_s_per_video_s_per_core"]
        ratio = "–" if not r else f"{r['ratio']:.2f}"
        per_core = "–" if prep is None else f"{prep:.3f}"
        disk = f"{s['disk_mb']:.2f} ({s['disk_ratio']:.2f}x)"
        if alone:
            rows.append(f"| {name} | {fmt(summary.get('clips_per_s'), 1)} | {ratio} | "
                        f"{fmt(doc['alone'].get(name, {}).get('clips_per_s'), 1)} | "
                        f"{fmt(summary.get('cpu_ms_per_clip'), 1)} | {fmt(summary.get('decoded_per_frame'), 2)} | "
                        f"{disk} | {per_core} | {_db_cell(s['psnr_db'])} | {_db_cell(s['psnr_train_db'])} |")
        else:
            rows.append(f"| {name} | {fmt(summary.get('clips_per_s'), 1)} | {ratio} | "
                        f"{fmt(summary.get('cpu_ms_per_clip'), 1)} | {disk} | {per_core} | {_db_cell(s['psnr_db'])} |")
    if alone:
        lines += table("| set | clips/s | / sources | decode alone clips/s (1 process) | CPU ms/clip | decoded per "
                       "delivered frame | disk MB (/ sources) | prepare s per video s per core | PSNR dB | "
                       f"PSNR dB at {c['side']}x{c['side']} |", rows)
    else:
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
