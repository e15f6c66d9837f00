"""Whole videos planned one by one (shmloader.video.planned): a recipe's frames and size per video,
decoded at that size in real workers, packed by a budget; ``frames`` and ``times`` per frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import shmloader
from shmloader.samples import read_codes, write_video
from shmloader.video.planned import Planned, PlannedVideos, Video

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Uniform:
    """A recipe as LLaVA-Video's: ``n`` frames spread evenly over the video (fewer where it has
    fewer), each at ``size``; a video costs one token per frame."""

    n: int = 6
    size: tuple[int, int] = (64, 96)

    def spec(self):
        return {"video": ((-1, *self.size, 3), np.dtype(np.uint8))}

    def plan(self, video: Video) -> Planned:
        n = min(self.n, video.frames)
        indices = np.linspace(0, video.frames - 1, n).round().astype(np.int64)
        return Planned(indices=indices, size=self.size, rows={"video": n}, cost=n)

    def fill(self, frames, planned, video, out) -> None:
        out["video"][:] = frames


@pytest.fixture(scope="module")
def lengths_videos(tmp_path_factory):
    """Videos of 4, 9, 30 and 50 frames at 25 fps, 96x128, H.264; video i's frames say (i, frame)."""
    folder = tmp_path_factory.mktemp("planned")
    lengths = [4, 9, 30, 50]
    return [write_video(folder / f"v{i}.mp4", i, frames=n) for i, n in enumerate(lengths)], lengths


def test_each_video_its_own_frames_decoded_at_the_planned_size(lengths_videos):
    paths, lengths = lengths_videos
    src = PlannedVideos(paths, [7, 8, 9, 10], Uniform())
    assert [len(p.indices) for p in src.plans()] == [4, 6, 6, 6]
    with shmloader.Loader(src, batch_tokens=12, workers=2, shuffle=True, seed=1) as loader:
        seen = {}
        for batch in loader:
            offsets = batch["video_offsets"]
            assert batch["video"].shape[1:] == (64, 96, 3)
            for k, v in enumerate(batch["index"]):
                frames = batch["video"][offsets[k] : offsets[k + 1]]
                ids, numbers = read_codes(frames)
                fo = batch["frames_offsets"]
                want = np.linspace(0, lengths[v] - 1, min(6, lengths[v])).round()
                assert (ids == v).all() and np.array_equal(numbers, want)
                np.testing.assert_array_equal(batch["frames"][fo[k] : fo[k + 1]], want)
                np.testing.assert_allclose(batch["times"][fo[k] : fo[k + 1]], want / 25, atol=1e-6)
                assert batch["label"][k] == 7 + v
                seen[int(v)] = len(frames)
            assert offsets[-1] <= 12
    assert seen == {0: 4, 1: 6, 2: 6, 3: 6}


@dataclass(frozen=True)
class Repeating(Uniform):
    """``n`` frames spread over the video even where it has fewer (frames repeat)."""

    def plan(self, video: Video) -> Planned:
        indices = np.linspace(0, video.frames - 1, self.n).round().astype(np.int64)
        return Planned(indices=indices, size=self.size, rows={"video": self.n}, cost=self.n)


@dataclass(frozen=True)
class InParts(Repeating):
    """``Repeating``, its rows filled three frames at a time as they are decoded."""

    part = 3

    def fill_part(self, frames, k, planned, out) -> None:
        assert len(frames) == min(3, self.n - 3 * k)
        out["video"][3 * k : 3 * k + len(frames)] = frames

    def fill(self, frames, planned, video, out) -> None:
        assert frames is None


@pytest.mark.parametrize("decoder", ["pyav", "decord"])
def test_a_recipe_filled_in_parts_gets_the_frames_a_whole_read_gives(lengths_videos, decoder):
    """Parts of 3 of 8 planned frames (the last one short), repeats where a video has 4 frames, the
    frames of every part as decoded whole, by either decoder."""
    paths, _ = lengths_videos
    size = (64, 128)  # a width decord's copy can produce
    whole = PlannedVideos(paths, None, Repeating(n=8, size=size), decoder=decoder).reader().read([0, 1, 3])
    parts = PlannedVideos(paths, None, InParts(n=8, size=size), decoder=decoder).reader().read([0, 1, 3])
    for a, b in zip(whole["video"], parts["video"]):
        assert a.shape == (8, 64, 128, 3)
        np.testing.assert_array_equal(a, b)
    assert whole["frames"][0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_video_that_cannot_be_planned_or_read_is_named(lengths_videos, tmp_path):
    paths, _ = lengths_videos

    class Picky(Uniform):
        def plan(self, video):
            if video.frames < 5:
                raise ValueError(f"{video.frames} frames, fewer than 5")
            return super().plan(video)

    with pytest.raises(ValueError, match=r"v0\.mp4: 4 frames, fewer than 5"):
        PlannedVideos(paths, None, Picky())
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    with pytest.raises(ValueError, match="broken.mp4: cannot read it"):
        PlannedVideos([paths[1], str(broken)], None, Uniform())


def _epoch(src, **kw) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every sample of one epoch by its ``index``: (its frames' indices, its pixels)."""
    out = {}
    with shmloader.Loader(src, batch_tokens=12, workers=1, **kw) as loader:
        for batch in loader:
            vo, fo = batch["video_offsets"], batch["frames_offsets"]
            for k, v in enumerate(batch["index"].tolist()):
                assert v not in out
                out[v] = (batch["frames"][fo[k] : fo[k + 1]].copy(), batch["video"][vo[k] : vo[k + 1]].copy())
        return out, loader.stats()


def test_every_unreadable_video_is_named_at_once_or_left_out(lengths_videos, tmp_path):
    """A missing file, one cut short and one too short to plan: ``"raise"`` names all three in one
    error; ``"skip"`` leaves them out with one warning and lists them, and each other video is
    read once with ``index`` its place in the paths given."""
    paths, lengths = lengths_videos
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(open(paths[3], "rb").read()[:3000])
    missing = tmp_path / "missing.mp4"

    class Picky(Uniform):
        def plan(self, video):
            if video.frames < 5:
                raise ValueError(f"{video.frames} frames, fewer than 5")
            return super().plan(video)

    given = [paths[0], str(cut), paths[1], str(missing), paths[2], paths[3]]
    with pytest.raises(ValueError, match=r"3 of 6 videos cannot be read or planned") as e:
        PlannedVideos(given, None, Picky())
    for name in ("v0.mp4: 4 frames, fewer than 5", "cut.mp4: cannot read it", "missing.mp4: cannot read it",
                 "on_error='skip'"):
        assert name in str(e.value)
    with pytest.warns(UserWarning, match=r"3 of 6 videos left out \(on_error='skip'\)"):
        src = PlannedVideos(given, [10, 11, 12, 13, 14, 15], Picky(), on_error="skip")
    assert len(src) == 3 and [(i, n.rsplit("/", 1)[1]) for i, n, _ in src.skipped] == \
        [(0, "v0.mp4"), (1, "cut.mp4"), (3, "missing.mp4")]
    assert "3 videos, 3 left out" in repr(src)
    got, stats = _epoch(src)
    assert sorted(got) == [2, 4, 5] and stats["skipped"] == 0
    for pos, (frames, pixels) in got.items():
        v = [None, None, 1, None, 2, 3][pos]
        ids, numbers = read_codes(pixels)
        assert (ids == v).all() and np.array_equal(numbers, frames)
    with pytest.raises(ValueError, match=r"2 of 2 videos cannot be read or planned"):
        PlannedVideos([str(cut), str(missing)], None, Uniform(), on_error="skip")
    with pytest.raises(ValueError, match="on_error must be one of 'raise', 'skip', got 'ignore'"):
        PlannedVideos(paths, None, Uniform(), on_error="ignore")


def test_a_saved_state_resumes_only_the_same_videos_planned_the_same_way(lengths_videos, tmp_path):
    from .conftest import state_after

    paths, _ = lengths_videos
    src = PlannedVideos(paths, None, Uniform())
    _, state = state_after(src, 1, batch_tokens=12, workers=1)
    assert state["dataset"] == src.fingerprint() == PlannedVideos(paths, None, Uniform()).fingerprint()
    others = [write_video(tmp_path / f"o{i}.mp4", 20 + i, frames=n) for i, n in enumerate([4, 9, 30, 50])]
    for other in (PlannedVideos(others, None, Uniform()), PlannedVideos(paths, None, Uniform(n=4)),
                  PlannedVideos(paths, [1, 2, 3, 4], Uniform())):
        assert other.fingerprint() != src.fingerprint()
        with pytest.raises(shmloader.StateError, match="another dataset"):
            shmloader.Loader(other, batch_tokens=12, workers=1, state=state).close()
    with shmloader.Loader(PlannedVideos(paths, None, Uniform()), batch_tokens=12, workers=1, state=state) as loader:
        assert sum(len(b["index"]) for b in loader) >= 1


def test_the_keywords_are_the_other_families(lengths_videos):
    paths, _ = lengths_videos
    src = PlannedVideos(paths[:1], None, Uniform(), decode_threads=2, decoder="pyav")
    assert (src.decode_threads, src.decoder) == (2, "pyav")
    with pytest.warns(DeprecationWarning, match="threads= is now decode_threads=") as said:
        assert PlannedVideos(paths[:1], None, Uniform(), threads=3).decode_threads == 3
    assert said[0].filename == __file__  # the user's line, where the default filters show it
    from shmloader import qwen

    with pytest.warns(DeprecationWarning, match="threads= is now decode_threads=") as said:
        assert qwen.clips(paths[2:3], threads=2).decode_threads == 2
    assert said[0].filename == __file__
    with pytest.raises(ValueError, match="decode_threads must be an integer >= 1"):
        PlannedVideos(paths[:1], None, Uniform(), decode_threads=0)
    with pytest.raises(ValueError, match="fetch takes"):
        PlannedVideos(paths[:1], None, Uniform(), fetch={"retry": 2})


def test_remote_videos_are_read_by_range_and_counted(lengths_videos):
    """Over an HTTP server of the test's: the same frames and pixels as the local files, the bytes
    and requests in ``stats()``, no file read whole once a request."""
    import os

    from ._servers import RangeServer

    paths, _ = lengths_videos
    root = os.path.dirname(paths[0])
    local, _ = _epoch(PlannedVideos(paths, None, Uniform()))
    with RangeServer(root) as srv:
        urls = [srv.url(os.path.basename(p)) for p in paths]
        src = PlannedVideos(urls, None, Uniform(), fetch={"block_size": 4096})
        assert src.remote and src.describe(0) == urls[0]
        with pytest.raises(ValueError, match="decoder='decord' reads local files only"):
            PlannedVideos(urls, None, Uniform(), decoder="decord")
        remote, stats = _epoch(src)
        served = srv.bytes_sent
    assert sorted(remote) == sorted(local) == [0, 1, 2, 3]
    for v in local:
        np.testing.assert_array_equal(local[v][0], remote[v][0])
        np.testing.assert_array_equal(local[v][1], remote[v][1])
    size = sum(os.path.getsize(p) for p in paths)
    assert stats["pyav"] == 4 and stats["requests"] > 0 and 0 < stats["bytes_read"] <= 2 * size
    assert served <= 4 * size, (served, size)  # the main process's probes and the workers' reads


def test_workers_get_the_columns_shared_not_the_lists():
    """A loader's workers receive the videos' paths and columns as one shared segment: what is
    pickled for each worker does not grow with the number of videos (planned from given metas,
    as from a manifest, nothing probed)."""
    import cloudpickle

    def sent(n: int) -> int:
        metas = [Video(frames=30, fps=25.0, height=96, width=128)] * n
        paths = [f"/data/videos/clip-{i:07d}.mp4" for i in range(n)]
        shared = PlannedVideos(paths, list(range(n)), Uniform(), spans=[(0.0, 1.0)] * n, metas=metas).for_workers()
        try:
            size = len(cloudpickle.dumps(shared))
            worker = cloudpickle.loads(cloudpickle.dumps(shared))  # as a worker gets it (the descriptor inherited)
            assert len(worker) == n and worker.videos.paths[n - 1] == paths[-1]
            assert worker.videos.labels[n - 1] == n - 1 and worker.videos._span(n - 1) == (0.0, 1.0)
            return size
        finally:
            shared.release()

    small, large = sent(10), sent(20_000)
    assert large < small + 512, (small, large)
    full = len(cloudpickle.dumps(PlannedVideos([f"/v{i}.mp4" for i in range(2_000)], None, Uniform(),
                                               metas=[Video(frames=30, fps=25.0, height=96, width=128)] * 2_000)))
    assert full > 20 * small  # what each worker would unpickle without the segment
