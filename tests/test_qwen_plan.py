"""Qwen-VL's video input planned without decoding (``shmloader.qwen`` over ``shmloader.vlm``): the
same frame indices, sizes, grids and patches as the reference tools give, which these tests call
on the same inputs (qwen-vl-utils' ``vision_process`` and transformers' Qwen-VL video processors)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys

import numpy as np
import pytest

from shmloader import qwen
from shmloader.samples import write_video
from shmloader.vlm import frames as vlm_frames
from shmloader.vlm import patches as vlm_patches
from shmloader.vlm import sizes as vlm_sizes

from ._needs import need
from ._qwen import have_torchvision, import_torchvision, vision_process

torch = need("torch")


@pytest.fixture(scope="module")
def vp():
    """qwen-vl-utils' vision_process, reading video with decord."""
    return vision_process()


# torch's linspace kernels for AVX2 and AVX-512 round first + i * step once (a fused multiply-add);
# its kernel without SIMD on x86 rounds twice (vlm.frames.linspace_indices' fused=False).
_FUSED = not (platform.machine() in ("x86_64", "AMD64") and torch.backends.cpu.get_cpu_capability() == "DEFAULT")


def _spans(seed: int, count: int) -> list[tuple[int, int, int]]:
    """(first, last, n) as Qwen-VL's readers pass them to torch.linspace, up to 200 000 frames."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        frames = rng.choice([rng.randint(2, 1000), rng.randint(1000, 30000), rng.randint(30000, 200000)])
        first = rng.choice([0, 0, rng.randint(0, frames // 2)])
        out.append((first, first + frames - 1, rng.choice([rng.randint(2, min(frames, 800)), rng.randint(2, frames)])))
    return out + [(0, 1, 2), (0, 0, 2), (5, 5, 3), (0, 9, 10), (3, 10, 2), (0, 4, 1)]


def test_linspace_indices_are_torch_float32_linspace_rounded():
    """Every index equals torch.linspace(first, last, n).round().long() (float32, half to even);
    float64 (np.linspace) gives another frame in many of the same cases, so the check can tell."""
    float64_differs = 0
    for first, last, n in _spans(0, 1500):
        want = torch.linspace(first, last, n).round().long().numpy()
        got = vlm_frames.linspace_indices(first, last, n, fused=_FUSED)
        assert np.array_equal(got, want), (first, last, n)
        float64_differs += not np.array_equal(np.rint(np.linspace(first, last, n)).astype(np.int64), want)
    assert float64_differs > 50


def test_linspace_indices_without_fused_multiply_add_match_torchs_plain_kernel(tmp_path):
    """With ``fused=False`` the indices are those of torch's kernel without SIMD (chosen with
    ``ATEN_CPU_CAPABILITY=default`` at torch's start), and the two forms differ on some spans."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY=default selects the plain kernel on x86 only")
    spans = _spans(1, 300)
    script = ("import json, sys, torch\n"
              "print(torch.backends.cpu.get_cpu_capability())\n"
              "spans = json.load(sys.stdin)\n"
              "print(json.dumps([torch.linspace(a, b, n).round().long().tolist() for a, b, n in spans]))\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(spans), capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, ATEN_CPU_CAPABILITY="default"), check=True)
    capability, values = done.stdout.splitlines()
    assert capability in ("DEFAULT", "NO AVX")  # the plain kernel: torch before 2.4 names it "NO AVX"
    plain = json.loads(values)
    differ = 0
    for (first, last, n), want in zip(spans, plain):
        assert vlm_frames.linspace_indices(first, last, n, fused=False).tolist() == want, (first, last, n)
        differ += vlm_frames.linspace_indices(first, last, n, fused=True).tolist() != want
    assert differ > 0


def _reference_indices(vp, ele: dict, num_frames: int, video_fps: float) -> list[int]:
    """What qwen-vl-utils' decord reader reads (``_read_video_decord`` without the file)."""
    first, last, frames = vp.calculate_video_frame_range(ele, num_frames, video_fps)
    n = vp.smart_nframes(ele, total_frames=frames, video_fps=video_fps)
    return torch.linspace(first, last, n).round().long().tolist()


def _cases(seed: int, count: int) -> list[tuple[int, float, dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        frames = rng.choice([rng.randint(1, 60), rng.randint(60, 3000), rng.randint(3000, 200000)])
        video_fps = rng.choice([24.0, 25.0, 29.97002997002997, 30.0, 59.94, 60.0, rng.uniform(1, 120)])
        ele: dict = {}
        form = rng.random()
        if form < 0.2:
            ele["nframes"] = rng.randint(1, max(2, frames + 3))
        elif form < 0.8:
            ele["fps"] = rng.choice([0.5, 1.0, 2.0, 4.0, rng.uniform(0.1, 30)])
        if rng.random() < 0.4:
            ele["min_frames"] = rng.randint(1, 64)
        if rng.random() < 0.4:
            ele["max_frames"] = rng.randint(2, 1024)
        duration = frames / video_fps
        if rng.random() < 0.3:
            ele["video_start"] = rng.uniform(-1, duration * 1.1)
        if rng.random() < 0.3:
            ele["video_end"] = rng.uniform(0, duration * 1.2)
        out.append((frames, video_fps, ele))
    return out


def test_frame_indices_are_qwen_vl_utils_own(vp):
    """For many videos (1 to 200 000 frames, common and odd rates), rates, counts, bounds and
    spans: the same indices as smart_nframes + calculate_video_frame_range + torch.linspace, and a
    ValueError where qwen-vl-utils raises one."""
    if not _FUSED:
        pytest.skip("torch runs its plain linspace kernel here (see the test above)")
    refused = 0
    for frames, video_fps, ele in _cases(2, 1500):
        keywords = {k: ele[k] for k in ("fps", "nframes", "min_frames", "max_frames", "video_start", "video_end")
                    if k in ele}
        try:
            want = _reference_indices(vp, ele, frames, video_fps)
        except ValueError:
            refused += 1
            with pytest.raises(ValueError):
                qwen.frame_indices(frames, video_fps, **keywords)
            continue
        got = qwen.frame_indices(frames, video_fps, **keywords)
        assert got.tolist() == want, (frames, video_fps, ele)
        first, last, count = vp.calculate_video_frame_range(ele, frames, video_fps)
        assert qwen.sample_fps(frames, video_fps, len(got), video_start=ele.get("video_start"),
                               video_end=ele.get("video_end")) == len(want) / max(count, 1e-6) * video_fps
    assert 20 < refused < 1000  # both outcomes seen


def _budget_cases(seed: int, count: int) -> list[tuple[int, int, int, dict, int]]:
    """(height, width, frames sampled, fetch_video keywords, image_patch_size)."""
    rng = random.Random(seed)
    sizes = [(360, 640), (640, 360), (720, 1280), (1080, 1920), (2160, 3840), (1920, 1080), (240, 320), (28, 28),
             (10, 10), (1, 150), (5, 1000), (4000, 20), (100, 20001), (97, 131), (480, 854), (1000, 1000)]
    out = []
    for _ in range(count):
        h, w = rng.choice(sizes) if rng.random() < 0.5 else (rng.randint(1, 4000), rng.randint(1, 4000))
        n = rng.choice([2, 4, 24, 64, 256, 768, rng.randrange(2, 1600, 2)])
        ele: dict = {}
        patch = rng.choice([14, 16])
        f2 = (2 * patch) ** 2
        if rng.random() < 0.3:
            ele["min_pixels"] = rng.choice([64, 128, 256]) * f2
        if rng.random() < 0.3:
            ele["max_pixels"] = rng.choice([100, 256, 768, 2000]) * f2
        if rng.random() < 0.3:
            ele["total_pixels"] = rng.choice([2048, 16384, 24576, 65536]) * f2
        if rng.random() < 0.1:
            ele["resized_height"], ele["resized_width"] = rng.randint(1, 2000), rng.randint(1, 2000)
        out.append((h, w, n, ele, patch))
    return out


def test_frame_sizes_are_fetch_videos_own(vp, monkeypatch):
    """fetch_video's own budget and resize arithmetic (its reader and its resize stood in for, to
    see the size it asks for without decoding) gives the size frame_size gives, over portrait,
    landscape, tiny, huge and near-200:1 frames, few to many frames, its defaults and given
    bounds, patch 14 and 16."""
    asked = []

    def reader(ele):
        n, h, w = ele["_shape"]
        return torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(n, 3, h, w), {}, 2.0

    def resize(video, size, **_):
        asked.append(tuple(size))
        return video[:, :, :1, :1]

    monkeypatch.setitem(vp.VIDEO_READER_BACKENDS, "decord", reader)
    monkeypatch.setattr(vp.transforms.functional, "resize", resize)
    refused = 0
    for h, w, n, ele, patch in _budget_cases(3, 800):
        try:
            vp.fetch_video({"video": "x.mp4", "_shape": (n, h, w), **ele}, image_patch_size=patch)
            want = asked.pop()
        except (ValueError, AssertionError):  # aspect ratio past 200; min_pixels above max_pixels
            refused += 1
            with pytest.raises(ValueError):
                qwen.frame_size(h, w, n, factor=2 * patch, **{k: v for k, v in ele.items()})
            continue
        if 0 in want:  # qwen-vl-utils asks its resize for a side of 0 (which fails there): refused here
            refused += 1
            with pytest.raises(ValueError):
                qwen.frame_size(h, w, n, factor=2 * patch, **ele)
            continue
        assert qwen.frame_size(h, w, n, factor=2 * patch, **ele) == want, (h, w, n, ele, patch)
    assert 10 < refused < 400


def test_smart_resize_is_qwen_vl_utils_own(vp):
    rng = random.Random(4)
    for _ in range(5000):
        h, w = rng.randint(1, 5000), rng.randint(1, 5000)
        factor = rng.choice([28, 32, 14])
        low = rng.choice([4, 128, 256]) * factor * factor
        high = max(low, rng.choice([rng.uniform(100, 20000) * factor * factor, 16384 * factor * factor]))
        try:
            want = vp.smart_resize(h, w, factor, low, high)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e).replace(".", r"\.")):
                vlm_sizes.smart_resize(h, w, factor, low, high)
            continue
        if 0 in want:
            continue
        assert vlm_sizes.smart_resize(h, w, factor, low, high) == want, (h, w, factor, low, high)


def test_fetch_video_on_a_real_video_reads_what_the_plan_says(vp, tmp_path):
    """qwen-vl-utils reading a real file with decord reads the plan's frames at the plan's size
    (whole, a span, a fixed count) and reports its sample_fps."""
    import decord

    path = write_video(tmp_path / "v.mp4", 3, frames=151, size=(72, 1000), fps=30)
    reader = decord.VideoReader(path)
    count, rate = len(reader), reader.get_avg_fps()
    for ele in [{}, {"fps": 4.0}, {"video_start": 1.1, "video_end": 3.7}, {"nframes": 9},
                {"min_pixels": 50000, "max_pixels": 120000}]:
        (video, meta), fps = vp.fetch_video({"video": path, **ele}, return_video_metadata=True,
                                            return_video_sample_fps=True)
        got = qwen.plan(count, rate, 72, 1000, **ele)
        assert list(meta["frames_indices"]) == got.indices.tolist(), ele
        assert tuple(video.shape) == (len(got.indices), 3, got.height, got.width), ele
        assert got.sample_fps == fps and got.second_per_grid_ts == 2 / fps


def _processors():
    if not have_torchvision():
        pytest.skip("torchvision is not installed (transformers' video processors need it; make test installs it)")
    import_torchvision()
    need("transformers")
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    yield "qwen2.5-vl", Qwen2VLVideoProcessor()  # Qwen2.5-VL's checkpoints name this class, same defaults
    yield "qwen2-vl", Qwen2VLVideoProcessor(patch_size=14)
    try:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    except ImportError:
        return
    yield "qwen3-vl", Qwen3VLVideoProcessor()


def test_patches_and_normalize_are_the_video_processors_own():
    """On random frames (an odd count too: the last frame repeats), rows + normalise equal
    transformers' pixel_values_videos to the bit, and the grid its video_grid_thw."""
    rng = np.random.default_rng(5)
    seen = 0
    for model, processor in _processors():
        side = processor.patch_size * processor.merge_size
        for t, gh, gw in [(2, 2, 3), (5, 1, 4), (8, 3, 2)]:
            frames = rng.integers(0, 256, (t, gh * side, gw * side, 3), dtype=np.uint8)
            want = processor(videos=[torch.from_numpy(frames).permute(0, 3, 1, 2)], do_resize=False,
                             do_sample_frames=False, cap_pixels_per_frame=False, return_tensors="pt")
            rows = qwen.normalize(qwen.patches(frames, model=model), model=model)
            assert np.array_equal(rows, want["pixel_values_videos"].numpy()), (model, t)
            assert want["video_grid_thw"].tolist() == [list(qwen.grid_thw(t, *frames.shape[1:3], model=model))]
            seen += 1
    assert seen >= 6


def test_normalize_takes_torch_tensors_and_keeps_them_where_they_are():
    rows = np.random.default_rng(6).integers(0, 256, (10, 3 * 2 * 14 * 14), dtype=np.uint8)
    tensor = torch.from_numpy(rows)
    out = qwen.normalize(tensor)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device == tensor.device
    assert np.array_equal(out.numpy(), qwen.normalize(rows))
    floats = tensor.float()
    again = qwen.normalize(floats)
    assert again is not floats and torch.equal(floats, tensor.float())  # the input is left as it was
    assert np.array_equal(again.numpy(), out.numpy())


def test_patches_write_into_the_callers_array():
    frames = np.random.default_rng(7).integers(0, 256, (3, 56, 84, 3), dtype=np.uint8)
    out = np.full((2 * 4 * 6, 1176), -1.0, np.float32)
    assert qwen.patches(frames, out=out) is out
    assert np.array_equal(out, qwen.patches(frames).astype(np.float32))
    with pytest.raises(ValueError, match="shape"):
        qwen.patches(frames, out=np.empty((48, 1175), np.uint8))
    with pytest.raises(TypeError):  # float rows cannot become uint8 silently
        vlm_patches.rows(frames.astype(np.float32), out=np.empty((48, 1176), np.uint8))


def test_a_plan_gives_the_frames_size_grid_tokens_and_times():
    """A 12-s 640x360 video at 30 fps: 24 frames (2 a second) at 364x644, 12x26x46 patches."""
    pts = np.arange(361) / 30.0
    plan = qwen.plan(360, 30.0, 360, 640, pts=np.stack([pts[:-1], pts[1:]], axis=1))
    assert (len(plan.indices), plan.height, plan.width, plan.grid_thw) == (24, 364, 644, (12, 26, 46))
    assert plan.tokens == 12 * 26 * 46 // 4 and plan.sample_fps == 2.0 and plan.second_per_grid_ts == 1.0
    assert np.allclose(plan.times, plan.indices / 30.0)
    three = qwen.plan(360, 30.0, 360, 640, model="qwen3-vl")
    assert (three.height % 32, three.width % 32, three.grid_thw[0]) == (0, 0, 12)
    assert qwen.plan(360, 30.0, 360, 640).times is None


def test_too_few_frames_are_told_as_the_videos_frames_what_was_set_and_what_to_change(tmp_path):
    """A 1-frame video: its one frame and Qwen-VL's 2 (FRAME_FACTOR) said plainly, not "0 frames of a
    video of 1: between 2 and 1 wanted"; options that give too few frames of a longer video: the
    option to change."""
    one = write_video(tmp_path / "one.mp4", 1, frames=1, size=(64, 64), fps=30)
    with pytest.raises(ValueError) as caught:
        qwen.clips([one])
    message = str(caught.value)
    assert "one.mp4: the video has 1 frame, and Qwen-VL needs at least 2 (FRAME_FACTOR" in message, message
    assert "fps=2.0, min_frames=4, max_frames=768 at video_fps=30.0" in message and "on_error='skip'" in message
    assert "between 2 and 1" not in message
    with pytest.raises(ValueError, match="the video has 1 frame.*whatever the options .set: nframes=2."):
        qwen.frame_indices(1, 30.0, nframes=2)
    with pytest.raises(ValueError, match="with fps=0.01, min_frames=0, .*: 0 frames of a video of 60, .*raise fps, "
                                         "or min_frames to 2 or more"):
        qwen.frame_indices(60, 30.0, fps=0.01, min_frames=0)
    with pytest.raises(ValueError, match="raise max_frames to 2 or more"):
        qwen.frame_indices(60, 30.0, max_frames=1)
    with pytest.raises(ValueError, match=r"nframes=1 \(rounded to a multiple of 2\): 0 frames .* set nframes to 2 or more"):
        qwen.frame_indices(60, 30.0, nframes=1)
    with pytest.raises(ValueError, match="set nframes to 50 or fewer, or give fps instead"):
        qwen.frame_indices(50, 30.0, nframes=51)


def test_bad_input_is_refused_in_words():
    with pytest.raises(ValueError, match="absolute aspect ratio must be smaller than 200, got 250"):
        qwen.frame_size(4, 1000, 8)
    with pytest.raises(ValueError, match="the video has 1 frame, and Qwen-VL needs at least 2"):  # too short
        qwen.frame_indices(1, 30.0)
    with pytest.raises(ValueError, match="with nframes=100: 100 frames of a video of 50, more than it has"):
        qwen.frame_indices(50, 30.0, nframes=100)
    with pytest.raises(ValueError, match="fps or nframes, not both"):
        qwen.frame_indices(50, 30.0, fps=1.0, nframes=4)
    with pytest.raises(ValueError, match="first frame must come before the last"):
        qwen.frame_indices(300, 30.0, video_start=5.0, video_end=5.01)
    with pytest.raises(ValueError, match="together"):
        qwen.frame_size(360, 640, 8, resized_height=300)
    with pytest.raises(ValueError, match="must be at least min_pixels"):
        qwen.frame_size(360, 640, 8, max_pixels=1000)
    with pytest.raises(ValueError, match="multiples of patch \\* merge \\(28\\)"):
        qwen.patches(np.zeros((2, 42, 56, 3), np.uint8))
    with pytest.raises(ValueError, match="model must be one of"):
        qwen.normalize(np.zeros((1, 1176), np.uint8), model="qwen4")
