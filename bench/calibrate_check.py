"""``shmloader.calibrate``'s prediction beside a real training loop on this machine.

For each step (a small CPU model: a 3-D convolution on the batch's first frames, then a sleep that
stands for a GPU step the host waits for), ``--reps`` times, interleaved: ``calibrate`` predicts
the fed fraction one clip per sample; a real loop (the same loader settings, the step on every
batch: calibrate's own ``measure_loader``) measures it. Writes ``<out>/<name>.json`` and a
Markdown table of the medians, ``.md`` (``harness.Benchmark``):

    python bench/calibrate_check.py --reps 3

Videos: ``shmloader.samples.make_videos``, 16 of 120 frames, 96x128, a keyframe every 60; clips of
8 frames every 2nd at 64x64, batch 4, 2 workers.
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
import report

BATCH, WORKERS = 4, 2


def make_step(sleep_s: float):
    import torch

    torch.set_num_threads(1)
    conv = torch.nn.Conv3d(3, 8, 3)

    def step(batch):
        x = torch.from_numpy(batch["video"][:, :, :32, :32]).permute(0, 4, 1, 2, 3).float()
        with torch.no_grad():
            conv(x)
        time.sleep(sleep_s)

    return step


def options(p) -> None:
    p.add_argument("--sleeps", type=float, nargs="+", default=[0.005, 0.4], help="seconds a step sleeps")
    p.add_argument("--seconds", type=float, default=12,
                   help="calibrate's seconds (no grouped rows: half each to the ceiling and the loader)")


def prepare(args, notes: list[str]) -> dict:
    import shmloader
    from shmloader.samples import make_videos

    paths, labels = make_videos(tempfile.mkdtemp(), count=16, frames=120, size=(96, 128), gop=60)
    return {"clips": shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64)),
            "steps": {s: make_step(s) for s in args.sleeps}}


def run(sleep_s: float, rep: int, args, ctx: dict) -> dict:
    import shmloader
    from shmloader._calibrate import measure_loader

    clips, step = ctx["clips"], ctx["steps"][sleep_s]
    r = shmloader.calibrate(clips, step, batch_size=BATCH, workers=WORKERS, seconds=args.seconds,
                            groupings=(), verbose=False)
    real = measure_loader(clips, BATCH, WORKERS, max(3.0, args.seconds / 4), step=step)["samples_per_s"]
    return {"sleep_s": sleep_s, "rep": rep, "predicted": r.one_clip.fed_fraction,
            "real": min(1.0, real / r.ceiling), "needed": r.one_clip.workers_needed,
            "short": r.one_clip.more_cores}


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["rows"] = [{"sleep_s": s, **{k: statistics.median(r[k] for r in runs if r["sleep_s"] == s)
                                     for k in ("predicted", "real", "needed", "short")}} for s in args.sleeps]


def markdown(doc: dict) -> str:
    lines = ["| step | predicted fed | real fed | predicted / real | workers needed | cores short |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| conv + {1e3 * r['sleep_s']:g} ms | {r['predicted']:.2f} | {r['real']:.2f} | "
                     f"{r['predicted'] / r['real']:.2f} | {r['needed']:g} | {r['short']:g} |")
    lines += ["", f"medians of {doc['config']['reps']}; {doc['machine']['usable_cores']} CPUs; `{doc['command']}`", ""]
    return "\n".join(lines + report.tail(doc))


BENCH = harness.Benchmark(
    script="bench/calibrate_check.py", name="calibrate-check-cpu2", about=__doc__, options=options,
    prepare=prepare, cells=lambda args, ctx: [list(args.sleeps)], run=run, report=summarize, markdown=markdown,
    plot=lambda doc, folder, name: [], label=lambda s: f"conv + {1e3 * s:g} ms", retry=False, preload=("torch",))


def main(argv: list[str] | None = None) -> int:
    return harness.main(BENCH, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
