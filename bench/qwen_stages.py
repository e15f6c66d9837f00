"""Where a planned video's CPU goes (issue 68): shmloader's read of one Qwen-VL sample and the
limit's (``bench/qwen_limit.py``), stage by stage, in this one process, no loader.

Paths, each over the workload's videos of ``bench/qwen.py`` (``--workloads``, same cache):

* ``shmloader``: ``qwen.clips(paths)``'s reader as a loader's worker runs it (``worker_init()``,
  then ``read(i, rng, out)`` into arrays of the slot's shapes): probe kept per worker, plan,
  decode at the planned size by the decoder the worker measured faster, patch rows written;
* ``shmloader-pyav``, ``shmloader-decord``: the same with ``decoder=`` that decoder alone;
* ``limit``: ``qwen_limit.read_plan`` (PyAV alone, the plan's frames only, rgb24, nothing laid out).

Per path: ``--warm`` passes over the videos (the worker's decoder measurement settles, probes are
kept, scalers built), ``--passes`` passes timed with ``time.process_time`` (CPU ms per video, no
profiler), then one pass under cProfile, its time cut into stages by the functions that spend it
(a C function's own time; the profiler adds a little, so the stages are scaled to the unprofiled
CPU):

* ``open``: containers opened and closed (``av.open``); ``seek``: ``seek`` and ``flush_buffers``;
* ``decode``: libavcodec, packet by packet (``decode`` of a packet or a codec context);
* ``scale``: swscale to the planned size and rgb24 (the loader's filter graph, the limit's
  ``reformat``); ``to_ndarray``: the frame's pixels copied into a numpy array;
* ``copy to scratch``: ``PyAV._decode``'s own time (each frame copied into the decoder's scratch);
* ``patches``: the frames laid out as patch rows in the slot (``vlm.patches.rows``, ``np.copyto``);
* ``decord``: decord's decode (its library calls and its own Python);
* ``demux + loop``: the generator that drives the decoder (``video.pyav._decoded``,
  ``qwen_limit.read_plan``): reading packets from the file and the per-packet Python;
* ``other``: the rest (the plan made again, timestamps, bookkeeping).

Counts per video: packets sent to the decoder (both paths) and frames the decoder put out
(shmloader's PyAV: the frames not skipped, wanted or referenced).

    python bench/qwen_stages.py --workloads textured12,kinetics     # ~2 minutes on 2 cores
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import harness
import numpy as np
import report
from qwen import workload_files, workload_options
from report import table

PATHS = ("shmloader", "shmloader-pyav", "shmloader-decord", "limit")
# The stages of the docstring, each with what names its functions (in "file:function|" of pstats:
# "|" ends a name), first match wins; what matches none is "other".
STAGES = (("open", ("av.container.core.open", "method 'close' of 'av.container")),
          ("seek", ("method 'seek' of", "flush_buffers")),
          ("decode", ("method 'decode' of 'av.",)),
          ("scale", ("of 'av.filter.graph.Graph'", "method 'reformat' of")),
          ("to_ndarray", ("to_ndarray",)),
          ("copy to scratch", ("shmloader/video/pyav.py:_decode|",)),
          ("patches", ("vlm/patches.py:", "numpy.copyto")),
          ("decord", ("decord",)),
          ("demux + loop", ("shmloader/video/pyav.py:_decoded|", "qwen_limit.py:read_plan|", "qwen_limit.py:convert|")))
NAMES = tuple(s for s, _ in STAGES) + ("other",)


def options(p) -> None:
    workload_options(p)
    p.set_defaults(workloads=["textured12", "kinetics"])
    p.add_argument("--fps", type=float, default=2.0, help="Qwen's frame rate")
    p.add_argument("--paths", type=harness.names(PATHS), default=list(PATHS))
    p.add_argument("--warm", type=int, default=4, help="passes over the videos before timing")
    p.add_argument("--passes", type=int, default=3, help="passes timed without the profiler")


def prepare(args, notes: list[str]) -> dict:
    from qwen_limit import plan_reads

    from shmloader import qwen

    files = {w: workload_files(args, w) for w in args.workloads}
    reads = {w: plan_reads(paths, qwen.clips(paths, fps=args.fps).plans()) for w, paths in files.items()}
    return {"files": files, "reads": reads}


def cells(args, ctx: dict) -> list[list]:
    return [[(w, p) for p in args.paths] for w in args.workloads]


class _Reader:
    """One pass over the workload's videos by ``path``; what the pass's PyAV put out."""

    def __init__(self, path: str, files: list[str], reads: list, fps: float) -> None:
        self.path, self.reads = path, reads
        self.src = None
        if path != "limit":
            from shmloader import qwen

            decoder = {"shmloader": "auto", "shmloader-pyav": "pyav", "shmloader-decord": "decord"}[path]
            self.src = qwen.clips(files, fps=fps, decoder=decoder)
            self.src.worker_init()
            spec, sizes = self.src.spec(), self.src.sizes()
            # The slot's arrays, made once as a ring's are.
            self.outs = [{k: np.zeros((int(sizes.rows[k][i]), *shape[1:]) if shape[:1] == (-1,) else shape, dtype)
                          for k, (shape, dtype) in spec.items()} for i in range(len(files))]

    def __len__(self) -> int:
        return len(self.reads)

    def one_pass(self) -> None:
        from qwen_limit import read_plan

        from shmloader.engine.source import seeded

        for i in range(len(self.reads)):
            if self.src is None:
                read_plan(self.reads[i])
            else:
                self.src.read(i, seeded((0, 0, i)), self.outs[i])

    def frames_out(self) -> int:
        d = None if self.src is None else self.src._decoding
        pyav = None if d is None else d._decoders.get("pyav")
        return 0 if pyav is None else pyav.frames_out

    def counters(self) -> dict:
        return {} if self.src is None else self.src.counters()


def stages(stats: pstats.Stats) -> tuple[dict[str, float], int]:
    """(CPU seconds by stage, packets sent to a decoder) of a profile."""
    out = dict.fromkeys(NAMES, 0.0)
    packets = 0
    for (file, _, name), (_, calls, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file}:{name}|"
        stage = next((s for s, marks in STAGES if any(m in where for m in marks)), "other")
        out[stage] += own
        if stage == "decode" and name.startswith("<method 'decode'"):
            packets += calls
    return out, packets


def run(cell, rep: int, args, ctx: dict) -> dict:
    workload, path = cell
    row: dict = {"workload": workload, "path": path, "rep": rep, "error": None}
    try:
        reader = _Reader(path, ctx["files"][workload], ctx["reads"][workload], args.fps)
        for _ in range(args.warm):
            reader.one_pass()
        t0 = time.process_time()
        for _ in range(args.passes):
            reader.one_pass()
        cpu = (time.process_time() - t0) / (args.passes * len(reader))
        out0 = reader.frames_out()
        prof = cProfile.Profile()
        t1 = time.process_time()
        prof.runcall(reader.one_pass)
        profiled = (time.process_time() - t1) / len(reader)
        by_stage, packets = stages(pstats.Stats(prof))
        total = sum(by_stage.values()) or 1.0
        row.update(cpu_ms_per_video=1e3 * cpu, profiled_ms_per_video=1e3 * profiled,
                   stages_ms={k: 1e3 * cpu * v / total for k, v in by_stage.items()},
                   packets_per_video=packets / len(reader), frames_out_per_video=(reader.frames_out() - out0) / len(reader),
                   counters={k: v for k, v in reader.counters().items() if isinstance(v, int)})
    except Exception as e:  # noqa: BLE001  one broken row must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["config"]["paths"] = list(args.paths)
    doc["summary"] = {}
    for w in args.workloads:
        for p in args.paths:
            rows = [r for r in runs if r["workload"] == w and r["path"] == p and not r.get("error")]
            if rows:
                doc["summary"].setdefault(w, {})[p] = {
                    "cpu_ms_per_video": float(np.median([r["cpu_ms_per_video"] for r in rows])),
                    "stages_ms": {k: float(np.median([r["stages_ms"][k] for r in rows])) for k in NAMES},
                    "packets_per_video": float(np.median([r["packets_per_video"] for r in rows])),
                    "frames_out_per_video": float(np.median([r["frames_out_per_video"] for r in rows])),
                    "counters": rows[-1]["counters"]}
    doc["notes"] += [f"{r['workload']}/{r['path']}: {r['error']}" for r in runs if r.get("error")]


def markdown(doc: dict) -> str:
    c = doc["config"]
    lines = report.header(doc, "Where a planned Qwen-VL video's CPU goes: shmloader's read against the limit's")
    lines += [(f"One process, no loader: CPU ms per video (`time.process_time`, median of {c['reps']} "
               f"repetitions of {c['passes']} passes after {c['warm']} warm ones), cut into stages by one "
               "profiled pass (each stage's share of the profile times the unprofiled CPU)."), ""]
    for w, paths in doc["summary"].items():
        head = "| stage | " + " | ".join(paths) + " |"
        rows = [f"| {k} | " + " | ".join(f"{s['stages_ms'][k]:.1f}" for s in paths.values()) + " |" for k in NAMES]
        rows.append("| **CPU ms per video** | " + " | ".join(f"**{s['cpu_ms_per_video']:.1f}**"
                                                           for s in paths.values()) + " |")
        rows.append("| packets decoded per video | " + " | ".join(f"{s['packets_per_video']:.0f}"
                                                                 for s in paths.values()) + " |")
        rows.append("| frames out of PyAV per video | " + " | ".join(
            f"{s['frames_out_per_video']:.0f}" if s["frames_out_per_video"] else "–" for s in paths.values()) + " |")
        lines += [f"## {w}", "", *table(head, rows), ""]
        for p, s in paths.items():
            k = s["counters"]
            if k:
                lines.append(f"- {p}: decodes by decord {k.get('decord', 0)}, by PyAV {k.get('pyav', 0)}; measured reads "
                             f"{k.get('measured_reads', 0)}, shapes chosen decord {k.get('chose_decord', 0)} / PyAV "
                             f"{k.get('chose_pyav', 0)}; probes {k.get('probes', 0)}")
        lines += [""]
    return "\n".join(lines + report.tail(doc, plots_heading=None))


BENCH = harness.Benchmark(script="bench/qwen_stages.py", name="qwen-stages-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=lambda doc, folder, name: [],
                          prepare=prepare, label=lambda cell: "/".join(cell), preload=(), retry=False, reps=1)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
