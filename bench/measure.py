"""Measuring one run: throughput at the consumer, CPU and memory sampled with psutil.

CPU is reported as ``top`` shows it: percent of one core, so two busy cores read 200 %.
"Main" is the process that runs the consumer (and, for thread-based loaders, the decoding);
"workers" are the loader's processes (``Loader.worker_pids()``, torch's worker processes, the
decode-only processes of the physical limit).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import psutil

# Children of ours that belong to no loader: multiprocessing's forkserver and resource tracker.
# Their own CPU and RSS stay out of every run (their children, torch's workers, count).
IGNORED_PIDS: set[int] = set()

# Sampling period: often enough to catch RSS peaks of short runs, rare enough to cost little
# (one cpu_times + memory_info per process per tick; the sampler's own CPU is subtracted).
_TICK_S = 0.1
# Looking for new descendants scans /proc (~1.3 ms holding the GIL, which delays the consumer
# being measured): every few ticks only. Known worker pids are read on every tick.
_SCAN_EVERY = 5


@dataclass
class _Snapshot:
    t: float
    main_cpu: float  # this process, less the sampler thread's own CPU
    worker_cpu: dict[int, float]  # CPU seconds since the window started, per worker pid
    system_busy: float  # all cores, every process: cumulative busy seconds


def system_busy() -> float:
    t = psutil.cpu_times()
    # guest time is already part of user time; iowait is idle.
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


class Sampler:
    """A thread that samples CPU times and RSS of this process and of ``pids()``.

    ``window_start()`` / ``window_end()`` bracket the steady-state part of a run; CPU is the
    difference of cumulative CPU times over it (per worker pid, first and last time seen, so a
    worker that appears or dies inside the window still counts). RSS peak covers the whole run.
    """

    def __init__(self, pids: Callable[[], list[int]] = lambda: [],
                 children: bool = False) -> None:
        self.pids = pids
        self.children = children  # also watch every descendant of this process
        self._me = psutil.Process()
        self._procs: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._windowed = False
        self.peak_rss = 0
        self.peak_main_rss = 0
        # This process's RSS before the run: one long benchmark process keeps what earlier runs
        # grew (allocator caches, TF state), so the run's own cost is the peak above this.
        self.base_rss = self._me.memory_info().rss
        self._own_cpu = 0.0  # the sampler thread's CPU time: not the loader's
        self._ticks = 0
        self._descendants: set[int] = set()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-sampler")

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _worker_pids(self, scan: bool) -> set[int]:
        try:
            pids = set(self.pids())
        except Exception:
            pids = set()
        if self.children:
            if scan or self._ticks % _SCAN_EVERY == 0:
                self._descendants = {c.pid for c in self._me.children(recursive=True)}
            self._ticks += 1
            pids |= self._descendants
        return pids - IGNORED_PIDS

    def _tick(self, scan: bool = False) -> tuple[float, dict[int, float]]:
        main = self._me.cpu_times()
        main_cpu = main.user + main.system
        rss = main_rss = self._me.memory_info().rss
        cpu = {}
        for pid in self._worker_pids(scan):
            p = self._procs.get(pid)
            try:
                if p is None:
                    p = self._procs[pid] = psutil.Process(pid)
                t = p.cpu_times()
                cpu[pid] = t.user + t.system
                rss += p.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_main_rss = max(self.peak_main_rss, main_rss)
        return main_cpu, cpu

    def _record(self, cpu: dict[int, float]) -> None:
        with self._lock:
            if self._windowed:
                for pid, c in cpu.items():
                    self._first.setdefault(pid, c)
                    self._last[pid] = c

    def _run(self) -> None:
        while not self._stop.wait(_TICK_S):
            t0 = time.thread_time()
            _, cpu = self._tick()
            self._record(cpu)
            with self._lock:
                self._own_cpu += time.thread_time() - t0

    def snapshot(self) -> _Snapshot:
        main_cpu, cpu = self._tick(scan=True)
        self._record(cpu)
        with self._lock:
            worker = {pid: self._last[pid] - self._first[pid] for pid in self._last}
            main_cpu -= self._own_cpu
        return _Snapshot(time.perf_counter(), main_cpu, worker, system_busy())

    def window_start(self) -> _Snapshot:
        with self._lock:
            self._windowed = True
            self._first.clear()
            self._last.clear()
        return self.snapshot()

    def window_end(self) -> _Snapshot:
        snap = self.snapshot()
        with self._lock:
            self._windowed = False
        return snap


@dataclass
class Result:
    loader: str
    workload: str
    workers: str  # "1", "2", ... or "auto"
    rep: int
    clips: int = 0
    seconds: float = 0.0
    clips_per_s: float = 0.0
    frames_per_s: float = 0.0
    gb_per_s: float = 0.0
    main_cpu_pct: float = 0.0
    workers_cpu_pct: float = 0.0
    main_cpu_s_per_gb: float = 0.0
    cpu_ms_per_clip: float = 0.0  # main + workers: what a clip costs, whatever else runs
    other_cpu_pct: float = 0.0  # busy CPU of everything else on the machine: noise
    peak_rss_mib: float = 0.0
    peak_main_rss_mib: float = 0.0
    added_rss_mib: float = 0.0  # peak (main + children) less main's RSS before the run
    first_batch_s: float = 0.0
    frames_bad: float = float("nan")  # clips of the first batch that are not the frames asked for
    frame_mad: float = float("nan")  # largest mean |difference| from decord's frames, grey levels
    wall_s: float = 0.0  # the whole run: start-up, warm-up, measuring, closing
    attempts: int = 1  # runs made; more than one when other load spoilt the earlier ones
    error: str | None = None
    extra: dict = field(default_factory=dict)


def cpu_shares(a: _Snapshot, b: _Snapshot) -> tuple[float, float, float]:
    """CPU % (100 = one core) over the window a..b: main process, workers, everything else."""
    dt = b.t - a.t
    main = 100 * max(0.0, b.main_cpu - a.main_cpu) / dt  # less the sampler's CPU: can dip below zero
    workers = 100 * sum(b.worker_cpu.values()) / dt
    return main, workers, max(0.0, 100 * (b.system_busy - a.system_busy) / dt - main - workers)


def window_result(res: Result, a: _Snapshot, b: _Snapshot, clips: int, clip_len: int,
                  clip_bytes: int, sampler: Sampler) -> Result:
    dt = b.t - a.t
    gb = clips * clip_bytes / 1e9
    main = max(0.0, b.main_cpu - a.main_cpu)
    res.clips, res.seconds = clips, dt
    res.clips_per_s = clips / dt
    res.frames_per_s = clips * clip_len / dt
    res.gb_per_s = gb / dt
    res.main_cpu_pct, res.workers_cpu_pct, res.other_cpu_pct = cpu_shares(a, b)
    res.main_cpu_s_per_gb = main / gb if gb else float("nan")
    res.cpu_ms_per_clip = 1e3 * (main + sum(b.worker_cpu.values())) / clips if clips else float("nan")
    res.peak_rss_mib = sampler.peak_rss / 2**20
    res.peak_main_rss_mib = sampler.peak_main_rss / 2**20
    res.added_rss_mib = (sampler.peak_rss - sampler.base_rss) / 2**20
    return res


def release_memory() -> None:
    """Give freed heap back to the OS between runs, so one run's RSS does not carry the last's."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def pin_processes(pids: list[int]) -> None:
    """Pin process ``pids[i]`` (every thread it has now) to core ``i``, round robin.

    Threads a process starts later inherit the mask of the thread that starts them, so a
    worker's decoder threads stay on its core. A diagnostic (``--pin``), not a loader feature.
    """
    cores = sorted(os.sched_getaffinity(0))
    for i, pid in enumerate(pids):
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), {cores[i % len(cores)]})
        except (FileNotFoundError, ProcessLookupError):
            pass  # gone already


def touch(batch) -> int:
    """What the consumer does with a batch: read one byte of every clip and the labels.

    A stand-in for handing the batch to a training step; the same small cost for every loader.
    Returns the number of clips in the batch.
    """
    video = batch["video"]
    firsts = video[:, 0, 0, 0, 0]
    _ = (firsts.numpy() if hasattr(firsts, "numpy") else np.asarray(firsts)).sum()  # waits for a jax.Array
    _ = batch["label"][0]
    return int(video.shape[0])


def run_pipeline(make, res: Result, *, clip_len: int, clip_bytes: int, duration: float,
                 warmup: int, min_batches: int = 1, check=None, clips_per_sample: int = 1) -> Result:
    """Build a pipeline with ``make()``, time its first batch, then measure ``duration`` s.

    A sample holds ``clips_per_sample`` clips. Where the pipeline says how many batches an epoch
    has (``Pipeline.epoch_batches``) the window holds whole epochs: grouped decode delivers in
    bursts (a shuffle window's batches complete together), and whole epochs from the same phase
    measure the steady rate. A pipeline that runs out (evaluation) ends the window early.
    ``check(video, labels) -> (bad clips, largest difference)`` looks at the first batch once
    the pipeline is closed (outside every measurement).

    Holds no reference to the tf.data iterator besides the pipeline's own, so that
    ``close`` can drop it (see NOTE [ Closing a from_generator pipeline ] in ``loaders``).
    """
    with Sampler(children=True) as sampler:
        t0 = time.perf_counter()
        pipe = make()
        sampler.pids = pipe.pids
        period = max(1, pipe.epoch_batches)
        try:
            first = next(pipe)
            touch(first)
            res.first_batch_s = time.perf_counter() - t0
            first = {k: np.array(v) for k, v in first.items()} if check else None
            for _ in range(warmup):
                touch(next(pipe))
            a = sampler.window_start()
            samples = batches = 0
            while batches < max(min_batches, period) or batches % period or time.perf_counter() - a.t < duration:
                try:
                    samples += touch(next(pipe))
                except StopIteration:
                    break
                batches += 1
            b = sampler.window_end()
            window_result(res, a, b, samples * clips_per_sample, clip_len, clip_bytes, sampler)
            res.extra.update(batches=batches, samples=samples, epoch_batches=period)
            if pipe.stats is not None:
                s = pipe.stats()
                res.extra.update(copied_batches=s.get("copied", 0), worker_replies=s.get("tasks"),
                                 decoded_samples=s.get("decoded"), decoded_per_frame=s.get("decoded_per_frame"),
                                 consumer_wait_s=round(s.get("consumer_wait_s", 0.0), 3))
        finally:
            t1 = time.perf_counter()
            pipe.close()
            res.extra["close_s"] = round(time.perf_counter() - t1, 3)
    if pipe.disk is not None:
        res.extra["disk"] = {k: v for k, v in pipe.disk.items() if k != "files"}
    if check is not None:
        res.frames_bad, res.frame_mad = check(first["video"], first["label"])
    return res


def row_of(res: Result, measure: Callable[[], Any], **columns: Any) -> dict:
    """The report's row of one measurement: ``measure()`` fills ``res`` (and may return a dict of
    columns that replace ``columns``); an error it raises is kept in the row, since one broken row
    must not lose the others' results."""
    try:
        columns.update(measure() or {})
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {e}"
    return {**asdict(res), **columns}


def run_timed(step: Callable[[], int], duration: float, res: Result) -> Result:
    """``step()`` (returning the clips it read) again and again for ``duration`` s in this
    process, no loader: clips/s, CPU ms per clip (this process's, every thread) and the other
    programs' load over that time."""
    busy0, n, cpu0, t0 = system_busy(), 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        n += step()
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    res.clips, res.seconds, res.clips_per_s = n, dt, n / dt
    res.cpu_ms_per_clip = 1000 * cpu / n
    res.main_cpu_pct = 100 * cpu / dt
    res.other_cpu_pct = max(0.0, 100 * (system_busy() - busy0 - cpu) / dt)
    return res


def reader_step(reader, videos: int, clips_per_video: int, clips_per_sample: int = 1) -> Callable[[], int]:
    """A ``step`` for ``run_timed``: ``reader`` (``VideoClips.reader()``, the loader's own reader)
    reads one sample at a time in the loader's sample order (``workloads.sample_keys``). Every
    video is read once first, outside the time: probed and opened, as a running loader has them."""
    from workloads import sample_keys

    for v in range(videos):
        reader.read([v * clips_per_video], epoch=10**6)
    keys = sample_keys(videos * clips_per_video)

    def step() -> int:
        epoch, sample = next(keys)
        reader.read([sample], epoch=epoch)
        return clips_per_sample

    return step


def machine_info() -> dict:
    import importlib.metadata as md

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {
        "cpu_model": cpu,
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "decord": version("decord2") or version("decord"),
        "tensorflow": version("tensorflow-cpu") or version("tensorflow"),
        "torch": version("torch"),
        "jax": version("jax"),
        "torchcodec": version("torchcodec"),
        "grain": version("grain"),
        "spdl": version("spdl_io") or version("spdl"),
        "shmloader": version("shmloader"),
        "psutil": psutil.__version__,
    }
