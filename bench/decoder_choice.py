"""Which decoder is faster for which file: PyAV beside decord, one process, random clips, per shape.

The evidence ``decoder="auto"`` chooses by where both decoders are exact (``video.probe``):
each file shape is frames of ``--sizes`` x a GOP of ``--gops`` frames (``0``: x264's default,
a keyframe at most every 250 frames, preset medium, CRF 23, B-frames in a pyramid, as ffmpeg
re-encodes Kinetics; else preset veryfast, CRF 23, a keyframe exactly every G frames, 2 B-frames,
as ``shmloader prepare`` writes) x ``--bframes`` (``yes``: as just said; ``no``: the same
without B-frames, as phones and baseline-profile encoders write), in ``--container`` (MP4, or
MKV: the container decord and PyAV open and seek in), ``--video-count`` textured
frame-code videos of ``--seconds`` each (``workloads.write_textured``). One process decodes
random clips of ``--clip-len`` frames every ``--frame-step``-th at the short side
``--short-side`` (the other side in proportion) for ``--duration`` seconds with each decoder,
``--together`` clips of one video a call: 1, one random clip per call; K, K random clips of one
video decoded in one call over the union of their frames, as the reader does for
``VideoClips(clips_per_video=K, group_clips=True)``. The two decoders run back to back (one block
per shape and K) in interleaved repetitions; CPU milliseconds per delivered clip are the figure
(they do not depend on what else the machine runs), clips/s beside them. The first call of each
run is checked: its frame codes are the frames asked for.

    python bench/decoder_choice.py            # ~8 minutes on 2 cores after writing the videos
"""

from __future__ import annotations

import os
import sys
import time

import harness
import numpy as np
import report
from report import fmt, fmt_ratio, table
from workloads import write_textured, written

DECODERS = ("pyav", "decord")


def options(p) -> None:
    p.add_argument("--sizes", type=lambda t: [harness.size(x) for x in t.split(",")],
                   default=[(128, 170), (256, 340), (480, 640)], help="HxW of the files, comma-separated")
    p.add_argument("--gops", type=harness.ints, default=[16, 0], help="frames per keyframe (0: x264's default)")
    p.add_argument("--bframes", type=harness.names(("yes", "no")), default=["yes", "no"],
                   help="files with B-frames, without, or both")
    p.add_argument("--container", default="mp4", choices=("mp4", "mkv"))
    p.add_argument("--together", type=harness.ints, default=[1, 8],
                   help="clips of one video decoded in one call (1: a random clip per call)")
    p.add_argument("--video-count", type=int, default=2)
    p.add_argument("--seconds", type=int, default=10, help="length of each video (30 fps)")
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--short-side", type=int, default=128, help="clips are decoded at this short side")
    p.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "decoder-choice"))


def _shape(size: tuple[int, int], gop: int, bframes: str, container: str) -> str:
    return (f"{size[0]}x{size[1]} gop {gop or 'x264'}" + ("" if bframes == "yes" else " no B")
            + ("" if container == "mp4" else f" {container.upper()}"))


def write(path: str, video_id: int, size: tuple[int, int], gop: int, bframes: str, seconds: int) -> None:
    options = {"preset": "medium", "crf": "23"} if gop == 0 else {
        "preset": "veryfast", "crf": "23", "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "bf": "2"}
    if bframes == "no":
        options["bf"] = "0"
    write_textured(path, video_id, frames=30 * seconds, size=size, fps=30, gop=gop, options=options)


def prepare(args, notes: list[str]) -> dict:
    from shmloader.video.probe import probe

    os.makedirs(args.cache, exist_ok=True)
    files: dict[str, list] = {}
    probe_ms: dict[str, float] = {}
    for size in args.sizes:
        for gop in args.gops:
            for bf in args.bframes:
                shape, paths = _shape(size, gop, bf, args.container), []
                for i in range(args.video_count):
                    p = os.path.join(args.cache, f"v{i:02d}_{size[0]}x{size[1]}_g{gop}{'_b0' if bf == 'no' else ''}"
                                                 f"_{args.seconds}s.{args.container}")
                    paths.append(written(p, lambda tmp: write(tmp, i, size, gop, bf, args.seconds)))
                infos = [probe(p) for p in paths]
                files[shape] = infos
                cpu0 = time.process_time()  # what a worker pays for a file whose probe it does not keep
                for _ in range(5):
                    for p in paths:
                        probe(p)
                probe_ms[shape] = 1000 * (time.process_time() - cpu0) / (5 * len(paths))
                mb = np.median([os.path.getsize(p) / 1e6 for p in paths])
                k = infos[0].keyframes
                notes.append(f"{shape}: {infos[0].frames} frames, keyframes every "
                             f"{int(np.diff(k).max()) if len(k) > 1 else infos[0].frames} frames at most, "
                             f"{mb:.2f} MB median; auto read them with {infos[0].decoder} at the commit measured"
                             f"{' (' + infos[0].problem + ')' if infos[0].problem else ''}.")
    return {"files": files, "probe_ms": probe_ms}


def _case(shape: str, together: int) -> str:
    return f"{shape}, {together} clip{'s' if together > 1 else ''} a call"


def cells(args, ctx: dict) -> list[list]:
    return [[(shape, k, d) for d in DECODERS] for shape in ctx["files"] for k in args.together]


def _decode_size(info, short: int) -> tuple[int, int]:
    from shmloader.sampling import scaled_size

    return scaled_size(info.height, info.width, short)


def run(cell, rep: int, args, ctx: dict) -> dict:
    from shmloader.samples import read_codes
    from shmloader.video.decord import Decord
    from shmloader.video.pyav import PyAV

    shape, together, name = cell
    infos = ctx["files"][shape]
    decoder = PyAV(1) if name == "pyav" else Decord(1)
    span = (args.clip_len - 1) * args.frame_step + 1
    rng = np.random.default_rng(rep)
    row: dict = {"case": _case(shape, together), "shape": shape, "together": together, "decoder": name, "rep": rep}
    n, bad, cpu0, t0 = 0, 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < args.duration:
        info = infos[int(rng.integers(len(infos)))]
        starts = rng.integers(0, info.frames - span + 1, together)
        frames = np.unique(starts[:, None] + np.arange(0, span, args.frame_step))  # the union, as grouped
        got = decoder.decode(info, _decode_size(info, args.short_side), frames)
        if n == 0:
            bad = int((read_codes(got)[1] != frames).sum())
        n += together
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    row.update(clips=n, clips_per_s=n / wall, cpu_ms_per_clip=1000 * cpu / n, frames_bad=bad)
    return row


METRICS = ("clips_per_s", "cpu_ms_per_clip", "frames_bad")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("case", "decoder"), METRICS)
    doc["cases"] = [{"case": _case(shape, k), "shape": shape, "together": k}
                    for shape in ctx["files"] for k in args.together]
    doc["ratios"] = {c["case"]: report.ratio(runs, {"case": c["case"], "decoder": "decord"},
                                             {"case": c["case"], "decoder": "pyav"}, "cpu_ms_per_clip")
                     for c in doc["cases"]}
    doc["probe_cpu_ms"] = ctx["probe_ms"]
    doc["targets"] = []


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Which decoder is faster for which file (one process, random clips)")
    c = doc["config"]
    lines += [(f"Clips of {c['clip_len']} frames every {c['frame_step']}, decoded at short side "
               f"{c['short_side']}; medians (min-max) over {c['reps']} interleaved repetitions of "
               f"{c['duration']:g} s; CPU ms per clip is the figure that decides. Clips a call: 1, a "
               "random clip per decode call; K, K random clips of one video decoded in one call over "
               "the union of their frames (`group_clips=True`)."), ""]
    rows = []
    for case in doc["cases"]:
        s = {d: doc["summary"].get(case["case"], {}).get(d, {}) for d in DECODERS}
        r = doc["ratios"].get(case["case"])
        rows.append(f"| {case['shape']} | {case['together']} | {fmt(s['pyav'].get('cpu_ms_per_clip'), 1)} | "
                    f"{fmt(s['decord'].get('cpu_ms_per_clip'), 1)} | "
                    f"{fmt_ratio(r)} | "
                    f"{fmt(s['pyav'].get('clips_per_s'), 1)} | {fmt(s['decord'].get('clips_per_s'), 1)} | "
                    f"{fmt(s['pyav'].get('frames_bad'))} / {fmt(s['decord'].get('frames_bad'))} | "
                    f"{_ms(doc.get('probe_cpu_ms', {}).get(case['shape']))} |")
    lines += table("| file shape | clips a call | PyAV CPU ms/clip | decord CPU ms/clip | decord / PyAV | "
                   "PyAV clips/s | decord clips/s | wrong frames (first call) | probe CPU ms |", rows)
    lines += ["", ("Probe CPU ms: one `probe()` of a file, what a worker pays where it keeps no probe of "
                   "it: PyAV seeks by the probe's timestamps, so a scan manifest's row spares it to decord "
                   "alone (median of 5 rounds over the files, before the runs).")]
    ratios = [r["ratio"] for r in doc["ratios"].values() if r]
    if ratios:
        faster = sum(x > 1 for x in ratios)
        lines += ["", (f"PyAV took less CPU per clip in {faster} of {len(ratios)} cases "
                       f"(decord / PyAV {min(ratios):.2f}–{max(ratios):.2f}).")]
    lines += [""]
    return "\n".join(lines + report.tail(doc))


BENCH = harness.Benchmark(script="bench/decoder_choice.py", name="decoder-choice-cpu2", about=__doc__,
                          options=options, cells=cells, run=run, report=finish, markdown=markdown,
                          plot=lambda doc, folder, name: [], prepare=prepare, label=lambda c: f"{_case(c[0], c[1])} {c[2]}",
                          preload=())

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
