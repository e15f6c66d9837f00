"""shmloader.qwen.clips through real workers against qwen-vl-utils' own fetch_video (decord reader,
torchvision's float32 bicubic resize) on the same files: the same frames and sizes, the pixels
within 35 dB PSNR (ours are decoded at the size, theirs at full size and resized), packed by
batch_tokens; bad input named."""

from __future__ import annotations

import numpy as np
import pytest

import shmloader
from shmloader import qwen
from shmloader.samples import write_video

from ._qwen import vision_process

pytestmark = pytest.mark.timeout(180)

# (height, width, frames, fps): landscape, larger and 30 fps, portrait, shorter than min_frames'
# 2 s, 480p; and a 200-frame video for the max_frames and total_pixels caps.
SHAPES = [(96, 128, 60, 25), (240, 320, 130, 30), (320, 176, 40, 25), (64, 64, 5, 25), (480, 640, 40, 25)]
LONG = (240, 320, 200, 25)


@pytest.fixture(scope="module")
def vp():
    return vision_process()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen")
    paths = [write_video(folder / f"v{i}.mp4", i, frames=f, size=(h, w), fps=fps)
             for i, (h, w, f, fps) in enumerate([*SHAPES, LONG])]
    return paths[:-1], paths[-1]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def check(vp, path: str, ele: dict, batch: dict, k: int, model: str = "qwen2.5-vl") -> None:
    """Sample ``k`` of ``batch`` is what fetch_video makes of ``path`` with ``ele``."""
    (video, meta), fps = vp.fetch_video({"video": path, **ele}, return_video_metadata=True,
                                        return_video_sample_fps=True)
    fo, po = batch["frames_offsets"], batch["pixel_values_videos_offsets"]
    frames = batch["frames"][fo[k] : fo[k + 1]]
    assert frames.tolist() == list(meta["frames_indices"]), (path, ele)
    n, _, h, w = video.shape
    patch = qwen.MODELS[model][0]
    assert batch["video_grid_thw"][k].tolist() == [-(-n // 2), h // patch, w // patch], (path, ele)
    np.testing.assert_allclose(batch["second_per_grid_ts"][k], 2 / fps, rtol=1e-6)
    np.testing.assert_allclose(batch["times"][fo[k] : fo[k + 1]], frames / meta["fps"], atol=1e-3)
    theirs = qwen.patches(video.permute(0, 2, 3, 1).numpy().round().clip(0, 255).astype(np.uint8), model=model)
    ours = batch["pixel_values_videos"][po[k] : po[k + 1]]
    assert ours.shape == theirs.shape and psnr(ours, theirs) >= 35, (path, ele, psnr(ours, theirs))


def test_each_sample_is_fetch_videos_frames_and_size_decoded_at_that_size(vp, files):
    paths, _ = files
    spans = [None, (1.1, 3.7), None, None, (0.3, None)]
    src = qwen.clips(paths, labels=[5, 6, 7, 8, 9], spans=spans)
    tokens = [p.cost for p in src.plans()]
    budget = max(tokens) + min(tokens)
    seen = []
    with shmloader.Loader(src, batch_tokens=budget, workers=2, shuffle=True, seed=2) as loader:
        for batch in loader:
            grid = batch["video_grid_thw"]
            assert int(np.prod(grid, axis=1).sum()) // 4 <= budget
            assert len(batch["pixel_values_videos"]) == int(np.prod(grid, axis=1).sum())
            for k, i in enumerate(batch["index"].tolist()):
                start, end = spans[i] or (None, None)
                ele = {k2: v for k2, v in (("video_start", start), ("video_end", end)) if v is not None}
                check(vp, paths[i], ele, batch, k)
                assert batch["label"][k] == 5 + i
                seen.append(i)
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_the_frame_caps_and_a_fixed_count(vp, files):
    """max_frames and the per-frame share of total_pixels (a 200-frame video sampled at 25 fps), and
    nframes, as fetch_video applies them."""
    paths, long = files
    caps = dict(fps=25.0, max_frames=64, min_pixels=16 * 28 * 28, total_pixels=1_600_000)
    src = qwen.clips([long], **caps)
    (plan,) = src.plans()
    assert len(plan.indices) == 64 and plan.size[0] * plan.size[1] < 240 * 320  # both caps bite
    fixed = dict(nframes=6, max_pixels=200 * 28 * 28)
    for source, ele in ((src, caps), (qwen.clips(paths[1:2], **fixed), fixed)):
        with shmloader.Loader(source, batch_size=1, workers=1) as loader:
            (batch,) = list(loader)
            check(vp, long if source is src else paths[1], ele, batch, 0)


def test_qwen3_vl_patches(vp, files):
    paths, _ = files
    with shmloader.Loader(qwen.clips(paths[:1], model="qwen3-vl"), batch_size=1, workers=1) as loader:
        (batch,) = list(loader)
    assert batch["pixel_values_videos"].shape[1] == 3 * 2 * 16 * 16
    h, w = (batch["video_grid_thw"][0, 1:] * 16).tolist()
    assert h % 32 == 0 and w % 32 == 0
    ours = batch["pixel_values_videos"]
    (video, _), _ = vp.fetch_video({"video": paths[0]}, image_patch_size=16, return_video_metadata=True,
                                   return_video_sample_fps=True)
    assert tuple(video.shape[2:]) == (h, w)
    theirs = qwen.patches(video.permute(0, 2, 3, 1).numpy().round().clip(0, 255).astype(np.uint8), model="qwen3-vl")
    assert psnr(ours, theirs) >= 35


def test_bad_input_is_named(files, tmp_path):
    paths, _ = files
    one = write_video(tmp_path / "one.mp4", 1, frames=1, size=(64, 64))
    with pytest.raises(ValueError, match=r"one\.mp4: .*frames"):
        qwen.clips([paths[0], one])
    thin = write_video(tmp_path / "thin.mp4", 2, frames=4, size=(16, 3400))
    with pytest.raises(ValueError, match=r"thin\.mp4: absolute aspect ratio must be smaller than 200, got 212"):
        qwen.clips([thin])
    src = qwen.clips(paths[:2])
    with pytest.raises(ValueError, match=r"cost more than batch_tokens=100 alone: sample 0 \(.*v0\.mp4\) costs 280"):
        shmloader.Loader(src, batch_tokens=100)
    with pytest.raises(ValueError, match="model must be one of"):
        qwen.clips(paths[:1], model="qwen9")


def test_unreadable_videos_are_left_out_or_named_together(files, tmp_path):
    paths, _ = files
    one = write_video(tmp_path / "one.mp4", 1, frames=1, size=(64, 64))
    missing = str(tmp_path / "missing.mp4")
    with pytest.raises(ValueError, match=r"2 of 3 videos cannot be read or planned: .*one\.mp4: .*missing\.mp4"):
        qwen.clips([one, paths[0], missing])
    with pytest.warns(UserWarning, match="2 of 3 videos left out"):
        src = qwen.clips([one, paths[0], missing], on_error="skip", decode_threads=1)
    assert len(src) == 1 and [i for i, _, _ in src.skipped] == [0, 2]
    out = _room(src)
    src.read(0, np.random.default_rng(0), out)
    assert out["index"] == 1 and len(out["frames"]) == src.plans()[0].indices.size


def _room(src) -> dict:
    """One sample's arrays, each field of rows as long as the sample's plan says."""
    sizes = src.sizes()
    return {k: np.zeros((int(sizes.rows[k][0]), *shape[1:]) if shape[:1] == (-1,) else shape, dtype)
            for k, (shape, dtype) in src.spec().items()}
