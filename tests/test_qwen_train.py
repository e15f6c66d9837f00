"""A tiny Qwen2.5-VL (transformers, random weights, CPU) trained on what ``shmloader.qwen.clips`` and
``Loader(batch_tokens=N)`` deliver: packed patch rows, grids and seconds per grid as the model takes
them, every video once an epoch, a loss that falls.

That ``qwen.normalize`` of the rows is, to the bit, what transformers' ``Qwen2VLVideoProcessor``
makes of the same frames is tests/test_qwen_plan.py's (test_patches_and_normalize_are_the_video_processors_own):
the model's loss on the processor's input is the loss here."""

from __future__ import annotations

import math

import numpy as np
import pytest

import shmloader
from shmloader import qwen
from shmloader.samples import write_video

from ._needs import need
from ._qwen import have_torchvision, import_torchvision

torch = need("torch")
# transformers decides once, at its import, whether torchvision is there (its video processors
# need it): torchvision first, where make test installed it, so that any later test in this process
# (tests/test_qwen_plan.py's processors) finds it
if have_torchvision():
    import_torchvision()
transformers = need("transformers")

pytestmark = pytest.mark.timeout(120)

# The tiny model's vocabulary: 64 ids, of which these play Qwen-VL's special tokens.
PAD, EOS = 0, 2
LABEL0 = 10  # video i's answer is the token LABEL0 + its label
VISION_START, VISION_END, VIDEO, IMAGE = 60, 61, 62, 63
MERGE = 2  # spatial_merge_size: a token is 2 x 2 patches, so 4 rows
BUDGET = 40  # batch_tokens: two or three of the videos below a batch

# (height, width), frames, fps: grids of 2 to 6 temporal patches, wide and tall frames, and a short
# 25-fps video that gives fewer frames than 2 a second asks (another second_per_grid_ts).
VIDEOS = [((64, 96), 10, 5), ((96, 128), 24, 6), ((48, 160), 12, 4), ((128, 64), 8, 4), ((80, 80), 36, 6),
          ((72, 112), 8, 25)]
# Each temporal patch 2 to 6 tokens: a video is 6 to 24 tokens.
PIXELS = {"min_pixels": 28 * 28 * 2, "max_pixels": 28 * 28 * 6}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen_train")
    paths = [write_video(folder / f"v{i}.mp4", i, frames=n, size=size, fps=fps)
             for i, (size, n, fps) in enumerate(VIDEOS)]
    return qwen.clips(paths, list(range(len(paths))), **PIXELS)


@pytest.fixture(scope="module")
def first_batch(source):
    """The first batch of an epoch, copied out of the ring (the loader closed)."""
    with shmloader.Loader(source, batch_tokens=BUDGET, workers=2, shuffle=True, seed=0) as loader:
        batch = next(iter(loader))
        return {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}


def tiny_model(seed: int = 0):
    """Qwen2.5-VL from a config (no download): one vision block, one text layer, 64 tokens."""
    config = transformers.Qwen2_5_VLConfig(
        # window_size 56 (2 x 2 tokens) and no full-attention block: the one block attends in
        # windows, as most of the real model's blocks do, over the rows in the processor's order.
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
                       "temporal_patch_size": 2, "spatial_merge_size": MERGE, "out_hidden_size": 32,
                       "window_size": 56, "fullatt_block_indexes": [], "tokens_per_second": 2},
        # head dim 16: mrope_section (t, h, w) splits its 8 rotary frequencies
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                     "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": PAD},
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END, video_token_id=VIDEO,
        image_token_id=IMAGE)
    torch.manual_seed(seed)
    return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()


def model_inputs(batch: dict, drop_one: bool = False) -> dict:
    """The model's keywords for a batch: per video ``[vision_start] + [video_pad] * tokens +
    [vision_end] + [answer, eos]``, right-padded, the loss on the answer and eos alone, video
    tokens marked in ``mm_token_type_ids`` (2) as the processor marks them. ``drop_one``: one video
    token fewer than its grid makes."""
    grid = batch["video_grid_thw"]
    tokens = (grid.prod(-1) // MERGE**2).tolist()
    if drop_one:
        tokens[0] -= 1
    answers = [[LABEL0 + int(label), EOS] for label in batch["label"]]
    rows = [[VISION_START] + [VIDEO] * n + [VISION_END] + a for n, a in zip(tokens, answers)]
    shape = (len(rows), max(map(len, rows)))
    input_ids = torch.full(shape, PAD, dtype=torch.int64)
    attention_mask = torch.zeros(shape, dtype=torch.int64)
    labels = torch.full(shape, -100, dtype=torch.int64)
    for k, (row, answer) in enumerate(zip(rows, answers)):
        input_ids[k, : len(row)] = torch.tensor(row)
        attention_mask[k, : len(row)] = 1
        labels[k, len(row) - len(answer) : len(row)] = torch.tensor(answer)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "mm_token_type_ids": (input_ids == VIDEO).int() * 2,
            "pixel_values_videos": qwen.normalize(batch["pixel_values_videos"]), "video_grid_thw": grid,
            "second_per_grid_ts": batch["second_per_grid_ts"]}


def check_packing(batch: dict) -> None:
    """Each video's rows where its offsets say, as many as its grid has, within the budget."""
    grid, offsets = batch["video_grid_thw"], batch["pixel_values_videos_offsets"]
    assert batch["pixel_values_videos"].dtype == torch.uint8 and batch["pixel_values_videos"].shape[1] == 1176
    assert offsets[0] == 0 and offsets[-1] == len(batch["pixel_values_videos"])
    assert torch.equal(offsets.diff(), grid.prod(-1))
    assert len(batch["pixel_values_videos"]) // MERGE**2 <= BUDGET


def test_a_tiny_qwen2_5_vl_trains_on_packed_batches(source, monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_DISABLE_TORCH_CHECK", raising=False)  # the model's own count check on
    model = tiny_model().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []
    with shmloader.Loader(source, batch_tokens=BUDGET, workers=2, shuffle=True, seed=0, epochs=2) as loader:
        assert len(loader) >= 2  # the budget cuts an epoch into several batches
        for batch in loader.as_torch():
            check_packing(batch)
            inputs = model_inputs(batch)
            # one video token per 4 rows the loader gave: the model's count check (it raises
            # otherwise, see the test below) passes with the rows as they come
            assert (inputs["input_ids"] == VIDEO).sum() == len(batch["pixel_values_videos"]) // MERGE**2
            model.model.rope_deltas = None
            loss = model(**inputs).loss
            # the 3D (time, height, width) positions were computed from the grids and seconds per
            # grid: without mm_token_type_ids transformers falls back to 1D positions silently
            assert model.model.rope_deltas is not None
            assert math.isfinite(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            seen.append(batch["index"].tolist())
    # every video once an epoch; each epoch is cut anew from its own order, so its batches are
    # counted here rather than taken from len(loader) (the first epoch's)
    first = next(b for b in range(len(seen)) if sum(map(len, seen[: b + 1])) >= len(VIDEOS)) + 1
    epochs = [[i for b in seen[:first] for i in b], [i for b in seen[first:] for i in b]]
    assert [sorted(e) for e in epochs] == [list(range(len(VIDEOS)))] * 2, seen
    assert epochs[0] != epochs[1]  # each epoch shuffled anew


def test_the_loss_on_one_packed_batch_falls_as_the_model_trains(first_batch):
    model = tiny_model().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs = model_inputs(first_batch)
    losses = []
    for _ in range(20):
        loss = model(**inputs).loss
        assert math.isfinite(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # random weights start near ln(64) = 4.16 a token; 20 steps on one batch learn its answers
    assert losses[0] > 3.0 and losses[-1] < losses[0] / 3, losses


def test_each_video_of_a_packed_batch_gives_the_model_what_it_gives_alone(first_batch):
    """Packed rows cut by the grids as the model cuts them: each video's logits in the batch are
    those of a batch of that video alone (its rows taken by its offsets)."""
    model = tiny_model()
    batch = first_batch
    assert len(batch["index"]) >= 2
    offsets = batch["pixel_values_videos_offsets"]
    together = model_inputs(batch)
    with torch.no_grad():
        packed = model(**together)
        for k in range(len(batch["index"])):
            alone = {"pixel_values_videos": batch["pixel_values_videos"][offsets[k] : offsets[k + 1]],
                     **{key: batch[key][k : k + 1] for key in ("video_grid_thw", "second_per_grid_ts", "label")}}
            inputs = model_inputs(alone)
            n = inputs["input_ids"].shape[1]
            assert torch.equal(together["input_ids"][k, :n], inputs["input_ids"][0])
            torch.testing.assert_close(packed.logits[k, :n], model(**inputs).logits[0], rtol=1e-4, atol=1e-5)


def test_the_model_refuses_video_tokens_that_do_not_match_the_rows(first_batch, monkeypatch):
    """The count check the training test relies on is live: one token short is an error."""
    monkeypatch.delenv("TRANSFORMERS_DISABLE_TORCH_CHECK", raising=False)
    with torch.no_grad(), pytest.raises(ValueError, match="Video features and video tokens do not match"):
        tiny_model()(**model_inputs(first_batch, drop_one=True))
