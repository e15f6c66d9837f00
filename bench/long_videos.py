"""Long videos: what a clip costs on a 20-minute file against a 10-second file of the same encode.

Both files are H.264 frame-code videos (``shmloader.samples``) at the same size, frame rate and
GOP (one keyframe every ``--gop`` frames), so the decoding work of a random clip is the same;
what differs is what opening and probing a file reads. Two ways to use them:

* ``one``: one file, every clip from it (``clips_per_video=64``): a worker may keep what it
  learnt about the file. Batches of one clip: a worker decodes the clips of one video in a batch
  in one pass, which on a 250-frame file would share most of the decoding between them;
* ``many``: ``--names`` names of the file (hard links), one clip each, in a shuffled order:
  every clip from another file, as in a large dataset, where no reader or probe is reused.

Each with ``decoder="auto"``, ``"pyav"`` and ``"decord"``, at ``--workers`` workers, random
``clip_len``-frame clips scaled to ``side x side``, through ``Loader.as_dataset()``. Per row:
clips/s at the consumer and CPU ms per delivered clip (every process of the run). The summary
gives, per decoder and use, long / short: 1.0 means a clip of a long video costs what a clip
of a short one costs.

    python bench/long_videos.py                       # ~5 minutes on 2 cores, after writing the videos
    python bench/long_videos.py --commit c5bd966      # the same run against an earlier commit

The videos are written once into ``.cache/long`` (the 20-minute one takes ~90 s).
Like the other benchmarks, this module imports neither TensorFlow nor torch at the top.
"""

from __future__ import annotations

import os
import sys

import harness
import report
from report import fmt, table
from workloads import ClipSet, Workload, written

DECODERS = ("auto", "pyav", "decord")
USES = ("one", "many")
LENGTHS = ("short", "long")


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--short-frames", type=int, default=250, help="frames of the short video (10 s at 25 fps)")
    p.add_argument("--long-frames", type=int, default=30_000, help="frames of the long video (20 min at 25 fps)")
    p.add_argument("--gop", type=int, default=250)
    # More names than a run measures clips: no worker meets a name twice, so none reuses a probe.
    p.add_argument("--names", type=int, default=4000, help="names (hard links) of each file in the 'many' use")
    p.add_argument("--side", type=int, default=112)
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8, help="of the 'many' use ('one': 1)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run, at least")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--decoders", type=harness.names(DECODERS), default=list(DECODERS))
    harness.video_options(p, "long", 1, 0, codec=False)


def prepare(args, notes: list[str]) -> dict:
    from shmloader.samples import write_video

    os.makedirs(args.cache, exist_ok=True)
    h, w = args.video_size
    files = {}
    for length, frames in (("short", args.short_frames), ("long", args.long_frames)):
        path = os.path.join(args.cache, f"{length}_{frames}f_{h}x{w}_gop{args.gop}.mp4")
        written(path, lambda tmp: write_video(tmp, 1, frames=frames, size=(h, w), gop=args.gop))
        folder = os.path.join(args.cache, f"names_{length}_{frames}f_{h}x{w}_gop{args.gop}")
        os.makedirs(folder, exist_ok=True)
        links = []
        for i in range(args.names):
            link = os.path.join(folder, f"{i:05d}.mp4")
            if not os.path.exists(link):
                os.link(path, link)
            links.append(link)
        files[length] = {"one": ClipSet((path,), (0,)), "many": ClipSet(tuple(links), (0,) * len(links))}
    notes.append(f"Videos: H.264 frame codes, {h}x{w}, 25 fps, one keyframe every {args.gop} frames; short "
                 f"{args.short_frames} frames ({os.path.getsize(files['short']['one'].paths[0]) / 1e6:.2f} MB), "
                 f"long {args.long_frames} frames ({os.path.getsize(files['long']['one'].paths[0]) / 1e6:.1f} MB). "
                 "Frame codes are flat cells: decoding a frame costs little, so what opening a file costs "
                 "weighs more here than on camera footage.")
    wl = Workload("long", args.clip_len, (args.side, args.side), 0, "random clips")
    return {"files": files, "wl": wl}


def cells(args, ctx: dict) -> list[list]:
    # A block per use: short and long, every decoder, side by side.
    return [[(use, length, d) for length in LENGTHS for d in args.decoders] for use in USES]


def run(cell, rep: int, args, ctx: dict) -> dict:
    import loaders
    from measure import Result, row_of, run_pipeline

    use, length, decoder = cell
    clips, wl = ctx["files"][length][use], ctx["wl"]
    res = Result(f"{use}/{length}/{decoder}", length, str(args.workers), rep)
    res.extra.update(use=use, length=length, decoder=decoder)
    per_video, batch = (64, 1) if use == "one" else (1, args.batch_size)

    def measure() -> None:
        run_pipeline(lambda: loaders.shm(clips, wl, args.workers, batch, decoder=decoder,
                                         clips_per_video=per_video),
                     res, clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                     warmup=args.warmup)

    return row_of(res, measure, use=use, length=length, decoder=decoder)


METRICS = ("clips_per_s", "cpu_ms_per_clip", "other_cpu_pct")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("use", "decoder", "length"), METRICS)
    ratios = {}
    for use in USES:
        for d in args.decoders:
            a = {"use": use, "decoder": d}
            ratios[f"{use}/{d}"] = {
                "clips_per_s": report.ratio(runs, {**a, "length": "long"}, {**a, "length": "short"}, "clips_per_s"),
                "cpu_ms_per_clip": report.ratio(runs, {**a, "length": "long"}, {**a, "length": "short"},
                                                "cpu_ms_per_clip")}
    doc["ratios"] = ratios


def _r(ratio: dict | None) -> str:
    return "–" if not ratio else f"{ratio['ratio']:.2f}"


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Long videos: a clip of a 20-minute file against a clip of a 10-second file")
    c = doc["config"]
    lines += [f"W={c['workers']}, random {c['clip_len']}-frame clips at {c['side']}x{c['side']}, batch "
              f"{c['batch_size']} (`many`) and 1 (`one`), through `Loader.as_dataset()`; medians (min-max) over "
              f"{c['reps']} interleaved repetitions.", ""]
    rows = []
    for use in USES:
        for d in c["decoders"]:
            s = doc["summary"].get(use, {}).get(d, {})
            r = doc["ratios"].get(f"{use}/{d}", {})
            cps, cpu = r.get("clips_per_s"), r.get("cpu_ms_per_clip")
            rows.append(f"| {use} | {d} | {fmt(s.get('short', {}).get('clips_per_s'), 1)} | "
                        f"{fmt(s.get('long', {}).get('clips_per_s'), 1)} | "
                        f"{_r(cps)} | "
                        f"{fmt(s.get('short', {}).get('cpu_ms_per_clip'), 1)} | "
                        f"{fmt(s.get('long', {}).get('cpu_ms_per_clip'), 1)} | "
                        f"{_r(cpu)} |")
    lines += table("| files | decoder | clips/s short | clips/s long | long/short | CPU ms/clip short | "
                   "CPU ms/clip long | long/short |", rows)
    lines += ["", "`one`: every clip from one file; `many`: every clip from another file (a name of its own).", ""]
    return "\n".join(lines + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    c = doc["config"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, use in zip(axes, USES):
        labels, spreads, colors = [], [], []
        for d in c["decoders"]:
            for length, color in (("short", "#9ecae1"), ("long", "#3182bd")):
                s = doc["summary"].get(use, {}).get(d, {}).get(length, {}).get("clips_per_s")
                if s:
                    labels.append(f"{d}\n{length}")
                    spreads.append(s)
                    colors.append(color)
        report.bars(ax, labels, spreads, colors)
        ax.set_title(f"{use} file{'s' if use == 'many' else ''}")
        ax.set_ylabel("clips/s")
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/long_videos.py", name="long-videos-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          label=lambda cell: "/".join(cell))

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
