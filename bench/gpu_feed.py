"""Does this node feed its GPU? A video model's step rate on synthetic input, against what each
input pipeline delivers into the same training loop (issue #36).

Run it on the GPU node you are sizing. For each model (torchvision ``models.video`` names:
``r2plus1d_18``, ``mvit_v2_s``, ``r3d_18``, ``s3d``, ``swin3d_t``...; ``tiny``: a one-layer model
for a CPU smoke run), with random weights, SGD, bf16 autocast and channels-last 3D on CUDA:

* ``synthetic``: one batch already on the device, stepped over and over: the ceiling;
* ``shmloader``: ``VideoClips`` one clip per sample, ``loader.as_torch(device=)``;
* ``shmloader grouped``: the same with ``clips_per_video=K, group_clips=True``;
* ``DataLoader``: torch's ``DataLoader`` with ``workers`` processes, each sample a decord
  ``VideoReader`` opened on the file and one ``get_batch`` (what most video training code does).

Every input row runs the same step on every batch for ``--seconds`` after a warm-up, measured
as ``shmloader.calibrate`` measures (``shmloader._calibrate``), and reports clips/s, the fraction
of the ceiling it reaches, and the CPU cores this process and its workers kept busy meanwhile.
``--reps`` (default 1) repeats every row, interleaved (``harness.Benchmark``). Clips:
``--clip-len`` frames every 2nd, the short side scaled to ``--short-side``, centre-cropped to
``--size`` (112 for most models, 224 for MViT / Swin3D).
Writes ``<out>/<name>.json``, ``.md`` and ``.png``.

    python bench/gpu_feed.py --videos 'data/*.mp4' --models r2plus1d_18,mvit_v2_s --workers 15
    python bench/gpu_feed.py --make-videos 64 --models r2plus1d_18     # synthetic 10-s long-GOP videos
    python bench/gpu_feed.py --models tiny --device cpu --make-videos 8 --seconds 2 --batch 4   # smoke run

torchvision is needed for its models only (``pip install torchvision`` matching your torch).
"""

from __future__ import annotations

import glob
import os
import statistics
import sys
import tempfile
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness
import numpy as np
import report

# Input size each model family was built for; the rest take 112.
_SIZE_224 = ("mvit", "swin3d", "s3d")
_ROWS = ("synthetic", "shmloader", "shmloader grouped", "DataLoader")


# ------------------------------------------------------------------------------- model
def build_model(name: str, classes: int):
    import torch

    if name == "tiny":
        return torch.nn.Sequential(torch.nn.Conv3d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(8, classes))
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def make_step(model_name: str, device: str, classes: int = 400) -> Callable[[dict], None]:
    """One SGD step on a batch of uint8 ``[B, T, H, W, 3]`` clips (numpy or torch, any device)."""
    import torch

    dev = torch.device(device)
    model = build_model(model_name, classes).to(dev)
    cuda = dev.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last_3d)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.43, 0.39, 0.38], device=dev).view(1, 3, 1, 1, 1) * 255
    std = torch.tensor([0.23, 0.22, 0.22], device=dev).view(1, 3, 1, 1, 1) * 255

    def step(batch: dict) -> None:
        video, label = batch["video"], batch["label"]
        if not isinstance(video, torch.Tensor):
            video, label = torch.from_numpy(video), torch.from_numpy(np.asarray(label))
        video = video.to(dev, non_blocking=True).permute(0, 4, 1, 2, 3).float()
        x = (video - mean) / std
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        y = label.to(dev, non_blocking=True).long() % classes
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


# ------------------------------------------------------------------------- pipelines
class DecordClips:
    """torch Dataset: a clip of a video per sample, as a DataLoader over decord does it: a
    ``VideoReader`` per clip at the scaled size, one ``get_batch``, a centre crop."""

    def __init__(self, paths: list[str], clip_len: int, step: int, short_side: int, size: int) -> None:
        self.paths, self.clip_len, self.step, self.short_side, self.size = paths, clip_len, step, short_side, size
        self.shapes: dict[str, tuple[int, int, int]] = {}  # per worker: frames, height, width

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        from shmloader.video.decord import (
            import_decord,  # decord without the CUDA stack it does not need
        )

        decord = import_decord()
        path = self.paths[i]
        if path not in self.shapes:
            vr = decord.VideoReader(path, num_threads=1)
            h, w = vr[0].shape[:2]
            self.shapes[path] = (len(vr), h, w)
        n, h, w = self.shapes[path]
        scale = self.short_side / min(h, w)
        sh, sw = round(h * scale / 2) * 2, round(w * scale / 2) * 2
        vr = decord.VideoReader(path, width=sw, height=sh, num_threads=1)
        span = (self.clip_len - 1) * self.step + 1
        start = int(np.random.default_rng().integers(0, max(1, n - span + 1)))
        frames = vr.get_batch(list(range(start, start + span, self.step))).asnumpy()
        y, x = (sh - self.size) // 2, (sw - self.size) // 2
        return {"video": np.ascontiguousarray(frames[:, y:y + self.size, x:x + self.size]), "label": i % 400}


def _size(model: str, args) -> tuple[int, int, int]:
    """The crop side, the scaled short side and the batch size for ``model``."""
    size = args.size or (224 if model.startswith(_SIZE_224) else 112)
    return size, args.short_side or (256 if size == 224 else 128), args.batch or (16 if size == 224 else 32)


def _children() -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process().children(recursive=True)]


def run(cell: tuple[str, str], rep: int, args, ctx: dict) -> dict:
    """One input row of one model: calibrate's own measurements (``shmloader._calibrate``), the
    step on every batch for ``--seconds``; the CPU cores this process and its workers kept busy."""
    import torch

    import shmloader
    from shmloader._calibrate import measure_ceiling, measure_loader, measure_steps

    model, row = cell
    size, short, batch_size = _size(model, args)
    if model not in ctx["steps"]:
        ctx["steps"][model] = make_step(model, args.device)
    step = ctx["steps"][model]
    clips = shmloader.VideoClips(ctx["paths"], ctx["labels"], clip_len=args.clip_len, frame_step=2, scale=short,
                                 crop=(size, size))
    cuda = args.device.startswith("cuda")
    if row == "synthetic":  # one batch of zeros already on the device, stepped over and over
        rate, cpu = measure_ceiling(clips, step, batch_size, args.device, args.seconds)
        m = {"samples_per_s": rate, "main_cpu_s": cpu, "worker_cpu_s": 0.0}
    elif row == "DataLoader":
        ds = DecordClips(ctx["paths"], args.clip_len, 2, short, size)
        sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=10**9)
        dl = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=args.workers,
                                         pin_memory=cuda, persistent_workers=False, prefetch_factor=4)
        it = iter(dl)
        try:
            m = measure_steps(it, step, args.seconds, args.warm, args.device, _children)
        finally:
            del it  # its workers stop
    else:
        source = clips if row == "shmloader" else clips.with_options(clips_per_video=args.group, group_clips=True)
        m = measure_loader(source, batch_size, args.workers, args.seconds, step=step, device=args.device,
                           pin_memory=cuda, warm=args.warm)
    return {"model": model, "batch": batch_size, "clip": f"{args.clip_len}x{size}x{size}", "rep": rep,
            "input": row if row != "shmloader grouped" else f"shmloader grouped K={args.group}",
            "clips_per_s": m["samples_per_s"], "cores_busy": (m["main_cpu_s"] + m["worker_cpu_s"]) * m["samples_per_s"]}


def options(p) -> None:
    p.add_argument("--models", default="r2plus1d_18,mvit_v2_s")
    p.add_argument("--videos", help="a glob of video files (default: --make-videos synthetic ones)")
    p.add_argument("--make-videos", type=int, default=64, help="write this many 340x256 30-fps videos, GOP 250")
    p.add_argument("--frames", type=int, default=300, help="frames per written video (10 s)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--workers", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    p.add_argument("--batch", type=int, help="default: 32 at 112, 16 at 224")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--size", type=int, help="crop side; default 112, 224 for MViT/Swin3D/S3D")
    p.add_argument("--short-side", type=int, help="default 128 at 112, 256 at 224")
    p.add_argument("--group", type=int, default=8, help="clips_per_video of the grouped row")
    p.add_argument("--rows", type=harness.names(_ROWS), default=list(_ROWS), help=f"of {','.join(_ROWS)}")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warm", type=int, default=10, help="batches before the clock starts (the loaders' rows)")
    p.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "shmloader-gpu-feed"))


def prepare(args, notes: list[str]) -> dict:
    if args.videos:
        paths = sorted(glob.glob(args.videos))
        if not paths:
            raise SystemExit(f"no file matches {args.videos!r}")
    else:
        from shmloader.samples import make_videos

        paths, _ = make_videos(args.folder, count=args.make_videos, frames=args.frames, size=(256, 340), fps=30,
                               gop=250)
    return {"paths": paths, "labels": [i % 400 for i in range(len(paths))], "steps": {}}


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    """The rows by model and input as asked, each with the fraction of its model's ceiling (the
    synthetic row of the same repetition) it reached; the machine's GPU where it ran on one."""
    import torch

    models, rows = args.models.split(","), list(args.rows)
    doc["rows"] = sorted(runs, key=lambda r: (models.index(r["model"]), rows.index(_row(r["input"])), r["rep"]))
    for r in doc["rows"]:
        ceiling = next((c["clips_per_s"] for c in runs if c["input"] == "synthetic" and c["model"] == r["model"]
                        and c["rep"] == r["rep"]), None)
        r["fed_fraction"] = None if not ceiling else r["clips_per_s"] / ceiling
    doc["config"]["videos"] = len(ctx["paths"])
    doc["median_cores_busy"] = statistics.median(r["cores_busy"] for r in runs)
    if torch.device(args.device).type == "cuda":
        doc["machine"]["gpu"] = torch.cuda.get_device_name()


def _row(name: str) -> str:
    return "shmloader grouped" if name.startswith("shmloader grouped") else name


# --------------------------------------------------------------------------- report
def markdown(doc: dict) -> str:
    c = doc["config"]
    lines = ["# Feeding a GPU: the model's ceiling against each input pipeline", "",
             f"Machine: {report.machine_line(doc['machine'])}  ", f"Command: `{doc['command']}`  ",
             (f"{c['videos']} videos; clips of {c['clip_len']} frames every 2nd, short side scaled, centre-cropped; "
              f"{c['workers']} workers; device {c['device']}; {c['seconds']:g}-s windows after {c['warm']} warm-up "
              f"batches; {c['reps']} run(s) each, interleaved. CPU cores busy: this process and its workers."), "",
             "| model, clip, batch | input | clips/s | x ceiling | CPU cores busy |", "|---|---|---|---|---|"]
    last = None
    for r in doc["rows"]:
        head = f"{r['model']}, {r['clip']}, B={r['batch']}"
        fed = "-" if r["fed_fraction"] is None else f"{r['fed_fraction']:.2f}"
        lines.append(f"| {head if head != last else ''} | {r['input']} | {r['clips_per_s']:.1f} | {fed} | "
                     f"{r['cores_busy']:.1f} |")
        last = head
    return "\n".join([*lines, "", *report.tail(doc, None)]).rstrip() + "\n"


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    models = list(dict.fromkeys(r["model"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        rows = [r for r in doc["rows"] if r["model"] == m]
        ax.barh([r["input"] for r in rows][::-1], [r["clips_per_s"] for r in rows][::-1], color="#3f51b5")
        ax.set_title(f"{m}, {rows[0]['clip']}, B={rows[0]['batch']}", fontsize=9)
        ax.set_xlabel("clips/s")
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


# report.py writes a committed result again from its json: it asks the script for BENCH.markdown.
BENCH = harness.Benchmark(
    script="bench/gpu_feed.py", name="gpu-feed", about=__doc__, options=options, prepare=prepare,
    cells=lambda args, ctx: [[(m, row) for row in args.rows] for m in args.models.split(",")], run=run,
    report=summarize, markdown=markdown, plot=plot, label=lambda cell: f"{cell[0]} {cell[1]}", retry=False, reps=1,
    preload=("torch",))


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
