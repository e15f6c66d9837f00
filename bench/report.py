"""Turning runs into medians, target checks, a Markdown report and plots."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import defaultdict

# What the loader benchmark promises (issue #4); each check says how it is computed.
SCALING_TARGET = 1.85  # shmloader(2 workers) / shmloader(1 worker), decode-bound clips
LIMIT_TARGET = 0.95  # shmloader / physical limit at the same number of workers
PYTHON_TARGET = 1.5  # shmloader / best thread-based loader, Python-heavy transform
T_ITER_TOLERANCE = 0.05  # |measured T_iter / formula - 1|

# Loaders whose decoding or transform runs in threads of the main process.
THREAD_BASED = ("naive", "tf-map", "threads", "videoloader", "spdl", "tfrecord-jpeg", "tfrecord-raw")
ORDER = ("naive", "tf-map", "threads", "videoloader", "torch", "tfrecord-jpeg", "tfrecord-raw", "grain",
         "grain-default", "spdl", "torchcodec", "shmloader", "limit", "torch-dl", "torchcodec-dl", "shm-torch",
         "shm-torch-grouped", "grain-jax", "shm-jax", "shm-jax-grouped")
# Rows that feed PyTorch or JAX instead of tf.data (issue 18), compared pairwise: shmloader's
# adapter (and its grouped decode) against what a user of that framework runs today.
FRAMEWORK_PAIRS = (("shm-torch", "torch-dl"), ("shm-torch", "torchcodec-dl"), ("shm-torch-grouped", "torch-dl"),
                   ("shm-torch-grouped", "torchcodec-dl"), ("shm-jax", "grain-jax"),
                   ("shm-jax-grouped", "grain-jax"))
FRAMEWORK_ROWS = tuple(sorted({n for pair in FRAMEWORK_PAIRS for n in pair}))
# Read fixed clips cut at conversion time, not a new random start every epoch.
FIXED_CLIPS = ("tfrecord-jpeg", "tfrecord-raw")
METRICS = ("clips_per_s", "frames_per_s", "main_cpu_pct", "workers_cpu_pct", "main_cpu_s_per_gb",
           "cpu_ms_per_clip", "peak_rss_mib", "added_rss_mib", "first_batch_s", "other_cpu_pct",
           "frames_bad", "frame_mad")


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _w_key(w: str) -> tuple[int, str]:
    return (int(w), "") if w.isdigit() else (10**6, w)


def summarize(runs: list[dict]) -> dict:
    """workload -> loader -> workers -> metric -> spread over repetitions."""
    groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in runs:
        if r.get("error") is None:
            groups[r["workload"]][r["loader"]][r["workers"]].append(r)
    out: dict = {}
    for wl, loaders in groups.items():
        for loader in sorted(loaders, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
            by_w = loaders[loader]
            for w in sorted(by_w, key=_w_key):
                rs = by_w[w]
                out.setdefault(wl, {}).setdefault(loader, {})[w] = {
                    m: spread([r[m] for r in rs]) for m in METRICS}
    return out


def _per_rep(runs: list[dict], workload: str, loader: str, workers: str) -> dict[int, float]:
    return {r["rep"]: r["clips_per_s"] for r in runs if r.get("error") is None
            and (r["workload"], r["loader"], r["workers"]) == (workload, loader, workers)}


def _ratio(runs: list[dict], a: tuple[str, str, str], b: tuple[str, str, str]) -> dict | None:
    """Median of a / median of b, and the min-max of the ratio paired by repetition."""
    ra, rb = _per_rep(runs, *a), _per_rep(runs, *b)
    if not ra or not rb:
        return None
    paired = [ra[k] / rb[k] for k in ra if k in rb and rb[k] > 0]
    return {"ratio": statistics.median(ra.values()) / statistics.median(rb.values()),
            "per_rep_min": min(paired, default=float("nan")),
            "per_rep_max": max(paired, default=float("nan"))}


def _best(summary: dict, workload: str, loader: str, metric: str = "clips_per_s",
          lowest: bool = False) -> tuple[str, float] | None:
    by_w = summary.get(workload, {}).get(loader)
    if not by_w:
        return None
    pick = min if lowest else max
    w = pick(by_w, key=lambda k: by_w[k][metric]["median"])
    return w, by_w[w][metric]["median"]


def check_targets(runs: list[dict], sims: list[dict], summary: dict) -> list[dict]:
    """Each target: what, the measured value (ratio of medians, per-repetition min-max), met."""
    out = []

    def add(target: str, r: dict | None, goal: float, how: str) -> None:
        if r is None:
            return
        out.append({"target": target, "goal": goal, "how": how, **r, "met": r["ratio"] >= goal})

    for wl in summary:
        for a, b in FRAMEWORK_PAIRS:
            ba, bb = _best(summary, wl, a), _best(summary, wl, b)
            if ba is not None and bb is not None:
                add(f"{a} >= {b}, {wl}", _ratio(runs, (wl, a, ba[0]), (wl, b, bb[0])), 1.0,
                    f"clips/s into the same framework, best W of each: {a} W={ba[0]}, {b} W={bb[0]}")
        if wl == "short":
            add("shmloader 2 workers / 1 worker, decode-bound",
                _ratio(runs, (wl, "shmloader", "2"), (wl, "shmloader", "1")), SCALING_TARGET,
                "clips/s, same workload, interleaved repetitions")
        for w in summary[wl].get("shmloader", {}):
            add(f"shmloader / physical limit, {wl}, W={w}",
                _ratio(runs, (wl, "shmloader", w), (wl, "limit", w)), LIMIT_TARGET,
                "clips/s delivered to tf.data vs decode alone in W processes")
        best = _best(summary, wl, "shmloader")
        if best is None:
            continue
        for other in summary[wl]:
            if other in ("shmloader", "limit", *FRAMEWORK_ROWS):
                continue
            ob = _best(summary, wl, other)
            add(f"shmloader >= {other}, {wl}",
                _ratio(runs, (wl, "shmloader", best[0]), (wl, other, ob[0])), 1.0,
                f"best W of each: shmloader W={best[0]}, {other} W={ob[0]}")
        if wl == "python":
            threaded = [(ob[1], other, ob[0]) for other in THREAD_BASED
                        if (ob := _best(summary, wl, other)) is not None]
            if threaded:
                _, other, ow = max(threaded)
                add(f"shmloader / best thread-based ({other}), Python-heavy transform",
                    _ratio(runs, (wl, "shmloader", best[0]), (wl, other, ow)), PYTHON_TARGET,
                    f"shmloader W={best[0]}, {other} W={ow}")
        # Main-process CPU per GB: shmloader's highest (any W) against each other loader's lowest.
        shm_high = max(v["main_cpu_s_per_gb"]["median"] for v in summary[wl]["shmloader"].values())
        others = [(min(v["main_cpu_s_per_gb"]["median"] for v in summary[wl][o].values()), o)
                  for o in summary[wl] if o not in ("shmloader", "limit", *FRAMEWORK_ROWS)]
        if others:
            low, low_name = min(others)
            out.append({"target": f"lowest main-process CPU per GB, {wl}", "goal": 1.0,
                        "how": f"{low_name}'s lowest / shmloader's highest, s/GB",
                        "ratio": low / shm_high, "per_rep_min": float("nan"),
                        "per_rep_max": float("nan"), "met": shm_high <= low})
    for cfg, rows in _t_iter_groups(sims).items():
        for w, rs in sorted(rows.items()):
            if w == 0:
                continue
            errs = [r["period_s"] / r["expected_period_s"] for r in rs]
            med = statistics.median(errs)
            out.append({"target": f"T_iter within 5 % of max(T_cpu/W, T_gpu): {cfg}, W={w}",
                        "goal": T_ITER_TOLERANCE, "how": "measured / formula",
                        "ratio": med, "per_rep_min": min(errs), "per_rep_max": max(errs),
                        "met": abs(med - 1) <= T_ITER_TOLERANCE})
    return out


def _t_iter_groups(sims: list[dict], experiment: str = "t_iter") -> dict:
    groups: dict = defaultdict(lambda: defaultdict(list))
    for s in sims:
        if s["experiment"] == experiment:
            groups[s["config"]][s["workers"]].append(s)
    return groups


# ------------------------------------------------------------------------- Markdown
COLUMNS = (
    "Columns: clips/s and frames/s reaching a Python loop over the tf.data dataset; CPU as `top` "
    "shows it (100 = one core), main process and loader workers apart; main-process CPU seconds per "
    "GB of frames delivered; CPU ms per clip = main + workers CPU time per delivered clip (what a "
    "clip costs, little affected by other load); peak RSS of main + children (shared ring pages "
    "count in every process that maps them) and the part of it the run added over the main "
    "process's RSS before it started (one process runs every configuration, so the absolute peak "
    "also carries what earlier runs left behind); time to first batch from building the pipeline; "
    "other load = busy CPU of everything else on the machine during the run; frames = the first "
    "batch of every run checked against its frame codes (one video, consecutive frames, its label) "
    "and against decord's decode of the same frames: 'ok' and the largest mean absolute pixel "
    "difference in grey levels (tolerance 7; frames one apart differ by 10-15), or the number of wrong clips. † = fixed clips cut "
    "at conversion time (every epoch reads the same clips).")
def _fmt(s: dict, digits: int = 0) -> str:
    if not s or s["n"] == 0:
        return "–"
    f = f"{{:.{digits}f}}"
    if s["n"] == 1:
        return f.format(s["median"])
    return f"{f.format(s['median'])} ({f.format(s['min'])}–{f.format(s['max'])})"


def _digits(v: float) -> int:
    return 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2


def markdown(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    lines = [f"# Loader benchmark: {doc['name']}", "",
             f"Machine: {m['cpu_model']}, {m['usable_cores']} usable cores, {m['memory_gib']} GiB; "
             f"Python {m['python']}, numpy {m['numpy']}, decord {m['decord']}, "
             f"tensorflow {m['tensorflow']}, torch {m['torch'] or 'not installed'}"
             + "".join(f", {k} {m[k]}" for k in ("jax", "torchcodec", "grain", "spdl") if m.get(k)) + ".", "",
             f"Command: `{doc['command']}`  ", f"Wall time: {doc['wall_s']:.0f} s.", "",
             f"Videos: {doc['videos']['count']} × {doc['videos']['about']}. Batch size "
             f"{cfg['batch_size']}, {cfg['reps']} interleaved repetitions of {cfg['duration']} s "
             f"each after {cfg['warmup']} warm-up batch(es). Cells: median (min–max).", "",
             COLUMNS, ""]
    for wl, about in doc["workloads"].items():
        if wl not in doc["summary"]:
            continue
        lines += [f"## {wl}: {about}", "",
                  "| loader | W | clips/s | frames/s | main CPU % | workers CPU % | main CPU s/GB "
                  "| CPU ms/clip | peak RSS MiB | added RSS MiB | first batch s | other load % | frames |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for loader, by_w in doc["summary"][wl].items():
            for w, s in by_w.items():
                per_gb = s["main_cpu_s_per_gb"]
                cells = [_fmt(s["clips_per_s"]), _fmt(s["frames_per_s"]), _fmt(s["main_cpu_pct"]),
                         _fmt(s["workers_cpu_pct"]), _fmt(per_gb, _digits(per_gb["median"])),
                         _fmt(s["cpu_ms_per_clip"], 1), _fmt(s["peak_rss_mib"]),
                         _fmt(s["added_rss_mib"]), _fmt(s["first_batch_s"], 2),
                         _fmt(s["other_cpu_pct"]), _frames_cell(s)]
                name = "physical limit" if loader == "limit" else loader
                name += "†" if loader in FIXED_CLIPS else ""
                lines.append(f"| {name} | {w} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _disk_markdown(doc)
    if doc["targets"]:
        lines += ["## Targets", "", "| target | goal | measured | per-repetition | met |",
                  "|---|---|---|---|---|"]
        for t in doc["targets"]:
            rep = ("–" if math.isnan(t["per_rep_min"]) else
                   f"{t['per_rep_min']:.2f}–{t['per_rep_max']:.2f}")
            goal = (f"≤ {t['goal']:.0%} off" if t["target"].startswith("T_iter")
                    else f"≥ {t['goal']:g}" if not t["target"].startswith("lowest") else "lowest")
            lines.append(f"| {t['target']} ({t['how']}) | {goal} | {t['ratio']:.2f} | {rep} | "
                         f"{'yes' if t['met'] else '**no**'} |")
        lines.append("")
    lines += _sim_markdown(doc)
    if doc["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    if doc.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in doc["plots"]] + [""]
    return "\n".join(lines)


def _frames_cell(s: dict) -> str:
    bad, mad = s["frames_bad"], s["frame_mad"]
    if bad["n"] == 0:
        return "–"
    if bad["max"] > 0:
        return f"**{bad['max']:.0f} wrong**"
    return f"ok, {mad['max']:.2f}"


def _disk_markdown(doc: dict) -> list[str]:
    """The TFRecord route's price: bytes on disk against the source videos, one-off conversion."""
    seen = {}
    for r in doc["runs"]:
        disk = r.get("extra", {}).get("disk")
        if disk:
            seen.setdefault((r["loader"], disk["about"]), disk)
    if not seen:
        return []
    lines = ["## Pre-decoded TFRecord: disk and conversion", "",
             "Converted once before the runs (one process: decode with decord, encode, write); "
             "the clips are fixed at conversion time.", "",
             "| loader | what is stored | records | MiB on disk | × source videos | conversion s (one-off) |",
             "|---|---|---|---|---|---|"]
    for (loader, about), d in seen.items():
        lines.append(f"| {loader} | {about} | {d['records']} | {d['bytes'] / 2**20:.1f} | "
                     f"{d['bytes'] / d['source_bytes']:.1f}× (of {d['source_bytes'] / 2**20:.1f} MiB) | "
                     f"{d['conversion_s']:.1f} |")
    return lines + [""]


def _sim_markdown(doc: dict) -> list[str]:
    lines = []
    prod = _t_iter_groups(doc["simulations"], "producers")
    for cfg, rows in prod.items():
        lines += [f"## Producers experiment: {cfg}", "",
                  "| W | items/s | model min(W/P, 1/C) | main CPU % | workers CPU % | other load % |",
                  "|---|---|---|---|---|---|"]
        for w, rs in sorted(rows.items()):
            lines.append(f"| {w} | {_fmt(spread([r['items_per_s'] for r in rs]), 1)} | "
                         f"{1 / rs[0]['expected_period_s']:.1f} | "
                         f"{_fmt(spread([r['main_cpu_pct'] for r in rs]), 1)} | "
                         f"{_fmt(spread([r['workers_cpu_pct'] for r in rs]), 1)} | "
                         f"{_fmt(spread([r['other_cpu_pct'] for r in rs]))} |")
        lines.append("")
    groups = _t_iter_groups(doc["simulations"])
    if groups:
        lines += ["## T_iter experiment", "",
                  "| work | W | T_iter ms | max(T_cpu/W, T_gpu) ms | serial T_cpu+T_gpu ms | "
                  "measured / formula | workers CPU % | other load % |",
                  "|---|---|---|---|---|---|---|---|"]
        for cfg, rows in groups.items():
            for w, rs in sorted(rows.items()):
                ms = spread([1e3 * r["period_s"] for r in rs])
                ratio = spread([r["period_s"] / r["expected_period_s"] for r in rs])
                lines.append(f"| {cfg} | {'serial' if w == 0 else w} | {_fmt(ms, 1)} | "
                             f"{1e3 * rs[0]['expected_period_s']:.1f} | "
                             f"{1e3 * rs[0]['serial_period_s']:.1f} | {_fmt(ratio, 3)} | "
                             f"{_fmt(spread([r['workers_cpu_pct'] for r in rs]))} | "
                             f"{_fmt(spread([r['other_cpu_pct'] for r in rs]))} |")
        lines.append("")
    return lines


# ---------------------------------------------------------------------------- plots
_STYLE = {"naive": ("tab:gray", "o"), "tf-map": ("tab:orange", "s"), "threads": ("tab:green", "^"),
          "torch": ("tab:red", "D"), "videoloader": ("tab:purple", "v"),
          "shmloader": ("tab:blue", "o"), "limit": ("black", "x"), "tfrecord-jpeg": ("tab:olive", "P"),
          "tfrecord-raw": ("tab:brown", "X"), "grain": ("tab:pink", "<"), "grain-default": ("goldenrod", ">"),
          "spdl": ("tab:cyan", "h"), "torchcodec": ("darkred", "d"),
          "shm-torch": ("navy", "o"), "shm-torch-grouped": ("navy", "*"), "torch-dl": ("salmon", "D"),
          "torchcodec-dl": ("maroon", "d"), "shm-jax": ("teal", "o"), "shm-jax-grouped": ("teal", "*"),
          "grain-jax": ("hotpink", "<")}


def _series(by_w: dict, metric: str):
    ws = [w for w in by_w if w.isdigit()]
    xs = [int(w) for w in ws]
    med = [by_w[w][metric]["median"] for w in ws]
    lo = [m - by_w[w][metric]["min"] for m, w in zip(med, ws)]
    hi = [by_w[w][metric]["max"] - m for m, w in zip(med, ws)]
    return xs, med, [lo, hi]


def _loader_axes(ax, summary_wl: dict, metric: str, xs_all: list[int]) -> None:
    for loader, by_w in summary_wl.items():
        color, marker = _STYLE.get(loader, ("tab:cyan", "."))
        label = "physical limit" if loader == "limit" else loader
        if any(w.isdigit() for w in by_w) and not (len(by_w) == 1 and loader == "naive"):
            xs, med, err = _series(by_w, metric)
            ax.errorbar(xs, med, yerr=err, color=color, marker=marker, capsize=3, label=label,
                        linestyle="--" if loader == "limit" else "-")
        else:  # one value whatever W (serial, or tf.data AUTOTUNE): a flat line
            s = next(iter(by_w.values()))[metric]
            ax.axhline(s["median"], color=color, linestyle=":", label=f"{label} ({next(iter(by_w))})")
            ax.axhspan(s["min"], s["max"], color=color, alpha=0.12)
    ax.set_xticks(xs_all)
    ax.grid(alpha=0.3)


def plot(doc: dict, folder: str, name: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    summary = doc["summary"]
    wls = [w for w in doc["workloads"] if w in summary]
    xs_all = sorted({int(w) for wl in wls for by_w in summary[wl].values() for w in by_w if w.isdigit()})
    if wls:
        fig, axes = plt.subplots(1, len(wls), figsize=(5.2 * len(wls), 4.2), squeeze=False)
        for ax, wl in zip(axes[0], wls):
            _loader_axes(ax, summary[wl], "clips_per_s", xs_all)
            ax.set_title(f"{wl}: {_short(doc['workloads'][wl])}", fontsize=9)
            ax.set_xlabel("workers W")
            ax.set_ylabel("clips/s at the tf.data consumer")
            meds = [s["clips_per_s"]["median"] for by_w in summary[wl].values() for s in by_w.values()]
            if max(meds) > 8 * min(meds):  # pre-decoded rows beside decoding ones: keep both readable
                ax.set_yscale("log")
                ax.set_ylabel("clips/s at the tf.data consumer (log scale)")
            else:
                ax.set_ylim(bottom=0)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"Throughput vs workers ({doc['machine']['cpu_model']}, "
                     f"{doc['machine']['usable_cores']} cores); median, bars min–max")
        fig.tight_layout()
        files.append(_save(fig, folder, f"{name}_throughput.png"))

        fig, axes = plt.subplots(2, len(wls), figsize=(5.2 * len(wls), 7.5), squeeze=False)
        for j, wl in enumerate(wls):
            for i, (metric, what) in enumerate((("main_cpu_pct", "main process"),
                                                ("workers_cpu_pct", "worker processes"))):
                ax = axes[i][j]
                _loader_axes(ax, summary[wl], metric, xs_all)
                ax.set_title(f"{wl}: {what}", fontsize=9)
                ax.set_xlabel("workers W")
                ax.set_ylabel("CPU % (100 = one core)")
                ax.set_ylim(bottom=0)
        axes[0][0].legend(fontsize=8)
        fig.suptitle("CPU vs workers, as top shows it; median, bars min–max")
        fig.tight_layout()
        files.append(_save(fig, folder, f"{name}_cpu.png"))

    prod = _t_iter_groups(doc["simulations"], "producers")
    if prod:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 4.2))
        for cfg, rows in prod.items():
            ws = sorted(rows)
            thr = [spread([r["items_per_s"] for r in rows[w]]) for w in ws]
            a1.errorbar(ws, [t["median"] for t in thr],
                        yerr=[[t["median"] - t["min"] for t in thr], [t["max"] - t["median"] for t in thr]],
                        marker="o", capsize=3, label="measured (shmloader)")
            a1.plot(ws, [1 / rows[w][0]["expected_period_s"] for w in ws], "k--",
                    label="min(W / producer, 1 / consumer)")
            for metric, label in (("main_cpu_pct", "main"), ("workers_cpu_pct", "workers, total")):
                a2.plot(ws, [spread([r[metric] for r in rows[w]])["median"] for w in ws],
                        marker="o", label=label)
            a1.set_title(cfg, fontsize=9)
        a1.set_xlabel("producers W"), a1.set_ylabel("items/s at the consumer"), a1.legend(fontsize=8)
        a2.set_xlabel("producers W"), a2.set_ylabel("CPU % (100 = one core)"), a2.legend(fontsize=8)
        a2.set_ylim(bottom=0, top=max(20.0, a2.get_ylim()[1]))
        a1.grid(alpha=0.3), a2.grid(alpha=0.3)
        fig.tight_layout()
        files.append(_save(fig, folder, f"{name}_producers.png"))

    groups = _t_iter_groups(doc["simulations"])
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.2), squeeze=False)
        for ax, (cfg, rows) in zip(axes[0], groups.items()):
            ws = sorted(w for w in rows if w > 0)
            meas = [spread([1e3 * r["period_s"] for r in rows[w]]) for w in ws]
            ax.errorbar(ws, [m["median"] for m in meas],
                        yerr=[[m["median"] - m["min"] for m in meas], [m["max"] - m["median"] for m in meas]],
                        marker="o", capsize=3, label="measured T_iter (shmloader)")
            ax.plot(ws, [1e3 * rows[w][0]["expected_period_s"] for w in ws], "k--",
                    label="max(T_cpu / W, T_gpu)")
            serial = 1e3 * rows[ws[0]][0]["serial_period_s"]
            ax.axhline(serial, color="tab:red", linestyle=":", label="serial T_cpu + T_gpu")
            if 0 in rows:
                s = spread([1e3 * r["period_s"] for r in rows[0]])
                ax.plot([ws[0]], [s["median"]], "rx", label="serial, measured")
            ax.set_title(cfg, fontsize=9)
            ax.set_xlabel("workers W"), ax.set_ylabel("ms per iteration")
            ax.set_xticks(ws), ax.set_ylim(bottom=0), ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        files.append(_save(fig, folder, f"{name}_titer.png"))
    return files


def save(doc: dict, text: str, folder: str, name: str) -> None:
    """Write ``<folder>/<name>.json`` (the document) and ``.md`` (``text``), print the text and
    what was written (plots included)."""
    base = os.path.join(folder, name)
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    with open(base + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"\nwrote {base}.json, {base}.md" + "".join(f", {os.path.join(folder, p)}" for p in doc.get("plots", [])))


def _short(about: str, width: int = 60) -> str:
    return about if len(about) <= width else about[: width - 1] + "…"


def _save(fig, folder: str, filename: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(folder, filename)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return filename
