"""``shmloader.calibrate``'s prediction beside a real training loop on this machine.

For each step (a small CPU model: a 3-D convolution on the batch's first frames, then a sleep that
stands for a GPU step the host waits for), ``--reps`` times: ``calibrate`` predicts the fed
fraction one clip per sample; a real loop (the same loader settings, the step on every batch)
measures it. Prints a Markdown table of the medians and writes it to ``--out``:

    python bench/calibrate_check.py --reps 3 --out bench/results/calibrate-check-cpu2.md

Videos: ``shmloader.samples.make_videos``, 16 of 120 frames, 96x128, a keyframe every 60; clips of
8 frames every 2nd at 64x64, batch 4, 2 workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


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


def real_fed(clips, step, ceiling: float, seconds: float, batch: int, workers: int) -> float:
    import shmloader

    with shmloader.Loader(clips, batch_size=batch, workers=workers, shuffle=True, epochs=None) as loader:
        n, t0 = 0, 0.0
        for i, b in enumerate(loader):
            step(b)
            if i == 2 * workers:
                t0 = time.perf_counter()
            elif i > 2 * workers:
                n += len(b["video"])
                if time.perf_counter() - t0 >= seconds:
                    break
        rate = n / (time.perf_counter() - t0)
    return min(1.0, rate / ceiling)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sleeps", type=float, nargs="+", default=[0.005, 0.4], help="seconds a step sleeps")
    parser.add_argument("--seconds", type=float, default=12, help="calibrate's seconds")
    parser.add_argument("--out", help="write the table here too")
    args = parser.parse_args(argv)

    import shmloader
    from shmloader.samples import make_videos

    folder = tempfile.mkdtemp()
    paths, labels = make_videos(folder, count=16, frames=120, size=(96, 128), gop=60)
    clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
    lines = ["| step | predicted fed | real fed | predicted / real | workers needed | cores short |",
             "|---|---:|---:|---:|---:|---:|"]
    for sleep_s in args.sleeps:
        step = make_step(sleep_s)
        predicted, real, needed, short = [], [], [], []
        for _ in range(args.reps):
            r = shmloader.calibrate(clips, step, batch_size=4, workers=2, seconds=args.seconds, verbose=False)
            row = r["one_clip"]
            predicted.append(row["fed_fraction"])
            needed.append(row["workers_needed"])
            short.append(row["more_cores"])
            real.append(real_fed(clips, step, r["ceiling"], max(3.0, args.seconds / 4), 4, 2))
        p, q = statistics.median(predicted), statistics.median(real)
        lines.append(f"| conv + {1e3 * sleep_s:g} ms | {p:.2f} | {q:.2f} | {p / q:.2f} | "
                     f"{statistics.median(needed):g} | {statistics.median(short):g} |")
    cpus = len(os.sched_getaffinity(0))
    text = "\n".join(lines) + f"\n\nmedians of {args.reps}; {cpus} CPUs; `python bench/calibrate_check.py " \
        + " ".join(argv if argv is not None else __import__("sys").argv[1:]) + "`\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
