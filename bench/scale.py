"""Does the training process pay per batch or per sample? (issue #11)

The main process's CPU per delivered sample decides how far the loader scales: a main process
that spends ``u`` us per sample can deliver at most ``1e6 / u`` samples/s, however many workers
decode. This experiment measures that figure (``getrusage(RUSAGE_SELF)``, user + sys of the
main process alone: workers are child processes, never waited for, so they are not in it),
with a consumer that does nothing else:

* video: ``VideoClips`` 16x112x112 clips, batch 8 and 32, 2 workers, plain iteration and
  through ``as_dataset()``; and a dataset smaller than one batch (8 videos, one clip each, at
  the largest batch: each batch spans epochs; ``Loader(span_epochs=True)`` where it exists);
* rows: ``ArraySource`` with 1 KiB rows, batch 256, 2 workers, shuffled, against
  ``tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).batch(256).prefetch(AUTOTUNE)`` over
  the same rows and a numpy gather ``x[perm[i:i + 256]]`` in one process;
* growth: a ``FunctionSource`` that sleeps instead of decoding (so 64 workers fit on 2 cores),
  W = 1 ... 64, batch 32: main CPU per sample and start-up (``Loader()`` to first batch);
* idle: main CPU per second while the consumer waits for a batch that takes long, so a slow
  machine's per-second costs (liveness polls) can be told apart from per-sample costs;
* memory: worker USS of a ``VideoClips`` loader over 8 real paths and over the same 8 followed
  by 1 000 000 paths that are never read, and the time to the first batch of each.

Every configuration runs once per repetition; repetitions are interleaved (``harness``: each runs
all configurations, blocks and the configurations in a block in a shuffled order) and the report
gives medians (min-max). A missed target is followed by a cProfile of the main process (its CPU
time, ``time.thread_time``) over plain iteration, top costs per batch. Writes
``<out>/<name>.json``, ``<out>/<name>.md`` and ``<out>/<name>.png``.

    python bench/scale.py                                    # the full run, ~6 minutes on 2 cores
    python bench/scale.py --commit HEAD                      # shmloader as committed (a shared tree
                                                             # may change under a long run)
    python bench/scale.py --reps 1 --duration 1 --rows 20000 --fake-paths 10000 \\
        --growth-workers 1,4 --name dev --out /tmp/scale      # seconds, for development
"""

from __future__ import annotations

import cProfile
import functools
import os
import pstats
import resource
import select
import sys
import threading
import time

import numpy as np
import psutil

import harness
import report
from measure import system_busy
from report import columns, table

fmt = functools.partial(report.fmt, comma=True)
EXPERIMENTS = ("video", "rows", "growth", "idle", "memory")

# What issue #11 asks for.
CLIP_TARGET_US = 10.0  # main-process CPU per clip, batch 32, plain iteration
ROWS_TARGET = 1.2  # shmloader plain samples/s / tf.data samples/s, 1 KiB rows, batch 256
USS_TARGET_MIB = 10.0  # worker USS, 1 000 000 more paths
FIRST_BATCH_TARGET = 2.0  # time to first batch, 1 000 000 more paths / 8 paths
# Our own reading of "flat" (the issue gives no number): per-sample main CPU at the widest W
# within this factor of W = 4, the first W with as many tasks per batch (min(batch, W, 4)).
FLAT_TARGET = 1.5
# A dataset smaller than one batch (8 videos at batch 32): main CPU per clip within this factor of
# the many-batch figure (issue 17).
SMALL_TARGET = 1.5
_SMALL_VIDEOS = 8

# A loader with W workers and batch B sends min(B, W, 4) tasks per batch: at W = 1 a batch is
# one task, from W = 4 on four. Per-sample cost comparable across W starts at this W.
_FLAT_FROM_W = 4
CLIP_LEN, CLIP_SIZE = 16, (112, 112)
# Clips per video in the video runs: 24 videos give 1536 clips an epoch, so the per-epoch work
# (a new permutation) weighs per clip about as it does on a real dataset, not once per batch.
CLIPS_PER_VIDEO = 64
# The memory runs: 2 clips of each of the 8 real videos fill the 2 slots the loader reads ahead
# (slots=2, batch 8, shuffle off), so it never reaches the paths that are not there.
_MEM_SLOTS, _MEM_CLIPS, _MEM_BATCH = 2, 2, 8
# A worker counts as idle once its CPU time grew by less than this over _IDLE_QUIET_S.
_IDLE_CPU_S, _IDLE_QUIET_S, _IDLE_TIMEOUT_S = 0.003, 0.3, 20.0
# The idle window opens this long after the consumer's first next() call (its start-up work).
_IDLE_SETTLE_S = 0.5
# A measured window holds at least this many ring's worth of batches (see _run_loader).
_WINDOW_RINGS = 2
# Functions listed per profile.
_PROFILE_TOP = 15



def options(p) -> None:
    p.add_argument("--experiments", type=harness.names(EXPERIMENTS), default=list(EXPERIMENTS))
    p.add_argument("--duration", type=float, default=6.0,
                   help="seconds measured per video run (clips arrive at decode speed)")
    p.add_argument("--min-batches", type=int, default=4, help="batches measured at least per run")
    p.add_argument("--warmup", type=int, default=2,
                   help="batches consumed after the first, unmeasured (at least the ring's slots)")
    p.add_argument("--workers", type=int, default=2, help="W of the video and rows runs")
    p.add_argument("--video-batches", type=harness.ints, default=[8, 32])
    harness.video_options(p, "bench-videos", count=24, frames=64)
    p.add_argument("--rows", type=int, default=200_000, help="N rows of the rows experiment")
    p.add_argument("--row-bytes", type=int, default=1024)
    p.add_argument("--rows-batch", type=int, default=256)
    p.add_argument("--rows-duration", type=float, default=3.0, help="seconds measured per rows run")
    p.add_argument("--growth-workers", type=harness.ints, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--growth-batch", type=int, default=32)
    p.add_argument("--sleep-ms", type=float, default=4.0, help="sleep per sample of the growth source")
    p.add_argument("--growth-duration", type=float, default=3.0, help="seconds measured per growth run")
    p.add_argument("--idle-duration", type=float, default=3.0, help="seconds of waiting measured")
    p.add_argument("--fake-paths", type=int, default=1_000_000,
                   help="paths added after the 8 real ones in the memory experiment")
    p.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                   help="profile the main process when a target is missed (auto), always or never")
    p.add_argument("--profile-batches", type=int, default=12, help="batches profiled")


# ------------------------------------------------------------------------ measuring
def _main_usage() -> tuple[float, int]:
    """CPU seconds and voluntary context switches (a thread blocked: one wake-up each) of this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw


def _procs_cpu(pids: list[int]) -> float:
    # shmloader.engine.stats.cpu_seconds, written here again: --commit measures commits older than it
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class Window:
    """One measured stretch: main CPU (getrusage, read first and last so that the psutil reads of
    the workers and of the whole machine fall outside it), wall time, workers' and others' CPU."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._w0, self._s0 = _procs_cpu(pids), system_busy()
        (self._c0, self._v0), self._t0 = _main_usage(), time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def end(self, samples: int, batches: int) -> dict:
        t1, (c1, v1) = time.perf_counter(), _main_usage()
        w1, s1 = _procs_cpu(self.pids), system_busy()
        dt, main, workers = t1 - self._t0, c1 - self._c0, w1 - self._w0
        return {"samples": samples, "batches": batches, "seconds": dt,
                "wakeups_per_batch": (v1 - self._v0) / batches, "wakeups_per_s": (v1 - self._v0) / dt,
                "samples_per_s": samples / dt, "main_cpu_s": main,
                "main_us_per_sample": 1e6 * main / samples,
                "main_us_per_batch": 1e6 * main / batches,
                "ceiling_samples_per_s": samples / main if main > 0 else float("inf"),
                "main_cpu_pct": 100 * main / dt, "workers_cpu_pct": 100 * workers / dt,
                "other_cpu_pct": max(0.0, 100 * ((s1 - self._s0) - main - workers) / dt)}


def _take(it, duration: float, min_batches: int, per_batch: int | None, pids: list[int]) -> dict:
    """Consume ``it`` for at least ``duration`` s and ``min_batches`` batches of ``per_batch``
    samples (``None``: counted, for batches that may be short), touching nothing else: each batch
    is dropped at once and its slot goes back to the ring."""
    batches = samples = 0
    win = Window(pids)
    while batches < min_batches or win.elapsed() < duration:
        batch = next(it)
        samples += per_batch or len(next(iter(batch.values())))
        batches += 1
    return win.end(samples, batches)


def _iterate(loader, mode: str):
    """Plain iteration over the loader, or over its ``as_dataset()``."""
    return iter(loader) if mode == "plain" else iter(loader.as_dataset())


def _run_loader(make, mode: str, *, duration: float, min_batches: int, warmup: int,
                batch: int | None) -> dict:
    """Build a loader, time its first batch, warm up, measure a window, close it.

    The tf.data iterator is dropped before the loader is closed (its prefetch thread may be in
    the loader's ``next()``, which returns once the loader is closed or a batch is ready).
    """
    t0 = time.perf_counter()
    loader = make()
    it = None
    try:
        it = _iterate(loader, mode)
        next(it)
        row = {"first_batch_s": time.perf_counter() - t0}
        # Every slot's batch of the start-up wave delivered before measuring, and a window of
        # several ring's worth: with W workers finishing W tasks at a time, replies arrive in
        # waves, and a short window would count a wave's replies against too few batches.
        slots = loader.stats()["slots"]
        for _ in range(max(warmup, slots)):
            next(it)
        s0 = loader.stats()
        row.update(_take(it, duration, max(min_batches, _WINDOW_RINGS * slots), batch, loader.worker_pids()))
        s1 = loader.stats()
        # Replies the main process read per batch delivered (tasks answered during the window).
        row["tasks_per_batch"] = (s1["tasks"] - s0["tasks"]) / row["batches"]
        # Batches the loader copied because the consumer (TF's prefetch buffer) held all but one slot.
        row["copied_share"] = (s1["copied"] - s0["copied"]) / row["batches"]
    finally:
        it = None
        t1 = time.perf_counter()
        loader.close()
        close_s = time.perf_counter() - t1
    row["close_s"] = close_s
    return row


# ------------------------------------------------------------------------- experiments
def _endless(source, batch: int, workers: int, **options):
    import shmloader

    options = {"drop_remainder": True, **options}
    return shmloader.Loader(source, batch_size=batch, workers=workers, shuffle=True, seed=0, epochs=None, **options)


def span_epochs() -> dict:
    """``span_epochs=True`` where this shmloader has it: a batch fills across epoch boundaries."""
    import inspect

    import shmloader

    return {"span_epochs": True} if "span_epochs" in inspect.signature(shmloader.Loader).parameters else {}


def video_loader(ctx: dict, batch: int, args, small: bool = False):
    """``VideoClips`` over the videos, ``CLIPS_PER_VIDEO`` clips each; ``small``: a dataset of
    ``_SMALL_VIDEOS`` videos, one clip each, smaller than one batch."""
    import shmloader

    paths, labels = ctx["videos"]
    if small:
        paths, labels = paths[:_SMALL_VIDEOS], labels[:_SMALL_VIDEOS]
    source = shmloader.VideoClips(paths, labels, clip_len=CLIP_LEN, clips_per_video=1 if small else CLIPS_PER_VIDEO,
                                  sampling="random", size=CLIP_SIZE)
    # An epoch of the small dataset is a short batch unless batches fill across epochs.
    return _endless(source, batch, args.workers, **({"drop_remainder": False, **span_epochs()} if small else {}))


def video_run(ctx: dict, batch: int, mode: str, small: bool, args) -> dict:
    return _run_loader(lambda: video_loader(ctx, batch, args, small), mode, duration=args.duration,
                       min_batches=args.min_batches, warmup=args.warmup, batch=None if small else batch)


def rows_shm(ctx: dict, mode: str, args) -> dict:
    # Enough warm-up batches to be past the first epoch's plan and the workers' first pages.
    warmup = max(args.warmup, len(ctx["rows_y"]) // args.rows_batch // 4)
    return _run_loader(lambda: _endless(ctx["array_source"], args.rows_batch, args.workers), mode,
                       duration=args.rows_duration, min_batches=args.min_batches, warmup=warmup,
                       batch=args.rows_batch)


def _whole_epochs(epoch, duration: float) -> dict:
    """Run ``epoch()`` (returns samples, batches) once unmeasured, then whole epochs for at
    least ``duration`` s: a whole epoch is what a training loop pays, shuffle fills included."""
    t0 = time.perf_counter()
    epoch()
    first = time.perf_counter() - t0
    win = Window([])
    samples = batches = 0
    while win.elapsed() < duration or not batches:
        s, b = epoch()
        samples += s
        batches += b
    row = win.end(samples, batches)
    row["first_epoch_s"] = first
    return row


def rows_tf(ctx: dict, args) -> dict:
    ds = ctx["tf_dataset"]

    def epoch():
        samples = batches = 0
        for _, y in ds:  # touching nothing but the batch's row count
            samples += int(y.shape[0])
            batches += 1
        return samples, batches

    return _whole_epochs(epoch, args.rows_duration)


def rows_numpy(ctx: dict, args) -> dict:
    x, y, b = ctx["rows_x"], ctx["rows_y"], args.rows_batch
    rng = np.random.default_rng(0)

    def epoch():
        perm = rng.permutation(len(y))
        batches = 0
        for i in range(0, len(perm), b):
            idx = perm[i : i + b]
            _ = x[idx], y[idx]
            batches += 1
        return len(perm), batches

    return _whole_epochs(epoch, args.rows_duration)


SLEEP_S = 0.004  # set from --sleep-ms in main(); travels to the workers with _sleepy (by value)


def _sleepy(index: int, rng) -> dict:
    """A sample that costs its worker a sleep, not CPU: 64 workers fit on 2 cores."""
    time.sleep(SLEEP_S)
    return {"x": np.full(16, index, np.int64)}


def growth_loader(workers: int, args):
    import shmloader

    return _endless(shmloader.FunctionSource(_sleepy, {"x": ((16,), np.int64)}, length=100_000),
                    args.growth_batch, workers)


def growth_run(ctx: dict, workers: int, args) -> dict:
    return _run_loader(lambda: growth_loader(workers, args), "plain", duration=args.growth_duration, min_batches=args.min_batches,
                       warmup=args.warmup, batch=args.growth_batch)


def _forever(index: int, rng) -> dict:
    time.sleep(3600)
    return {"x": np.zeros(16, np.int64)}


def idle_run(ctx: dict, args) -> dict:
    """Main CPU per second while ``next()`` waits for a batch that never comes: the loader's
    per-second costs (waking to check deadlines and worker liveness), not per sample."""
    import shmloader

    source = shmloader.FunctionSource(_forever, {"x": ((16,), np.int64)}, length=64, check=False)
    loader = shmloader.Loader(source, batch_size=1, workers=args.workers, timeout=7200.0)
    result: dict = {}
    try:
        _wait_idle(loader.worker_pids())  # started: imported and initialised

        def measure_then_close():
            # The consumer thread is blocked in next() by then (its first call read the workers'
            # ready messages and sent the tasks); this thread sleeps: the window is the loader's.
            time.sleep(_IDLE_SETTLE_S)
            win = Window(loader.worker_pids())
            time.sleep(args.idle_duration)
            result.update(win.end(1, 1))
            loader.close()

        closer = threading.Thread(target=measure_then_close, daemon=True)
        closer.start()
        for _ in loader:  # ends when close() comes
            pass
        closer.join()
    finally:
        loader.close()
    s = result["seconds"]
    return {"seconds": s, "main_cpu_s": result["main_cpu_s"], "main_us_per_s": 1e6 * result["main_cpu_s"] / s,
            "wakeups_per_s": result["wakeups_per_s"], "wake_us": _wake_cost(),
            "other_cpu_pct": result["other_cpu_pct"]}


def _wake_cost(n: int = 25, wait_s: float = 0.02) -> float:
    """CPU us this thread pays for one bare wake-up: an epoll wait on nothing that times out.
    What a blocked-then-woken loader pays at the least, whatever Python it runs after."""
    ep = select.epoll()
    costs = []
    try:
        for _ in range(n):
            c0 = time.thread_time()
            ep.poll(wait_s)
            costs.append(time.thread_time() - c0)
    finally:
        ep.close()
    return 1e6 * float(np.median(costs))


def _wait_idle(pids: list[int]) -> float:
    """Wait until ``pids`` use (almost) no CPU; returns the seconds waited."""
    t0 = time.perf_counter()
    last = _procs_cpu(pids)
    while time.perf_counter() - t0 < _IDLE_TIMEOUT_S:
        time.sleep(_IDLE_QUIET_S)
        now = _procs_cpu(pids)
        if now - last < _IDLE_CPU_S * len(pids):
            break
        last = now
    return time.perf_counter() - t0


def memory_run(ctx: dict, which: str, args) -> dict:
    """Worker USS once the loader is idle after its first batch, and Loader() to first batch."""
    import shmloader

    source = ctx["mem_sources"][which]
    t0 = time.perf_counter()
    loader = shmloader.Loader(source, batch_size=_MEM_BATCH, workers=args.workers, shuffle=False,
                              epochs=1, slots=_MEM_SLOTS)
    try:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        # The second slot's batch is still being decoded: same work in both loaders; wait for it.
        pids = loader.worker_pids()
        _wait_idle(pids)
        uss, rss = [], []
        for pid in pids:
            m = psutil.Process(pid).memory_full_info()
            uss.append(m.uss / 2**20)
            rss.append(m.rss / 2**20)
        stats = loader.stats()
        it = None
    finally:
        loader.close()
    return {"paths": len(source.paths), "first_batch_s": first, "worker_uss_mib": float(np.mean(uss)),
            "worker_uss_max_mib": max(uss), "worker_rss_mib": float(np.mean(rss)),
            "skipped": stats["skipped"], "main_rss_mib": psutil.Process().memory_info().rss / 2**20}


# ------------------------------------------------------------------------------ plan
def plan(args, ctx: dict) -> list[list[tuple]]:
    """Blocks of configurations; the ones a target compares share a block and run back to back."""
    blocks = []
    if "video" in args.experiments:
        block = [("video", f"b{b} {mode}", (b, mode, False)) for b in args.video_batches
                 for mode in ("plain", "as_dataset")]
        if args.video_batches:  # the dataset smaller than one batch, beside the largest batch
            b = max(args.video_batches)
            how = ", span_epochs" if span_epochs() else ", one short batch per epoch"
            block.append(("video", f"b{b} plain, {_SMALL_VIDEOS} videos{how}", (b, "plain", True)))
        blocks.append(block)
    if "rows" in args.experiments:
        blocks.append([("rows", "shmloader plain", ("plain",)), ("rows", "shmloader as_dataset", ("as_dataset",)),
                       ("rows", "tf.data", ()), ("rows", "numpy gather", ())])
    if "growth" in args.experiments:
        blocks.append([("growth", str(w), (w,)) for w in args.growth_workers])
    if "idle" in args.experiments:
        blocks.append([("idle", f"W={args.workers}", ())])
    if "memory" in args.experiments:
        blocks.append([("memory", "8 paths", ("small",)), ("memory", f"8 + {args.fake_paths} paths", ("large",))])
    ctx["blocks"] = blocks
    return blocks


def run_one(cfg: tuple, rep: int, args, ctx: dict) -> dict:
    exp, name, params = cfg
    row = {"experiment": exp, "config": name, "rep": rep, "error": None}
    try:
        if exp == "video":
            row.update(video_run(ctx, *params, args))
        elif exp == "rows" and name.startswith("shmloader"):
            row.update(rows_shm(ctx, *params, args))
        elif exp == "rows" and name == "tf.data":
            row.update(rows_tf(ctx, args))
        elif exp == "rows":
            row.update(rows_numpy(ctx, args))
        elif exp == "growth":
            row.update(growth_run(ctx, *params, args))
        elif exp == "idle":
            row.update(idle_run(ctx, args))
        else:
            row.update(memory_run(ctx, *params, args))
    except Exception as e:  # one broken configuration must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def brief(cfg: tuple, row: dict) -> str:
    """One line per run: what it measured."""
    return f"rep {row['rep'] + 1} {cfg[0]} {cfg[1]}: " + (
        f"{row['main_us_per_sample']:.2f} us/sample, {row['samples_per_s']:,.0f}/s" if "main_us_per_sample" in row else
        f"{row['main_us_per_s']:.0f} us/s" if "main_us_per_s" in row else
        f"USS {row['worker_uss_mib']:.1f} MiB, first batch {row['first_batch_s']:.2f} s"
        if "worker_uss_mib" in row else row["error"]) + f" ({row['wall_s']:.1f} s)"


def prepare(args, notes: list[str]) -> dict:
    """What the runs share, built once and outside every measurement."""
    global SLEEP_S
    SLEEP_S = args.sleep_ms / 1e3
    ctx: dict = {}
    needs_videos = {"video", "memory"} & set(args.experiments)
    if needs_videos:
        from workloads import make_clipset

        clips = make_clipset(args.cache, args.video_count, args.video_frames, args.video_size, args.codec)
        ctx["videos"] = (list(clips.paths), list(clips.labels))
    if "rows" in args.experiments:
        import shmloader
        import tensorflow as tf

        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (args.rows, args.row_bytes), dtype=np.uint8)
        y = np.arange(args.rows, dtype=np.int64)
        ctx["rows_x"], ctx["rows_y"] = x, y
        ctx["array_source"] = shmloader.ArraySource({"x": x, "y": y})
        ctx["tf_dataset"] = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.rows)
                             .batch(args.rows_batch).prefetch(tf.data.AUTOTUNE))
    if "memory" in args.experiments:
        import shmloader

        paths, labels = ctx["videos"]
        real, real_labels = paths[:8], labels[:8]
        fake = [f"/nonexistent/scale-bench/video_{i:07d}.mp4" for i in range(args.fake_paths)]
        kw = dict(clip_len=CLIP_LEN, clips_per_video=_MEM_CLIPS, sampling="random", size=CLIP_SIZE)
        t0 = time.perf_counter()
        large = shmloader.VideoClips(real + fake, real_labels + [i % 2 for i in range(len(fake))], **kw)
        ctx["large_source_s"] = time.perf_counter() - t0
        ctx["mem_sources"] = {"small": shmloader.VideoClips(real, real_labels, **kw), "large": large}
        notes.append(f"memory: VideoClips over {len(real) + len(fake)} paths took "
                     f"{ctx['large_source_s']:.2f} s to build (the user's side, before Loader(); not in "
                     "the time to first batch).")
    return ctx


# --------------------------------------------------------------------------- summary
_METRICS = ("samples_per_s", "main_us_per_sample", "main_us_per_batch", "ceiling_samples_per_s",
            "main_cpu_pct", "workers_cpu_pct", "other_cpu_pct", "first_batch_s", "close_s",
            "tasks_per_batch", "wakeups_per_batch", "wakeups_per_s", "wake_us", "copied_share", "main_us_per_s",
            "worker_uss_mib", "worker_uss_max_mib", "worker_rss_mib", "first_epoch_s")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    """Summary (experiment -> configuration, in plan order -> metric -> spread), targets, and a
    profile of each missed main-process target's plain iteration (a memory target would need
    another tool) or of all with --profile always."""
    cfgs = [(exp, cfg) for block in ctx["blocks"] for exp, cfg, _ in block]
    summary = report.summarize(runs, ("experiment", "config"), _METRICS,
                               sort=lambda r: cfgs.index((r["experiment"], r["config"])))
    doc.update(summary=summary, targets=check_targets(runs, summary, args), profiles=[])
    missed = {t["key"] for t in doc["targets"] if not t["met"]}
    for what in ("video", "rows", "growth"):
        if what in args.experiments and (args.profile == "always" or (args.profile == "auto" and what in missed)):
            print(f"profiling plain iteration: {what}", flush=True)
            doc["profiles"].append(profile_plain(ctx, what, args))
    if "memory" in args.experiments and (args.profile == "always" or (args.profile == "auto" and "memory" in missed)):
        print("profiling Loader() to first batch: memory", flush=True)
        doc["profiles_first_batch"] = [profile_first_batch(ctx, which, args) for which in ("small", "large")]
    errors = [r for r in runs if r["error"]]
    if errors:
        doc["notes"].append(f"{len(errors)} run(s) failed: " + "; ".join(
            f"{r['experiment']} {r['config']}: {r['error']}" for r in errors[:5]))




def _med(summary: dict, exp: str, cfg: str, metric: str) -> float | None:
    s = summary.get(exp, {}).get(cfg, {}).get(metric)
    return None if s is None or not s["n"] else s["median"]


def _target(key: str, target: str, goal: str, value: float, met: bool, measured: str) -> dict:
    return {"key": key, "target": target, "goal": goal, "value": value, "met": met, "measured": measured}


def check_targets(runs: list[dict], summary: dict, args) -> list[dict]:
    """Issue #11's targets from the medians; ``key`` names the experiment a miss would profile."""
    out = []
    idle = _med(summary, "idle", f"W={args.workers}", "main_us_per_s")
    b = max(args.video_batches) if args.video_batches else None
    clip = _med(summary, "video", f"b{b} plain", "main_us_per_sample")
    if clip is not None:
        measured = f"{clip:.1f} us (ceiling {1e6 / clip:,.0f} clips/s)"
        rate = _med(summary, "video", f"b{b} plain", "samples_per_s")
        if idle is not None and rate:
            measured += f"; {clip - idle / rate:.1f} us net of the idle cost ({idle:.0f} us/s at {rate:.0f} clips/s)"
        out.append(_target("video", f"main CPU per clip, 16x112x112, batch {b}, W={args.workers}, plain iteration",
                           f"<= {CLIP_TARGET_US:g} us", clip, clip <= CLIP_TARGET_US, measured))
        small_cfg = next((c for c in summary["video"] if c.startswith(f"b{b} plain, {_SMALL_VIDEOS} videos")), None)
        small = small_cfg and _med(summary, "video", small_cfg, "main_us_per_sample")
        if small is not None:
            out.append(_target("video", f"main CPU per clip, {_SMALL_VIDEOS} videos at batch {b}, within "
                               f"{SMALL_TARGET:g}x of the many-batch figure", f"<= {SMALL_TARGET:g}x", small / clip,
                               small / clip <= SMALL_TARGET, f"{small / clip:.2f}x ({small:.1f} vs {clip:.1f} us; "
                               f"{small_cfg.split(', ', 1)[1]})"))
    shm, tfd = (_med(summary, "rows", c, "samples_per_s") for c in ("shmloader plain", "tf.data"))
    if shm is not None and tfd is not None:
        paired = report.ratio(runs, {"experiment": "rows", "config": "shmloader plain"},
                              {"experiment": "rows", "config": "tf.data"}, "samples_per_s")
        out.append(_target("rows", f"1 KiB rows, batch {args.rows_batch}, W={args.workers}: shmloader plain / "
                                   "tf.data from_tensor_slices.shuffle.batch.prefetch",
                           f">= {ROWS_TARGET:g}x", shm / tfd, shm / tfd >= ROWS_TARGET,
                           f"{shm / tfd:.2f}x ({shm:,.0f} vs {tfd:,.0f} samples/s; per repetition "
                           f"{paired['per_rep_min']:.2f}-{paired['per_rep_max']:.2f}x)"))
    wide = sorted(w for w in map(int, summary.get("growth", {})) if w >= _FLAT_FROM_W)
    if len(wide) >= 2:
        lo, hi = (_med(summary, "growth", str(w), "main_us_per_sample") for w in (wide[0], wide[-1]))
        out.append(_target("growth", f"main CPU per sample flat in W (sleeping source, batch {args.growth_batch}): "
                                     f"W={wide[-1]} / W={wide[0]}",
                           f"<= {FLAT_TARGET:g}x (our reading of 'flat')", hi / lo, hi / lo <= FLAT_TARGET,
                           f"{hi / lo:.2f}x ({hi:.1f} vs {lo:.1f} us/sample)"))
    mem = summary.get("memory", {})
    if len(mem) == 2:
        small, large = "8 paths", next(c for c in mem if c != "8 paths")
        ua, ub = (_med(summary, "memory", c, "worker_uss_mib") for c in (large, small))
        out.append(_target("memory", f"worker USS, {large} vs 8 paths", f"<= +{USS_TARGET_MIB:g} MiB", ua - ub,
                           ua - ub <= USS_TARGET_MIB, f"{ua - ub:+.1f} MiB ({ua:.1f} vs {ub:.1f} MiB)"))
        fa, fb = (_med(summary, "memory", c, "first_batch_s") for c in (large, small))
        out.append(_target("memory", f"Loader() to first batch, {large} / 8 paths", f"<= {FIRST_BATCH_TARGET:g}x",
                           fa / fb, fa / fb <= FIRST_BATCH_TARGET, f"{fa / fb:.2f}x ({fa:.2f} vs {fb:.2f} s)"))
    return out


# --------------------------------------------------------------------------- profile
def _where(file: str, line: int) -> str:
    """``shmloader/_loader.py:336`` for the package measured (wherever it was imported from)."""
    import shmloader

    parent = os.path.dirname(os.path.dirname(os.path.abspath(shmloader.__file__)))
    if file.startswith(parent + os.sep):
        return f"{os.path.relpath(file, parent)}:{line}"
    return f"{os.path.basename(file)}:{line}"


def _profile_rows(prof, names: tuple[str, str, str], per_call: float, per_s: float) -> list[dict]:
    """One row per function: ``names`` for its calls, self time and cumulative time, scaled."""
    return [{"function": f"{func} ({_where(file, line)})", names[0]: nc * per_call,
             names[1]: per_s * tt, names[2]: per_s * ct}
            for (file, line, func), (cc, nc, tt, ct, _) in pstats.Stats(prof).stats.items()]


def _profile(make, warm, batches, timer=None) -> tuple:
    """cProfile of this process over ``batches(loader)`` batches of the loader ``make()`` builds,
    after ``warm(loader)`` unprofiled ones (none: its construction is profiled too); with the
    ``timer``'s seconds (cProfile's own wall clock by default) over the profiled part and the
    batches profiled."""
    prof = cProfile.Profile(*([timer] if timer else []))
    timer = timer or time.perf_counter
    if warm is None:
        prof.enable()
    t0 = timer()
    loader = make()
    try:
        it = iter(loader)
        for _ in range(warm(loader) if warm else 0):
            next(it)
        nb = batches(loader)
        if warm is not None:
            t0 = timer()
            prof.enable()
        for _ in range(nb):
            next(it)
        prof.disable()
        return prof, timer() - t0, nb
    finally:
        prof.disable()
        it = None
        loader.close()


def profile_plain(ctx: dict, what: str, args) -> dict:
    """cProfile of the main thread's CPU time (``time.thread_time``) over plain iteration: the
    consumer's thread is the only one working in plain iteration. The profiler slows every call
    down, so the shares matter more than the absolute microseconds."""
    if what == "video":
        batch = max(args.video_batches)
        make = functools.partial(video_loader, ctx, batch, args)
    elif what == "rows":
        batch = args.rows_batch
        make = functools.partial(_endless, ctx["array_source"], batch, args.workers)
    else:
        batch, workers = args.growth_batch, max(args.growth_workers)
        what = f"sleeping FunctionSource, W={workers}"
        make = functools.partial(growth_loader, workers, args)
    # Enough batches that the profile is not a few wake-ups: a ring's worth at least.
    prof, total, nb = _profile(make, lambda loader: 1 + max(args.warmup, loader.stats()["slots"]),
                               lambda loader: max(args.profile_batches, 2 * loader.stats()["slots"],
                                                  200 if what == "rows" else 0), time.thread_time)
    rows = sorted(_profile_rows(prof, ("calls_per_batch", "self_us_per_batch", "cum_us_per_batch"), 1 / nb, 1e6 / nb),
                  key=lambda r: -r["self_us_per_batch"])
    return {"what": what, "batch_size": batch, "batches": nb, "thread_cpu_us_per_batch": 1e6 * total / nb,
            "top_self": rows[:_PROFILE_TOP],
            "top_cumulative": sorted(rows, key=lambda r: -r["cum_us_per_batch"])[:_PROFILE_TOP],
            "top_cumulative_shmloader": sorted((r for r in rows if "shmloader/" in r["function"]),
                                               key=lambda r: -r["cum_us_per_batch"])[:_PROFILE_TOP]}


def profile_first_batch(ctx: dict, which: str, args) -> dict:
    """cProfile, wall clock, of the main process from ``Loader()`` to the first batch of a memory
    run's loader: where the time to first batch goes (the workers' own start-up shows as waiting)."""
    import shmloader

    source = ctx["mem_sources"][which]
    prof, wall, _ = _profile(lambda: shmloader.Loader(source, batch_size=_MEM_BATCH, workers=args.workers,
                                                      shuffle=False, epochs=1, slots=_MEM_SLOTS),
                             None, lambda loader: 1)
    rows = _profile_rows(prof, ("calls", "self_ms", "cum_ms"), 1, 1e3)
    return {"paths": len(source.paths), "wall_s": wall,
            "top_cumulative": sorted(rows, key=lambda r: -r["cum_ms"])[:_PROFILE_TOP],
            "top_self": sorted(rows, key=lambda r: -r["self_ms"])[:_PROFILE_TOP]}


# ---------------------------------------------------------------------------- report
def _ceiling(s: dict) -> str:
    m = s.get("main_us_per_sample")
    return "–" if not m or not m["n"] else f"{1e6 / m['median']:,.0f}"


def markdown(doc: dict) -> str:
    m, sm, a = doc["machine"], doc["summary"], doc["config"]
    lines = report.header(doc, f"Scale: main-process CPU per sample ({doc['name']})",
                          machine_tail=f" Load average at start {m['load_avg_at_start']}.",
                          wall_tail=f" {a['reps']} interleaved repetitions; cells: median (min–max).")
    lines += ["Main CPU = `getrusage(RUSAGE_SELF)` user + sys of the main process (all its threads, TF's "
             "included; the workers are children and are not in it) over a window after the first "
             "batch and a warm-up of one ring's worth of batches (the slots), for at least "
             f"{a['duration']:g} s (video), {a['rows_duration']:g} s (rows), {a['growth_duration']:g} s "
             f"(growth) and {_WINDOW_RINGS} rings' worth of batches; the consumer touches nothing. Ceiling = "
             "1e6 / (us per sample): samples/s at which the main process would use a whole core. "
             "Replies/batch: worker replies the main process read per batch delivered (`stats()['tasks']`). "
             "Main wake-ups/batch: voluntary context switches of the main process (`ru_nvcsw`) per batch, "
             "i.e. how often it blocked and was woken (through `as_dataset()` TF's threads count too). "
             "Copied %: batches the loader copied because the consumer held all but one slot. "
             "Workers and other load: CPU % (100 = one core) of the loader's workers and of every "
             "other program on the machine during the window.", ""]
    for t in doc["targets"]:
        verdict = "met" if t["met"] else "missed"
        lines.append(f"- **{verdict}**: {t['target']}: {t['measured']} (goal {t['goal']}).")
    lines.append("")
    if "video" in sm:
        lines += [f"## Video clips {CLIP_LEN}x{CLIP_SIZE[0]}x{CLIP_SIZE[1]}, W={a['workers']}", ""]
        lines += columns("batch | delivery", ((" | ".join(c[1:].split(" ", 1)), s) for c, s in sm["video"].items()), [
            ("main us/clip", "main_us_per_sample", 1), ("ceiling clips/s", _ceiling),
            ("main us/batch", "main_us_per_batch", 0), ("clips/s", "samples_per_s", 1),
            ("replies/batch", "tasks_per_batch", 1), ("main wake-ups/batch", "wakeups_per_batch", 1),
            ("copied %", "copied_share", 0, 100), ("workers CPU %", "workers_cpu_pct", 0),
            ("other load %", "other_cpu_pct", 0), ("first batch s", "first_batch_s", 2)], comma=True) + [""]
    if "idle" in sm:
        s = next(iter(sm["idle"].values()))
        lines += [f"Idle cost: {fmt(s['main_us_per_s'])} us of main CPU per second while `next()` waits "
                  f"(W={a['workers']}, no batch arriving; {fmt(s['wakeups_per_s'], 1)} wake-ups/s to check "
                  "deadlines and worker liveness). At the video runs' decode speed this is part of the "
                  "per-clip figure; on a machine delivering thousands of clips/s it is not. One bare "
                  f"wake-up (an epoll wait on nothing that times out after 20 ms) costs {fmt(s['wake_us'])} us "
                  "of CPU on this machine: a main process that blocks and wakes k times per batch pays at "
                  "least k times that per batch before running any Python.", ""]
    if "rows" in sm:
        lines += [f"## {a['row_bytes']} B rows, N = {a['rows']:,}, batch {a['rows_batch']}, shuffled", ""]
        lines += columns("pipeline", sm["rows"].items(), [
            ("samples/s", "samples_per_s", 0), ("main us/sample", "main_us_per_sample", 2),
            ("ceiling samples/s", _ceiling), ("main CPU %", "main_cpu_pct", 0), ("workers CPU %", "workers_cpu_pct", 0),
            ("main wake-ups/batch", "wakeups_per_batch", 1), ("copied %", "copied_share", 0, 100),
            ("other load %", "other_cpu_pct", 0)], comma=True)
        lines += ["", f"shmloader: `Loader(ArraySource({{'x': uint8[N, {a['row_bytes']}], 'y': int64[N]}}), "
                      f"batch_size={a['rows_batch']}, workers={a['workers']}, shuffle=True)`, measured "
                      "after a quarter epoch of warm-up. tf.data: `from_tensor_slices((x, y)).shuffle(N)"
                      f".batch({a['rows_batch']}).prefetch(AUTOTUNE)`, whole epochs after one unmeasured "
                      "(each epoch refills the shuffle buffer, as every epoch of training does). numpy: "
                      "`x[idx], y[idx]` for `idx = perm[i:i+B]`, a new permutation per epoch, one process.", ""]
    if "growth" in sm:
        lines += [f"## Growth with workers: FunctionSource sleeping {a['sleep_ms']:g} ms per sample, batch "
                  f"{a['growth_batch']}", ""]
        lines += columns("W", sorted(sm["growth"].items(), key=lambda kv: int(kv[0])), [
            ("main us/sample", "main_us_per_sample", 1), ("main us/batch", "main_us_per_batch", 0),
            ("replies/batch", "tasks_per_batch", 1), ("main wake-ups/batch", "wakeups_per_batch", 1),
            ("samples/s", "samples_per_s", 0), ("start-up s (Loader() to first batch)", "first_batch_s", 2),
            ("close s", "close_s", 2), ("other load %", "other_cpu_pct", 0)], comma=True) + [""]
    if "memory" in sm:
        lines += [f"## Worker memory: VideoClips, W={a['workers']}, batch {_MEM_BATCH}, shuffle off", ""]
        lines += columns("paths", sm["memory"].items(), [
            ("worker USS MiB (mean of workers)", "worker_uss_mib", 1), ("largest worker USS MiB", "worker_uss_max_mib", 1),
            ("worker RSS MiB", "worker_rss_mib", 1), ("Loader() to first batch s", "first_batch_s", 2)], comma=True)
        lines += ["", f"USS (psutil `memory_full_info`) once the workers are idle after the first batch. "
                      f"Each of the 8 real videos gives {_MEM_CLIPS} clips and the loader reads {_MEM_SLOTS} "
                      "batches ahead (`slots=2`), so both loaders decode the same 16 clips and the "
                      "other paths are never opened.", ""]
    for p in doc.get("profiles", []):
        lines += [f"## Profile: plain iteration, {p['what']}, batch {p['batch_size']} "
                  f"({p['batches']} batches)", "",
                  f"Main thread CPU under the profiler: {p['thread_cpu_us_per_batch']:,.0f} us per batch "
                  "(cProfile with `time.thread_time`; the profiler's own overhead inflates every figure).", ""]
        for what, key in (("function (self time)", "top_self"), ("shmloader function (cumulative)",
                                                                  "top_cumulative_shmloader")):
            lines += _profile_table(f"| {what} | calls/batch | self us/batch | cumulative us/batch |", p[key],
                                    ("calls_per_batch", "self_us_per_batch", "cum_us_per_batch"), "{:.1f}", "{:.0f}")
            lines.append("")
    for p in doc.get("profiles_first_batch", []):
        lines += [f"## Profile: Loader() to first batch, {p['paths']} paths "
                  f"({p['wall_s']:.2f} s under the profiler)", "",
                  "Wall clock (cProfile's default timer): waiting for the workers shows as `select`/`poll`.", ""]
        lines += _profile_table("| function (cumulative) | calls | self ms | cumulative ms |", p["top_cumulative"],
                                ("calls", "self_ms", "cum_ms"), "{}", "{:.1f}") + [""]
    return "\n".join(lines + report.tail(doc, plots_heading=None))


def _profile_table(head: str, rows: list[dict], keys: tuple[str, str, str], calls: str, times: str) -> list[str]:
    return table(head, [f"| `{r['function']}` | {calls.format(r[keys[0]])} | {times.format(r[keys[1]])} | "
                        f"{times.format(r[keys[2]])} |" for r in rows])


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    sm = doc["summary"]
    panels = [k for k in ("growth", "video", "rows") if k in sm]
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.3), squeeze=False)
    for ax, k in zip(axes[0], panels):
        if k == "growth":
            ws = sorted(sm[k], key=int)
            xs = [int(w) for w in ws]

            def err(metric):
                s = [sm[k][w][metric] for w in ws]
                med = [x["median"] for x in s]
                return med, [[m - x["min"] for m, x in zip(med, s)], [x["max"] - m for m, x in zip(med, s)]]

            med, e = err("main_us_per_sample")
            ax.errorbar(xs, med, yerr=e, marker="o", capsize=3, color="tab:blue", label="main CPU us/sample")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_ylim(bottom=0, top=max(med) * 1.6)
            ax.set_xlabel("workers W"), ax.set_ylabel("main-process CPU us per sample")
            ax2 = ax.twinx()
            med2, e2 = err("first_batch_s")
            ax2.errorbar(xs, med2, yerr=e2, marker="s", capsize=3, color="tab:orange", linestyle="--",
                         label="start-up s")
            ax2.set_ylabel("Loader() to first batch, s"), ax2.set_ylim(bottom=0)
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
            ax.set_title(f"sleeping FunctionSource, batch {doc['config']['growth_batch']}", fontsize=9)
        elif k == "video":
            cfgs = list(sm[k])
            report.bars(ax, range(len(cfgs)), [sm[k][c]["main_us_per_sample"] for c in cfgs],
                        ["tab:blue" if "plain" in c else "tab:purple" for c in cfgs])
            ax.axhline(CLIP_TARGET_US, color="tab:red", linestyle=":",
                       label=f"target {CLIP_TARGET_US:g} us (b32 plain)")
            ax.set_xticks(range(len(cfgs)), [c.replace(" ", "\n") for c in cfgs], fontsize=8)
            ax.set_ylabel("main-process CPU us per clip"), ax.legend(fontsize=8)
            ax.set_title(f"video clips {CLIP_LEN}x{CLIP_SIZE[0]}x{CLIP_SIZE[1]}, W={doc['config']['workers']}",
                         fontsize=9)
        else:
            cfgs = list(sm[k])
            report.bars(ax, range(len(cfgs)), [sm[k][c]["samples_per_s"] for c in cfgs],
                        ["tab:blue" if c.startswith("shm") else "tab:gray" for c in cfgs])
            ax.set_yscale("log")
            ax.set_ylim(bottom=min(sm[k][c]["samples_per_s"]["median"] for c in cfgs) / 4)  # every bar visibly starts from the same floor
            ax.set_xticks(range(len(cfgs)), [c.replace(" ", "\n") for c in cfgs], fontsize=8)
            ax.set_ylabel("rows/s")
            ax.set_title(f"{doc['config']['row_bytes']} B rows, batch {doc['config']['rows_batch']}, shuffled",
                         fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Main-process cost ({doc['machine']['cpu_model']}, {doc['machine']['usable_cores']} cores); "
                 "median, bars min–max", fontsize=10)
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(
    script="bench/scale.py", name="scale-cpu2", about=__doc__, options=options, prepare=prepare, cells=plan,
    run=run_one, report=finish, markdown=markdown, plot=plot, label=lambda cfg: f"{cfg[0]} {cfg[1]}",
    brief=brief, retry=False)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
