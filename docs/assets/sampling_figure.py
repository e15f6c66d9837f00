"""Draw docs/assets/sampling.png, the Sampling recipes page's timeline, from shmloader.sampling:
where each ``sampling`` mode, a time span and ``fps=`` put the frames of one 96-frame, 25-fps
video (3.84 s). The frames drawn are those the functions return, so the figure follows the code.

    python docs/assets/sampling_figure.py        # rewrites docs/assets/sampling.png
"""

from __future__ import annotations

import os
import sys

import numpy as np

from shmloader.sampling import clip_frames, rate_frames

FRAMES, FPS = 96, 25
PTS = np.stack([np.arange(FRAMES) / FPS, (np.arange(FRAMES) + 1) / FPS], axis=1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sampling.png")
COLORS = ["tab:blue", "tab:orange", "tab:green"]


def rows() -> list[dict]:
    """One row of the figure per recipe: its label, the frames of each clip, and what to shade."""
    def clips(sampling: str, n: int, seed: int = 0, **kw) -> np.ndarray:
        kw = {"clip_len": 8, "frame_step": 2, "fps": None, **kw}
        return clip_frames(FRAMES, PTS, sampling=sampling, clips=list(range(n)), total_clips=n,
                           short_video="error", rng=np.random.default_rng(seed), **kw)

    seg = dict(clip_len=8, frame_step=1)
    return [
        {"label": 'sampling="random": 3 draws\n(clip_len=8, frame_step=2)',
         "clips": [clips("random", 1, seed)[0] for seed in (1, 2, 3)]},
        {"label": 'sampling="uniform",\nclips_per_video=3', "clips": list(clips("uniform", 3))},
        {"label": 'sampling="center"', "clips": list(clips("center", 1))},
        {"label": 'sampling="segments"\n(clip_len=8: 8 segments)', "clips": list(clips("segments", 1, 4, **seg)),
         "segments": 8},
        {"label": 'sampling="segments_uniform"', "clips": list(clips("segments_uniform", 1, **seg)), "segments": 8},
        {"label": "spans=[(1.0, 2.0)],\nrandom clip inside", "span": (1.0, 2.0),
         "clips": list(clip_frames(FRAMES, PTS, clip_len=8, frame_step=2, fps=None, sampling="random", clips=[0],
                                   total_clips=1, short_video="error", rng=np.random.default_rng(5),
                                   span=(1.0, 2.0)))},
        {"label": "fps=5, max_frames=16 (no clip_len):\n20 instants thinned to 16",
         "clips": [rate_frames(FRAMES, PTS, fps=5, max_frames=16, sampling="uniform", short_video="error",
                               rng=np.random.default_rng(0))]},
    ]


def draw(path: str = OUT) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = rows()
    fig, ax = plt.subplots(figsize=(8.4, 0.62 * len(recipes) + 1.5))
    for y, row in enumerate(recipes[::-1]):
        ax.broken_barh([(0, FRAMES / FPS)], (y - 0.3, 0.6), color="0.93")  # the video
        if "span" in row:
            a, b = row["span"]
            ax.broken_barh([(a, b - a)], (y - 0.36, 0.72), color="gold", alpha=0.45)
        for k in range(1, row.get("segments", 0)):
            ax.plot([k * FRAMES / FPS / row["segments"]] * 2, [y - 0.36, y + 0.36], color="0.5", lw=0.8, ls="--")
        for c, frames in enumerate(row["clips"]):
            t = (np.asarray(frames) + 0.5) / FPS  # a frame's middle
            ax.plot(t, np.full(len(t), y + (c - (len(row["clips"]) - 1) / 2) * 0.16), "|", ms=11, mew=2,
                    color=COLORS[c % len(COLORS)])
    ax.set_yticks(range(len(recipes)), [r["label"] for r in recipes[::-1]], fontsize=8.5)
    ax.set_xlim(-0.05, FRAMES / FPS + 0.05)
    ax.set_ylim(-0.7, len(recipes) - 0.3)
    ax.set_xlabel(f"video time, s (a {FRAMES}-frame video at {FPS} fps)\n"
                  "each tick is one frame delivered, one colour per clip")
    ax.set_xticks(np.arange(0, FRAMES / FPS, 0.5))
    ax.grid(axis="x", alpha=0.3)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("Where the frames of a sample come from\n(gold: a time span; dashed: segment borders)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw(sys.argv[1] if len(sys.argv) > 1 else OUT))
