"""LeRobot datasets (issue 56): samples/s, frames/s and peak memory of ``shmloader.lerobot.dataset``
against LeRobot's own DataLoader over ``LeRobotDataset``, a shuffled epoch of the same dataset.

Runs in a Python with lerobot installed (``make test-lerobot`` builds ``.venv-lerobot-3.12``): it
writes the datasets with LeRobot's own writer and measures LeRobot's loader. (The script is not
named ``lerobot.py``: run as ``python bench/<script>``, ``bench/`` comes first on ``sys.path`` and a
``lerobot.py`` there would be imported in place of the package.)

Two pipelines, ``--workers`` worker processes each, each run one shuffled epoch of every timestep
(seed = the repetition), batches of ``--batch-size`` (lerobot-train's default):

* ``shmloader``: ``Loader(lerobot.dataset(root, delta_timestamps=...), batch_size=B, workers=W,
  shuffle=True)``: every camera's frames uint8 ``[B, (T,) H, W, 3]`` in the shared-memory ring
  (channels first is one ``permute``, on the GPU; not timed);
* ``lerobot``: ``torch.utils.data.DataLoader(LeRobotDataset(repo_id, root=root, delta_timestamps=
  ..., return_uint8=True), batch_size=B, shuffle=True, num_workers=W, prefetch_factor=4,
  persistent_workers=True, multiprocessing_context="spawn")`` as ``lerobot-train`` builds it (its
  defaults but the worker count; no pinned memory without CUDA): uint8 ``[B, (T,) 3, H, W]``
  frames (the training loop divides by 255; not timed here either), LeRobot's default video
  decoder (torchcodec where it loads, else PyAV: the report says which) unless
  ``--lerobot-decoder`` names one.

The consumer reads one value of every 4 KiB of what it is handed (a stand-in for the copy to the
GPU) and drops it. The first batch of every run is checked: each camera's frame at a sample's own
time must show that timestep (the frame code of ``shmloader.samples``), in both pipelines.

Two workloads, each written once into ``--cache`` by LeRobot's writer (``LeRobotDataset.create``,
``add_frame``, ``save_episode``; ``--episodes`` episodes of ``--episode-seconds`` at ``--fps``, all
in one file per camera): two cameras (``observation.images.front``, ``.wrist``), a 6-d state and
action, two tasks.

* ``av1-480x640``: 480x640, LeRobot's default encoder (libsvtav1, GOP 2, CRF 30);
* ``h264-224``: 224x224, ``RGBEncoderConfig(vcodec="h264")`` (LeRobot's GOP 2 and CRF 30).

Frames: a frame code (camera, timestep) over a panning 4x4-block texture with camera noise
(``--noise``; as ``workloads.write_textured``). Each workload is measured plain (one frame per camera) and with a
two-frame history (``delta_timestamps`` ``[-1/fps, 0]`` for every ``observation.*`` key, as
``resolve_delta_timestamps`` gives a policy with ``n_obs_steps=2``).

Per run: samples/s from the first batch to the epoch's end, seconds to the first batch (workers
started), frames/s (samples/s x cameras x frames per camera), CPU s per sample, and memory sampled
every 0.1 s over the whole run as ``bench/qwen.py`` samples it (``peak_mem_mib``: each process's
own PSS plus shared memory counted once, main process and every process it started).

    python bench/lerobot_feed.py        # ~20 minutes on 2 cores after writing the datasets (~4 min once)
    python bench/lerobot_feed.py --episodes 2 --episode-seconds 2 --reps 1 --no-plots \\
        --name lerobot-tiny --out /tmp/lerobot-tiny          # it runs (~2 minutes)
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time

import harness
import numpy as np
import report
from measure import cpu_shares
from qwen import MemorySampler
from report import fmt, fmt_ratio, table

ARMS = ("shmloader", "lerobot")
WORKLOADS = {"av1-480x640": ("libsvtav1", (480, 640)), "h264-224": ("h264", (224, 224))}
HISTORIES = (1, 2)  # frames per camera a sample holds
CAMERAS = ("observation.images.front", "observation.images.wrist")
REPO = "bench/lerobot"
SPEED_TARGET = 4.0  # issue 56: shmloader >= 4x LeRobot's samples/s at equal workers
FRAMES_GOAL = 120.0  # LeRobot's streaming goal: >= 120 frames/s per node
# One value read of every this many bytes of what the consumer is handed: every page touched.
_TOUCH_BYTES = 4096
# The texture's share of a frame, as workloads.write_textured.
_TEXTURE_AMPLITUDE = 0.3
# Noise fields cycled through (drawing a 480x640 field per frame would cost more than encoding it).
_NOISE_FIELDS = 16


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="lerobot-train's default")
    p.add_argument("--arms", type=harness.names(ARMS), default=list(ARMS))
    p.add_argument("--workloads", type=harness.names(tuple(WORKLOADS)), default=list(WORKLOADS))
    p.add_argument("--histories", type=harness.ints, default=list(HISTORIES),
                   help="frames per camera: 1 (plain) and 2 (a two-frame history)")
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--episode-seconds", type=float, default=10.0)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--noise", type=float, default=3.0,
                   help="camera noise, grey levels (std), as workloads.write_textured; a new dataset per value")
    p.add_argument("--stretch", type=int, default=None, help="lerobot.dataset(stretch=) (default: its own)")
    p.add_argument("--lerobot-decoder", default=None, choices=("pyav", "torchcodec"),
                   help="LeRobotDataset(video_backend=) (default: LeRobot's own choice)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="LeRobot's DataLoader (lerobot-train's default)")
    p.add_argument("--torch-start", default="spawn", choices=("fork", "forkserver", "spawn"),
                   help="how LeRobot's DataLoader workers start (lerobot-train's default: spawn)")
    p.add_argument("--memory-floor", type=float, default=1.0,
                   help="GiB: a run that leaves less memory available is stopped")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "lerobot"))


# ----------------------------------------------------------------------------- datasets
class Scene:
    """One camera's frames: the frame code (``camera``, timestep) over a 4x4-block texture that
    pans 1 px a frame right and 1 every other frame down, plus camera noise (``noise`` grey levels):
    inter frames carry motion and residuals, as camera footage does."""

    def __init__(self, camera: int, size: tuple[int, int], steps: int, noise: float) -> None:
        h, w = size
        rng = np.random.default_rng((56, camera))
        margin = steps + 8
        coarse = rng.integers(0, 256, ((h + margin) // 4 + 1, (w + margin) // 4 + 1, 3)).astype(np.float32)
        self.texture = _TEXTURE_AMPLITUDE * (np.kron(coarse, np.ones((4, 4, 1), np.float32)) - 128)
        self.noise = [rng.normal(0.0, noise, (h, w, 3)).astype(np.float32) for _ in range(_NOISE_FIELDS)]
        self.camera, self.size = camera, size

    def frame(self, step: int) -> np.ndarray:
        from shmloader.samples import frame_image

        h, w = self.size
        y, x = step // 2, step
        image = frame_image(self.camera, step, h, w) + self.texture[y : y + h, x : x + w]
        return (image + self.noise[step % _NOISE_FIELDS]).clip(0, 255).astype(np.uint8)


def write_dataset(root: str, codec: str, size: tuple[int, int], args) -> None:
    """A dataset by LeRobot's writer: ``--episodes`` episodes of ``--episode-seconds``, two cameras
    encoded as the frames come (``streaming_encoding``: no PNG files first), a state and action."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    h, w = size
    features = {c: {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]} for c in CAMERAS}
    features["observation.state"] = {"dtype": "float32", "shape": (6,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (6,), "names": None}
    length = round(args.episode_seconds * args.fps)
    steps = args.episodes * length
    scenes = [Scene(j + 1, size, steps, args.noise) for j in range(len(CAMERAS))]
    ds = LeRobotDataset.create(REPO, fps=args.fps, features=features, root=root,
                               rgb_encoder=RGBEncoderConfig(vcodec=codec), streaming_encoding=True)
    rng = np.random.default_rng(0)
    step = 0
    for e in range(args.episodes):
        for _ in range(length):
            frame = {c: s.frame(step) for c, s in zip(CAMERAS, scenes)}
            frame.update({"observation.state": rng.standard_normal(6).astype(np.float32),
                          "action": rng.standard_normal(6).astype(np.float32), "task": f"task {e % 2}"})
            ds.add_frame(frame)
            step += 1
        ds.save_episode()
    ds.finalize()


def dataset_root(workload: str, args) -> str:
    """The workload's dataset in ``--cache``, written where missing (into a temporary folder
    renamed at the end: a stopped write leaves nothing under the name later runs reuse)."""
    codec, size = WORKLOADS[workload]
    length = round(args.episode_seconds * args.fps)
    root = os.path.join(args.cache, f"{workload}-{args.episodes}x{length}-{args.fps}fps-noise{args.noise:g}")
    if not os.path.exists(root):
        print(f"writing {root}", file=sys.stderr)
        tmp = root + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        write_dataset(tmp, codec, size, args)
        os.replace(tmp, root)
    return root


def deltas(history: int, fps: int) -> dict[str, list[float]] | None:
    """``delta_timestamps`` of a policy with ``n_obs_steps=history`` (every ``observation.*`` key),
    as LeRobot's ``resolve_delta_timestamps`` gives them; None for one frame."""
    if history == 1:
        return None
    offsets = [i / fps for i in range(1 - history, 1)]
    return {k: offsets for k in (*CAMERAS, "observation.state")}


# ---------------------------------------------------------------------------- pipelines
def _touch(flat: np.ndarray) -> None:
    _ = flat[:: max(1, _TOUCH_BYTES // flat.itemsize)].sum()


def _codes_wrong(frames: np.ndarray, index: np.ndarray, camera: int) -> int:
    """How many samples of a batch show another frame than their own timestep's: ``frames`` uint8
    ``[B, (T,) H, W, 3]``, the sample's own time the window's last. The codes are read from block
    means (8 x 16 blocks: a quarter of a code cell each): at CRF 30 the texture and the encoder's
    loss flip a bit read from one pixel now and then, in LeRobot's decode and ours alike."""
    from shmloader.samples import read_codes

    *lead, h, w, c = frames.shape
    cropped = frames[..., : h - h % 8, : w - w % 16, :]
    blocks = cropped.reshape(*lead, 8, h // 8, 16, w // 16, c).mean((-4, -2), dtype=np.float32)
    ids, steps = read_codes(blocks)
    if steps.ndim == 2:
        ids, steps = ids[:, -1], steps[:, -1]
    return int(((ids != camera) | (steps != index)).sum())


class Pipeline:
    """``next()`` gives one delivered batch as (samples, bytes touched, frames wrong in a checked
    batch or None); ``pids()``; ``close()``."""

    def __init__(self, items, pids, close) -> None:
        self.items, self.pids, self._close = items, pids, close

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, int, int | None]:
        return next(self.items)

    def close(self) -> None:
        self.items = None
        self._close()


def shm_pipeline(root: str, history: int, rep: int, args) -> Pipeline:
    import shmloader
    from shmloader import lerobot

    kw = {"stretch": args.stretch} if args.stretch else {}
    src = lerobot.dataset(root, delta_timestamps=deltas(history, args.fps), **kw)
    loader = shmloader.Loader(src, batch_size=args.batch_size, workers=args.workers, shuffle=True, seed=rep)

    def items():
        check = True
        for batch in loader:
            nbytes = 0
            for value in batch.values():
                _touch(value.reshape(-1))
                nbytes += value.nbytes
            wrong = None
            if check:
                wrong = sum(_codes_wrong(batch[c], batch["index"], j + 1) for j, c in enumerate(CAMERAS))
                check = False
            yield len(batch["index"]), nbytes, wrong

    return Pipeline(items(), loader.worker_pids, loader.close)


def lerobot_dataset(root: str, history: int, args):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(REPO, root=root, delta_timestamps=deltas(history, args.fps),
                          video_backend=args.lerobot_decoder, return_uint8=True)


def lerobot_pipeline(root: str, history: int, rep: int, args) -> Pipeline:
    import multiprocessing as mp

    import torch
    from torch.utils.data import DataLoader

    ds = lerobot_dataset(root, history, args)
    dl = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=False,
                    prefetch_factor=args.prefetch_factor, persistent_workers=True,
                    generator=torch.Generator().manual_seed(rep), multiprocessing_context=mp.get_context(args.torch_start))
    it = iter(dl)  # starts the workers

    def items():
        check = True
        for batch in it:
            nbytes = 0
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    _touch(value.reshape(-1).numpy())
                    nbytes += value.nbytes
            wrong = None
            if check:  # uint8 [B, (T,) 3, H, W]
                wrong = sum(_codes_wrong(batch[c].movedim(-3, -1).numpy(), batch["index"].numpy(), j + 1)
                            for j, c in enumerate(CAMERAS))
                check = False
            yield len(batch["index"]), nbytes, wrong

    def pids() -> list[int]:
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    return Pipeline(items(), pids, it._shutdown_workers)


# -------------------------------------------------------------------------------- runs
def prepare(args, notes: list[str]) -> dict:
    import av
    import lerobot as lerobot_package

    from shmloader import lerobot

    os.makedirs(args.cache, exist_ok=True)
    roots = {}
    for w in args.workloads:
        t0 = time.perf_counter()
        roots[w] = dataset_root(w, args)
        took = time.perf_counter() - t0
        codec, (h, wd) = WORKLOADS[w]
        videos = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(roots[w], "videos")) for f in fs]
        nbytes = sum(map(os.path.getsize, videos))
        with av.open(min(videos)) as c:
            stream = c.streams.video[0]
            seconds = float(stream.duration * stream.time_base) if stream.duration else float("nan")
        ds = lerobot.dataset(roots[w])
        wrote = f"written in {took:.0f} s" if took > 1 else "in the cache"
        notes.append(f"{w}: {len(ds)} timesteps ({len(ds.episodes)} episodes of {args.episode_seconds:g} s at "
                     f"{args.fps} fps), cameras {wd}x{h} encoded by LeRobot's writer with {codec}, "
                     f"{len(videos)} video files, {nbytes / 2**20:.1f} MiB, {nbytes * 8e-6 / seconds / len(videos):.2f} "
                     f"Mbit/s a file; {wrote}.")
    # Which decoder LeRobot uses, and the same frames from both (checked once, outside the runs).
    caught = _LogCatcher()
    logging.getLogger().addHandler(caught)
    try:
        theirs = lerobot_dataset(roots[args.workloads[0]], 1, args)
    finally:
        logging.getLogger().removeHandler(caught)
    backend = theirs._video_backend
    why = ""
    if caught.lines:  # the innermost error first: which library did not load
        said = [line.strip() for line in caught.lines[-1].splitlines() if line.strip()]
        cause = next((line for line in said if "cannot open shared object" in line), said[0])
        why = f" ({said[-1]} {cause})"
    notes.append(f"LeRobot {lerobot_package.__version__} decoded with {backend}"
                 f"{' (--lerobot-decoder)' if args.lerobot_decoder else ', its own default'}{why}.")
    ours = lerobot.dataset(roots[args.workloads[0]])
    picks = np.linspace(0, len(ours) - 1, 5).round().astype(int).tolist()
    mine = ours.read(picks)
    diffs = []
    for j, i in enumerate(picks):
        item = theirs[i]
        for c in CAMERAS:
            ref = item[c].movedim(-3, -1).numpy().astype(np.float64)
            diffs.append(float(np.abs(mine[c][j].astype(np.float64) - ref).mean()))
    notes.append(f"{args.workloads[0]}: samples {picks} from both pipelines: mean |diff| of the frames, grey "
                 f"levels, at most {max(diffs):.3f} (0 = the same pixels).")
    return {"roots": roots, "backend": backend}


class _LogCatcher(logging.Handler):
    """The warnings LeRobot logs while choosing its decoder (why torchcodec did not load)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())


def cells(args, ctx: dict) -> list[list]:
    # A block per workload and history, its arms side by side.
    return [[(w, h, a) for a in args.arms] for w in args.workloads for h in args.histories]


def label(cell) -> str:
    w, h, a = cell
    return f"{w}/{'history' if h > 1 else 'plain'}/{a}"


def run(cell, rep: int, args, ctx: dict) -> dict:
    workload, history, arm = cell
    root = ctx["roots"][workload]
    row: dict = {"workload": workload, "history": history, "arm": arm, "rep": rep, "error": None}
    with MemorySampler(args.memory_floor * 2**30) as sampler:
        t0 = time.perf_counter()
        pipe = None
        try:
            make = shm_pipeline if arm == "shmloader" else lerobot_pipeline
            pipe = make(root, history, rep, args)
            sampler.pids = pipe.pids
            first, nbytes, wrong = next(pipe)
            row["first_s"] = time.perf_counter() - t0
            row["first_batch_wrong"] = wrong
            a = sampler.window_start()
            samples = 0
            for n, b, _ in pipe:
                samples, nbytes = samples + n, nbytes + b
            b = sampler.window_end()
            main, workers, other = cpu_shares(a, b)
            seconds = b.t - a.t
            total = first + samples
            rate = samples / seconds if samples else float("nan")
            row.update(samples=total, seconds=seconds, epoch_s=time.perf_counter() - t0, samples_per_s=rate,
                       frames_per_s=rate * len(CAMERAS) * history,
                       cpu_ms_per_sample=(main + workers) / 100 * seconds / max(samples, 1) * 1000,
                       main_cpu_pct=main, workers_cpu_pct=workers, other_cpu_pct=other,
                       delivered_kib_per_sample=nbytes / total / 1024)
        except Exception as e:  # noqa: BLE001  one broken row must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        finally:
            if pipe is not None:
                t1 = time.perf_counter()
                try:
                    pipe.close()
                except Exception as e:  # noqa: BLE001  after the epoch: said, the row kept
                    row["close_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                row["close_s"] = time.perf_counter() - t1
    if sampler.tripped:
        row["error"] = (f"stopped: less than {args.memory_floor:g} GiB of memory was left available "
                        f"(its processes then held {sampler.peak_mem / 2**30:.1f} GiB)")
    row.update(peak_mem_mib=sampler.peak_mem / 2**20, peak_rss_mib=sampler.peak_sum_rss / 2**20,
               added_mem_mib=(sampler.peak_mem - sampler.base_mem) / 2**20, base_mem_mib=sampler.base_mem / 2**20)
    return row


METRICS = ("samples_per_s", "frames_per_s", "first_s", "epoch_s", "cpu_ms_per_sample", "workers_cpu_pct",
           "main_cpu_pct", "other_cpu_pct", "peak_mem_mib", "added_mem_mib", "peak_rss_mib", "delivered_kib_per_sample")


def _case(workload: str, history: int) -> str:
    return f"{workload}, {'two-frame history' if history > 1 else 'plain'}"


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["config"]["lerobot_backend"] = ctx.get("backend")
    keyed = [dict(r, case=_case(r["workload"], r["history"])) for r in runs]
    doc["summary"] = report.summarize(keyed, ("case", "arm"), METRICS)
    doc["ratios"], doc["targets"] = {}, []
    for w in args.workloads:
        for h in args.histories:
            case = _case(w, h)
            if "lerobot" in args.arms and "shmloader" in args.arms:
                ours, theirs = {"workload": w, "history": h, "arm": "shmloader"}, {"workload": w, "history": h, "arm": "lerobot"}
                r = {m: report.ratio(runs, ours, theirs, m) for m in ("samples_per_s", "peak_mem_mib")}
                doc["ratios"][case] = r
                speed = r["samples_per_s"]
                doc["targets"].append({"target": f"{case}: samples/s, shmloader / LeRobot >= {SPEED_TARGET:g}",
                                       "ratio": speed and speed["ratio"],
                                       "met": bool(speed and speed["ratio"] >= SPEED_TARGET)})
            for arm in args.arms:
                s = doc["summary"].get(case, {}).get(arm, {}).get("frames_per_s")
                if arm == "shmloader" and s:
                    doc["targets"].append({"target": f"{case}: shmloader frames/s >= {FRAMES_GOAL:g} (LeRobot's goal per node)",
                                           "ratio": s["median"] / FRAMES_GOAL, "met": s["median"] >= FRAMES_GOAL})
    wrong = [r for r in runs if r.get("first_batch_wrong")]
    if wrong:
        doc["notes"].append(f"{len(wrong)} runs delivered a first batch with frames of other timesteps: "
                            + "; ".join(sorted({label((r['workload'], r['history'], r['arm'])) for r in wrong})))
    else:
        doc["notes"].append("Every run's first batch showed each camera's frame of each sample's own timestep.")
    closing = [r for r in runs if r.get("close_error")]
    if closing:
        doc["notes"].append(f"{len(closing)} runs raised while their pipeline closed, after the epoch (the row "
                            "kept): " + "; ".join(sorted({f"{label((r['workload'], r['history'], r['arm']))}: "
                                                          f"{r['close_error']}" for r in closing})))
    errors = [r for r in runs if r.get("error")]
    if errors:
        doc["notes"].append(f"{len(errors)} of {len(runs)} runs failed, left out of the medians: "
                            + "; ".join(sorted({f"{label((r['workload'], r['history'], r['arm']))}: {r['error']}"
                                                for r in errors})))


def markdown(doc: dict) -> str:
    lines = report.header(doc, "LeRobot datasets: shmloader against LeRobot's DataLoader", libs=("torch", "torchcodec"))
    c = doc["config"]
    lines += [(f"W={c['workers']} worker processes each, batches of {c['batch_size']}, one shuffled epoch a run; LeRobot "
               f"decoding with {c.get('lerobot_backend')}. Medians (min–max) over {c['reps']} interleaved repetitions. "
               "samples/s from the first batch to the epoch's end; frames/s = samples/s x 2 cameras x frames per "
               "camera; memory: the peak over the run of the processes' own memory (PSS without shared memory) "
               "plus their shared memory counted once, main process and workers."), ""]
    rows = []
    for case, arms in doc["summary"].items():
        for arm in c["arms"]:
            s = arms.get(arm)
            if s is None:
                continue
            rows.append(f"| {case} | {arm} | {fmt(s.get('samples_per_s'), 1)} | {fmt(s.get('frames_per_s'), 0)} | "
                        f"{fmt(s.get('first_s'), 1)} | {fmt(s.get('cpu_ms_per_sample'), 1)} | "
                        f"{fmt(s.get('peak_mem_mib'), 0, comma=True)} | {fmt(s.get('added_mem_mib'), 0, comma=True)} | "
                        f"{fmt(s.get('peak_rss_mib'), 0, comma=True)} |")
    lines += table("| workload | pipeline | samples/s | frames/s | first batch s | CPU ms/sample | peak memory MiB | "
                   "added MiB | summed RSS MiB |", rows)
    lines += [""]
    if doc["ratios"]:
        lines += table("| shmloader / LeRobot | samples/s | peak memory |",
                       [f"| {k} | {fmt_ratio(r['samples_per_s'])} | {fmt_ratio(r['peak_mem_mib'])} |"
                        for k, r in doc["ratios"].items()])
        lines += [""]
    lines += report.target_lines(doc["targets"])
    lines += ["", ("frames/s per node: this machine is the node (its usable cores in the header). `added`: the peak "
                   "less the main process's own memory before the run (torch, lerobot and shmloader imported). "
                   "`summed RSS`: every process's RSS added up, shared pages once per process (for comparison)."), ""]
    return "\n".join(lines + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    c = doc["config"]
    cases = list(doc["summary"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.6 + 0.7 * len(cases) * len(c["arms"])))
    for ax, (metric, title, scale) in zip(axes, (("samples_per_s", "samples/s", 1), ("peak_mem_mib", "peak memory, GiB", 1 / 1024))):
        names, spreads, colors = [], [], []
        for case in cases:
            for arm in c["arms"]:
                s = doc["summary"][case].get(arm, {}).get(metric)
                if s:
                    names.append(f"{case}: {arm}")
                    spreads.append({k: (v * scale if k != "n" else v) for k, v in s.items()})
                    colors.append("#3182bd" if arm == "shmloader" else "#bdbdbd")
        report.bars(ax, names, spreads, colors, horizontal=True)
        ax.set_title(title)
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/lerobot_feed.py", name="lerobot-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          label=label, preload=("torch",))

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
