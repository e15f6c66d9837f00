"""Open-Sora buckets (issue 67): videos/s, CPU and peak memory of ``shmloader.opensora.clips``
against Open-Sora's own reading path, a shuffled epoch of the same files in the same bucket.

Both pipelines run ``--workers`` worker processes over ``--count`` textured frame-code videos of
``--seconds`` s at 640x360, 30 fps (``workloads.write_textured``; x264 preset medium, CRF 23, its
default GOP and B-frames, as FFmpeg's defaults encode a download), with ``bucket_config``
``{"360p": {--frames: (1.0, --batch-size)}}`` and ``fps_max=--fps-max``: every video falls in the
360p 16:9 bucket, ``--frames`` frames at 352x656, picked by ``linspace`` over a seeded window of
``frames × interval`` frames (``interval = ⌈30 / fps_max⌉``). What differs is how a sample is read:

* ``shmloader``: ``Loader(opensora.clips(paths, captions, bucket_config=..., fps_max=...),
  shuffle=True, seed=rep, workers=W)``: each worker decodes the frames the sample needs alone, at
  the size that covers the bucket, into the shared-memory ring: uint8 ``[B, T, H, W, 3]`` (the
  model's ``x / 127.5 - 1`` runs later, on the GPU; not timed);
* ``opensora``: ``torch.utils.data.DataLoader(dataset, batch_sampler=<one bucket a batch>,
  num_workers=W)``, workers started with ``--torch-start`` (fork, Open-Sora's), whose dataset reads
  a sample as Open-Sora's does: PyAV decodes the WHOLE video at full size, every frame to RGB, into
  ``[N, H, W, 3]`` (``read_video_av``, as torchvision's ``read_video``: a list of frames, then one
  ``np.stack``), picks the frames by the same rule, converts them to float, resizes them with
  ``F.interpolate(mode="bilinear", align_corners=False)`` to the covering size, crops the centre
  and normalises to ``[-1, 1]`` (``ToTensorVideo``, ``ResizeCrop``, ``Normalize``): float32
  ``[B, 3, T, H, W]``. The batch sampler shuffles each epoch, puts each video in its bucket by the
  config's rules and cuts each bucket's videos into batches of its batch size, as Open-Sora's
  ``VariableVideoBatchSampler`` does.

The consumer reads one value of every 4 KiB of what it is handed (a stand-in for the copy to the
GPU) and drops it. The first batch of every run is checked: each frame's code must name the
sample's own video and the frame index the pipeline says it picked. Once, outside the runs, a few
samples read by shmloader are compared with Open-Sora's path on the same frames (grey levels).

Per run (``--epochs`` shuffled epochs, seed = the repetition): videos/s over the whole run, from the
pipeline's start (workers started) to its last batch, the figure the target reads; videos/s and CPU
s per video (main process and workers) from the first batch to the last (the batches the workers
prepared ahead while the first was awaited flatter that rate: shmloader's ring holds more of them
than the DataLoader's prefetch); memory sampled every 0.1 s over the whole
run as ``bench/qwen.py`` samples it (``peak_mem_mib``: each process's own PSS plus shared memory
counted once; ``peak_rss_mib``: summed RSS, main process and every process it started).

    python bench/opensora.py --reps 5        # ~4 minutes on 2 cores after writing the videos (~2 min once)
    python bench/opensora.py --count 4 --seconds 3 --reps 1 --no-plots --name opensora-tiny --out /tmp/os
"""

from __future__ import annotations

import math
import os
import sys
import time

import harness
import numpy as np
import report
from measure import cpu_shares
from qwen import MemorySampler
from report import fmt, fmt_ratio, table
from workloads import write_textured, written

ARMS = ("shmloader", "opensora")
SPEED_TARGET = 4.0  # issue 67: shmloader >= 4x Open-Sora's reading path, videos/s at W = 2
MEMORY_TARGET = 0.5  # issue 67: shmloader's peak memory <= 1/2 of Open-Sora's path's
SIZE, FPS = (360, 640), 30  # the files: 640x360 at 30 fps
# One value read of every this many bytes of what the consumer is handed: every page touched.
_TOUCH_BYTES = 4096
# How many samples of the first epoch the one-off pixel comparison reads from both paths.
_COMPARED = 3


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2, help="the bucket's batch size")
    p.add_argument("--frames", type=int, default=33, help="the bucket's length (frames a sample)")
    p.add_argument("--fps-max", type=float, default=16.0)
    p.add_argument("--arms", type=harness.names(ARMS), default=list(ARMS))
    p.add_argument("--count", type=int, default=16, help="videos")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each video")
    p.add_argument("--epochs", type=int, default=3, help="shuffled epochs a run reads")
    p.add_argument("--decoder", default="auto", choices=("auto", "pyav", "decord"),
                   help="shmloader's opensora.clips(decoder=)")
    p.add_argument("--prefetch-factor", type=int, default=2, help="the DataLoader's (torch's default)")
    p.add_argument("--torch-start", default="fork", choices=("fork", "forkserver", "spawn"),
                   help="how the DataLoader's workers start")
    p.add_argument("--memory-floor", type=float, default=1.0,
                   help="GiB: a run that leaves less memory available is stopped")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "opensora"))


def config_of(args) -> dict:
    return {"360p": {args.frames: (1.0, args.batch_size)}}


def video_files(args) -> list[str]:
    frames = round(FPS * args.seconds)
    h, w = SIZE
    return [written(os.path.join(args.cache, f"opensora_{i:03d}_{frames}f_{h}x{w}.mp4"),
                    lambda tmp, i=i: write_textured(tmp, i, frames=frames, size=SIZE, fps=FPS, gop=0,
                                                    options={"preset": "medium", "crf": "23"}))
            for i in range(args.count)]


# --------------------------------------------------------------- Open-Sora's reading path
def read_whole(path: str):
    """Every frame of the video at full size, uint8 ``[N, 3, H, W]``, and its rate: Open-Sora's
    ``read_video(path, backend="av")`` (torchvision's ``read_video`` through PyAV, ``TCHW``)."""
    import av
    import torch

    with av.open(path, metadata_errors="ignore") as container:
        stream = container.streams.video[0]
        frames = [frame.to_rgb().to_ndarray() for frame in container.decode(stream)]
        fps = float(stream.average_rate)
    return torch.as_tensor(np.stack(frames)).permute(0, 3, 1, 2), fps


def pick_frames(n: int, length: int, interval: int, rng: np.random.Generator) -> np.ndarray:
    """Open-Sora's temporal crop: ``length`` frames by ``linspace`` over a window of ``length ×
    interval`` frames whose start is uniform in ``[0, n − window − 1]``."""
    window = length * interval
    start = int(rng.integers(0, max(0, n - window - 1) + 1))
    return np.linspace(start, min(start + window, n) - 1, length).astype(int)


def resize_crop(clip, size: tuple[int, int]):
    """uint8 ``[T, 3, h, w]`` to float ``[T, 3, H, W]`` in ``[-1, 1]``: ``ToTensorVideo``, then
    ``ResizeCrop`` (bilinear to the size that covers ``size``, keeping the aspect, centre crop),
    then ``Normalize(0.5, 0.5)``, as Open-Sora's ``resize_crop`` transform."""
    import torch.nn.functional as F

    th, tw = size
    h, w = clip.shape[-2:]
    rh, rw = th / h, tw / w
    sh, sw = (th, round(w * rh)) if rh > rw else (round(h * rw), tw)
    x = F.interpolate(clip.float() / 255.0, size=(sh, sw), mode="bilinear", align_corners=False)
    top, left = (sh - th) // 2, (sw - tw) // 2
    return (x[..., top : top + th, left : left + tw] - 0.5) / 0.5


class OpenSoraVideos:
    """A map-style dataset read the way Open-Sora's is: item ``(video, bucket, epoch)`` is the
    video's frames in that bucket, float32 ``[3, T, H, W]``, with what was picked."""

    def __init__(self, paths: list[str], captions: list[str], shapes: np.ndarray, fps_max: float, seed: int) -> None:
        self.paths, self.captions, self.shapes, self.fps_max, self.seed = paths, captions, shapes, fps_max, seed

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: tuple[int, int, int]) -> dict:
        import torch

        i, k, epoch = item
        length, height, width = (int(x) for x in self.shapes[k])
        vframes, fps = read_whole(self.paths[i])
        interval = math.ceil(fps / self.fps_max) if fps >= self.fps_max else 1
        picked = pick_frames(len(vframes), length, interval, np.random.default_rng((self.seed, epoch, i)))
        video = resize_crop(vframes[picked], (height, width))
        return {"video": video.permute(1, 0, 2, 3), "text": self.captions[i], "index": i,
                "frames": torch.as_tensor(picked), "bucket": k}


class BucketBatches:
    """A batch sampler over ``epochs`` epochs: each shuffled, each video in its bucket for the epoch
    (``BucketTable.assign``: the config's rules, -1 left out), each bucket's videos cut into
    batches of its batch size, the batches shuffled (Open-Sora's ``VariableVideoBatchSampler``)."""

    def __init__(self, assign, batch_sizes: np.ndarray, n: int, seed: int, epochs: int) -> None:
        self.assign, self.batch_sizes, self.n, self.seed, self.epochs = assign, batch_sizes, n, seed, epochs

    def __iter__(self):
        for epoch in range(self.epochs):
            rng = np.random.default_rng((self.seed, epoch))
            buckets = self.assign(self.seed, epoch)
            batches = []
            for k in np.unique(buckets[buckets >= 0]).tolist():
                mine = [i for i in rng.permutation(self.n).tolist() if buckets[i] == k]
                size = int(self.batch_sizes[k])
                batches += [[(i, k, epoch) for i in mine[j : j + size]] for j in range(0, len(mine), size)]
            yield from (batches[j] for j in rng.permutation(len(batches)).tolist())


# ---------------------------------------------------------------------------- pipelines
class Pipeline:
    """``next()`` gives one delivered batch as (videos, bytes touched, samples wrong in a checked
    batch or None); ``pids()``; ``stats()`` (the loader's, or {}); ``close()``."""

    def __init__(self, items, pids, close, stats=dict) -> None:
        self.items, self.pids, self._close, self.stats = items, pids, close, stats

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, int, int | None]:
        return next(self.items)

    def close(self) -> None:
        self.items = None
        self._close()


def _touch(flat: np.ndarray) -> None:
    _ = flat[:: max(1, _TOUCH_BYTES // flat.itemsize)].sum()


def _codes_wrong(video: np.ndarray, index: np.ndarray, frames: np.ndarray) -> int:
    """Samples of a batch (uint8 ``[B, T, H, W, 3]``) whose frame codes name another video than
    ``index`` or other frames than ``frames`` ``[B, T]``."""
    from shmloader.samples import read_codes

    ids, shown = read_codes(video)
    return int(((ids != index[:, None]) | (shown != frames)).any(axis=1).sum())


def shm_pipeline(paths: list[str], rep: int, args) -> Pipeline:
    import shmloader
    from shmloader import opensora

    videos = opensora.clips(paths, [f"video {i}" for i in range(len(paths))], bucket_config=config_of(args),
                            fps_max=args.fps_max, decoder=args.decoder)
    loader = shmloader.Loader(videos, shuffle=True, seed=rep, workers=args.workers, epochs=args.epochs)

    def items():
        check = True
        for batch in loader:
            video = batch["video"]
            _touch(video.reshape(-1))
            wrong = _codes_wrong(video, batch["index"], batch["frames"]) if check else None
            check = False
            yield len(video), video.nbytes, wrong

    return Pipeline(items(), loader.worker_pids, loader.close, loader.stats)


def opensora_pipeline(paths: list[str], rep: int, args) -> Pipeline:
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    from shmloader.opensora import BucketTable

    table = BucketTable(config_of(args))
    n = len(paths)
    meta = np.array([(round(FPS * args.seconds), *SIZE, FPS)] * n, np.float64).T  # the files as written

    def assign(seed: int, epoch: int) -> np.ndarray:
        return table.assign(*meta, seed=seed, epoch=epoch, fps_max=args.fps_max)

    ds = OpenSoraVideos(paths, [f"video {i}" for i in range(n)], table.shapes, args.fps_max, rep)
    dl = DataLoader(ds, batch_sampler=BucketBatches(assign, table.batch_sizes, n, rep, args.epochs),
                    num_workers=args.workers, prefetch_factor=args.prefetch_factor,
                    multiprocessing_context=mp.get_context(args.torch_start))
    it = iter(dl)  # starts the workers

    def items():
        check = True
        for batch in it:
            video = batch["video"]  # float32 [B, 3, T, H, W] in [-1, 1]
            _touch(video.reshape(-1).numpy())
            wrong = None
            if check:
                shown = ((video.permute(0, 2, 3, 4, 1).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8)
                wrong = _codes_wrong(shown, batch["index"].numpy(), batch["frames"].numpy())
                check = False
            yield len(video), video.nbytes, wrong

    def pids() -> list[int]:
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    return Pipeline(items(), pids, it._shutdown_workers)


# -------------------------------------------------------------------------------- runs
def prepare(args, notes: list[str]) -> dict:
    import av

    from shmloader import opensora

    os.makedirs(args.cache, exist_ok=True)
    t0 = time.perf_counter()
    paths = video_files(args)
    took = time.perf_counter() - t0
    with av.open(paths[0]) as c:
        s = c.streams.video[0]
        frames = s.frames
        keys = sum(p.is_keyframe for p in c.demux(s) if p.size)
    mbit = np.median([os.path.getsize(p) * 8 / args.seconds / 1e6 for p in paths])
    videos = opensora.clips(paths, bucket_config=config_of(args), fps_max=args.fps_max, decoder=args.decoder)
    k = int(videos.assign(0, 0)[0])
    interval = math.ceil(FPS / args.fps_max) if FPS >= args.fps_max else 1
    wrote = f"written in {took:.0f} s" if took > 1 else "in the cache"
    notes.append(f"{len(paths)} x {frames} frames ({args.seconds:g} s) {SIZE[1]}x{SIZE[0]} at {FPS} fps, libx264 "
                 f"preset medium CRF 23, default GOP ({keys} keyframes in the first file), {mbit:.2f} Mbit/s median; "
                 f"{wrote}. Bucket {videos.table.names[k]}, batch size {args.batch_size}: {args.frames} frames a "
                 f"sample over a window of {args.frames * interval} (interval {interval}); PyAV {av.__version__}.")
    # The same pixels as Open-Sora's path, checked once outside the runs.
    picks = list(range(min(_COMPARED, len(paths))))
    got = videos.reader().read(picks, seed=0, epoch=0)
    diffs = []
    for j, i in enumerate(picks):
        vframes, _ = read_whole(paths[i])
        ref = resize_crop(vframes[got["frames"][j]], tuple(got["thw"][j][1:].tolist())).permute(0, 2, 3, 1).numpy()
        diffs.append(float(np.abs(got["video"][j].astype(np.float64) - (ref.astype(np.float64) + 1) * 127.5).mean()))
    notes.append(f"Samples {picks} read by shmloader and by Open-Sora's path on the same frames: mean |diff| "
                 f"{max(diffs):.2f} grey levels at most (0 = the same pixels; Open-Sora's float output on the "
                 "0-255 scale).")
    return {"paths": paths}


def run(cell, rep: int, args, ctx: dict) -> dict:
    arm = cell
    row: dict = {"arm": arm, "rep": rep, "error": None}
    with MemorySampler(args.memory_floor * 2**30) as sampler:
        t0 = time.perf_counter()
        pipe = None
        try:
            pipe = (shm_pipeline if arm == "shmloader" else opensora_pipeline)(ctx["paths"], rep, args)
            sampler.pids = pipe.pids
            first, nbytes, wrong = next(pipe)
            row["first_s"] = time.perf_counter() - t0
            row["first_batch_wrong"] = wrong
            a = sampler.window_start()
            videos = 0
            for n, b, _ in pipe:
                videos, nbytes = videos + n, nbytes + b
            b = sampler.window_end()
            main, workers, other = cpu_shares(a, b)
            seconds, total = b.t - a.t, first + videos
            row.update(videos=total, seconds=seconds, run_s=b.t - t0, videos_per_s=total / (b.t - t0),
                       after_first_per_s=videos / seconds,
                       cpu_s_per_video=(main + workers) / 100 * seconds / max(videos, 1), main_cpu_pct=main,
                       workers_cpu_pct=workers, other_cpu_pct=other, delivered_mib_per_video=nbytes / total / 2**20)
            row.update(_loader_figures(pipe.stats()))
        except Exception as e:  # noqa: BLE001  one broken row must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        finally:
            if pipe is not None:
                t1 = time.perf_counter()
                pipe.close()
                row["close_s"] = time.perf_counter() - t1
    if sampler.tripped:
        row["error"] = (f"stopped: less than {args.memory_floor:g} GiB of memory was left available "
                        f"(its processes then held {sampler.peak_mem / 2**30:.1f} GiB)")
    row.update(peak_mem_mib=sampler.peak_mem / 2**20, peak_rss_mib=sampler.peak_sum_rss / 2**20,
               added_mem_mib=(sampler.peak_mem - sampler.base_mem) / 2**20, base_mem_mib=sampler.base_mem / 2**20)
    return row


def _loader_figures(stats: dict) -> dict:
    """What shmloader's ``stats()`` says of where its workers' time went."""
    if not stats:
        return {}
    busy = stats.get("worker_busy_fraction") or [float("nan")]
    return {"pyav_reads": stats.get("pyav"), "decord_reads": stats.get("decord"),
            "worker_busy": float(np.mean(busy)), "worker_videos_per_s": stats.get("samples_per_worker_s"),
            "consumer_wait": stats.get("consumer_wait_fraction"), "ring_slots": stats.get("slots")}


METRICS = ("videos_per_s", "after_first_per_s", "first_s", "cpu_s_per_video", "workers_cpu_pct",
           "main_cpu_pct", "other_cpu_pct", "peak_mem_mib", "added_mem_mib", "peak_rss_mib", "delivered_mib_per_video",
           "worker_busy", "worker_videos_per_s")
RATIOS = ("videos_per_s", "after_first_per_s", "peak_mem_mib", "peak_rss_mib")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("arm",), METRICS)
    doc["ratios"], doc["targets"] = {}, []
    if set(ARMS) <= set(args.arms):
        r = {m: report.ratio(runs, {"arm": "shmloader"}, {"arm": "opensora"}, m) for m in RATIOS}
        doc["ratios"] = r
        speed, mem = r["videos_per_s"], r["peak_mem_mib"]
        doc["targets"] += [
            {"target": f"videos/s, shmloader / Open-Sora's path >= {SPEED_TARGET:g}", "ratio": speed and speed["ratio"],
             "met": bool(speed and speed["ratio"] >= SPEED_TARGET)},
            {"target": f"peak memory, shmloader / Open-Sora's path <= {MEMORY_TARGET:g}", "ratio": mem and mem["ratio"],
             "met": bool(mem and mem["ratio"] <= MEMORY_TARGET)}]
    ours = [r for r in runs if r["arm"] == "shmloader" and r.get("pyav_reads") is not None]
    if ours:
        doc["notes"].append(f"shmloader's workers read with PyAV {sum(r['pyav_reads'] for r in ours)} times and decord "
                            f"{sum(r['decord_reads'] for r in ours)} times over its {len(ours)} runs "
                            f"(decoder={args.decoder!r}); its ring held {ours[0]['ring_slots']} slots.")
    wrong = [r for r in runs if r.get("first_batch_wrong")]
    doc["notes"].append(f"{len(wrong)} runs delivered a first batch with frames of another video or other frames than "
                        "the pipeline said: " + "; ".join(sorted({r["arm"] for r in wrong})) if wrong else
                        "Every run's first batch showed each sample's own video and the frames it said it picked.")
    errors = [r for r in runs if r.get("error")]
    if errors:
        doc["notes"].append(f"{len(errors)} of {len(runs)} runs failed, left out of the medians: "
                            + "; ".join(sorted({f"{r['arm']}: {r['error']}" for r in errors})))


ABOUT = {"shmloader": "shmloader, `opensora.clips`, uint8 `[B, T, H, W, 3]`",
         "opensora": "Open-Sora's path (whole video by PyAV, `F.interpolate`), torch DataLoader, "
                     "float32 `[B, 3, T, H, W]`"}


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Open-Sora buckets: shmloader against Open-Sora's reading path", libs=("torch",))
    c = doc["config"]
    lines += [(f"W={c['workers']} worker processes each; {c['count']} videos of {c['seconds']:g} s at 640x360, 30 fps; "
               f"bucket_config `{{\"360p\": {{{c['frames']}: (1.0, {c['batch_size']})}}}}`, fps_max={c['fps_max']:g}; "
               f"{c['epochs']} shuffled epoch{'s' if c['epochs'] > 1 else ''} a run. Medians (min–max) over "
               f"{c['reps']} interleaved repetitions. videos/s: the run's videos over its time from the "
               "pipeline's start (workers started) to the last batch; `after the first batch`: from the first "
               "batch to the last, which the batches prepared ahead flatter; CPU over that window. Memory: the "
               "peak over the run of the processes' own memory (PSS without shared memory) plus their shared "
               "memory counted once, main process and workers."), ""]
    rows = []
    for arm in c["arms"]:
        s = doc["summary"].get(arm)
        if s is None:
            continue
        rows.append(f"| {ABOUT[arm]} | {fmt(s.get('videos_per_s'), 2)} | {fmt(s.get('after_first_per_s'), 2)} | "
                    f"{fmt(s.get('first_s'), 1)} | {fmt(s.get('cpu_s_per_video'), 3)} | "
                    f"{fmt(s.get('peak_mem_mib'), 0, comma=True)} | {fmt(s.get('added_mem_mib'), 0, comma=True)} | "
                    f"{fmt(s.get('peak_rss_mib'), 0, comma=True)} | {fmt(s.get('delivered_mib_per_video'), 1)} |")
    lines += table("| pipeline | videos/s | after the first batch | first batch s | CPU s/video | peak memory MiB | "
                   "added MiB | summed RSS MiB | delivered MiB/video |", rows)
    lines += [""]
    if doc["ratios"]:
        r = doc["ratios"]
        lines += table("| shmloader / Open-Sora's path | videos/s | after the first batch | peak memory | summed RSS |",
                       [f"| ratio | {' | '.join(fmt_ratio(r[m]) for m in RATIOS)} |"])
        lines += [""]
    lines += report.target_lines(doc["targets"])
    lines += ["", ("`added`: the peak less the main process's own memory before the run (its imports: torch, "
                   "shmloader). `summed RSS`: every process's RSS added up, shared pages once per process. "
                   "`delivered`: bytes the training process is handed per video."), ""]
    return "\n".join(lines + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    arms = [a for a in doc["config"]["arms"] if a in doc["summary"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.9 + 0.6 * len(arms)))
    for ax, (metric, title, scale) in zip(axes, (("videos_per_s", "videos/s", 1),
                                                 ("peak_mem_mib", "peak memory, GiB", 1 / 1024))):
        spreads = [{k: (v * scale if k != "n" else v) for k, v in doc["summary"][a][metric].items()} for a in arms]
        report.bars(ax, arms, spreads, ["#3182bd" if a == "shmloader" else "#bdbdbd" for a in arms], horizontal=True)
        ax.set_title(title)
    axes[1].set_yticklabels([])
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/opensora.py", name="opensora-cpu2", about=__doc__, options=options,
                          cells=lambda args, ctx: [list(args.arms)], run=run, report=finish, markdown=markdown,
                          plot=plot, prepare=prepare, preload=("torch",))

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
