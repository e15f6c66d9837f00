"""What a clip's audio costs: Kinetics-style files with an AAC track, read with and without it.

The files: ``--video-count`` textured frame-code videos (``workloads.write_textured``) of
``--seconds`` s at 340x256, 30 fps, as ffmpeg's defaults re-encode Kinetics (x264 preset medium,
CRF 23, its default GOP: a keyframe at most every 250 frames, B-frames), each with an AAC-LC
stereo track at ``--source-rate`` Hz, 128 kbit/s (``workloads._AacTrack``). Every arm reads the
same files through ``shmloader.Loader(VideoClips(...)).as_dataset()`` at ``--workers`` workers:
random clips of ``--clip-len`` frames every ``--frame-step``-th, the short side scaled to
``--scale``, a centre crop of ``--crop`` x ``--crop``. Arms, one block (side by side, in
interleaved repetitions):

* ``video``: one clip per sample, no audio (``audio_rate=None``: the track is never read);
* ``video+audio``: the same with ``audio_rate=--audio-rate``, ``audio_channels=--audio-channels``
  (16 kHz mono: the worker decodes the AAC span and resamples and mixes it);
* ``grouped``, ``grouped+audio``: ``clips_per_sample=--group`` clips of one video in a sample,
  decoded in one pass, without and with the audio; batches of ``--batch-size / --group`` samples,
  so that every arm delivers ``--batch-size`` clips a batch;
* ``alone``, ``alone+audio``: one clip per sample in one process, no loader: the loader's reader
  (``VideoClips.reader().read``) in the loader's sample order, without and with the audio (what
  the reader costs, apart from the workers, the ring and the consumer).

Per arm: clips/s at the consumer and CPU milliseconds per delivered clip (main process and
workers: what a clip costs whatever else the machine runs); per pair, the ratio with / without
audio of both. CPU per clip is the figure the target reads.

    python bench/audio.py            # ~6 minutes on 2 cores after writing the videos
    python bench/audio.py --video-count 2 --duration 1 --alone-duration 1 --reps 1 --no-plots  # it runs
"""

from __future__ import annotations

import os
import sys

import harness
import numpy as np
import report
from report import fmt, fmt_ratio, table
from workloads import ClipSet, Workload, write_textured, written

ARMS = ("video", "video+audio", "grouped", "grouped+audio", "alone", "alone+audio")
PAIRS = {"one clip per sample": ("video+audio", "video"), "grouped": ("grouped+audio", "grouped"),
         "one process, one clip per sample": ("alone+audio", "alone")}
TARGET = 1.15  # issue 45: the audio adds at most 15 % to a clip's CPU cost at W=2
TARGETED = ("one clip per sample", "grouped")  # the loader's pairs (the one-process pair explains them)


def options(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--video-count", type=int, default=16)
    p.add_argument("--seconds", type=int, default=10, help="length of each video (30 fps)")
    p.add_argument("--source-rate", type=int, default=44100, help="Hz of the files' AAC stereo track")
    p.add_argument("--audio-rate", type=int, default=16000, help="Hz the loader delivers")
    p.add_argument("--audio-channels", type=int, default=1, choices=(1, 2))
    p.add_argument("--clip-len", type=int, default=16)
    p.add_argument("--frame-step", type=int, default=2)
    p.add_argument("--scale", type=int, default=128, help="short side the frames are scaled to")
    p.add_argument("--crop", type=int, default=112, help="centre crop, crop x crop")
    p.add_argument("--group", type=int, default=8, help="clips_per_sample of the grouped arms")
    p.add_argument("--batch-size", type=int, default=8, help="clips a batch (grouped: batch-size / group samples)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per loader run, at least")
    p.add_argument("--alone-duration", type=float, default=6.0, help="seconds measured per one-process run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--arms", type=harness.names(ARMS), default=list(ARMS))
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "kinetics-audio"))


def write_kinetics_av(path: str, video_id: int, seconds: int, rate: int) -> str:
    """A Kinetics-style re-encode (x264 preset medium, CRF 23, default GOP, 340x256, 30 fps)
    with an AAC stereo track at ``rate`` Hz."""
    return write_textured(path, video_id, frames=30 * seconds, size=(256, 340), fps=30, gop=0,
                          options={"preset": "medium", "crf": "23"}, audio_rate=rate)


def _track(path: str) -> str:
    """The file's audio stream in words: codec, rate, channels, kbit/s."""
    import av

    with av.open(path) as c:
        s = c.streams.audio[0]
        return (f"{s.codec_context.name} {s.codec_context.sample_rate} Hz, {len(s.codec_context.layout.channels)} "
                f"channels, {(s.bit_rate or 0) / 1e3:.0f} kbit/s")


def prepare(args, notes: list[str]) -> dict:
    import shmloader
    from shmloader.video.probe import probe

    os.makedirs(args.cache, exist_ok=True)
    paths = []
    for i in range(args.video_count):
        p = os.path.join(args.cache, f"kinetics_av_{i:03d}_{args.seconds}s_{args.source_rate}hz.mp4")
        paths.append(written(p, lambda tmp: write_kinetics_av(tmp, i, args.seconds, args.source_rate)))
    info = probe(paths[0])
    mbps = np.median([os.path.getsize(p) * 8 / args.seconds / 1e6 for p in paths])
    notes.append(f"Videos: {args.video_count} x {info.frames} frames {info.width}x{info.height} at {info.fps:g} fps, "
                 f"libx264 preset medium CRF 23, default GOP (keyframes of the first: {info.keyframes.tolist()}), "
                 f"B-frames; audio {_track(paths[0])}; {mbps:.2f} Mbit/s median in all; textured frame codes "
                 f"(workloads.write_textured). decoder='auto' reads the frames with {info.decoder}.")
    # What the audio arms deliver, read once outside the runs: the clip's sound is there.
    one = shmloader.VideoClips(paths[:1], clip_len=args.clip_len, frame_step=args.frame_step, size=None,
                               scale=args.scale, crop=(args.crop, args.crop), audio_rate=args.audio_rate,
                               audio_channels=args.audio_channels).reader().read([0])
    rms = float(np.sqrt((one["audio"][0, : int(one["audio_len"][0])] ** 2).mean()))
    notes.append(f"A clip's audio: {one['audio'].shape[1]} samples x {one['audio'].shape[2]} channel(s) at "
                 f"{args.audio_rate} Hz (audio_len {int(one['audio_len'][0])} in the first file's sample 0, "
                 f"RMS {rms:.3f}).")
    wl = Workload("kinetics-audio", args.clip_len, (args.crop, args.crop), 0, "random clips",
                  frame_step=args.frame_step)
    return {"clips": ClipSet(tuple(paths), tuple(i % 2 for i in range(len(paths)))), "wl": wl}


def cells(args, ctx: dict) -> list[list]:
    return [list(args.arms)]  # one block: every arm back to back


def _arm_options(arm: str, args) -> tuple[dict, int, int]:
    """(VideoClips options, samples a batch, clips a sample) of ``arm``."""
    opts: dict = {"size": None, "scale": args.scale, "crop": (args.crop, args.crop)}
    if arm.endswith("+audio"):
        opts.update(audio_rate=args.audio_rate, audio_channels=args.audio_channels)
    if arm.startswith("grouped"):
        opts.update(clips_per_video=1, clips_per_sample=args.group)
        return opts, max(1, args.batch_size // args.group), args.group
    return opts, args.batch_size, 1


def _alone(clips: ClipSet, wl: Workload, opts: dict, args, res) -> None:
    import shmloader
    from measure import reader_step, run_timed
    from workloads import CLIPS_PER_VIDEO

    reader = shmloader.VideoClips(list(clips.paths), list(clips.labels), clip_len=wl.clip_len,
                                  frame_step=wl.frame_step, clips_per_video=CLIPS_PER_VIDEO, **opts).reader()
    run_timed(reader_step(reader, len(clips.paths), CLIPS_PER_VIDEO), args.alone_duration, res)


def run(arm: str, rep: int, args, ctx: dict) -> dict:
    import loaders
    from measure import Result, row_of, run_pipeline

    clips, wl = ctx["clips"], ctx["wl"]
    opts, batch, k = _arm_options(arm, args)
    res = Result(arm, wl.name, "1" if arm.startswith("alone") else str(args.workers), rep)

    def measure() -> None:
        if arm.startswith("alone"):
            _alone(clips, wl, opts, args, res)
        else:
            run_pipeline(lambda: loaders.shm(clips, wl, args.workers, batch, whole_epochs=k > 1, **opts),
                         res, clip_len=wl.clip_len, clip_bytes=wl.clip_bytes, duration=args.duration,
                         warmup=args.warmup, clips_per_sample=k)

    return row_of(res, measure, arm=arm)


METRICS = ("clips_per_s", "cpu_ms_per_clip", "workers_cpu_pct", "main_cpu_pct", "other_cpu_pct")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("arm",), METRICS)
    pairs = {name: ab for name, ab in PAIRS.items() if set(ab) <= set(args.arms)}
    doc["ratios"] = {name: {m: report.ratio(runs, {"arm": a}, {"arm": b}, m) for m in ("cpu_ms_per_clip", "clips_per_s")}
                     for name, (a, b) in pairs.items()}
    doc["targets"] = []
    for name, r in doc["ratios"].items():
        if name not in TARGETED:
            continue
        cpu = r["cpu_ms_per_clip"]
        doc["targets"].append({"target": f"{name}: CPU ms per clip with / without audio <= {TARGET}",
                               "ratio": cpu and cpu["ratio"], "met": bool(cpu and cpu["ratio"] <= TARGET)})


ABOUT = {"video": "one clip per sample, no audio", "video+audio": "one clip per sample, audio",
         "grouped": "clips_per_sample={k}, no audio", "grouped+audio": "clips_per_sample={k}, audio",
         "alone": "one process, the reader alone, no audio", "alone+audio": "one process, the reader alone, audio"}


def markdown(doc: dict) -> str:
    lines = report.header(doc, "What a clip's audio costs: Kinetics-style files with an AAC track")
    c = doc["config"]
    ch = "mono" if c["audio_channels"] == 1 else "stereo"
    lines += [(f"W={c['workers']}, random clips of {c['clip_len']} frames every {c['frame_step']}, short side "
               f"{c['scale']}, centre crop {c['crop']}x{c['crop']}, {c['batch_size']} clips a batch, through "
               f"`Loader.as_dataset()`; audio arms: {c['audio_rate']} Hz {ch}. Medians (min-max) over "
               f"{c['reps']} interleaved repetitions of at least {c['duration']:g} s."), ""]
    rows = []
    for arm in c["arms"]:
        s = doc["summary"].get(arm, {})
        rows.append(f"| {ABOUT[arm].format(k=c['group'])} | {fmt(s.get('clips_per_s'), 1)} | "
                    f"{fmt(s.get('cpu_ms_per_clip'), 1)} | {fmt(s.get('workers_cpu_pct'))} | "
                    f"{fmt(s.get('main_cpu_pct'))} | {fmt(s.get('other_cpu_pct'))} |")
    lines += table("| arm | clips/s | CPU ms/clip | workers CPU % | main CPU % | other load % |", rows)
    lines += [""]
    lines += table("| with / without audio | CPU ms per clip | clips/s |",
                   [f"| {name} | {fmt_ratio(r['cpu_ms_per_clip'])} | {fmt_ratio(r['clips_per_s'])} |"
                    for name, r in doc["ratios"].items()])
    lines += [""] + report.target_lines(doc["targets"])
    lines += [""]
    return "\n".join(lines + report.tail(doc))


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    arms = [a for a in doc["config"]["arms"] if doc["summary"].get(a, {}).get("clips_per_s")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    colors = ["#3182bd" if a.endswith("+audio") else "#9ecae1" for a in arms]
    for ax, metric, label in zip(axes, ("clips_per_s", "cpu_ms_per_clip"), ("clips/s", "CPU ms per clip")):
        report.bars(ax, arms, [doc["summary"][a][metric] for a in arms], colors, horizontal=True)
        ax.set_xlabel(label)
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/audio.py", name="audio-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          label=str, reps=5)

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
