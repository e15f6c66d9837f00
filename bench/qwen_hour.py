"""A long video's memory (issue 68): what one worker and the ring hold to read one video at
Qwen's default plan, a 12-s file against the same content an hour long.

The short file is the ``textured12`` workload's first (``bench/qwen.py``: 12 s of textured
640x360 at 30 fps, x264 preset medium, CRF 23, its default GOP); the long one is that file's
video stream ``--minutes * 5`` times in a row, remuxed (``qwen.repeat_segment``: packets copied,
timestamps shifted), so both decode alike per frame. Each run is a fresh process (``python -c``)
that builds ``qwen.clips([path])`` and reads the first batch of ``Loader(source, batch_size=1,
workers=1)``; it reports, with the batch in hand:

* the worker's peak resident memory (``VmHWM`` of ``/proc/<pid>/status``: its own pages and the
  ring pages it wrote), its own memory now (``Pss_Anon + Pss_File``, ``smaps_rollup``), and the
  ring's: the bytes its segment has taken (pages allocated) beside the room its slots have;
* the plan: frames and size, tokens, the rows' bytes; seconds to the batch; frames the decoder went
  through (``stats()["frames_decoded"]``).

    python bench/qwen_hour.py                     # ~2 minutes on 2 cores, after writing the hour (~1 min)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness  # noqa: E402
import report  # noqa: E402
from report import fmt, table  # noqa: E402

SCRIPT = r"""
import json, os, sys, time
import shmloader
from shmloader import qwen

def status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

def own(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(l.split()[1]) * 1024 for l in f if l.split(":")[0] in ("Pss_Anon", "Pss_File"))

def ring_taken():
    sizes = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:shmloader"):
                st = os.fstat(int(fd))
                sizes[st.st_dev, st.st_ino] = st.st_blocks * 512
        except OSError:
            pass
    return max(sizes.values())

t0 = time.monotonic()
src = qwen.clips([sys.argv[1]])
(plan,) = src.plans()
with shmloader.Loader(src, batch_size=1, workers=1) as loader:
    batch = next(iter(loader))
    took = time.monotonic() - t0
    (pid,) = loader.worker_pids()
    rows = batch["pixel_values_videos"]
    print(json.dumps({"worker_hwm": status(pid, "VmHWM"), "worker_own": own(pid), "ring_taken": ring_taken(),
                      "ring_room": loader.layout.slot_bytes * loader._nslots, "slots": loader._nslots,
                      "frames": len(plan.indices), "size": list(plan.size), "tokens": int(plan.cost),
                      "rows_bytes": int(rows.nbytes), "seconds": took,
                      "frames_decoded": int(loader.stats()["frames_decoded"])}))
"""

FILES = ("short", "hour")


def options(p) -> None:
    p.add_argument("--minutes", type=float, default=60.0, help="the long file's length")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "qwen"))
    p.add_argument("--timeout", type=float, default=600.0)


def prepare(args, notes: list[str]) -> dict:
    import argparse

    import qwen

    parser = argparse.ArgumentParser()
    qwen.workload_options(parser)
    wargs = parser.parse_args(["--cache", args.cache])
    short = qwen.workload_files(wargs, "textured12")[0]
    times = max(1, round(args.minutes * 60 / 12))
    hour = os.path.join(args.cache, f"hour_{times * 360}f_360x640.mp4")
    if not os.path.exists(hour):
        tmp = hour.replace(".mp4", ".tmp.mp4")
        qwen.repeat_segment(short, tmp, times)
        os.replace(tmp, hour)
    notes.append(f"short: {os.path.basename(short)}; hour: its video {times} times in a row "
                 f"({times * 360} frames, {times * 12 / 60:g} min), remuxed.")
    return {"paths": {"short": short, "hour": hour}}


def cells(args, ctx: dict) -> list[list]:
    return [[(name,) for name in FILES]]


def run(cell, rep: int, args, ctx: dict) -> dict:
    (name,) = cell
    out = subprocess.run([sys.executable, "-c", SCRIPT, ctx["paths"][name]], capture_output=True, text=True,
                         timeout=args.timeout)
    row = {"file": name, "rep": rep}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return {**row, "error": lines[-1] if lines else f"exited with {out.returncode}"}
    return {**row, **json.loads(out.stdout.strip().splitlines()[-1])}


METRICS = ("worker_hwm", "worker_own", "ring_taken", "ring_room", "seconds", "frames_decoded")


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    rows = []
    for name in FILES:
        rs = [r for r in runs if r["file"] == name and not r.get("error")]
        if rs:
            rows.append({"file": name, "n": len(rs), **{m: report.spread([r[m] for r in rs]) for m in METRICS},
                         **{k: rs[0][k] for k in ("frames", "size", "tokens", "rows_bytes", "slots")}})
    doc["rows"] = rows
    doc["config"].update(minutes=args.minutes)
    failed = [r for r in runs if r.get("error")]
    if failed:
        doc["notes"].append(f"{len(failed)} runs failed: " + "; ".join(f"{r['file']}: {r['error']}" for r in failed))


def markdown(doc: dict) -> str:
    mib = 2**20
    lines = ["# A long video's memory: one worker and the ring at Qwen's default plan", "",
             f"Command: `{doc['command']}`  ", f"Machine: {report.machine_line(doc['machine'])}  "]
    if doc.get("code"):
        lines.append(f"Code: {doc['code']['describe']}  ")
    lines += [f"Wall time: {doc['wall_s']:.0f} s.", "",
              "Each run a fresh process reading the first batch of `Loader(qwen.clips([path]), batch_size=1, "
              "workers=1)`. Worker peak: `VmHWM` (its own pages and the ring pages it wrote); worker own: "
              "`Pss_Anon + Pss_File` with the batch in hand; ring: bytes its segment has taken, beside the room "
              "its slots have. Medians (min–max) of the repetitions.", "",
              *table("| file | plan | rows MiB | worker peak MiB | worker own MiB | ring taken MiB | ring room MiB "
                     "| to the batch, s | frames decoded |",
                     [f"| {r['file']} | {r['frames']} frames at {r['size'][0]}x{r['size'][1]}, {r['tokens']:,} "
                      f"tokens | {r['rows_bytes'] / mib:.0f} | {fmt(r['worker_hwm'], 0, scale=1 / mib)} | "
                      f"{fmt(r['worker_own'], 0, scale=1 / mib)} | {fmt(r['ring_taken'], 0, scale=1 / mib)} | "
                      f"{fmt(r['ring_room'], 0, scale=1 / mib)} ({r['slots']} slots) | {fmt(r['seconds'], 1)} | "
                      f"{fmt(r['frames_decoded'], 0)} |" for r in doc["rows"]]), ""]
    return "\n".join(lines + report.tail(doc)).rstrip("\n") + "\n"


BENCH = harness.Benchmark(
    script="bench/qwen_hour.py", name="qwen-hour-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=cells, run=run, report=summarize, markdown=markdown, plot=lambda doc, folder, name: [],
    label=lambda cell: cell[0], reps=1, preload=())


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
