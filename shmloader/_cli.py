"""Command line: ``shmloader demo``, ``shmloader scan PATH...``, ``shmloader prepare SRC... --out DST``
and ``shmloader make-videos DIR``.

The help texts here are what a terminal shows: plain text, no reST."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shmloader" / "samples"


def _size(text: str) -> tuple[int, int]:
    """``HxW``, both at least 1 (argparse turns the error into one line and exit 2)."""
    h, _, w = text.lower().partition("x")
    try:
        size = int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HxW (e.g. 112x112)") from None
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: height and width must be at least 1")
    return size


def _at_least(low: int):
    """An argparse type: a whole number >= ``low``."""
    def whole(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is less than {low}")
        return n
    whole.__name__ = f"whole number >= {low}"
    return whole


def _seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return x


def make_videos_cmd(args) -> int:
    from .video.samples import make_videos

    try:
        paths, _ = make_videos(args.dir, count=args.count, frames=args.frames, size=args.size,
                               codec=args.codec, classes=args.classes, audio=args.audio)
    except (ValueError, OSError) as e:  # an odd size for libx264, a folder that cannot be made
        why = f"cannot write videos in {args.dir!r}: {e.strerror}" if isinstance(e, OSError) and e.strerror else e
        print(f"shmloader make-videos: {why}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def measure(paths, labels, workers: int, batches: int, batch_size: int, clip_len: int, size, progress=None):
    """Stream ``batches`` batches through ``as_dataset()``; return throughput and CPU figures."""
    from . import Loader, VideoClips
    from .engine.stats import cpu_seconds

    clips = VideoClips(paths, labels, clip_len=clip_len, frame_step=2, size=size)
    me = os.getpid()
    if progress is not None:
        progress.set_postfix_str(f"workers={workers}, starting")
    t_start = time.perf_counter()
    with Loader(clips, batch_size=batch_size, workers=workers, shuffle=True, epochs=None) as loader:
        kids = loader.worker_pids()
        it = iter(loader.as_dataset())
        next(it)  # warm-up: worker start and the first batch are not throughput
        first = time.perf_counter() - t_start  # from Loader(), the workers' start included: what a script waits
        if progress is not None:
            progress.set_postfix_str(f"workers={workers}")
        main0, kids0, t0 = cpu_seconds([me]), cpu_seconds(kids), time.perf_counter()
        nbytes = 0
        for _ in range(batches):
            b = next(it)
            nbytes += int(b["video"].shape.num_elements())
            if progress is not None:
                progress.update(1)
        dt = time.perf_counter() - t0
        main_s, kids_s = cpu_seconds([me]) - main0, cpu_seconds(kids) - kids0
        del it, b
    clips_n = batches * batch_size
    return {"workers": workers, "clips_s": clips_n / dt, "frames_s": clips_n * clip_len / dt,
            "main_cpu_pct": 100 * main_s / dt, "worker_cpu_pct": 100 * kids_s / dt,
            "main_cpu_s_per_gb": main_s / (nbytes / 1e9), "first_batch_s": first}


def _quiet_tensorflow() -> None:
    """Keep TensorFlow's start-up INFO lines out of the demo's output; warnings still show.

    ``TF_CPP_MIN_LOG_LEVEL=1`` hides INFO logs, but not the "oneDNN custom operations are on"
    line, which TF prints before it reads that variable unless ``TF_ENABLE_ONEDNN_OPTS`` is set:
    the demo does no tensor math, so oneDNN's kernels do not matter to it. A user's own settings win.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def demo_cmd(args) -> int:
    import importlib.util

    from tqdm import tqdm

    missing = [m for m, extra in (("tensorflow", "tf"), ("av", "samples")) if importlib.util.find_spec(m) is None]
    if missing:
        print(f"shmloader demo: needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
              "installed: pip install './shmloader[tf,samples]' from the source (make demo does it)",
              file=sys.stderr)
        return 2
    _quiet_tensorflow()

    from .video.samples import make_videos

    folder = Path(args.videos) if args.videos else _cache_dir()
    print(f"sample videos: {folder}")
    paths, labels = make_videos(folder, count=args.count, frames=64, size=(240, 320))
    from ._cpus import usable_cpus

    cores = usable_cpus()
    workers = args.workers or list(range(1, cores + 1))
    t = time.perf_counter()
    import tensorflow  # noqa: F401  # once per process, before the clock of the first loader starts

    print(f"TensorFlow imported in {time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    with tqdm(total=len(workers) * args.batches, unit="batch", desc="streaming") as bar:
        for w in workers:
            rows.append(measure(paths, labels, w, args.batches, args.batch_size, args.clip_len, args.size, bar))
    h, w_ = args.size
    print(f"\n{args.clip_len}x{h}x{w_} clips, batch {args.batch_size}, through loader.as_dataset(); first batch: "
          "seconds from Loader() to the first batch, the workers' start included:\n")
    print(f"{'workers':>7} {'clips/s':>8} {'frames/s':>9} {'CPU% main':>9} {'CPU% workers':>12} {'first batch s':>13}")
    for r in rows:
        print(f"{r['workers']:>7} {r['clips_s']:>8.1f} {r['frames_s']:>9.0f} {r['main_cpu_pct']:>9.0f} "
              f"{r['worker_cpu_pct']:>12.0f} {r['first_batch_s']:>13.2f}")
    if len(rows) > 1:
        load = os.getloadavg()[0]
        a, b = rows[-1]["workers"], rows[0]["workers"]
        print(f"\n{a} worker{'s' * (a != 1)} / {b} worker{'s' * (b != 1)}: "
              f"{rows[-1]['clips_s'] / rows[0]['clips_s']:.2f}x from one run of {args.batches} batches each; "
              f"load average {load:.1f} on {cores} cores: what else runs on them moves this ratio between runs "
              f"(--batches 64 measures longer)")
    print("next: your own videos: shmloader scan VIDEOS/ --out manifest.csv, then "
          "shmloader.VideoClips.from_csv('manifest.csv', ...); loader.stats_line() says whether training waits "
          "for input and how many workers to use (README.md, docs/getting-started.md)")
    return 0


def earlier_line(summary: dict) -> str:
    """What became of the rows of an earlier run, for the summary line ('' where there were none)."""
    resumed, rechecked = summary["resumed"], summary["rechecked"]
    if not resumed:
        return ""
    again = sum(rechecked.values())
    why = ", ".join(f"{reason}: {n}" for reason, n in sorted(rechecked.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"; {resumed} rows from an earlier run: {summary['kept']} kept, {again} probed again"
            + (f" ({why})" if why else ""))


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def scan_cmd(args) -> int:
    """``shmloader scan``: exit 0, or 1 when ``--fail-on`` kinds were found, 2 for bad input."""
    from .tools.rescan import preparing_pays
    from .tools.scan import check_fail_on, scan

    try:
        fail_on = check_fail_on(args.fail_on or "")
        options = _storage_options(args.storage_options)
        summary = scan(args.paths, args.out, workers=args.workers, check=args.check, timeout=args.timeout,
                       overwrite=args.overwrite, progress=not args.quiet, storage_options=options,
                       fail_on=fail_on, measure_cut=args.measure_cut)
    except (ValueError, ImportError, OSError) as e:
        print(f"shmloader scan: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _stopped(f"shmloader scan: stopped; {args.out} lists the files probed, and the same command again "
                        "probes the rest")
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    rows, bad = summary["rows"], summary["unreadable"]
    decoders = ", ".join(f"{n} by {name}" for name, n in sorted(summary["decoders"].items()))
    say(f"{_files(rows)} in {args.out}: {rows - bad} readable" + (f" ({decoders})" if decoders else "")
        + f", {bad} unreadable" + earlier_line(summary))
    _problems(summary, say)
    if summary["unlabelled"]:
        n = summary["unlabelled"]
        say(f"{_files(n)} {'has' if n == 1 else 'have'} no label (-1): {'it is' if n == 1 else 'they are'} not in "
            "class sub-folders of a folder given (nor labelled by an input manifest or a shard's .cls)")
    skipped = summary["passed_over"]
    if skipped:
        kinds = ", ".join(f"{ext} {n}" for ext, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        say(f"passed over {_files(sum(skipped.values()))} without a video extension ({kinds})")
    if summary["failed"]:
        say(f"shmloader scan: exit 1: {_files(summary['failed'])} with a problem of --fail-on {args.fail_on}")
        return 1
    pays = preparing_pays(summary)
    if pays:
        why, flags = pays
        at = f" at short side {flags[1]}" if flags[0] == "--short-side" else ""
        say(f"one clip per sample over these files: {why}; copies{at} with a keyframe every 16 frames read "
            "random clips faster (the guide's 'Preparing a dataset'):\n  "
            + _prepare_command(args.paths, flags, args.storage_options))
    say(f"next: shmloader.VideoClips.from_csv({args.out!r}, ...) loads it"
        + (" (unreadable rows are left out)" if bad else ""))
    return 0


def _stopped(message: str) -> int:
    """Exit 130 after a Ctrl-C, in one line (NOTE [ A stop that leaves every output whole ]): the
    stop is done, and a Ctrl-C more must not turn the exit into a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(message, file=sys.stderr)
    return 130


def _problems(summary: dict, say) -> None:
    """Each kind of problem a scan's or a prepare's rows have, counted, with its first file."""
    if summary["problems"]:
        say("problems (the manifest's problem column), with the first file of each:")
    for kind, n in sorted(summary["problems"].items(), key=lambda kv: -kv[1]):
        path, text = summary["first"].get(kind, ("", ""))
        text = text.removesuffix(f": {path!r}")  # FFmpeg's errors end with the path, said just before
        say(f"  {kind}: {_files(n)}" + (f", {path}: {text}" if path else ""))


def _prepare_command(inputs: list[str], options: list[str], storage_options: str | None) -> str:
    """``shmloader prepare`` of a scan's inputs, the copies beside the outermost folder given
    (``videos/`` -> ``videos-prepared``: never inside a folder given), else in ``prepared``."""
    import shlex

    folders = sorted((p for p in inputs if os.path.isdir(p)), key=lambda p: os.path.abspath(p).count(os.sep))
    out = "prepared"
    if folders:
        out = os.path.abspath(folders[0]).rstrip(os.sep) + "-prepared"
        out = out if os.path.isabs(folders[0]) else os.path.relpath(out)
    words = ["shmloader", "prepare", *inputs, "--out", out, *options]
    if storage_options:
        words += ["--storage-options", storage_options]
    return " ".join(map(shlex.quote, words))


def _storage_options(text: str | None) -> dict | None:
    """``--storage-options``: a JSON object, or None; ValueError in words otherwise."""
    if not text:
        return None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--storage-options is not JSON ({e}): {text!r}") from None
    if not isinstance(options, dict):
        # ValueError, not TypeError: what the commands report as bad input (exit 2)
        raise ValueError(f"--storage-options must be a JSON object ({{...}}), got {text!r}")  # noqa: TRY004
    return options


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.0f} kB"


def prepare_cmd(args) -> int:
    """``shmloader prepare``: exit 0, or 1 when ``--fail-on`` kinds were found, 2 for bad input."""
    from .tools.prepare import prepare_files
    from .tools.scan import check_fail_on

    try:
        fail_on = check_fail_on(args.fail_on or "")
        summary = prepare_files(args.sources, args.out, short_side=args.short_side, size=args.size, gop=args.gop,
                                crf=args.crf, workers=args.workers, timeout=args.timeout, fail_on=fail_on,
                                progress=not args.quiet,
                                storage_options=_storage_options(args.storage_options))
    except (ValueError, ImportError, OSError) as e:
        print(f"shmloader prepare: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _stopped(f"shmloader prepare: stopped; {os.path.join(args.out, 'manifest.csv')} lists the copies "
                        "finished, and the same command again prepares the rest")

    def say(text: str) -> None:
        print(text, file=sys.stderr)

    rows, bad, made = summary["rows"], summary["unreadable"], summary["prepared"]
    ratio = summary["copy_bytes"] / summary["source_bytes"] if summary["source_bytes"] else 0.0
    say(f"{_files(rows)} in {summary['manifest']}: {made} prepared in {summary['seconds']:.1f} s, "
        f"{summary['kept']} kept from an earlier run, {bad} could not be prepared; copies "
        f"{_megabytes(summary['copy_bytes'])}, {ratio:.2f}x their sources' {_megabytes(summary['source_bytes'])}")
    _problems(summary, say)
    if summary["unlabelled"]:
        say(f"{_files(summary['unlabelled'])} without a label (-1): not in class sub-folders of a folder given "
            "(nor labelled by an input manifest or a shard's .cls)")
    if summary["failed"]:
        say(f"shmloader prepare: exit 1: {_files(summary['failed'])} with a problem of --fail-on {args.fail_on}")
        return 1
    say(f"next: shmloader.VideoClips.from_csv({summary['manifest']!r}, ...) loads the copies"
        + (" (rows that could not be prepared are left out)" if bad else ""))
    return 0


_DESCRIPTION = "shmloader: decode video clips in worker processes into a shared-memory ring, for tf.data, " \
               "PyTorch, JAX and Keras."
_EPILOG = "`shmloader COMMAND --help` for a command's options. The Python API and the guides: README.md " \
          "and docs/ in the source, or the package's documentation."


class _Formatter(argparse.HelpFormatter):
    """The commands listed one a line, without argparse's ``COMMAND`` line above them."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        if isinstance(action, argparse._SubParsersAction):
            text = text.split("\n", 1)[1]
        return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A missing command prints the list of commands, not argparse's ``required: cmd``; any other
        error is one line."""
        if "required: COMMAND" in message:
            self.print_help(sys.stderr)
            self.exit(2, "\nshmloader: say which command to run (demo, scan, prepare or make-videos)\n")
        # One line, without argparse's usage block: what is wrong and where the options are.
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="shmloader", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"shmloader {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, title="commands", metavar="COMMAND")
    d = sub.add_parser("demo", help="stream sample videos through loader.as_dataset() with 1..N workers; "
                                    "print clips/s and CPU", description="Write sample videos (once) and stream "
                       "them through loader.as_dataset() with 1, 2, ... workers; print clips/s, CPU and the "
                       "time to the first batch. Needs TensorFlow and PyAV: pip install './shmloader[tf,samples]' from the source.")
    d.add_argument("--videos", help="folder for the sample videos (default: the user cache)")
    d.add_argument("--count", type=_at_least(1), default=12, help="sample videos to make (default 12)")
    d.add_argument("--workers", type=_at_least(1), nargs="*", help="worker counts (default 1..cores)")
    d.add_argument("--batches", type=_at_least(1), default=16, help="batches measured per worker count (default 16)")
    d.add_argument("--batch-size", type=_at_least(1), default=8, help="clips per batch (default 8)")
    d.add_argument("--clip-len", type=_at_least(1), default=16, help="frames per clip, every 2nd frame (default 16)")
    d.add_argument("--size", type=_size, default=(112, 112), help="HxW (default 112x112)")
    d.set_defaults(fn=demo_cmd)
    m = sub.add_parser("make-videos", help="write synthetic videos whose frames say which video and frame they "
                                           "are", description="Write synthetic videos whose frames encode the "
                       "video's id and the frame's number (shmloader.samples.read_codes reads them back); print "
                       "their paths.")
    m.add_argument("dir", help="folder to write them in")
    m.add_argument("--count", type=_at_least(1), default=8, help="videos to write (default 8)")
    m.add_argument("--frames", type=_at_least(1), default=48, help="frames per video (default 48)")
    m.add_argument("--size", type=_size, default=(96, 128), help="HxW (default 96x128)")
    m.add_argument("--codec", default="libx264", choices=["libx264", "mpeg4"], help="encoder (default libx264)")
    m.add_argument("--audio", action="store_true", help="a sound track too: a tone of 440 + 20 i Hz for video i")
    m.add_argument("--classes", type=_at_least(1), default=2, help="classes in shmloader.samples.make_videos' labels: video i has label i %% N (default 2)")
    m.set_defaults(fn=make_videos_cmd)
    s = sub.add_parser("scan", help="probe videos into a manifest: frames, size, decoder, problems",
                       description="Probe every video once, in worker processes, into a CSV manifest (frames, "
                       "size, fps, decoder, problem) that VideoClips.from_csv loads without probing again. "
                       "Exit status: 0 when the manifest is written; 1 when --fail-on kinds were found; 2 for "
                       "bad arguments or inputs.")
    s.add_argument("paths", nargs="+", help="folders (class sub-folders give labels), manifests (.csv/.json), "
                                          "lists (.txt, one path per line) or video files; URLs of files, "
                                          "prefixes (s3://bucket/videos/) and tar shards (shard-{000..009}.tar)")
    s.add_argument("--out", default="manifest.csv", help="the CSV manifest to write (default manifest.csv); "
                                                        "an existing one of the same inputs is resumed")
    s.add_argument("--workers", type=_at_least(1), help="probing processes (default: one per CPU)")
    s.add_argument("--check", default="keyframes", choices=["headers", "keyframes", "frames"],
                   help="headers: packets only; keyframes (default): decode every keyframe; frames: every frame")
    s.add_argument("--timeout", type=_seconds, default=120.0,
                   help="seconds one file may take (default %(default)s)")
    s.add_argument("--overwrite", action="store_true", help="start again instead of resuming --out")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--fail-on", metavar="KINDS",
                   help="exit 1 when a row has one of these problems (comma-separated): any, unreadable, damaged, "
                        "truncated, 'size change', 'edit list', 'timestamp gap', ... (see the guide's scan page); "
                        "without it a scan exits 0 whatever it finds")
    s.add_argument("--storage-options", metavar="JSON",
                   help='for URLs: fsspec options as JSON, e.g. \'{"client_kwargs": {"endpoint_url": "..."}}\'')
    s.add_argument("--measure-cut", metavar="LEN,STEP[,HxW[,K]]", help="time both decoders on a few clips of this cut "
                   "(e.g. 16,2,112x112) where both read a file exactly: the faster in its decoder column, the "
                   "CPU ms a read in decord_ms and pyav_ms")
    s.set_defaults(fn=scan_cmd)
    p = sub.add_parser("prepare", help="copies of the videos made for training: the training size, a keyframe "
                                       "every G frames, a manifest",
                       description="Decode every video and encode it again, in worker processes, at the "
                       "training size with a keyframe every G frames (H.264, frame i of the copy is frame i of "
                       "the source as the loader reads it, with its time), into DST with the sources' relative "
                       "paths, and DST/manifest.csv (scan's columns) that VideoClips.from_csv loads without "
                       "probing. A run into a DST prepared before keeps the copies whose sources are unchanged. "
                       "Exit status: 0 when the manifest is written; 1 when --fail-on kinds were found; 2 for "
                       "bad arguments or inputs.")
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="folders (class sub-folders give labels), manifests (.csv/.json), lists (.txt) or video "
                        "files; URLs of files, prefixes (s3://bucket/videos/) and tar shards")
    p.add_argument("--out", required=True, metavar="DST",
                   help="the folder of the copies (never inside a source folder)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--short-side", type=_at_least(2), metavar="N",
                      help="scale the shorter side to N, keeping the aspect ratio (e.g. 128; VideoMAE-style: 320)")
    size.add_argument("--size", type=_size, metavar="HxW",
                      help="scale to HxW (R(2+1)D-style: 128x171; an odd side is rounded up to even)")
    p.add_argument("--gop", type=_at_least(1), default=16, metavar="G",
                   help="a keyframe every G frames (default 16): a random clip decodes at most G-1 frames more")
    p.add_argument("--crf", type=_at_least(0), default=23, metavar="Q",
                   help="x264's quality, 0-51, lower is better and larger (default 23)")
    p.add_argument("--workers", type=_at_least(1), help="processes, one core each (default: one per CPU)")
    p.add_argument("--timeout", type=_seconds, default=3600.0,
                   help="seconds one file may take (default 3600); it is tried once more alone with twice "
                        "the time, and its row then says so")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--fail-on", metavar="KINDS",
                   help="exit 1 when a row has one of these problems (comma-separated, as scan's): unreadable "
                        "(a file that could not be prepared), any, 'timestamp gap', ...; without it prepare "
                        "exits 0 whatever it finds")
    p.add_argument("--storage-options", metavar="JSON", help="for URLs: fsspec options as JSON")
    p.set_defaults(fn=prepare_cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
