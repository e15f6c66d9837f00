"""A LeRobot policy trains on shmloader's batches: ACT (tiny, CPU) gets the same loss from a batch of
``shmloader.lerobot.dataset`` as from LeRobot's own DataLoader on the same indices, and a few
optimizer steps on the loader's batches lower it.

The whole module runs in a Python that imports lerobot (the lerobot lane, ``make test-lerobot``):
the policy, its pre-processor and LeRobot's DataLoader run here, beside shmloader. The dataset is
written by LeRobot's own writer in its default codec (AV1), as ``tests/_lerobot_reference.py``
writes it; the policy is configured as ``lerobot-train`` configures it (features and normalisation
statistics from the dataset's metadata, ``delta_timestamps`` from the policy's delta indices).
ACT, because it needs nothing beyond ``lerobot[dataset]`` (Diffusion Policy needs ``diffusers``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ._needs import need

need("lerobot", "lerobot is not installed in this Python: run this module in the lerobot lane's Python "
     "(make test-lerobot builds .venv-lerobot-3.12; or $SHMLOADER_LEROBOT_PYTHON -m pytest "
     "tests/test_lerobot_policy.py)")

import torch  # lerobot needs torch: where it imports, torch does

import shmloader
from shmloader import lerobot

from . import _lerobot_reference as reference

REPO = "shmloader/reference"
# ACT's action chunk, in timesteps: 0.4 s at the reference's 10 fps, so that the chunk of every
# episode's last timesteps passes its end (episodes of 7, 5 and 9 timesteps: pads in the loss).
CHUNK = 5
# Timesteps at both edges of every episode (and inside), read in batches of BATCH and joined.
INDICES = [0, 1, 3, 6, 7, 9, 11, 12, 15, 19, 20]
BATCH = 4
STEPS = 12  # optimizer steps on the loader's batches
LR = 1e-3
# The two losses are equal within float32's rounding; a camera one grey level off moves the loss
# ~30x further, another sample's frames ~200x.
RTOL = 1e-6


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("lerobot-policy") / "ds")
    reference.write(root, "libsvtav1")  # LeRobot's default codec
    return root


def tiny_act():
    """An ACT configuration as small as it goes on CPU: no pretrained backbone to download, dropout
    off (the loss a function of the batch and the seed alone)."""
    from lerobot.policies.act.configuration_act import ACTConfig

    return ACTConfig(chunk_size=CHUNK, n_action_steps=CHUNK, dim_model=32, n_heads=2, dim_feedforward=64,
                     n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8,
                     pretrained_backbone_weights=None, dropout=0.0, device="cpu")


@pytest.fixture(scope="module")
def one_thread():
    """torch's own threads off: beside the loader's workers on a small machine they only contend
    (ten times slower steps on two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(written, one_thread):
    """LeRobot's side as ``lerobot-train`` builds it: metadata, ``delta_timestamps`` from the policy,
    the dataset, the policy and its pre-processor (normalisation from the dataset's statistics)."""
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.policies.factory import make_policy, make_pre_post_processors

    cfg = tiny_act()
    meta = LeRobotDatasetMetadata(REPO, root=written)
    deltas = resolve_delta_timestamps(cfg, meta)
    assert deltas == {"action": [i / reference.FPS for i in range(CHUNK)]}  # ACT: an action chunk, no history
    theirs = LeRobotDataset(REPO, root=written, delta_timestamps=deltas)
    ours = lerobot.dataset(written, delta_timestamps=deltas)
    torch.manual_seed(0)
    policy = make_policy(cfg, ds_meta=meta)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=meta.stats)
    return theirs, ours, policy, preprocessor


def as_lerobot(batch: dict, ds) -> dict:
    """A batch of ``shmloader.lerobot.dataset`` in the form LeRobot's DataLoader gives (the module
    docstring of ``shmloader.lerobot``): each camera uint8 ``[B, H, W, 3]`` to float32 ``[B, 3, H, W]``
    in [0, 1], ``task`` the texts of ``task_index``, the rest as it is."""
    out = {k: torch.as_tensor(v) for k, v in batch.items()}
    for camera in ds.cameras:
        out[camera] = out[camera].permute(0, 3, 1, 2).float() / 255
    out["task"] = [ds.tasks[t] for t in out["task_index"].tolist()]
    return out


def lerobot_batch(theirs, indices: list[int]) -> dict:
    """``indices`` of ``LeRobotDataset`` through its own ``torch.utils.data.DataLoader`` (default
    collate) in batches of ``BATCH``, the batches joined."""
    from torch.utils.data import DataLoader, Subset

    batches = list(DataLoader(Subset(theirs, indices), batch_size=BATCH, shuffle=False, num_workers=0))
    return {k: ([t for b in batches for t in b[k]] if k == "task" else torch.cat([b[k] for b in batches]))
            for k in batches[0]}


def loss_of(policy, preprocessor, batch: dict, seed: int = 0) -> torch.Tensor:
    """ACT's training loss (its VAE's latent sampled from ``seed``) on ``batch`` after the policy's
    pre-processor, as ``lerobot-train`` computes it."""
    torch.manual_seed(seed)
    policy.train()
    loss, _ = policy.forward(preprocessor(dict(batch)))
    return loss


def test_the_policy_gets_the_same_batch_and_loss_as_from_lerobots_dataloader(setup):
    theirs, ours, policy, preprocessor = setup
    want = lerobot_batch(theirs, INDICES)
    got = as_lerobot(ours.read(INDICES), ours)
    assert set(got) == set(want)
    assert got["task"] == want["task"]
    for key in set(want) - {"task"}:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), f"{key}: max |diff| {(got[key].double() - want[key].double()).abs().max()}"
    assert want["action_is_pad"].any() and not want["action_is_pad"].all()  # chunks pass episodes' ends
    # lerobot-train's own dataset gives uint8 frames (``return_uint8=True``; its loop divides by 255):
    # ours, channels first, are those.
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    as_uint8 = lerobot_batch(LeRobotDataset(REPO, root=theirs.root, delta_timestamps=theirs.delta_timestamps,
                                            return_uint8=True), INDICES)
    read = ours.read(INDICES)
    for camera in ours.cameras:
        assert as_uint8[camera].dtype == torch.uint8
        assert torch.equal(torch.from_numpy(read[camera]).permute(0, 3, 1, 2), as_uint8[camera]), camera

    with torch.no_grad():
        mine, reference_loss = loss_of(policy, preprocessor, got), loss_of(policy, preprocessor, want)
        # The loss tells apart what the equality must: another sample's frames, frames one grey
        # level off, no pads, another action chunk.
        camera = ours.cameras[0]
        wrong = [dict(got, **{camera: got[camera].roll(1, dims=0)}),
                 dict(got, **{camera: (got[camera] + 1 / 255).clamp(0, 1)}),
                 dict(got, action_is_pad=torch.zeros_like(got["action_is_pad"])),
                 dict(got, action=got["action"].roll(1, dims=0))]
        others = [loss_of(policy, preprocessor, b) for b in wrong]
    assert math.isfinite(mine.item())
    assert torch.allclose(mine, reference_loss, rtol=RTOL, atol=0), (mine.item(), reference_loss.item())
    for other in others:
        assert not torch.allclose(other, reference_loss, rtol=RTOL, atol=0), (other.item(), reference_loss.item())


def test_a_few_optimizer_steps_on_the_loaders_batches_lower_the_loss(setup):
    """The loader's own batches (2 workers, shuffled epochs, ``as_torch``), each checked against
    ``read`` of its samples, train the policy; the loss on a fixed batch (and seed) falls."""
    theirs, ours, policy, preprocessor = setup
    fixed = lerobot_batch(theirs, INDICES)
    with torch.no_grad():
        before = loss_of(policy, preprocessor, fixed).item()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR)
    losses, seen = [], []
    with shmloader.Loader(ours, batch_size=BATCH, workers=2, shuffle=True, seed=7, epochs=None) as loader:
        for step, batch in zip(range(STEPS), loader.as_torch()):
            read = ours.read(batch["index"].tolist())
            assert set(batch) == set(read)
            for key, value in read.items():
                assert np.array_equal(batch[key].numpy(), value), key
            seen += batch["index"].tolist()
            loss = loss_of(policy, preprocessor, as_lerobot(batch, ours), seed=step)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert len(losses) == STEPS and all(map(math.isfinite, losses)), losses
    assert sorted(seen[: len(ours) // BATCH * BATCH]) != seen[: len(ours) // BATCH * BATCH]  # shuffled
    with torch.no_grad():
        after = loss_of(policy, preprocessor, fixed).item()
    assert after < 0.8 * before, (before, after, losses)
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
