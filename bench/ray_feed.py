"""Clips/s through Ray against the local Loader on the same cores and clips (issue #37).

    flock /tmp/bench.lock python bench/ray_feed.py [--reps 3] [--videos 48] [--epochs 1] [--layout nodes|one]

Cells, each one dataset (or loader) of ``--epochs`` epochs, interleaved over ``--reps``
repetitions (``harness.Benchmark``) after a warm-up epoch each; with ``--epochs 3`` each
start-up (Ray Data's executor, the loader's first batches) is paid once per 3 epochs, as in a
training run that asks for its epochs up front:
``loader``: ``Loader(workers=2)``; ``ray``: ``shmloader.ray.dataset`` iterated with
``iter_batches``, on a local cluster: ``--layout nodes`` (a head with no CPU for tasks, which runs
this driver, and two decode nodes of one CPU each, so both read on 2 cores and every clip moves
between two nodes' object stores, as it moves over the network on a real cluster) or ``--layout
one`` (one Ray node of 2 CPUs with the driver on it: Ray as one box would run it); each one clip per sample and grouped
(``clips_per_video=4, group_clips=True``); each cell also counts its clips per CPU second of the
processes taking part, a figure the machine's other jobs do not move. Then the consumer routes
over one materialized epoch (no decoding): ``iter_batches`` (numpy), ``iter_torch_batches`` and
``to_tf``; and the idle cluster's CPU and memory. Results: bench/results/ray-feed-cpu2.{json,md}
(``--out``, ``--name``).
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This checkout's shmloader, here and in the processes Ray starts (they inherit the environment).
sys.path[:0] = [ROOT, HERE]
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # nodes on 127.0.0.1 (see tests/test_ray.py)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import harness
import psutil
import report

import shmloader
from shmloader.engine.stats import cpu_seconds
from shmloader.samples import make_videos

BATCH = 8
# --layout: (the Ray column's heading, what the cluster start counts)
LAYOUTS = {"nodes": ("Ray, 2 decode nodes x 1 CPU", "head + 2 nodes"), "one": ("Ray, one node of 2 CPUs", "one node")}
NODE = {"object_store_memory": 200 * 1024**2, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
SOURCES = ("one clip", "grouped x4")
READERS = ("loader", "ray")


def cluster_pids(cluster) -> list[int]:
    """Every process of the cluster (``None``: the one node ``ray.init`` started, this driver's children)."""
    if cluster is None:
        return [p.pid for p in psutil.Process().children(recursive=True)]
    out = set()
    for pid in {i.process.pid for n in [cluster.head_node, *cluster.worker_nodes] for v in n.all_processes.values()
                for i in v}:
        try:
            out |= {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return sorted(out)


def idle(cluster, seconds: float = 10.0) -> dict:
    """CPU (cores busy) and memory (RSS, USS in MB) of every process of the cluster, driver aside."""
    pids = cluster_pids(cluster)
    t0 = cpu_seconds(pids)
    time.sleep(seconds)
    busy = cpu_seconds(pids) - t0
    mem = []
    for pid in pids:
        try:
            mem.append(psutil.Process(pid).memory_full_info())
        except psutil.NoSuchProcess:
            pass
    return {"processes": len(pids), "cores_busy": busy / seconds,
            "rss_mb": sum(m.rss for m in mem) / 1e6, "uss_mb": sum(m.uss for m in mem) / 1e6}


def epoch_loader(clips, seed: int, epochs: int = 1) -> tuple[float, float]:
    """Clips/s, and clips per CPU second of this process and its workers (the busy box's other
    jobs do not count there)."""
    with shmloader.Loader(clips, batch_size=BATCH, workers=2, shuffle=True, seed=seed, epochs=epochs) as loader:
        pids = [os.getpid(), *loader.worker_pids()]
        c, t = cpu_seconds(pids), time.perf_counter()
        n = sum(len(b["index"]) for b in loader)
        return n / (time.perf_counter() - t), n / (cpu_seconds(pids) - c)


def epoch_ray(clips, seed: int, cluster, epochs: int = 1, **options) -> tuple[float, float]:
    """Clips/s, and clips per CPU second of this driver and every process of the cluster."""
    import shmloader.ray as sray

    pids = [os.getpid(), *cluster_pids(cluster)]
    c = cpu_seconds(pids)
    ds = sray.dataset(clips, seed=seed, epochs=epochs, shuffle=True, resources={"decode": 1}, **options)
    t = time.perf_counter()
    n = sum(len(b["index"]) for b in ds.iter_batches(batch_size=BATCH, batch_format="numpy"))
    return n / (time.perf_counter() - t), n / (cpu_seconds(pids) - c)


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
    for name, tasks in ((f"tasks_in_flight={mine}", mine), ('tasks_in_flight="ray"', "ray")):
        ds = sray.dataset(clips, seed=7, epochs=epochs, shuffle=True, resources={"decode": 1},
                          **{**options, "tasks_in_flight": tasks})
        peak = n = 0
        t = time.perf_counter()
        for b in ds.iter_batches(batch_size=BATCH, batch_format="numpy"):
            n += len(b["index"])
            time.sleep(pause_s)
            peak = max(peak, total - ray.available_resources().get("object_store_memory", total))
        out[name] = {"clips": n, "seconds": time.perf_counter() - t, "peak_mb": peak / 1e6,
                     "stream_mb": clips_mb(clips, n), "store_mb": total / 1e6}
    return out


def options(p) -> None:
    p.add_argument("--videos", type=int, default=48)
    p.add_argument("--folder", default="/tmp/ray_feed_videos")
    p.add_argument("--epochs", type=int, default=1, help="epochs per cell (one dataset, one loader)")
    p.add_argument("--num-cpus", type=float, default=None, help="shmloader.ray.dataset(num_cpus=)")
    p.add_argument("--samples-per-task", type=int, default=None, help="shmloader.ray.dataset(samples_per_task=)")
    p.add_argument("--tasks-in-flight", default=None,
                   help="shmloader.ray.dataset(tasks_in_flight=): a number, 'auto' or 'ray'")
    p.add_argument("--run-ahead", type=float, default=None, metavar="PAUSE_S",
                   help="then grouped clips for 10 epochs read with this pause a batch: the object store's peak")
    p.add_argument("--layout", choices=("nodes", "one"), default="nodes",
                   help="nodes: a head + 2 decode nodes of 1 CPU; one: one node of 2 CPUs with the driver")


def prepare(args, notes: list[str]) -> dict:
    """The videos, the two sources, the cluster, a warm-up epoch of each cell, the idle cluster."""
    # torch before tensorflow (see harness.Benchmark.preload), both before Ray starts; the to_tf
    # route needs tensorflow.
    importlib.import_module("torch")
    importlib.import_module("tensorflow")
    import ray
    from ray.cluster_utils import Cluster

    options = {k: v for k, v in (("num_cpus", args.num_cpus), ("samples_per_task", args.samples_per_task))
               if v is not None}
    if args.tasks_in_flight is not None:
        t = args.tasks_in_flight
        options["tasks_in_flight"] = t if t in ("auto", "ray") else int(t)
    os.makedirs(args.folder, exist_ok=True)
    paths, labels = make_videos(args.folder, count=args.videos, frames=120, size=(256, 340))
    common = {"clip_len": 16, "frame_step": 2, "size": (112, 112)}
    ctx: dict = {"options": options, "sources": {
        "one clip": shmloader.VideoClips(paths, labels, clips_per_video=2, **common),
        "grouped x4": shmloader.VideoClips(paths, labels, clips_per_video=4, group_clips=True, **common)}}
    t = time.perf_counter()
    if args.layout == "nodes":
        ctx["cluster"] = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0, "resources": {"trainer": 1}})
        for _ in range(2):
            ctx["cluster"].add_node(**NODE, num_cpus=1, resources={"decode": 1})
        ctx["cluster"].connect()
    else:  # the three nodes' object stores in one
        ctx["cluster"] = None
        ray.init(num_cpus=2, resources={"decode": 2}, object_store_memory=3 * NODE["object_store_memory"],
                 include_dashboard=False, _node_ip_address="127.0.0.1")
    ctx["started"] = time.perf_counter() - t
    for clips in ctx["sources"].values():  # warm-up: Ray's task workers start, files in the page cache
        epoch_ray(clips, 0, ctx["cluster"], **options)
        epoch_loader(clips, 0)
    ctx["idle"] = idle(ctx["cluster"])
    return ctx


def run(cell: tuple[str, str], rep: int, args, ctx: dict) -> dict:
    source, reader = cell
    clips = ctx["sources"][source]
    rate, per_cpu = (epoch_loader(clips, rep + 1, args.epochs) if reader == "loader" else
                     epoch_ray(clips, rep + 1, ctx["cluster"], args.epochs, **ctx["options"]))
    return {"cell": f"{source} / {reader}", "rep": rep, "clips_per_s": rate, "clips_per_cpu_s": per_cpu}


def after(args, ctx: dict) -> dict:
    """Once after the cells: the load, the consumer routes and, with --run-ahead, the object store's peak."""
    out = {"load_avg_1m_at_end": os.getloadavg()[0], "routes": routes(ctx["sources"]["one clip"], **ctx["options"])}
    if args.run_ahead is not None:
        out["run_ahead"] = {"pause_s": args.run_ahead, "epochs": 10,
                            "runs": run_ahead(ctx["sources"]["grouped x4"], 10, args.run_ahead, **ctx["options"])}
    return out


def close(ctx: dict) -> None:
    import ray

    ray.shutdown()
    if ctx.get("cluster") is not None:
        ctx["cluster"].shutdown()


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    import ray

    options = {"tasks_in_flight": "auto (the default)", **ctx["options"]}
    doc["conditions"] = {"cpus": os.cpu_count(), "batch": BATCH, "videos": args.videos,
                         "video": "120 frames 340x256 x264 (GOP <= 250)", "clip": "16 x every 2nd, 112x112",
                         "ray": ray.__version__, "reps": args.reps, "epochs": args.epochs, "layout": args.layout,
                         "dataset_options": options}
    doc["cluster_start_s"], doc["idle_after_warm_up"] = ctx["started"], ctx["idle"]
    doc["cells"] = report.summarize(runs, ("cell",), ("clips_per_s", "clips_per_cpu_s"))


def markdown(r: dict) -> str:
    c = r["conditions"]
    heading, started = LAYOUTS[c["layout"]]
    lines = [f"# Ray vs the local Loader, {c['cpus']} cores (bench/ray_feed.py)", "",
             (f"{c['videos']} videos of {c['video']}; clips {c['clip']}; batch {c['batch']}; Ray {c['ray']}; "
              + (f"median of {c['reps']} epochs after a warm-up epoch." if c["epochs"] == 1 else
                 f"each cell one dataset (one loader) of {c['epochs']} epochs, median of {c['reps']} "
                 "after a warm-up epoch.")
              + "".join(f" `{k}={v}`." for k, v in c["dataset_options"].items())), "",
             (f"| clips | Loader(workers=2) clips/s | {heading} | Ray / Loader "
              "| per CPU second: Loader | Ray | Ray / Loader |"),
             "|---|---|---|---|---|---|---|"]

    def pair(s: str, metric: str) -> str:
        lo, ra = (r["cells"][f"{s} / {w}"].get(metric, {}).get("median") for w in READERS)
        return f" {lo:.1f} | {ra:.1f} | {ra / lo:.2f}x |" if lo and ra else " - | - | - |"

    lines += [f"| {s} |{pair(s, 'clips_per_s')}{pair(s, 'clips_per_cpu_s')}" for s in SOURCES]
    load = r["load_avg_1m_at_end"]
    lines += ["", ("Per CPU second: clips over the CPU time of every process taking part (the loader and its "
                   "workers; the driver and all of the cluster's processes), which the machine's other jobs "
                   "do not change." + (f" Load average at the end: {load:.1f}." if load is not None else ""))]
    i = r["idle_after_warm_up"]
    lines += ["", (f"Cluster start ({started}): {r['cluster_start_s']:.1f} s. Idle cluster after the warm-up: "
                   f"{i['processes']} processes, {i['cores_busy']:.2f} cores busy, RSS {i['rss_mb']:.0f} MB, "
                   f"USS {i['uss_mb']:.0f} MB."), "", "| consumer route (materialized epoch) | rows/s | MB/s |",
              "|---|---|---|"]
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
    return "\n".join([*lines, "", *report.tail(r)]).rstrip("\n") + "\n"


# report.py writes a committed result again from its json: it asks the script for BENCH.markdown.
BENCH = harness.Benchmark(
    script="bench/ray_feed.py", name="ray-feed-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=lambda args, ctx: [[(s, w) for s in SOURCES for w in READERS]], run=run, after=after, close=close,
    report=summarize, markdown=markdown, plot=lambda doc, folder, name: [], label=lambda cell: " / ".join(cell),
    retry=False, preload=())


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
