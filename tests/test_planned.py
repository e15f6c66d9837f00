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
