"""Planning at scale (issue 68): seconds from a fresh training process's start to its first batch
of ``Loader(qwen.clips(...), batch_size=1, workers=--workers)`` over N small local videos, with
and without a scan manifest.

Each N's videos are N hard links (``os.link``) of ``--distinct`` files written once into
``--cache`` by ``shmloader.samples.write_video`` (``--seconds`` s at 96x128, 25 fps, x264): each
link is a file of its own that a probe opens and parses, and the links of one file share its
pages, so the page cache holds them all and the disk is not what is measured. Every run is a fresh
training process (``python -c``) that reads its N paths from a list file and builds its source in
one of these modes:

* ``probed``: ``qwen.clips(paths, probes=<absent file>)``, a first run: every video probed before
  the first batch (from 256 local files in fresh interpreters, ``python -m
  shmloader.video.probing``, one per usable CPU, each with its share), the probes written to the
  file for the next run;
* ``probed-threads``: the same in 8 threads of the training process, as every run probed before
  (``shmloader.video.probing._PROCESSES_FROM`` raised in the script);
* ``kept``: ``qwen.clips(paths, probes=<the file an earlier run wrote>)``, a second run: every
  row reused (no file changed), only the files' sizes and times read, and the file written again;
* ``manifest``: ``qwen.from_manifest(<scan.csv>)``, no file opened before the first batch;
* ``scan``: the offline step that writes that manifest, ``python -m shmloader scan <folder> --out
  scan.csv --workers W --overwrite --quiet`` (W = ``--workers``; ``--check keyframes``, its default), timed as
  a run of its own.

Per run: seconds from the process's start to its first batch, split into the start (the
interpreter and ``import shmloader``), the plan (the source's construction: the list read, probing,
planning) and the loader (``Loader``'s construction to the first batch: workers started, the
first video read); CPU seconds of the process and every descendant (``os.wait4``: probe
processes, loader workers, the fork server; and those it left behind, reaped here as their
subreaper: multiprocessing's forkserver under ``shmloader scan``), to the process's exit; and the other
programs' load over the run (a run spoilt by it is repeated, ``--max-other-load``). A ``kept``
or ``manifest`` run whose file no earlier run left (the cells run in a shuffled order) first runs
the step that makes it, untimed.

    python bench/planning.py                   # N = 10 000 (3 reps) and 100 000 (once): ~30 min on 2 cores
    python bench/planning.py --counts 500,1000 --reps 1 --name planning-tiny --out /tmp/planning  # ~1 min
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness
import report
from report import fmt, table

MODES = ("probed", "probed-threads", "kept", "manifest", "scan")
ABOUT = {"probed": "probed (processes), probes kept", "probed-threads": "probed in threads (as before)",
         "kept": "probes kept by an earlier run", "manifest": "from a scan manifest",
         "scan": "the scan itself (offline)"}
# linux/prctl.h; how long the processes a measured one left behind may take to exit.
_PR_SET_CHILD_SUBREAPER, _ORPHANS_S = 36, 30.0
PARTS = (("start_s", "start", "#bdbdbd"), ("plan_s", "plan", "#3182bd"), ("loader_s", "loader", "#9ecae1"))

SCRIPT = r"""
import json, sys, time
import shmloader
from shmloader import qwen
imported = time.monotonic()
mode, source, probes, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if mode == "probed-threads":
    import shmloader.video.probing as probing
    probing._PROCESSES_FROM = 1 << 62  # threads whatever the count
if mode == "manifest":
    src = qwen.from_manifest(source)
else:
    with open(source) as f:
        src = qwen.clips(f.read().splitlines(), probes=probes)
planned = time.monotonic()
with shmloader.Loader(src, batch_size=1, workers=workers) as loader:
    next(iter(loader))
    first = time.monotonic()
print(json.dumps({"imported": imported, "planned": planned, "first": first, "videos": len(src)}))
"""


def run_child(argv: list[str], timeout: float) -> dict:
    """One process to its exit: its stdout (JSON, where it prints one), the time it started
    (``time.monotonic``, which every process on the machine shares), its wall and the CPU of it
    and every descendant it reaped; the other programs' load over it (% of a core)."""
    from measure import system_busy

    with tempfile.TemporaryFile() as err:
        busy0, t0 = system_busy(), time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        killed = threading.Event()
        timer = threading.Timer(timeout, lambda: (killed.set(), proc.kill()))
        timer.start()
        try:
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            proc.stdout.close()
        wall = time.monotonic() - t0
        cpu = usage.ru_utime + usage.ru_stime + _orphans_cpu()
        row = {"t0": t0, "wall_s": wall, "cpu_s": cpu,
               "other_cpu_pct": max(0.0, 100 * (system_busy() - busy0 - cpu) / wall)}
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            why = f"killed after {timeout:.0f} s" if killed.is_set() else f"exited with {code}"
            return {**row, "error": f"{why}: {lines[-1] if lines else ''}"}
    return {**row, "out": json.loads(out) if out.strip() else None}


def _subreaper() -> None:
    """Make this process the reaper of its descendants' orphans (Linux's
    ``PR_SET_CHILD_SUBREAPER``): a process left behind by the one measured (multiprocessing's
    forkserver under ``shmloader scan``, which its parent exits without waiting for) is reaped
    here, its CPU and its reaped children's counted (``_orphans_cpu``), not lost to init."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _orphans_cpu() -> float:
    """CPU seconds of the descendants orphaned to this process, each reaped as it exits; those
    still running after ``_ORPHANS_S`` are left (and counted when a later run reaps them)."""
    cpu, deadline = 0.0, time.monotonic() + _ORPHANS_S
    while time.monotonic() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
            continue
        cpu += usage.ru_utime + usage.ru_stime
    return cpu


def training(mode: str, source: str, probes: str, workers: int, timeout: float) -> dict:
    """A training run: seconds to its first batch from its start, and their split."""
    got = run_child([sys.executable, "-c", SCRIPT, mode, source, probes, str(workers)], timeout)
    out = got.pop("out", None)
    t0 = got.pop("t0")
    if got.get("error"):
        return got
    return {**got, "total_s": out["first"] - t0, "start_s": out["imported"] - t0,
            "plan_s": out["planned"] - out["imported"], "loader_s": out["first"] - out["planned"],
            "videos": out["videos"]}


def scan(folder: str, out: str, workers: int, timeout: float) -> dict:
    """``shmloader scan`` of ``folder`` into ``out``: its wall and CPU, and the rows it wrote."""
    got = run_child([sys.executable, "-m", "shmloader", "scan", folder, "--out", out, "--workers", str(workers),
                     "--overwrite", "--quiet"], timeout)
    got.pop("out", None)
    got.pop("t0")
    if not got.get("error"):
        with open(out) as f:
            got["videos"] = sum(1 for _ in f) - 1
        got["total_s"] = got["wall_s"]
    return got


# ------------------------------------------------------------------------ the videos
def options(p) -> None:
    p.add_argument("--counts", default="10000,100000", help="videos per dataset (N)")
    p.add_argument("--modes", type=harness.names(MODES), default=list(MODES))
    p.add_argument("--workers", type=int, default=2, help="loader workers and scan processes")
    p.add_argument("--large-from", type=int, default=100_000,
                   help="datasets of at least this many videos are measured --large-reps times")
    p.add_argument("--large-reps", type=int, default=1)
    p.add_argument("--distinct", type=int, default=8, help="distinct files the links point to")
    p.add_argument("--seconds", type=float, default=2.0, help="length of each distinct file")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a run may take before it is killed")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "planning"),
                   help="where the distinct files and the folders of links are made (reused when present)")


def _links(folder: str, distinct: list[str], count: int) -> str:
    """``folder`` holding ``count`` links of ``distinct`` in turn, made unless it is already whole."""
    names = [f"v{i:07d}.mp4" for i in range(count)]
    if os.path.isdir(folder) and len(os.listdir(folder)) == count and os.path.exists(os.path.join(folder, names[-1])):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for i, name in enumerate(names):
        os.link(distinct[i % len(distinct)], os.path.join(folder, name))
    return folder


def prepare(args, notes: list[str]) -> dict:
    from shmloader.samples import write_video

    _subreaper()
    frames = round(args.seconds * 25)
    made = os.path.join(args.cache, f"distinct-{frames}f")
    os.makedirs(made, exist_ok=True)
    distinct = []
    for k in range(args.distinct):
        path = os.path.join(made, f"d{k}.mp4")
        if not os.path.exists(path):
            write_video(path + ".tmp.mp4", k, frames=frames, size=(96, 128))
            os.replace(path + ".tmp.mp4", path)
        distinct.append(path)
    work = tempfile.mkdtemp(prefix="shmloader-planning-")
    ctx = {"work": work, "folders": {}, "lists": {}}
    for n in harness.ints(args.counts):
        folder = _links(os.path.join(args.cache, f"n{n}-of-{args.distinct}x{frames}f"), distinct, n)
        ctx["folders"][n] = folder
        ctx["lists"][n] = os.path.join(work, f"paths-{n}.txt")
        with open(ctx["lists"][n], "w") as f:
            f.writelines(os.path.join(folder, name) + "\n" for name in sorted(os.listdir(folder)))
    return ctx


def close(ctx: dict) -> None:
    if ctx.get("work"):
        shutil.rmtree(ctx["work"], ignore_errors=True)


# ------------------------------------------------------------------------ the runs
def cells(args, ctx: dict) -> list[list]:
    return [[(n, mode) for mode in args.modes] for n in harness.ints(args.counts)]


def run(cell, rep: int, args, ctx: dict) -> dict:
    n, mode = cell
    row = {"count": n, "mode": mode, "rep": rep}
    if n >= args.large_from and rep >= args.large_reps:
        return {**row, "not_run": True}
    work, paths, folder = ctx["work"], ctx["lists"][n], ctx["folders"][n]
    kept, manifest = os.path.join(work, f"probes-{n}.csv"), os.path.join(work, f"scan-{n}.csv")
    if mode == "scan":
        timed = os.path.join(work, f"scan-{n}-timed.csv")
        got = scan(folder, timed, args.workers, args.timeout)
        if not got.get("error"):
            os.replace(timed, manifest)  # the manifest mode's, from now on
        return {**row, **got}
    if mode in ("probed", "probed-threads"):
        fresh = os.path.join(work, f"fresh-{n}.csv")
        if os.path.exists(fresh):
            os.unlink(fresh)
        got = training(mode, paths, fresh, args.workers, args.timeout)
        if not got.get("error"):
            os.replace(fresh, kept)  # the kept mode's, from now on
        return {**row, **got}
    if mode == "kept":
        if not os.path.exists(kept):
            made = training("probed", paths, kept, args.workers, args.timeout)  # untimed: what a first run leaves
            if made.get("error"):
                return {**row, "error": f"making the probes to keep: {made['error']}"}
        return {**row, **training("kept", paths, kept, args.workers, args.timeout)}
    if not os.path.exists(manifest):
        made = scan(folder, manifest, args.workers, args.timeout)  # untimed: the offline step
        if made.get("error"):
            return {**row, "error": f"making the manifest: {made['error']}"}
    return {**row, **training("manifest", manifest, "", args.workers, args.timeout)}


def brief(cell, row: dict) -> str | None:
    if row.get("error"):
        return f"N={cell[0]} {cell[1]}: {row['error']}"
    if not row.get("not_run") and row.get("videos") != cell[0]:
        return f"N={cell[0]} {cell[1]}: {row.get('videos')} videos planned, not {cell[0]}"
    return None


# ------------------------------------------------------------------------ the report
METRICS = ("total_s", "start_s", "plan_s", "loader_s", "cpu_s", "other_cpu_pct")


def summarize(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    ok = [r for r in runs if not r.get("error") and not r.get("not_run")]
    rows = []
    for n in harness.ints(args.counts):
        for mode in args.modes:
            rs = [r for r in ok if r["count"] == n and r["mode"] == mode]
            if not rs:
                continue
            row = {"count": n, "mode": mode, "n": len(rs),
                   **{m: report.spread([r[m] for r in rs]) for m in METRICS if m in rs[0]},
                   "ms_per_video": report.spread([(r["plan_s"] if mode != "scan" else r["total_s"]) / n * 1e3
                                                  for r in rs]),
                   "videos": sorted({r["videos"] for r in rs})}
            rows.append(row)
    doc["rows"] = rows
    frames = round(args.seconds * 25)
    doc["config"].update(frames=frames, size="96x128", fps=25, cpus=len(os.sched_getaffinity(0)))
    failed = [r for r in runs if r.get("error")]
    if failed:
        doc["notes"].append(f"{len(failed)} runs failed: " + "; ".join(
            f"N={r['count']} {r['mode']}: {r['error']}" for r in failed[:3]))
    wrong = [r for r in rows if r["videos"] != [r["count"]]]
    if wrong:
        doc["notes"].append("Videos planned other than N: " + "; ".join(
            f"N={r['count']} {r['mode']}: {r['videos']}" for r in wrong))


def markdown(doc: dict) -> str:
    c = doc["config"]
    lines = ["# Planning at scale: a fresh training process's first batch over many videos", "",
             f"Command: `{doc['command']}`  ", f"Machine: {report.machine_line(doc['machine'])}  "]
    if doc.get("code"):
        lines.append(f"Code: {doc['code']['describe']}  ")
    lines += [f"Wall time: {doc['wall_s']:.0f} s.", "",
              (f"N local videos, hard links of {c['distinct']} distinct {c['seconds']:g}-s {c['size']} files "
               f"({c['frames']} frames at {c['fps']} fps, x264; every file in the page cache); each run a fresh "
               f"process building its source and reading the first batch of `Loader(source, batch_size=1, "
               f"workers={c['workers']})`. Seconds from the process's start: to the first batch, and its parts: "
               "start (interpreter, `import shmloader`), plan (the source's construction), loader (its "
               "construction to the first batch). CPU: the process and every descendant, to its exit. Medians "
               f"of {c['reps']} interleaved repetitions (min–max){_large(doc)}. The scan row is the offline step "
               f"the manifest row needs (`shmloader scan --workers {c['workers']}`), its own wall time in "
               "brackets: not part of a training run."), "",
              *table("| videos | source | to the first batch, s | start, s | plan, s | loader, s | "
                     "plan, ms per video | CPU, s |",
                     [_line(r) for r in doc["rows"]]), ""]
    return "\n".join(lines + report.tail(doc)).rstrip("\n") + "\n"


def _large(doc: dict) -> str:
    c = doc["config"]
    large = sorted({r["count"] for r in doc["rows"] if r["count"] >= c["large_from"]})
    if not large or c["large_reps"] >= c["reps"]:
        return ""
    return f"; {' and '.join(f'{n:,}' for n in large)} videos: {c['large_reps']} repetition(s)"


def _line(r: dict) -> str:
    if r["mode"] == "scan":
        return (f"| {r['count']:,} | {ABOUT['scan']} | ({fmt(r['total_s'], 1)}) | – | – | – | "
                f"{fmt(r['ms_per_video'], 2)} | {fmt(r['cpu_s'], 1)} |")
    return (f"| {r['count']:,} | {ABOUT[r['mode']]} | {fmt(r['total_s'], 1)} | {fmt(r['start_s'], 2)} | "
            f"{fmt(r['plan_s'], 2)} | {fmt(r['loader_s'], 2)} | {fmt(r['ms_per_video'], 2)} | {fmt(r['cpu_s'], 1)} |")


def plot(doc: dict, folder: str, name: str) -> list[str]:
    """Per N, each training mode's median seconds to the first batch as its parts (the scan apart)."""
    counts = sorted({r["count"] for r in doc["rows"]})
    if not counts:
        return []
    plt = report.pyplot()
    modes = [m for m in MODES if m != "scan" and any(r["mode"] == m for r in doc["rows"])]
    fig, axes = plt.subplots(1, len(counts), figsize=(5.5 * len(counts), 0.9 + 0.5 * len(modes)), squeeze=False)
    for ax, n in zip(axes[0], counts):
        rows = {r["mode"]: r for r in doc["rows"] if r["count"] == n}
        names = [ABOUT[m] for m in modes if m in rows]
        left = [0.0] * len(names)
        for key, label, color in PARTS:
            widths = [rows[m][key]["median"] for m in modes if m in rows]
            ax.barh(names, widths, left=left, color=color, label=label)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_title(f"{n:,} videos: s to the first batch")
        ax.invert_yaxis()
        if ax is not axes[0][0]:
            ax.set_yticklabels([])
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(
    script="bench/planning.py", name="planning-cpu2", about=__doc__, options=options, prepare=prepare,
    cells=cells, run=run, report=summarize, markdown=markdown, plot=plot, close=close, brief=brief,
    label=lambda cell: f"N={cell[0]} {cell[1]}", reps=3, preload=())


def main(argv: list[str]) -> int:
    return harness.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
