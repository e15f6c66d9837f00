"""Beyond one machine's disk: clips from an HTTP object store with latency, four ways.

The videos (textured frame codes, ``workloads.write_textured``: ~500 kbit/s, one keyframe every
``--gop`` frames) are served by a Range-capable HTTP server on 127.0.0.1 (``tests/_servers.py``)
that waits ``--latency`` ms before answering each request, as object stores take 20-100 ms to
first byte. They are also packed into WebDataset tar shards (``key.mp4`` + ``key.cls``) on the
same server. Routes, each at ``--workers`` workers, ``CLIPS_PER_VIDEO`` random ``clip_len``-frame
clips of every video scaled to ``side x side``:

* ``local``: shmloader on the files on local disk (no server): the ceiling;
* ``shm-url``: shmloader on the videos' URLs, each under ``--names`` names (``?name=i``), so that
  nearly every clip comes from a file its worker has not opened before, as in a dataset of
  millions: a probe (the header and index, two GOPs) and then the clip's own packets, the
  requests of a task's clips sent together;
* ``shm-shards``: shmloader ``VideoClips.from_shards`` over the shards' URLs (members by range;
  a worker keeps each member's probe once read: with few members, most clips skip it);
* ``shm-url-grouped``, ``shm-shards-grouped``: the same with ``group_clips=True``: the clips of a
  video go to one worker as one task, which probes the file once and fetches their packets in one
  round of requests, as webdataset reads a sample once for all its clips;
* ``webdataset``: the usual route: webdataset streams whole shards (curl) in a torch DataLoader,
  each video's bytes decoded by decord from memory (all its clips from one reader);
* ``download``: each video downloaded whole to a temporary file, then its clips decoded by decord.

Remote routes run at ``--workers`` (the cores) and at ``--io-workers``: waiting on the network
needs no core, and more workers keep more requests in flight. Per row: clips/s at the consumer, CPU ms per clip (every process of the run), and bytes served
per delivered clip (counted by the server over the whole run, first batch included).

    python bench/remote.py                      # ~6 minutes on 2 cores, after writing the videos

Like the other benchmarks, this module imports neither TensorFlow nor torch at the top.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys
import tarfile
import threading

import numpy as np

import harness
import report
from report import fmt, table
from workloads import CLIPS_PER_VIDEO, ClipSet, Workload, make_clipset

sys.path.insert(0, harness.ROOT)
from tests._servers import RangeServer  # noqa: E402  (the tests' server, bound to 127.0.0.1)

ROUTES = ("local", "shm-url", "shm-url-grouped", "shm-shards", "shm-shards-grouped", "webdataset", "download")


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--io-workers", type=int, default=8, help="the remote routes' second worker count")
    p.add_argument("--latency", type=harness.ints, default=[20, 100], help="ms before each answer")
    p.add_argument("--gop", type=int, default=50)
    p.add_argument("--per-shard", type=int, default=4, help="videos per tar shard")
    p.add_argument("--side", type=int, default=112)
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--duration", type=float, default=8.0, help="seconds measured per run, at least")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--routes", type=harness.names(ROUTES), default=list(ROUTES))
    p.add_argument("--names", type=int, default=64, help="URLs of each video in shm-url (cold files)")
    p.add_argument("--cache-mb", type=float, default=4.0,
                   help="shmloader's block cache per worker: far below the data, as with a bucket of TBs")
    harness.video_options(p, "remote", 16, 750, codec=False)


def prepare(args, notes: list[str]) -> dict:
    h, w = args.video_size
    clips = make_clipset(args.cache, args.video_count, args.video_frames, (h, w), "libx264", content="textured",
                         gop=args.gop)
    folder = os.path.dirname(clips.paths[0])
    shards = []
    for s in range(0, len(clips.paths), args.per_shard):
        name = f"shard-{s // args.per_shard:03d}.tar"
        shards.append(name)
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            with tarfile.open(path + ".tmp", "w") as t:
                for v in range(s, min(s + args.per_shard, len(clips.paths))):
                    t.add(clips.paths[v], arcname=f"{v:06d}.mp4")
                    data = str(clips.labels[v]).encode()
                    info = tarfile.TarInfo(f"{v:06d}.cls")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
            os.replace(path + ".tmp", path)
    mb = sum(os.path.getsize(p) for p in clips.paths) / 1e6
    notes.append(f"Videos: {len(clips.paths)} textured H.264 frame-code videos, {h}x{w}, {args.video_frames} "
                 f"frames at 25 fps, one keyframe every {args.gop} frames, {mb:.1f} MB in all; "
                 f"{len(shards)} shards of {args.per_shard}.")
    notes.append("The server (Python's ThreadingHTTPServer in this process) answers each request after the "
                 "latency, many at once, as an object store does; its CPU counts in every route's CPU/clip.")
    wl = Workload("remote", args.clip_len, (args.side, args.side), 0, "random clips")
    return {"clips": clips, "folder": folder, "shards": shards, "wl": wl}


def cells(args, ctx: dict) -> list[list]:
    # One block per latency (local, with no server, in each as the ceiling to compare with).
    counts = list(dict.fromkeys([args.workers, args.io_workers]))
    return [[(r, lat, w) for r in args.routes for w in (counts if r != "local" else [args.workers])]
            for lat in args.latency]


def run(cell, rep: int, args, ctx: dict) -> dict:
    from measure import Result, run_pipeline

    route, latency, workers = cell
    args = argparse.Namespace(**{**vars(args), "workers": workers})
    wl, clips = ctx["wl"], ctx["clips"]
    res = Result(f"{route}/{latency}ms/W{workers}", route, str(workers), rep)
    served = {}
    with RangeServer(ctx["folder"], latency=latency / 1000, max_requests=10**7) as srv:
        rel = [os.path.basename(p) for p in clips.paths]
        urls = ClipSet(tuple(f"{srv.url(r)}?name={j}" for j in range(args.names) for r in rel),
                       tuple(clips.labels) * args.names)
        make = {
            "local": lambda: _shm(ClipSet(clips.paths, clips.labels), wl, args),
            "shm-url": lambda: _shm(urls, wl, args),
            "shm-url-grouped": lambda: _shm(urls, wl, args, group_clips=True),
            "shm-shards": lambda: _shm_shards([srv.url(s) for s in ctx["shards"]], wl, args),
            "shm-shards-grouped": lambda: _shm_shards([srv.url(s) for s in ctx["shards"]], wl, args, group_clips=True),
            "webdataset": lambda: _webdataset([srv.url(s) for s in ctx["shards"]], wl, args, len(clips.paths)),
            "download": lambda: _download([srv.url(r) for r in rel], clips.labels, wl, args),
        }[route]
        counted = {}

        def counting():
            pipe = make()
            inner = pipe.batches

            def batches():
                for b in inner:
                    counted["clips"] = counted.get("clips", 0) + int(b["video"].shape[0])
                    yield b

            pipe.batches = batches()
            return pipe

        try:
            run_pipeline(counting, res, clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                         warmup=args.warmup)
        except Exception as e:  # one broken row must not lose the others' results
            res.error = f"{type(e).__name__}: {e}"
        served = {"bytes": srv.bytes_sent, "requests": srv.requests}
    out = dataclasses.asdict(res)
    n = max(1, counted.get("clips", 0))
    out.update(route=route, latency=latency, W=workers, clips_counted=counted.get("clips", 0))
    if route != "local":  # the local route reads no byte from the server
        out.update(kb_per_clip=served["bytes"] / n / 1e3, requests_per_clip=served["requests"] / n)
    return out


def _fetch(args) -> dict:
    return {"cache_bytes": int(args.cache_mb * 2**20)}


def _shm(clips: ClipSet, wl: Workload, args, group_clips: bool = False):
    import loaders

    return loaders.shm(clips, wl, args.workers, args.batch_size, fetch=_fetch(args), group_clips=group_clips)


def _shm_shards(urls: list[str], wl: Workload, args, group_clips: bool = False):
    import loaders
    import shmloader

    source = shmloader.VideoClips.from_shards(urls, clip_len=wl.clip_len, clips_per_video=CLIPS_PER_VIDEO,
                                              size=wl.size, sampling="random", fetch=_fetch(args),
                                              group_clips=group_clips)
    loader = shmloader.Loader(source, batch_size=args.batch_size, workers=args.workers, shuffle=True, seed=0,
                              epochs=None, drop_remainder=True)
    return loaders._loader_pipeline(loader, iter(loader.as_dataset()))


def _clips_from(reader, wl: Workload, rng) -> list[np.ndarray]:
    """``CLIPS_PER_VIDEO`` random clips from one decord reader."""
    n = len(reader)
    out = []
    for _ in range(CLIPS_PER_VIDEO):
        start = int(rng.integers(0, max(1, n - wl.span + 1)))
        out.append(reader.get_batch(list(range(start, start + wl.span, wl.frame_step))).asnumpy())
    return out


def _decode_stage(samples, wl: Workload):
    """A webdataset stage: each (mp4 bytes, cls) decoded by decord from memory into
    ``CLIPS_PER_VIDEO`` clips."""
    import decord

    rng = np.random.default_rng()
    h, w = wl.size
    for data, cls in samples:
        reader = decord.VideoReader(io.BytesIO(data), width=w, height=h, num_threads=1)
        for clip in _clips_from(reader, wl, rng):
            yield clip, int(cls)


def _webdataset(urls: list[str], wl: Workload, args, videos: int):
    """webdataset as its users run it: endless resampled shards streamed whole (curl) in the
    workers of a torch DataLoader (forkserver workers, as ``loaders.torch_loader``)."""
    import functools
    import multiprocessing as mp

    import webdataset as wds
    from torch.utils.data import DataLoader

    from loaders import Pipeline

    pipeline = wds.DataPipeline(wds.ResampledShards(urls), wds.tarfile_to_samples(), wds.to_tuple("mp4", "cls"),
                                functools.partial(_decode_stage, wl=wl))
    loader = DataLoader(pipeline, batch_size=args.batch_size, num_workers=args.workers, prefetch_factor=2,
                        multiprocessing_context=mp.get_context("forkserver"))
    it = iter(loader)

    def batches():
        for video, label in it:
            yield {"video": video.numpy(), "label": label.numpy()}

    def pids():
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    return Pipeline(batches(), threading.Event(), pids=pids, teardown=[it._shutdown_workers])


def _fetch_and_decode(task):
    """A ``download`` worker's job: the whole file to a temporary file, then its clips."""
    import tempfile
    import urllib.request

    import decord

    url, label, wl, seed = task
    rng = np.random.default_rng(seed)
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        with urllib.request.urlopen(url, timeout=60) as r:
            f.write(r.read())
        f.flush()
        h, w = wl.size
        reader = decord.VideoReader(f.name, width=w, height=h, num_threads=1)
        return [(clip, label) for clip in _clips_from(reader, wl, rng)]


def _download(urls: list[str], labels, wl: Workload, args):
    import concurrent.futures
    import multiprocessing as mp
    from collections import deque

    from loaders import Pipeline

    pool = concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("forkserver"))
    stop = threading.Event()

    def batches():
        rng = np.random.default_rng(0)
        pending, ready, seed = deque(), deque(), 0
        while not stop.is_set():
            while len(pending) < 2 * args.workers:
                v = int(rng.integers(len(urls)))
                pending.append(pool.submit(_fetch_and_decode, (urls[v], labels[v], wl, seed)))
                seed += 1
            ready.extend(pending.popleft().result())
            while len(ready) >= args.batch_size:
                items = [ready.popleft() for _ in range(args.batch_size)]
                yield {"video": np.stack([c for c, _ in items]), "label": np.array([x for _, x in items])}

    def pids():
        return [p.pid for p in (pool._processes or {}).values()]

    return Pipeline(batches(), stop, pids=pids, teardown=[lambda: pool.shutdown(cancel_futures=True)])


METRICS = ("clips_per_s", "cpu_ms_per_clip", "kb_per_clip", "requests_per_clip")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("latency", "route", "W"), METRICS)
    # Each route against shmloader on the URLs at the same worker count.
    doc["ratios"] = {f"{lat}/{r}/{w}": report.ratio(runs, {"latency": lat, "route": "shm-url", "W": w},
                                                    {"latency": lat, "route": r, "W": w}, "clips_per_s")
                     for lat in args.latency for r in args.routes if r != "shm-url"
                     for w in (args.workers, args.io_workers)}


def _cell(summary: dict, lat, route: str, w) -> dict:
    """summary[latency][route][W], keyed as the JSON has them (strings after a round trip)."""
    s = summary.get(str(lat), summary.get(lat, {})).get(route, {})
    return s.get(str(w), s.get(w, {}))


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Beyond one machine's disk: clips from an HTTP store with latency")
    c = doc["config"]
    lines += [f"{CLIPS_PER_VIDEO} random {c['clip_len']}-frame clips per video at {c['side']}x{c['side']}, "
              f"batch {c['batch_size']}; medians (min-max) over {c['reps']} interleaved repetitions. "
              "shm-url/route: clips/s of shmloader on the URLs over the route's, at the same W.", ""]
    rows = []
    for lat in c["latency"]:
        for r in c["routes"]:
            for w in dict.fromkeys([c["workers"], c["io_workers"]]):
                s = _cell(doc["summary"], lat, r, w)
                if not s:
                    continue
                ratio = doc["ratios"].get(f"{lat}/{r}/{w}")
                rows.append(f"| {lat} ms | {r} | {w} | {fmt(s.get('clips_per_s'), 1)} | "
                            f"{fmt(s.get('cpu_ms_per_clip'), 1)} | {fmt(s.get('kb_per_clip'), 0)} | "
                            f"{fmt(s.get('requests_per_clip'), 2)} | "
                            f"{'–' if not ratio else format(ratio['ratio'], '.2f')} |")
    lines += table("| latency | route | W | clips/s | CPU ms/clip | KB served/clip | requests/clip | shm-url/route |",
                   rows)
    return "\n".join(lines + [""] + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    c = doc["config"]
    fig, axes = plt.subplots(1, len(c["latency"]), figsize=(5 * len(c["latency"]), 3.6), sharey=True, squeeze=False)
    for ax, lat in zip(axes[0], c["latency"]):
        labels, spreads, colors = [], [], []
        for r in c["routes"]:
            for w in dict.fromkeys([c["workers"], c["io_workers"]]):
                s = _cell(doc["summary"], lat, r, w).get("clips_per_s")
                if s:
                    labels.append(f"{r}\nW={w}")
                    spreads.append(s)
                    colors.append("#3182bd" if r.startswith("shm") else "#bbbbbb" if r == "local" else "#fd8d3c")
        report.bars(ax, labels, spreads, colors)
        ax.set_title(f"{lat} ms per request")
        ax.set_ylabel("clips/s")
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/remote.py", name="remote-cpu2", about=__doc__, options=options, cells=cells,
                          run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          label=lambda cell: f"{cell[0]}/{cell[1]}ms/W{cell[2]}", forkserver=True)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
