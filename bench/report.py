"""Turning any benchmark's runs into medians, ratios, a Markdown report, plots and a json file.

A benchmark's document (``harness.main``) holds its command, machine, config, summary,
targets, notes and every run; its Markdown is a function of that document alone, so a report
can be written again from its json without running anything:

    python bench/report.py bench/results/scale-cpu2.json       # prints the Markdown
    python bench/report.py bench/results/*.json --write        # rewrites each .md beside its json
    python bench/report.py bench/results/cpu2.json --plots     # and its plots
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict], keys: tuple[str, ...], metrics: tuple[str, ...], sort=None) -> dict:
    """keys[0] -> keys[1] -> ... -> metric -> spread over the runs without an error, in the order
    ``sort(run)`` gives (stable: the runs' own order by default); metrics a run lacks are left out."""
    groups: dict = {}
    for r in sorted((r for r in runs if not r.get("error")), key=sort or (lambda r: 0)):
        node = groups
        for k in keys[:-1]:
            node = node.setdefault(r[k], {})
        node.setdefault(r[keys[-1]], []).append(r)

    def leaves(node):
        if isinstance(node, list):
            return {m: spread([r[m] for r in node]) for m in metrics if m in node[0]}
        return {k: leaves(v) for k, v in node.items()}

    return leaves(groups)


def ratio(runs: list[dict], a: dict, b: dict, metric: str) -> dict | None:
    """Median of ``metric`` over the runs that match ``a`` (key: value) / the same over ``b``,
    and the min-max of the ratio paired by repetition; runs with an error or no value left out."""
    def by_rep(match: dict) -> dict[int, float]:
        return {r["rep"]: r[metric] for r in runs if not r.get("error") and r.get(metric)
                and not math.isnan(r[metric]) and all(r[k] == v for k, v in match.items())}

    ra, rb = by_rep(a), by_rep(b)
    if not ra or not rb:
        return None
    paired = [ra[k] / rb[k] for k in ra if k in rb]
    return {"ratio": statistics.median(ra.values()) / statistics.median(rb.values()),
            "per_rep_min": min(paired, default=float("nan")), "per_rep_max": max(paired, default=float("nan"))}


# ------------------------------------------------------------------------- Markdown
def fmt(s: dict | None, digits: int = 0, scale: float = 1.0, comma: bool = False) -> str:
    """A summary cell: the median, and (min–max) over more than one repetition."""
    if not s or not s["n"]:
        return "–"
    f = f"{{:{',' if comma else ''}.{digits}f}}"
    med = f.format(s["median"] * scale)
    if s["n"] == 1:
        return med
    return f"{med} ({f.format(s['min'] * scale)}–{f.format(s['max'] * scale)})"


def fmt_ratio(r: dict | None) -> str:
    """A ``ratio`` cell: the ratio of medians, and (min–max) of the ratio by repetition."""
    return "–" if not r else f"{r['ratio']:.2f} ({r['per_rep_min']:.2f}–{r['per_rep_max']:.2f})"


def header(doc: dict, title: str, libs: tuple[str, ...] = (), machine_tail: str = "",
           wall_tail: str = "") -> list[str]:
    """Title, machine, command, the code measured and the wall time. ``libs``: versions named
    after TensorFlow's (torch always, as 'not installed' where it is not; the others where present)."""
    m = doc["machine"]
    line = (f"Machine: {m['cpu_model']}, {m['usable_cores']} usable cores, {m['memory_gib']} GiB; "
            f"Python {m['python']}, numpy {m['numpy']}, decord {m['decord']}, tensorflow {m['tensorflow']}")
    for lib in libs:
        if lib == "torch" or m.get(lib):
            line += f", {lib} {m.get(lib) or 'not installed'}"
    lines = [f"# {title}", "", f"{line}.{machine_tail}", "", f"Command: `{doc['command']}`  "]
    if doc.get("code"):
        lines.append(f"Code: {doc['code']['describe']}  ")
    return lines + [f"Wall time: {doc['wall_s']:.0f} s.{wall_tail}", ""]


def machine_line(m: dict) -> str:
    """The machine in one line: CPU, usable cores, Python, and torch and the GPU where named."""
    extra = "".join(f", {x}" for x in (m.get("torch") and f"torch {m['torch']}", m.get("gpu")) if x)
    return f"{m['cpu_model']}, {m['usable_cores']} usable cores, Python {m['python']}{extra}"


def target_lines(targets: list[dict]) -> list[str]:
    """A line per target of a report: met or missed, and its ratio."""
    return [f"- Target {t['target']}: {'met' if t['met'] else 'missed'} "
            f"({'–' if t['ratio'] is None else format(t['ratio'], '.2f')})." for t in targets]


def table(head: str, rows: list[str]) -> list[str]:
    """A Markdown table: ``head`` is its header row, ``rows`` its body rows (with their pipes)."""
    return [head, "|" + "---|" * (head.count("|") - 1), *rows]


def columns(first: str, items, cols: list[tuple], **fmt_options) -> list[str]:
    """A table of ``items`` ((name, summary) pairs), ``first`` heading the names: each of ``cols``
    is (heading, metric, digits[, scale]) for ``fmt`` of that metric, or (heading, cell(summary))."""
    def cell(c: tuple, s: dict) -> str:
        return c[1](s) if callable(c[1]) else fmt(s.get(c[1]), *c[2:], **fmt_options)

    return table(f"| {first} | " + " | ".join(c[0] for c in cols) + " |",
                 [f"| {name} | " + " | ".join(cell(c, s) for c in cols) + " |" for name, s in items])


def tail(doc: dict, plots_heading: str | None = "## Plots") -> list[str]:
    """The notes, then the plots."""
    lines = ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""] if doc["notes"] else []
    if doc.get("plots"):
        lines += ([plots_heading, ""] if plots_heading else []) + [f"![{p}]({p})" for p in doc["plots"]] + [""]
    return lines


# ---------------------------------------------------------------------------- plots
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(ax, names: list[str], spreads: list[dict], colors: list[str], horizontal: bool = False) -> None:
    """Medians as bars, min–max as error bars."""
    med = [s["median"] for s in spreads]
    err = [[m - s["min"] for m, s in zip(med, spreads)], [s["max"] - m for m, s in zip(med, spreads)]]
    if horizontal:
        ax.barh(names, med, xerr=err, color=colors, capsize=3)
    else:
        ax.bar(names, med, yerr=err, color=colors, capsize=3)


def savefig(fig, folder: str, filename: str) -> str:
    path = os.path.join(folder, filename)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return filename


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


# --------------------------------------------------------------------- re-rendering
def benchmark_of(doc: dict):
    """The ``Benchmark`` whose script wrote ``doc`` (named in its command line)."""
    script = doc["command"].split()[1]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(os.path.splitext(os.path.basename(script))[0]).BENCH


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Write a benchmark's report again from its json file.")
    p.add_argument("json", nargs="+")
    p.add_argument("--write", action="store_true", help="write <name>.md beside each json instead of printing")
    p.add_argument("--plots", action="store_true", help="draw the plots again too (beside the json)")
    args = p.parse_args(argv)
    for path in args.json:
        with open(path) as f:
            doc = json.load(f)
        bench = benchmark_of(doc)
        folder, name = os.path.split(os.path.splitext(path)[0])
        if args.plots:
            doc["plots"] = bench.plot(doc, folder, name)
        text = bench.markdown(doc)
        if args.write:
            with open(os.path.join(folder, name + ".md"), "w") as f:
                f.write(text)
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
