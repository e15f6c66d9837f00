"""Every family of samples keeps the house's contract (NOTE [ A family of samples ] in
``engine.source``): clips, Qwen-VL's planned videos, LeRobot's timesteps, Open-Sora's buckets and the example family a
maintainer adds in one folder (tests/families/thumbnails, docs/adding-a-family.md) — a
description with a fingerprint, a worker source with shared tables, a reader for any process, the
same keywords for the same things; and the example runs end to end on what the house gives it."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import shmloader
from shmloader import lerobot, opensora, qwen
from shmloader.engine.source import Family, Reader
from shmloader.planned import PlannedVideos
from shmloader.samples import make_videos, read_codes, write_video
from shmloader.clips.options import KEYWORDS

from . import _lerobot_v3 as v3
from .families import thumbnails

pytestmark = pytest.mark.timeout(180)

# What every family takes by the same keyword (the house's reading options).
HOUSE_KEYWORDS = {"decoder", "decode_threads", "storage_options", "fetch"}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    paths, labels = make_videos(str(folder), count=3, frames=30, size=(96, 128))
    return folder, paths, labels


@pytest.fixture(scope="module")
def families(videos, tmp_path_factory):
    _, paths, labels = videos
    root = v3.write(str(tmp_path_factory.mktemp("lerobot") / "ds"))

    def make(name: str, given=paths):
        return {"clips": lambda: shmloader.VideoClips(given, labels, clip_len=4, size=(64, 64)),
                "qwen": lambda: qwen.clips(given, labels),
                "lerobot": lambda: lerobot.dataset(root),
                "thumbnails": lambda: thumbnails.clips(given, labels, count=4),
                # 30 frames at 25 fps: 15 under fps_max 16, which a 9-frame bucket holds
                "opensora": lambda: opensora.clips(given, bucket_config={"64px": {9: (1.0, 2)}})}[name]()

    return make


@pytest.mark.parametrize("name", ["clips", "qwen", "lerobot", "thumbnails", "opensora"])
def test_every_family_keeps_the_contract(families, name):
    described = families(name)
    assert isinstance(described, Family), f"{name}: not a Family"
    assert described.fingerprint() == families(name).fingerprint()  # the same data, the same identity
    spec = described.spec()
    reader = described.reader()
    assert isinstance(reader, Reader)
    batch = reader.read([0, len(described) - 1], seed=3, epoch=1)
    extras = getattr(described, "extras", None)  # what a family adds in the main process (captions)
    assert set(batch) == set(spec) | set(extras(np.zeros(0, np.int64)) if extras else ())
    assert all(len(batch[k]) == 2 for k in spec)
    assert isinstance(reader.counters(), dict) and sum(reader.counters().get(k, 0) for k in ("decord", "pyav")) >= 1
    running = described.for_workers()
    try:
        assert all(callable(getattr(running, m, None)) for m in ("worker_init", "read")) and len(running) == len(described)
        assert running.spec() == spec and running.describe(0) == described.describe(0)
        assert len(getattr(running, "fds", ())) >= 1  # its tables go to the workers in a shared segment
    finally:
        running.release()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["clips", "qwen", "thumbnails", "opensora"])
def test_a_family_over_other_videos_has_another_fingerprint(families, videos, name, tmp_path):
    _, paths, _ = videos
    other = [write_video(tmp_path / f"o{i}.mp4", 10 + i, frames=30, size=(96, 128)) for i in range(len(paths))]
    assert families(name, other).fingerprint() != families(name).fingerprint()


def test_the_same_keyword_for_the_same_thing():
    takes = {"VideoClips": set(KEYWORDS), "PlannedVideos": _keywords(PlannedVideos),
             "qwen.clips": _keywords(qwen.clips), "lerobot.dataset": _keywords(lerobot.dataset),
             "opensora.clips": _keywords(opensora.clips), "opensora.from_table": _keywords(opensora.from_table)}
    for name, keywords in takes.items():
        assert HOUSE_KEYWORDS <= keywords, f"{name} lacks {HOUSE_KEYWORDS - keywords}"
    assert all("on_error" in takes[k] for k in ("PlannedVideos", "qwen.clips", "opensora.clips", "opensora.from_table"))


def _keywords(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_the_example_family_end_to_end(videos, tmp_path):
    """One folder (tests/families/thumbnails) and nothing else: its samples through a loader of 2
    workers, each video's frames decoded at the family's size; a file that cannot be read skipped
    and named; a saved state refused by the same family over other videos; Ray's task plan."""
    folder, paths, labels = videos
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(open(paths[1], "rb").read()[:2000])
    with pytest.warns(UserWarning, match="1 of 4 videos left out"):
        src = thumbnails.clips([paths[0], str(cut), *paths[1:]], [*labels[:1], 9, *labels[1:]], count=4,
                               on_error="skip")
    seen = {}
    with shmloader.Loader(src, batch_tokens=2 * 4 * 49, workers=2, shuffle=True, seed=0) as loader:
        for batch in loader:
            po = batch["pixels_offsets"]
            for k, position in enumerate(batch["index"].tolist()):
                ids, numbers = read_codes(batch["pixels"][po[k] : po[k + 1]])
                video = [0, None, 1, 2][position]
                assert (ids == video).all() and numbers.tolist() == [0, 10, 19, 29]
                assert batch["label"][k] == labels[video]
                seen[position] = batch["pixels"].shape[1:]
        state = loader.state()
    assert seen == {0: (64, 64, 3), 2: (64, 64, 3), 3: (64, 64, 3)}
    assert [(i, os.path.basename(p)) for i, p, _ in src.skipped] == [(1, "cut.mp4")]
    with pytest.raises(shmloader.StateError, match="another dataset"):
        shmloader.Loader(thumbnails.clips(paths[:2] + paths[:1], count=4), batch_tokens=2 * 4 * 49, workers=2,
                         shuffle=True, seed=0, state=state)
    items = shmloader.ray.plan_items(src, epochs=2, shuffle=True, seed=0)
    assert sorted(s for it in items if it["epoch"] == 1 for s in it["samples"]) == [0, 1, 2]


def test_the_adding_a_family_page_shows_the_family_as_it_is():
    """docs/adding-a-family.md shows tests/families/thumbnails/__init__.py whole, as it is."""
    from ._examples import ROOT, python_blocks

    shown = [b.code for b in python_blocks("docs/adding-a-family.md") if "tests/families/thumbnails" in b.value]
    with open(os.path.join(ROOT, "tests", "families", "thumbnails", "__init__.py")) as f:
        assert shown == [f.read()]
