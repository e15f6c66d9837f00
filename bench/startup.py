"""Starting workers: a training script's CPU and first-batch wait per loader, with workers forked
by the fork server (``engine.forkserver``, the default) and started as fresh interpreters
(``SHMLOADER_FORK_SERVER=0``).

Each run is a fresh training process (``python -c``) that opens the same small loader ``--loaders``
times one after another, W workers each, and reads one epoch of ``--videos`` sample videos (one
8-frame 64x64 clip each, batch 2): what a script that makes a loader per epoch, a notebook that
re-runs its cell or an evaluation loop pays. Its CPU is the process's and every descendant's
(``os.wait4``: workers, and the server with the workers it reaped), less the median CPU of the same
script opening no loader (``baseline``: the interpreter and ``import shmloader``), per loader. The
first-batch wait is from the loader's construction to its first batch: the first loader's (which
starts the server) and the median of the others'.

    python bench/startup.py                     # W = 1, 2, 4; 10 loaders; 5 reps: ~2 minutes on 2 cores
    python bench/startup.py --workers 2 --reps 3
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness
import report

from shmloader.samples import make_videos

MODES = {"server": "fork server (default)", "exec": "fresh interpreters (SHMLOADER_FORK_SERVER=0)",
         "baseline": "no loader (baseline)"}

SCRIPT = r"""
import json, sys, time
import shmloader

paths, workers, loaders = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
clips = shmloader.VideoClips(paths, [0] * len(paths), clip_len=8, size=(64, 64))
firsts, batches = [], 0
for _ in range(loaders):
    t0 = time.perf_counter()
    with shmloader.Loader(clips, batch_size=2, workers=workers, epochs=1, shuffle=False) as loader:
        it = iter(loader)
        next(it)
        firsts.append(time.perf_counter() - t0)
        batches += 1 + sum(1 for _ in it)
print(json.dumps({"firsts": firsts, "batches": batches}))
"""


def run_script(paths: list[str], mode: str, workers: int, loaders: int) -> dict:
    """One training process: its output and the CPU seconds of it and all its descendants."""
    env = {**os.environ, "SHMLOADER_FORK_SERVER": "0" if mode == "exec" else "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(paths), str(workers),
                             str(loaders if mode != "baseline" else 0)],
                            stdout=subprocess.PIPE, text=True, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    if proc.returncode != 0:
        return {"error": f"the script exited with {proc.returncode}"}
    got = json.loads(out)
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - t0, **got}


def options(p) -> None:
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--loaders", type=int, default=10)
    p.add_argument("--videos", type=int, default=6)
    p.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "shmloader-startup"))


def prepare(args, notes: list[str]) -> dict:
    paths, _ = make_videos(args.folder, count=args.videos, frames=40, size=(96, 128))
    return {"paths": paths}


def cells(args, ctx: dict) -> list[list]:
    return [[("baseline", 0)]] + [[("server", w), ("exec", w)] for w in harness.ints(args.workers)]


def run(cell, rep: int, args, ctx: dict) -> dict:
    mode, workers = cell
    return {"mode": mode, "workers": workers, "rep": rep, **run_script(ctx["paths"], mode, workers, args.loaders)}


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    ok = [r for r in runs if not r.get("error")]
    base = statistics.median(r["cpu_s"] for r in ok if r["mode"] == "baseline")
    rows = []
    for w in harness.ints(args.workers):
        for mode in ("server", "exec"):
            rs = [r for r in ok if r["mode"] == mode and r["workers"] == w]
            if not rs:
                continue
            rows.append({"mode": mode, "workers": w, "n": len(rs),
                         "cpu_ms_per_loader": report.spread([(r["cpu_s"] - base) / args.loaders * 1e3 for r in rs]),
                         "first_ms": report.spread([r["firsts"][0] * 1e3 for r in rs]),
                         "later_ms": report.spread([statistics.median(r["firsts"][1:]) * 1e3 for r in rs])})
        pair = {m: next((r for r in rows if r["mode"] == m and r["workers"] == w), None) for m in ("server", "exec")}
        if pair["server"] and pair["exec"]:
            per_rep = {r["rep"]: r for r in ok if r["mode"] == "exec" and r["workers"] == w}
            ratios = [(per_rep[r["rep"]]["cpu_s"] - base) / (r["cpu_s"] - base)
                      for r in ok if r["mode"] == "server" and r["workers"] == w and r["rep"] in per_rep]
            pair["server"]["cpu_ratio"] = report.spread(ratios)
    doc["config"].update(batch=2, clip_len=8, size="64x64")
    doc["baseline_cpu_s"] = base
    doc["rows"] = rows
    loaded = [r for r in ok if r["mode"] != "baseline"]
    if loaded:
        doc["notes"].append(f"Batches per loader: {loaded[0]['batches'] // args.loaders}; the baseline script (the "
                            f"interpreter and `import shmloader`) took {base * 1e3:.0f} ms of CPU (median), "
                            "subtracted from every row.")


def markdown(doc: dict) -> str:
    c = doc["config"]
    lines = ["# Starting workers: the fork server against fresh interpreters", "",
             f"Command: `{doc['command']}`  ", f"Machine: {report.machine_line(doc['machine'])}  "]
    if doc.get("code"):
        lines.append(f"Code: {doc['code']['describe']}  ")
    lines += [(f"Each run: a fresh training process opening {c['loaders']} loaders in turn over {c['videos']} "
               f"sample videos (one clip of {c['clip_len']} frames at {c['size']} each, batch {c['batch']}, one "
               f"epoch); medians of {c['reps']} interleaved repetitions (min-max)."), "",
              *report.table("| workers | started by | CPU ms per loader | first loader's first batch, ms | "
                            "later loaders' first batch, ms | CPU per loader, fresh interpreters / fork server |",
                            [f"| {r['workers']} | {MODES[r['mode']]} | {report.fmt(r['cpu_ms_per_loader'])} | "
                             f"{report.fmt(r['first_ms'])} | {report.fmt(r['later_ms'])} | {_ratio(r.get('cpu_ratio'))} |"
                             for r in doc["rows"]]), ""]
    return "\n".join(lines + report.tail(doc)).rstrip("\n") + "\n"


def _ratio(s: dict | None) -> str:
    return "" if not s else f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


BENCH = harness.Benchmark(
    script="bench/startup.py", name="startup-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=cells, run=run, report=summarize, markdown=markdown, plot=lambda doc, folder, name: [],
    label=lambda cell: f"{cell[0]} W={cell[1]}", reps=5, preload=())


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
