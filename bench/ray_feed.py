"""Clips/s through Ray against the local Loader on the same cores and clips (issue #37).

    flock /tmp/bench.lock python bench/ray_feed.py [--reps 3] [--videos 48] [--epochs 1] [--layout nodes|one]

Cells, each one dataset (or loader) of ``--epochs`` epochs, interleaved over ``--reps``
repetitions after a warm-up epoch each; with ``--epochs 3`` each start-up (Ray Data's executor,
the loader's first batches) is paid once per 3 epochs, as in a training run that asks for its
epochs up front:
``loader``: ``Loader(workers=2)``; ``ray``: ``shmloader.ray.dataset`` iterated with
``iter_batches``, on a local cluster: ``--layout nodes`` (a head with no CPU for tasks, which runs
this driver, and two decode nodes of one CPU each, so both read on 2 cores and every clip moves
between two nodes' object stores, as it moves over the network on a real cluster) or ``--layout
one`` (one Ray node of 2 CPUs with the driver on it: Ray as one box would run it); each one clip per sample and grouped
(``clips_per_video=4, group_clips=True``); each cell also counts its clips per CPU second of the
processes taking part, a figure the machine's other jobs do not move. Then the consumer routes
over one materialized epoch (no decoding): ``iter_batches`` (numpy), ``iter_torch_batches`` and
``to_tf``; and the idle cluster's CPU and memory. Results: bench/results/ray-feed-cpu2.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This checkout's shmloader, here and in the processes Ray starts (they inherit the environment).
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # nodes on 127.0.0.1 (see tests/test_ray.py)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import psutil

import shmloader
from shmloader.samples import make_videos

BATCH = 8
# --layout: (the Ray column's heading, what the cluster start counts)
LAYOUTS = {"nodes": ("Ray, 2 decode nodes x 1 CPU", "head + 2 nodes"), "one": ("Ray, one node of 2 CPUs", "one node")}
NODE = {"object_store_memory": 200 * 1024**2, "include_dashboard": False, "node_ip_address": "127.0.0.1"}


def cluster_procs(cluster) -> list[psutil.Process]:
    """Every process of the cluster (``None``: the one node ``ray.init`` started, this driver's children)."""
    if cluster is None:
        return psutil.Process().children(recursive=True)
    pids = {i.process.pid for n in [cluster.head_node, *cluster.worker_nodes] for v in n.all_processes.values()
            for i in v}
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each process still there."""
    out = {}
    for p in procs:
        try:
            out[p.pid] = sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_since(procs: list[psutil.Process], before: dict[int, float]) -> float:
    now = cpu_s(procs)
    return sum(now[pid] - t for pid, t in before.items() if pid in now)


def idle(cluster, seconds: float = 10.0) -> dict:
    """CPU (cores busy) and memory (RSS, USS in MB) of every process of the cluster, driver aside."""
    procs = cluster_procs(cluster)
    t0 = cpu_s(procs)
    time.sleep(seconds)
    busy = cpu_since(procs, t0)
    mem = [p.memory_full_info() for p in procs if p.is_running()]
    return {"processes": len(procs), "cores_busy": busy / seconds,
            "rss_mb": sum(m.rss for m in mem) / 1e6, "uss_mb": sum(m.uss for m in mem) / 1e6}


def epoch_loader(clips, seed: int, epochs: int = 1) -> tuple[float, float]:
    """Clips/s, and clips per CPU second of this process and its workers (the busy box's other
    jobs do not count there)."""
    with shmloader.Loader(clips, batch_size=BATCH, workers=2, shuffle=True, seed=seed, epochs=epochs) as loader:
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        c, t = cpu_s(procs), time.perf_counter()
        n = sum(len(b["index"]) for b in loader)
        return n / (time.perf_counter() - t), n / cpu_since(procs, c)


def epoch_ray(clips, seed: int, cluster, epochs: int = 1, **options) -> tuple[float, float]:
    """Clips/s, and clips per CPU second of this driver and every process of the cluster."""
    import shmloader.ray as sray

    procs = [psutil.Process(), *cluster_procs(cluster)]
    c = cpu_s(procs)
    ds = sray.dataset(clips, seed=seed, epochs=epochs, resources={"decode": 1}, **options)
    t = time.perf_counter()
    n = sum(len(b["index"]) for b in ds.iter_batches(batch_size=BATCH, batch_format="numpy"))
    return n / (time.perf_counter() - t), n / cpu_since(procs, c)


def clips_mb(clips, n: int) -> float:
    """MB of ``n`` of these clips (uint8, 112x112x3 frames)."""
    return n * clips.spec()["video"][0][0] * 112 * 112 * 3 / 1e6


def routes(clips, **options) -> dict:
    """Rows/s and MB/s of each consumer route over one decoded, materialized epoch."""
    import shmloader.ray as sray

    ds = sray.dataset(clips, seed=99, resources={"decode": 1}, **options).materialize()
    rows = ds.count()
    mb = clips_mb(clips, rows)
    ways = {
        "iter_batches": lambda: ds.iter_batches(batch_size=BATCH, batch_format="numpy"),
        "iter_torch_batches": lambda: ds.iter_torch_batches(batch_size=BATCH),
        "to_tf": lambda: ds.to_tf(feature_columns="video", label_columns="label", batch_size=BATCH),
    }
    out = {}
    for name, make in ways.items():
        times = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in make():
                pass
            times.append(time.perf_counter() - t)
        s = statistics.median(times)
        out[name] = {"rows_per_s": rows / s, "mb_per_s": mb / s}
    return out


def run_ahead(clips, epochs: int, pause_s: float, **options) -> dict:
    """A trainer slower than decoding (``pause_s`` a batch): the most object store memory the
    cluster held while it read ``epochs`` epochs, by ``tasks_in_flight`` (``options`` as given,
    then Ray Data's own scheduling)."""
    import ray

    import shmloader.ray as sray

    total = ray.cluster_resources()["object_store_memory"]
    out = {}
    mine = options.get("tasks_in_flight", "auto")
    for name, tasks in ((f"tasks_in_flight={mine}", mine), ("tasks_in_flight=None", None)):
        ds = sray.dataset(clips, seed=7, epochs=epochs, resources={"decode": 1}, **{**options, "tasks_in_flight": tasks})
        peak = n = 0
        t = time.perf_counter()
        for b in ds.iter_batches(batch_size=BATCH, batch_format="numpy"):
            n += len(b["index"])
            time.sleep(pause_s)
            peak = max(peak, total - ray.available_resources().get("object_store_memory", total))
        out[name] = {"clips": n, "seconds": time.perf_counter() - t, "peak_mb": peak / 1e6,
                     "stream_mb": clips_mb(clips, n), "store_mb": total / 1e6}
    return out


# report.py writes a committed result again from its json: it asks the script for BENCH.markdown.
BENCH = types.SimpleNamespace(markdown=lambda doc: report(doc), plot=lambda doc, folder, name: [])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--videos", type=int, default=48)
    ap.add_argument("--folder", default="/tmp/ray_feed_videos")
    ap.add_argument("--name", default="ray-feed-cpu2")
    ap.add_argument("--epochs", type=int, default=1, help="epochs per cell (one dataset, one loader)")
    ap.add_argument("--num-cpus", type=float, default=None, help="shmloader.ray.dataset(num_cpus=)")
    ap.add_argument("--samples-per-task", type=int, default=None, help="shmloader.ray.dataset(samples_per_task=)")
    ap.add_argument("--tasks-in-flight", default=None, help="shmloader.ray.dataset(tasks_in_flight=): a number, 'auto' or 'none'")
    ap.add_argument("--run-ahead", type=float, default=None, metavar="PAUSE_S",
                    help="then grouped clips for 10 epochs read with this pause a batch: the object store's peak")
    ap.add_argument("--layout", choices=("nodes", "one"), default="nodes",
                    help="nodes: a head + 2 decode nodes of 1 CPU; one: one node of 2 CPUs with the driver")
    args = ap.parse_args()
    # torch before tensorflow: tensorflow 2.21 imported first, then triton (torch's CUDA build),
    # crashes the process (tensorflow#124205); the to_tf route needs tensorflow
    importlib.import_module("torch")
    importlib.import_module("tensorflow")

    options = {k: v for k, v in (("num_cpus", args.num_cpus), ("samples_per_task", args.samples_per_task)) if v is not None}
    if args.tasks_in_flight is not None:
        t = args.tasks_in_flight
        options["tasks_in_flight"] = None if t == "none" else t if t == "auto" else int(t)
    os.makedirs(args.folder, exist_ok=True)
    paths, labels = make_videos(args.folder, count=args.videos, frames=120, size=(256, 340))
    common = {"clip_len": 16, "frame_step": 2, "size": (112, 112)}
    sources = {"one clip": shmloader.VideoClips(paths, labels, clips_per_video=2, **common),
               "grouped x4": shmloader.VideoClips(paths, labels, clips_per_video=4, group_clips=True, **common)}

    import ray
    from ray.cluster_utils import Cluster

    t = time.perf_counter()
    if args.layout == "nodes":
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0, "resources": {"trainer": 1}})
        for _ in range(2):
            cluster.add_node(**NODE, num_cpus=1, resources={"decode": 1})
        cluster.connect()
    else:  # the three nodes' object stores in one
        cluster = None
        ray.init(num_cpus=2, resources={"decode": 2}, object_store_memory=3 * NODE["object_store_memory"],
                 include_dashboard=False, _node_ip_address="127.0.0.1")
    started = time.perf_counter() - t
    results: dict = {"command": " ".join(["python bench/ray_feed.py", *sys.argv[1:]]), "conditions": {"cpus": os.cpu_count(), "batch": BATCH, "videos": args.videos,
                                    "video": "120 frames 340x256 x264 (GOP <= 250)", "clip": "16 x every 2nd, 112x112",
                                    "ray": ray.__version__, "reps": args.reps, "epochs": args.epochs,
                                    "layout": args.layout,
                                    "dataset_options": options},
                     "cluster_start_s": started, "cells": {}}
    try:
        for clips in sources.values():  # warm-up: Ray's task workers start, files in the page cache
            epoch_ray(clips, 0, cluster, **options)
            epoch_loader(clips, 0)
        results["idle_after_warm_up"] = idle(cluster)
        cells = [(s, w) for s in sources for w in ("loader", "ray")]
        got: dict = {f"{s} / {w}": [] for s, w in cells}
        for rep in range(args.reps):
            for s, w in cells if rep % 2 == 0 else cells[::-1]:
                k = f"{s} / {w}"
                got[k].append(epoch_loader(sources[s], rep + 1, args.epochs) if w == "loader" else
                              epoch_ray(sources[s], rep + 1, cluster, args.epochs, **options))
                print(f"{k}: {got[k][-1][0]:.1f} clips/s, {got[k][-1][1]:.1f} clips/CPU-s", flush=True)
        results["cells"] = {k: {"clips_per_s": statistics.median(a for a, _ in v), "all": [a for a, _ in v],
                                "clips_per_cpu_s": statistics.median(b for _, b in v), "all_cpu": [b for _, b in v]}
                            for k, v in got.items()}
        results["load_avg_1m_at_end"] = os.getloadavg()[0]
        results["routes"] = routes(sources["one clip"], **options)
        if args.run_ahead is not None:
            results["run_ahead"] = {"pause_s": args.run_ahead, "epochs": 10,
                                    "runs": run_ahead(sources["grouped x4"], 10, args.run_ahead, **options)}
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    out = os.path.join(HERE, "results", args.name)
    with open(out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(report(results))
    print(report(results))


def report(r: dict) -> str:
    c = r["conditions"]
    heading, started = LAYOUTS[c.get("layout", "nodes")]
    options = c.get("dataset_options", {})
    if "layout" in c and "tasks_in_flight" not in options:  # runs since tasks_in_flight (run 13 on)
        options = {**options, "tasks_in_flight": "auto (the default)"}
    # Runs before the CPU-second counts (runs 1-3) render as they were written.
    per_cpu = any("clips_per_cpu_s" in v for v in r["cells"].values())
    lines = [f"# Ray vs the local Loader, {c['cpus']} cores (bench/ray_feed.py)", "",
             (f"{c['videos']} videos of {c['video']}; clips {c['clip']}; batch {c['batch']}; Ray {c['ray']}; "
              + (f"median of {c['reps']} epochs after a warm-up epoch." if c.get("epochs", 1) == 1 else
               f"each cell one dataset (one loader) of {c['epochs']} epochs, median of {c['reps']} "
               "after a warm-up epoch.")
              + "".join(f" `{k}={v}`." for k, v in options.items())), "",
             f"| clips | Loader(workers=2) clips/s | {heading} | Ray / Loader "
             + ("| per CPU second: Loader | Ray | Ray / Loader |" if per_cpu else "|"),
             "|---|---|---|---|" + ("---|---|---|" if per_cpu else "")]
    for s in ("one clip", "grouped x4"):
        lo, ra = r["cells"][f"{s} / loader"], r["cells"][f"{s} / ray"]
        a, b = lo["clips_per_s"], ra["clips_per_s"]
        pa, pb = lo.get("clips_per_cpu_s"), ra.get("clips_per_cpu_s")
        cpu = (f" {pa:.1f} | {pb:.1f} | {pb / pa:.2f}x |" if pa and pb else " - | - | - |") if per_cpu else ""
        lines.append(f"| {s} | {a:.1f} | {b:.1f} | {b / a:.2f}x |{cpu}")
    if per_cpu:
        lines += ["", ("Per CPU second: clips over the CPU time of every process taking part (the loader and its "
                       "workers; the driver and all of the cluster's processes), which the machine's other jobs "
                       "do not change." + (f" Load average at the end: {r['load_avg_1m_at_end']:.1f}."
                                           if "load_avg_1m_at_end" in r else ""))]
    i = r["idle_after_warm_up"]
    lines += ["", (f"Cluster start ({started}): {r['cluster_start_s']:.1f} s. Idle cluster after the warm-up: "
                   f"{i['processes']} processes, {i['cores_busy']:.2f} cores busy, RSS {i['rss_mb']:.0f} MB, "
                   f"USS {i['uss_mb']:.0f} MB."), "", "| consumer route (materialized epoch) | rows/s | MB/s |", "|---|---|---|"]
    for name, v in r["routes"].items():
        lines.append(f"| {name} | {v['rows_per_s']:.0f} | {v['mb_per_s']:.0f} |")
    if "run_ahead" in r:
        a = r["run_ahead"]
        lines += ["", (f"A trainer slower than decoding: grouped clips, {a['epochs']} epochs, {a['pause_s']} s of pause "
                       "after each batch; the most object store memory the cluster held meanwhile."), "",
                  "| decode tasks | clips/s | peak object store MB | of the stream's MB | of the stores' MB |",
                  "|---|---|---|---|---|"]
        for name, v in a["runs"].items():
            lines.append(f"| {name} | {v['clips'] / v['seconds']:.1f} | {v['peak_mb']:.0f} | {v['stream_mb']:.0f} | "
                         f"{v['store_mb']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
