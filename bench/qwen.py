"""Qwen-VL video inputs (issue 55): videos/s and peak memory of ``shmloader.qwen.clips`` against
qwen-vl-utils' ``fetch_video`` in a torch DataLoader.

Both pipelines give every video the frames and size qwen-vl-utils gives it (``fps=--fps``, its
default pixel budget) and run ``--workers`` worker processes; each run reads an endless shuffled
stream of the workload's videos. What reaches the training process differs, as it does in use:

* ``shmloader``: ``Loader(qwen.clips(paths), batch_size=1, workers=W)``, one video a batch, its
  frames decoded at the planned size and laid out as uint8 patch rows (``pixel_values_videos``,
  with ``video_grid_thw``) in the shared-memory ring;
* ``shmloader-tokens``: the same with ``batch_tokens=--batch-tokens`` (as many videos as fit the
  budget; Kinetics-style files only: a long video alone nearly fills the model's budget);
* ``limit`` (issue 68): no loader, PyAV alone in W spawned processes decoding only what each
  plan needs (``bench/qwen_limit.py``): the frames no wanted frame references left undecoded,
  the wanted ones converted to rgb24 at the planned size, nothing laid out; videos/s summed over
  the processes. The most W processes of this machine make of the plans: a loader can at best
  deliver that. Timed over ``--duration`` s from a common start once every process has read
  one video (on every workload: a long run's loaders are timed from their start).
* ``decord``, ``torchcodec``: ``torch.utils.data.DataLoader(dataset, num_workers=W, batch_size=1,
  collate_fn=<a list as it comes>)`` whose dataset returns ``fetch_video({"video": path, "fps":
  fps})``: qwen-vl-utils' reader (``FORCE_QWENVL_VIDEO_READER``) decodes the frames at full size,
  torchvision resizes them (bicubic, antialiased) and they come as float32 ``[n, 3, H, W]``. Each
  reader runs as it comes: decord's ``VideoReader`` with its default threads, torchcodec's with
  qwen-vl-utils' ``TORCHCODEC_NUM_THREADS`` (8). DataLoader workers start with ``--torch-start``
  (fork, Linux's default); the dataset loads torchvision itself, so spawned workers work too.

The processor's normalisation and patch layout run later, in the trainer, in both cases (ours:
``qwen.normalize`` on the rows; theirs: ``Qwen2VLVideoProcessor``); neither is timed here. The
consumer reads one value of every 4 KiB of what it is handed (a stand-in for the copy to the
GPU) and drops it.

Three workloads, each written once into ``--cache``:

* ``kinetics``: ``--kinetics-count`` textured frame-code videos (``workloads.write_textured``) of
  ``--kinetics-seconds`` s at 340x256, 30 fps, x264 preset medium, CRF 23, its default GOP
  (Kinetics as ffmpeg's defaults re-encode it). Runs of at least ``--duration`` s after
  ``--warmup`` videos.
* ``textured12``: ``--textured12-count`` textured videos of 12 s at 30 fps, every third at
  1280x720 and the others at 640x360, the same encode: files as a new user would try first
  (Qwen's plan at 2 fps: 24 frames each). Runs as the Kinetics-style ones.
* ``long``: ``--long-count`` videos of ``--long-minutes`` min at 640x480, 30 fps, the same
  encode: a ``--long-segment``-second textured segment per video, written by the encoder once and
  repeated by remuxing (packets copied, timestamps shifted: every repeat starts at a keyframe, so
  decoding it costs what decoding a file of that length costs). A run delivers ``--long-videos``
  videos (default one per file), timed from the pipeline's start.

Per run: videos/s, seconds to the first video, CPU seconds per video (main process and workers),
and memory sampled every 0.1 s over the whole run (main process and every process it started):

* ``peak_mem_mib``, the figure the target reads: the peak of the processes' own memory plus their
  shared memory counted once. Per process ``Pss_Anon + Pss_File`` (``/proc/<pid>/smaps_rollup``:
  a page shared by k processes counts 1/k in each, so forked workers' inherited pages and shared
  libraries are not counted twice), plus every shared-memory object a process maps or holds open
  (memfd, ``/dev/shm``: shmloader's ring, torch's tensors on their way to the main process) at
  its allocated size, once. Summed RSS counts a shared page once per process, and PSS alone
  misses a reserved ring's pages no process has touched yet.
* ``peak_rss_mib``: summed RSS, as ``top`` would add it up (for comparison only);
  ``added_mem_mib``: the peak less the main process's own memory before the run.

A run whose processes leave less than ``--memory-floor`` GiB available is stopped (its workers
killed) and its row says so.

    python bench/qwen.py                   # ~13 minutes on 2 cores after writing the videos (~5 min once)
    python bench/qwen.py --kinetics-count 2 --kinetics-seconds 3 --textured12-count 1 --long-count 2 \\
        --long-minutes 0.25 --long-segment 5 --duration 3 --reps 1 --no-plots --name qwen-tiny   # it runs (~2 minutes)
    python bench/qwen.py --workloads textured12,kinetics --arms shmloader,decord,limit \\
        --name qwen-limit-cpu2             # issue 68's rows (~5 minutes)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import time

import harness
import numpy as np
import psutil
import report
from measure import Sampler, cpu_shares
from report import fmt, fmt_ratio, table
from workloads import kinetics_video, write_textured, written

ARMS = ("shmloader", "shmloader-tokens", "decord", "torchcodec", "limit")
OURS = ("shmloader", "shmloader-tokens")
WORKLOADS = ("kinetics", "textured12", "long")
# (ratio, issue): ours >= ratio x qwen-vl-utils' videos/s at W = 2
SPEED_TARGETS = ((2.0, "issue 55"), (4.0, "issue 68"))
LIMIT_TARGET = 0.9  # issue 68: ours >= 0.9 x the limit's videos/s at W = 2
MEMORY_TARGET = 0.5  # issue 55: ours <= 1/2 of qwen-vl-utils' peak memory on the long videos
# One value read of every this many bytes of what the consumer is handed: every page touched.
_TOUCH_BYTES = 4096
# Sampling period of the memory sampler (as measure.Sampler's): short enough for a worker's
# transient buffers of a long video, which live for seconds.
_TICK_S = 0.1
def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fps", type=float, default=2.0, help="Qwen's frame rate (fetch_video's fps)")
    p.add_argument("--arms", type=harness.names(ARMS), default=list(ARMS))
    workload_options(p)
    p.add_argument("--long-videos", type=int, default=None, help="videos a long run delivers (default: --long-count)")
    p.add_argument("--batch-tokens", type=int, default=8192, help="shmloader-tokens' budget (Kinetics-style files)")
    p.add_argument("--slots", type=int, default=None, help="shmloader's ring slots (default: the loader's own)")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds measured per Kinetics-style or textured12 run (and per limit run), at least")
    p.add_argument("--warmup", type=int, default=2,
                   help="videos delivered before a Kinetics-style or textured12 run's window")
    p.add_argument("--torch-start", default="fork", choices=("fork", "forkserver", "spawn"),
                   help="how the DataLoader's workers start")
    p.add_argument("--memory-floor", type=float, default=1.0,
                   help="GiB: a run that leaves less memory available is stopped")


def workload_options(p) -> None:
    """The workloads' options (``workload_files``' videos), shared with ``bench/qwen_stages.py``."""
    p.add_argument("--workloads", type=harness.names(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--kinetics-count", type=int, default=12)
    p.add_argument("--kinetics-seconds", type=float, default=10.0)
    p.add_argument("--textured12-count", type=int, default=6)
    p.add_argument("--long-count", type=int, default=4)
    p.add_argument("--long-minutes", type=float, default=5.0)
    p.add_argument("--long-segment", type=float, default=30.0,
                   help="seconds encoded per long video, repeated by remuxing up to --long-minutes")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "qwen"))


# ------------------------------------------------------------------------------- videos
def _kinetics(args, i: int) -> str:
    return kinetics_video(args.cache, i, frames=round(30 * args.kinetics_seconds))


def _textured12(args, i: int) -> str:
    h, w = (720, 1280) if i % 3 == 2 else (360, 640)
    path = os.path.join(args.cache, f"textured12_{i:03d}_360f_{h}x{w}.mp4")
    return written(path, lambda tmp: write_textured(tmp, 200 + i, frames=360, size=(h, w), fps=30, gop=0,
                                                    options={"preset": "medium", "crf": "23"}))


def workload_files(args, name: str) -> list[str]:
    """The videos of workload ``name`` (``WORKLOADS``), written into ``--cache`` where missing."""
    os.makedirs(args.cache, exist_ok=True)
    make, count = {"kinetics": (_kinetics, args.kinetics_count), "textured12": (_textured12, args.textured12_count),
                   "long": (_long, args.long_count)}[name]
    return [make(args, i) for i in range(count)]


def _long(args, i: int) -> str:
    seg_frames = round(30 * args.long_segment)
    repeats = max(1, round(args.long_minutes * 60 / args.long_segment))
    segment = os.path.join(args.cache, f"segment_{i:03d}_{seg_frames}f_480x640.mp4")
    written(segment, lambda tmp: write_textured(tmp, 100 + i, frames=seg_frames, size=(480, 640), fps=30, gop=0,
                                                options={"preset": "medium", "crf": "23"}))
    path = os.path.join(args.cache, f"long_{i:03d}_{seg_frames * repeats}f_480x640.mp4")
    return written(path, lambda tmp: repeat_segment(segment, tmp, repeats))


def repeat_segment(segment: str, path: str, times: int) -> str:
    """``segment``'s video stream ``times`` times in a row into ``path``, packets copied: each
    repeat's timestamps shifted by the segment's length (it starts at a keyframe, as the segment)."""
    import av

    with av.open(segment) as src:
        s = src.streams.video[0]
        span = round(s.frames / s.average_rate / s.time_base)  # the segment's length, stream units
    with av.open(path, "w") as dst:
        out = None
        for k in range(times):
            with av.open(segment) as src:
                s = src.streams.video[0]
                out = out or dst.add_stream_from_template(s)
                for packet in src.demux(s):
                    if packet.dts is None:  # the flush packet
                        continue
                    packet.pts += k * span
                    packet.dts += k * span
                    packet.stream = out
                    dst.mux(packet)
    return path


# -------------------------------------------------------------------- qwen-vl-utils
def vision_process(backend: str):
    """qwen-vl-utils' vision_process with ``backend`` as its video reader; torchvision loaded as
    the tests load it (tests/_qwen.py: from where `make test` installs it, its C++ ops unloadable
    beside torch's CPU build)."""
    if harness.ROOT not in sys.path:  # a DataLoader worker spawned with this script as its main module
        sys.path.append(harness.ROOT)
    from tests._qwen import have_torchvision, import_torchvision

    if have_torchvision():
        import_torchvision()
    module = importlib.import_module("qwen_vl_utils.vision_process")
    if module.FORCE_QWENVL_VIDEO_READER != backend:
        module.FORCE_QWENVL_VIDEO_READER = backend  # read once and cached by get_video_reader_backend
        module.get_video_reader_backend.cache_clear()
    return module


class FetchVideos:
    """A map-style dataset: item ``i`` is ``fetch_video({"video": paths[i], "fps": fps})`` with
    qwen-vl-utils' ``backend`` reader (float32 ``[n, 3, H, W]``)."""

    def __init__(self, paths: list[str], fps: float, backend: str) -> None:
        self.paths, self.fps, self.backend = paths, fps, backend

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return vision_process(self.backend).fetch_video({"video": self.paths[i], "fps": self.fps})


def as_list(items: list) -> list:
    """``collate_fn=lambda x: x``, at module level so that spawned workers can unpickle it."""
    return items


class Endless:
    """A sampler: a new shuffled order of ``n`` items each epoch, for ever."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        epoch = 0
        while True:
            yield from np.random.default_rng((0, epoch)).permutation(self.n).tolist()
            epoch += 1


# ----------------------------------------------------------------------------- memory
def _rollup(pid: int) -> tuple[int, int]:
    """(Pss_Anon + Pss_File, Rss) of ``pid`` in bytes: its memory without shared memory objects."""
    own = rss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss_Anon", "Pss_File"):
                own += int(rest.split()[0]) * 1024
            elif key == "Rss":
                rss = int(rest.split()[0]) * 1024
    return own, rss


def _is_shm(target: str) -> bool:
    return target.startswith(("/memfd:", "/dev/shm/", "/SYSV"))


def _shm_objects(pid: int, found: dict[tuple[int, int], int]) -> None:
    """Every shared-memory object ``pid`` holds open or maps, (device, inode) -> allocated bytes."""
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            if _is_shm(os.readlink(f"{fds}/{fd}")):
                st = os.stat(f"{fds}/{fd}")
                found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        except OSError:
            pass  # closed meanwhile
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and _is_shm(parts[5]):
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                key = (os.makedev(major, minor), int(parts[4]))
                if key not in found:
                    try:
                        found[key] = os.stat(f"/proc/{pid}/map_files/{parts[0]}").st_blocks * 512
                    except OSError:  # map_files needs privileges: the mapped length instead
                        lo, hi = (int(x, 16) for x in parts[0].split("-"))
                        found[key] = max(found.get(key, 0), hi - lo)


def memory_of(pids: list[int]) -> tuple[int, int]:
    """(own memory + shared memory counted once, summed RSS) of ``pids``, bytes."""
    own = rss = 0
    shm: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            o, r = _rollup(pid)
            _shm_objects(pid, shm)
        except (OSError, ValueError):
            continue  # gone
        own, rss = own + o, rss + r
    return own + sum(shm.values()), rss


class MemorySampler(Sampler):
    """``measure.Sampler`` (CPU of this process and its descendants), plus the peak of
    ``memory_of`` this process and every process it started, sampled on each tick; kills
    ``pids()`` where the machine's available memory falls under ``floor`` bytes."""

    def __init__(self, floor: float) -> None:
        super().__init__(children=True)
        self.floor, self.tripped = floor, False
        self.base_mem = memory_of([os.getpid()])[0]
        self.peak_mem = self.peak_sum_rss = 0

    def _tick(self, scan: bool = False):
        out = super()._tick(scan)
        pids = [os.getpid(), *self._procs]
        mem, rss = memory_of(pids)
        self.peak_mem, self.peak_sum_rss = max(self.peak_mem, mem), max(self.peak_sum_rss, rss)
        if psutil.virtual_memory().available < self.floor and not self.tripped:
            self.tripped = True
            for pid in pids[1:]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return out


# ---------------------------------------------------------------------------- pipelines
class Pipeline:
    """``next()`` gives one delivered item as (videos, bytes touched); ``pids()``; ``close()``;
    ``stats()``: what the loader says of the run (shmloader's ``Loader.stats()``, in part), or {}."""

    def __init__(self, items, pids, close, describe: dict, stats=dict) -> None:
        self.items, self.pids, self._close, self.describe, self.stats = items, pids, close, describe, stats

    def __next__(self) -> tuple[int, int]:
        return next(self.items)

    def close(self) -> None:
        self.items = None
        self._close()


def _touch(flat: np.ndarray) -> None:
    _ = flat[:: max(1, _TOUCH_BYTES // flat.itemsize)].sum()


# What a shmloader row keeps of ``Loader.stats()``: where the workers' time goes, the decoders chosen.
_LOADER_STATS = ("consumer_wait_fraction", "worker_busy_fraction", "samples_per_worker_s", "decord", "pyav",
                 "decoder_fallbacks", "probes", "measured_reads", "chose_decord", "chose_pyav", "decoder_shapes",
                 "frames_decoded", "frames_delivered", "decoded_per_frame")


def shm_pipeline(paths: list[str], args, tokens: bool) -> Pipeline:
    import shmloader
    from shmloader import qwen

    src = qwen.clips(paths, fps=args.fps)
    size = {"batch_tokens": args.batch_tokens} if tokens else {"batch_size": 1}
    # timeout: a worker may take minutes over one long video on a loaded 2-core machine.
    loader = shmloader.Loader(src, workers=args.workers, slots=args.slots, shuffle=True, epochs=None, timeout=600.0,
                              **size)

    def items():
        for batch in loader:
            rows = batch["pixel_values_videos"]
            _touch(rows.reshape(-1))
            yield len(batch["video_grid_thw"]), rows.nbytes

    ring = {"ring_slots": loader._nslots, "ring_mib": loader._nslots * loader._layout.slot_bytes / 2**20}

    def stats() -> dict:
        s = loader.stats()
        return {k: s.get(k) for k in _LOADER_STATS}

    return Pipeline(items(), loader.worker_pids, loader.close, ring, stats)


def torch_pipeline(paths: list[str], args, backend: str) -> Pipeline:
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    vision_process(backend)  # in this process too: forked workers inherit it
    dl = DataLoader(FetchVideos(paths, args.fps, backend), batch_size=1, sampler=Endless(len(paths)),
                    num_workers=args.workers, collate_fn=as_list, multiprocessing_context=mp.get_context(args.torch_start))
    it = iter(dl)  # starts the workers

    def items():
        for (video,) in it:
            _touch(video.reshape(-1).numpy())
            yield 1, video.nbytes

    def pids() -> list[int]:
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    return Pipeline(items(), pids, it._shutdown_workers, {})


def make_pipeline(arm: str, paths: list[str], args) -> Pipeline:
    if arm in OURS:
        return shm_pipeline(paths, args, tokens=arm == "shmloader-tokens")
    return torch_pipeline(paths, args, backend=arm)


# -------------------------------------------------------------------------------- runs
def prepare(args, notes: list[str]) -> dict:
    files, written_s = {}, {}
    for name in args.workloads:
        t0 = time.perf_counter()
        files[name] = workload_files(args, name)
        written_s[name] = time.perf_counter() - t0
    missing = ""
    if "torchcodec" in args.arms and importlib.util.find_spec("torchcodec") is None:
        args.arms = [a for a in args.arms if a != "torchcodec"]
        missing = ("qwen-vl-utils' torchcodec reader was not measured: torchcodec is not installed "
                   "(`make peers` installs torchcodec 0.13).")
    plans, reads = {}, {}
    for name, paths in files.items():
        plans[name] = _describe(name, paths, args, written_s[name], notes)
        if "limit" in args.arms:  # what each plan needs decoded, found once here
            from qwen_limit import plan_reads

            reads[name] = plan_reads(paths, plans[name])
    # The same frames and size as qwen-vl-utils, checked once outside the runs (its decord reader).
    if "kinetics" in files and any(a not in (*OURS, "limit") for a in args.arms):
        video = vision_process("decord").fetch_video({"video": files["kinetics"][0], "fps": args.fps})
        p = plans["kinetics"][0]
        same = tuple(video.shape) == (len(p.indices), 3, *p.size)
        notes.append(f"fetch_video gave {tuple(video.shape)} {video.dtype} for the first Kinetics-style file, the plan "
                     f"{len(p.indices)} frames at {p.size[0]}x{p.size[1]}: {'the same' if same else 'NOT the same'}.")
    if missing:
        notes.append(missing)
    return {"files": files, "plans": plans, "reads": reads}


def _describe(name: str, paths: list[str], args, written_s: float, notes: list[str]) -> list:
    """Every video's plan (``qwen.clips``, as the main process makes it); a note per frame size
    of the workload: the files, their encode and bit rate, Qwen's plan of them."""
    import av

    from shmloader import qwen

    plans = qwen.clips(paths, fps=args.fps).plans()
    shapes: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        with av.open(path) as c:
            s = c.streams.video[0]
            shapes.setdefault(f"{s.codec_context.width}x{s.codec_context.height}:{s.frames}", []).append(i)
    wrote = f"; written in {written_s:.0f} s" if written_s > 1 else " (in the cache)"
    for key, which in shapes.items():
        shape, frames = key.split(":")
        mb = np.median([os.path.getsize(paths[i]) * 8 / (int(frames) / 30) / 1e6 for i in which])
        plan = plans[which[0]]
        notes.append(f"{name}: {len(which)} x {frames} frames ({int(frames) / 30:g} s) {shape} at 30 fps, libx264 "
                     f"preset medium CRF 23, default GOP, {mb:.2f} Mbit/s median{wrote}. Qwen's plan at "
                     f"{args.fps:g} fps: {len(plan.indices)} frames at {plan.size[1]}x{plan.size[0]}, "
                     f"{plan.cost} tokens a video.")
    return plans


def cells(args, ctx: dict) -> list[list]:
    # A block per workload, its arms side by side; the token budget only where several videos fit it.
    return [[(w, a) for a in args.arms if not (w == "long" and a == "shmloader-tokens")]
            for w in args.workloads]


def run(cell, rep: int, args, ctx: dict) -> dict:
    workload, arm = cell
    row: dict = {"workload": workload, "arm": arm, "rep": rep, "error": None}
    with MemorySampler(args.memory_floor * 2**30) as sampler:
        if arm == "limit":
            _limit_run(row, ctx["reads"][workload], args)
        else:
            _pipeline_run(row, ctx["files"][workload], args, sampler)
    if sampler.tripped:
        row["error"] = (f"stopped: less than {args.memory_floor:g} GiB of memory was left available "
                        f"(its processes then held {sampler.peak_mem / 2**30:.1f} GiB)")
    row.update(peak_mem_mib=sampler.peak_mem / 2**20, peak_rss_mib=sampler.peak_sum_rss / 2**20,
               added_mem_mib=(sampler.peak_mem - sampler.base_mem) / 2**20, base_mem_mib=sampler.base_mem / 2**20)
    return row


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _pipeline_run(row: dict, paths: list[str], args, sampler: MemorySampler) -> None:
    """One run of a loader's pipeline into ``row``: a long run delivers ``--long-videos`` videos
    from the start, the others are measured over ``--duration`` s after ``--warmup`` videos."""
    long_run = row["workload"] == "long"
    count = (args.long_videos or len(paths)) if long_run else None
    warmup = 0 if long_run else args.warmup
    t0 = time.perf_counter()
    pipe = None
    try:
        pipe = make_pipeline(row["arm"], paths, args)
        sampler.pids = pipe.pids
        row.update(pipe.describe)
        a = sampler.window_start() if not warmup else None
        videos, nbytes = next(pipe)
        row["first_s"] = time.perf_counter() - t0
        if warmup:
            done = videos
            while done < 1 + warmup:
                done += next(pipe)[0]
            a, videos, nbytes = sampler.window_start(), 0, 0
        while (videos < count) if count else (time.perf_counter() - a.t < args.duration):
            v, b = next(pipe)
            videos, nbytes = videos + v, nbytes + b
        b = sampler.window_end()
        main, workers, other = cpu_shares(a, b)
        seconds = b.t - a.t
        row.update(videos=videos, seconds=seconds, videos_per_s=videos / seconds,
                   cpu_s_per_video=(main + workers) / 100 * seconds / videos, main_cpu_pct=main,
                   workers_cpu_pct=workers, other_cpu_pct=other, delivered_mib_per_video=nbytes / videos / 2**20)
        row["loader_stats"] = pipe.stats()
    except Exception as e:  # noqa: BLE001  one broken row must not lose the others
        row["error"] = _error(e)
    finally:
        if pipe is not None:
            t1 = time.perf_counter()
            pipe.close()
            row["close_s"] = time.perf_counter() - t1


def _limit_run(row: dict, reads: list, args) -> None:
    """The limit (``qwen_limit``) into ``row``: W processes for ``--duration`` s after each has
    read one video (its first, outside the window)."""
    from qwen_limit import physical_limit

    try:
        res = physical_limit(reads, args.workers, args.duration, row["workload"], row["rep"])
    except Exception as e:  # noqa: BLE001
        row["error"] = _error(e)
        return
    row.update(videos=res.clips, seconds=res.seconds, videos_per_s=res.clips_per_s, first_s=res.first_batch_s,
               cpu_s_per_video=res.cpu_ms_per_clip / 1e3, main_cpu_pct=res.main_cpu_pct,
               workers_cpu_pct=res.workers_cpu_pct, other_cpu_pct=res.other_cpu_pct,
               delivered_mib_per_video=float(np.mean([r.nbytes for r in reads])) / 2**20)


METRICS = ("videos_per_s", "first_s", "cpu_s_per_video", "workers_cpu_pct", "main_cpu_pct", "other_cpu_pct",
           "peak_mem_mib", "added_mem_mib", "peak_rss_mib", "delivered_mib_per_video")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["config"]["arms"] = list(args.arms)  # torchcodec left out where it does not import
    doc["summary"] = report.summarize(runs, ("workload", "arm"), METRICS)
    doc["ratios"], doc["targets"] = {}, []
    theirs = [a for a in args.arms if a not in OURS]
    for w in args.workloads:
        for ours in (a for a in args.arms if a in OURS and not (w == "long" and a == "shmloader-tokens")):
            for them in theirs:
                key = f"{w}: {ours} / {them}"
                doc["ratios"][key] = {m: report.ratio(runs, {"workload": w, "arm": ours}, {"workload": w, "arm": them}, m)
                                      for m in ("videos_per_s", "peak_mem_mib")}
                if ours == "shmloader":
                    doc["targets"] += _targets(w, them, doc["ratios"][key])
    for w in args.workloads:
        for arm in OURS:
            ring = next((r for r in runs if r["workload"] == w and r["arm"] == arm and "ring_mib" in r), None)
            if ring:
                doc["notes"].append(f"{w}, {arm}: the ring held {ring['ring_slots']} slots, {ring['ring_mib']:,.0f} MiB "
                                    "reserved when the loader starts (part of its peak memory).")
    errors = [r for r in runs if r.get("error")]
    if errors:
        doc["notes"] += [f"{len(errors)} of {len(runs)} runs failed, left out of the medians: "
                         + "; ".join(sorted({f"{r['workload']}/{r['arm']}: {r['error']}" for r in errors}))]


def _targets(workload: str, them: str, ratios: dict) -> list[dict]:
    """The targets shmloader / ``them`` on ``workload`` answers: the speed targets against
    qwen-vl-utils, the share of the limit, the memory of long videos."""
    speed, mem = ratios["videos_per_s"], ratios["peak_mem_mib"]
    if them == "limit":
        goals = [(f"{workload}, videos/s, shmloader / limit >= {LIMIT_TARGET:g} (issue 68)", speed, LIMIT_TARGET)]
    else:
        goals = [(f"{workload}, videos/s, shmloader / {them} >= {t:g} ({issue})", speed, t) for t, issue in SPEED_TARGETS]
    out = [{"target": name, "ratio": r and r["ratio"], "met": bool(r and r["ratio"] >= t)} for name, r, t in goals]
    if workload == "long" and them != "limit":
        out.append({"target": f"long, peak memory, shmloader / {them} <= {MEMORY_TARGET:g}",
                    "ratio": mem and mem["ratio"], "met": bool(mem and mem["ratio"] <= MEMORY_TARGET)})
    return out


ABOUT = {"shmloader": "shmloader, `batch_size=1`", "shmloader-tokens": "shmloader, `batch_tokens={tokens}`",
         "decord": "qwen-vl-utils `fetch_video`, decord reader, torch DataLoader",
         "torchcodec": "qwen-vl-utils `fetch_video`, torchcodec reader, torch DataLoader",
         "limit": "limit: PyAV alone, the plans' frames only, W processes (no loader)"}


def _about(w: str, c: dict) -> str:
    if w == "kinetics":
        return f"Kinetics-style: {c['kinetics_count']} x {c['kinetics_seconds']:g} s, 340x256"
    if w == "textured12":
        n = c.get("textured12_count", 0)
        return f"Textured 12-s files: {n - n // 3} x 640x360 and {n // 3} x 1280x720, 30 fps"
    return f"Long videos: {c['long_count']} x {c['long_minutes']:g} min, 640x480"


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Qwen-VL video inputs: shmloader against qwen-vl-utils", libs=("torch", "torchcodec"))
    c = doc["config"]
    lines += [(f"W={c['workers']} worker processes, Qwen's frames at {c['fps']:g} fps and its default pixel budget. "
               "shmloader delivers uint8 patch rows in shared memory; qwen-vl-utils float32 frames `[n, 3, H, W]` "
               "(the processor's normalising and patching run later, in the trainer, for both)"
               f"{'; the limit keeps rgb24 frames in its own processes' if 'limit' in c['arms'] else ''}. Medians (min–max) "
               f"over {c['reps']} interleaved repetitions; memory: the peak over the run of the processes' own "
               "memory (PSS without shared memory) plus their shared memory counted once, main process and workers."),
              ""]
    for w in c["workloads"]:
        rows = []
        for arm in c["arms"]:
            s = doc["summary"].get(w, {}).get(arm)
            if s is None:
                continue
            rows.append(f"| {ABOUT[arm].format(tokens=c['batch_tokens'])} | {fmt(s.get('videos_per_s'), 2)} | "
                        f"{fmt(s.get('first_s'), 1)} | {fmt(s.get('cpu_s_per_video'), 2)} | "
                        f"{fmt(s.get('peak_mem_mib'), 0, comma=True)} | {fmt(s.get('added_mem_mib'), 0, comma=True)} | "
                        f"{fmt(s.get('peak_rss_mib'), 0, comma=True)} | {fmt(s.get('delivered_mib_per_video'), 1)} |")
        lines += [f"## {_about(w, c)}", ""]
        lines += table("| pipeline | videos/s | first video s | CPU s/video | peak memory MiB | added MiB | "
                       "summed RSS MiB | delivered MiB/video |", rows)
        lines += [""]
    if doc["ratios"]:
        lines += table("| shmloader / qwen-vl-utils or the limit | videos/s | peak memory |",
                       [f"| {k} | {fmt_ratio(r['videos_per_s'])} | {fmt_ratio(r['peak_mem_mib'])} |"
                        for k, r in doc["ratios"].items()])
        lines += [""]
    lines += report.target_lines(doc["targets"])
    lines += ["", *_per_rep(doc)]
    lines += ["", ("`added`: the peak less the main process's own memory before the run (its imports: torch, "
                   "qwen-vl-utils, shmloader). `summed RSS`: every process's RSS added up, shared pages once per "
                   "process (for comparison). `delivered`: bytes the training process is handed per video "
                   "(the limit: its frames' rgb24 bytes)."), ""]
    return "\n".join(lines + report.tail(doc))


def _per_rep(doc: dict) -> list[str]:
    """Videos/s of every run, by repetition; shmloader's own view of its runs (``Loader.stats()``)."""
    runs, reps = doc["runs"], range(doc["config"]["reps"])
    cells = sorted({(r["workload"], r["arm"]) for r in runs}, key=lambda k: (k[0], ARMS.index(k[1])))

    def value(w: str, a: str, rep: int) -> str:
        r = next((r for r in runs if (r["workload"], r["arm"], r["rep"]) == (w, a, rep)), None)
        return "–" if r is None or r.get("error") or "videos_per_s" not in r else f"{r['videos_per_s']:.2f}"

    lines = ["## Every run", ""]
    lines += table("| workload | pipeline | " + " | ".join(f"rep {k + 1} videos/s" for k in reps) + " |",
                   [f"| {w} | {a} | " + " | ".join(value(w, a, k) for k in reps) + " |" for w, a in cells])
    seen = [r for r in runs if r.get("loader_stats")]
    if seen:
        lines += ["", ("shmloader's `Loader.stats()` at the end of each run: consumer wait, each worker's busy "
                       "share, decodes by decord / PyAV, decoded frames per delivered frame."), ""]
        for r in seen:
            s = r["loader_stats"]
            busy = "/".join(f"{b:.2f}" for b in s.get("worker_busy_fraction") or [])
            dpf = s.get("decoded_per_frame")
            lines.append(f"- {r['workload']}, {r['arm']}, rep {r['rep'] + 1}: wait {s.get('consumer_wait_fraction', 0):.2f}, "
                         f"busy {busy}, decord {s.get('decord')} / pyav {s.get('pyav')}, "
                         f"{'–' if dpf is None else format(dpf, '.2f')} decoded per delivered frame")
    return lines


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    c = doc["config"]
    panels = [(w, "videos_per_s", f"{w}: videos/s") for w in c["workloads"]]
    if "long" in c["workloads"]:
        panels.append(("long", "peak_mem_mib", "long: peak memory, GiB"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (w, metric, title) in zip(axes[0], panels):
        arms = [a for a in c["arms"] if doc["summary"].get(w, {}).get(a, {}).get(metric)]
        scale = 1 / 1024 if metric == "peak_mem_mib" else 1
        spreads = [{k: (v * scale if k != "n" else v) for k, v in doc["summary"][w][a][metric].items()} for a in arms]
        colors = ["#3182bd" if a in OURS else "black" if a == "limit" else "#bdbdbd" for a in arms]
        report.bars(ax, arms, spreads, colors, horizontal=True)
        ax.set_title(title)
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/qwen.py", name="qwen-cpu2", about=__doc__, options=options, cells=cells,
                          run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          label=lambda cell: "/".join(cell), preload=("torch",))

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
