"""How many workers, and how much faster than what I have? (issue #4)

Runs every loader in ``loaders`` and the physical limit (``limit``) for each workload and
worker count, plus the two simulated-work experiments (``experiments``), interleaved: each
repetition runs every configuration once, in a shuffled order, so slow spells of a shared
machine spread over all loaders instead of hitting one, and the loaders compared at one
(workload, W) run back to back. A run during which other programs used much CPU is repeated
(``--max-other-load``). Writes ``<out>/<name>.json``, ``<out>/<name>.md`` and PNG plots.

    python bench/cpu_vs_workers.py                       # the default set, a few minutes on 2 cores
    python bench/cpu_vs_workers.py --workers 1,2,4,8 --reps 5 --duration 5 --name cpu8
    python bench/cpu_vs_workers.py --videos ~/ucf101/clips --loaders shmloader,limit

This module imports neither TensorFlow nor torch at the top: multiprocessing children (torch's
workers, the physical limit's processes) import it as their main module and must stay light.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import os
import random
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Optional (issue #12): each skipped with its reason when it cannot run.
PEERS = ("tfrecord-jpeg", "tfrecord-raw", "grain", "grain-default", "spdl", "torchcodec")
# Into PyTorch and JAX instead of tf.data (issue 18): shmloader's adapters against what a
# PyTorch or JAX user runs today; each skipped with its reason when its framework is missing.
FRAMEWORKS = ("shm-torch", "shm-torch-grouped", "torch-dl", "torchcodec-dl", "shm-jax", "shm-jax-grouped",
              "grain-jax")
ALL_LOADERS = ("naive", "tf-map", "threads", "torch", "videoloader", "shmloader", "limit", *PEERS, *FRAMEWORKS)
ALL_WORKLOADS = ("short", "large", "python")
ALL_EXPERIMENTS = ("producers", "titer")

# The classic experiments at full scale, in seconds; --sim-scale shrinks them all alike.
PRODUCER_S, CONSUMER_S = 1.0, 0.2  # 5:1: the consumer bounds throughput from W = 5
T_GPU_S = 0.4
T_CPU_SLEEP_S = 2.0  # W = 1, 2, 4 are bound by T_cpu / W, W = 8 by T_gpu
T_CPU_BUSY_S = 0.8  # busy work only up to the core count: W = 1, 2 stay bound by T_cpu / W


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _names(allowed):
    def parse(text: str) -> list[str]:
        names = [x for x in text.split(",") if x]
        bad = [x for x in names if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
        return names

    return parse


def _size(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--name", default="cpu2", help="results are <out>/<name>.{json,md} and <name>_*.png")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", type=_ints, default=[1, 2], help="worker counts W, comma-separated")
    p.add_argument("--loaders", type=_names(ALL_LOADERS), default=list(ALL_LOADERS))
    p.add_argument("--workloads", type=_names(ALL_WORKLOADS), default=list(ALL_WORKLOADS))
    p.add_argument("--experiments", type=_names(ALL_EXPERIMENTS), default=list(ALL_EXPERIMENTS),
                   help="simulated-work experiments; '' for none")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--duration", type=float, default=1.25, help="seconds measured per loader run")
    p.add_argument("--warmup", type=int, default=1, help="batches consumed before measuring")
    p.add_argument("--min-batches", type=int, default=3, help="batches measured at least")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--small", type=int, default=112, help="side of the short and python clips")
    p.add_argument("--large", type=int, default=224, help="side of the large clips")
    p.add_argument("--py-iters", type=int, default=600_000,
                   help="pure-Python loop iterations per clip in the python workload")
    p.add_argument("--videos", default=None,
                   help="use the videos in this folder instead of generating synthetic ones")
    p.add_argument("--cache", default=os.path.join(ROOT, ".cache", "bench-videos"),
                   help="where synthetic videos are written (reused when present)")
    p.add_argument("--video-count", type=int, default=24)
    p.add_argument("--video-frames", type=int, default=64)
    p.add_argument("--video-size", type=_size, default=(240, 320), help="HxW of synthetic videos")
    p.add_argument("--codec", default="libx264", choices=("libx264", "mpeg4"))
    p.add_argument("--content", default="codes", choices=("codes", "textured"),
                   help="synthetic videos: flat frame codes (cheap to decode, tiny files) or the codes "
                        "over a panning texture with noise (~web-video bit rate)")
    p.add_argument("--sim-scale", type=float, default=0.1,
                   help="scale of the simulated times (1.0: producer 1 s, consumer 0.2 s per item)")
    p.add_argument("--sim-items", type=int, default=8,
                   help="items measured per simulated run (rounded up to a multiple of W)")
    p.add_argument("--producers", type=_ints, default=list(range(1, 9)),
                   help="producer counts for the producers experiment")
    p.add_argument("--max-other-load", type=float, default=50.0,
                   help="CPU %% used by other programs above which a run is repeated")
    p.add_argument("--retries", type=int, default=1,
                   help="repeats of a run spoilt by other load; the quietest attempt is kept")
    p.add_argument("--pin", action="store_true",
                   help="diagnostic: pin each worker process of shmloader, torch and the physical "
                        "limit to one core (worker i on core i mod cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run order shuffle")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.reps < 1 or args.duration <= 0 or not args.workers or min(args.workers) < 1:
        p.error("--reps >= 1, --duration > 0 and worker counts >= 1")
    return args


# ------------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class Task:
    kind: str  # "loader", "limit", "producers", "titer", "serial"
    name: str  # loader name, or the experiment's work kind
    workload: str = ""
    workers: int = 1

    def label(self) -> str:
        if self.kind in ("loader", "limit"):
            return f"{self.workload} {self.name} W={self.workers}"
        if self.kind == "serial":
            return f"T_iter {self.name} serial"
        return f"{'T_iter ' + self.name if self.kind == 'titer' else 'producers'} W={self.workers}"


def plan(args) -> list[list[Task]]:
    """Blocks of tasks. Loaders that are compared with each other (same workload, same W) share
    a block and run back to back, so they see the same spell of the shared machine."""
    from loaders import FIXED_PARALLELISM
    from peers import PEER_FIXED

    fixed = {**FIXED_PARALLELISM, **PEER_FIXED}
    blocks = []
    for wl in args.workloads:
        for w in args.workers:
            block = []
            for name in args.loaders:
                if name not in fixed:
                    block.append(Task("limit" if name == "limit" else "loader", name, wl, w))
                elif w == max(args.workers):  # one run per workload, beside the widest W
                    block.append(Task("loader", name, wl, 1))
            blocks.append(block)
    if "producers" in args.experiments:
        blocks.append([Task("producers", "sleep", workers=w) for w in args.producers])
    if "titer" in args.experiments:
        cores = len(os.sched_getaffinity(0))
        blocks.append([Task("titer", "sleep", workers=w) for w in (1, 2, 4, 8)] + [Task("serial", "sleep")])
        blocks.append([Task("titer", "busy", workers=w) for w in range(1, cores + 1)] + [Task("serial", "busy")])
    return [b for b in blocks if b]


def skip_unavailable(args, notes: list[str]) -> None:
    from loaders import framework_missing, torch_missing
    from peers import missing

    for name in [n for n in args.loaders if n in FRAMEWORKS]:
        if why := framework_missing(name):
            print(f"note: skipping {name}: {why}", file=sys.stderr)
            notes.append(f"{name} skipped: {why}")
            args.loaders.remove(name)

    for name in [n for n in args.loaders if n in PEERS]:
        if why := missing(name):
            print(f"note: skipping {name}: {why}", file=sys.stderr)
            notes.append(f"{name} skipped: {why}")
            args.loaders.remove(name)
    if "torch" in args.loaders and (why := torch_missing()):
        print(f"note: skipping the torch DataLoader: {why}", file=sys.stderr)
        notes.append(f"torch DataLoader skipped: {why}")
        args.loaders.remove("torch")
    if "videoloader" in args.loaders:
        import decord

        if not hasattr(decord, "VideoLoader"):
            why = f"this decord ({getattr(decord, '__version__', '?')}) has no VideoLoader"
            print(f"note: skipping decord's VideoLoader: {why}", file=sys.stderr)
            notes.append(f"decord VideoLoader skipped: {why}")
            args.loaders.remove("videoloader")


def convert_tfrecords(args, clips, workloads: dict) -> None:
    """The TFRecord route's one-off conversion, before any run (cached: see ``tfrecord``)."""
    import tfrecord

    for name in ("tfrecord-jpeg", "tfrecord-raw"):
        if name in args.loaders:
            for wl in args.workloads:
                info = tfrecord.convert(clips, workloads[wl], name.split("-")[1])
                print(f"{name} {wl}: {info['about']}, {info['bytes'] / 2**20:.1f} MiB, "
                      f"converted in {info['conversion_s']:.1f} s", file=sys.stderr)


def start_forkserver() -> None:
    """Start the forkserver now, with the worker-side modules preloaded.

    torch's workers fork from it: preloading torch and decord there gives them the start-up
    that fork would, without forking TensorFlow.
    """
    import multiprocessing as mp

    mp.set_forkserver_preload(["numpy", "decord", "torch", "torchcodec.decoders", "workloads", "loaders",
                               "peers"])
    ctx = mp.get_context("forkserver")
    p = ctx.Process(target=int)
    p.start()
    p.join()
    from multiprocessing import forkserver, resource_tracker

    import measure

    for pid in (forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid):
        if pid:
            measure.IGNORED_PIDS.add(pid)


# ---------------------------------------------------------------------- running
def run_task(task: Task, rep: int, args, clips, workloads: dict) -> dict:
    import experiments
    import limit
    from measure import Result, run_pipeline

    scale = args.sim_scale
    if task.kind == "producers":
        r = experiments.producers(task.workers, PRODUCER_S * scale, CONSUMER_S * scale, args.sim_items, rep)
        return dataclasses.asdict(r)
    if task.kind in ("titer", "serial"):
        t_cpu = (T_CPU_BUSY_S if task.name == "busy" else T_CPU_SLEEP_S) * scale
        if task.kind == "serial":
            r = experiments.serial(task.name, t_cpu, T_GPU_S * scale, max(3, args.sim_items // 2), rep)
        else:
            r = experiments.t_iter(task.name, task.workers, t_cpu, T_GPU_S * scale, args.sim_items, rep)
        return dataclasses.asdict(r)
    wl = workloads[task.workload]
    from loaders import FIXED_PARALLELISM, LOADERS
    from peers import PEER_FIXED
    from peers import PEERS as PEER_LOADERS
    from workloads import check_frames

    workers = {**FIXED_PARALLELISM, **PEER_FIXED}.get(task.name, str(task.workers))
    res = Result(task.name, wl.name, workers, rep)
    try:
        if task.kind == "limit":
            limit.physical_limit(clips, wl, task.workers, args.duration, res, pin=args.pin)
        else:
            make = {**LOADERS, **PEER_LOADERS}[task.name]
            check = None if args.videos else lambda video, labels: check_frames(video, labels, clips, wl)
            run_pipeline(lambda: make(clips, wl, task.workers, args.batch_size, pin=args.pin), res,
                         clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                         warmup=args.warmup, min_batches=args.min_batches, check=check)
    except Exception as e:  # one broken loader must not lose the others' results
        res.error = f"{type(e).__name__}: {e}"
    return dataclasses.asdict(res)


def release_memory() -> None:
    """Give freed heap back to the OS between runs, so one run's RSS does not carry the last's."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_quietly(task: Task, rep: int, args, clips, workloads: dict) -> dict:
    """``run_task``, repeated up to ``--retries`` times while other programs load the machine."""
    best, attempts = None, 0
    for attempts in range(1, 2 + max(0, args.retries)):
        release_memory()
        t0 = time.perf_counter()
        row = run_task(task, rep, args, clips, workloads)
        row["wall_s"] = time.perf_counter() - t0
        if best is None or row.get("other_cpu_pct", 0) < best.get("other_cpu_pct", 0):
            best = row
        if row.get("error") or row.get("other_cpu_pct", 0) <= args.max_other_load:
            break
    best["attempts"] = attempts
    return best


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from tqdm import tqdm

    import report
    from measure import machine_info
    from workloads import default_workloads, list_clipset, make_clipset

    notes: list[str] = []
    os.makedirs(args.out, exist_ok=True)
    if args.videos:
        clips = list_clipset(args.videos)
        videos = {"folder": args.videos, "count": len(clips.paths), "about": "files given by --videos"}
    else:
        h, w = args.video_size
        clips = make_clipset(args.cache, args.video_count, args.video_frames, args.video_size, args.codec,
                             args.content)
        kbps = sum(os.path.getsize(p) for p in clips.paths) * 8 / 1e3 / (len(clips.paths) * args.video_frames / 25)
        maker = ("shmloader._samples.make_videos" if args.content == "codes"
                 else "frame codes over a panning texture with noise, workloads.write_textured")
        videos = {"folder": os.path.relpath(os.path.dirname(clips.paths[0]), ROOT), "count": len(clips.paths),
                  "about": f"{args.video_frames} frames {h}x{w} {args.codec}, {kbps:.0f} kbit/s ({maker})"}
    workloads = default_workloads(args.clip_len, args.small, args.large, args.py_iters)
    skip_unavailable(args, notes)
    blocks = plan(args)
    convert_tfrecords(args, clips, workloads)

    # Paid once, outside every measurement: TensorFlow's import and the forkserver's start.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401

    start_forkserver()
    gc.freeze()  # TensorFlow's own objects: keeps the collection between runs short
    machine = machine_info()

    runs, sims = [], []
    order = random.Random(args.seed)
    with tqdm(total=sum(map(len, blocks)) * args.reps, unit="run", dynamic_ncols=True) as bar:
        for rep in range(args.reps):
            for block in order.sample(blocks, len(blocks)):
                for task in order.sample(block, len(block)):
                    bar.set_description(f"rep {rep + 1}/{args.reps} {task.label()}")
                    row = run_quietly(task, rep, args, clips, workloads)
                    if row.get("error"):
                        tqdm.write(f"{task.label()}: {row['error']}")
                    (sims if task.kind in ("producers", "titer", "serial") else runs).append(row)
                    bar.update()

    summary = report.summarize(runs)
    doc = {
        "name": args.name,
        "command": " ".join(shlex.quote(a) for a in ["python", "bench/cpu_vs_workers.py", *argv]),
        "machine": machine,
        "config": dict(vars(args)),
        "videos": videos,
        "workloads": {k: v.about for k, v in workloads.items() if k in args.workloads},
        "summary": summary,
        "targets": [],
        "simulations": sims,
        "runs": runs,
        "notes": notes + standing_notes(args) + retry_notes(runs + sims, args),
    }
    doc["targets"] = report.check_targets(runs, sims, summary)
    doc["wall_s"] = time.perf_counter() - t_start
    if not args.no_plots:
        doc["plots"] = report.plot(doc, args.out, args.name)
    report.save(doc, report.markdown(doc), args.out, args.name)
    return 0


def retry_notes(rows: list[dict], args) -> list[str]:
    retried = [r for r in rows if r.get("attempts", 1) > 1]
    if not retried:
        return []
    still = sum(r.get("other_cpu_pct", 0) > args.max_other_load for r in retried)
    return [f"{len(retried)} of {len(rows)} runs were repeated because other programs used more than "
            f"{args.max_other_load:g} % CPU during them; the quietest attempt is kept "
            f"({still} stayed above the threshold)."]


def standing_notes(args) -> list[str]:
    notes = [
        "Every loader decodes with decord.VideoReader(num_threads=1) and the same clip starts "
        "(shmloader's rule: seeded by (seed, epoch, sample)); every pipeline ends in "
        "tf.data prefetch(AUTOTUNE) (the framework rows excepted, below); the consumer reads one byte per "
        "clip of each batch.",
        "naive is serial whatever W; tf-map's parallelism is tf.data AUTOTUNE (W = auto).",
        "torch: DataLoader(num_workers=W, prefetch_factor=2) with forkserver workers (fork is unsafe "
        "once TensorFlow runs; the forkserver preloads torch and decord, as fork would have).",
        "videoloader: decord.VideoLoader(ctx=[cpu(i) for i in range(W)], shuffle=2) picks its own "
        "clips (fixed 16-frame chunks, random order) and batches in the generator; its decode work "
        "per clip is the same on average.",
        "physical limit: decode_clip alone in W spawned processes for the same duration, no "
        "loader and no consumer, default environment; the python workload's transform is part of "
        "its work.",
    ]
    peer_notes = {
        "tfrecord-jpeg": "tfrecord-jpeg† / tfrecord-raw†: the clips converted once into TFRecord (JPEG quality 90 "
                         "per frame, or raw uint8 at the workload's size; see the disk table), read with "
                         "TFRecordDataset(num_parallel_reads=AUTOTUNE).repeat().shuffle(96).map(parse + "
                         "decode_jpeg or decode_raw, AUTOTUNE).batch.prefetch: all in TensorFlow's C++ threads "
                         "of the main process (the python workload's transform as a numpy_function there). "
                         "Fixed clips: each epoch reads the same 96 clips in a new order (W = auto).",
        "grain": "grain: grain.DataLoader(worker_count=W, read_options=ReadOptions(num_threads=1)), "
                 "SequentialSampler over the same (epoch, sample) stream, Batch in the workers (spawned "
                 "processes); grain-default: ReadOptions() as it comes, 16 read threads per worker.",
        "spdl": "spdl: PipelineBuilder().add_source(keys).pipe(decode, concurrency=W).aggregate(B).pipe(stack)"
                ".build(num_threads=W); decode = spdl.io.demux_video(path, timestamp=clip window ± half a "
                "frame) + decode_packets(scale filter, decoder threads=1) + convert_frames: frames chosen by "
                "timestamp. Threads of the main process (FFmpeg releases the GIL).",
        "torchcodec": "torchcodec: torch DataLoader(num_workers=W) as for torch, decoding with "
                      "torchcodec.decoders.VideoDecoder(dimension_order='NHWC', num_ffmpeg_threads=1, "
                      "seek_mode='approximate', transforms=[Resize(size)]) and get_frames_at (its resize "
                      "differs from decord's by about one grey level).",
    }
    for name, note in peer_notes.items():
        if name in args.loaders or (name == "tfrecord-jpeg" and "tfrecord-raw" in args.loaders):
            notes.append(note)
    if any(n in args.loaders for n in FRAMEWORKS):
        notes.append("Framework rows (issue 18) feed a PyTorch or JAX loop, no tf.data: the consumer reads one "
                     "byte per clip of each batch (np.asarray of a jax.Array waits for it). shm-torch: "
                     "loader.as_torch() (torch.from_numpy over the ring's slots; pin_memory off, no CUDA); "
                     "shm-jax: shmloader.jax.batches(loader) (jax.device_put, which wraps the slots on the CPU "
                     "backend); -grouped: the same with VideoClips(group_clips=True), the clips_per_video clips "
                     "of a video decoded in one pass and spread over the coming batches. torch-dl / "
                     "torchcodec-dl: the torch and torchcodec DataLoaders above, their collated tensors handed "
                     "to the loop as they come. grain-jax: the grain row (one read thread per worker), each "
                     "batch through jax.device_put.")
    if args.pin:
        notes.append("--pin: worker process i of shmloader (Loader(pin_workers=True) where the installed "
                     "shmloader has it), torch and the physical limit runs on core i, with all its "
                     "threads; thread-based loaders are unchanged.")
    if "python" in args.workloads:
        notes.append(f"python workload: {args.py_iters} iterations of a pure-Python loop per clip. With "
                     "P ms of Python and D ms of decoding per clip on C cores, threads deliver at most "
                     "min(1/P, C/(P+D)) clips/ms (the GIL serialises P) and processes C/(P+D): "
                     "processes can win by max(1, C·P/(P+D)), at most C×, only when P dominates.")
    return notes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
