"""Converting decoded frames: YUV to RGB and the resize, per frame, against today's filter graph.

Every frame PyAV decodes goes through ``shmloader.video.pyav._Scaler``: a libavfilter graph
``scale=W:H,format=rgb24`` on one thread, built as decord builds its own, so that PyAV's pixels
equal decord's (``decoder="auto"`` may switch between the two within a run). This script times
that conversion and the alternatives the wheels offer, one frame at a time, on yuv420p frames
PyAV decoded from textured H.264 files (``workloads.write_textured``: a panning noise texture
under frame codes, libx264 preset medium CRF 23, as ffmpeg re-encodes Kinetics), and compares
each alternative's pixels with today's.

Cuts (source W x H -> output W x H): 112x112 and 224x224 at their own size (a copy ``prepare``
made at the clip's size), 340x256 -> 112x112 and native, 640x480 -> 224x224, 1280x720 -> 112x112
and native. Rows (one block per cut, the rows of a block interleaved over
``--reps`` repetitions; each run converts the cut's ``--frames`` frames in turn for at least
``--duration`` s into one preallocated array, as ``PyAV.decode`` writes a clip):

* ``graph``: today's ``_Scaler`` (swscale's default flags, ``bicubic``), its output copied into
  the array;
* ``graph-view``: the same without that copy (PyAV writes no filter or scaler output into a
  given array: ``to_ndarray`` and ``reformat`` take none), what the copy costs;
* ``reformat``: ``VideoFrame.reformat(w, h, "rgb24", interpolation="BICUBIC", threads=1)``,
  PyAV's cached SwsContext with the graph's flags and no filter graph;
* ``graph-bilinear``, ``graph-fast-bilinear``, ``graph-area``: the graph with other swscale flags;
* ``opencv-cubic``, ``opencv-linear``, ``opencv-area``: OpenCV (one thread): the frame's planes
  packed as I420 (``to_ndarray()``), ``cvtColor(COLOR_YUV2RGB_I420)`` at the source size, then
  ``resize`` into the array with that interpolation;
* ``opencv-planes-area``: the Y, U and V planes each resized (``INTER_AREA``) into a small I420
  buffer, then one ``cvtColor`` into the array (even output sizes only).

At a native cut no row scales: the OpenCV rows are one ``cvtColor``. Pixel differences are
against ``graph`` (grey levels, max and mean |difference| over every frame of the cut). After the
runs, once: the same differences on two colour variants of the 340x256 file (BT.709 limited
range, tagged so; BT.601 full range, tagged so), and decord's own frames (``VideoReader`` at each
cut) against ``graph``.

The OpenCV rows need ``opencv-python-headless`` (not a dependency of shmloader): installed
aside, e.g. ``pip install --no-deps --target /tmp/cv opencv-python-headless`` and
``PYTHONPATH=/tmp/cv``; without it they are left out (said in the notes).

    python bench/convert.py                  # ~7 minutes on 2 cores after writing the videos
    python bench/convert.py --rows graph,reformat --cuts "340x256 -> 112x112" --reps 3
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import harness
import numpy as np
import report
from report import fmt, table
from workloads import write_textured, written

# (name, source H x W, output H x W)
CUTS = (("112x112 -> native", (112, 112), (112, 112)),
        ("224x224 -> native", (224, 224), (224, 224)),
        ("340x256 -> 112x112", (256, 340), (112, 112)),
        ("340x256 -> native", (256, 340), (256, 340)),
        ("640x480 -> 224x224", (480, 640), (224, 224)),
        ("1280x720 -> 112x112", (720, 1280), (112, 112)),
        ("1280x720 -> native", (720, 1280), (720, 1280)))
CUT_NAMES = tuple(c[0] for c in CUTS)
GRAPH_OPTIONS = {"graph": None, "graph-view": None, "graph-bilinear": "flags=bilinear",
                 "graph-fast-bilinear": "flags=fast_bilinear", "graph-area": "flags=area"}
OPENCV_ROWS = ("opencv-cubic", "opencv-linear", "opencv-area", "opencv-planes-area")
ROWS = ("graph", "graph-view", "reformat", "graph-bilinear", "graph-fast-bilinear", "graph-area") + OPENCV_ROWS
ABOUT = {"graph": "today: filter graph `scale,format=rgb24` (swscale bicubic), copied into the array",
         "graph-view": "the same graph, its output not copied",
         "reformat": "PyAV `reformat` (swscale bicubic, threads=1), no filter graph",
         "graph-bilinear": "filter graph, swscale `bilinear`",
         "graph-fast-bilinear": "filter graph, swscale `fast_bilinear`",
         "graph-area": "filter graph, swscale `area`",
         "opencv-cubic": "OpenCV cvtColor I420 + resize INTER_CUBIC",
         "opencv-linear": "OpenCV cvtColor I420 + resize INTER_LINEAR",
         "opencv-area": "OpenCV cvtColor I420 + resize INTER_AREA",
         "opencv-planes-area": "OpenCV: planes resized (INTER_AREA), then cvtColor I420"}
ENCODE = {"preset": "medium", "crf": "23"}


def options(p) -> None:
    p.add_argument("--frames", type=int, default=24, help="frames decoded per source, converted in turn")
    p.add_argument("--duration", type=float, default=1.0, help="seconds measured per run, at least")
    p.add_argument("--rows", type=harness.names(ROWS), default=list(ROWS))
    p.add_argument("--cuts", type=harness.names(CUT_NAMES), default=list(CUT_NAMES))
    p.add_argument("--cache", default=os.path.join(harness.ROOT, ".cache", "convert"))


# ------------------------------------------------------------------------- the converters
class Graph:
    """``scale=W:H[:OPTIONS],format=rgb24`` on one thread: today's ``_Scaler`` where ``options``
    is None, else ``_Scaler`` with those options of the scale filter."""

    def __init__(self, options: str | None) -> None:
        from shmloader.video.pyav import _Scaler

        self._scaler = _Scaler(options or "")

    def __call__(self, frame, w: int, h: int) -> np.ndarray:
        return self._scaler(frame, w, h)


def _reformat(frame, w: int, h: int) -> np.ndarray:
    try:
        out = frame.reformat(width=w, height=h, format="rgb24", interpolation="BICUBIC", threads=1)
    except TypeError:  # a PyAV before threads= (its sws_scale runs on one thread)
        out = frame.reformat(width=w, height=h, format="rgb24", interpolation="BICUBIC")
    return out.to_ndarray()


def converter(row: str):
    """``convert(frame, dest)``: the frame as RGB at ``dest``'s size, written into ``dest``."""
    if row in GRAPH_OPTIONS:
        g = Graph(GRAPH_OPTIONS[row])
        if row == "graph-view":
            return lambda f, dest: g(f, dest.shape[1], dest.shape[0])

        def graph(f, dest):
            dest[...] = g(f, dest.shape[1], dest.shape[0])
        return graph
    if row == "reformat":
        def reformat(f, dest):
            dest[...] = _reformat(f, dest.shape[1], dest.shape[0])
        return reformat
    import cv2

    cv2.setNumThreads(1)
    if row == "opencv-planes-area":
        small: dict = {}

        def planes(f, dest):
            h, w = dest.shape[:2]
            if (f.height, f.width) == (h, w):
                return cv2.cvtColor(f.to_ndarray(), cv2.COLOR_YUV2RGB_I420, dst=dest)
            buf = small.get((h, w))
            if buf is None:
                buf = small[(h, w)] = np.empty((h * 3 // 2, w), np.uint8)
            flat, q = buf.reshape(-1), h * w // 4
            half = (h // 2, w // 2)
            targets = (buf[:h], flat[h * w: h * w + q].reshape(half), flat[h * w + q:].reshape(half))
            for plane, pw, ph, target in zip(f.planes, (f.width, f.width // 2, f.width // 2),
                                             (f.height, f.height // 2, f.height // 2), targets):
                src = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:ph, :pw]
                cv2.resize(src, (target.shape[1], target.shape[0]), dst=target, interpolation=cv2.INTER_AREA)
            cv2.cvtColor(buf, cv2.COLOR_YUV2RGB_I420, dst=dest)
        return planes
    inter = {"opencv-cubic": cv2.INTER_CUBIC, "opencv-linear": cv2.INTER_LINEAR, "opencv-area": cv2.INTER_AREA}[row]

    def opencv(f, dest):
        h, w = dest.shape[:2]
        if (f.height, f.width) == (h, w):
            return cv2.cvtColor(f.to_ndarray(), cv2.COLOR_YUV2RGB_I420, dst=dest)
        rgb = cv2.cvtColor(f.to_ndarray(), cv2.COLOR_YUV2RGB_I420)
        cv2.resize(rgb, (w, h), dst=dest, interpolation=inter)
    return opencv


def convert_all(row: str, frames: list, size: tuple[int, int]) -> np.ndarray:
    """Every frame through ``row``'s converter: ``[n, h, w, 3]``."""
    out = np.empty((len(frames), *size, 3), np.uint8)
    c = converter(row)
    for f, dest in zip(frames, out):
        got = c(f, dest)
        if got is not None and got is not dest:  # graph-view: the graph's own array
            dest[...] = got
    return out


def differences(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    d = np.abs(a.astype(np.int16) - b)
    return int(d.max()), float(d.mean())


# ------------------------------------------------------------------------- the sources
def decoded(path: str, count: int) -> list:
    import av

    with av.open(path) as c:
        out = []
        for f in c.decode(video=0):
            out.append(f)
            if len(out) == count:
                break
    return out


def write_colour(path: str, src: str, matrix: str, full: bool) -> str:
    """``src``'s frames (as today's graph shows them) encoded again by libx264 in yuv420p with
    the YUV of ``matrix`` ("itu709" or "itu601") at the full or limited range, tagged so."""
    import av

    rgb = convert_all("graph", decoded(src, 10**9), (256, 340))
    space = {"itu709": 1, "itu601": 6}[matrix]
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = 340, 256, "yuv420p"
        s.options = dict(ENCODE)
        cc = s.codec_context
        cc.colorspace, cc.color_range = space, 2 if full else 1
        for img in rgb:
            f = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=matrix, dst_color_range="JPEG" if full else "MPEG")
            f.colorspace, f.color_range = space, 2 if full else 1
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def prepare(args, notes: list[str]) -> dict:
    import av

    os.makedirs(args.cache, exist_ok=True)
    sources = {}
    for size in sorted({src for name, src, _ in CUTS if name in args.cuts} | {(256, 340)}):
        h, w = size
        path = os.path.join(args.cache, f"textured_{w}x{h}.mp4")
        sources[size] = written(path, lambda tmp, size=size: write_textured(tmp, 1, frames=60, size=size, fps=30,
                                                                             gop=0, options=dict(ENCODE)))
    rows = list(args.rows)
    try:
        import cv2

        notes.append(f"OpenCV {cv2.__version__} (opencv-python-headless, installed aside), one thread.")
    except ImportError:
        rows = [r for r in rows if r not in OPENCV_ROWS]
        notes.append("OpenCV is not importable here: its rows are left out.")
    frames = {size: decoded(p, args.frames) for size, p in sources.items()}
    f = frames[(256, 340)][0]
    notes.append(f"Frames: the first {args.frames} of each 60-frame file, decoded by PyAV {av.__version__} "
                 f"(libswscale {'.'.join(map(str, av.library_versions['libswscale']))}): {f.format.name}, "
                 f"colour space {int(f.colorspace)}, range {int(f.color_range)} (FFmpeg's numbers; 2 and 0 are "
                 "unspecified, which swscale reads as BT.601 at the limited range).")
    cuts = {name: (src, out) for name, src, out in CUTS if name in args.cuts}
    refs = {name: convert_all("graph", frames[src], out) for name, (src, out) in cuts.items()}
    return {"sources": sources, "frames": frames, "cuts": cuts, "refs": refs, "rows": rows}


def cells(args, ctx: dict) -> list[list]:
    return [[(cut, row) for row in ctx["rows"]] for cut in ctx["cuts"]]


def run(cell, rep: int, args, ctx: dict) -> dict:
    from measure import system_busy

    cut, row = cell
    src, out = ctx["cuts"][cut]
    frames = ctx["frames"][src]
    base = {"cut": cut, "row": row, "rep": rep}
    if row == "opencv-planes-area" and (out[0] % 2 or out[1] % 2):
        return {**base, "error": "odd output size"}
    try:
        convert = converter(row)
        dest = np.empty((len(frames), *out, 3), np.uint8)
        for f, d in zip(frames, dest):  # warm-up: the graph or context built, the code paged in
            convert(f, d)
        busy0, n, cpu0, t0 = system_busy(), 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < args.duration:
            for f, d in zip(frames, dest):
                convert(f, d)
            n += len(frames)
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        other = max(0.0, 100 * (system_busy() - busy0 - cpu) / dt)
        got = convert_all(row, frames, out)
        mad_max, mad_mean = differences(got, ctx["refs"][cut])
    except Exception as e:  # noqa: BLE001 (kept in the row: one broken row must not lose the others)
        return {**base, "error": f"{type(e).__name__}: {e}"}
    return {**base, "frames": n, "seconds": dt, "ms_per_frame": 1000 * dt / n, "cpu_ms_per_frame": 1000 * cpu / n,
            "other_cpu_pct": other, "diff_max": mad_max, "diff_mean": mad_mean}


def after(args, ctx: dict) -> dict:
    """Once: every row's pixels (and decord's) against today's on two colour variants of the
    340x256 file, and decord's against today's at each cut."""
    src = ctx["sources"][(256, 340)]
    colour: dict = {}
    for name, matrix, full in (("BT.709 limited", "itu709", False), ("BT.601 full range", "itu601", True)):
        tag = f"{'bt709' if matrix == 'itu709' else 'bt601'}_{'full' if full else 'limited'}"
        path = written(os.path.join(args.cache, f"textured_340x256_{tag}.mp4"),
                       lambda tmp, m=matrix, fr=full: write_colour(tmp, src, m, fr))
        frames = decoded(path, 8)
        for size in ((112, 112), (256, 340)):
            ref = convert_all("graph", frames, size)
            for row in ctx["rows"]:
                try:
                    diff = differences(convert_all(row, frames, size), ref)
                except Exception as e:  # noqa: BLE001
                    diff = (f"{type(e).__name__}: {e}", None)
                colour.setdefault(name, {}).setdefault(f"{size[1]}x{size[0]}", {})[row] = diff
            colour[name][f"{size[1]}x{size[0]}"]["decord"] = _decord_diff(path, size, len(frames), ref)
    by_decord = {cut: _decord_diff(ctx["sources"][src_size], out, len(ctx["frames"][src_size]), ctx["refs"][cut])
                 for cut, (src_size, out) in ctx["cuts"].items()}
    # Why reformat differs where it scales: the graph told that the chroma is sited left (as an
    # H.264 frame says; sws_scale_frame reads it from the frame) gives reformat's pixels.
    left: dict = {}
    for cut, (src_size, out) in ctx["cuts"].items():
        frames = ctx["frames"][src_size]
        g = Graph("in_chroma_loc=left")
        try:
            sited = np.stack([g(f, out[1], out[0]).copy() for f in frames])
            left[cut] = differences(convert_all("reformat", frames, out), sited)
        except Exception as e:  # noqa: BLE001 (an FFmpeg without the option)
            left[cut] = (f"{type(e).__name__}: {e}", None)
    return {"colour": colour, "decord": by_decord, "reformat_vs_left_sited_graph": left}


def _decord_diff(path: str, size: tuple[int, int], n: int, ref: np.ndarray) -> tuple:
    """decord's own first ``n`` frames of ``path`` at ``size`` against ``ref``."""
    import decord

    try:
        reader = decord.VideoReader(path, width=size[1], height=size[0], num_threads=1)
        return differences(reader.get_batch(list(range(n))).asnumpy(), ref)
    except decord.DECORDError as e:
        return (f"decord refused: {str(e).splitlines()[0][:80]}", None)


METRICS = ("ms_per_frame", "cpu_ms_per_frame", "other_cpu_pct", "diff_max", "diff_mean")


def finish(doc: dict, runs: list[dict], args, ctx: dict) -> None:
    doc["summary"] = report.summarize(runs, ("cut", "row"), METRICS)
    doc["config"]["rows_run"] = ctx["rows"]
    errors = sorted({f"{r['cut']} / {r['row']}: {r['error']}" for r in runs if r.get("error")})
    doc["notes"] += [f"Not measured: {e}." for e in errors]


def _diff(s: dict) -> str:
    if not s.get("diff_max") or not s["diff_max"]["n"]:
        return "–"
    return f"{s['diff_max']['max']:.0f} / {s['diff_mean']['max']:.3f}"


def _grid(cuts: list[str], rows: list[str], cell, name=lambda r: r) -> list[str]:
    """A table: a line per row (``name(row)``), a column per cut holding ``cell(cut, row)``."""
    return table("| row | " + " | ".join(cuts) + " |",
                 [f"| {name(r)} | " + " | ".join(cell(cut, r) for cut in cuts) + " |" for r in rows])


def markdown(doc: dict) -> str:
    lines = report.header(doc, "Converting frames: YUV to RGB and the resize, per frame", libs=("torch",))
    c, s = doc["config"], doc["summary"]
    cuts = [cut for cut in c["cuts"] if cut in s]
    rows = c["rows_run"]

    def metric(key: str):
        return lambda cut, r: fmt(s[cut].get(r, {}).get(key), 3)

    lines += [(f"One thread, one frame at a time into a preallocated array; medians (min–max) over {c['reps']} "
               f"interleaved repetitions of at least {c['duration']:g} s each over {c['frames']} frames. "
               "Sizes are W x H. Source: textured H.264 (libx264 preset medium, CRF 23), yuv420p."), "",
              "## Wall ms per frame", ""]
    lines += _grid(cuts, rows, metric("ms_per_frame"), name=lambda r: f"`{r}`: {ABOUT[r]}")
    lines += ["", "## CPU ms per frame", ""]
    lines += _grid(cuts, rows, metric("cpu_ms_per_frame"))
    lines += ["", ("Speed-up over today's graph, CPU per frame (median CPU ms of `graph` / the row's; one thread "
                   "converts, so its CPU time is its cost whatever else the machine runs):"), ""]
    lines += _grid(cuts, [r for r in rows if r != "graph"], lambda cut, r: _speedup(s[cut], r))
    lines += ["", "## Pixels against today's (`graph`): max / mean |difference|, grey levels", ""]
    lines += _grid(cuts, rows, lambda cut, r: _diff(s[cut].get(r, {})))
    dec = doc.get("decord", {})
    lines += ["", "decord's own frames (`VideoReader(width=, height=)`) against `graph`: "
              + "; ".join(f"{cut}: {_cdiff(d)}" for cut, d in dec.items()) + ".", ""]
    left = doc.get("reformat_vs_left_sited_graph", {})
    if left:
        lines += ["`reformat` against the graph told that the chroma is sited left (`scale=W:H:in_chroma_loc=left`, "
                  "as an H.264 frame says and `sws_scale_frame` reads it): "
                  + "; ".join(f"{cut}: {_cdiff(d)}" for cut, d in left.items()) + ".", ""]
    colour = doc.get("colour", {})
    if colour:
        lines += ["## Colour variants of the 340x256 file: max / mean |difference| from `graph`", ""]
        heads = [f"{n}, -> {sz}" for n, sizes in colour.items() for sz in sizes]
        lines += _grid(heads, [*rows, "decord"],
                       lambda head, r: _cdiff(colour[head.split(", -> ")[0]][head.split(", -> ")[1]].get(r)))
        lines += [""]
    other = [x for cut in cuts for r in rows for x in [s[cut].get(r, {}).get("other_cpu_pct")] if x]
    if other:
        lines += [(f"Other programs' CPU during the runs: median {np.median([o['median'] for o in other]):.0f} % "
                   f"(max {max(o['max'] for o in other):.0f} %) of one core."), ""]
    return "\n".join(lines + report.tail(doc))


def _speedup(cell: dict, row: str) -> str:
    a, b = cell.get("graph", {}).get("cpu_ms_per_frame"), cell.get(row, {}).get("cpu_ms_per_frame")
    if not a or not b or not b["n"]:
        return "–"
    return f"{a['median'] / b['median']:.2f}x"


def _cdiff(d) -> str:
    if d is None:
        return "–"
    return f"{d[0]} / {d[1]:.3f}" if d[1] is not None else str(d[0])


def plot(doc: dict, folder: str, name: str) -> list[str]:
    plt = report.pyplot()
    s, rows = doc["summary"], doc["config"]["rows_run"]
    cuts = [cut for cut in doc["config"]["cuts"] if cut in s]
    fig, axes = plt.subplots(1, len(cuts), figsize=(3.2 * len(cuts), 4.2), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, cut in zip(axes, cuts):
        have = [r for r in rows if s[cut].get(r, {}).get("ms_per_frame")]
        report.bars(ax, have, [s[cut][r]["ms_per_frame"] for r in have],
                    ["#3182bd" if r == "graph" else "#9ecae1" for r in have], horizontal=True)
        ax.set_title(cut, fontsize=9)
        ax.set_xlabel("ms per frame")
    fig.tight_layout()
    return [report.savefig(fig, folder, f"{name}.png")]


BENCH = harness.Benchmark(script="bench/convert.py", name="convert-cpu2", about=__doc__, options=options,
                          cells=cells, run=run, report=finish, markdown=markdown, plot=plot, prepare=prepare,
                          after=after, label=lambda cell: f"{cell[0]} {cell[1]}", reps=5, preload=())

if __name__ == "__main__":
    sys.exit(harness.main(BENCH, sys.argv[1:]))
